"""Review of routing Rule R11 (answered elsewhere): the pure broker core with real frames."""

from __future__ import annotations

import pytest

from dcp._core.broker.core import BrokerCore
from dcp.wire import Reply, Request
from tests.core.test_broker_once import call, dispatched, inflight, rid
from tests.helpers import C1, ECHO, W1, W2, feed, out, take, workers

NOBODY = b"nobody"
OTHER = b"other"


@pytest.mark.parametrize("expiring", [True, False], ids=["expires-in", "no-deadline"])
def test_a_service_left_without_worker_nor_queue_is_forgotten(expiring: bool) -> None:
    """Rule R11 ends the last queued request of a service nobody provides: the service is
    forgotten then, as when it expires (queues Rule Q3; admission Rule AD5 no longer counts
    it for the client that made it)."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W2, service=OTHER)
    one = call(1, 30.0, NOBODY) if expiring else Request(NOBODY, None, (rid(1),), (b"d1",))
    feed(core, C1, one, now=0.0)
    assert take(core) == []
    assert NOBODY in core.routing.services
    assert core.routing.made == {C1: 1}
    feed(core, W2, Reply(C1, one.metadata, (b"done",)), now=0.1)
    assert take(core) == [out(C1, Reply(C1, one.metadata, (b"done",)))]
    assert core.statistics().answered_elsewhere == 1
    assert inflight(core) == 0
    assert NOBODY not in core.routing.services
    assert core.routing.made == {}


def test_the_queue_front_stays_live_after_ending_a_copy_behind_a_dead_one() -> None:
    """Queues Rule Q3: a queue's front is never a tombstone. Rule R11 ends the front (no
    deadline) while the next is a tombstone (expired): the worker freed next gets the live
    request behind them."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    workers(core, W2, service=OTHER)
    feed(core, C1, call(1, 30.0), now=0.0)
    [given] = dispatched(take(core), W1)
    plain = Request(ECHO, None, (rid(2),), (b"d2",))
    feed(core, C1, plain, now=0.1)
    feed(core, C1, call(3, 0.5), now=0.2)
    feed(core, C1, call(4, 30.0), now=0.3)
    core.expire(1.0)  # request 3 expired in the queue: a tombstone behind request 2
    take(core)
    feed(core, W2, Reply(C1, plain.metadata, (b"two",)), now=1.1)
    take(core)
    assert core.statistics().services[ECHO].queued == 1
    feed(core, W1, Reply(C1, given.metadata, (b"one",)), now=1.2)
    [sent] = dispatched(take(core), W1)
    assert sent.metadata[0] == rid(4)
    feed(core, W1, Reply(C1, sent.metadata, (b"four",)), now=1.3)
    take(core)
    assert (inflight(core), core.statistics().clients, core.memory.used) == (0, 0, 0)
    assert core.routing.loads == {}
