"""Protocol-blind routing: per-service queues, least-recently-used idle workers, credit, held
requests and registrations. Sans-IO. A queued request's options and deadline and a retry's
replacement are :mod:`.queues` (Rules Q1-Q4); what a worker that goes away gives back, and
work timeouts, :mod:`.redelivery` (Rules R5 and R7).

This module does not know which wire protocol a peer speaks. It sees worker sessions
(:mod:`.peers`), service names, client addresses, a request's *metadata* (opaque parts the
client's dialect supplies and gets back in the answer; empty for MDP clients), its data parts,
and the client's dialect; it writes through each peer's :class:`~.dialects.Dialect`, which
turns a decision into frames. The dialect handlers (:mod:`.dcp1`, :mod:`.majordomo`,
:mod:`.dbp`) call it; it tells the streams (:mod:`.streams`) when a request is finished.

Rule R1 - Credit. A worker has *credit*: how many more requests it may be given. Registering,
  or asking for work (a DCP ping, or a request sent without finishing a held one) set it to at
  least 1: idle heartbeats do not pile up credit. An answer that finishes a held request adds
  1 (that request's slot is free again). Each request given to the worker takes 1. So a plain
  worker holds one request until it answers, and a dcp worker with N slots keeps N busy by
  pinging only when it has no credit left and a slot free.
Rule R2 - Queues. Each service has a FIFO queue of requests. A worker with credit and nothing
  queued for its services waits in its services' idle lists; the least recently used idle
  worker gets the next request, but one that holds nothing first (among the first
  ``IDLE_SCAN`` of the list: a worker that prefetches, or serves several requests at once,
  may have credit while busy, and a request given to it could wait behind a slow one while
  another worker is free); a worker serving several services takes the oldest request
  among them. A request is *held* by the worker it was given to until that worker answers it
  or leaves. An answer is matched by client address and, for dialects that carry it,
  metadata (DCP workers must pass it on unchanged; failing an exact match, one equal but for
  dcp options other than the request id matches: a traced forward carries its own trace
  context, ``docs/tracing.md``); an answer that matches nothing releases
  nothing (guessing could release a request the worker is still running, which would then
  not be redelivered if it died).
Rule R8 - At most once while the worker lives. A request whose first metadata part is a dcp
  request id (:data:`~dcp.wire.options.REQUEST_ID_PREFIX`: a dcp client's) is *in flight*
  from when the broker accepts it until it ends (answered, refused, failed, dropped at its
  expiry or given up): queued, held by a worker, or passed on by a forward (which carries the
  same client address and id, so a chain is one request in flight). The broker indexes these
  by (client address, request id). A request that arrives with the key of one in flight is a
  retry (its client's attempt timed out) and is never queued or run again: a queued copy for
  the same service takes its metadata, data and dialect (queues Rule Q4); one held or passed
  on keeps running, and its answer, when it comes, answers the retry too (the client matches
  replies by id), once. In every case the retry's expires-in, if any, becomes the request's
  deadline (queues Rule Q3: it applies if the request is queued again, Rule R5) and its
  dialect the one answered in; it is counted (``replaced``), not accepted anew. So a request
  is run again only when the broker gives it back from a worker that went away (Rule R5) or
  timed out (Rule R7), never because a client's timer fired. A forward that carries the key
  of a request in flight held by another worker or queued (its sender is a worker the broker
  gave up on, and the request was given back) is dropped and counted
  (``duplicate_forward``); one whose sender holds that request but changed its metadata (so
  it matched nothing, Rule R2) is passed on as before, not indexed. The index holds
  only requests the broker keeps anyway (bounded by the queue and held limits), and an entry
  leaves it when its request ends. Requests without a dcp id (MDP, DBP and plain DCP
  clients) are not indexed.
Rule R9 - Forward chains. A forward that finishes a request its sender holds continues that
  request's *chain*: the services it went through (the last ``MAX_CHAIN``), and its
  deadline (its expiry, queues Rule Q3, not one counted afresh from the forward's arrival).
  A forward to a service no registered worker provides fails the chain at once with a
  ``no_workers`` error reply (as no-wait does for a client, queues Rule Q2: a forward cannot
  usefully wait for a worker that may never come). An error reply to a request that came by a
  forward (refused here, failed at the broker, or a worker's error reply) reaches a dcp
  client with the chain after its metadata, one :data:`~dcp.wire.options.VIA_PREFIX` part per
  service, the last the one where it failed (``docs/protocol.md``).
Rule R10 - Bytes. A request accepted (queued, or given to a worker at once) is charged to its
  client in the byte budget's ``queued`` account (:mod:`.budget`: its frames, Rule MB4, with
  one entry's overhead that also pays for its Rule R8 index entry, which only requests
  queued or held have), before anything is kept; a charge refused (the account is full, or
  the client holds its share, Rules MB1-MB2) refuses the request with ``memory_budget``
  (admission Rule AD6). The charge stays while the request is queued, held, given back
  (Rule R5) or replaced by a retry (then the retry's bytes are charged instead, if they
  fit; else the queued copy keeps its own), and is released exactly once, when the request
  ends: answered, expired (queues Rules Q3 and Q5), given up (``redelivery_limit``, streams
  Rule ST6) or no longer tracked (``held_overflow``).
Rule R11 - Answered elsewhere. A worker's reply that matches nothing it holds (Rule R2) but
  names the client address and dcp request id of a request in flight here that is *queued*
  (not held, not running) ends that queued copy unrun: its client has its answer (or, for a
  ``HELD`` notice, data ``\\xffDCP-HELD``, a worker holds it and will
  answer), so running it again would only run it twice. This happens when a request went
  through two brokers (a client that failed over, ``docs/scaling.md``) or when a worker the
  broker gave up on answers after all while its request waits to be given out again. The
  queued copy is counted (``answered_elsewhere``), its bytes released, its index entry
  removed (a service left with neither worker nor queue is forgotten); the reply itself is
  routed to the client as before. A copy held by another worker keeps running (nothing can
  stop it; the client drops the second answer).
Rules R5 (redelivery) and 7 (work timeouts), for workers that go away and what they held:
:mod:`.redelivery`. Registration (its refusals, approval, security Rule S3): here.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Mapping, Sequence

from dcp._core.broker import admission
from dcp._core.broker.admission import Limits, Load
from dcp._core.broker.approval import Approval, Approvals
from dcp._core.broker.budget import ENTRY_OVERHEAD, FRAME_OVERHEAD, Account, cost
from dcp._core.broker.dialects import Dialect
from dcp._core.broker.directory import Directory, Name
from dcp._core.broker.guard import Guard
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.queues import Options, QueueDeadlines, read_options
from dcp._core.broker.records import Expiry, Key, Pending, Service, Session
from dcp._core.broker.streams import Streams
from dcp._stats import DURATION_BUCKETS
from dcp._util import DeadlineHeap, PeerId
from dcp.wire.options import REQUEST_ID_PREFIX, via_parts, without_options

__all__ = [
    "MAX_CHAIN",
    "Routing",
    "chain_of",
    "error_metadata",
    "with_chain",
    "work_deadline_live",
]

#: Services of a forward chain the broker remembers per request, the latest (Rule R9).
MAX_CHAIN = 16
#: Idle workers looked at for one that holds nothing before the first is taken (Rule R2).
IDLE_SCAN = 8
_ID = REQUEST_ID_PREFIX
_ID_LEN = len(REQUEST_ID_PREFIX)


def chain_of(upstream: Pending | None, name: bytes) -> tuple[bytes, ...]:
    """Rule R9: the chain of a forward to ``name`` that finished ``upstream`` (``None``: it
    finished nothing), ``name`` last."""
    if upstream is None:
        return (name,)
    return (*upstream.chain, upstream.service.name, name)[-MAX_CHAIN:]


def with_chain(metadata: tuple[bytes, ...], chain: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """Rule R9: an error reply's ``metadata`` with ``chain`` after it, if its client is a dcp
    client (its first part a dcp request id)."""
    if metadata and metadata[0][:_ID_LEN] == _ID:
        return (*metadata, *via_parts(chain[-MAX_CHAIN:]))
    return metadata


def error_metadata(pending: Pending) -> tuple[bytes, ...]:
    """Rule R9: the metadata of an error reply to ``pending``: its own, and its chain if it
    came by a forward."""
    if pending.chain:
        return with_chain(pending.metadata, (*pending.chain, pending.service.name))
    return pending.metadata


def work_deadline_live(pending: Pending, token: int) -> bool:
    """Whether a work-timeout deadline still stands: the request is held, by the same hold."""
    return pending.holder is not None and token == pending.token


class Routing:
    """Queues, credit, held requests and registrations (the module's rules). It only sees
    sessions, names, addresses, metadata and data.

    :param limits: the bounds it enforces (:mod:`.admission`)
    :param sessions: the registered workers
    :param outputs: where messages, counts, refusals and log lines go
    :param streams: told when a request is finished (streams Rule ST7)
    :param directory: what workers said about their services (a registration makes a
        waiting description the service's info)
    :param guard: the security rules (``None``: off): client addresses are sealed, and
        registrations need permission
    :param approvals: registrations waiting for the approver (``None``: no approver)
    :param work_timeout: seconds a worker may hold a request that carries no work timeout
        (``None``: no limit; Rule R7)
    :param mdp_work_timeout: seconds a worker of a dialect with no error reply (MDP) may hold
        a request that has no work timeout after ``work_timeout`` (``None``: no limit;
        majordomo Rule M5)
    :param memory: the byte budget's ``queued`` account (Rule R10; ``None``: one without a
        limit)
    """

    def __init__(
        self,
        *,
        limits: Limits,
        sessions: Sessions,
        outputs: Outputs,
        streams: Streams,
        directory: Directory,
        guard: Guard | None,
        approvals: Approvals | None,
        work_timeout: float | None,
        mdp_work_timeout: float | None = None,
        memory: Account | None = None,
    ) -> None:
        self.limits = limits
        self.work_timeout = work_timeout
        self.mdp_work_timeout = mdp_work_timeout
        self._sessions = sessions
        self._out = outputs
        self._outbox = outputs.outbox
        self._counters = outputs.counters
        self._streams = streams
        self._directory = directory
        self._guard = guard
        self._approvals = approvals
        #: Services by name (one is forgotten once nobody provides it and nothing waits).
        self.services: dict[bytes, Service] = {}
        #: What each client has accepted and unanswered (admission Rule AD3), by address;
        #: only clients with something in flight are here.
        self.loads: dict[bytes, Load] = {}
        #: Work-timeout deadlines of held requests (Rule R7).
        self.work_deadlines: DeadlineHeap[Pending] = DeadlineHeap(work_deadline_live)
        #: Requests in flight by (client address, dcp request id) (Rule R8).
        self.inflight: dict[Key, Pending] = {}
        #: Bytes of requests kept, by client (Rule R10).
        self.memory = Account("queued", None, None) if memory is None else memory
        #: Services without a worker, by the client whose request made them (admission
        #: Rule AD5); only clients that made one are here.
        self.made: dict[bytes, int] = {}
        #: Expiries of queued requests, and what retries change (queues Rules Q3-Q5).
        self.queues = QueueDeadlines(
            self._counters,
            self.loads,
            self.services,
            self.inflight,
            memory=self.memory,
            forget=self.forget,
            wait_over=self._wait_over,
            max_queue_wait=limits.max_queue_wait,
        )

    # -------------------------------------------------------------- requests

    def submit(
        self,
        client: bytes,
        origin: Dialect,
        name: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        now: float,
        *,
        forward: bool,
        upstream: Pending | None = None,
        sender: bytes = b"",
    ) -> tuple[str, str] | None:
        """Queue or dispatch a request (admission rules in :mod:`.admission`, options in
        :mod:`.queues`), or join it to the one in flight it retries (Rule R8); on refusal,
        return ``(code, message)`` (the caller tells the client).

        :param forward: it comes from a registered worker on behalf of ``client``
        :param upstream: the request a forward finished (Rule R9), if any
        :param sender: the forwarding worker's address (for a forward's log line)
        """
        options = read_options(metadata)
        if options is not None and options.too_long:  # queues Rule Q1
            return "header_too_long", f"a dcp option part of {options.too_long} bytes"
        key = None
        if metadata and metadata[0][:1] == b"\xff" and metadata[0].startswith(_ID):
            key = (client, metadata[0])
            running = self.inflight.get(key)
            if running is not None:
                if not forward:
                    self._retried(running, origin, name, metadata, data, now, options)
                    return None
                holder = running.holder
                if holder is None or holder.ident != sender:
                    self._out.reject(
                        sender,
                        "duplicate_forward",
                        "a forward of a request in flight elsewhere (for %s)",
                        Name(running.service.name),
                    )
                    return None
                key = None  # its sender holds it but changed its metadata (Rule R2)
        limits = self.limits
        service = self.services.get(name)
        work_timeout = expiry = None
        if service is None and len(name) > limits.max_service_name:
            # admission Rule AD1, before "no worker serves" (no-wait, a forward): too long.
            return admission.name_too_long(limits, name)
        if options is not None:
            # Queues Rules Q2 and Q3 (only requests carrying options get here).
            if options.no_wait and (service is None or not service.workers):
                return "no_workers", f"no worker serves {name[:64]!r}"
            work_timeout = options.work_timeout
            if options.expires_in is not None:
                expiry = Expiry(now + options.expires_in)
        chain: tuple[bytes, ...] = ()
        if forward:
            if service is None or not service.workers:
                return "no_workers", f"no worker serves {name[:64]!r}"  # Rule R9
            if upstream is not None:
                chain = (*upstream.chain, upstream.service.name)[-MAX_CHAIN:]
                if upstream.expiry is not None:
                    when = upstream.expiry.when
                    if when <= now:
                        self._counters.expired_in_queue += 1  # its caller gave up
                        return None
                    expiry = Expiry(when)
        made = service is None
        if service is None:
            refused = admission.new_service_refusal(
                limits, len(self.services), name, self.made.get(client, 0)
            )
            if refused is not None:
                return refused
            service = Service(name)  # kept only once the request is accepted
        idle = service.idle
        load = self.loads.get(client)
        if load is None:
            load = Load()
        if load.inflight >= limits.max_client_inflight or (
            not idle
            and (
                len(service.queue) - service.dead >= limits.max_queue
                or load.queued >= limits.max_client_queued
            )
        ):
            refused = admission.refusal(
                limits, len(service.queue) - service.dead, bool(idle), load, name
            )
            if refused is not None:
                return refused
        # budget.cost of its parts, inlined: most requests have one metadata part and one
        # data part.
        parts = len(metadata)
        charged = len(metadata[0]) if parts == 1 else sum(map(len, metadata))
        if len(data) == 1:
            charged += ENTRY_OVERHEAD + FRAME_OVERHEAD * (parts + 1) + len(data[0])
        else:
            charged += ENTRY_OVERHEAD + FRAME_OVERHEAD * (parts + len(data)) + sum(map(len, data))
        # Rule R10: Account.charge, inlined (one call less per request).
        memory = self.memory
        balances = memory.balances
        held = balances.get(client, 0)
        used = memory.used + charged
        if used > memory.ceiling or (held and held + charged > memory.peer_ceiling):
            memory.refused += 1
            return "memory_budget", f"the broker holds too many bytes of requests ({name[:64]!r})"
        balances[client] = held + charged
        memory.used = used
        if used > memory.peak:
            memory.peak = used
        if made:
            self.services[name] = service
            service.creator = client
            self.made[client] = self.made.get(client, 0) + 1
        if not load.inflight:
            self.loads[client] = load
        if work_timeout is None:
            work_timeout = self.work_timeout
        counters = self._counters
        counters.requests += 1
        if forward:
            counters.forwards += 1
        load.inflight += 1
        shown = client if self._guard is None else self._guard.seal(client)
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
            now,
            key,
            chain,
            charged,
        )
        if key is not None:
            self.inflight[key] = pending
        service.requests += 1
        if idle:
            worker = next(iter(idle.values()))
            if worker.held:  # Rule R2: busy, with credit; is another free?
                worker = _least_busy(idle)
            self.dispatch(worker, pending, now)
        else:
            service.queue.append(pending)
            load.queued += 1
            queues = self.queues
            if expiry is not None:
                queues.queued(pending)
            elif queues.check_at is None:
                queues.waiting(now)  # Rule Q5
        return None

    def _wait_over(self, pending: Pending) -> None:
        """Queues Rule Q5: ``pending`` was dropped at the broker's longest wait."""
        self._counters.count("queue_timeout")
        self.error_reply(
            pending,
            "queue_timeout",
            f"no worker took it within {self.limits.max_queue_wait} s (max_queue_wait)",
        )

    def _retried(
        self,
        running: Pending,
        origin: Dialect,
        name: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        now: float,
        options: Options | None,
    ) -> None:
        """Rule R8: a client's retry of ``running``, which is in flight (``options``: the
        retry's, read once by :meth:`submit`)."""
        self._counters.replaced += 1
        running.origin = origin
        queues = self.queues
        if running.holder is None and not running.chain and running.service.name == name:
            # Queues Rule Q4, if the retry's bytes fit in place of the copy's (Rule R10).
            memory = self.memory
            client = running.client
            charged = cost((*metadata, *data))
            more = charged - running.charged
            if more <= 0:
                memory.release(client, -more)
                fits = True
            else:
                fits = memory.charge(client, more)  # if not, the copy keeps its own
            if fits:
                running.charged = charged
                queues.replace(running, origin, metadata, data)
        if options is not None and options.expires_in is not None:
            queues.extend(running, now + options.expires_in)

    def release(
        self, worker: Session, client: bytes, metadata: tuple[bytes, ...] | None, now: float
    ) -> Pending | None:
        """Rule R2: ``worker`` answered the request it held for ``client`` with ``metadata``
        (``None``: the dialect carries none; the oldest such request matches). Returns it,
        no longer held, or ``None`` (counted as unmatched) if none matches."""
        held = worker.held
        for i, pending in enumerate(held):
            if pending.client == client and (metadata is None or pending.metadata == metadata):
                return self._released(held, i, now)
        if metadata is not None:
            # A forward may differ in dcp options other than the id (a traced worker
            # passes its own trace context on): compare without them.
            key = without_options(metadata)
            for i, pending in enumerate(held):
                if pending.client == client and without_options(pending.metadata) == key:
                    return self._released(held, i, now)
        self._counters.unmatched += 1
        return None

    def answered_elsewhere(self, client: bytes, metadata: tuple[bytes, ...] | None) -> None:
        """Rule R11: a worker's unmatched answer to ``client`` with ``metadata``: end the
        queued copy of the same request (client address and dcp request id), if there is
        one."""
        if not metadata or not metadata[0].startswith(_ID):
            return
        pending = self.inflight.get((client, metadata[0]))
        if pending is None or pending.holder is not None:
            return
        service = pending.service
        expiry = pending.expiry
        if expiry is not None:
            if not expiry.queued:
                return
            self.queues.unqueue(pending)
        else:
            try:
                service.queue.remove(pending)
            except ValueError:  # not queued (nothing else holds an unheld copy: defensive)
                return
        self._counters.answered_elsewhere += 1
        pending.load.queued -= 1
        self.queues.drop(pending, counted=False)
        if service.dead:
            self.queues.sweep(service)
        self.forget_if_unused(service)  # as queues Rule Q3 does (admission Rule AD5)

    def _released(self, held: list[Pending], i: int, now: float) -> Pending:
        pending = held.pop(i)
        service = pending.service
        service.answered += 1
        took = now - pending.since
        service.busy_time += took
        service.durations[bisect_left(DURATION_BUCKETS, took)] += 1
        self.finish(pending)
        return pending

    def answered(
        self,
        peer: bytes,
        worker: Session,
        client: bytes,
        metadata: tuple[bytes, ...] | None,
        now: float,
    ) -> tuple[bytes, Pending | None] | None:
        """A worker's answer (or forward) names ``client``: the client's real address
        (unsealed in secure mode) and the held request it finishes (``None``: none, counted
        as unmatched); or ``None`` if the address is not one the broker gave (security Rule
        S4: counted, logged, and the worker's credit kept)."""
        if self._guard is not None:
            unsealed = self.unseal(peer, client)
            if unsealed is None:
                self.credit(worker, now, released=False)
                return None
            client = unsealed
        return client, self.release(worker, client, metadata, now)

    def unsealed(self, peer: bytes, client: bytes) -> bytes | None:
        """The client address a worker's message names, as is without a guard; else as
        :meth:`unseal`."""
        if self._guard is None:
            return client
        return self.unseal(peer, client)

    def unseal(self, peer: bytes, sealed: bytes) -> bytes | None:
        """Security Rule S4: the client address sealed in a worker's message, or ``None``
        (counted and logged) if the broker did not seal it."""
        assert self._guard is not None
        client = self._guard.unseal(sealed)
        if client is None:
            self._out.reject(peer, "bad_client_address", "not a client address the broker gave")
        return client

    def error_reply(self, pending: Pending, code: str, message: str) -> None:
        """An error reply to ``pending``'s client, in its dialect, with its chain (Rule R9;
        none to an MDP client, majordomo Rule M1)."""
        frames = pending.origin.error(
            pending.client, pending.service.name, error_metadata(pending), code, message
        )
        if frames is not None:
            self._outbox.append(frames)

    # ---------------------------------------------------------------- credit

    def credit(self, worker: Session, now: float, *, released: bool) -> None:
        """Rule R1: grant credit (+1 for a finished request, else at least 1), then use it."""
        if released:
            worker.credit += 1
        elif worker.credit < 1:
            worker.credit = 1
        quarantine = self._sessions.quarantine
        if quarantine and worker.ident in quarantine:
            return  # Rule R7: it may register and heartbeat, but gets no work for now
        self.use_credit(worker, now)

    def use_credit(self, worker: Session, now: float) -> None:
        """Give ``worker`` queued requests while it has credit (the oldest across its
        services, usually just one); then it waits in its services' idle lists."""
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
            if (best.dead or pending.expiry is not None) and not self.queues.taken(
                best, pending, now
            ):
                continue  # queues Rule Q3: it had expired
            self.dispatch(worker, pending, now)
        if worker.credit:
            ident = worker.ident
            for service in services:
                if ident not in service.idle:
                    service.idle[ident] = worker

    def dispatch(self, worker: Session, pending: Pending, now: float) -> None:
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
            self.finish(held.pop(0))
            self._counters.count("held_overflow")
        held.append(pending)
        pending.holder = worker
        pending.since = now
        timeout = pending.work_timeout
        if timeout is None and not worker.dialect.errors:
            timeout = self.mdp_work_timeout  # majordomo Rule M5
        if timeout is not None:
            pending.token += 1
            deadlines = self.work_deadlines
            deadlines.live += 1
            deadlines.push(now + timeout, pending.token, pending)
        self._counters.dispatched += 1
        self._outbox.append(
            worker.dialect.request(
                ident, pending.service.name, pending.shown, pending.metadata, pending.data
            )
        )

    def unhold(self, pending: Pending) -> None:
        """``pending`` is no longer held by a worker."""
        if self.held_timeout(pending) is not None:
            self.work_deadlines.live -= 1
        pending.holder = None

    def progress(self, pending: Pending, now: float) -> None:
        """Majordomo Rule M5: held ``pending`` had a part answered at ``now``: its
        ``mdp_work_timeout`` (not a work timeout of its own) starts again."""
        timeout = self.mdp_work_timeout
        if timeout is not None and pending.work_timeout is None:
            pending.token += 1  # the older deadline is stale; live stays one
            self.work_deadlines.push(now + timeout, pending.token, pending)

    def held_timeout(self, pending: Pending) -> float | None:
        """Rule R7: the work timeout of ``pending`` while it is held: its own (or the
        broker's), else ``mdp_work_timeout`` if its worker's dialect has no error reply
        (majordomo Rule M5)."""
        timeout = pending.work_timeout
        if timeout is None:
            holder = pending.holder
            if holder is not None and not holder.dialect.errors:
                return self.mdp_work_timeout
        return timeout

    def finish(self, pending: Pending) -> None:
        """The broker is done with held ``pending`` (answered, or no longer tracked): its
        client's load drops, its stream (if any) ends (streams Rule ST7)."""
        holder = pending.holder
        pending.holder = None
        if pending.work_timeout is not None or (
            holder is not None and not holder.dialect.errors and self.mdp_work_timeout is not None
        ):
            self.work_deadlines.live -= 1
        key = pending.key
        if key is not None and self.inflight.get(key) is pending:
            del self.inflight[key]  # Rule R8
        # Rule R10: Account.release, inlined (one call less per request).
        memory = self.memory
        client = pending.client
        balances = memory.balances
        held = balances.get(client, 0)
        charged = pending.charged
        if charged >= held:
            if held:
                del balances[client]
            memory.used -= held
        else:
            balances[client] = held - charged
            memory.used -= charged
        load = pending.load
        load.inflight -= 1
        if not load.inflight:
            self.loads.pop(pending.client, None)
        streams = self._streams
        if streams.open:
            streams.finished(pending)

    def requeue(self, pending: Pending, now: float) -> None:
        """Rule R5: ``pending``, no longer held, goes back to the front of its queue."""
        self._counters.redeliveries += 1
        service = pending.service
        service.redeliveries += 1
        pending.since = now  # queues Rule Q5: its wait starts anew
        service.queue.appendleft(pending)
        pending.load.queued += 1
        queues = self.queues
        if pending.expiry is not None:
            queues.queued(pending)
        elif queues.check_at is None:
            queues.waiting(now)

    def refill(self, service: Service, now: float) -> None:
        """Give ``service``'s queued requests to its idle workers (after a requeue)."""
        queues = self.queues
        while service.idle and service.queue:
            queued = queues.take(service, now)
            if queued is not None:
                self.dispatch(_least_busy(service.idle), queued, now)

    # --------------------------------------------------------------- workers

    def add_service(self, worker: Session, name: bytes) -> Service:
        """``worker`` provides ``name`` (created if new; not bounded by ``max_services``)."""
        service = self.services.get(name)
        if service is None:
            service = self.services[name] = Service(name)
        elif service.creator is not None:
            self._unmake(service)  # admission Rule AD5: a worker provides it now
        if service not in worker.services:
            worker.services.append(service)
            service.workers += 1
        return service

    def withdraw(self, worker: Session, *, holding: bool) -> None:
        """``worker`` (removed) no longer provides its services; one that nobody provides
        and nothing waits for is forgotten (bounds memory), unless the worker was
        ``holding`` requests (they go back to the queues)."""
        ident = worker.ident
        for service in worker.services:
            service.workers -= 1
            service.idle.pop(ident, None)
            if not service.workers and not service.queue and not holding:
                self.forget(service)
        worker.services = []

    def forget(self, service: Service) -> None:
        """Forget ``service``: nobody provides it and nothing waits for it (bounds memory;
        admission Rule AD5: it no longer counts for its maker)."""
        services = self.services
        if services.get(service.name) is service:
            del services[service.name]
        if service.creator is not None:
            self._unmake(service)

    def forget_if_unused(self, service: Service) -> None:
        """Forget ``service`` if nobody provides it and nothing waits for it."""
        if not service.workers and not service.queue:
            self.forget(service)

    def _unmake(self, service: Service) -> None:
        creator = service.creator
        assert creator is not None
        service.creator = None
        made = self.made
        left = made.get(creator, 0) - 1
        if left > 0:
            made[creator] = left
        else:
            made.pop(creator, None)

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
        waiting for the approver (approval Rule AP1; ``approved``: it said yes). Returns the
        worker's session, or ``None`` if refused or waiting."""
        out = self._out
        if len(name) > self.limits.max_service_name:
            out.reject(peer, "service_name_too_long", "%d bytes", len(name))
            if worker is None and dialect.beats:
                self._outbox.append(dialect.expel(peer))
            return None
        if admission.is_reserved(name):  # admission Rule AD4
            self.refuse_registration(
                peer, dialect, name, "reserved_service", f"{name[:64]!r} is the broker's own"
            )
            return None
        guard = self._guard
        if guard is not None:
            key = None if principal is None else principal.encode("ascii", "replace")
            if not guard.may_register(key, name):
                detail = f"key {principal} may not register {name[:64]!r}"
                self.refuse_registration(peer, dialect, name, "registration_refused", detail)
                return None
        approvals = self._approvals
        if (
            approvals is not None
            and not approved
            and (worker is None or not any(s.name == name for s in worker.services))
        ):
            info = self._directory.waiting_info(peer, name)
            if not approvals.ask(peer, name, dialect, principal, info):
                detail = "too many registrations await approval"
                self.refuse_registration(peer, dialect, name, "registration_refused", detail)
            return None
        if worker is not None:
            services = worker.services
            if len(services) >= self.limits.max_services_per_worker and not any(
                s.name == name for s in services
            ):
                out.reject(peer, "too_many_services", "registration for %r", name[:64])
                return None
            new = not any(s.name == name for s in services)
        else:
            worker = self._sessions.add(peer, dialect, now)
            new = True
        if new:
            out.note(
                logging.INFO,
                "worker %s (%s) registered for %s",
                PeerId(peer),
                dialect.name,
                Name(name),
            )
        self.add_service(worker, name)
        self._directory.registered(peer, name)
        confirmation = dialect.registered(peer, name)
        if confirmation is not None:
            self._outbox.append(confirmation)
        self.credit(worker, now, released=False)
        return worker

    def refuse_registration(
        self, peer: bytes, dialect: Dialect, name: bytes, reason: str, detail: str
    ) -> None:
        """Count, log, and tell the worker (DCP: a ``registration_refused`` error reply)."""
        self._out.reject(peer, reason, detail)
        self._outbox.append(dialect.refused(peer, name, "registration_refused", detail))

    def decide(self, token: int, answer: Approval, now: float) -> None:
        """Approval Rule AP2: the approver answered question ``token``."""
        approvals = self._approvals
        assert approvals is not None
        entry = approvals.take(token)
        if entry is None:
            return
        request, dialect, principal = entry
        peer, name = request.routing_id, request.service
        if answer.approved:
            self._out.note(logging.INFO, "approved worker %s for %r", PeerId(peer), name[:64])
            worker = self._sessions.workers.get(peer)
            self.register(peer, worker, name, dialect, now, principal, approved=True)
            return
        reason = answer.reason or "denied by the broker's approver"
        self.refuse_registration(peer, dialect, name, "registration_refused", reason)

    def serves(self, name: bytes) -> bool:
        """Whether some registered worker provides ``name``."""
        service = self.services.get(name)
        return service is not None and service.workers > 0

    # ------------------------------------------------------------------ time

    def overdue(self, now: float) -> Pending | None:
        """Rule R7: a held request past its work timeout at ``now`` (one at a time), if any."""
        return self.work_deadlines.pop(now)

    def next_deadline(self) -> float | None:
        """The earliest work-timeout deadline or expiry of a queued request (``None``:
        none)."""
        deadlines = self.work_deadlines
        when = deadlines.next_due() if deadlines.live else None
        expiry = self.queues.next_due()
        if expiry is not None and (when is None or expiry < when):
            when = expiry
        return when


def _least_busy(idle: Mapping[bytes, Session]) -> Session:
    """Rule R2: the least recently used of ``idle`` that holds nothing, among the first
    :data:`IDLE_SCAN`; else the least recently used."""
    scan = IDLE_SCAN
    for worker in idle.values():
        if not worker.held:
            return worker
        scan -= 1
        if not scan:
            break
    return next(iter(idle.values()))
