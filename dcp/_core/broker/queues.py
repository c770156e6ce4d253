"""Service queues: the options a request carries, the caller's deadline of a queued request,
and a retry that replaces its queued copy. Sans-IO (the routing part, :mod:`.routing`, drives
it; a queue itself is its :class:`~.records.Service`'s).

Rule Q1 - Options. A request's dcp options (metadata parts starting with ``\\xffDCP:``, see
  :mod:`dcp.wire.messages`; a dcp request id, ``\\xffDCP:id=...``, is not one) are read once, in
  one pass, when it arrives (:func:`read_options`); a request with none (plain DCP traffic)
  costs one byte comparison per metadata part. A request carrying such a part (request id
  included) longer than :data:`dcp.wire.options.MAX_OPTION` is refused (``header_too_long``)
  before anything of it is kept or looked up.
Rule Q2 - No-wait. A request carrying the no-wait option for a service no registered worker
  provides is refused at once (``no_workers``) instead of being queued.
Rule Q3 - Deadlines. A request carrying expires-in (the time its caller has left) expires
  that long after it arrived at the broker; a forward keeps the deadline of the request it
  passes on (routing Rule R9), and a retry moves it (Rule Q4). A request still *queued* past
  its expiry is dropped without a reply (its caller gave up) and counted
  (``expired_in_queue``). A request held by a worker is not affected (work timeouts govern
  those, routing Rule R7); one its worker gives back (routing Rule R5) is queued again under
  the same expiry, and dropped at once if that has passed. Expiries live in one
  :class:`~dcp._util.DeadlineHeap`; a queue is never scanned: an expired request stays in its
  deque as a *tombstone* (its payload freed), skipped when it reaches the front (a queue's
  front is never a tombstone) and swept out when tombstones outnumber the live requests.
Rule Q4 - Replacement. A retry (routing Rule R8: the same client address and dcp request id)
  of a request still *queued* for the same service replaces it in place (its metadata, data,
  dialect and expiry; its place in the queue is kept) instead of queueing a copy, and is
  counted (``replaced``), not accepted anew. A retry of a request held by a worker, or passed
  on by a forward, changes only its expiry (Rule Q3): routing Rule R8.
Rule Q5 - Longest wait. The broker cannot tell that a client has gone (ROUTER says nothing),
  so a request that carries no expires-in (MDP, DBP, a raw DCP peer, a dcp call without a
  timeout) waits in a queue at most the broker's ``max_queue_wait`` (default 300 s) from when
  it entered it (again, after a redelivery: the wait starts anew). Then it is dropped as in
  Rule Q3 and its client gets an error reply ``queue_timeout`` (counted by that reason; its
  caller did not give up, so it is told). Not to cost the hot path a deadline per request,
  this is checked at the fronts of the queues (requests behind a front are younger, but for
  one given back, Rule R5, which waits anew) when the oldest front's wait is over, at most
  every sixteenth of ``max_queue_wait``: a request may wait that much longer, or up to
  ``max_queue_wait`` longer behind a front with an expiry of its caller's or a redelivered
  one. A retry that carries expires-in gives the queued copy that
  deadline (Rule Q4). So requests of departed clients leave the queues, and a service
  nobody provides is forgotten when its queue empties (admission Rule AD5 counts it for its
  maker until then).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from dcp._core.broker.admission import Load
from dcp._core.broker.budget import Account
from dcp._core.broker.dialects import Dialect
from dcp._core.broker.records import Expiry, Key, Pending, Service
from dcp._stats import BrokerCounters
from dcp._util import DeadlineHeap
from dcp.wire.options import (
    MAX_OPTION,
    NO_WAIT_OPTION,
    REQUEST_ID_PREFIX,
    parse_work_timeout,
    request_expires_in,
)

__all__ = ["Options", "QueueDeadlines", "read_options"]

#: Tombstones a queue may hold before they are swept out, beyond as many as its live requests.
_SWEEP_SLACK = 1024


class Options:
    """The dcp options a request carries (Rule Q1)."""

    __slots__ = ("expires_in", "no_wait", "too_long", "work_timeout")

    def __init__(self) -> None:
        self.work_timeout: float | None = None
        self.expires_in: float | None = None
        self.no_wait = False
        #: The length of a part over :data:`~dcp.wire.options.MAX_OPTION` (0: none is).
        self.too_long = 0


def read_options(metadata: tuple[bytes, ...]) -> Options | None:
    """Rule Q1: the options in ``metadata`` (the first valid one of each kind), or ``None``
    if it carries none (and no part is too long)."""
    options = None
    for part in metadata:
        if part[:1] != b"\xff":
            continue
        if len(part) > MAX_OPTION:
            if options is None:
                options = Options()
            options.too_long = len(part)
        elif not part.startswith(REQUEST_ID_PREFIX):
            if options is None:
                options = Options()
            if part == NO_WAIT_OPTION:
                options.no_wait = True
            elif options.work_timeout is None and (seconds := parse_work_timeout(part)):
                options.work_timeout = seconds
            elif options.expires_in is None:
                options.expires_in = request_expires_in((part,))
    return options


def _queued_live(pending: Pending, token: int) -> bool:
    expiry = pending.expiry
    return expiry is not None and expiry.queued and expiry.token == token


class QueueDeadlines:
    """The expiries of queued requests (Rule Q3) and what a retry changes (Rule Q4). Only
    requests that carry expires-in (or whose retry did) are ever in the heap.

    :param counters: the broker's counters (``expired_in_queue``)
    :param loads: the routing part's per-client loads (an expired request leaves its load)
    :param services: the routing part's services (one nobody serves is forgotten once its
        queue is empty)
    :param inflight: the routing part's requests in flight (routing Rule R8): one that
        expires leaves it
    :param memory: the ``queued`` account, which an expired request's bytes go back to
        (routing Rule R10)
    :param forget: forgets a service nobody provides once its queue is empty (routing's)
    :param wait_over: tells the client of a request dropped at ``max_queue_wait`` (Rule Q5)
    :param max_queue_wait: Rule Q5's longest wait (``None``: for ever)
    """

    def __init__(
        self,
        counters: BrokerCounters,
        loads: dict[bytes, Load],
        services: dict[bytes, Service],
        inflight: dict[Key, Pending],
        *,
        memory: Account,
        forget: Callable[[Service], None],
        wait_over: Callable[[Pending], None],
        max_queue_wait: float | None = None,
    ) -> None:
        self._counters = counters
        self._loads = loads
        self._services = services
        self._inflight = inflight
        self._memory = memory
        self._forget = forget
        self._wait_over = wait_over
        self._max_wait = max_queue_wait
        #: When the fronts of the queues are next checked (Rule Q5; ``None``: no request
        #: without an expiry may be queued).
        self.check_at: float | None = None
        self._heap: DeadlineHeap[Pending] = DeadlineHeap(_queued_live)

    def replace(
        self, queued: Pending, origin: Dialect, metadata: tuple[bytes, ...], data: Sequence[bytes]
    ) -> None:
        """Rule Q4: queued request ``queued`` takes its retry's dialect, metadata and data
        (its expiry: :meth:`extend`)."""
        queued.origin = origin
        queued.metadata = metadata
        queued.data = data

    def extend(self, pending: Pending, when: float) -> None:
        """Rules Q3 and Q4: ``pending``'s caller now gives up at ``when`` (a retry's
        expires-in); ``pending`` is queued, or held (then it matters if it is given back,
        routing Rule R5)."""
        expiry = pending.expiry
        if expiry is None:
            pending.expiry = expiry = Expiry(when)
            if pending.holder is None:
                expiry.queued = True
                self._push(pending, expiry)
            return
        expiry.when = when
        if expiry.queued:
            self._heap.live -= 1
            self._push(pending, expiry)

    def queued(self, pending: Pending) -> None:
        """``pending`` (carrying an expiry) entered its queue."""
        expiry = pending.expiry
        assert expiry is not None
        expiry.queued = True
        self._push(pending, expiry)

    def take(self, service: Service, now: float) -> Pending | None:
        """The request at the front of ``service``'s queue, taken out of it for a worker
        (``None``: it had expired, and was dropped)."""
        pending = service.queue.popleft()
        pending.load.queued -= 1
        return pending if self.taken(service, pending, now) else None

    def taken(self, service: Service, pending: Pending, now: float) -> bool:
        """``pending`` was taken from the front of ``service``'s queue (and its client's
        queued count): keep the front live, and say whether it is still wanted (if not, it
        had expired and was dropped). Only needed if ``service.dead`` or ``pending.expiry``."""
        if service.dead:
            self.sweep(service)
        if pending.expiry is not None:
            expired = pending.expiry.when <= now
            self._dequeued(pending, expired)
            if expired:
                self.drop(pending)
                return False
        return True

    def waiting(self, now: float) -> None:
        """Rule Q5: a request without an expiry entered a queue at ``now`` (call only while
        :attr:`check_at` is ``None``)."""
        if self._max_wait is not None:
            self.check_at = now + self._max_wait

    def expire(self, now: float) -> None:
        """Rules Q3 and Q5: drop every queued request past its expiry, then those past their
        wait at the fronts."""
        while (pending := self._heap.pop(now)) is not None:
            self._dequeued(pending, True)
            pending.load.queued -= 1
            self.drop(pending)
            service = pending.service
            service.dead += 1
            self.sweep(service)
            if not service.queue and not service.workers:
                # Nobody provides it and nothing waits for it: forget it (bounds memory).
                self._forget(service)
        check_at = self.check_at
        if check_at is not None and check_at <= now:
            self._check_fronts(now)

    def _check_fronts(self, now: float) -> None:
        """Rule Q5: drop the requests without an expiry at the queues' fronts whose wait is
        over; check again when the oldest remaining front's is."""
        wait = self._max_wait
        assert wait is not None
        oldest = None
        forget = []
        for service in self._services.values():
            queue = service.queue
            while queue:
                front = queue[0]
                if front.expiry is not None:
                    break
                if front.since + wait > now:
                    if oldest is None or front.since < oldest:
                        oldest = front.since
                    break
                queue.popleft()
                front.load.queued -= 1
                self.drop(front, waited=True)
                if service.dead:
                    self.sweep(service)  # it may rebuild the queue
                    queue = service.queue
            if not queue and not service.workers:
                forget.append(service)
            elif queue and oldest is None:
                oldest = now  # a front with an expiry: look again a wait later
        for service in forget:
            self._forget(service)  # nobody provides it and nothing waits for it
        # At most every sixteenth of the wait: a scan costs one look per service.
        self.check_at = None if oldest is None else max(oldest + wait, now + wait / 16)

    def unqueue(self, pending: Pending) -> None:
        """``pending`` (queued, carrying an expiry) leaves its queue early (routing Rule
        R11): it becomes a tombstone there; the caller drops it."""
        self._dequeued(pending, True)
        pending.service.dead += 1

    def drop(self, pending: Pending, *, waited: bool = False, counted: bool = True) -> None:
        """Rule Q3: ``pending``, no longer counted as queued or held, expired unanswered
        (Rule Q5, ``waited``: the broker's wait was over: its client is told); or, not
        ``counted`` as expired, answered elsewhere (routing Rule R11)."""
        if counted:
            self._counters.expired_in_queue += 1
        if waited:
            self._wait_over(pending)
        self._memory.release(pending.client, pending.charged)  # routing Rule R10
        pending.data = ()
        key = pending.key
        if key is not None and self._inflight.get(key) is pending:
            del self._inflight[key]  # routing Rule R8
        load = pending.load
        load.inflight -= 1
        if not load.inflight:
            self._loads.pop(pending.client, None)

    def next_due(self) -> float | None:
        """The earliest expiry of a queued request, or check of the queues' fronts (Rule Q5;
        ``None``: none)."""
        heap = self._heap
        when = heap.next_due() if heap.live else None
        check_at = self.check_at
        if check_at is not None and (when is None or check_at < when):
            when = check_at
        return when

    @staticmethod
    def sweep(service: Service) -> None:
        """Rule Q3: drop tombstones from the front of ``service``'s queue; rebuild the queue
        when they outnumber the rest."""
        queue = service.queue
        while queue and (expiry := queue[0].expiry) is not None and expiry.dead:
            queue.popleft()
            service.dead -= 1
        if service.dead > len(queue) // 2 + _SWEEP_SLACK:
            service.queue = deque(p for p in queue if p.expiry is None or not p.expiry.dead)
            service.dead = 0

    def _dequeued(self, pending: Pending, dead: bool) -> None:
        expiry = pending.expiry
        assert expiry is not None and expiry.queued
        expiry.queued = False
        expiry.dead = dead
        self._heap.live -= 1

    def _push(self, pending: Pending, expiry: Expiry) -> None:
        expiry.token += 1
        self._heap.live += 1
        self._heap.push(expiry.when, expiry.token, pending)
