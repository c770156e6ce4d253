"""Counters and the values of statistics snapshots, in this one place: the cores increment the
counters and build the snapshots (``statistics()``, ``BrokerCore.snapshot``), which the
drivers, metrics and info services read. Values only: this module is below the cores and
imports none of them."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = [
    "DURATION_BUCKETS",
    "AccountFigures",
    "BrokerCounters",
    "BrokerSnapshot",
    "BrokerStatistics",
    "ClientFigures",
    "ClientStatistics",
    "ServiceFigures",
    "QueueStatistics",
    "WorkerFigures",
    "WorkerStatistics",
]

#: Upper bounds (seconds) of the buckets that count each service's answers by processing
#: time (dispatch to answer); a last bucket holds the longer ones. Counted by the broker
#: core's routing with one ``bisect`` per answer (``/metrics``:
#: ``dcp_service_request_duration_seconds``).
DURATION_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class BrokerCounters:
    """Monotonic event counts of one broker (plain attributes: incrementing one is as cheap
    as it gets on the per-message path)."""

    __slots__ = (
        "answered_elsewhere",
        "dispatched",
        "dropped_replies",
        "expired",
        "expired_in_queue",
        "forwards",
        "partials",
        "reconnects_sent",
        "redeliveries",
        "rejections",
        "replaced",
        "replies",
        "requests",
        "undeliverable",
        "unmatched",
        "work_timeouts",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.replies = 0
        self.partials = 0
        self.forwards = 0
        self.dispatched = 0
        self.redeliveries = 0
        self.dropped_replies = 0
        self.undeliverable = 0
        self.reconnects_sent = 0
        self.unmatched = 0
        self.expired = 0
        self.work_timeouts = 0
        self.expired_in_queue = 0
        self.replaced = 0
        self.answered_elsewhere = 0
        #: Messages refused, by reason.
        self.rejections: dict[str, int] = {}

    def count(self, reason: str) -> None:
        """Count one refusal for ``reason``."""
        self.rejections[reason] = self.rejections.get(reason, 0) + 1


@attrs.frozen
class StreamStatistics:
    """The broker's figures of dcp streams (``BrokerStatistics.streams``; see
    ``docs/streams.md``)."""

    #: Streams open now (a part was forwarded, the final reply has not come).
    open: int = 0
    #: Parts forwarded now and not yet credited back by their readers, all streams together.
    outstanding: int = 0
    #: The most parts one stream ever had outstanding (never above its window).
    outstanding_max: int = 0
    #: Streams their reader cancelled.
    cancelled: int = 0
    #: Streams whose worker went away after a part was delivered (``stream_broken``).
    broken: int = 0
    #: Parts a worker sent without credit (the stream is ended with ``stream_overrun``).
    overruns: int = 0
    #: Messages held because a reader's socket was full (MDP readers; retried until sent).
    held: int = 0


@attrs.frozen
class QueueStatistics:
    """A service's queue and workers as the broker sees them
    (:attr:`BrokerStatistics.services`)."""

    #: Registered workers providing the service.
    workers: int
    #: Of those, how many are idle (have credit, nothing queued for them).
    idle: int
    #: Requests waiting in the queue.
    queued: int


@attrs.frozen
class AccountFigures:
    """One account of the broker's byte budget (``dcp._core.broker.budget``), as
    :meth:`dcp.Broker.statistics`, ``/metrics``, ``/status`` and ``dcp top`` show it."""

    #: the account's name (a key of :data:`SHARES`)
    name: str
    #: bytes held now
    used: int
    #: the most bytes held at once
    peak: int
    #: the account's limit (``None``: no budget)
    limit: int | None
    #: the most one peer may hold (``None``: no budget)
    peer_limit: int | None
    #: peers holding something
    peers: int
    #: charges refused (Rule MB1, MB2)
    refused: int


@attrs.frozen
class BrokerStatistics:
    """Counters and gauges of a broker, as returned by ``statistics()``."""

    #: Requests accepted (queued or dispatched), including forwards.
    requests: int
    #: Replies routed to a client (final ones; see :attr:`partials`).
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
    #: Workers removed because they held a request past its work timeout (Rule R7).
    work_timeouts: int
    #: Messages refused, by reason (also malformed ones, by ProtocolError reason).
    rejections: dict[str, int]
    #: Registered workers.
    workers: int
    #: Clients with requests accepted and not yet answered (queued or held).
    clients: int
    #: Per-service workers, idle workers and queue depth.
    services: dict[bytes, QueueStatistics]
    #: Partial replies (MDP/0.2 PARTIAL) routed to a client.
    partials: int = 0
    #: Queued requests dropped unanswered because their caller's deadline (the expires-in
    #: option) passed (queues Rule Q3).
    expired_in_queue: int = 0
    #: Retries that replaced their still-queued copy instead of queueing another (queues
    #: Rule Q4; not counted in :attr:`requests`).
    replaced: int = 0
    #: Queued requests ended unrun because a worker answered them through another broker
    #: (or after the broker gave up on it): routing Rule R11.
    answered_elsewhere: int = 0
    #: dcp streams (``docs/streams.md``).
    streams: StreamStatistics = StreamStatistics()
    #: The byte budget: ``max_memory`` (``None``: no budget) and every account's figures.
    max_memory: int | None = None
    memory: tuple[AccountFigures, ...] = ()


@attrs.frozen
class WorkerStatistics:
    """Counters of a worker (:meth:`dcp.Worker.statistics`).

    ``received == replies + errors + forwards + cancelled + dropped + expired + in_progress +
    backlog``
    """

    #: Requests received from the broker.
    received: int
    #: Successful replies produced (sent, or kept for the next connection); not errors.
    replies: int
    #: Requests forwarded to another service.
    forwards: int
    #: Error replies sent (handler raised, or returned something that is not a result).
    errors: int
    #: Handlers cancelled by a stop's grace deadline (no reply sent).
    cancelled: int
    #: Requests dropped without running: backlog on reconnect or stop, arrivals while stopping.
    dropped: int
    #: Handlers running now.
    in_progress: int
    #: Requests waiting in the local backlog now.
    backlog: int
    #: Requests that ever had to wait in the backlog (Rule W4).
    backlogged: int
    #: New connections after the first one (broker went silent).
    reconnects: int
    #: Registrations repeated on the same connection after a Reconnect from the broker.
    reregistrations: int
    #: Malformed messages received from the broker.
    malformed: int
    #: Well-formed but unexpected messages received (e.g. a reply).
    unexpected: int
    #: Messages the socket refused to send (e.g. high-water mark); filled by the I/O layer.
    send_failures: int = 0
    #: Requests not run because their caller's deadline passed while they waited in the
    #: backlog (answered with an ``expired`` error reply; Rule W4).
    expired: int = 0
    #: Replies sent again after a lost connection, in case the broker lost them (Rule W13 of
    #: :mod:`dcp._core.worker.core`); a client drops the ones it already has.
    replayed: int = 0
    #: Of those, replies not sent: the send queue had no room for them (they never delay a
    #: fresh answer; Rule WC7 of :mod:`dcp._worker.connection`).
    replays_dropped: int = 0
    #: Requests that came again (through another broker) while held or lately answered, and
    #: were not run again (a worker serving several brokers, docs/scaling.md).
    duplicates: int = 0
    #: Whether a broker has confirmed the registration (:meth:`dcp.Worker.brokers`: that
    #: broker; :meth:`dcp.Worker.statistics`: any).
    registered: bool = False


@attrs.frozen
class ClientStatistics:
    """Counters of a client (its tracker and its driver), from ``statistics()``."""

    #: Requests started.
    requests: int
    #: Requests answered with a result (a :class:`Response`).
    replies: int
    #: Requests answered with a dcp error reply (:class:`~dcp.RemoteError`).
    errors: int
    #: Resends after a timed-out attempt.
    retries: int
    #: Requests that failed with :class:`~dcp.RequestTimeout` (not :class:`~dcp.NoWorkers`).
    timeouts: int
    #: Requests cancelled before an answer.
    cancelled: int
    #: Replies for a request that had already been answered.
    duplicates: int
    #: Replies for a request that had timed out or been cancelled.
    late: int
    #: Replies for an id this client does not know (or no longer remembers).
    unknown: int
    #: Incoming messages dropped because they are not a DCP reply with an id, by reason.
    malformed: Mapping[str, int]
    #: Requests waiting for an answer now.
    pending: int
    #: Sends that found zmq's queue full (high-water mark) and had to wait.
    send_waits: int = 0
    #: Resends not made because zmq's queue was full (the attempt then times out again).
    resends_dropped: int = 0
    #: Requests that failed with :class:`~dcp.NoWorkers` (a probe's ``404`` or a broker's
    #: ``no_workers`` answer to a no-wait request).
    no_workers: int = 0
    #: ``mmi.service`` probes sent before a request's end (Rule RT5).
    probes: int = 0
    #: Failover across several brokers (``docs/scaling.md``; always 0 with one broker).
    #: Requests moved to another broker after theirs was lost (Rule BK4 of
    #: :mod:`dcp._core.client.brokers`; a move is not a retry).
    failovers: int = 0
    #: HELD notices that kept an outstanding request from moving (Rule BK5).
    held: int = 0
    #: HELD notices for a request this client no longer waits for, dropped (Rule BK5).
    held_dropped: int = 0
    #: Times a broker was lost (its connection closed or a handshake failed, Rule BK2),
    #: summed over the brokers.
    brokers_lost: int = 0


#: How a request ended: a result, an error reply, or a timeout (maybe :class:`NoWorkers`).


@attrs.frozen
class ServiceFigures:
    """One service in a :class:`BrokerSnapshot`. Its counters start when the broker learns of
    the service and are forgotten with it (no worker provides it, nothing queued)."""

    #: Its name (bytes that are not UTF-8 escaped).
    name: str
    #: Registered workers providing it, idle ones (credit, nothing queued for them), busy ones.
    workers: int
    idle: int
    busy: int
    #: Requests waiting in its queue, and the age (s) of the oldest (since queued or requeued).
    queued: int
    oldest_queued_age: float
    #: Requests accepted (queued or dispatched; forwards included).
    requests: int
    #: Answers from its workers that finished a request (errors included).
    replies: int
    #: Of those, error replies.
    errors: int
    #: Requests put back in its queue because their worker went away.
    redeliveries: int
    #: Sum of the answers' processing times (s, dispatch to answer).
    processing_time: float
    #: Answers per processing-time bucket (:data:`DURATION_BUCKETS`, then a last one for
    #: longer), not cumulative.
    durations: tuple[int, ...]
    #: What its newest describing worker said (empty when none did).
    version: str = ""
    description: str = ""


@attrs.frozen
class WorkerFigures:
    """One registered worker in a :class:`BrokerSnapshot`."""

    #: Its routing id, in hex.
    id: str
    #: The dialect it speaks (``dcp``, ``dcp/4``, ``MDPW01``, ...).
    dialect: str
    #: The services it provides.
    services: tuple[str, ...]
    #: Requests it holds now, and how many more it may be given.
    held: int
    credit: int
    #: Seconds since it was last heard from.
    silent: float


@attrs.frozen
class ClientFigures:
    """A client with requests accepted and not yet answered, in a :class:`BrokerSnapshot`."""

    #: Its routing id, in hex.
    id: str
    #: The dialect the broker answers it in.
    dialect: str
    #: Its requests accepted and not answered (queued or at a worker), and of those, queued.
    inflight: int
    queued: int


@attrs.frozen
class BrokerSnapshot:
    """Everything the HTTP endpoint shows (``docs/operations.md``), taken in one go where the
    broker's core runs (``BrokerCore.snapshot``)."""

    #: The counters and gauges of ``Broker.statistics()``.
    statistics: BrokerStatistics
    services: tuple[ServiceFigures, ...]
    #: Registered workers and active clients (empty unless asked for: they can be many).
    workers: tuple[WorkerFigures, ...]
    clients: tuple[ClientFigures, ...]
    #: Peers by kind (``worker``; ``client``: with requests in flight) and dialect.
    peers: dict[tuple[str, str], int]
