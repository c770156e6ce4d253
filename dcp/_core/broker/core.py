"""The broker core: a pure state machine (sans-IO) serving every wire dialect on one socket.

It takes whole messages as the broker's ROUTER sees them (routing id first) together with the
current time, and appends the messages to send to :attr:`BrokerCore.outbox`. It knows nothing
of sockets, anyio or clocks; :class:`dcp.Broker` is the thin driver that feeds it.

Layout: each message is sniffed (:mod:`dcp.wire.sniff`) and parsed by its dialect's codec
(:mod:`dcp.wire`); this module handles DCP v1 peers, :mod:`dcp._core.broker.majordomo` the
Majordomo ones; both drive the protocol-blind routing core (:mod:`dcp._core.broker.routing`: Rules
1, 2, 5, 7), which keeps per-peer sessions (:mod:`dcp._core.broker.peers`: liveness Rules L1-L4),
admits requests (:mod:`dcp._core.broker.admission`), reads their options and keeps its queues
(:mod:`dcp._core.broker.queues`: no-wait, the caller's deadline, retries that replace their queued
copy, Rules Q1-Q4), answers ``mmi.*`` (:mod:`dcp._core.broker.directory`) and writes to each peer
in its dialect (:mod:`dcp._core.broker.dialects`).

Output convention (the same for every dcp core: this one,
:class:`~dcp._core.worker.core.WorkerCore` and :class:`~dcp._core.client.tracker.RequestTracker`):
input methods take ``now`` and append what to send to ``outbox`` (here ROUTER frames, routing id
first), returning only their own answer, if any; the driver drains it after each call or batch
(``out, core.outbox = core.outbox, []``).

DCP rules (this module):

Rule 3 - Addresses. A request without a client address gets the sender's address inserted.
  One that carries an address keeps it (a worker forwarding work), but only a registered
  worker may name an address other than its own, unless ``allow_foreign_address``.
  A reply is routed to its client address in the client's dialect (for a DCP client, the
  type-frame width, 1 or 4 bytes, it used). A reply for a peer that is not connected is
  kept and sent again for ``liveness x heartbeat_interval`` (:mod:`dcp._core.broker.unreachable`),
  then counted and dropped.
Rule 4 - Heartbeats. Every ping from a worker is answered with a pong and asks for work (Rule
  1); a pong from a worker is a keep-alive that asks for no work and is answered with a pong
  (dcp extension). A ping or pong from a peer that is not a registered worker is answered
  with reconnect (0x06). A worker that sends reconnect leaves at once (dcp extension).
Rule 6 - Bounds and bad input. A message in no known dialect (``unknown_protocol``), a
  malformed one, or one that breaks a limit, is counted by reason, logged once per peer, and
  dropped; when its sender can be told (a request, even one cut short at a size or frame
  limit, if its metadata survived), it gets a dcp error reply instead. A registered worker
  that sends another dialect's message is refused (``dialect_mismatch``). Nothing raises out
  of :meth:`BrokerCore.receive`. (Messages the driver cut at a limit, or could not send:
  :mod:`dcp._core.broker.driver_reports`.)
Rule S - Security (only with a :class:`~dcp._core.broker.guard.Guard`, i.e. CURVE on; its rules
  S1-S4 are in :mod:`dcp._core.broker.guard`). Each message comes with its sender's key
  (*principal*); one the guard does not admit is counted and dropped. A registration the guard does
  not permit is counted (``registration_refused``), logged, and refused in the worker's dialect
  (DCP: a reply with no client address, the service as its one metadata part, and the data of a
  ``registration_refused`` error reply; MDP: DISCONNECT). Client addresses in requests given to
  workers are sealed; a worker's answer or forward must carry a sealed one (else
  ``bad_client_address``).

What the core does NOT do: socket options, message-size limits (zmq's MAXMSGSIZE in the
driver), timers (the driver calls :meth:`BrokerCore.expire`), persistence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dcp._core.broker import directory, driver_reports
from dcp._core.broker.admission import Limits
from dcp._core.broker.approval import Approval, Approvals, decide
from dcp._core.broker.dbp import DbpPeers
from dcp._core.broker.dialects import DCP1, DCP4, DcpDialect, Dialect
from dcp._core.broker.guard import Guard
from dcp._core.broker.majordomo import Majordomo
from dcp._core.broker.mc0 import Mc0Peers
from dcp._core.broker.peers import Session, Sessions
from dcp._core.broker.pubsub_peers import PUBSUB_PREFIX, PubSubOptions
from dcp._core.broker.unreachable import EarlyReplies, Unreachable
from dcp._errors import RemoteProtocolError
from dcp._stats import BrokerStatistics, QueueStatistics
from dcp.wire.dcp1 import PROTOCOL, parse
from dcp.wire.messages import ERROR_MARKER, MessageType, Register, Reply, Request
from dcp.wire.sniff import Family, sniff
from dcp.wire.streams import TYPE_FRAMES as STREAM_TYPE_FRAMES

__all__ = ["BrokerCore"]


class BrokerCore(Mc0Peers, Majordomo, DbpPeers):
    """The broker's state machine (see the module docstring for its rules and layout).

    :param heartbeat_interval: seconds between worker heartbeats (agreed with the workers)
    :param liveness: heartbeats a DCP worker may miss before it is considered gone
    :param allow_foreign_address: let any peer (not only registered workers) send requests
        carrying a client address other than its own
    :param max_queue: requests queued per service; more get a ``queue_full`` error reply
    :param max_services: distinct services known at once; a request for one more gets a
        ``too_many_services`` error reply (registrations are not refused for this)
    :param max_services_per_worker: services one worker may register; more are refused
    :param max_service_name: bytes in a service name; longer ones are refused
    :param max_redeliveries: times a request is put back after its worker died before the
        client gets a ``redelivery_limit`` error reply instead
    :param max_width_peers: non-worker peers whose dialect (a 4-byte DCP type width, or a
        Majordomo form) is remembered (LRU)
    :param max_held: requests tracked per worker for redelivery; past this (only a worker
        that changes metadata, so its answers match nothing, gets there) the oldest is
        no longer tracked (counted as ``held_overflow``)
    :param max_client_queued: requests of one client waiting in queues; more get a
        ``client_limit`` error reply
    :param max_client_inflight: requests of one client accepted and not yet answered
        (queued or held by a worker); more get a ``client_limit`` error reply
    :param work_timeout: seconds a worker may hold a request that does not carry its own
        work timeout (``None``: no limit); past it the worker is treated as lost (Rule 7)
    :param busy_timeout: seconds a busy worker that does not beat while busy may be silent
        (peers Rule L3); it is probed meanwhile, so a dead connection is noticed sooner
    :param reply_grace: seconds a reply whose client is not connected is kept and sent
        again, and a reply from a peer not registered is kept for it to register
        (:mod:`dcp._core.broker.unreachable`; ``None``: ``liveness x heartbeat_interval``)
    :param mdp_timeout: seconds an idle Majordomo worker may be silent (its libraries beat
        every 2.5 s by default)
    :param guard: the security rules for CURVE mode (``None``: off; see Rule S)
    :param pubsub: pub/sub settings (:mod:`dcp._core.broker.pubsub_peers`,
        :mod:`dcp._core.broker.mc0`)
    :param approve: registrations wait for an approver (:mod:`dcp._core.broker.approval`):
        the driver answers the questions in ``approvals.asked`` with :meth:`decide`
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
        busy_timeout: float = 60.0,
        mdp_timeout: float = 10.0,
        reply_grace: float | None = None,
        guard: Guard | None = None,
        pubsub: PubSubOptions | None = None,
        approve: bool = False,
    ) -> None:
        if heartbeat_interval <= 0 or liveness < 1:
            raise ValueError("heartbeat_interval must be > 0 and liveness >= 1")
        if work_timeout is not None and not 0 < work_timeout < float("inf"):
            raise ValueError("work_timeout must be None or a positive finite number")
        if not 0 < busy_timeout < float("inf") or not 0 < mdp_timeout < float("inf"):
            raise ValueError("busy_timeout and mdp_timeout must be positive finite numbers")
        timeout = heartbeat_interval * liveness
        super().__init__(
            limits=Limits(
                max_queue=max_queue,
                max_services=max_services,
                max_service_name=max_service_name,
                max_redeliveries=max_redeliveries,
                max_held=max_held,
                max_services_per_worker=max_services_per_worker,
                max_client_queued=max_client_queued,
                max_client_inflight=max_client_inflight,
            ),
            sessions=Sessions(
                timeout=timeout, mdp_timeout=mdp_timeout, max_remembered=max_width_peers
            ),
            work_timeout=work_timeout,
            quarantine=timeout,
            guard=guard,
            approvals=Approvals() if approve else None,
        )
        self.heartbeat_interval = heartbeat_interval
        self.liveness = liveness
        self.allow_foreign_address = allow_foreign_address
        self.busy_timeout = busy_timeout
        #: Replies whose client is not connected yet, sent again for a while (Rules U1-U3).
        grace = liveness * heartbeat_interval if reply_grace is None else reply_grace
        self.unreachable = Unreachable(grace)
        #: Replies from peers that may be about to register (Rules U4-U5).
        self.early = EarlyReplies(grace)
        self._next_beat = 0.0
        #: When the driver started serving (its clock; ``None``: not yet), for the uptime.
        self.started: float | None = None
        self.init_pubsub(pubsub)

    # ------------------------------------------------------------------ input

    def receive(self, frames: list[bytes], now: float, principal: str | None = None) -> None:
        """Handle one message as received by the ROUTER (routing id first).

        :param principal: the sender's key, which the guard checks (Rule S)
        """
        self._now = now
        peer = frames[0]
        if self.guard is not None and not self._admitted(peer, principal):
            return
        body = frames[1:]
        worker = self.sessions.workers.get(peer)
        # Most traffic is DCP v1: test for it before sniffing (the hot path).
        if len(body) > 2 and body[1] == PROTOCOL and not body[0]:
            family: Family | None = Family.DCP
        else:
            family = sniff(body)
        if family is Family.DCP:
            self._on_dcp(peer, body, worker, now, principal)
        elif family is Family.MDP:
            self._on_mdp(peer, body, worker, now, principal)
        elif family is Family.MC0:
            self.on_mc0(peer, body, now, principal)
        elif family is Family.DBP:
            self._on_dbp(peer, body, worker, now, principal)
        else:
            self.reject(peer, "unknown_protocol", "no DCP, MDP or mc0 header")

    def _on_dcp(
        self,
        peer: bytes,
        body: Sequence[bytes],
        worker: Session | None,
        now: float,
        principal: str | None,
    ) -> None:
        if len(body) > 2 and body[2] in STREAM_TYPE_FRAMES and body[1] == PROTOCOL:
            self.on_stream(peer, body, worker, now)  # dcp streams (_core/streams.py)
            return
        try:
            msg, width = parse(body)
        except RemoteProtocolError as exc:
            self.reject(peer, exc.reason, str(exc))
            return
        dialect = DCP1 if width == 1 else DCP4
        if worker is not None:
            if worker.dialect.__class__ is not DcpDialect:
                self.reject(peer, "dialect_mismatch", "DCP from a %s worker", worker.dialect.name)
                return
            # Answer in the type width it last used; peers Rule L1 (Sessions.heard, inlined).
            worker.dialect = dialect
            worker.heard = now
            worker.expiry = now + worker.timeout
            worker.order.move_to_end(peer)
        else:
            self.sessions.remember(peer, dialect)
        mtype = msg.type
        if mtype is MessageType.REQUEST:
            assert isinstance(msg, Request)
            if msg.service[:5] == PUBSUB_PREFIX:
                self.on_pubsub(peer, msg, dialect, now, principal)
            else:
                self._on_request(peer, worker, msg, dialect)
        elif mtype is MessageType.REPLY:
            assert isinstance(msg, Reply)
            self._on_reply(peer, worker, msg)
        elif mtype is MessageType.PING or mtype is MessageType.PONG:
            if worker is None:
                self.outbox.append(dialect.expel(peer))
                self.counters.reconnects_sent += 1
            else:
                self.outbox.append(dialect.beat(peer))
                if mtype is MessageType.PING:
                    if worker.held:
                        worker.beats_busy = True
                    self.credit(worker, released=False)
                else:
                    # A worker's pong is a dcp keep-alive: dcp workers beat while busy.
                    worker.beats_busy = True
        elif mtype is MessageType.REGISTER:
            assert isinstance(msg, Register)
            session = self.register(peer, worker, msg.service, dialect, now, principal)
            if session is not None and len(self.early):
                # Rule U4: its answers that came ahead of this registration.
                for early in self.early.registered(peer):
                    assert isinstance(early, Reply)
                    self._on_reply(peer, session, early)
        elif worker is None:  # RECONNECT
            self.reject(peer, "unexpected_reconnect", "reconnect from a non-worker")
        else:
            self.remove_worker(worker)

    def _on_request(
        self, peer: bytes, worker: Session | None, msg: Request, dialect: Dialect
    ) -> None:
        client = msg.client
        released = False
        origin = dialect
        if client is None:
            client = peer
        elif worker is not None:
            forwarded = self._forwarded(peer, worker, client, msg.metadata)
            if forwarded is None:
                return
            client, origin, released = forwarded
        elif client != peer:
            if not self.allow_foreign_address:
                self.refuse(
                    peer,
                    dialect,
                    msg.service,
                    msg.metadata,
                    "forbidden_address",
                    "only registered workers may send a request for another client's address",
                )
                return
            origin = self.sessions.dialect_of(client)
        name = msg.service
        if name[:4] == b"mmi.":
            self.answer_directly(client, origin, name, msg.metadata, msg.data)
        else:
            forward = msg.client is not None and worker is not None
            refused = self.submit(client, origin, name, msg.metadata, msg.data, forward=forward)
            if refused is not None:
                # The error reply goes to the request's client: for a forward, the original.
                self.refuse(client, origin, name, msg.metadata, *refused)
        if worker is not None:
            self.credit(worker, released=released)

    def _forwarded(
        self, peer: bytes, worker: Session, client: bytes, metadata: tuple[bytes, ...]
    ) -> tuple[bytes, Dialect, bool] | None:
        """A worker's forward names ``client``: the client's real address, its dialect, and
        whether the forward finished a request the worker held (matched exactly; a worker
        naming an address without holding its request releases nothing); ``None`` if the
        address is not one the broker gave (Rule S)."""
        answered = self.answered(peer, worker, client, metadata)
        if answered is None:
            return None
        client, finished = answered
        if finished is not None:
            return client, finished.origin, True
        return client, self.sessions.dialect_of(client), False

    def _on_reply(self, peer: bytes, worker: Session | None, msg: Reply) -> None:
        if worker is None:
            # Rule U4 (dcp._core.broker.unreachable): it may register in a moment.
            if not self.early.keep(peer, msg, self._now):
                self.reject(peer, "reply_from_non_worker", "only registered workers may reply")
            return
        client = msg.client
        if client is None:
            self.reject(peer, "reply_without_client", "reply has no client address")
            self.credit(worker, released=False)
            return
        answered = self.answered(peer, worker, client, msg.metadata)
        if answered is None:
            return
        client, pending = answered
        self.counters.replies += 1
        if pending is not None:
            origin, name = pending.origin, pending.service.name
            data = msg.data
            if data and data[0] == ERROR_MARKER:
                pending.service.errors += 1  # directory Rule D5
        else:
            origin, name = self.sessions.dialect_of(client), b""
        self.answer(client, origin.reply(client, name, msg.metadata, msg.data))
        self.credit(worker, released=pending is not None)

    def _admitted(self, peer: bytes, principal: str | None) -> bool:
        """Rule S: whether the guard admits a message from ``peer`` under ``principal``
        (if not, it is counted and logged)."""
        assert self.guard is not None
        refused = self.guard.admit(peer, principal)
        if refused is not None:
            self.reject(peer, refused, "key %s", principal)
            return False
        return True

    def decide(self, token: int, answer: Approval, now: float) -> None:
        """The approver answered registration question ``token`` (approval Rule A2)."""
        decide(self, token, answer, now)

    # ------------------- what the driver reports (_core/driver_reports.py; Rules 6 and U1)

    reject_too_many_frames = driver_reports.reject_too_many_frames
    reject_too_large = driver_reports.reject_too_large
    undeliverable = driver_reports.undeliverable

    # --------------------------------------------------------------- time

    def expire(self, now: float) -> None:
        """Time passes: work timeouts (Rule 7), expiries of queued requests (queues Rule
        Q3), liveness (peers Rules L2-L3: expire, or probe a busy worker), and the broker's
        heartbeats to MDP workers (Rule M4)."""
        self._now = now
        self.time_out_work(now)
        self._queues.expire(now)
        if self.unreachable.kept:  # Rule U2 (dcp._core.broker.unreachable)
            again, expired = self.unreachable.due(now)
            self.outbox += again
            self.counters.dropped_replies += expired
        if len(self.early):  # Rule U4
            for peer in self.early.expire(now):
                self.reject(peer, "reply_from_non_worker", "only registered workers may reply")
        sessions = self.sessions
        for session in sessions.due(now):
            if session.ident not in sessions.workers:
                continue
            held = session.held
            if held and not session.beats_busy:
                limit = self.busy_timeout
                for pending in held:
                    if pending.work_timeout is not None and pending.work_timeout > limit:
                        limit = pending.work_timeout
                if now - session.heard < limit:
                    # Rule L3: a send to a dead connection fails, which removes it.
                    self.outbox.append(session.dialect.beat(session.ident))
                    sessions.probed(session, now)
                    continue
            self.counters.expired += 1
            self.remove_worker(session, "expired")
        if sessions.beating and now >= self._next_beat:
            self._beat(now)
            self._next_beat = now + self.heartbeat_interval
        self.expire_pubsub(now)

    def next_expiry(self) -> float | None:
        """When :meth:`expire` next has something to do, unless messages arrive first
        (``None``: nothing to expire)."""
        when = self.sessions.next_expiry()
        work = self.next_work_deadline()
        if work is not None and (when is None or work < when):
            when = work
        if self.sessions.beating and (when is None or self._next_beat < when):
            when = self._next_beat
        pubsub = self.next_pubsub_expiry()
        if pubsub is not None and (when is None or pubsub < when):
            when = pubsub
        return when

    # --------------------------------------------------------- statistics

    def overview(self) -> dict[str, Any]:
        """Broker-wide figures for ``mmi.broker`` (:func:`~.directory.broker_entry`);
        the uptime counts from :attr:`started`, which the driver sets when it has bound."""
        errors = sum(s.errors for s in self._services.values())
        listed = sum(s.requests for s in self._services.values())
        busy = sum(1 for w in self.sessions.workers.values() if w.held)
        started = self._now if self.started is None else self.started
        uptime = max(0.0, self._now - started)
        return directory.broker_entry(self.statistics(), uptime, errors, busy, listed)

    def statistics(self) -> BrokerStatistics:
        """A snapshot of the counters and per-service gauges."""
        c = self.counters
        return BrokerStatistics(
            requests=c.requests,
            replies=c.replies,
            forwards=c.forwards,
            dispatched=c.dispatched,
            redeliveries=c.redeliveries,
            dropped_replies=c.dropped_replies,
            undeliverable=c.undeliverable,
            reconnects_sent=c.reconnects_sent,
            unmatched=c.unmatched,
            expired_workers=c.expired,
            work_timeouts=c.work_timeouts,
            rejections=dict(c.rejections),
            workers=len(self.sessions.workers),
            clients=len(self._loads),
            services={
                name: QueueStatistics(s.workers, len(s.idle), s.queued())
                for name, s in self._services.items()
            },
            partials=c.partials,
            expired_in_queue=c.expired_in_queue,
            replaced=c.replaced,
            streams=self.stream_statistics(),
        )
