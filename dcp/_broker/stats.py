"""What a running broker reports: its statistics (the core's, with the handshakes its ZAP
handler refused) and the HTTP endpoint's snapshots (``docs/operations.md``).

Rules:

Rule BS1 - With the I/O thread, the core changes while another thread reads it: a reading that
   raced a change is taken again (:func:`dcp._broker.oplog.read_racy`).
Rule BS2 - An HTTP snapshot is taken where the core runs
   (:meth:`dcp._broker.thread.CoreCalls.run`), so it is consistent; the ZAP handler's counts are
   added to it afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import anyio.abc
import attrs

from dcp._broker.oplog import read_racy
from dcp._broker.reload import SecurityReload
from dcp._broker.thread import CoreCalls
from dcp._broker.zap import ZapHandler
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.pubsub import PubSubStatistics
from dcp._http.address import HttpOptions
from dcp._stats import BrokerSnapshot, BrokerStatistics

__all__ = ["Reports", "with_zap"]


class Reports:
    """A broker's statistics and snapshots (Rules BS1 and BS2).

    :param core: the broker's core
    :param calls: where the core runs
    :param security: the broker's security (its ZAP handler counts refused handshakes)
    """

    def __init__(self, core: BrokerCore, calls: CoreCalls, security: SecurityReload) -> None:
        self._core = core
        self._calls = calls
        self._security = security

    def statistics(self) -> BrokerStatistics:
        """The core's counters and gauges, with the ZAP handler's refusals (Rule BS1)."""
        return with_zap(self._security.zap, read_racy(self._core.statistics))

    def pubsub_statistics(self) -> PubSubStatistics:
        """The core's pub/sub counters and gauges (Rule BS1)."""
        return read_racy(self._core.pubsub.statistics)

    async def snapshot(self, peers: bool) -> BrokerSnapshot:
        """What the HTTP endpoint shows, taken where the core runs (``peers``: list them;
        Rule BS2)."""
        taken = await self._calls.run(partial(self._core.snapshot, peers=peers))
        return attrs.evolve(taken, statistics=with_zap(self._security.zap, taken.statistics))

    async def serve_http(
        self,
        options: HttpOptions,
        bound: list[str],
        report: Callable[[str | None], None],
        *,
        task_status: anyio.abc.TaskStatus[str],
    ) -> None:
        """Serve the HTTP endpoint (:func:`dcp._http.run.run_http`) until cancelled.

        :param bound: the broker's bound zmq endpoints
        :param report: told the endpoint's address once bound, ``None`` once stopped
        """
        from dcp._http.run import run_http

        await run_http(options, self.snapshot, bound, report, task_status=task_status)


def with_zap(zap: ZapHandler | None, stats: BrokerStatistics) -> BrokerStatistics:
    """``stats`` with the handshakes the ZAP handler refused in ``rejections``."""
    if zap is not None and (zap.denied or zap.malformed):
        rejections = dict(stats.rejections)
        for reason, count in (("zap_denied", zap.denied), ("zap_malformed", zap.malformed)):
            if count:
                rejections[reason] = count
        stats = attrs.evolve(stats, rejections=rejections)
    return stats
