"""Routing Rule R2: among workers with credit, one that holds nothing gets the next request
first (a prefetching worker asks for more while busy), else the least recently used."""

from __future__ import annotations

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.routing import IDLE_SCAN
from dcp.wire.messages import Ping
from tests.helpers import C1, W1, W2, answer, feed, given, req, take, workers


def sent(core: BrokerCore) -> list[list[bytes]]:
    """The requests the core gave (its PONGs to the pings left out)."""
    return [frames for frames in take(core) if frames[3] == b"\x04"]


def test_a_free_worker_gets_the_request_before_a_busy_one_with_credit() -> None:
    core = BrokerCore()
    workers(core, W1, W2)
    feed(core, C1, req(1))
    feed(core, C1, req(2))
    assert sent(core) == [given(W1, 1, C1), given(W2, 2, C1)]
    feed(core, W1, Ping())  # busy, asks for one more (a prefetch): first in line
    feed(core, W2, answer(2, C1))  # free again, behind W1
    take(core)
    feed(core, C1, req(3))
    assert sent(core) == [given(W2, 3, C1)]  # W2 holds nothing: it runs it now
    feed(core, C1, req(4))
    assert sent(core) == [given(W1, 4, C1)]  # W2 has no credit left: W1 prefetches it


def test_only_the_first_idle_scan_workers_are_looked_at() -> None:
    core = BrokerCore()
    busy = [b"B%d" % i for i in range(IDLE_SCAN)]
    workers(core, *busy)
    for i, ident in enumerate(busy):
        feed(core, C1, req(i))
        assert sent(core) == [given(ident, i, C1)]
        feed(core, ident, Ping())
    workers(core, b"free")  # behind IDLE_SCAN busy workers with credit
    feed(core, C1, req(99))
    assert sent(core) == [given(busy[0], 99, C1)]  # bounded: the least recently used
