"""The client's brokers (sans-IO, :mod:`dcp._core.client.brokers`): spread, failover, HELD
notices and parked requests, driven by hand with explicit ``now``; and the tracker's moves
(Rule RT8)."""

from __future__ import annotations

import pytest

from dcp._core.client.brokers import (
    BrokerInfo,
    Brokers,
    BrokerState,
    endpoint_list,
    held_request,
)
from dcp._core.client.tracker import RequestTracker
from dcp._errors import RequestTimeout
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import HELD_MARKER, Reply, Request
from dcp.wire.options import request_expires_in
from tests.helpers import take_tracker as take

A, B, C = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"


def rid(n: int) -> bytes:
    return b"\xffDCP:id=" + n.to_bytes(16, "big")


def live(*endpoints: str, grace: float = 0.2, spread: str = "least") -> Brokers:
    brokers = Brokers(endpoints, grace=grace, spread=spread)
    for i in range(len(endpoints)):
        assert brokers.up(i) == []
    return brokers


def connecting(brokers: Brokers) -> bool:
    return brokers.connecting  # (read afresh: mypy would narrow the property)


# ---------------------------------------------------------------- Rule BK1


def test_endpoint_list_takes_a_str_as_one_endpoint() -> None:
    assert endpoint_list(A) == (A,)
    assert endpoint_list(f"{A},{B}") == (f"{A},{B}",)  # a comma is not split
    assert endpoint_list([A, B]) == (A, B)
    assert endpoint_list((A,)) == (A,)


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ([], "empty list"),
        ((), "empty list"),
        ([A, B, A], f"{A!r} is given twice"),
        ([A, 5], r"endpoint\[1\] must be a str"),
        (b"tcp://x:1", "not bytes"),
        (5, "not int"),
    ],
)
def test_endpoint_list_refuses_bad_lists(endpoint: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        endpoint_list(endpoint)  # type: ignore[arg-type]


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="failover_grace"):
        Brokers([A], grace=-1)
    with pytest.raises(ValueError, match="failover_grace"):
        Brokers([A], grace=float("inf"))
    with pytest.raises(ValueError, match="spread"):
        Brokers([A], spread="random")


# ---------------------------------------------------------------- Rules BK2, BK3


def test_only_live_brokers_are_chosen() -> None:
    brokers = Brokers([A, B])
    assert brokers.choose() is None
    assert not brokers.any_live and connecting(brokers)
    assert [i.state for i in brokers.info()] == [BrokerState.CONNECTING] * 2
    brokers.up(1)
    assert brokers.choose() == 1
    assert brokers.is_live(1) and not brokers.is_live(0)
    brokers.up(0)
    assert {brokers.choose(), brokers.choose()} == {0, 1}
    assert not connecting(brokers)
    brokers.lost(0, 0.0)
    assert [brokers.choose() for _ in range(3)] == [1, 1, 1]
    assert brokers.info()[0] == BrokerInfo(A, BrokerState.LOST, 0, 0, 1)


def test_least_outstanding_first_round_robin_among_ties() -> None:
    brokers = live(A, B, C)
    chosen = []
    for n in range(6):  # nothing ends: the loads stay level, each in turn
        i = brokers.choose()
        assert i is not None
        brokers.sent(rid(n), i)
        chosen.append(i)
    assert chosen == [0, 1, 2, 0, 1, 2]
    for n in (0, 3):  # broker 0's two end: it is the least loaded
        brokers.done(rid(n))
    assert brokers.choose() == 0
    assert [i.outstanding for i in brokers.info()] == [0, 2, 2]
    assert [i.sent for i in brokers.info()] == [2, 2, 2]
    assert len(brokers) == 4


def test_round_robin_ignores_the_load() -> None:
    brokers = live(A, B, spread="round-robin")
    brokers.sent(rid(1), 0)
    brokers.sent(rid(2), 0)
    assert [brokers.choose() for _ in range(4)] == [0, 1, 0, 1]


def test_with_no_live_broker_a_request_is_parked_until_one_is_up() -> None:
    brokers = Brokers([A, B])
    assert brokers.choose() is None
    brokers.park(rid(1))
    brokers.park(rid(2))
    brokers.done(rid(2))  # ended while parked: not handed back
    assert brokers.up(1) == [rid(1)]
    assert brokers.up(0) == []  # handed back once
    brokers.sent(rid(1), 1)
    assert brokers.where(rid(1)) == 1


# ---------------------------------------------------------------- Rule BK4


def test_a_lost_brokers_requests_move_after_the_grace() -> None:
    brokers = live(A, B, grace=0.2)
    for n in range(4):
        i = brokers.choose()
        assert i is not None
        brokers.sent(rid(n), i)
    on_a = [r for r in map(rid, range(4)) if brokers.where(r) == 0]
    assert len(on_a) == 2
    assert brokers.next_deadline() is None
    assert brokers.lost(0, 10.0) == []
    assert brokers.next_deadline() == pytest.approx(10.2)
    assert brokers.expire(10.1) == []
    due = brokers.expire(10.2)
    assert due == on_a
    assert brokers.next_deadline() is None
    assert brokers.moved == 2
    for r in due:
        i = brokers.choose()
        assert i == 1
        brokers.sent(r, i)
    assert [i.outstanding for i in brokers.info()] == [0, 4]
    assert brokers.lost(0, 11.0) == []  # lost twice: nothing more happens


def test_a_request_that_ends_or_is_resent_within_the_grace_does_not_move() -> None:
    brokers = live(A, B)
    brokers.sent(rid(1), 0)
    brokers.sent(rid(2), 0)
    brokers.sent(rid(3), 0)
    brokers.lost(0, 0.0)
    brokers.done(rid(1))  # answered (its reply came through B)
    brokers.sent(rid(2), 1)  # an attempt-timeout resend went through B
    assert brokers.expire(1.0) == [rid(3)]


def test_streams_do_not_move_they_are_reported_at_once() -> None:
    brokers = live(A, B)
    brokers.sent(rid(1), 0, movable=False)
    brokers.sent(rid(2), 0)
    assert brokers.lost(0, 0.0) == [rid(1)]
    assert brokers.where(rid(1)) is None  # ended
    assert brokers.expire(1.0) == [rid(2)]


def test_a_move_with_no_live_broker_is_parked() -> None:
    brokers = live(A, B)
    brokers.sent(rid(1), 0)
    brokers.lost(0, 0.0)
    brokers.lost(1, 0.0)
    (due,) = brokers.expire(1.0)
    assert brokers.choose() is None
    brokers.park(due)
    assert brokers.up(0) == [rid(1)]  # broker 0 back: the first live one takes it


def test_a_broker_back_within_the_grace_is_chosen_again() -> None:
    brokers = live(A, B)
    brokers.sent(rid(1), 0)
    brokers.sent(rid(2), 1)
    brokers.lost(0, 0.0)
    brokers.up(0)
    assert brokers.expire(0.2) == [rid(1)]  # it moves all the same (the broker may not know it)
    assert brokers.choose() == 0  # the least loaded now


def test_a_resend_stays_on_a_live_broker_and_leaves_a_lost_one() -> None:
    brokers = live(A, B)
    brokers.sent(rid(1), 0)
    assert brokers.route(rid(1)) == 0  # Rule BK6
    brokers.lost(0, 0.0)
    assert brokers.route(rid(1)) == 1
    assert brokers.route(rid(9)) == 1  # a probe's id: any live broker
    brokers.lost(1, 0.0)
    assert brokers.route(rid(1)) is None


# ---------------------------------------------------------------- Rule BK5


def held_frames(request_id: bytes, *metadata: bytes, width: int = 1) -> list[bytes]:
    return serialize(Reply(None, (request_id, *metadata), (HELD_MARKER,)), width=width)


def test_held_request_reads_a_notice() -> None:
    assert held_request(held_frames(rid(1))) == rid(1)
    assert held_request(held_frames(rid(1), b"user", width=4)) == rid(1)
    with_address = serialize(Reply(b"client", (rid(1),), (HELD_MARKER,)))
    assert held_request(with_address) == rid(1)
    assert held_request([b"", b"DGBX\x01", b"\x05", b"x", b"", HELD_MARKER]) is None
    assert held_request(serialize(Reply(None, (rid(1),), (b"answer",)))) is None
    assert held_request(serialize(Reply(None, (rid(1),), (b"x", HELD_MARKER)))) is None
    request = serialize(Request(b"svc", None, (rid(1),), (HELD_MARKER,)))
    assert held_request(request) is None
    assert held_request([b"", HELD_MARKER]) is None


def test_a_held_request_does_not_move() -> None:
    brokers = live(A, B)
    brokers.sent(rid(1), 0)
    brokers.sent(rid(2), 0)
    assert brokers.hold(rid(1))  # before the loss is seen
    brokers.lost(0, 0.0)
    assert brokers.hold(rid(2))  # within the grace
    assert brokers.is_held(rid(2))
    assert brokers.expire(1.0) == []
    assert brokers.held == 2
    brokers.sent(rid(2), 1)  # an attempt-timeout resend: no longer held
    assert not brokers.is_held(rid(2))
    brokers.lost(1, 2.0)
    assert brokers.expire(3.0) == [rid(2)]


def test_a_held_notice_for_a_parked_request_keeps_it_from_being_sent_again() -> None:
    brokers = live(A, B)
    brokers.sent(rid(1), 0)
    brokers.lost(0, 0.0)
    brokers.lost(1, 0.0)
    (due,) = brokers.expire(1.0)
    brokers.park(due)  # moved, but no broker is live: waits for one
    held = held_request(held_frames(rid(1)))
    assert held == rid(1) and brokers.hold(held)  # the worker holding it says so
    assert brokers.up(1) == []  # back: it is not sent again (a worker holds it)
    assert brokers.is_held(rid(1)) and brokers.where(rid(1)) == 0
    assert brokers.route(rid(1)) == 1  # an attempt-timeout resend still goes (Rule BK6)
    brokers.sent(rid(1), 1)
    assert not brokers.is_held(rid(1))
    # A parked request never sent: nobody holds it, the notice is dropped, it stays parked.
    brokers.lost(1, 2.0)
    brokers.park(rid(2))
    assert not brokers.hold(rid(2))
    assert brokers.up(0) == [rid(2)]
    assert (brokers.held, brokers.held_dropped) == (1, 1)


def test_a_notice_for_nothing_outstanding_is_counted_and_dropped() -> None:
    brokers = live(A, B)
    assert not brokers.hold(rid(7))
    brokers.sent(rid(1), 0)
    brokers.done(rid(1))
    assert not brokers.hold(rid(1))
    assert (brokers.held, brokers.held_dropped) == (0, 2)


# ---------------------------------------------------------------- tracker Rule RT8


def test_a_move_is_not_a_retry() -> None:
    t = RequestTracker(timeout=10.0, retries=2)
    r = t.request(b"echo", [b"x"], 0.0)
    (first,) = take(t)
    deadline = t.deadline_of(r)
    frames = t.moved(r, 4.0)
    assert frames is not None
    msg, _ = parse(frames)
    assert isinstance(msg, Request)
    assert msg.metadata[0] == r
    assert request_expires_in(msg.metadata) == pytest.approx(6.0, abs=0.01)
    assert frames[:6] == first[:6] and frames[7:] == first[7:]
    assert take(t) == []  # sent by the driver, not through the outbox
    assert t.deadline_of(r) == deadline
    assert t.statistics().retries == 0
    assert t.moved(b"\xffDCP:id=unknown", 4.0) is None


def test_a_move_at_or_past_its_end_is_not_made_the_tracker_times_it_out() -> None:
    """A parked request handed back by a broker that came up just as (or after) its deadline
    passed, before the tracker's expiry ran (the monitor and the deadlines are read apart):
    it is not moved (no ValueError from its expires-in), and it times out as usual."""
    t = RequestTracker(timeout=1.0, retries=0)
    r = t.request(b"echo", [b"x"], 0.0)
    take(t)
    brokers = Brokers(["a", "b"])
    brokers.park(r)
    assert brokers.up(0) == [r]
    assert t.moved(r, 1.0) is None
    assert t.moved(r, 1.5) is None
    assert t.is_pending(r)
    t.expire(1.5)
    _, events = t.drain()
    assert [e.request_id for e in events] == [r]
    assert isinstance(events[0].error, RequestTimeout)
