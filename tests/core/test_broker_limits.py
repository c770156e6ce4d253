"""The broker core's limits and work timeouts (Rules R6 and R7), without sockets.

Messages go in as the ROUTER sees them (routing id first), with explicit ``now``.
"""

from __future__ import annotations

import pytest

from dcp._core.broker.core import BrokerCore
from dcp._stats import QueueStatistics
from dcp.wire import PROTOCOL, Ping, Pong, Reconnect, Register, Reply, Request, serialize
from dcp.wire.options import parse_work_timeout, work_timeout_option
from tests.helpers import (
    C1,
    C2,
    ECHO,
    W1,
    W2,
    answer,
    error_of,
    feed,
    given,
    out,
    req,
    take,
    workers,
)

P = PROTOCOL


def timed(n: int, seconds: float, client: bytes | None = None) -> Request:
    """Request ``n`` carrying a work timeout."""
    return Request(ECHO, client, (b"m%d" % n, work_timeout_option(seconds)), (b"d%d" % n,))


# ------------------------------------------------------------ the option itself


@pytest.mark.parametrize(
    ("seconds", "part"),
    [(1, b"\xffDCP:work-timeout=1000"), (0.0001, b"\xffDCP:work-timeout=1"), (2.5, None)],
)
def test_work_timeout_option_is_whole_milliseconds(seconds: float, part: bytes | None) -> None:
    option = work_timeout_option(seconds)
    if part is not None:
        assert option == part
    assert parse_work_timeout(option) == max(0.001, round(seconds * 1000) / 1000)


@pytest.mark.parametrize("seconds", [0, -1, float("inf"), float("nan")])
def test_work_timeout_option_refuses_nonsense(seconds: float) -> None:
    with pytest.raises(ValueError, match="work_timeout"):
        work_timeout_option(seconds)


@pytest.mark.parametrize(
    "part",
    [
        b"\xffDCP:work-timeout=",
        b"\xffDCP:work-timeout=0",
        b"\xffDCP:work-timeout=-5",
        b"\xffDCP:work-timeout=1.5",
        b"\xffDCP:work-timeout=" + b"9" * 13,
        b"\xffDCP:other=5",
        b"work-timeout=5",
    ],
)
def test_malformed_work_timeout_options_are_ignored(part: bytes) -> None:
    assert parse_work_timeout(part) is None
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, Request(ECHO, None, (part,), (b"d",)), now=0.0)
    take(core)
    core.expire(1e9)
    assert core.statistics().work_timeouts == 0


# ------------------------------------------------------------ Rule R7: work timeouts


def test_a_worker_past_the_work_timeout_is_dropped_and_the_request_redelivered() -> None:
    core = BrokerCore(heartbeat_interval=100.0, reply_grace=0)
    workers(core, W1)
    feed(core, C1, timed(1, 5.0), now=0.0)
    [sent] = take(core)
    assert sent[:1] == [W1]
    assert core.next_deadline() == 5.0
    workers(core, W2)
    core.expire(4.999)
    assert take(core) == []
    core.expire(5.0)
    assert take(core) == [
        out(W1, Reconnect()),
        out(W2, timed(1, 5.0, C1)),
    ]
    stats = core.statistics()
    assert (stats.work_timeouts, stats.redeliveries, stats.workers) == (1, 1, 1)
    # The late answer from the dropped worker is rejected; W2's is routed.
    feed(core, W1, Reply(C1, timed(1, 5.0).metadata, (b"late",)))
    feed(core, W2, Reply(C1, timed(1, 5.0).metadata, (b"r1",)))
    assert take(core) == [out(C1, Reply(C1, timed(1, 5.0).metadata, (b"r1",)))]
    assert core.statistics().rejections == {"reply_from_non_worker": 1}
    assert core.statistics().clients == 0


def test_the_timeout_restarts_with_each_delivery() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    feed(core, C1, timed(1, 5.0), now=0.0)
    take(core)
    core.expire(5.0)
    take(core)
    feed(core, W2, Register(ECHO), now=5.0)  # gets the request at time 5
    core.expire(7.0)
    feed(core, W2, Ping(), now=7.0)
    take(core)
    core.expire(9.999)
    assert core.statistics().work_timeouts == 1
    core.expire(10.0)
    assert core.statistics().work_timeouts == 2


def test_an_answer_in_time_cancels_the_timeout() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    feed(core, C1, timed(1, 5.0), now=0.0)
    take(core)
    feed(core, W1, Reply(C1, timed(1, 5.0).metadata, (b"r",)), now=1.0)
    core.expire(50.0)
    stats = core.statistics()
    assert (stats.work_timeouts, stats.workers) == (0, 1)


def test_the_brokers_default_work_timeout_applies_to_requests_without_one() -> None:
    core = BrokerCore(heartbeat_interval=100.0, work_timeout=2.0)
    workers(core, W1)
    feed(core, C1, req(1), now=0.0)  # no option: the default
    feed(core, W1, Ping(), now=0.0)
    feed(core, C2, timed(2, 60.0), now=0.0)  # its own, longer
    take(core)
    core.expire(2.0)
    assert take(core) == [out(W1, Reconnect())]
    # Both went back to the queue; nothing is left to time out.
    assert core.statistics().services[ECHO].queued == 2
    assert core.next_deadline() == 302.0  # only W1's quarantine (liveness 300 s) is left


def test_work_timeouts_count_towards_the_redelivery_limit() -> None:
    core = BrokerCore(heartbeat_interval=100.0, max_redeliveries=1)
    feed(core, C1, timed(1, 1.0), now=0.0)
    for now, worker in ((0.0, W1), (1.0, W2)):
        feed(core, worker, Register(ECHO), now=now)
        core.expire(now + 1.0)
    sent = take(core)
    assert error_of(sent[-1]) == (C1, "redelivery_limit", timed(1, 1.0).metadata)
    stats = core.statistics()
    assert (stats.work_timeouts, stats.redeliveries, stats.clients) == (2, 1, 0)
    assert stats.rejections == {"redelivery_limit": 1}


def test_answered_deadlines_do_not_pile_up() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    for n in range(10_000):
        feed(core, C1, timed(n, 3600.0), now=0.0)
        feed(core, W1, Reply(C1, timed(n, 3600.0).metadata, (b"r",)), now=0.0)
        take(core)
    assert len(core.routing.work_deadlines) <= 1024 + 2
    assert core.next_deadline() == 300.0  # the worker's liveness: the deadlines are all stale
    core.expire(3600.0)
    assert core.statistics().work_timeouts == 0


# -------------------------------------------------- Rule R6: per-client limits


def test_queued_requests_per_client_are_capped() -> None:
    core = BrokerCore(max_client_queued=2)
    for n in range(3):
        feed(core, C1, req(n))
    feed(core, C2, req(9))
    [refusal] = take(core)
    assert error_of(refusal) == (C1, "client_limit", req(2).metadata)
    assert core.statistics().services[ECHO].queued == 3
    # Dispatching frees room in the queue.
    workers(core, W1)
    feed(core, C1, req(3))
    assert take(core) == []
    assert core.statistics().rejections == {"client_limit": 1}


def test_inflight_requests_per_client_are_capped_and_released_by_answers() -> None:
    core = BrokerCore(max_client_inflight=2)
    workers(core, W1)
    feed(core, C1, req(1))  # held by W1
    feed(core, C1, req(2))  # queued
    feed(core, C1, req(3))  # over
    sent = take(core)
    assert sent[0] == given(W1, 1, C1)
    assert error_of(sent[1]) == (C1, "client_limit", req(3).metadata)
    assert core.statistics().clients == 1
    feed(core, W1, answer(1, C1))
    assert take(core)[1] == given(W1, 2, C1)
    feed(core, C1, req(4))  # room again: queued
    feed(core, W1, answer(2, C1))
    feed(core, W1, answer(4, C1))
    take(core)
    assert core.statistics().clients == 0
    assert core.statistics().rejections == {"client_limit": 1}


def test_a_forward_moves_the_load_and_redeliveries_keep_it() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=1, max_client_inflight=1)
    workers(core, W1)
    workers(core, W2, service=b"next")
    feed(core, C1, req(1), now=0.0)
    take(core)
    # W1 forwards to "next": still one request in flight for C1.
    feed(core, W1, Request(b"next", C1, (b"m1",), (b"x",)), now=0.0)
    feed(core, C1, req(2), now=0.0)
    sent = take(core)
    assert error_of(sent[-1]) == (C1, "client_limit", req(2).metadata)
    # W2 dies; its request is redelivered, still counted once.
    core.expire(1.0)
    feed(core, W2, Register(b"next"), now=1.0)
    feed(core, W2, Reply(C1, (b"m1",), (b"done",)), now=1.0)
    take(core)
    assert core.statistics().clients == 0


# ------------------------------------------------ Rule R6: messages cut at a limit


def test_a_request_cut_at_the_frame_limit_gets_an_error_reply() -> None:
    core = BrokerCore()
    frames = [C1, *serialize(req(1), width=4)][:-1]  # the data part was dropped
    core.reject_too_many_frames(frames, 100, 0.0)
    [refusal] = take(core)
    assert refusal[3] == b"\x05\x00\x00\x00"  # answered in the sender's width
    assert error_of(refusal) == (C1, "too_many_frames", req(1).metadata)
    assert core.statistics().rejections == {"too_many_frames": 1}


def test_a_request_cut_inside_its_metadata_is_only_counted() -> None:
    core = BrokerCore()
    frames = [C1, b"", P, b"\x04", ECHO, b"", b"m1"]
    core.reject_too_large(frames, 10_000, 1024, 0.0)
    core.reject_too_many_frames([C1, b"", P, b"\x02"], 5, 0.0)
    assert take(core) == []
    assert core.statistics().rejections == {"message_too_large": 1, "too_many_frames": 1}


def test_a_forward_cut_at_a_limit_answers_the_original_client_and_frees_the_worker() -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(1))
    feed(core, C2, req(2))  # queued behind
    take(core)
    frames = out(W1, Request(b"next", C1, (b"m1",), (b"huge",)))
    core.reject_too_large(frames, 1 << 30, 1024, 0.0)
    sent = take(core)
    assert error_of(sent[0]) == (C1, "message_too_large", (b"m1",))
    assert sent[1] == given(W1, 2, C2)  # W1's slot was freed by the (failed) forward


def test_a_foreign_address_in_a_cut_request_is_not_used() -> None:
    core = BrokerCore()
    frames = out(C1, Request(ECHO, C2, (b"m",), (b"d",)))
    core.reject_too_many_frames(frames, 10, 0.0)
    [refusal] = take(core)
    assert error_of(refusal)[:2] == (C1, "too_many_frames")


@pytest.mark.parametrize("queued", [True, False])
def test_a_zero_client_limit_refuses_a_new_clients_first_request(queued: bool) -> None:
    core = BrokerCore(max_client_queued=0) if queued else BrokerCore(max_client_inflight=0)
    feed(core, C1, req(1))
    [refusal] = take(core)
    assert error_of(refusal) == (C1, "client_limit", req(1).metadata)
    assert core.statistics().clients == 0


def test_a_worker_dropped_for_a_work_timeout_gets_no_work_for_a_while() -> None:
    """Quarantine: a worker that hangs on every request registers again at once, but the
    request it held goes to another worker, and it gets work again only later."""
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    workers(core, W1)
    feed(core, C1, timed(1, 0.5), now=0.0)
    take(core)
    core.expire(0.5)
    assert take(core) == [out(W1, Reconnect())]
    feed(core, W1, Register(ECHO), now=0.6)  # back at once: echoed, but no work
    assert take(core) == [out(W1, Register(ECHO))]
    feed(core, W1, Ping(), now=0.7)
    assert take(core) == [out(W1, Pong())]
    assert core.statistics().services[ECHO] == QueueStatistics(workers=1, idle=0, queued=1)
    assert core.next_deadline() == 3.5
    feed(core, W2, Register(ECHO), now=1.0)  # another worker takes the request
    assert take(core) == [out(W2, Register(ECHO)), out(W2, timed(1, 0.5, C1))]
    feed(core, W2, Reply(C1, timed(1, 0.5).metadata, (b"r1",)), now=1.1)
    feed(core, W2, Reconnect(), now=1.2)  # W2 leaves
    take(core)
    feed(core, C2, req(2), now=1.3)
    assert take(core) == []  # queued: W1 is still in quarantine
    core.expire(3.4)
    assert take(core) == []
    core.expire(3.5)  # quarantine over: W1 uses the credit it was given
    assert take(core) == [given(W1, 2, C2)]


def test_cut_requests_from_4_byte_peers_keep_the_width_memory_bounded() -> None:
    core = BrokerCore(max_width_peers=2)
    for peer in (b"P1", b"P2", b"P3"):
        core.reject_too_many_frames([peer, *serialize(req(1), width=4)], 5, 0.0)
    assert [frames[3] for frames in take(core)] == [b"\x05\x00\x00\x00"] * 3
    assert list(core.sessions.dialects) == [b"P2", b"P3"]
