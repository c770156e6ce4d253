"""The worker's sans-IO core, driven synchronously with an explicit ``now``."""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp._core.broker import directory
from dcp._core.broker.core import BrokerCore
from dcp._core.worker.core import (
    DESCRIBE,
    BrokerLost,
    Event,
    Malformed,
    Refused,
    Replays,
    Run,
    State,
    WorkerCore,
    backoff_delay,
)
from dcp._core.worker.replay import Answered
from dcp._models import Forward
from dcp._worker.results import error_reply, result_message
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import (
    ERROR_MARKER,
    HELD_MARKER,
    Message,
    Ping,
    Pong,
    Reconnect,
    Register,
    Reply,
    Request,
    parse_error_reply,
)
from dcp.wire.options import expires_in_option
from tests.helpers import SVC, Crossed, Wired
from tests.helpers import take_worker as take

CLIENT = b"\x01client"


def core(n: int = 1, **kw: float) -> WorkerCore:
    return WorkerCore(SVC, concurrency=n, random=lambda: 0.0, **kw)  # type: ignore[arg-type]


def state(w: WorkerCore) -> State:
    """``w.state``, read through a call so mypy does not narrow it between steps."""
    return w.state


def ready(n: int = 1, now: float = 0.0) -> WorkerCore:
    w = core(n)
    w.connect(now)
    assert take(w) == [Register(SVC)]
    assert state(w) is State.REGISTERING
    # The echo: READY, and a PONG that says the worker beats while busy (Rule W1).
    w.receive(serialize(Register(SVC)), now)
    assert take(w) == [Pong()]
    assert state(w) is State.READY
    return w


def req(i: int, client: bytes = CLIENT) -> Request:
    return Request(SVC, client, (b"id-%d" % i, b"m2"), (b"data-%d" % i, b""))


def deliver(w: WorkerCore, msg: Message, now: float) -> list[Message | Event]:
    w.receive(serialize(msg), now)
    return take(w)


def test_registration_is_echoed_then_ready_without_ping() -> None:
    w = core(3)
    assert w.next_deadline() is None
    w.connect(5.0)
    assert take(w) == [Register(SVC)]
    # Waiting for the echo: only the liveness deadline counts.
    assert w.next_deadline() == 5.0 + 3 * 1.0
    w.expire(6.5)
    assert take(w) == []
    # The registration itself is a readiness signal: the echo asks for no work. A PONG
    # (asks for nothing) tells the broker this worker beats while busy.
    assert deliver(w, Register(SVC), 6.5) == [Pong()]
    assert state(w) is State.READY
    with pytest.raises(RuntimeError):
        w.connect(7.0)


def test_outbox_and_events_keep_outputs_in_order_until_the_driver_drains_them() -> None:
    w = core(2)
    w.connect(0.0)
    w.receive(serialize(Register(SVC)), 0.0)
    w.receive(serialize(req(1)), 0.1)
    assert w.outbox == [serialize(m) for m in (Register(SVC), Pong(), Ping())]
    assert w.events == [Run(req(1))]
    out, events = w.drain()
    assert len(out) == 3 and len(events) == 1
    assert w.outbox == [] and w.events == []


def test_echo_for_another_service_is_unexpected() -> None:
    w = core()
    w.connect(0.0)
    take(w)
    assert deliver(w, Register(b"other"), 0.1) == []
    assert state(w) is State.REGISTERING
    assert w.statistics().unexpected == 1


def test_request_runs_and_asks_for_more_while_a_slot_is_free() -> None:
    w = ready(n=3)
    assert deliver(w, req(1), 1.0) == [Ping(), Run(req(1))]
    assert deliver(w, req(2), 1.0) == [Ping(), Run(req(2))]
    # The third fills the last slot: no PING.
    assert deliver(w, req(3), 1.0) == [Run(req(3))]
    assert w.in_progress == 3
    # A reply is a readiness signal by itself: no PING after it.
    w.finish(Reply(CLIENT, (b"id-1", b"m2"), (b"r",)), 2.0)
    out = take(w)
    assert out == [Reply(CLIENT, (b"id-1", b"m2"), (b"r",))]
    assert w.in_progress == 2


def test_concurrency_one_never_pings_on_request() -> None:
    w = ready(n=1)
    assert deliver(w, req(1), 0.5) == [Run(req(1))]


def test_backlog_when_a_request_arrives_while_full() -> None:
    w = ready(n=1)
    assert deliver(w, req(1), 0.1) == [Run(req(1))]
    # The race of Rule W4: one more request arrives while the only slot is busy.
    assert deliver(w, req(2), 0.2) == []
    st1 = w.statistics()
    assert (st1.in_progress, st1.backlog, st1.backlogged) == (1, 1, 1)
    reply = result_message(req(1), b"done")
    w.finish(reply, 0.3)
    assert take(w) == [reply, Run(req(2))]
    assert w.in_progress == 1
    assert w.statistics().backlog == 0
    w.finish(None, 0.4)
    assert take(w) == []
    stats = w.statistics()
    assert (stats.received, stats.replies, stats.cancelled, stats.in_progress) == (2, 1, 1, 0)


def test_finish_without_handler_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        ready().finish(None, 0.0)


def test_counters_split_replies_errors_forwards() -> None:
    w = ready(n=3)
    for i in range(3):
        deliver(w, req(i), 0.0)
    w.finish(result_message(req(0), [b"a", b"b"]), 0.1)
    w.finish(error_reply(req(1), "handler_error", "ValueError: x"), 0.1)
    w.finish(result_message(req(2), Forward("next", b"x")), 0.1)
    s = w.statistics()
    assert (s.received, s.replies, s.errors, s.forwards, s.in_progress) == (3, 1, 1, 1, 0)


def test_idle_heartbeat_is_a_ping_every_interval() -> None:
    w = ready(n=2, now=0.0)
    assert w.next_deadline() == 1.0
    w.expire(0.99)
    assert take(w) == []
    w.expire(1.0)
    assert take(w) == [Ping()]
    assert w.next_deadline() == 2.0
    # The broker answers: liveness refreshed, next beat one interval after the ping.
    assert deliver(w, Pong(), 1.01) == []
    w.expire(1.5)
    assert take(w) == []
    w.expire(2.0)
    assert take(w) == [Ping()]


def test_full_worker_heartbeats_with_pong() -> None:
    w = ready(n=1, now=0.0)
    deliver(w, req(1), 0.0)
    w.expire(1.0)
    assert take(w) == [Pong()]
    deliver(w, Pong(), 1.0)
    w.expire(2.0)
    assert take(w) == [Pong()]


def test_stopping_worker_heartbeats_with_pong_and_drops_new_requests() -> None:
    w = ready(n=2, now=0.0)
    deliver(w, req(1), 0.0)
    w.stop()
    w.expire(1.0)
    assert take(w) == [Pong()]
    assert deliver(w, req(2), 1.1) == []
    s = w.statistics()
    assert (s.received, s.dropped, s.in_progress) == (2, 1, 1)
    reply = result_message(req(1), b"ok")
    w.finish(reply, 1.2)
    assert take(w) == [reply]
    w.leave()
    assert take(w) == [Reconnect()]
    assert state(w) is State.CLOSED
    w.expire(100.0)
    assert take(w) == []
    w.receive(serialize(req(3)), 100.0)
    assert take(w) == []


def test_replies_alone_do_not_suppress_heartbeats() -> None:
    # Replies are never answered; if the broker sent nothing for an interval, beat anyway.
    w = ready(n=4, now=0.0)
    for i in range(4):
        deliver(w, req(i), 0.0)
    # A reply went out at 0.9, but nothing came in since 0.0: beat at 1.0 all the same.
    w.finish(result_message(req(0), b"r"), 0.9)
    take(w)
    # The reply already earned one request for the freed slot (Rule W2): a keep-alive, then.
    w.expire(1.0)
    assert take(w) == [Pong()]
    # Only once per interval, even though the broker stays quiet.
    w.finish(result_message(req(1), b"r"), 1.5)
    take(w)
    w.expire(1.9)
    assert take(w) == []
    w.expire(2.0)
    assert take(w) == [Pong()]


def test_heartbeat_not_sent_while_traffic_flows_both_ways() -> None:
    w = ready(n=1, now=0.0)
    t = 0.0
    for i in range(10):
        t += 0.5
        assert deliver(w, req(i), t) == [Run(req(i))]
        w.expire(t)
        assert take(w) == []
        w.finish(result_message(req(i), b"r"), t)
        take(w)
    # ... and a beat at most once per interval when the broker goes quiet.
    w.expire(t + 0.99)
    assert take(w) == []
    w.expire(t + 1.0)
    assert take(w) == [Ping()]
    w.expire(t + 1.5)
    assert take(w) == []


def test_broker_silence_is_broker_lost_with_backoff() -> None:
    w = ready(n=1, now=0.0)
    deliver(w, req(1), 0.0)
    deliver(w, req(2), 0.0)  # backlog
    w.expire(2.0)
    assert take(w) == [Pong()]
    assert w.next_deadline() == 3.0
    w.expire(3.0)
    assert take(w) == [BrokerLost(0.05 * 2)]  # reconnect_min (0.1) x (0.5 + 0/2)
    assert state(w) is State.DISCONNECTED
    assert w.next_deadline() is None
    s = w.statistics()
    assert (s.backlog, s.dropped, s.in_progress) == (0, 1, 1)
    # The running handler finishes while disconnected: its reply waits for the next socket.
    reply = result_message(req(1), b"late")
    w.finish(reply, 3.5)
    assert take(w) == []
    w.connect(4.0)
    assert take(w) == [Register(SVC), reply]
    assert w.statistics().reconnects == 1
    # Waiting for the echo also times out; the delay doubles.
    w.expire(7.0)
    assert take(w) == [BrokerLost(0.1)]
    w.connect(7.1)
    assert take(w) == [Register(SVC)]
    deliver(w, Register(SVC), 7.2)
    w.expire(10.2)
    assert take(w) == [BrokerLost(0.1)]  # reset by the echo


def test_reconnect_from_broker_reregisters_at_once() -> None:
    w = ready(n=1, now=0.0)
    deliver(w, req(1), 0.0)
    deliver(w, req(2), 0.0)
    assert deliver(w, Reconnect(), 0.5) == [Register(SVC)]
    assert state(w) is State.REGISTERING
    s = w.statistics()
    assert (s.reregistrations, s.backlog, s.dropped, s.in_progress) == (1, 0, 1, 1)
    # Results still go out while re-registering.
    reply = result_message(req(1), b"r")
    w.finish(reply, 0.6)
    assert take(w) == [reply]
    assert deliver(w, Register(SVC), 0.7) == [Pong()]
    assert state(w) is State.READY


def test_a_new_connection_registers_before_the_results_kept_meanwhile() -> None:
    # Rule W12: the broker restarted under the same socket.
    w = ready(n=2, now=0.0)
    deliver(w, req(1), 0.0)
    deliver(w, req(2), 0.0)
    w.connection_lost(0.5)
    assert state(w) is State.DISCONNECTED
    assert w.next_deadline() is None  # zmq reconnects; no liveness clock meanwhile
    w.expire(100.0)
    assert take(w) == []
    first = result_message(req(1), b"r1")
    w.finish(first, 0.6)
    assert take(w) == []  # kept: the broker there now may not know us
    w.reconnected(0.7)
    assert take(w) == [Register(SVC), first]
    assert state(w) is State.REGISTERING
    second = result_message(req(2), b"r2")
    w.finish(second, 0.8)  # on the new connection, after the REGISTER
    assert take(w) == [second]
    assert w.statistics().reconnects == 1
    # A new connection without a reported loss: register again on it at once.
    assert deliver(w, Register(SVC), 0.9) == [Pong()]
    w.reconnected(1.0)
    assert take(w) == [Register(SVC)]
    assert w.statistics().reregistrations == 1
    # Nothing to do once closed.
    w.leave()
    take(w)
    w.connection_lost(1.1)
    w.reconnected(1.2)
    assert take(w) == []
    assert state(w) is State.CLOSED


def test_malformed_message_is_counted_and_proves_liveness() -> None:
    w = ready(now=0.0)
    w.receive([b"", b"XXXX\x01", b"\x02"], 2.5)  # never raises: counted and reported
    assert take(w) == [
        Malformed("bad_protocol_frame", "protocol frame b'XXXX\\x01' is not b'DGBX\\x01'")
    ]
    assert w.statistics().malformed == 1
    w.expire(3.0)
    assert take(w) == [Ping()]  # not lost: the garbage arrived at 2.5


def test_unexpected_reply_and_ping_are_ignored() -> None:
    w = ready()
    assert deliver(w, Reply(CLIENT, (), (b"x",)), 0.1) == []
    assert deliver(w, Ping(), 0.1) == []
    assert w.statistics().unexpected == 1


def test_four_byte_type_width_is_answered_in_kind() -> None:
    w = core(2)
    w.connect(0.0)
    w.receive(serialize(Register(SVC), width=4), 0.0)
    assert w.width == 4


def test_leave_before_registration_and_when_disconnected() -> None:
    w = core()
    w.leave()
    assert take(w) == []
    w2 = core()
    w2.connect(0.0)
    take(w2)
    w2.leave()
    assert take(w2) == [Reconnect()]


def test_stop_drops_backlog() -> None:
    w = ready(n=1)
    deliver(w, req(1), 0.0)
    deliver(w, req(2), 0.0)
    w.stop()
    assert w.statistics().backlog == 0
    # The freed slot does not start anything any more.
    w.finish(None, 0.1)
    assert take(w) == []


# -- the contract of every core (dcp/_core/__init__.py) -----------------------------------

EVENTS = (Run, BrokerLost, Refused, Malformed)


def check_drained(w: WorkerCore) -> tuple[list[list[bytes]], list[Event]]:
    """Drain ``w`` and check the form of what it gave: messages as frames ready for the
    socket, in the core's width; events of the core's own frozen classes."""
    outbox, events = w.drain()
    assert w.outbox == [] and w.events == []
    assert w.outbox is not outbox and w.events is not events  # the driver's to keep
    for frames in outbox:
        assert type(frames) is list and all(type(f) is bytes for f in frames)
        assert len(frames[2]) == w.width  # serialized in the width the core answers in
        parse(frames)
    for event in events:
        assert isinstance(event, EVENTS)
        assert attrs.has(type(event))
        field = attrs.fields(type(event))[0].name
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(event, field, None)
    return outbox, events


@pytest.mark.parametrize("width", [1, 4])
def test_the_worker_core_follows_the_contract_of_every_core(width: int) -> None:
    # The cores do not import each other: the name descriptions go to is the broker's.
    assert DESCRIBE == directory.DESCRIBE
    # One time API, no other: expire(now) and next_deadline().
    assert not hasattr(WorkerCore, "tick") and not hasattr(WorkerCore, "deadline")
    w = WorkerCore(SVC, concurrency=1, type_width=width, random=lambda: 0.0)
    assert w.next_deadline() is None  # nothing until more input
    w.connect(0.0)  # input methods return nothing (mypy checks it): outputs are in the lists
    outbox, events = check_drained(w)
    assert [parse(f)[0] for f in outbox] == [Register(SVC)] and events == []
    w.receive(serialize(Register(SVC), width=width), 0.0)
    w.receive(serialize(req(1), width=width), 0.0)
    w.receive(serialize(req(2), width=width), 0.0)  # waits in the backlog: concurrency 1
    outbox, events = check_drained(w)
    assert [parse(f)[0] for f in outbox] == [Pong()] and events == [Run(req(1))]
    # Bad input from the network is counted and reported, never raised.
    for frames in ([], [b""], [b"", b"DGBX\x01"], [b"", b"DGBX\x01", b"\x09"], [b"x"] * 9):
        w.receive(frames, 0.1)
    _, events = check_drained(w)
    assert len(events) == 5 and all(type(e) is Malformed for e in events)
    assert w.statistics().malformed == 5
    # expire() before next_deadline() does nothing; at it, what was due.
    due = w.next_deadline()
    assert due == 1.0  # a heartbeat, one interval after the last one
    w.expire(due - 0.001)
    assert check_drained(w) == ([], [])
    w.expire(due)
    outbox, _ = check_drained(w)
    assert [parse(f)[0] for f in outbox] == [Pong()]  # busy: a keep-alive
    # A finish's answer is a message; the backlog's request an event.
    w.finish(result_message(req(1), b"r"), 1.2)
    outbox, events = check_drained(w)
    assert [parse(f)[0] for f in outbox] == [result_message(req(1), b"r")]
    assert events == [Run(req(2))]
    # The broker silent for liveness x interval since the last message: an event, and
    # nothing to do until more input.
    w.expire(0.1 + 3 * 1.0)
    assert check_drained(w) == ([], [BrokerLost(0.1)])
    assert w.next_deadline() is None
    w.leave()
    assert check_drained(w) == ([], [])


@given(frames=st.lists(st.binary(max_size=6), max_size=6), n=st.integers(1, 3))
def test_the_worker_core_never_raises_for_what_the_broker_sends(
    frames: list[bytes], n: int
) -> None:
    w = ready(n)
    w.receive(frames, 0.5)
    check_drained(w)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"heartbeat_interval": 0.0},
        {"liveness": 0},
        {"reconnect_min": 0.0},
        {"reconnect_min": 2.0, "reconnect_max": 1.0},
    ],
)
def test_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        WorkerCore(SVC, **kwargs)  # type: ignore[arg-type]


# -- results ---------------------------------------------------------------------------


def test_result_message_shapes() -> None:
    r = req(1)
    assert result_message(r, b"x") == Reply(CLIENT, r.metadata, (b"x",))
    assert result_message(r, bytearray(b"y")) == Reply(CLIENT, r.metadata, (b"y",))
    assert result_message(r, [b"a", b""]) == Reply(CLIENT, r.metadata, (b"a", b""))
    assert result_message(r, ()) == Reply(CLIENT, r.metadata, ())
    fwd = result_message(r, Forward("next", b"p", b"q"))
    assert fwd == Request(b"next", CLIENT, r.metadata, (b"p", b"q"))
    bare = result_message(r, Forward(b"next"))
    assert bare == Request(b"next", CLIENT, r.metadata, ())


@pytest.mark.parametrize("bad", [None, 3, [b"ok", 3], {b"a": 1}])
def test_result_message_rejects_other_types(bad: object) -> None:
    with pytest.raises(TypeError):
        result_message(req(1), bad)


def test_result_message_sends_str_as_utf8() -> None:
    """Finding 6 of issue 25: ``str`` results and parts are UTF-8, mixed with bytes."""
    for result, data in [
        ("héllo", (b"h\xc3\xa9llo",)),
        (["a", b"b"], (b"a", b"b")),
        (("a", bytearray(b"b")), (b"a", b"b")),
    ]:
        assert result_message(req(1), result) == Reply(CLIENT, req(1).metadata, data)


def test_forward_validation() -> None:
    with pytest.raises(TypeError):
        Forward("s", 3)  # type: ignore[arg-type]
    f = Forward(b"s", b"a", "é")
    assert (f.service, f.data) == ("s", (b"a", "é".encode()))
    assert result_message(req(1), f) == Request(b"s", CLIENT, req(1).metadata, (b"a", b"\xc3\xa9"))


def test_error_reply_keeps_client_and_metadata() -> None:
    r = req(1)
    e = error_reply(r, "handler_error", "ValueError: é")
    assert (e.client, e.metadata, e.data[0]) == (CLIENT, r.metadata, ERROR_MARKER)
    assert parse_error_reply(e.data) == ("handler_error", "ValueError: é")


def test_backoff_delay() -> None:
    assert backoff_delay(0, 0.1, 5.0, 0.0) == 0.1
    assert backoff_delay(0, 0.1, 5.0, 0.999) == pytest.approx(0.1, rel=1e-3)
    assert backoff_delay(3, 0.1, 5.0, 0.0) == pytest.approx(0.4)
    assert backoff_delay(3, 0.1, 5.0, 0.999) == pytest.approx(0.8, rel=1e-3)
    assert backoff_delay(10, 0.1, 5.0, 0.5) == pytest.approx(3.75)
    assert backoff_delay(10_000, 0.1, 5.0, 0.999) <= 5.0
    rng = random.Random(1)
    for failures in range(20):
        d = backoff_delay(failures, 0.1, 5.0, rng.random())
        assert 0.1 <= d <= 5.0


# -- the worker core against the real broker core, in memory ----------------------------


@pytest.mark.parametrize("n", [1, 2, 5])
def test_wired_fills_exactly_n_slots_without_backlog(n: int) -> None:
    w = Wired(n)
    for i in range(3 * n):
        w.client_request(i)
    assert w.max_running == n
    assert len(w.running) == n
    for _ in range(3 * n):
        w.finish(0)
    assert sorted(int(r.data[0]) for r in w.replies) == list(range(3 * n))
    s = w.worker.statistics()
    assert (s.received, s.replies, s.backlogged) == (3 * n, 3 * n, 0)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 4),
    steps=st.lists(st.tuples(st.sampled_from(["req", "fin", "tick"]), st.integers(0, 7))),
)
def test_wired_never_exceeds_n_and_answers_everything(
    n: int, steps: list[tuple[str, int]]
) -> None:
    w = Wired(n)
    sent = 0
    for kind, k in steps:
        if kind == "req":
            w.client_request(sent)
            sent += 1
        elif kind == "fin" and w.running:
            w.finish(k % len(w.running))
        else:
            w.advance(0.3 + k / 10)
        assert len(w.running) <= n
    for _ in range(sent + 1):  # drain
        if not w.running:
            break
        w.finish(0)
    assert sorted(int(r.data[0]) for r in w.replies) == list(range(sent))
    s = w.worker.statistics()
    assert s.received == s.replies + s.in_progress + s.backlog + s.dropped


def test_nothing_is_sent_or_kept_after_leave() -> None:
    w = ready(n=1)
    deliver(w, req(1), 0.0)
    w.leave()
    assert take(w) == [Reconnect()]
    w.finish(result_message(req(1), b"late"), 0.1)
    assert take(w) == []
    assert w.next_deadline() is None
    assert w.statistics().replies == 1


def test_heartbeats_are_not_kept_while_disconnected() -> None:
    w = ready(n=1, now=0.0)
    w.expire(3.0)
    assert take(w) == [BrokerLost(0.1)]
    w.receive(serialize(Pong()), 3.1)
    assert take(w) == []  # a stale socket's message
    w.connect(3.2)
    assert take(w) == [Register(SVC)]


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 4),
    requests=st.integers(0, 20),
    steps=st.lists(st.tuples(st.sampled_from(["up", "down", "fin"]), st.integers(0, 7))),
)
def test_credit_keeps_exactly_n_busy_when_messages_cross(
    n: int, requests: int, steps: list[tuple[str, int]]
) -> None:
    """Whatever order the pipes deliver in: never more than N handlers and never the
    backlog (Rule W2's invariant), and whenever all is delivered, N run if work is queued."""
    w = Crossed(n)
    for i in range(requests):
        msg = Request(SVC, None, (b"id-%d" % i,), (b"%d" % i,))
        w.broker.receive([b"C", *serialize(msg)], 0.0)
        w.collect()
    for kind, k in steps:
        w.step(kind, k)
        assert len(w.running) <= n
        if not (w.to_broker or w.to_worker):
            queued = w.broker.statistics().services[SVC].queued
            assert len(w.running) == n or queued == 0
    for _ in range(requests + 1):
        w.settle()
        if not w.running:
            break
        w.step("fin", 0)
    w.settle()
    assert sorted(int(r.data[0]) for r in w.replies) == list(range(requests))
    assert w.worker.statistics().backlogged == 0


def test_answers_from_before_a_re_registration_earn_no_credit() -> None:
    """The broker forgets a busy worker, which registers again: the answers of the handlers
    it was running match nothing at the broker, so they must not count as credit either,
    or the worker under-asks for good (only one of its N slots busy)."""
    broker = BrokerCore(max_redeliveries=0)
    worker = WorkerCore(SVC, concurrency=2)
    running: list[Run] = []

    def to_broker(outs: Sequence[Message | Event]) -> None:
        for out in outs:
            if isinstance(out, Run):
                running.append(out)
            else:
                assert isinstance(out, Message)
                broker.receive([b"W", *serialize(out)], 0.0)
        while broker.outbox:
            batch, _ = broker.drain()
            for frames in batch:
                if frames[0] == b"W":
                    worker.receive(frames[1:], 0.0)
                    to_broker(take(worker))

    def finish(run: Run) -> None:
        reply = result_message(run.request, b"ok")
        worker.finish(reply, 0.0, generation=run.generation)
        to_broker(take(worker))

    def request(i: int) -> None:
        msg = Request(SVC, None, (b"id-%d" % i,), (b"x",))
        broker.receive([b"C", *serialize(msg)], 0.0)
        to_broker([])

    worker.connect(0.0)
    to_broker(take(worker))
    request(0)
    request(1)
    assert len(running) == 2
    broker.expire(1e9)  # the broker forgets the busy worker...
    broker.outbox.clear()
    to_broker([Ping()])  # ...which hears reconnect on its next heartbeat and registers again
    assert worker.statistics().reregistrations == 1
    for run in running[:]:
        running.remove(run)
        finish(run)  # late answers: routed by the broker, matched to nothing
    assert broker.statistics().unmatched == 2
    for i in range(10, 16):
        request(i)
    assert len(running) == 2  # both slots busy again
    while running:
        finish(running.pop(0))
        assert len(running) == 2 or broker.statistics().services[SVC].queued == 0
    assert worker.statistics().backlogged == 0


def test_a_backlogged_request_past_its_callers_deadline_is_answered_not_run() -> None:
    """Rule W4: the caller gave up while the request waited for a slot; the ``expired`` error
    reply frees its slot at the broker (and earns credit, Rule W3) and nobody runs it."""
    w = ready(1)
    first = req(1)
    doomed = Request(SVC, CLIENT, (b"id-2", expires_in_option(1.0)), (b"d2",))
    later = Request(SVC, CLIENT, (b"id-3", expires_in_option(1.0)), (b"d3",))
    assert deliver(w, first, 0.0) == [Run(first)]
    assert deliver(w, doomed, 0.0) == []
    assert deliver(w, later, 0.5) == []
    w.finish(result_message(first, b"r1"), 1.0)
    out = take(w)
    assert out[0] == Reply(CLIENT, first.metadata, (b"r1",))
    expired = out[1]
    assert isinstance(expired, Reply)
    assert (expired.client, expired.metadata) == (CLIENT, doomed.metadata)
    assert parse_error_reply(expired.data) == (
        "expired",
        "the caller's deadline passed while the request waited for a slot",
    )
    assert out[2:] == [Run(later)]  # its deadline, 1.5, has not come
    s = w.statistics()
    assert (s.received, s.replies, s.expired, s.errors, s.in_progress, s.backlog) == (
        3,
        1,
        1,
        0,
        1,
        0,
    )
    # Credit: two answers, two slots freed at the broker; the worker asks for no more.
    w.finish(result_message(later, b"r3"), 2.0)
    assert take(w) == [Reply(CLIENT, later.metadata, (b"r3",))]


# -- Rule W13: answers the broker may have lost ---------------------------------------------

DCP_ID = b"\xffDCP:id=" + bytes(16)


def dcp_req(i: int, *options: bytes) -> Request:
    """A request as a dcp client sends it: its id first, then options."""
    return Request(SVC, CLIENT, (DCP_ID + b"%08d" % i, *options), (b"data-%d" % i,))


def replayed(msgs: Sequence[Message], width: int = 1) -> Replays:
    """The :class:`Replays` event of ``msgs`` (given oldest first; the event is newest
    first)."""
    return Replays(tuple(serialize(m, width=width) for m in reversed(msgs)))


def test_replies_sent_before_a_lost_connection_are_sent_again_after_register() -> None:
    w = ready(n=4, now=0.0)
    for i in range(4):
        deliver(w, dcp_req(i), 0.0)
    replies = [result_message(dcp_req(i), b"r%d" % i) for i in range(4)]
    old = replies[0]
    w.finish(old, 0.1)  # older than L * I (3 s) when the loss is noticed: not kept
    w.finish(replies[1], 3.0)
    w.finish(replies[2], 3.2)
    take(w)
    w.connection_lost(3.5)
    w.finish(replies[3], 3.6)  # while disconnected: kept as before (Rule W7)
    assert take(w) == []
    w.reconnected(3.7)
    # The fresh answer first; the replays after it, best effort (the driver's Rule WC7).
    assert take(w) == [Register(SVC), replies[3], replayed([replies[1], replies[2]])]
    assert w.statistics().replayed == 2
    # Once sent again they are remembered again: a second restart replays them too.
    assert deliver(w, Register(SVC), 3.8) == [Pong()]
    assert deliver(w, Reconnect(), 3.9) == [Register(SVC), replayed(replies[1:])]
    assert w.statistics().replayed == 5


def test_a_silent_broker_replays_after_the_new_connection() -> None:
    w = ready(n=1, now=0.0)
    deliver(w, dcp_req(1), 0.0)
    reply = result_message(dcp_req(1), b"r")
    w.finish(reply, 0.5)
    take(w)
    w.expire(3.0)  # Rule W6: silent for L * I
    assert take(w) == [BrokerLost(0.1)]
    w.connect(3.2)
    assert take(w) == [Register(SVC), replayed([reply])]


def test_only_replies_a_client_can_tell_apart_are_replayed() -> None:
    w = ready(n=4, now=0.0)
    plain = req(1)  # metadata of its own (an MDP or DagBox client): matched by order
    stream = dcp_req(2, b"\xffDCP:stream=8")
    forward_of = dcp_req(3)
    errored = dcp_req(4)
    for r in (plain, stream, forward_of, errored):
        deliver(w, r, 0.0)
    w.finish(result_message(plain, b"r"), 0.1)
    w.finish(result_message(stream, b""), 0.1)
    w.finish(Request(b"next", CLIENT, forward_of.metadata, (b"x",)), 0.1)
    failed = error_reply(errored, "handler_error", "boom")
    w.finish(failed, 0.1)
    take(w)
    w.connection_lost(0.2)
    w.reconnected(0.3)
    assert take(w) == [Register(SVC), replayed([failed])]


def test_replay_is_bounded_by_count_and_bytes() -> None:
    w = WorkerCore(SVC, concurrency=8, replay_limit=3, replay_bytes=10)
    w.connect(0.0)
    w.receive(serialize(Register(SVC)), 0.0)
    for i in range(8):
        w.receive(serialize(dcp_req(i)), 0.0)
    replies = [result_message(dcp_req(i), b"abcd") for i in range(8)]
    for r in replies[:5]:
        w.finish(r, 0.1)
    take(w)
    w.connection_lost(0.2)
    w.reconnected(0.3)
    # The newest 3, then only 2 fit in 10 bytes.
    assert take(w)[1:] == [replayed(replies[3:5])]
    off = WorkerCore(SVC, replay_limit=0)
    off.connect(0.0)
    off.receive(serialize(Register(SVC)), 0.0)
    off.receive(serialize(dcp_req(1)), 0.0)
    off.finish(result_message(dcp_req(1), b"r"), 0.1)
    off.connection_lost(0.2)
    off.reconnected(0.3)
    assert [m for m in take(off) if isinstance(m, Reply)] == [result_message(dcp_req(1), b"r")]


# -- several brokers (Rule W15; dcp._worker.brokers) ------------------------------------------


def test_a_relayed_answer_is_sent_only_while_ready_and_credits_as_a_ping() -> None:
    w = ready(n=1, now=0.0)
    deliver(w, dcp_req(1), 0.0)  # the one slot is busy, no credit left
    other = Reply(CLIENT, dcp_req(9).metadata, (b"from elsewhere",))
    w.relay(other, 0.1)
    assert take(w) == [other]
    assert w.statistics().replies == 0  # not this broker's request: no counter moves
    # The broker took it as a PING (credit 1): what it sends next waits (Rule W4).
    assert deliver(w, dcp_req(2), 0.2) == []
    assert w.statistics().backlog == 1
    w.connection_lost(0.3)
    w.relay(other, 0.4)  # not READY: dropped, not kept
    w.reconnected(0.5)
    assert other not in take(w)


def test_a_relayed_answer_lets_a_real_broker_send_one_more_request() -> None:
    wired = Wired(1)
    wired.client_request(1)
    assert len(wired.running) == 1
    wired.worker.relay(Reply(b"C", (b"id-9",), (b"x",)), wired.now)  # credit as a PING
    wired.flush()
    wired.pump()
    wired.client_request(2)
    assert wired.worker.statistics().backlog == 1  # mirrored: at most N run (Rule W4)
    assert wired.max_running == 1
    wired.finish(0)
    assert [r.data for r in wired.replies][-2:] == [(b"x",), (b"1",)]
    assert len(wired.running) == 1  # the backlogged one took the slot


def test_taken_replays_are_not_replayed_again_to_the_successor() -> None:
    """Rule W15 with W13: answers relayed through another broker at a loss are not sent
    again to the lost broker's successor; a fresh answer kept meanwhile (W7) still is."""
    w = ready(n=2, now=0.0)
    deliver(w, dcp_req(1), 0.0)
    deliver(w, dcp_req(2), 0.0)
    first = result_message(dcp_req(1), b"r1")
    w.finish(first, 0.1)
    take(w)
    assert w.take_replays() == []
    w.connection_lost(0.2)
    second = result_message(dcp_req(2), b"r2")
    w.finish(second, 0.3)  # kept for the next registration (Rule W7)
    assert w.take_replays() == [first]
    assert w.take_replays() == []
    w.reconnected(0.4)
    assert take(w) == [Register(SVC), second]
    # The other way round: replayed to the successor, nothing is left to take.
    w.connection_lost(0.5)
    w.reconnected(0.6)
    assert take(w) == [Register(SVC), replayed([second])]
    assert w.take_replays() == []


def test_a_closed_connection_replays_only_its_last_heartbeat_interval() -> None:
    """Rule W13: a loss seen at once (the connection closed) can only have taken what the
    broker had not passed on then: the answers of the last ``I`` seconds are replayed, the
    whole ``L x I`` window only after a silence (W6) or a congested connection."""
    replies = [result_message(dcp_req(i), b"r%d" % i) for i in range(3)]

    def loaded() -> WorkerCore:
        w = ready(n=3, now=0.0)
        for i in range(3):
            deliver(w, dcp_req(i), 0.0)
        for i, at in enumerate((0.5, 1.6, 2.2)):
            w.finish(replies[i], at)
        take(w)
        return w

    w = loaded()
    w.connection_lost(2.5)
    w.reconnected(2.6)
    assert take(w) == [Register(SVC), replayed(replies[1:])]
    congested = loaded()
    congested.connection_lost(2.5, congested=True)
    congested.reconnected(2.6)
    assert take(congested) == [Register(SVC), replayed(replies)]


def test_relayed_replays_are_one_event_after_the_notices_and_credit_as_a_ping() -> None:
    w = ready(n=1, now=0.0)
    deliver(w, dcp_req(1), 0.0)  # the one slot is busy, no credit left
    notice = Reply(CLIENT, dcp_req(8).metadata, (HELD_MARKER,))
    answers = [Reply(CLIENT, dcp_req(i).metadata, (b"a%d" % i,)) for i in (9, 10)]
    w.relay(notice, 0.1)
    w.relay_replays(answers, 0.1)
    w.relay_replays([], 0.1)  # nothing: no event
    assert take(w) == [notice, replayed(answers)]
    assert deliver(w, dcp_req(2), 0.2) == []  # credit 1, as a PING: it waits (Rule W4)
    w.connection_lost(0.3)
    w.relay_replays(answers, 0.4)  # not READY: dropped
    assert take(w) == []


def test_answered_keeps_answers_by_id_within_window_and_bounds() -> None:
    kept = Answered(window=3.0, limit=2, max_bytes=8)
    kept.remember(b"a", (b"1234",), 0.0)
    kept.remember(b"a", (b"other",), 0.1)  # the first answer stays
    assert kept.get(b"a", 1.0) == (b"1234",)
    kept.remember(b"b", (b"12",), 1.0)
    kept.remember(b"c", (b"12",), 2.0)  # over the limit: the oldest goes
    assert kept.get(b"a", 2.0) is None
    assert kept.get(b"b", 2.0) == (b"12",)
    kept.remember(b"d", (b"12345678",), 2.5)  # over the bytes: older ones go
    assert kept.get(b"c", 2.5) is None and kept.get(b"d", 2.5) == (b"12345678",)
    assert kept.get(b"d", 5.6) is None  # past the window
    off = Answered(window=3.0, limit=0, max_bytes=8)
    off.remember(b"a", (b"1",), 0.0)
    assert off.get(b"a", 0.0) is None
