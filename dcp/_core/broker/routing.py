"""Protocol-blind routing: per-service queues, least-recently-used idle workers, credit, held
requests, redelivery and work timeouts. Sans-IO. What a queue holds, a queued request's
deadline and a retry's replacement are :mod:`.queues` (Rules Q1-Q4).

This module does not know which wire protocol a peer speaks. It sees worker sessions
(:mod:`.peers`), service names, client addresses, a request's *metadata* (opaque parts the
client's dialect supplies and gets back in the answer; empty for MDP clients), its data parts,
and the client's dialect; it writes through each peer's :class:`~.dialects.Dialect`, which
turns a decision into frames. The dialect handlers in :mod:`dcp._core.broker.core` call it.

Rule 1 - Credit. A worker has *credit*: how many more requests it may be given. Registering,
  or asking for work (a DCP ping, or a request sent without finishing a held one) set it to at
  least 1: idle heartbeats do not pile up credit. An answer that finishes a held request adds
  1 (that request's slot is free again). Each request given to the worker takes 1. So a plain
  worker holds one request until it answers, and a dcp worker with N slots keeps N busy by
  pinging only when it has no credit left and a slot free.
Rule 2 - Queues. Each service has a FIFO queue of requests. A worker with credit and nothing
  queued for its services waits in its services' idle lists; the least recently used idle
  worker gets the next request; a worker serving several services takes the oldest request
  among them. A request is *held* by the worker it was given to until that worker answers it
  or leaves. An answer is matched by client address and, for dialects that carry it,
  metadata (DCP workers must pass it on unchanged; failing an exact match, one equal but for
  dcp options other than the request id matches: a traced forward carries its own trace
  context, ``docs/tracing.md``); an answer that matches nothing releases
  nothing (guessing could release a request the worker is still running, which would then
  not be redelivered if it died).
Rules 5 (redelivery) and 7 (work timeouts), for workers that go away and what they held:
:mod:`.redelivery`.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from typing import Any

from dcp._core.broker import admission, directory, redelivery
from dcp._core.broker.admission import Limits, Load
from dcp._core.broker.approval import Approvals
from dcp._core.broker.dialects import Dialect
from dcp._core.broker.guard import Guard
from dcp._core.broker.peers import Session, Sessions
from dcp._core.broker.queues import Expiry, Pending, QueueDeadlines, Service, read_options
from dcp._json import encode_json
from dcp._stats import DURATION_BUCKETS, BrokerCounters
from dcp._util import DeadlineHeap, LogEvery, PeerId
from dcp.wire.options import without_options

__all__ = ["Pending", "Routing", "Service"]


class Routing:
    """Queues, credit, held requests, redelivery and work timeouts (the module's rules).

    The broker core (:class:`~dcp._core.broker.core.BrokerCore`) is a subclass that adds the
    dialects; this class only sees sessions, names, addresses, metadata and data.
    """

    def __init__(
        self,
        *,
        limits: Limits,
        sessions: Sessions,
        work_timeout: float | None,
        quarantine: float,
        guard: Guard | None,
        approvals: Approvals | None = None,
    ) -> None:
        self.limits = limits
        #: Registrations waiting for the approver (:mod:`.approval`; ``None``: no approver).
        self.approvals = approvals
        #: What workers said about their services (:mod:`.directory`).
        self.directory = directory.Directory()
        self.sessions = sessions
        self.work_timeout = work_timeout
        self.guard = guard
        self._quarantine_for = quarantine
        #: Messages to send, ROUTER-side (routing id first). The driver empties it.
        self.outbox: list[list[bytes]] = []
        self.counters = BrokerCounters()
        self._services: dict[bytes, Service] = {}
        self._loads: dict[bytes, Load] = {}
        # Work-timeout deadlines of held requests (Rule 7).
        self._deadlines: DeadlineHeap[Pending] = DeadlineHeap(redelivery.deadline_live)
        # Expiries of queued requests, and retries' matches (queues Rules Q3 and Q4).
        self._queues = QueueDeadlines(self.counters, self._loads, self._services)
        #: Lines for the operators' log, ``(level, message, args)``: the driver logs them on
        #: the ``dcp.broker`` logger and empties this (the core does no I/O; ``args`` format
        #: themselves only if a record is emitted). Past 4,096 unread, the oldest go.
        self.log_lines: deque[tuple[int, str, tuple[object, ...]]] = deque(maxlen=4096)
        #: Refusals are logged once per reason per minute (of the core's clock).
        self._log_every = LogEvery()
        # The time of the call being handled, for work-timeout deadlines.
        self._now = 0.0

    # -------------------------------------------------------------- requests

    def submit(
        self,
        client: bytes,
        origin: Dialect,
        name: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        *,
        forward: bool,
    ) -> tuple[str, str] | None:
        """Queue or dispatch a request (admission rules in :mod:`.admission`, options in
        :mod:`.queues`); on refusal, return ``(code, message)`` (the caller tells the
        client)."""
        limits = self.limits
        service = self._services.get(name)
        work_timeout = expiry = None
        options = read_options(metadata)
        if options is not None:
            # Queues Rules Q2 and Q4 (only requests carrying options get here).
            if options.no_wait and (service is None or not service.workers):
                return "no_workers", f"no worker serves {name[:64]!r}"
            work_timeout = options.work_timeout
            if options.expires_in is not None:
                key = self._queues.key(name, client, metadata)
                when = self._now + options.expires_in
                if self._queues.replace(key, origin, metadata, data, when):
                    return None
                expiry = Expiry(when, key)
        if service is None:
            refused = admission.new_service_refusal(limits, len(self._services), name)
            if refused is not None:
                return refused
            service = self._services[name] = Service(name)
        idle = service.idle
        load = self._loads.get(client)
        if load is None:
            load = Load()
        refused = admission.refusal(
            limits, len(service.queue) - service.dead, bool(idle), load, name
        )
        if refused is not None:
            return refused
        if not load.inflight:
            self._loads[client] = load
        if work_timeout is None:
            work_timeout = self.work_timeout
        counters = self.counters
        counters.requests += 1
        if forward:
            counters.forwards += 1
        load.inflight += 1
        shown = client if self.guard is None else self.guard.seal(client)
        pending = Pending(
            counters.requests,
            service,
            client,
            shown,
            origin,
            metadata,
            data,
            load,
            work_timeout,
            expiry,
        )
        pending.since = self._now
        service.requests += 1
        if idle:
            self._dispatch(next(iter(idle.values())), pending)
        else:
            service.queue.append(pending)
            load.queued += 1
            if expiry is not None:
                self._queues.queued(pending)
        return None

    def release(
        self, worker: Session, client: bytes, metadata: tuple[bytes, ...] | None
    ) -> Pending | None:
        """Rule 2: ``worker`` answered the request it held for ``client`` with ``metadata``
        (``None``: the dialect carries none; the oldest such request matches). Returns it,
        no longer held, or ``None`` (counted as unmatched) if none matches."""
        held = worker.held
        for i, pending in enumerate(held):
            if pending.client == client and (metadata is None or pending.metadata == metadata):
                return self._released(held, i)
        if metadata is not None:
            # A forward may differ in dcp options other than the id (a traced worker
            # passes its own trace context on): compare without them.
            key = without_options(metadata)
            for i, pending in enumerate(held):
                if pending.client == client and without_options(pending.metadata) == key:
                    return self._released(held, i)
        self.counters.unmatched += 1
        return None

    def _released(self, held: list[Pending], i: int) -> Pending:
        pending = held.pop(i)
        service = pending.service
        service.answered += 1
        took = self._now - pending.since
        service.busy_time += took
        service.durations[bisect_left(DURATION_BUCKETS, took)] += 1
        self._finish(pending)
        return pending

    def find_held(self, worker: Session, client: bytes) -> Pending | None:
        """The oldest request ``worker`` holds for ``client`` (for partial answers)."""
        for pending in worker.held:
            if pending.client == client:
                return pending
        return None

    # ---------------------------------------------------------------- credit

    def credit(self, worker: Session, *, released: bool) -> None:
        """Rule 1: grant credit (+1 for a finished request, else at least 1), then use it."""
        if released:
            worker.credit += 1
        elif worker.credit < 1:
            worker.credit = 1
        quarantine = self.sessions.quarantine
        if quarantine and worker.ident in quarantine:
            return  # Rule 7: it may register and heartbeat, but gets no work for now
        self._use_credit(worker)

    def _use_credit(self, worker: Session) -> None:
        # Serve the oldest requests across the worker's services (usually just one).
        services = worker.services
        while worker.credit:
            best: Service | None = None
            for service in services:
                if service.queue and (best is None or service.queue[0].seq < best.queue[0].seq):
                    best = service
            if best is None:
                break
            pending = best.queue.popleft()
            pending.load.queued -= 1
            if (best.dead or pending.expiry is not None) and not self._queues.taken(
                best, pending, self._now
            ):
                continue  # queues Rule Q3: it had expired
            self._dispatch(worker, pending)
        if worker.credit:
            ident = worker.ident
            for service in services:
                if ident not in service.idle:
                    service.idle[ident] = worker

    def _dispatch(self, worker: Session, pending: Pending) -> None:
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
        if len(held) >= self.limits.max_held:
            # Only a worker that changes metadata gets here: stop tracking its oldest.
            self._finish(held.pop(0))
            self.counters.count("held_overflow")
        held.append(pending)
        pending.holder = worker
        pending.since = self._now
        if pending.work_timeout is not None:
            pending.token += 1
            self._deadlines.live += 1
            self._deadlines.push(self._now + pending.work_timeout, pending.token, pending)
        self.counters.dispatched += 1
        self.outbox.append(
            worker.dialect.request(
                ident, pending.service.name, pending.shown, pending.metadata, pending.data
            )
        )

    def _unhold(self, pending: Pending) -> None:
        """``pending`` is no longer held by a worker."""
        pending.holder = None
        if pending.work_timeout is not None:
            self._deadlines.live -= 1

    def _finish(self, pending: Pending) -> None:
        """The broker is done with held ``pending`` (answered, or no longer tracked)."""
        self._unhold(pending)
        load = pending.load
        load.inflight -= 1
        if not load.inflight:
            self._loads.pop(pending.client, None)

    # --------------------------------------------------------------- workers

    def add_service(self, worker: Session, name: bytes) -> Service:
        """``worker`` provides ``name`` (created if new; not bounded by ``max_services``)."""
        service = self._services.get(name)
        if service is None:
            service = self._services[name] = Service(name)
        if service not in worker.services:
            worker.services.append(service)
            service.workers += 1
        return service

    def register(
        self,
        peer: bytes,
        worker: Session | None,
        name: bytes,
        dialect: Dialect,
        now: float,
        principal: str | None,
        *,
        approved: bool = False,
    ) -> Session | None:
        """A registration for ``name`` (any dialect): confirmed, refused and told, or left
        waiting for the approver (approval Rule A1; ``approved``: it said yes). Returns the
        worker's session, or ``None`` if refused or waiting."""
        if len(name) > self.limits.max_service_name:
            self.reject(peer, "service_name_too_long", "%d bytes", len(name))
            if worker is None and dialect.beats:
                self.outbox.append(dialect.expel(peer))
            return None
        if directory.is_reserved(name):
            self._refuse_registration(
                peer, dialect, name, "reserved_service", f"{name[:64]!r} is the broker's own"
            )
            return None
        guard = self.guard
        if guard is not None:
            key = None if principal is None else principal.encode("ascii", "replace")
            if not guard.may_register(key, name):
                detail = f"key {principal} may not register {name[:64]!r}"
                self._refuse_registration(peer, dialect, name, "registration_refused", detail)
                return None
        approvals = self.approvals
        if (
            approvals is not None
            and not approved
            and (worker is None or not any(s.name == name for s in worker.services))
        ):
            info = self.directory.waiting_info(peer, name)
            if not approvals.ask(peer, name, dialect, principal, info):
                detail = "too many registrations await approval"
                self._refuse_registration(peer, dialect, name, "registration_refused", detail)
            return None
        if worker is not None:
            services = worker.services
            if len(services) >= self.limits.max_services_per_worker and not any(
                s.name == name for s in services
            ):
                self.reject(peer, "too_many_services", "registration for %r", name[:64])
                return None
            new = not any(s.name == name for s in services)
        else:
            worker = self.sessions.add(peer, dialect, now)
            new = True
        if new:
            self.note(
                logging.INFO,
                "worker %s (%s) registered for %s",
                PeerId(peer),
                dialect.name,
                directory.Name(name),
            )
        self.add_service(worker, name)
        self.directory.registered(peer, name)
        confirmation = dialect.registered(peer, name)
        if confirmation is not None:
            self.outbox.append(confirmation)
        self.credit(worker, released=False)
        return worker

    def _refuse_registration(
        self, peer: bytes, dialect: Dialect, name: bytes, reason: str, detail: str
    ) -> None:
        """Count, log, and tell the worker (DCP: a ``registration_refused`` error reply)."""
        self.reject(peer, reason, detail)
        self.outbox.append(dialect.refused(peer, name, "registration_refused", detail))

    def serves(self, name: bytes) -> bool:
        """Whether some registered worker provides ``name``."""
        service = self._services.get(name)
        return service is not None and service.workers > 0

    # ------------------------------------------- workers lost (.redelivery: Rules 5 and 7)

    revoke = redelivery.revoke
    remove_worker = redelivery.remove_worker
    time_out_work = redelivery.time_out_work
    next_work_deadline = redelivery.next_work_deadline

    # ---------------------------------------------------------------- output
    def answered(
        self, peer: bytes, worker: Session, client: bytes, metadata: tuple[bytes, ...] | None
    ) -> tuple[bytes, Pending | None] | None:
        """A worker's answer (or forward) names ``client``: the client's real address
        (unsealed in secure mode) and the held request it finishes (``None``: none, counted
        as unmatched); or ``None`` if the address is not one the broker gave (security Rule
        S4: counted, logged, and the worker's credit kept)."""
        if self.guard is not None:
            unsealed = self.unseal(peer, client)
            if unsealed is None:
                self.credit(worker, released=False)
                return None
            client = unsealed
        return client, self.release(worker, client, metadata)

    def unseal(self, peer: bytes, sealed: bytes) -> bytes | None:
        """Security Rule S4: the client address sealed in a worker's message, or ``None``
        (counted and logged) if the broker did not seal it."""
        assert self.guard is not None
        client = self.guard.unseal(sealed)
        if client is None:
            self.reject(peer, "bad_client_address", "not a client address the broker gave")
        return client

    def answer_directly(
        self,
        client: bytes,
        origin: Dialect,
        name: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
    ) -> None:
        """Rules D1, D3 (:mod:`.directory`): the broker answers an ``mmi.*`` request itself."""
        if name == directory.DESCRIBE:
            answer: tuple[bytes, ...] = (directory.describe(self, client, data),)
        elif name == directory.BROKER:
            answer = (encode_json(self.overview()),)
        else:
            answer = directory.answer(
                name, data, self.serves, self._services, self.directory, self._now
            )
        self.outbox.append(origin.reply(client, name, metadata, answer))

    def overview(self) -> dict[str, Any]:
        """Broker-wide figures (``mmi.broker``, Rule D1); the broker core adds its own."""
        return {}

    def error_reply(self, pending: Pending, code: str, message: str) -> None:
        self.outbox.append(
            pending.origin.error(
                pending.client, pending.service.name, pending.metadata, code, message
            )
        )

    def refuse(
        self,
        client: bytes,
        origin: Dialect,
        name: bytes,
        metadata: tuple[bytes, ...],
        code: str,
        message: str,
    ) -> None:
        """Refuse a request: count, log once, and tell its client with an error reply."""
        self.reject(client, code, message)
        self.outbox.append(origin.error(client, name, metadata, code, message))

    def reject(self, peer: bytes, reason: str, detail: str, *args: object) -> None:
        """Count a refused message, and log it (:attr:`log_lines`) once per reason per
        minute (the line names the peer, and how many more were refused meanwhile).
        ``detail % args`` is formatted only if the line is written."""
        self.counters.count(reason)
        line = self._log_every(
            reason,
            self._now,
            "rejected message from peer %s: %s (%s)",
            PeerId(peer),
            reason,
            Detail(detail, args) if args else detail,
        )
        if line is not None:
            # no_workers answers a no-wait request as the protocol says ("no responders",
            # what `dcp call` asks by default): news, not a misbehaving peer.
            level = logging.INFO if reason == "no_workers" else logging.WARNING
            self.log_lines.append((level, *line))

    def note(self, level: int, msg: str, *args: object) -> None:
        """A line for the operators' log (:attr:`log_lines`; the driver writes it)."""
        self.log_lines.append((level, msg, args))


class Detail:
    """``text % args``, formatted only if a log record is emitted."""

    __slots__ = ("args", "text")

    def __init__(self, text: str, args: tuple[object, ...]) -> None:
        self.text = text
        self.args = args

    def __str__(self) -> str:
        return self.text % self.args
