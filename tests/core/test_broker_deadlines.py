"""The broker core's request options (queues Rules Q1-Q4): the caller's deadline of a queued
request, retries that replace their queued copy (routing Rule R8 matches them), and no-wait;
without sockets, with explicit ``now``. Also the ``redelivery_limit`` message (routing Rule R5).

Messages go in as the ROUTER sees them (routing id first).
"""

from __future__ import annotations

import pytest

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.queues import read_options
from dcp._stats import QueueStatistics
from dcp.wire import Ping, Pong, Register, Reply, Request, parse
from dcp.wire.messages import parse_error_reply
from dcp.wire.options import (
    NO_WAIT_OPTION,
    REQUEST_ID_PREFIX,
    expires_in_option,
    work_timeout_option,
)
from tests.helpers import C1, C2, ECHO, W1, error_of, feed, out, take, workers

OTHER = b"other"


def rid(n: int) -> bytes:
    return REQUEST_ID_PREFIX + b"%d" % n


def expiring(n: int, seconds: float, *extra: bytes, client: bytes | None = None) -> Request:
    """Request ``n`` as a dcp client sends it: id, expires-in, then the caller's own parts."""
    return Request(ECHO, client, (rid(n), expires_in_option(seconds), *extra), (b"d%d" % n,))


def queued(core: BrokerCore, service: bytes = ECHO) -> int:
    return core.statistics().services[service].queued


# ------------------------------------------------------------ Rule Q1: reading options


def test_options_are_read_in_one_pass() -> None:
    assert read_options((b"plain", rid(1))) is None
    assert read_options(()) is None
    options = read_options(
        (rid(1), work_timeout_option(2), expires_in_option(3), NO_WAIT_OPTION, b"mine")
    )
    assert options is not None
    assert (options.work_timeout, options.expires_in, options.no_wait) == (2.0, 3.0, True)
    # The first valid one of each kind wins; malformed and unknown ones are ignored.
    options = read_options(
        (b"\xffDCP:expires-in=0", expires_in_option(1), expires_in_option(9), b"\xffDCP:x")
    )
    assert options is not None
    assert (options.work_timeout, options.expires_in, options.no_wait) == (None, 1.0, False)


# ------------------------------------------------------------ Rule Q3: deadlines


def test_a_queued_request_past_its_expiry_is_dropped_without_a_reply() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, expiring(1, 2.0), now=10.0)
    assert take(core) == []
    assert core.next_deadline() == 12.0
    core.expire(11.999)
    assert queued(core) == 1
    core.expire(12.0)
    assert take(core) == []  # the caller gave up: no reply
    stats = core.statistics()
    assert (stats.expired_in_queue, stats.requests, stats.clients) == (1, 1, 0)
    assert stats.rejections == {}
    assert stats.services == {}  # nobody serves it and nothing waits: forgotten
    assert core.next_deadline() is None
    # A worker that registers later gets nothing.
    feed(core, W1, Register(ECHO), now=13.0)
    assert take(core) == [out(W1, Register(ECHO))]


def test_a_queued_request_is_dispatched_until_its_expiry() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, expiring(1, 2.0), now=0.0)
    feed(core, W1, Register(ECHO), now=1.9)
    assert take(core) == [out(W1, Register(ECHO)), out(W1, expiring(1, 2.0, client=C1))]
    core.expire(100.0)  # held: its expiry no longer matters (work timeouts govern it)
    assert core.next_deadline() == 301.9  # only W1's liveness is left
    feed(core, W1, Reply(C1, expiring(1, 2.0).metadata, (b"r",)), now=50.0)
    assert take(core) == [out(C1, Reply(C1, expiring(1, 2.0).metadata, (b"r",)))]
    assert core.statistics().expired_in_queue == 0


def test_an_expired_request_is_not_dispatched_between_checks() -> None:
    """The driver checks expiries every heartbeat_interval / 4; a worker that asks for work
    in between does not get a request whose caller already gave up."""
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, expiring(1, 1.0), now=0.0)
    feed(core, C1, expiring(2, 5.0), now=0.0)
    feed(core, W1, Register(ECHO), now=2.0)
    assert take(core) == [out(W1, Register(ECHO)), out(W1, expiring(2, 5.0, client=C1))]
    stats = core.statistics()
    assert (stats.expired_in_queue, stats.dispatched) == (1, 1)
    assert stats.services[ECHO] == QueueStatistics(workers=1, idle=0, queued=0)


def test_expired_requests_in_the_middle_leave_the_order_alone() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, expiring(1, 9.0), now=0.0)
    feed(core, C1, expiring(2, 1.0), now=0.0)  # expires in the middle of the queue
    feed(core, C2, Request(ECHO, None, (b"plain",), (b"p",)), now=0.0)
    feed(core, C1, expiring(3, 1.0), now=0.0)  # and at its end
    core.expire(1.0)
    assert queued(core) == 2
    assert core.statistics().clients == 2
    feed(core, W1, Register(ECHO), now=2.0)
    feed(core, W1, Ping(), now=2.0)
    feed(core, W1, Ping(), now=2.0)
    sent = [parse(frames[1:])[0] for frames in take(core) if frames[3] == b"\x04"]
    assert [m.data for m in sent if isinstance(m, Request)] == [(b"d1",), (b"p",)]
    assert core.statistics().expired_in_queue == 2


def test_many_expired_requests_are_swept_out_of_a_queue() -> None:
    core = BrokerCore(heartbeat_interval=100.0, max_client_queued=100_000)
    feed(core, C2, Request(ECHO, None, (b"first",), (b"p",)), now=0.0)  # never expires
    for n in range(5000):
        feed(core, C1, expiring(n, 1.0), now=0.0)
    feed(core, C2, Request(ECHO, None, (b"last",), (b"p",)), now=0.0)
    core.expire(1.0)
    assert queued(core) == 2
    assert core.statistics().expired_in_queue == 5000
    assert len(core.routing.services[ECHO].queue) < 2000  # tombstones swept, not kept
    feed(core, W1, Register(ECHO))
    feed(core, W1, Ping())
    sent = [parse(frames[1:])[0] for frames in take(core) if frames[3] == b"\x04"]
    assert [m.metadata for m in sent if isinstance(m, Request)] == [(b"first",), (b"last",)]


def test_the_queue_limit_counts_live_requests_only() -> None:
    core = BrokerCore(heartbeat_interval=100.0, max_queue=2)
    feed(core, C2, Request(ECHO, None, (b"keep",), (b"p",)), now=0.0)
    feed(core, C1, expiring(1, 1.0), now=0.0)
    feed(core, C1, expiring(2, 9.0), now=0.0)  # the queue is full: refused
    [sent] = take(core)
    assert error_of(sent)[1] == "queue_full"
    core.expire(1.0)
    feed(core, C1, expiring(3, 9.0), now=1.0)
    assert take(core) == []
    assert queued(core) == 2


def test_a_redelivered_request_past_its_expiry_is_dropped() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=1)
    workers(core, W1)
    feed(core, C1, expiring(1, 2.0), now=0.0)
    feed(core, C1, expiring(2, 9.0), now=0.0)
    feed(core, W1, Pong(), now=0.0)  # beats while busy: silence means it hung
    feed(core, W1, Ping(), now=0.0)  # and holds both
    take(core)
    core.expire(3.0)  # W1 expired; request 1's caller gave up meanwhile
    stats = core.statistics()
    assert (stats.expired_workers, stats.redeliveries, stats.expired_in_queue) == (1, 1, 1)
    assert queued(core) == 1
    assert stats.clients == 1
    core.expire(9.0)  # request 2 is queued again under its own expiry
    assert core.statistics().expired_in_queue == 2
    assert core.statistics().clients == 0


# ------------------------------------------------------------ Rule Q4: replacement


def test_a_retry_replaces_its_queued_copy() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, expiring(1, 2.0, b"mine"), now=0.0)
    feed(core, C1, expiring(1, 4.5, b"mine"), now=1.5)  # the retry: time left, 4.5 s
    feed(core, C1, expiring(1, 3.0, b"mine"), now=3.0)  # another one
    assert take(core) == []
    stats = core.statistics()
    assert (stats.requests, stats.replaced, stats.clients) == (1, 2, 1)
    assert queued(core) == 1
    assert core.next_deadline() == 6.0  # the latest attempt's deadline
    core.expire(5.9)
    assert queued(core) == 1
    # A worker that registers later runs the job once, with the latest attempt's metadata.
    feed(core, W1, Register(ECHO), now=5.9)
    feed(core, W1, Ping(), now=5.9)
    assert take(core) == [
        out(W1, Register(ECHO)),
        out(W1, expiring(1, 3.0, b"mine", client=C1)),
        out(W1, Pong()),
    ]
    feed(core, W1, Reply(C1, expiring(1, 3.0, b"mine").metadata, (b"r",)), now=6.0)
    assert take(core) == [out(C1, Reply(C1, expiring(1, 3.0, b"mine").metadata, (b"r",)))]
    stats = core.statistics()
    assert (stats.replies, stats.unmatched, stats.expired_in_queue, stats.clients) == (1, 0, 0, 0)


def test_a_retry_keeps_its_place_in_the_queue() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, expiring(1, 9.0), now=0.0)
    feed(core, C1, expiring(2, 9.0), now=0.0)
    feed(core, C1, expiring(1, 8.0), now=1.0)
    workers(core, W1)
    assert take(core) == []
    feed(core, W1, Ping(), now=1.0)
    assert take(core) == [out(W1, Pong()), out(W1, expiring(2, 9.0, client=C1))]


def test_a_retry_of_a_held_request_is_not_queued() -> None:
    """Routing Rule R8 (its own tests: ``tests/core/test_broker_once.py``)."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    feed(core, C1, expiring(1, 5.0), now=0.0)
    take(core)
    feed(core, C1, expiring(1, 3.0), now=2.0)
    feed(core, C1, expiring(1, 2.0), now=3.0)
    assert take(core) == []
    stats = core.statistics()
    assert (stats.requests, stats.replaced) == (1, 2)
    assert queued(core) == 0


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (Request(ECHO, None, (rid(1),), (b"d",)), Request(ECHO, None, (rid(1),), (b"d",))),
        (expiring(1, 5.0, b"a"), expiring(1, 5.0, b"b")),
        (expiring(1, 5.0), Request(ECHO, None, (rid(1), expires_in_option(4.0)), (b"x",))),
    ],
    ids=["no-expires-in", "other-metadata", "other-data"],
)
def test_a_retry_is_known_by_its_id(first: Request, second: Request) -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, first, now=0.0)
    feed(core, C1, second, now=1.0)
    stats = core.statistics()
    assert (stats.requests, stats.replaced) == (1, 1)
    # The queued copy took the retry's metadata and data.
    feed(core, W1, Register(ECHO), now=1.0)
    assert take(core)[-1] == out(W1, Request(ECHO, C1, second.metadata, second.data))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (expiring(1, 5.0), expiring(2, 5.0)),
        (Request(ECHO, None, (b"1",), (b"d",)), Request(ECHO, None, (b"1",), (b"d",))),
    ],
    ids=["other-id", "not-a-dcp-id"],
)
def test_other_requests_are_not_retries(first: Request, second: Request) -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, first, now=0.0)
    feed(core, C1, second, now=1.0)
    stats = core.statistics()
    assert (stats.requests, stats.replaced) == (2, 0)


def test_a_retry_for_another_service_is_joined_not_replaced() -> None:
    """The same client and id for another service: the request in flight (a forward chain's
    next service, routing Rule R9) is not run again, and keeps its own metadata and data."""
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, expiring(1, 5.0), now=0.0)
    feed(core, C1, Request(OTHER, None, expiring(1, 9.0).metadata, (b"x",)), now=1.0)
    assert (core.statistics().requests, core.statistics().replaced) == (1, 1)
    assert core.next_deadline() == 10.0  # its deadline is the retry's
    feed(core, W1, Register(ECHO), now=1.0)
    assert take(core)[-1] == out(W1, expiring(1, 5.0, client=C1))


def test_another_clients_request_is_not_a_retry() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, expiring(1, 5.0), now=0.0)
    feed(core, C2, expiring(1, 5.0), now=0.0)
    assert (core.statistics().requests, queued(core)) == (2, 2)


def test_a_retry_is_not_refused_by_the_limits_its_copy_already_passed() -> None:
    core = BrokerCore(heartbeat_interval=100.0, max_queue=1, max_client_queued=1)
    feed(core, C1, expiring(1, 5.0), now=0.0)
    feed(core, C1, expiring(1, 4.0), now=1.0)
    assert take(core) == []
    assert core.statistics().replaced == 1


# ------------------------------------------------------------ Rule Q2: no-wait


@pytest.mark.parametrize("width", [1, 4])
def test_no_wait_for_a_service_nobody_serves_gets_no_workers_at_once(width: int) -> None:
    core = BrokerCore()
    request = Request(ECHO, None, (rid(1), NO_WAIT_OPTION), (b"d",))
    feed(core, C1, request, width)
    [sent] = take(core)
    assert error_of(sent) == (C1, "no_workers", request.metadata)
    assert len(sent[3]) == width
    reply, _ = parse(sent[1:])
    assert isinstance(reply, Reply)
    assert parse_error_reply(reply.data) == ("no_workers", "no worker serves b'echo'")
    stats = core.statistics()
    assert stats.rejections == {"no_workers": 1}
    assert (stats.requests, stats.clients, stats.services) == (0, 0, {})


def test_no_wait_queues_when_a_worker_serves_even_a_busy_one() -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, Request(ECHO, None, (b"1",), (b"d",)))
    feed(core, C1, Request(ECHO, None, (rid(2), NO_WAIT_OPTION), (b"d",)))
    assert len(take(core)) == 1  # the first one, to W1
    assert queued(core) == 1
    assert core.statistics().rejections == {}


def test_a_forward_with_no_wait_to_an_unserved_service_tells_the_original_client() -> None:
    core = BrokerCore()
    workers(core, W1)
    metadata = (rid(1), NO_WAIT_OPTION)
    feed(core, C1, Request(ECHO, None, metadata, (b"d",)))
    take(core)
    feed(core, W1, Request(OTHER, C1, metadata, (b"d2",)))
    sent = take(core)
    chain = (b"\xffDCP:via=echo", b"\xffDCP:via=other")  # routing Rule R9
    assert error_of(sent[0]) == (C1, "no_workers", (*metadata, *chain))
    assert core.statistics().clients == 0  # the forward released what W1 held


# ------------------------------------------------------------ Rule R5: the message


def test_the_redelivery_limit_message_says_what_happened() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=1, max_redeliveries=2)
    feed(core, C1, Request(ECHO, None, (b"m",), (b"d",)), now=0.0)
    for now in (0.0, 1.0, 2.0):
        feed(core, W1, Register(ECHO), now=now)  # the same worker, each time
        feed(core, W1, Pong(), now=now)
        core.expire(now + 1.0)
    reply, _ = parse(take(core)[-1][1:])
    assert isinstance(reply, Reply)
    assert parse_error_reply(reply.data) == (
        "redelivery_limit",
        "redelivered 2 times (the limit); each time, the worker holding it went away",
    )
