"""Review of the worker core's prefetch (Rules W2, W4, W7, W12 with ``P`` > 0): against the
real broker core, with real frames."""

from __future__ import annotations

from tests.helpers import Wired


def test_a_connection_made_again_to_the_same_broker_runs_the_prefetched_requests() -> None:
    """Rule W12: zmq made the connection again (same socket, same routing id) to a broker
    that never lost us: it still holds the prefetched requests, as given to us, and a retry
    of one joins the held copy (its Rule R8). Dropped here, they would never be answered
    while this worker lives."""
    w = Wired(1, prefetch=2)
    for i in range(3):
        w.client_request(i)
    assert w.worker.statistics().backlog == 2
    w.worker.connection_lost(w.now)
    w.worker.reconnected(w.now)
    w.flush()
    w.pump()
    for _ in range(10):
        while w.running:
            w.finish(0)
        w.advance(0.5)
    assert sorted(int(r.data[0]) for r in w.replies) == [0, 1, 2]
    assert w.max_running == 1
    s = w.worker.statistics()
    assert (s.received, s.replies, s.dropped, s.backlog) == (3, 3, 0, 0)
