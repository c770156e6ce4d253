"""Issue 26, finding 6: what the broker keeps for requests, replies and streams is bounded in
bytes (budget Rules MB1-MB4) and what departed clients left behind leaves (admission Rules
AD5-AD6, queues Rule Q5, routing Rule R10, unreachable Rules U3 and U6, streams Rule ST8).

Pure core, real frames, explicit ``now``, a small ``max_memory``.
"""

from __future__ import annotations

import pytest

from dcp._core.broker.budget import ENTRY_OVERHEAD, FRAME_OVERHEAD, cost
from dcp._core.broker.core import BrokerCore
from dcp.wire import Register, Reply, Request
from dcp.wire.options import REQUEST_ID_PREFIX, expires_in_option
from dcp.wire.streams import StreamType, build, stream_option
from tests.helpers import C1, C2, ECHO, W1, error_of, feed, out, take, workers

KB = 1024


def big(n: int, size: int, service: bytes = ECHO, client: bytes | None = None) -> Request:
    """Request ``n`` with ``size`` bytes of data."""
    return Request(service, client, (b"m%d" % n,), (b"x" * size,))


def queued(core: BrokerCore) -> int:
    return core.memory.account("queued").used


# ------------------------------------------------------ the services lockout (finding 6)


def test_one_client_cannot_fill_max_services() -> None:
    """Admission Rule AD5: one client's made-up names fill at most its share."""
    core = BrokerCore(max_services=100)
    for i in range(20):
        feed(core, C1, big(i, 1, b"made-up-%d" % i))
    sent = take(core)
    assert [error_of(f)[1] for f in sent] == ["too_many_services"] * 10
    assert len(core.routing.services) == 10
    # Another client may still wait for a service whose worker is not there yet.
    feed(core, C2, big(1, 1, ECHO))
    assert take(core) == []
    workers(core, W1)  # echo's worker starts: it gets C2's request
    assert core.statistics().dispatched == 1


def test_made_up_services_leave_with_their_requests() -> None:
    """Queues Rule Q5: requests without an expiry leave after ``max_queue_wait`` with a
    ``queue_timeout`` error reply; the services nobody provides are forgotten with them, and
    stop counting for their maker (admission Rule AD5)."""
    core = BrokerCore(max_services=20, max_client_services=20, max_queue_wait=30.0)
    for i in range(20):
        feed(core, C1, big(i, 1, b"made-up-%d" % i), now=1.0)
    assert take(core) == []
    feed(core, C2, big(99, 1, ECHO), now=2.0)
    assert error_of(take(core)[0])[1] == "too_many_services"  # full, for now
    assert core.next_deadline() == 31.0
    core.expire(31.0)
    sent = take(core)
    assert {error_of(f)[:2] for f in sent} == {(C1, "queue_timeout")}
    assert len(sent) == 20
    assert core.routing.services == {}
    assert core.routing.made == {}
    assert queued(core) == 0
    stats = core.statistics()
    assert stats.rejections["queue_timeout"] == 20
    assert stats.expired_in_queue == 20
    feed(core, C2, big(99, 1, ECHO), now=32.0)
    assert take(core) == []  # queued: waits for echo's worker
    workers(core, W1)
    assert core.statistics().dispatched == 1


def test_a_service_a_worker_provides_no_longer_counts_for_its_maker() -> None:
    core = BrokerCore(max_client_services=1)
    feed(core, C1, big(1, 1, b"a"))
    workers(core, W1, service=b"a")
    assert core.routing.made == {}
    feed(core, C1, big(2, 1, b"b"))
    assert take(core) == []
    assert core.routing.made == {C1: 1}


def test_a_refused_request_makes_no_service() -> None:
    """A request refused for its client's limit leaves no empty service behind."""
    core = BrokerCore(max_client_inflight=1)
    feed(core, C1, big(1, 1, b"a"))
    feed(core, C1, big(2, 1, b"b"))
    assert error_of(take(core)[0])[1] == "client_limit"
    assert set(core.routing.services) == {b"a"}
    assert core.routing.made == {C1: 1}


def test_the_wait_starts_anew_when_a_request_is_given_back() -> None:
    core = BrokerCore(max_queue_wait=30.0, heartbeat_interval=100.0)
    workers(core, W1)
    feed(core, C1, big(1, 1), now=0.0)
    take(core)
    core.redelivery.remove_worker(core.sessions.workers[W1], 50.0)
    assert core.next_deadline() == 80.0  # given back at 50: not dropped at once
    core.expire(80.0)
    assert error_of(take(core)[0])[:2] == (C1, "queue_timeout")


def test_a_caller_deadline_replaces_the_wait() -> None:
    """A retry's expires-in is the caller's deadline: no error reply when it passes."""
    core = BrokerCore(max_queue_wait=30.0, heartbeat_interval=100.0)
    rid = REQUEST_ID_PREFIX + b"1"
    feed(core, C1, Request(ECHO, None, (rid,), (b"d",)), now=0.0)
    assert core.next_deadline() == 30.0
    feed(core, C1, Request(ECHO, None, (rid, expires_in_option(5.0)), (b"d",)), now=1.0)
    assert core.next_deadline() == 6.0
    core.expire(6.0)
    assert take(core) == []
    assert "queue_timeout" not in core.statistics().rejections


def test_no_wait_limit_keeps_requests() -> None:
    core = BrokerCore(max_queue_wait=None)
    feed(core, C1, big(1, 1))
    assert core.next_deadline() is None


# --------------------------------------------------------- queued bytes (Rule R10)


@pytest.mark.parametrize(
    ("metadata", "data"),
    [((b"m1",), (b"abc",)), ((b"m1", b"m2"), (b"abc", b"", b"z" * 100)), ((b"m1",), ())],
)
def test_a_request_is_charged_the_budget_cost_of_its_parts(
    metadata: tuple[bytes, ...], data: tuple[bytes, ...]
) -> None:
    """Rule R10: what submit charges (inlined there) is budget.cost of the request's parts."""
    core = BrokerCore()
    feed(core, C1, Request(ECHO, None, metadata, data))  # no worker: it waits, charged
    assert queued(core) == cost((*metadata, *data))


def test_queued_requests_are_charged_and_refused_past_the_share() -> None:
    """Rule R10 / MB2: one client holds at most its share of the ``queued`` account."""
    core = BrokerCore(max_memory=400 * KB)  # queued: 140 KiB, 35 KiB per client
    for i in range(10):
        feed(core, C1, big(i, 10 * KB))
    sent = take(core)
    one = 10 * KB + 2 + 2 * FRAME_OVERHEAD + ENTRY_OVERHEAD
    assert queued(core) == 3 * one
    assert [error_of(f)[:2] for f in sent] == [(C1, "memory_budget")] * 7
    assert core.memory.account("queued").refused == 7
    assert core.statistics().rejections["memory_budget"] == 7
    # Another client has its own share.
    feed(core, C2, big(1, 10 * KB))
    assert take(core) == []
    assert core.statistics().services[ECHO].queued == 4


def test_the_account_fills_up_broker_wide() -> None:
    core = BrokerCore(max_memory=100 * KB)  # queued: 35 KiB
    refused = 0
    for i in range(10):
        feed(core, b"C%d" % i, big(i, 10 * KB))
        refused += len(take(core))
    assert refused == 7
    assert queued(core) <= core.memory.account("queued").limit  # type: ignore[operator]


def test_charges_are_released_when_answered() -> None:
    core = BrokerCore(max_memory=400 * KB)
    workers(core, W1)
    feed(core, C1, big(1, 10 * KB))
    assert len(take(core)) == 1  # given to W1
    assert queued(core) > 10 * KB  # held by the worker: still charged
    feed(core, W1, Reply(C1, (b"m1",), (b"r",)))
    take(core)
    assert queued(core) == 0
    assert core.memory.account("queued").held(C1) == 0


def test_charges_are_released_when_given_up() -> None:
    """redelivery_limit, expiry and Q4 replacement release exactly what was charged."""
    core = BrokerCore(max_memory=400 * KB, max_redeliveries=0, heartbeat_interval=100.0)
    workers(core, W1)
    feed(core, C1, big(1, 10 * KB))
    take(core)
    core.redelivery.remove_worker(core.sessions.workers[W1], 1.0)
    assert error_of(take(core)[0])[1] == "redelivery_limit"
    assert queued(core) == 0
    # Expired in the queue (Rule Q3).
    feed(core, C1, Request(ECHO, None, (b"m2", expires_in_option(1.0)), (b"x" * KB,)))
    assert queued(core) > KB
    core.expire(5.0)
    assert queued(core) == 0
    # A retry replaces its queued copy: the retry's bytes are charged instead.
    rid = REQUEST_ID_PREFIX + b"7"
    feed(core, C1, Request(ECHO, None, (rid,), (b"x" * (2 * KB),)), now=6.0)
    first = queued(core)
    feed(core, C1, Request(ECHO, None, (rid,), (b"x" * KB,)), now=7.0)
    assert queued(core) == first - KB
    assert core.statistics().replaced == 1
    core.expire(6.0 + 300.0)
    assert queued(core) == 0
    assert core.routing.inflight == {}


def test_the_inflight_index_is_bounded_by_the_account() -> None:
    """Rule R10: an index entry exists only for a request that is charged (entry overhead
    included): a client past its share adds no entries."""
    core = BrokerCore(max_memory=100 * KB)  # queued: 35 KiB, 8.75 KiB per client
    for i in range(1000):
        rid = REQUEST_ID_PREFIX + b"%d" % i
        feed(core, C1, Request(ECHO, None, (rid,), (b"",)))
    take(core)
    per_entry = ENTRY_OVERHEAD + 2 * FRAME_OVERHEAD + len(REQUEST_ID_PREFIX) + 3
    assert len(core.routing.inflight) <= 8.75 * KB // (per_entry - 1) + 1
    assert len(core.routing.inflight) < 1000


# ------------------------------------------- replies kept for the grace (Rules U3, U6)


def test_replies_from_non_workers_are_charged_and_bounded() -> None:
    """Unreachable Rule U6: replies kept for a peer to register are charged to its share of
    the ``replies`` account; past it they are refused at once."""
    core = BrokerCore(max_memory=400 * KB)  # replies: 40 KiB, 10 KiB per peer
    for i in range(10):
        feed(core, b"X", Reply(C1, (b"m%d" % i,), (b"r" * (4 * KB),)), now=0.0)
    replies = core.memory.account("replies")
    assert len(core.early) == 2
    assert core.statistics().rejections["reply_from_non_worker"] == 8
    assert replies.used == replies.held(b"X") > 8 * KB
    core.expire(100.0)
    assert replies.used == 0
    assert len(core.early) == 0


def test_replies_kept_for_a_registering_worker_are_released() -> None:
    core = BrokerCore(max_memory=400 * KB)
    feed(core, W1, Reply(C1, (b"m1",), (b"r",)), now=0.0)
    assert core.memory.account("replies").used > 0
    feed(core, W1, Register(ECHO), now=0.1)
    assert core.memory.account("replies").used == 0


def test_replies_for_unreachable_clients_are_charged_and_bounded() -> None:
    """Unreachable Rule U6: a reply refused for a gone client is kept only if its client's
    share of ``replies`` allows; kept ones are released when they are sent again."""
    core = BrokerCore(max_memory=400 * KB, heartbeat_interval=1.0)
    replies = core.memory.account("replies")
    frames = [out(C1, Reply(C1, (b"m%d" % i,), (b"r" * (4 * KB),))) for i in range(5)]
    for f in frames:
        core.undeliverable(f, "gone")
    assert len(core.unreachable.kept) == 2
    assert core.statistics().dropped_replies == 3
    assert replies.used == replies.held(C1) > 8 * KB
    core.expire(core.next_deadline() or 0.0)
    assert len(take(core)) == 2  # sent again
    assert replies.used == 0


# ------------------------------------------------------- stream parts (Rule ST8)


def test_a_reader_that_never_reads_is_stopped_at_its_share() -> None:
    """Streams Rule ST8: parts written to a reader and not yet credited back are charged to
    it in the ``streams`` account; a part past its share ends the stream (``memory_budget``),
    whatever window it asked for."""
    core = BrokerCore(max_memory=400 * KB)  # streams: 60 KiB, 15 KiB per reader
    workers(core, W1)
    rid = REQUEST_ID_PREFIX + b"1"
    metadata = (rid, stream_option(999_999_999))
    feed(core, C1, Request(ECHO, None, metadata, (b"go",)))
    take(core)
    part = b"p" * (4 * KB)
    for _ in range(10):
        feed(core, W1, build(StreamType.PARTIAL, C1, metadata, (part,)))
    sent = take(core)
    to_reader = [f for f in sent if f[0] == C1]
    to_worker = [f for f in sent if f[0] == W1]
    assert len(to_reader) == 4  # 3 parts, then the error reply
    assert error_of(to_reader[-1])[:2] == (C1, "memory_budget")
    assert len(to_worker) == 1  # CANCEL
    streams = core.memory.account("streams")
    assert 12 * KB < streams.used <= 15 * KB
    # The worker's final reply ends the stream: its charge goes.
    feed(core, W1, Reply(C1, metadata, (b"done",)))
    take(core)
    assert streams.used == 0


def test_credit_releases_a_readers_parts() -> None:
    core = BrokerCore(max_memory=400 * KB)
    workers(core, W1)
    rid = REQUEST_ID_PREFIX + b"1"
    metadata = (rid, stream_option(100))
    feed(core, C1, Request(ECHO, None, metadata, (b"go",)))
    take(core)
    part = b"p" * (4 * KB)
    streams = core.memory.account("streams")
    for _ in range(30):  # 120 KiB in all, never more than 8 KiB outstanding
        feed(core, W1, build(StreamType.PARTIAL, C1, metadata, (part,)))
        feed(core, C1, build(StreamType.CREDIT, None, (rid,), credit=1))
        assert streams.used < 8 * KB
    sent = take(core)
    assert sum(1 for f in sent if f[0] == C1) == 30
    assert core.statistics().rejections.get("memory_budget") is None


def test_a_retry_too_large_for_the_share_leaves_the_queued_copy() -> None:
    """Rule R10 with queues Rule Q4: a retry whose bytes do not fit does not replace the
    queued copy, which keeps its own charge."""
    core = BrokerCore(max_memory=400 * KB)  # queued: 35 KiB per client
    rid = REQUEST_ID_PREFIX + b"1"
    feed(core, C1, Request(ECHO, None, (rid,), (b"x" * KB,)))
    feed(core, C2, big(2, 10 * KB))  # C1's first charge is small: the account has room
    first = core.memory.account("queued").held(C1)
    feed(core, C1, Request(ECHO, None, (rid,), (b"y" * (40 * KB),)))
    assert core.memory.account("queued").held(C1) == first
    assert core.statistics().replaced == 1
    workers(core, W1)  # it gets the oldest request: C1's copy, unchanged
    assert [p.data for p in core.sessions.workers[W1].held] == [(b"x" * KB,)]


def test_the_new_options_are_checked() -> None:
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="max_queue_wait"):
            BrokerCore(max_queue_wait=bad)
    with pytest.raises(ValueError, match="max_client_services"):
        BrokerCore(max_client_services=0)


def test_a_front_with_a_caller_deadline_is_left_to_it() -> None:
    """Queues Rule Q5: the wait is checked at the fronts; a front with its caller's own
    expiry is left to Rule Q3, and the requests behind it are looked at again later."""
    core = BrokerCore(max_queue_wait=30.0, heartbeat_interval=100.0)
    feed(core, C1, Request(ECHO, None, (b"m1", expires_in_option(100.0)), (b"d",)), now=0.0)
    feed(core, C1, big(2, 1), now=1.0)
    assert core.next_deadline() == 31.0
    core.expire(31.0)
    assert take(core) == []  # behind a front that is not its to drop
    assert core.next_deadline() == 61.0  # looked at again a wait later
    core.expire(100.0)  # the front's caller gives up (Rule Q3): it goes, silently;
    # the request behind it, now at the front, is past its wait
    assert [error_of(f)[:2] for f in take(core)] == [(C1, "queue_timeout")]
    assert core.routing.services == {}
    assert queued(core) == 0


def test_replies_of_other_peers_stay_kept_when_one_registers() -> None:
    core = BrokerCore(max_memory=400 * KB)
    feed(core, W1, Reply(C1, (b"m1",), (b"r",)), now=0.0)
    feed(core, b"X", Reply(C1, (b"m2",), (b"r",)), now=0.0)
    replies = core.memory.account("replies")
    kept = replies.held(b"X")
    feed(core, W1, Register(ECHO), now=0.1)
    assert replies.used == kept
    assert len(core.early) == 1
