"""The records the broker core's parts share: a registered worker (:class:`Session`), a
service (:class:`Service`), a request (:class:`Pending`) and a queued request's deadline
(:class:`Expiry`). Plain slotted state, no behaviour: the parts that own the collections
apply the rules (:mod:`.peers`: liveness, Rules L1-L4; :mod:`.routing`: credit, queues, held
requests, requests in flight and forward chains, Rules R1-R2, R8-R9; :mod:`.queues`: options,
expiries and retries, Rules Q1-Q4; :mod:`.redelivery`: Rules R5 and R7). They refer to one
another, hence one module.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import TypeAlias

from dcp._core.broker.admission import Load
from dcp._core.broker.dialects import Dialect
from dcp._stats import DURATION_BUCKETS

__all__ = ["Expiry", "Key", "Pending", "Service", "Session"]

#: What a request in flight is known by (routing Rule R8): its client's address and its dcp
#: request id.
Key: TypeAlias = "tuple[bytes, bytes]"


class Session:
    """A registered worker."""

    __slots__ = (
        "beats_busy",
        "credit",
        "dialect",
        "expiry",
        "heard",
        "held",
        "ident",
        "order",
        "services",
        "timeout",
    )

    def __init__(self, ident: bytes, dialect: Dialect, timeout: float) -> None:
        self.ident = ident
        #: How to write to it (for DCP, the type-frame width it last used).
        self.dialect = dialect
        self.services: list[Service] = []
        #: Requests it may still be given (routing Rule R1).
        self.credit = 0
        #: Requests given to it and not yet answered, oldest first.
        self.held: list[Pending] = []
        #: Silence allowed before peers Rule L2 applies.
        self.timeout = timeout
        #: When it was last heard from, and when it expires if not heard from again.
        self.heard = 0.0
        self.expiry = 0.0
        #: Whether it has been heard beating while it held requests (peers Rule L3).
        self.beats_busy = False
        #: The liveness order it is in (its timeout's).
        self.order: OrderedDict[bytes, None] = OrderedDict()

    def held_for(self, client: bytes) -> Pending | None:
        """The oldest request it holds for ``client`` (for partial answers)."""
        for pending in self.held:
            if pending.client == client:
                return pending
        return None


class Expiry:
    """When a request's caller gives up, and its bookkeeping (queues Rule Q3)."""

    __slots__ = ("dead", "queued", "token", "when")

    def __init__(self, when: float) -> None:
        self.when = when
        #: In a queue now (its latest heap entry stands).
        self.queued = False
        #: Dropped from its queue (a tombstone until it reaches the front or is swept).
        self.dead = False
        #: Bumped at each push: older heap entries are stale.
        self.token = 0


class Pending:
    """A request in a queue or held by a worker."""

    __slots__ = (
        "chain",
        "charged",
        "client",
        "data",
        "expiry",
        "holder",
        "key",
        "load",
        "metadata",
        "origin",
        "redeliveries",
        "seq",
        "service",
        "shown",
        "since",
        "token",
        "work_timeout",
    )

    def __init__(
        self,
        seq: int,
        service: Service,
        client: bytes,
        shown: bytes,
        origin: Dialect,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        load: Load,
        work_timeout: float | None,
        expiry: Expiry | None,
        since: float,
        key: Key | None = None,
        chain: tuple[bytes, ...] = (),
        charged: int = 0,
    ) -> None:
        #: Arrival order, to serve a multi-service worker the oldest request first.
        self.seq = seq
        self.service = service
        #: The client's address, and the address workers see (sealed in secure mode).
        self.client = client
        self.shown = shown
        #: The client's dialect, to answer it in kind.
        self.origin = origin
        self.metadata = metadata
        self.data = data
        self.redeliveries = 0
        self.load = load
        self.work_timeout = work_timeout
        #: Its caller's deadline, if it carries expires-in (queues Rule Q3).
        self.expiry = expiry
        #: The worker holding it, if any.
        self.holder: Session | None = None
        #: Counts dispatches: a work-timeout entry is live only while its token matches.
        self.token = 0
        #: When it was queued or last dispatched (directory Rule D5: queue age, timing).
        self.since = since
        #: Its client's address and dcp request id, if it has one: it is in the routing
        #: part's index of requests in flight under this key (routing Rule R8).
        self.key = key
        #: The services it passed through before this one, oldest first (a forward's;
        #: empty for a client's own request; routing Rule R9).
        self.chain = chain
        #: Bytes charged for it to its client in the ``queued`` account (routing Rule R10).
        self.charged = charged


class Service:
    """A service: its queue (queues Rule Q3: the front is never a tombstone) and its
    workers."""

    __slots__ = (
        "answered",
        "busy_time",
        "creator",
        "dead",
        "durations",
        "errors",
        "idle",
        "name",
        "queue",
        "redeliveries",
        "requests",
        "workers",
    )

    def __init__(self, name: bytes) -> None:
        self.name = name
        #: The client whose request made it, while no worker has provided it (admission
        #: Rule AD5; ``None``: a worker made it, or has provided it since).
        self.creator: bytes | None = None
        self.queue: deque[Pending] = deque()
        #: Tombstones in :attr:`queue` (queues Rule Q3).
        self.dead = 0
        #: Ready workers, least recently used first.
        self.idle: OrderedDict[bytes, Session] = OrderedDict()
        self.workers = 0
        #: Directory Rule D5: requests accepted, error replies, answers and their total
        #: processing time (s, dispatch to answer).
        self.requests = self.errors = self.answered = 0
        self.busy_time = 0.0
        #: Requests put back in the queue because their worker went away (routing Rule R5).
        self.redeliveries = 0
        #: Answers by processing time: ``durations[i]`` counts those of at most
        #: ``DURATION_BUCKETS[i]`` seconds and more than the bucket before (the last: longer).
        self.durations = [0] * (len(DURATION_BUCKETS) + 1)

    def queued(self) -> int:
        """Live requests in the queue."""
        return len(self.queue) - self.dead
