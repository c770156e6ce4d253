"""The worker core's prefetch (Rules W2, W4, W5 with ``P`` > 0), driven with an explicit
``now``, alone and against the real broker core."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp._core.worker.core import Run, State, WorkerCore
from dcp._worker.results import result_message
from dcp.wire.dcp1 import serialize
from dcp.wire.messages import Ping, Pong, Register, Reply, Request, parse_error_reply
from dcp.wire.options import expires_in_option
from tests.helpers import SVC, Wired
from tests.helpers import take_worker as take

CLIENT = b"\x01client"


def ready(n: int, p: int) -> WorkerCore:
    w = WorkerCore(SVC, concurrency=n, prefetch=p, random=lambda: 0.0)
    w.connect(0.0)
    w.receive(serialize(Register(SVC)), 0.0)
    assert take(w) == [Register(SVC), Pong()]
    assert w.state is State.READY
    return w


def req(i: int, *metadata: bytes) -> Request:
    return Request(SVC, CLIENT, (b"id-%d" % i, *metadata), (b"data-%d" % i,))


def test_a_negative_prefetch_is_refused() -> None:
    with pytest.raises(ValueError, match="prefetch"):
        WorkerCore(SVC, prefetch=-1)


def test_a_busy_worker_asks_for_up_to_p_more_and_starts_them_in_order() -> None:
    """Rule W2: a PING while ``in_progress + backlog < N + P`` and credit is 0; Rule W4: the
    prefetched requests wait and start in arrival order, at most ``N`` running."""
    w = ready(1, 2)
    w.receive(serialize(req(1)), 0.1)
    assert take(w) == [Ping(), Run(req(1))]  # one slot, busy: room for two more
    w.receive(serialize(req(2)), 0.1)
    assert take(w) == [Ping()]
    w.receive(serialize(req(3)), 0.1)
    assert take(w) == []  # N + P held: no more asked for
    s = w.statistics()
    assert (s.in_progress, s.backlog, s.backlogged) == (1, 2, 2)
    for i in (1, 2):
        reply = result_message(req(i), b"r")
        w.finish(reply, 0.2)
        # The answer earns one credit at the broker (Rule W3): no PING.
        assert take(w) == [reply, Run(req(i + 1))]
        assert w.in_progress == 1
    w.finish(result_message(req(3), b"r"), 0.3)
    assert take(w) == [result_message(req(3), b"r")]
    s = w.statistics()
    assert (s.received, s.replies, s.in_progress, s.backlog) == (3, 3, 0, 0)


def test_the_heartbeat_asks_for_more_while_the_backlog_has_room() -> None:
    """Rule W5: a PING when credit is 0 and there is room in the backlog; a PONG once full."""
    w = ready(1, 1)
    w.receive(serialize(req(1)), 0.0)
    assert take(w) == [Ping(), Run(req(1))]
    w.expire(1.0)  # credit 1 (owed): a PONG
    assert take(w) == [Pong()]
    w.receive(serialize(req(2)), 1.5)
    assert take(w) == []  # full
    w.expire(2.5)
    assert take(w) == [Pong()]
    w.finish(None, 2.6)  # cancelled: no answer, no credit
    assert take(w) == [Run(req(2))]
    w.expire(3.6)  # credit 0, room for one: a PING
    assert take(w) == [Ping()]


def test_a_prefetched_request_past_its_deadline_is_answered_expired() -> None:
    w = ready(1, 1)
    w.receive(serialize(req(1)), 0.0)
    w.receive(serialize(req(2, expires_in_option(0.5))), 0.0)
    take(w)
    w.finish(result_message(req(1), b"r"), 1.0)
    out = take(w)
    assert out[0] == result_message(req(1), b"r")
    expired = out[1]
    assert isinstance(expired, Reply)
    assert parse_error_reply(expired.data) is not None
    assert parse_error_reply(expired.data)[0] == "expired"  # type: ignore[index]
    assert len(out) == 2  # not run
    assert w.statistics().expired == 1


def test_a_request_started_from_the_backlog_carries_its_deadline() -> None:
    """Rule W4: a request started from the backlog carries the deadline counted from its
    arrival (:attr:`Run.deadline`); one started at once carries none (it arrived now)."""
    w = ready(1, 2)
    w.receive(serialize(req(1, expires_in_option(5.0))), 0.0)
    w.receive(serialize(req(2, expires_in_option(2.0))), 0.5)
    w.receive(serialize(req(3)), 0.5)
    events = [e for e in w.drain()[1] if isinstance(e, Run)]
    assert [e.deadline for e in events] == [None]
    assert w.backlog_requests() == [req(2, expires_in_option(2.0)), req(3)]  # left there
    assert w.statistics().backlog == 2
    w.finish(result_message(req(1, expires_in_option(5.0)), b"r"), 1.0)
    w.finish(result_message(req(2, expires_in_option(2.0)), b"r"), 1.5)
    started = [e for e in w.drain()[1] if isinstance(e, Run)]
    assert started == [Run(req(2, expires_in_option(2.0))), Run(req(3))]
    assert [e.deadline for e in started] == [2.5, float("inf")]
    assert w.backlog_requests() == []


def test_stop_drops_the_prefetched_requests() -> None:
    """Rule W9: the broker holds them until the worker leaves, then requeues them."""
    w = ready(1, 2)
    for i in (1, 2, 3):
        w.receive(serialize(req(i)), 0.0)
    take(w)
    w.stop()
    assert w.statistics().backlog == 0 and w.statistics().dropped == 2
    w.finish(result_message(req(1), b"r"), 0.1)
    assert take(w) == [result_message(req(1), b"r")]  # nothing started


def test_a_stop_told_to_keep_the_backlog_starts_it_as_slots_free() -> None:
    """Rule W9: kept (a lost broker's, announced held), the backlog starts as slots free;
    nothing more is asked for; leave() drops what is left."""
    w = ready(1, 2)
    for i in (1, 2, 3):
        w.receive(serialize(req(i)), 0.0)
    take(w)
    w.stop(keep_backlog=True)
    assert w.statistics().backlog == 2 and w.statistics().dropped == 0
    w.finish(result_message(req(1), b"r"), 0.1)
    assert take(w) == [result_message(req(1), b"r"), Run(req(2))]
    w.expire(1.5)  # a heartbeat: a PONG, no more work asked for
    assert take(w) == [Pong()]
    w.leave()
    assert w.statistics().backlog == 0 and w.statistics().dropped == 1


def test_wired_holds_n_plus_p_and_runs_n() -> None:
    """Against the real broker core: it grants exactly ``N + P`` and queues the rest."""
    w = Wired(2, prefetch=3)
    for i in range(10):
        w.client_request(i)
    assert len(w.running) == 2
    assert w.worker.statistics().backlog == 3
    assert w.broker.statistics().services[SVC].queued == 5
    while w.running:
        w.finish(0)
        assert len(w.running) <= 2
    assert [int(r.data[0]) for r in w.replies] == list(range(10))  # in order: N and P FIFO


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3),
    p=st.integers(0, 4),
    steps=st.lists(st.tuples(st.sampled_from(["req", "fin", "tick"]), st.integers(0, 7))),
)
def test_wired_prefetch_never_exceeds_n_and_answers_everything(
    n: int, p: int, steps: list[tuple[str, int]]
) -> None:
    w = Wired(n, prefetch=p)
    sent = 0
    for kind, k in steps:
        if kind == "req":
            w.client_request(sent)
            sent += 1
        elif kind == "fin" and w.running:
            w.finish(k % len(w.running))
        else:
            w.advance(0.3 + k / 10)
        s = w.worker.statistics()
        assert len(w.running) <= n
        assert s.in_progress + s.backlog <= n + p
    for _ in range(sent + 1):
        if not w.running:
            break
        w.finish(0)
    assert sorted(int(r.data[0]) for r in w.replies) == list(range(sent))
