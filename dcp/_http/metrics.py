"""``/metrics``: the broker's figures in Prometheus text exposition (``docs/operations.md``).

Rule HM1 - Read at scrape time. A custom collector turns one :class:`~dcp._stats.BrokerSnapshot`
  into metric families when Prometheus asks; the broker keeps nothing for it in between.
Rule HM2 - Prometheus conventions: base units (seconds), ``_total`` counters that never go
  down while their series exists, ``dcp_build_info`` for the version, no label per peer
  (peers are counted by kind and dialect). A service's series start when the broker learns
  of it and end when it forgets it (no worker provides it, nothing is queued): a service that
  comes back starts from zero, which Prometheus treats as a counter reset.
Rule HM3 - The byte budget (``dcp._core.broker.budget``), one series per account (label
  ``account``): ``dcp_broker_memory_bytes`` (held now), ``dcp_broker_memory_peak_bytes``,
  ``dcp_broker_memory_limit_bytes`` and ``dcp_broker_memory_peer_limit_bytes`` (absent
  without a budget), ``dcp_broker_memory_refused_total``; ``dcp_broker_max_memory_bytes``
  (absent without a budget). The endpoint's own refusals: ``dcp_http_refused_total`` by
  ``reason`` (app Rule HA3).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dcp._stats import DURATION_BUCKETS, BrokerSnapshot

__all__ = ["SnapshotCollector", "render"]

#: Broker-wide counters: (``BrokerStatistics`` attribute, metric name, help).
_COUNTERS = (
    ("requests", "requests", "Requests accepted (queued or dispatched), forwards included."),
    ("replies", "replies", "Final replies routed to a client."),
    ("partials", "partial_replies", "Partial replies (MDP/0.2) routed to a client."),
    ("forwards", "forwards", "Requests forwarded by workers on behalf of a client."),
    ("dispatched", "dispatched", "Requests given to a worker (first deliveries and again)."),
    ("redeliveries", "redeliveries", "Requests requeued because their worker went away."),
    ("dropped_replies", "dropped_replies", "Replies dropped: their client was gone or full."),
    ("undeliverable", "undeliverable", "Other messages dropped for the same reasons."),
    ("unmatched", "unmatched_replies", "Worker answers that matched no request they held."),
    ("expired_workers", "expired_workers", "Workers removed because they went silent."),
    ("work_timeouts", "work_timeouts", "Workers removed for holding a request too long."),
    ("expired_in_queue", "expired_in_queue", "Queued requests whose caller's deadline passed."),
    ("replaced", "replaced_retries", "Retries that replaced their still-queued copy."),
    (
        "answered_elsewhere",
        "answered_elsewhere",
        "Queued requests ended unrun: a worker answered them elsewhere.",
    ),
)


class SnapshotCollector(Collector):
    """Metric families from one snapshot (Rule HM1).

    :param snap: the snapshot
    :param version: the broker's version (``dcp_build_info``)
    :param started: when the broker's endpoint started (Unix time)
    """

    def __init__(
        self,
        snap: BrokerSnapshot,
        version: str,
        started: float,
        http: dict[str, int] | None = None,
    ) -> None:
        self._snap = snap
        self._version = version
        self._started = started
        self._http = http or {}

    def collect(self) -> Iterator[Metric]:
        snap = self._snap
        stats = snap.statistics
        info = InfoMetricFamily("dcp_build", "The dcp library the broker runs.")
        info.add_metric([], {"version": self._version})
        yield info
        yield GaugeMetricFamily(
            "dcp_broker_start_time_seconds",
            "When the broker started serving (Unix time).",
            value=self._started,
        )
        yield GaugeMetricFamily(
            "dcp_broker_uptime_seconds",
            "Seconds since the broker started serving.",
            value=max(0.0, time.time() - self._started),
        )
        for attr, name, doc in _COUNTERS:
            yield CounterMetricFamily(f"dcp_broker_{name}", doc, value=getattr(stats, attr))
        rejections = CounterMetricFamily(
            "dcp_broker_rejections", "Messages refused, by reason.", labels=["reason"]
        )
        for reason, count in sorted(stats.rejections.items()):
            rejections.add_metric([reason], count)
        yield rejections
        peers = GaugeMetricFamily(
            "dcp_broker_peers",
            "Registered workers, and clients with requests in flight, by dialect.",
            labels=["kind", "dialect"],
        )
        for (kind, dialect), count in sorted(snap.peers.items()):
            peers.add_metric([kind, dialect], count)
        yield peers
        yield GaugeMetricFamily("dcp_broker_workers", "Registered workers.", value=stats.workers)
        yield GaugeMetricFamily(
            "dcp_broker_clients",
            "Clients with requests accepted and not yet answered.",
            value=stats.clients,
        )
        yield from self._memory()
        refused = CounterMetricFamily(
            "dcp_http_refused",
            "HTTP requests this endpoint refused, by reason.",
            labels=["reason"],
        )
        for reason in ("misdirected", "unauthorized"):
            refused.add_metric([reason], self._http.get(reason, 0))
        yield refused
        yield from self._services()

    def _memory(self) -> Iterator[Metric]:
        """Rule HM3."""
        stats = self._snap.statistics
        if stats.max_memory is not None:
            yield GaugeMetricFamily(
                "dcp_broker_max_memory_bytes",
                "Bytes the broker may hold on its peers' behalf (max_memory).",
                value=stats.max_memory,
            )
        label = ["account"]
        used = GaugeMetricFamily(
            "dcp_broker_memory_bytes", "Bytes held on peers' behalf, by account.", labels=label
        )
        peak = GaugeMetricFamily(
            "dcp_broker_memory_peak_bytes",
            "The most bytes held at once, by account.",
            labels=label,
        )
        limit = GaugeMetricFamily(
            "dcp_broker_memory_limit_bytes", "Each account's share of max_memory.", labels=label
        )
        peer_limit = GaugeMetricFamily(
            "dcp_broker_memory_peer_limit_bytes",
            "The most one peer may hold in each account.",
            labels=label,
        )
        refused = CounterMetricFamily(
            "dcp_broker_memory_refused",
            "Charges refused for want of room in the account (memory_budget).",
            labels=label,
        )
        for a in stats.memory:
            name = [a.name]
            used.add_metric(name, a.used)
            peak.add_metric(name, a.peak)
            if a.limit is not None:
                limit.add_metric(name, a.limit)
            if a.peer_limit is not None:
                peer_limit.add_metric(name, a.peer_limit)
            refused.add_metric(name, a.refused)
        yield from (used, peak, limit, peer_limit, refused)

    def _services(self) -> Iterator[Metric]:
        label = ["service"]
        requests = CounterMetricFamily(
            "dcp_service_requests", "Requests accepted for the service.", labels=label
        )
        replies = CounterMetricFamily(
            "dcp_service_replies",
            "Answers from its workers that finished a request (errors included).",
            labels=label,
        )
        errors = CounterMetricFamily(
            "dcp_service_errors", "Error replies from its workers.", labels=label
        )
        redeliveries = CounterMetricFamily(
            "dcp_service_redeliveries",
            "Requests requeued because their worker went away.",
            labels=label,
        )
        depth = GaugeMetricFamily(
            "dcp_service_queue_depth", "Requests waiting in the queue.", labels=label
        )
        oldest = GaugeMetricFamily(
            "dcp_service_oldest_queued_age_seconds",
            "Age of the oldest queued request (0: none queued).",
            labels=label,
        )
        workers = GaugeMetricFamily(
            "dcp_service_workers",
            "Registered workers providing the service, idle or busy.",
            labels=["service", "state"],
        )
        durations = HistogramMetricFamily(
            "dcp_service_request_duration_seconds",
            "Processing time of answered requests (dispatch to answer).",
            labels=label,
        )
        bounds = [_bound(b) for b in DURATION_BUCKETS] + ["+Inf"]
        for s in sorted(self._snap.services, key=lambda s: s.name):
            name = [s.name]
            requests.add_metric(name, s.requests)
            replies.add_metric(name, s.replies)
            errors.add_metric(name, s.errors)
            redeliveries.add_metric(name, s.redeliveries)
            depth.add_metric(name, s.queued)
            oldest.add_metric(name, s.oldest_queued_age)
            workers.add_metric([s.name, "idle"], s.idle)
            workers.add_metric([s.name, "busy"], s.busy)
            cumulative = []
            total = 0
            for bound, count in zip(bounds, s.durations, strict=True):
                total += count
                cumulative.append((bound, float(total)))
            durations.add_metric(name, cumulative, sum_value=s.processing_time)
        yield from (requests, replies, errors, redeliveries, depth, oldest, workers, durations)


def _bound(seconds: float) -> str:
    return repr(float(seconds))


def render(
    snap: BrokerSnapshot, version: str, started: float, *, http: dict[str, int] | None = None
) -> tuple[bytes, str]:
    """The exposition of ``snap`` and its content type.

    :param http: requests the endpoint refused, by reason (Rule HM3)
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snap, version, started, http))
    return generate_latest(registry), CONTENT_TYPE_LATEST
