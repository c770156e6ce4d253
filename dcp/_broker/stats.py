"""What a running broker reports: its statistics (the core's, with the handshakes its ZAP
handler refused) and the HTTP endpoint's snapshots (``docs/operations.md``).

Rules:

1. With the I/O thread, the core changes while another thread reads it: a reading that
   raced a change is taken again (:func:`dcp._broker.oplog.read_racy`).
2. An HTTP snapshot is taken where the core runs (:func:`dcp._broker.thread.in_core`), so
   it is consistent; the ZAP handler's counts are added to it afterwards.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import anyio.abc
import attrs

from dcp._broker.thread import in_core
from dcp._broker.zap import ZapHandler
from dcp._stats import BrokerSnapshot, BrokerStatistics

if TYPE_CHECKING:
    from dcp._broker.broker import Broker

__all__ = ["serve_http", "take_snapshot", "with_zap"]


async def serve_http(
    broker: Broker, bound: list[str], *, task_status: anyio.abc.TaskStatus[str]
) -> None:
    from dcp._http.run import run_http

    assert broker._http is not None

    def report(address: str | None) -> None:
        broker.http_address = address

    await run_http(
        broker._http, partial(take_snapshot, broker), bound, report, task_status=task_status
    )


async def take_snapshot(broker: Broker, peers: bool) -> BrokerSnapshot:
    """What the HTTP endpoint shows, taken where the core runs (``peers``: list them)."""
    core = broker._core
    taken = await in_core(broker, partial(core.snapshot, peers=peers))
    return attrs.evolve(taken, statistics=with_zap(broker._zap, taken.statistics))


def with_zap(zap: ZapHandler | None, stats: BrokerStatistics) -> BrokerStatistics:
    """``stats`` with the handshakes the ZAP handler refused in ``rejections``."""
    if zap is not None and (zap.denied or zap.malformed):
        rejections = dict(stats.rejections)
        for reason, count in (("zap_denied", zap.denied), ("zap_malformed", zap.malformed)):
            if count:
                rejections[reason] = count
        stats = attrs.evolve(stats, rejections=rejections)
    return stats
