"""Review of issue 28: the tracker's moves (Rule RT8) at or past a request's end."""

from __future__ import annotations

from dcp._core.client.brokers import Brokers
from dcp._core.client.tracker import RequestTracker
from dcp._errors import RequestTimeout
from tests.helpers import take_tracker as take


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
