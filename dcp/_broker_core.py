"""The broker's routing core: a pure state machine (sans-IO).

It takes whole messages as the broker's ROUTER sees them (routing id first) together with the
current time, and appends the messages to send to :attr:`BrokerCore.outbox`. It knows nothing
of sockets, anyio or clocks; :class:`dcp.Broker` is the thin driver that feeds it.

State rules (the whole routing policy lives here):

Rule 1 - Workers. A peer becomes a *worker* by registering a service (0x01); the registration
  is echoed as confirmation. A worker may register several services (dcp extension; each is
  echoed). A worker has *credit*: how many more requests it may be given. Registering, a
  ping, or a request sent without finishing a held one (a worker calling a service itself)
  set it to at least 1 ("I can take one more"): idle heartbeats do not pile up credit. A
  reply or forward that finishes a held request adds 1 (that request's slot is free again).
  Each request given to the worker takes 1. So a plain DCP worker holds one request until it
  replies, forwards or pings, and a worker with N slots can keep exactly N busy by pinging
  only when it has no credit left and a slot free (what :class:`dcp.Worker` does).
Rule 2 - Queues. Each service has a FIFO queue of requests. A worker with credit and nothing
  queued for its services waits in its services' idle lists; the least recently used idle
  worker gets the next request. A request is *held* by the worker it was given to until that
  worker replies or forwards it (matched by client address and metadata, which workers must
  pass on unchanged; an answer that matches nothing releases nothing) or leaves.
Rule 3 - Addresses. A request without a client address gets the sender's address inserted.
  One that carries an address keeps it (a worker forwarding work), but only a registered
  worker may name an address other than its own, unless ``allow_foreign_address``.
  A reply is routed to its client address, answering each peer in the type-frame width (1 or
  4 bytes) it last used. A reply for a peer that is gone is counted and dropped.
Rule 4 - Heartbeats. Every ping from a worker is answered with a pong; a pong from a worker is
  a keep-alive that asks for no work and is answered with a pong (dcp extension). A ping or
  pong from a peer that is not a registered worker is answered with reconnect (0x06).
Rule 5 - Liveness. A worker not heard from for ``liveness x heartbeat_interval`` is removed,
  and every request it held goes back to the *front* of its service's queue (the spec allows
  losing it; we do not), at most ``max_redeliveries`` times, after which the client gets an
  error reply. A worker that sends reconnect (0x06) leaves the same way, at once (dcp
  extension); so does a worker the driver cannot send to.
Rule 6 - Bounds and bad input. A malformed message, or one that breaks a limit, is counted by
  reason, logged once per peer, and dropped; when its sender can be told (a request, even one
  cut short at a size or frame limit, if its metadata survived), it gets a dcp error reply
  instead. Nothing raises out of :meth:`BrokerCore.receive`. Per client (the request's client
  address), at most ``max_client_queued`` requests wait in queues and at most
  ``max_client_inflight`` are accepted and unanswered (queued or held by workers); past
  either, the request gets a ``client_limit`` error reply.
Rule 7 - Work timeouts. A request may carry a work timeout (a metadata option, see
  :func:`~dcp._messages.work_timeout_option`; else the broker's ``work_timeout``, if any).
  A worker that holds it longer than that is treated as lost, as in Rule 5: it is sent
  reconnect and removed, and what it held is redelivered, within ``max_redeliveries``.
  The same peer may register again at once, but gets no work for ``liveness x
  heartbeat_interval`` (*quarantine*), so a worker that hangs on every request cannot take
  the redelivered request straight back while others could serve it.
Rule S - Security (only with a :class:`~dcp._guard.Guard`, i.e. CURVE on; its rules S1-S4
  are in :mod:`dcp._guard`). Each message comes with its sender's key (*principal*); one
  the guard does not admit is counted and dropped. A registration the guard does not permit
  is counted (``registration_refused``), logged, and answered with a reply to the worker:
  no client address, the service as its one metadata part (none for an empty name), and the
  data of a ``registration_refused`` error reply (dcp extension). Client addresses in
  requests given to workers are sealed; a worker's reply or forward must carry a sealed
  one (else ``bad_client_address``).

What the core does NOT do: socket options, message-size limits (zmq's MAXMSGSIZE in the
driver), timers (the driver calls :meth:`BrokerCore.expire`), persistence.
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict, deque

import attrs

from ._codec import PROTOCOL, TYPE_FRAMES, parse
from ._errors import MessageTooLarge, RemoteProtocolError, TooManyFrames
from ._guard import Guard
from ._messages import (
    MessageType,
    Register,
    Reply,
    Request,
    error_reply_data,
    request_work_timeout,
)

__all__ = ["BrokerCore", "BrokerStatistics", "ServiceStatistics"]

logger = logging.getLogger("dcp.broker")

_REPLY_TYPE_FRAMES = (TYPE_FRAMES[1][MessageType.REPLY], TYPE_FRAMES[4][MessageType.REPLY])


class _Load:
    """What the broker holds for one client address (Rule 6)."""

    __slots__ = ("inflight", "queued")

    def __init__(self) -> None:
        self.queued = 0
        self.inflight = 0


class _Pending:
    """A request in a queue or held by a worker."""

    __slots__ = (
        "client",
        "holder",
        "load",
        "metadata",
        "redeliveries",
        "seq",
        "service",
        "tail",
        "token",
        "work_timeout",
    )

    def __init__(
        self,
        seq: int,
        service: _Service,
        client: bytes,
        metadata: tuple[bytes, ...],
        tail: list[bytes],
        load: _Load,
        work_timeout: float | None,
    ) -> None:
        #: Arrival order, to serve a multi-service worker the oldest request first.
        self.seq = seq
        self.service = service
        self.client = client
        self.metadata = metadata
        #: The frames after the type frame, ready to send: service, client, "", meta, "", data.
        self.tail = tail
        self.redeliveries = 0
        self.load = load
        self.work_timeout = work_timeout
        #: The worker holding it, if any.
        self.holder: _Worker | None = None
        #: Counts dispatches: a work-timeout entry is live only while its token matches.
        self.token = 0


class _Service:
    __slots__ = ("idle", "name", "queue", "workers")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.queue: deque[_Pending] = deque()
        #: Ready workers, least recently used first.
        self.idle: OrderedDict[bytes, _Worker] = OrderedDict()
        self.workers = 0


class _Worker:
    __slots__ = ("credit", "expiry", "held", "ident", "services", "width")

    def __init__(self, ident: bytes, width: int) -> None:
        self.ident = ident
        self.width = width
        self.services: list[_Service] = []
        #: Requests the worker may still be given (Rule 1).
        self.credit = 0
        self.held: list[_Pending] = []
        self.expiry = 0.0


@attrs.frozen
class ServiceStatistics:
    """Per-service figures from :meth:`BrokerCore.statistics`."""

    #: Registered workers providing the service.
    workers: int
    #: Of those, how many are idle (have credit, nothing queued for them).
    idle: int
    #: Requests waiting in the queue.
    queued: int


@attrs.frozen
class BrokerStatistics:
    """Counters and gauges of a broker, as returned by ``statistics()``."""

    #: Requests accepted (queued or dispatched), including forwards.
    requests: int
    #: Replies routed to a client.
    replies: int
    #: Requests sent by registered workers carrying a client address (forwarding).
    forwards: int
    #: Requests given to a worker (first deliveries and redeliveries).
    dispatched: int
    #: Held requests put back at the front of a queue because their worker went away.
    redeliveries: int
    #: Replies dropped because their client was gone or could not take them.
    dropped_replies: int
    #: Other messages (echoes, pongs, reconnects) dropped for the same reasons.
    undeliverable: int
    #: Reconnect messages sent to peers that pinged without being registered.
    reconnects_sent: int
    #: Replies and forwards from workers that matched no request they held (still routed).
    unmatched: int
    #: Workers removed because they were silent for too long.
    expired_workers: int
    #: Workers removed because they held a request past its work timeout (Rule 7).
    work_timeouts: int
    #: Messages refused, by reason (also malformed ones, by ProtocolError reason).
    rejections: dict[str, int]
    #: Registered workers.
    workers: int
    #: Clients with requests accepted and not yet answered (queued or held).
    clients: int
    #: Per-service workers, idle workers and queue depth.
    services: dict[bytes, ServiceStatistics]


class BrokerCore:
    """The broker's routing state machine (see the module docstring for its rules).

    :param heartbeat_interval: seconds between worker heartbeats (agreed with the workers)
    :param liveness: heartbeats a worker may miss before it is considered gone
    :param allow_foreign_address: let any peer (not only registered workers) send requests
        carrying a client address other than its own
    :param max_queue: requests queued per service; more get a ``queue_full`` error reply
    :param max_services: distinct services known at once; a request for one more gets a
        ``too_many_services`` error reply (registrations are not refused for this)
    :param max_services_per_worker: services one worker may register; more are refused
    :param max_service_name: bytes in a service name; longer ones are refused
    :param max_redeliveries: times a request is put back after its worker died before the
        client gets a ``redelivery_limit`` error reply instead
    :param max_width_peers: non-worker peers whose 4-byte type width is remembered (LRU)
    :param max_held: requests tracked per worker for redelivery; past this (only a worker
        that changes metadata, so its answers match nothing, gets there) the oldest is
        no longer tracked (counted as ``held_overflow``)
    :param max_client_queued: requests of one client waiting in queues; more get a
        ``client_limit`` error reply
    :param max_client_inflight: requests of one client accepted and not yet answered
        (queued or held by a worker); more get a ``client_limit`` error reply
    :param work_timeout: seconds a worker may hold a request that does not carry its own
        work timeout (``None``: no limit); past it the worker is treated as lost (Rule 7)
    :param guard: the security rules for CURVE mode (``None``: off; see Rule S)
    """

    def __init__(
        self,
        *,
        heartbeat_interval: float = 1.0,
        liveness: int = 3,
        allow_foreign_address: bool = False,
        max_queue: int = 100_000,
        max_services: int = 10_000,
        max_service_name: int = 1024,
        max_redeliveries: int = 5,
        max_width_peers: int = 65_536,
        max_held: int = 10_000,
        max_services_per_worker: int = 256,
        max_client_queued: int = 10_000,
        max_client_inflight: int = 20_000,
        work_timeout: float | None = None,
        guard: Guard | None = None,
    ) -> None:
        if heartbeat_interval <= 0 or liveness < 1:
            raise ValueError("heartbeat_interval must be > 0 and liveness >= 1")
        if work_timeout is not None and not 0 < work_timeout < float("inf"):
            raise ValueError("work_timeout must be None or a positive finite number")
        self.heartbeat_interval = heartbeat_interval
        self.liveness = liveness
        self.allow_foreign_address = allow_foreign_address
        self.max_queue = max_queue
        self.max_services = max_services
        self.max_service_name = max_service_name
        self.max_redeliveries = max_redeliveries
        self.max_width_peers = max_width_peers
        self.max_held = max_held
        self.max_services_per_worker = max_services_per_worker
        self.max_client_queued = max_client_queued
        self.max_client_inflight = max_client_inflight
        self.work_timeout = work_timeout
        self.guard = guard
        #: Messages to send, ROUTER-side (routing id first). The driver empties it.
        self.outbox: list[list[bytes]] = []
        self._timeout = heartbeat_interval * liveness
        self._workers: dict[bytes, _Worker] = {}
        # Workers ordered by last activity: the first one is the next to expire.
        self._by_activity: OrderedDict[bytes, None] = OrderedDict()
        self._services: dict[bytes, _Service] = {}
        self._wide: OrderedDict[bytes, None] = OrderedDict()
        self._logged: OrderedDict[tuple[bytes, str], None] = OrderedDict()
        self._rejections: dict[str, int] = {}
        self._requests = 0
        self._replies = 0
        self._forwards = 0
        self._dispatched = 0
        self._redeliveries = 0
        self._dropped_replies = 0
        self._expired = 0
        self._reconnects_sent = 0
        self._unmatched = 0
        self._undeliverable = 0
        self._work_timeouts = 0
        self._loads: dict[bytes, _Load] = {}
        # Work-timeout deadlines of held requests: (when, seq, token, request), lazily
        # deleted (an entry is live while its request's holder is set and token matches).
        self._deadlines: list[tuple[float, int, int, _Pending]] = []
        self._timed_held = 0
        # Rule 7: peers removed for a work timeout, and until when they get no work.
        self._quarantine: dict[bytes, float] = {}
        # The time of the call being handled (receive or expire), for work-timeout deadlines.
        self._now = 0.0

    # ------------------------------------------------------------------ input

    def receive(self, frames: list[bytes], now: float, principal: str | None = None) -> None:
        """Handle one message as received by the ROUTER (routing id first).

        :param principal: the sender's key, which the guard checks (Rule S)
        """
        self._now = now
        peer = frames[0]
        if self.guard is not None and not self._admitted(peer, principal):
            return
        try:
            msg, width = parse(frames[1:])
        except RemoteProtocolError as exc:
            self._reject(peer, exc.reason, str(exc))
            return
        # Remember which type width a non-worker peer speaks, to answer in kind.
        worker = self._workers.get(peer)
        if worker is not None:
            worker.width = width
            worker.expiry = now + self._timeout
            self._by_activity.move_to_end(peer)
        else:
            self._remember_width(peer, width)

        mtype = msg.type
        if mtype is MessageType.REQUEST:
            assert isinstance(msg, Request)
            self._on_request(peer, worker, msg, width)
        elif mtype is MessageType.REPLY:
            assert isinstance(msg, Reply)
            self._on_reply(peer, worker, msg)
        elif mtype is MessageType.PING or mtype is MessageType.PONG:
            if worker is None:
                self._send(peer, width, MessageType.RECONNECT)
                self._reconnects_sent += 1
            else:
                self._send(peer, width, MessageType.PONG)
                if mtype is MessageType.PING:
                    self._credit(worker, released=False)
        elif mtype is MessageType.REGISTER:
            assert isinstance(msg, Register)
            self._on_register(peer, worker, msg.service, width, now, principal)
        elif worker is None:  # RECONNECT
            self._reject(peer, "unexpected_reconnect", "reconnect from a non-worker")
        else:
            self._remove_worker(worker)

    def reject_too_many_frames(
        self, frames: list[bytes], dropped: int, now: float, principal: str | None = None
    ) -> None:
        """The driver cut a message at its frame limit, keeping ``frames`` (routing id
        first): count and log it, and answer it with an error reply if it is a request
        whose metadata was kept."""
        kept = len(frames) - 1
        exc = TooManyFrames(f"{kept + dropped} frames; the limit is {kept}")
        self._reject_cut(frames, exc.reason, str(exc), now, principal)

    def reject_too_large(
        self,
        frames: list[bytes],
        nbytes: int,
        limit: int,
        now: float,
        principal: str | None = None,
    ) -> None:
        """The driver found a message over its size limit and kept only ``frames`` of it:
        as :meth:`reject_too_many_frames`."""
        exc = MessageTooLarge(f"{nbytes} bytes; the limit is {limit}")
        self._reject_cut(frames, exc.reason, str(exc), now, principal)

    def undeliverable(self, frames: list[bytes], why: str) -> None:
        """The driver could not send ``frames`` (its peer is gone, or its queue is full).

        A worker we cannot reach is treated as gone: what it holds is redelivered. Any other
        message is dropped and counted: replies in ``dropped_replies``, the rest (echoes,
        pongs, reconnects) in ``undeliverable``.
        """
        peer = frames[0]
        worker = self._workers.get(peer)
        if worker is not None:
            logger.warning("worker %s unreachable (%s): removing it", peer.hex(), why)
            self._count(f"worker_unreachable_{why}")
            self._remove_worker(worker)
        elif len(frames) > 3 and frames[3] in _REPLY_TYPE_FRAMES:
            self._dropped_replies += 1
        else:
            self._undeliverable += 1

    def expire(self, now: float) -> None:
        """Remove workers silent for ``liveness x heartbeat_interval`` (Rule 5) and workers
        holding a request past its work timeout (Rule 7); redeliver their work."""
        self._now = now
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, token, pending = heapq.heappop(deadlines)
            worker = pending.holder
            if worker is None or token != pending.token:
                continue
            logger.warning(
                "worker %s held a request for %r past its work timeout (%.3f s): removing it",
                worker.ident.hex(),
                pending.service.name[:64],
                pending.work_timeout,
            )
            self._work_timeouts += 1
            self._quarantine[worker.ident] = now + self._timeout
            self._send(worker.ident, worker.width, MessageType.RECONNECT)
            self._remove_worker(worker)
        if self._quarantine:
            for ident, until in list(self._quarantine.items()):
                if until <= now:
                    del self._quarantine[ident]
                    released = self._workers.get(ident)
                    if released is not None and released.credit:
                        self._use_credit(released)
        order = self._by_activity
        workers = self._workers
        while order:
            ident = next(iter(order))
            worker = workers[ident]
            if worker.expiry > now:
                break
            logger.info("worker %s expired", ident.hex())
            self._expired += 1
            self._remove_worker(worker)

    def next_expiry(self) -> float | None:
        """When :meth:`expire` next has something to do, unless messages arrive first
        (``None``: nothing to expire)."""
        when = None
        if self._by_activity:
            when = self._workers[next(iter(self._by_activity))].expiry
        deadlines = self._deadlines
        while deadlines and (
            deadlines[0][3].holder is None or deadlines[0][2] != deadlines[0][3].token
        ):
            heapq.heappop(deadlines)  # answered or redelivered: stale
        if deadlines:
            top = deadlines[0][0]
            when = top if when is None or top < when else when
        if self._quarantine:
            top = min(self._quarantine.values())
            when = top if when is None or top < when else when
        return when

    # ------------------------------------------------------------ handlers

    def _reject_cut(
        self, frames: list[bytes], reason: str, detail: str, now: float, principal: str | None
    ) -> None:
        """A message cut at a limit: an error reply if it is a request with its metadata."""
        self._now = now
        peer = frames[0]
        guard = self.guard
        if guard is not None and not self._admitted(peer, principal):
            return
        try:
            msg, width = parse(frames[1:])
        except RemoteProtocolError:
            msg, width = None, 1
        if not isinstance(msg, Request):
            self._reject(peer, reason, detail)
            return
        worker = self._workers.get(peer)
        if worker is None:
            self._remember_width(peer, width)
        client = msg.client
        released = False
        if worker is not None and client is not None:
            # A worker forwarding a request it holds: that one is finished, and its client
            # is the one to tell.
            answered = self._answered(peer, worker, client, msg.metadata)
            if answered is None:
                return
            client, released = answered
        elif client is None or (client != peer and not self.allow_foreign_address):
            client = peer
        self._refuse(client, msg.metadata, reason, detail)
        if worker is not None:
            self._credit(worker, released=released)

    def _on_request(self, peer: bytes, worker: _Worker | None, msg: Request, width: int) -> None:
        client = msg.client
        released = False
        if client is None:
            client = peer
        elif worker is not None:
            # A forward: the worker passes on a request it holds (matched exactly; a worker
            # naming an address without holding its request releases nothing).
            answered = self._answered(peer, worker, client, msg.metadata)
            if answered is None:
                return
            client, released = answered
        elif client != peer and not self.allow_foreign_address:
            self._refuse(
                peer,
                msg.metadata,
                "forbidden_address",
                "only registered workers may send a request for another client's address",
            )
            return
        refused = self._accept(client, msg, forward=msg.client is not None and worker is not None)
        if refused is not None:
            # The error reply goes to the request's client: for a forward, the original one.
            self._refuse(client, msg.metadata, *refused)
        if worker is not None:
            self._credit(worker, released=released)

    def _accept(self, client: bytes, msg: Request, *, forward: bool) -> tuple[str, str] | None:
        """Queue or dispatch ``msg``; on refusal, return ``(code, message)``."""
        name = msg.service
        service = self._services.get(name)
        if service is None:
            if len(name) > self.max_service_name:
                return "service_name_too_long", f"service name of {len(name)} bytes"
            if len(self._services) >= self.max_services:
                return "too_many_services", f"{len(self._services)} services already known"
            service = self._services[name] = _Service(name)
        idle = service.idle
        if not idle and len(service.queue) >= self.max_queue:
            return "queue_full", f"queue for {name[:64]!r} is full"
        load = self._loads.get(client)
        if load is None:
            load = _Load()
        if load.inflight >= self.max_client_inflight:
            return "client_limit", f"{load.inflight} requests of this client unanswered"
        if not idle and load.queued >= self.max_client_queued:
            return "client_limit", f"{load.queued} requests of this client queued"
        if not load.inflight:
            self._loads[client] = load
        metadata = msg.metadata
        work_timeout = request_work_timeout(metadata)
        if work_timeout is None:
            work_timeout = self.work_timeout
        self._requests += 1
        if forward:
            self._forwards += 1
        load.inflight += 1
        shown = client if self.guard is None else self.guard.seal(client)
        tail = [name, shown, b"", *metadata, b"", *msg.data]
        pending = _Pending(self._requests, service, client, metadata, tail, load, work_timeout)
        if idle:
            self._dispatch(next(iter(idle.values())), pending)
        else:
            service.queue.append(pending)
            load.queued += 1
        return None

    def _on_reply(self, peer: bytes, worker: _Worker | None, msg: Reply) -> None:
        if worker is None:
            self._reject(peer, "reply_from_non_worker", "only registered workers may reply")
            return
        client = msg.client
        if client is None:
            self._reject(peer, "reply_without_client", "reply has no client address")
            self._credit(worker, released=False)
            return
        answered = self._answered(peer, worker, client, msg.metadata)
        if answered is None:
            return
        client, released = answered
        self._replies += 1
        self._route_reply(client, msg.metadata, msg.data)
        self._credit(worker, released=released)

    def _on_register(
        self,
        peer: bytes,
        worker: _Worker | None,
        name: bytes,
        width: int,
        now: float,
        principal: str | None,
    ) -> None:
        if len(name) > self.max_service_name:
            self._reject(peer, "service_name_too_long", f"{len(name)} bytes")
            return
        guard = self.guard
        if guard is not None:
            key = None if principal is None else principal.encode("ascii", "replace")
            if not guard.may_register(key, name):
                self._refuse_registration(peer, width, name, principal)
                return
        service = self._services.get(name)
        if (
            worker is not None
            and len(worker.services) >= self.max_services_per_worker
            and service not in worker.services
        ):
            self._reject(peer, "too_many_services", f"registration for {name[:64]!r}")
            return
        if service is None:
            # Not bounded by max_services, which bounds what *requests* create: requests for
            # made-up names must not lock real workers out. Workers are bounded per worker.
            service = self._services[name] = _Service(name)
        if worker is None:
            worker = _Worker(peer, width)
            worker.expiry = now + self._timeout
            self._workers[peer] = worker
            self._by_activity[peer] = None
            logger.info("worker %s registered for %r", peer.hex(), name)
        if service not in worker.services:
            worker.services.append(service)
            service.workers += 1
        self._send(peer, width, MessageType.REGISTER, name)
        self._credit(worker, released=False)

    def _admitted(self, peer: bytes, principal: str | None) -> bool:
        """Rule S: whether the guard admits a message from ``peer`` under ``principal``
        (if not, it is counted and logged)."""
        assert self.guard is not None
        refused = self.guard.admit(peer, principal)
        if refused is not None:
            self._reject(peer, refused, f"key {principal}")
            return False
        return True

    def _remember_width(self, peer: bytes, width: int) -> None:
        """Remember a non-worker peer's type width (an LRU of 4-byte peers), to answer in
        kind."""
        wide = self._wide
        if width == 4:
            wide[peer] = None
            wide.move_to_end(peer)
            if len(wide) > self.max_width_peers:
                wide.popitem(last=False)
        elif peer in wide:
            del wide[peer]

    def _answered(
        self, peer: bytes, worker: _Worker, client: bytes, metadata: tuple[bytes, ...]
    ) -> tuple[bytes, bool] | None:
        """A worker's reply or forward names ``client``: the client's real address
        (unsealed in secure mode) and whether it finished a request the worker held; or
        ``None`` if the address is not one the broker gave (Rule S, counted)."""
        if self.guard is not None:
            unsealed = self._unseal(peer, worker, client, metadata)
            if unsealed is None:
                return None
            client = unsealed
        return client, self._release(worker, client, metadata)

    def _unseal(
        self, peer: bytes, worker: _Worker, sealed: bytes, metadata: tuple[bytes, ...]
    ) -> bytes | None:
        """Rule S: the client address sealed in a worker's reply or forward, or ``None``
        (counted, logged, and the worker's credit kept) if it is not one the broker made."""
        assert self.guard is not None
        client = self.guard.unseal(sealed)
        if client is None:
            self._reject(peer, "bad_client_address", "not a client address the broker gave")
            self._credit(worker, released=False)
        return client

    def _refuse_registration(
        self, peer: bytes, width: int, name: bytes, principal: str | None
    ) -> None:
        """Rule S: count, log, and tell the worker (a reply with no client address)."""
        detail = f"key {principal} may not register {name[:64]!r}"
        self._reject(peer, "registration_refused", detail)
        self.outbox.append(
            [
                peer,
                b"",
                PROTOCOL,
                TYPE_FRAMES[width][MessageType.REPLY],
                b"",
                *((name,) if name else ()),
                b"",
                *error_reply_data("registration_refused", detail),
            ]
        )

    # ------------------------------------------------------------- routing

    def _credit(self, worker: _Worker, *, released: bool) -> None:
        """Rule 1: grant credit (+1 for a finished request, else at least 1), then use it."""
        if released:
            worker.credit += 1
        elif worker.credit < 1:
            worker.credit = 1
        if self._quarantine and worker.ident in self._quarantine:
            return  # Rule 7: it may register and heartbeat, but gets no work for now
        self._use_credit(worker)

    def _use_credit(self, worker: _Worker) -> None:
        # Serve the oldest requests across the worker's services (usually just one).
        services = worker.services
        while worker.credit:
            best: _Service | None = None
            for service in services:
                if service.queue and (best is None or service.queue[0].seq < best.queue[0].seq):
                    best = service
            if best is None:
                break
            pending = best.queue.popleft()
            pending.load.queued -= 1
            self._dispatch(worker, pending)
        if worker.credit:
            ident = worker.ident
            for service in services:
                if ident not in service.idle:
                    service.idle[ident] = worker

    def _dispatch(self, worker: _Worker, pending: _Pending) -> None:
        """Give ``pending`` to ``worker``, taking one credit; a worker left with credit goes
        to the back of the idle lists (least recently used first)."""
        worker.credit -= 1
        ident = worker.ident
        for service in worker.services:
            idle = service.idle
            if ident in idle:
                if worker.credit:
                    idle.move_to_end(ident)
                else:
                    del idle[ident]
        held = worker.held
        if len(held) >= self.max_held:
            # Only a worker that changes metadata gets here: stop tracking its oldest.
            self._finish(held.pop(0))
            self._count("held_overflow")
        held.append(pending)
        pending.holder = worker
        if pending.work_timeout is not None:
            pending.token += 1
            self._timed_held += 1
            deadlines = self._deadlines
            heapq.heappush(
                deadlines,
                (self._now + pending.work_timeout, pending.seq, pending.token, pending),
            )
            if len(deadlines) > 2 * self._timed_held + 1024:
                # Mostly answered requests' entries: keep the live ones (amortised O(1)).
                self._deadlines = [
                    e for e in deadlines if e[3].holder is not None and e[2] == e[3].token
                ]
                heapq.heapify(self._deadlines)
        self._dispatched += 1
        self.outbox.append(
            [
                ident,
                b"",
                PROTOCOL,
                TYPE_FRAMES[worker.width][MessageType.REQUEST],
                *pending.tail,
            ]
        )

    def _release(self, worker: _Worker, client: bytes, metadata: tuple[bytes, ...]) -> bool:
        """Rule 2: the worker answered (replied to or forwarded) a request it held.

        Matched by client address and metadata, which workers must pass on unchanged. A
        reply that matches nothing (a late answer from before a re-registration, or a worker
        that changed the metadata) releases nothing: guessing could release a request the
        worker is still running, which would then not be redelivered if it died.
        """
        for i, pending in enumerate(worker.held):
            if pending.client == client and pending.metadata == metadata:
                del worker.held[i]
                self._finish(pending)
                return True
        self._unmatched += 1
        return False

    def _unhold(self, pending: _Pending) -> None:
        """``pending`` is no longer held by a worker."""
        pending.holder = None
        if pending.work_timeout is not None:
            self._timed_held -= 1

    def _finish(self, pending: _Pending) -> None:
        """The broker is done with held ``pending`` (answered, or no longer tracked)."""
        self._unhold(pending)
        load = pending.load
        load.inflight -= 1
        if not load.inflight:
            self._loads.pop(pending.client, None)

    def _remove_worker(self, worker: _Worker) -> None:
        """Rule 5: forget the worker; its held requests go back to the front of the queue."""
        ident = worker.ident
        del self._workers[ident]
        del self._by_activity[ident]
        held, worker.held = worker.held, []
        for service in worker.services:
            service.workers -= 1
            service.idle.pop(ident, None)
            if not service.workers and not service.queue and not held:
                # Nobody provides it and nothing waits for it: forget it (bounds memory).
                del self._services[service.name]
        worker.services = []
        for pending in reversed(held):
            pending.redeliveries += 1
            service = pending.service
            if pending.redeliveries > self.max_redeliveries:
                self._finish(pending)
                self._count("redelivery_limit")
                self._error_reply(
                    pending.client,
                    pending.metadata,
                    "redelivery_limit",
                    f"request given to {pending.redeliveries} workers that all went away",
                )
                continue
            self._unhold(pending)
            self._redeliveries += 1
            service.queue.appendleft(pending)
            pending.load.queued += 1
        for pending in held:
            service = pending.service
            while service.idle and service.queue:
                queued = service.queue.popleft()
                queued.load.queued -= 1
                self._dispatch(next(iter(service.idle.values())), queued)

    # ------------------------------------------------------------- output

    def _width_of(self, peer: bytes) -> int:
        worker = self._workers.get(peer)
        if worker is not None:
            return worker.width
        return 4 if peer in self._wide else 1

    def _send(self, peer: bytes, width: int, mtype: MessageType, *body: bytes) -> None:
        self.outbox.append([peer, b"", PROTOCOL, TYPE_FRAMES[width][mtype], *body])

    def _route_reply(
        self, client: bytes, metadata: tuple[bytes, ...], data: tuple[bytes, ...]
    ) -> None:
        """A reply to ``client``, in its width, client address kept (protocol.md #4)."""
        tframe = TYPE_FRAMES[self._width_of(client)][MessageType.REPLY]
        self.outbox.append([client, b"", PROTOCOL, tframe, client, b"", *metadata, b"", *data])

    def _error_reply(
        self, client: bytes, metadata: tuple[bytes, ...], code: str, message: str
    ) -> None:
        self._route_reply(client, metadata, error_reply_data(code, message))

    def _refuse(self, client: bytes, metadata: tuple[bytes, ...], code: str, message: str) -> None:
        """Refuse a request: count, log once, and tell its client with an error reply."""
        self._reject(client, code, message)
        self._error_reply(client, metadata, code, message)

    def _count(self, reason: str) -> None:
        self._rejections[reason] = self._rejections.get(reason, 0) + 1

    def _reject(self, peer: bytes, reason: str, detail: str) -> None:
        self._count(reason)
        key = (peer, reason)
        if key not in self._logged:
            self._logged[key] = None
            if len(self._logged) > 4096:
                self._logged.popitem(last=False)
            logger.warning("rejected message from peer %s: %s (%s)", peer.hex(), reason, detail)

    # --------------------------------------------------------- statistics

    def statistics(self) -> BrokerStatistics:
        """A snapshot of the counters and per-service gauges."""
        return BrokerStatistics(
            requests=self._requests,
            replies=self._replies,
            forwards=self._forwards,
            dispatched=self._dispatched,
            redeliveries=self._redeliveries,
            dropped_replies=self._dropped_replies,
            undeliverable=self._undeliverable,
            reconnects_sent=self._reconnects_sent,
            unmatched=self._unmatched,
            expired_workers=self._expired,
            work_timeouts=self._work_timeouts,
            rejections=dict(self._rejections),
            workers=len(self._workers),
            clients=len(self._loads),
            services={
                name: ServiceStatistics(s.workers, len(s.idle), len(s.queue))
                for name, s in self._services.items()
            },
        )
