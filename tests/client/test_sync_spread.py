"""The blocking client's broker choice and failover decisions (Rules SB1-SB6 of
:mod:`dcp._client.sync_spread`), pure: no sockets, ``now`` given."""

from __future__ import annotations

import math

from dcp._client.sync_spread import BrokerState, Kind, Spread

LIVE, LOST, CONNECTING = BrokerState.LIVE, BrokerState.LOST, BrokerState.CONNECTING


def rid(n: int) -> bytes:
    return b"id%d" % n


def test_least_outstanding_first_round_robin_among_ties() -> None:
    s = Spread(3, 0.2)
    assert s.choose() == 0  # Rule SB2: connecting ones when none is live
    for i in range(3):
        s.live(i)
    picks = []
    for n in range(6):
        broker = s.choose()
        assert broker is not None
        s.place(rid(n), broker, [b"f"], 0.0)
        picks.append(broker)
    assert picks == [1, 2, 0, 1, 2, 0]  # (the first choose() moved the round on)
    assert s.outstanding == [2, 2, 2]
    s.done(rid(1))
    assert s.outstanding == [2, 2, 1]
    assert s.choose() == 2  # the fewest, wherever the round is


def test_a_lost_broker_s_requests_move_after_the_grace() -> None:
    s = Spread(2, 0.2)
    s.live(0)
    s.live(1)
    s.place(rid(1), 0, [b"f1"], 0.0)
    s.place(rid(2), 1, [b"f2"], 0.0)
    s.place(rid(3), 0, [b"f3"], 0.0, Kind.STREAM)
    assert s.next_deadline() == math.inf
    assert s.lost(0, 10.0) == [rid(3)]  # a stream breaks (Rule SB3)
    assert s.states == [LOST, LIVE]
    assert s.next_deadline() == 10.2
    assert s.due(10.1) == []
    assert s.due(10.2) == [rid(1)]
    assert s.choose() == 1
    s.place(rid(1), 1, [b"f1"], 10.2)
    assert s.outstanding == [1, 2]  # (the stream until the driver drops it)
    assert s.moved == 1
    assert s.lost(0, 11.0) == []  # already lost: nothing again


def test_held_requests_stay_and_unknown_notices_are_counted() -> None:
    s = Spread(2, 0.2)
    s.live(0)
    s.live(1)
    s.place(rid(1), 0, [b"f"], 0.0)
    s.place(rid(2), 0, [b"f"], 0.0)
    assert s.notice(rid(1))  # Rule SB5, before the loss
    s.lost(0, 1.0)
    assert s.notice(rid(2))  # and after it, within the grace
    assert s.due(5.0) == []
    assert not s.notice(rid(9))
    assert (s.held, s.held_unknown, s.moved) == (2, 1, 0)


def test_with_no_broker_a_request_waits_for_the_first_back() -> None:
    s = Spread(2, 0.2)
    s.live(0)
    s.place(rid(1), 0, [b"f"], 0.0)
    s.lost(0, 1.0)
    s.lost(1, 1.0)  # (a failed connection attempt while connecting)
    assert s.choose() is None
    assert s.due(1.2) == [rid(1)]
    s.place(rid(1), None, [b"f"], 1.2)  # Rule SB4: nowhere yet
    s.place(rid(2), None, [b"g"], 1.3)
    assert s.outstanding == [0, 0]
    assert s.live(1) == [rid(1), rid(2)]  # they go there at once
    assert s.live(1) == []  # already live


def test_pub_sub_goes_to_the_first_live_broker_and_pinned_requests_do_not_move() -> None:
    s = Spread(3, 0.2)
    assert s.home() == 0  # all connecting: the first
    s.live(2)
    assert s.home() == 2
    s.live(1)
    assert s.home() == 1
    s.place(rid(1), 1, [b"f"], 0.0, Kind.HOME)
    s.place(rid(2), 1, [b"f"], 0.0, Kind.FIXED)
    assert s.lost(1, 0.0) == [rid(2)]  # asked of that broker: it fails
    assert s.home() == 2
    assert s.due(1.0) == [rid(1)]
    assert s.target(s.placed[rid(1)]) == 2  # pub/sub moves to the next home
    assert s.states == [CONNECTING, LOST, LIVE]
