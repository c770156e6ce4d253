"""The chaos test's figures, computed from what the processes recorded, and their table.

Pure functions of plain records (no processes, no clock), so they are easy to test: the
client records of :mod:`benchmarks.chaos_peers`, the workers' event lines, the faults as the
orchestrator carried them out, and the phases of the schedule.
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Phase",
    "broker_statistics",
    "compute",
    "hangs",
    "recovery",
    "render",
]

#: Width (seconds) of the sliding window in which throughput counts as recovered.
RECOVERY_WINDOW = 0.25
#: Seconds before a broker kill over which the baseline throughput is measured (at most).
BASELINE = 2.0


@dataclass(frozen=True)
class Phase:
    """A stretch of the run, in seconds since the load started."""

    name: str
    start: float
    end: float


def merge_timelines(records: Sequence[Mapping[str, Any]]) -> Counter[int]:
    total: Counter[int] = Counter()
    for rec in records:
        for key, count in rec["timeline"].items():
            total[int(key)] += int(count)
    return total


def _replies(timeline: Mapping[int, int], bucket: float, start: float, end: float) -> int:
    lo = round(start / bucket)
    hi = round(end / bucket)
    return sum(n for i, n in timeline.items() if lo <= i < hi)


def rate(timeline: Mapping[int, int], bucket: float, start: float, end: float) -> float:
    """Replies per second in ``[start, end)``."""
    if end <= start:
        return 0.0
    return _replies(timeline, bucket, start, end) / (end - start)


def recovery(
    timeline: Mapping[int, int],
    bucket: float,
    *,
    kill: float,
    restart: float,
    end: float,
    fractions: Sequence[float] = (0.5, 0.9),
) -> dict[str, Any]:
    """Recovery after one broker restart (times in seconds since the load started).

    ``baseline``: replies/s over the :data:`BASELINE` seconds before the kill.
    ``first_reply_s``: from the restart to the first reply after it. ``to_<p>pct_s``: from
    the restart to the end of the first :data:`RECOVERY_WINDOW` window (sliding by one
    bucket, starting at the restart) that holds at least ``p``% of the baseline rate
    (``None`` if none does before ``end``).
    """
    base_start = max(0.0, kill - BASELINE)
    baseline = rate(timeline, bucket, base_start, kill)
    first = min((i for i, n in timeline.items() if n and i * bucket >= restart), default=None)
    out: dict[str, Any] = {
        "kill": round(kill, 3),
        "restart": round(restart, 3),
        "downtime_s": round(restart - kill, 3),
        "baseline_rate": round(baseline, 1),
        "first_reply_s": None if first is None else round(max(0.0, first * bucket - restart), 3),
    }
    steps = int(max(0.0, end - RECOVERY_WINDOW - restart) / bucket + 1e-9) + 1
    for fraction in fractions:
        key = f"to_{round(fraction * 100)}pct_s"
        out[key] = None
        need = fraction * baseline * RECOVERY_WINDOW
        if baseline <= 0:
            continue
        for step in range(steps):
            t = restart + step * bucket
            if _replies(timeline, bucket, t, t + RECOVERY_WINDOW) >= need:
                out[key] = round(t + RECOVERY_WINDOW - restart, 3)
                break
    return out


_STAT = re.compile(r"\b(\w+)=(\d+)\b")
_REJECTIONS = re.compile(r"rejections=(\{[^}]*\})")


def broker_statistics(log_text: str) -> dict[str, Any]:
    """The counters of the last ``broker stopped: BrokerStatistics(...)`` log line: the
    integers, and ``rejections`` by reason."""
    lines = [line for line in log_text.splitlines() if "broker stopped:" in line]
    if not lines:
        return {}
    line = lines[-1]
    head = line.split("rejections=", 1)[0]
    out: dict[str, Any] = {key: int(value) for key, value in _STAT.findall(head)}
    match = _REJECTIONS.search(line)
    rejections = ast.literal_eval(match.group(1)) if match else {}
    out["rejections"] = {str(k): int(v) for k, v in rejections.items()}
    return out


def hangs(
    worker_events: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each hang, and who answered the hung request in the end (from the slow replies)."""
    answered: dict[str, tuple[str, float]] = {}
    for rec in records:
        for payload, worker, latency in rec["slow"]:
            answered[payload] = (worker, latency)
    out = []
    for ev in worker_events:
        if ev.get("ev") != "hang":
            continue
        rid = str(ev["id"])
        by, latency = answered.get(rid, (None, None))
        out.append(
            {
                "mode": ev["mode"],
                "id": rid,
                "hung_pid": ev["pid"],
                "answered_by": None if by is None else int(by),
                "latency_s": latency,
                "answered": by is not None,
                # By another process (not the hung one, registered again after the broker
                # dropped it).
                "elsewhere": by is not None and int(by) != int(ev["pid"]),
            }
        )
    return out


def reruns_worker_survived(
    worker_events: Sequence[Mapping[str, Any]],
    faults: Sequence[Mapping[str, Any]],
    kind: str | None = None,
) -> int:
    """Requests run again although the process that ran them first was neither killed
    before the second run nor hung on them: work that should have been delivered, not
    repeated (issue 17; broker restarts are the case). A worker killed only later does not
    excuse a re-run (when the records carry the time of each run and kill: ``t`` of a run
    event and ``clock`` of a kill, on the same monotonic clock; without them, a worker
    killed at any time does). ``kind``: count only re-runs whose first run was by a worker
    of that kind (``dcp``, ``majortomo``, ``dagbox``; a run event without one is ``dcp``)."""
    killed: dict[int, float] = {}
    for f in faults:
        if f["kind"] == "kill_worker":
            killed[int(f["pid"])] = float(f.get("clock", -math.inf))
    hung = {(str(ev["id"]), int(ev["pid"])) for ev in worker_events if ev.get("ev") == "hang"}
    first: dict[str, int] = {}
    first_kind: dict[str, str] = {}
    count = 0
    counted: set[str] = set()
    for ev in worker_events:
        if ev.get("ev") != "run":
            continue
        rid = str(ev["id"])
        pid = first.get(rid)
        if pid is None:
            first[rid] = int(ev["pid"])
            first_kind[rid] = str(ev.get("kind", "dcp"))
            continue
        if rid in counted or (rid, pid) in hung:
            continue
        if kind is not None and first_kind[rid] != kind:
            continue
        died = killed.get(pid)
        if died is not None and died <= float(ev.get("t", math.inf)):
            continue
        counted.add(rid)
        count += 1
    return count


def compute(
    *,
    records: Sequence[Mapping[str, Any]],
    worker_events: Sequence[Mapping[str, Any]],
    faults: Sequence[Mapping[str, Any]],
    phases: Sequence[Phase],
    bucket: float,
    duration: float,
    broker_stats: Mapping[str, Any],
) -> dict[str, Any]:
    """The run's figures (see :mod:`benchmarks.chaos` for their meaning)."""
    timeline = merge_timelines(records)
    stats: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    latency: Counter[int] = Counter()
    for rec in records:
        for key, value in rec["stats"].items():
            if isinstance(value, int):
                stats[key] += value
        errors.update(rec["errors"])
        latency.update({int(k): v for k, v in rec["latency_ms"].items()})
    runs = Counter(str(ev["id"]) for ev in worker_events if ev.get("ev") == "run")
    sent = sum(r["sent"] for r in records)
    replies = sum(r["replies"] for r in records)
    kills = [f for f in faults if f["kind"] == "kill_worker"]
    restarts = [f for f in faults if f["kind"] == "start_broker"]
    recoveries = [
        recovery(timeline, bucket, kill=down.start, restart=down.end, end=after.end)
        for down, after in itertools.pairwise(phases)
        if down.name == "broker down" and after.name == "broker recovery"
    ]
    return {
        "sent": sent,
        "replies": replies,
        "lost": sum(r["timeouts"] + r["unfinished"] for r in records),
        "errors": dict(errors),
        "wrong": sum(r["wrong"] for r in records),
        "duplicates_delivered": sum(r["duplicates"] for r in records),
        "client_retries": stats["retries"],
        "client_duplicates_dropped": stats["duplicates"],
        "client_late_dropped": stats["late"],
        "handler_runs": sum(runs.values()),
        "requests_run_more_than_once": sum(1 for n in runs.values() if n > 1),
        "reruns_worker_survived": reruns_worker_survived(worker_events, faults),
        "reruns_worker_survived_dcp": reruns_worker_survived(worker_events, faults, "dcp"),
        "latency_ms": _latency_summary(latency),
        "worker_kills": len(kills),
        "worker_kills_confirmed": sum(1 for k in kills if k.get("signal") == 9),
        "broker_restarts": len(restarts),
        "recoveries": recoveries,
        "hangs": hangs(worker_events, records),
        "broker_last": dict(broker_stats),
        "phases": [
            {
                "name": p.name,
                "start": round(p.start, 3),
                "end": round(p.end, 3),
                "rate": round(rate(timeline, bucket, p.start, p.end), 1),
            }
            for p in phases
        ],
        "overall_rate": round(rate(timeline, bucket, 0.0, duration), 1),
        "per_second": [
            _replies(timeline, bucket, float(s), float(s + 1)) for s in range(int(duration))
        ],
    }


def _latency_summary(hist: Mapping[int, int]) -> dict[str, float]:
    total = sum(hist.values())
    out: dict[str, float] = {}
    if not total:
        return out
    keys = sorted(hist)
    for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
        need = q * total
        seen = 0
        for k in keys:
            seen += hist[k]
            if seen >= need:
                out[name] = float(k)
                break
    out["max"] = float(keys[-1])
    return out


def _median(values: Sequence[float]) -> float | None:
    vals = sorted(values)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def render(fig: Mapping[str, Any], settings: str) -> str:
    """The figures as Markdown tables."""
    hangs = fig["hangs"]
    rec = fig["recoveries"]
    runs_extra = fig["handler_runs"] - fig["replies"]
    rows = [
        ("requests sent", fig["sent"]),
        ("replies received (checked)", fig["replies"]),
        ("lost (timed out or unfinished)", fig["lost"]),
        ("error replies", sum(fig["errors"].values()) or 0),
        ("wrong replies", fig["wrong"]),
        ("duplicates delivered to the application", fig["duplicates_delivered"]),
        ("client retries (resends)", fig["client_retries"]),
        ("duplicate / late replies dropped by the clients", _pair(fig)),
        ("handler runs (beyond one per reply)", f"{fig['handler_runs']} ({runs_extra:+d})"),
        ("requests run more than once", fig["requests_run_more_than_once"]),
        ("... of them where the first worker survived", fig["reruns_worker_survived"]),
        (
            "... of those, first run by a dcp.Worker",
            fig.get("reruns_worker_survived_dcp", "-"),
        ),
        (
            "worker SIGKILLs (confirmed)",
            f"{fig['worker_kills']} ({fig['worker_kills_confirmed']})",
        ),
        (
            "hung requests answered / by another worker process",
            f"{sum(h['answered'] for h in hangs)} / {sum(h['elsewhere'] for h in hangs)} "
            f"of {len(hangs)}",
        ),
        ("broker SIGKILL + restart", fig["broker_restarts"]),
        ("broker downtime, s (median)", _median([r["downtime_s"] for r in rec])),
        ("restart to first reply, s (median)", _median_opt(rec, "first_reply_s")),
        ("restart to 50% throughput, s (median)", _median_opt(rec, "to_50pct_s")),
        ("restart to 90% throughput, s (median)", _median_opt(rec, "to_90pct_s")),
        ("broker redeliveries (last broker)", fig["broker_last"].get("redeliveries")),
        ("workers removed: silent / past a work timeout (last broker)", _removed(fig)),
        ("messages refused (last broker)", _reasons(fig["broker_last"].get("rejections"))),
        ("latency p50 / p99 / max, ms", _lat(fig["latency_ms"])),
    ]
    out = [settings, "", "| figure | value |", "|---|---:|"]
    out += [f"| {name} | {_fmt(value)} |" for name, value in rows]
    out += ["", "| phase | from s | to s | replies/s |", "|---|---:|---:|---:|"]
    out += [
        f"| {p['name']} | {p['start']:.1f} | {p['end']:.1f} | {p['rate']:.0f} |"
        for p in fig["phases"]
    ]
    if hangs:
        out += ["", "| hang | hung pid | answered by | latency s |", "|---|---:|---:|---:|"]
        out += [
            f"| {h['mode']} | {h['hung_pid']} | {_fmt(h['answered_by'])} | "
            f"{_fmt(h['latency_s'])} |"
            for h in hangs
        ]
    return "\n".join(out)


def _removed(fig: Mapping[str, Any]) -> str:
    last = fig["broker_last"]
    return f"{_fmt(last.get('expired_workers'))} / {_fmt(last.get('work_timeouts'))}"


def _reasons(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return "0"
    return ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items()))


def _pair(fig: Mapping[str, Any]) -> str:
    return f"{fig['client_duplicates_dropped']} / {fig['client_late_dropped']}"


def _median_opt(recs: Sequence[Mapping[str, Any]], key: str) -> float | str | None:
    values = [r[key] for r in recs if r[key] is not None]
    missing = len(recs) - len(values)
    med = _median(values)
    if missing and med is not None:
        return f"{med:.2f} ({missing} never)"
    return "never" if missing else med


def _lat(lat: Mapping[str, float]) -> str:
    if not lat:
        return "-"
    return f"{lat['p50']:.0f} / {lat['p99']:.0f} / {lat['max']:.0f}"


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several runs' figures in one: totals of what must be 0 and of the faults, and the
    medians (with min and max) of the rest."""

    def total(key: str) -> int:
        return sum(int(f[key]) for f in runs)

    recs = [r for f in runs for r in f["recoveries"]]
    hung = [h for f in runs for h in f["hangs"]]
    phases: dict[str, list[float]] = {}
    for f in runs:
        for p in f["phases"]:
            phases.setdefault(p["name"], []).append(p["rate"])
    return {
        "rounds": len(runs),
        "sent": total("sent"),
        "replies": total("replies"),
        "lost": total("lost"),
        "wrong": total("wrong"),
        "duplicates_delivered": total("duplicates_delivered"),
        "errors": sum(sum(f["errors"].values()) for f in runs),
        "worker_kills": total("worker_kills"),
        "broker_restarts": total("broker_restarts"),
        "reruns": total("requests_run_more_than_once"),
        "reruns_worker_survived": total("reruns_worker_survived"),
        "reruns_worker_survived_dcp": sum(
            int(f.get("reruns_worker_survived_dcp", 0)) for f in runs
        ),
        "hangs": len(hung),
        "hangs_answered": sum(1 for h in hung if h["answered"]),
        "hangs_elsewhere": sum(1 for h in hung if h["elsewhere"]),
        "spread": {
            "overall replies/s": _spread([f["overall_rate"] for f in runs]),
            "client retries per run": _spread([f["client_retries"] for f in runs]),
            "requests run more than once, per run": _spread(
                [f["requests_run_more_than_once"] for f in runs]
            ),
            "broker downtime, s": _spread([r["downtime_s"] for r in recs]),
            "restart to first reply, s": _spread([r["first_reply_s"] for r in recs]),
            "restart to 50% throughput, s": _spread([r["to_50pct_s"] for r in recs]),
            "restart to 90% throughput, s": _spread([r["to_90pct_s"] for r in recs]),
            **{
                f"{mode} request answered after, s": _spread(
                    [h["latency_s"] for h in hung if h["mode"] == mode]
                )
                for mode in sorted({h["mode"] for h in hung})
            },
            "latency p50, ms": _spread([f["latency_ms"].get("p50") for f in runs]),
            "latency p99, ms": _spread([f["latency_ms"].get("p99") for f in runs]),
            **{f"{name} replies/s": _spread(rates) for name, rates in phases.items()},
        },
    }


def _spread(values: Sequence[float | None]) -> dict[str, Any]:
    present = sorted(float(v) for v in values if v is not None)
    return {
        "median": _median(present),
        "min": present[0] if present else None,
        "max": present[-1] if present else None,
        "missing": len(values) - len(present),
    }


def render_summary(summary: Mapping[str, Any]) -> str:
    """The summary of several runs as Markdown tables."""
    s = summary
    rows = [
        ("requests sent / replies received (all rounds)", f"{s['sent']} / {s['replies']}"),
        ("lost / wrong / duplicates delivered / error replies (all rounds)",
         f"{s['lost']} / {s['wrong']} / {s['duplicates_delivered']} / {s['errors']}"),
        ("worker SIGKILLs / broker restarts (all rounds)",
         f"{s['worker_kills']} / {s['broker_restarts']}"),
        ("requests run more than once / where the first worker survived / of those, "
         "first run by a dcp.Worker (all rounds)",
         f"{s.get('reruns', '-')} / {s.get('reruns_worker_survived', '-')} / "
         f"{s.get('reruns_worker_survived_dcp', '-')}"),
        ("hung requests answered / by another worker process",
         f"{s['hangs_answered']} / {s['hangs_elsewhere']} of {s['hangs']}"),
    ]  # fmt: skip
    out = ["| figure (totals) | value |", "|---|---:|"]
    out += [f"| {name} | {value} |" for name, value in rows]
    out += ["", "| figure | median | min | max |", "|---|---:|---:|---:|"]
    for name, sp in s["spread"].items():
        never = f" ({sp['missing']} never)" if sp["missing"] else ""
        cells = (_fmt_num(sp["median"]), _fmt_num(sp["min"]), _fmt_num(sp["max"]))
        out.append(f"| {name} | {cells[0]}{never} | {cells[1]} | {cells[2]} |")
    return "\n".join(out)


def _fmt_num(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}"
