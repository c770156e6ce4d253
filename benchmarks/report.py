"""Turn the suite's raw records into ``performance.md`` and PNG plots (matplotlib, Agg).

``python -m benchmarks.report [docs/perf/results.json] [--out docs]`` re-renders the page
from saved records. Every figure is a median over rounds; every ratio is the median of the
ratios measured in the same round.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .sections import kept_sections

__all__ = ["Target", "evaluate_targets", "main", "write"]

Rec = dict[str, Any]
KIB = 1024
MIB = 1024 * 1024

#: Reference variants of the targets.
DCP, MINIMAL, MAJORTOMO, PROXY = "dcp", "minimal", "majortomo", "zmq.proxy"


def _size(n: int) -> str:
    if n >= MIB:
        return f"{n // MIB} MiB"
    if n >= KIB:
        return f"{n // KIB} KiB"
    return f"{n} B"


def _median(xs: Iterable[float]) -> float | None:
    values = [x for x in xs if x is not None]
    return statistics.median(values) if values else None


def _ok(records: Iterable[Rec]) -> list[Rec]:
    return [r for r in records if "error" not in r]


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    if digits == 0 and abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:,.{max(digits, 1) if abs(x) < 100 else digits}f}"


class Main:
    """Median figures and same-round ratios of the main matrix."""

    def __init__(self, records: Sequence[Rec], variants: Sequence[str]) -> None:
        self.records = list(records)
        self.variants = [v for v in variants if any(r["variant"] == v for r in records)]
        self.by: dict[tuple[str, int, int], list[Rec]] = defaultdict(list)
        for r in _ok(records):
            self.by[(r["variant"], r["payload"], r["window"])].append(r)
        self.configs = sorted(
            {(r["payload"], r["window"]) for r in records}, key=lambda c: (c[0], -c[1])
        )

    def median(self, variant: str, payload: int, window: int, key: str) -> float | None:
        recs = self.by.get((variant, payload, window), [])
        return _median(float(r[key]) for r in recs if r.get(key) is not None)

    def ratio(self, a: str, b: str, payload: int, window: int, key: str) -> float | None:
        """Median over rounds of ``a[key] / b[key]`` measured in the same round."""
        ra = {r["round"]: r for r in self.by.get((a, payload, window), [])}
        rb = {r["round"]: r for r in self.by.get((b, payload, window), [])}
        ratios = [
            ra[k][key] / rb[k][key] for k in ra.keys() & rb.keys() if rb[k][key] and ra[k][key]
        ]
        return _median(ratios)

    def lost(self, variant: str, payload: int, window: int) -> int:
        return sum(int(r["lost"]) for r in self.by.get((variant, payload, window), []))

    def runs(self, variant: str, payload: int, window: int) -> tuple[int, int]:
        total = sum(
            1
            for r in self.records
            if (r["variant"], r["payload"], r["window"]) == (variant, payload, window)
        )
        return len(self.by.get((variant, payload, window), [])), total


@dataclass
class Target:
    name: str
    measured: str
    met: bool | None
    note: str = ""

    @property
    def verdict(self) -> str:
        return {True: "**met**", False: "**not met**", None: "not measured"}[self.met]


def _cmp(x: float | None, limit: float, below: bool) -> bool | None:
    if x is None:
        return None
    return x <= limit if below else x >= limit


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def evaluate_targets(results: Rec) -> list[Target]:
    """The targets of issue 4, each with the measured ratio."""
    m = Main(results["main"], list(results.get("variants", {})))
    t: list[Target] = []
    small = 16
    r = m.ratio(DCP, MINIMAL, small, 64, "broker_cpu_us")
    t.append(
        Target(
            "dcp broker CPU per request <= the minimal sync broker's (16 B, window 64)",
            f"{_x(r)} (dcp {_fmt(m.median(DCP, small, 64, 'broker_cpu_us'), 1)} us vs "
            f"{_fmt(m.median(MINIMAL, small, 64, 'broker_cpu_us'), 1)} us)",
            _cmp(r, 1.0, below=True),
            "process CPU (all threads); Python threads only: "
            + _x(m.ratio(DCP, MINIMAL, small, 64, "broker_thread_cpu_us")),
        )
    )
    r = m.ratio(DCP, MAJORTOMO, small, 64, "rate")
    t.append(
        Target(
            "dcp throughput >= 1.4x majortomo's (16 B, window 64, same load generator)",
            f"{_x(r)} ({_fmt(m.median(DCP, small, 64, 'rate'))} vs "
            f"{_fmt(m.median(MAJORTOMO, small, 64, 'rate'))} req/s)",
            _cmp(r, 1.4, below=False),
            "dcp-own vs majortomo-own: "
            + _x(m.ratio("dcp-own", "majortomo-own", small, 64, "rate"))
            + "; dcp vs majortomo-cli (as shipped, logging every message): "
            + _x(m.ratio(DCP, "majortomo-cli", small, 64, "rate")),
        )
    )
    r = m.ratio(DCP, MINIMAL, small, 64, "rate")
    t.append(
        Target(
            "dcp throughput >= 0.95x the minimal sync broker's (16 B, window 64)",
            f"{_x(r)} ({_fmt(m.median(DCP, small, 64, 'rate'))} vs "
            f"{_fmt(m.median(MINIMAL, small, 64, 'rate'))} req/s)",
            _cmp(r, 0.95, below=False),
        )
    )
    r = m.ratio(DCP, MINIMAL, small, 1, "p50_us")
    t.append(
        Target(
            "dcp window-1 p50 latency <= 1.1x the minimal sync broker's (16 B)",
            f"{_x(r)} ({_fmt(m.median(DCP, small, 1, 'p50_us'))} vs "
            f"{_fmt(m.median(MINIMAL, small, 1, 'p50_us'))} us)",
            _cmp(r, 1.1, below=True),
        )
    )
    for name, spread, net, control in _sweep_spreads(results.get("sweeps", [])):
        t.append(
            Target(
                f"dcp broker CPU per request flat within 15% across the {name} sweep",
                f"max/min {spread:.2f}x",
                spread <= 1.15,
                f"net of idle heartbeat load: {net:.2f}x; minimal broker (control): "
                + _x(control),
            )
        )
    cli = _client_ratios(results.get("clients", []))
    for kind, limit in (("dcp.Client (trio)", 1.3), ("dcp.Client (asyncio)", 1.3)):
        r = cli.get((kind, 64))
        t.append(
            Target(
                f"{kind} CPU per request <= {limit}x a plain pyzmq pipelined loop (window 64)",
                _x(r),
                _cmp(r, limit, below=True),
                "window 1: " + _x(cli.get((kind, 1))),
            )
        )
    r = cli.get(("dcp.SyncClient", 64))
    t.append(
        Target(
            "dcp.SyncClient CPU per request <= 1.1x a plain pyzmq pipelined loop (window 64)",
            _x(r),
            _cmp(r, 1.1, below=True),
            "window 1: " + _x(cli.get(("dcp.SyncClient", 1))),
        )
    )
    t.append(_copy_target(m, results["machine"].get("memcpy_4mib_us")))
    return t


def _copy_target(m: Main, memcpy_us: float | None) -> Target:
    """4 MiB forwarded without copying in Python.

    The broker's *main-thread* CPU per request at 4 MiB (window 1) above its 16 B figure is
    what handling the payload costs in Python. It is calibrated by two brokers measured in
    the same rounds: the minimal broker (``recv`` with ``copy=True``: every payload is copied
    into a new ``bytes`` on each hop) and zmq.proxy (libzmq moves message pointers: no
    copy). Met if dcp's extra is within a quarter of the way from zmq.proxy's to minimal's.
    """
    big = 4 * MIB

    def extra(v: str) -> float | None:
        a = m.median(v, big, 1, "broker_thread_cpu_us")
        b = m.median(v, 16, 1, "broker_thread_cpu_us")
        return None if a is None or b is None else a - b

    d, copy, none = extra(DCP), extra(MINIMAL), extra(PROXY)
    name = "4 MiB payloads forwarded without copying in Python"
    if d is None or copy is None or none is None or copy <= none:
        return Target(name, "-", None, "needs dcp, minimal and zmq.proxy at 16 B and 4 MiB")
    where = (d - none) / (copy - none)
    peak = m.median(DCP, big, 64, "broker_peak_growth_mb")
    return Target(
        name,
        f"{where:.2f} of the way from no copy to copy (extra main-thread CPU per 4 MiB "
        f"request: dcp {d:,.0f} us, minimal {copy:,.0f} us, zmq.proxy {none:,.0f} us)",
        where <= 0.25,
        f"one warm 4 MiB memcpy here: {memcpy_us or 0:.0f} us; dcp peak RSS growth at "
        f"window 64: {_fmt(peak)} MiB (64 x 4 MiB in flight)",
    )


def _sweep_groups(records: Sequence[Rec]) -> dict[str, dict[str, dict[int, list[Rec]]]]:
    """sweep -> broker -> x -> records."""
    out: dict[str, dict[str, dict[int, list[Rec]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for r in _ok(records):
        out[r["sweep"]][r.get("broker", DCP)][r["x"]].append(r)
    return out


def _spread(points: dict[int, list[Rec]], key: str) -> float | None:
    """max / min over the points of the median of ``key``."""
    values = [v for v in (_median(r[key] for r in recs) for recs in points.values()) if v]
    return max(values) / min(values) if len(values) >= 2 else None


def _sweep_spreads(records: Sequence[Rec]) -> list[tuple[str, float, float, float | None]]:
    """(sweep, dcp raw spread, dcp net spread, control's raw spread)."""
    out = []
    for name, brokers in _sweep_groups(records).items():
        raw = _spread(brokers.get(DCP, {}), "broker_cpu_us")
        net = _spread(brokers.get(DCP, {}), "net_cpu_us")
        if raw is not None:
            control = _spread(brokers.get(MINIMAL, {}), "broker_cpu_us")
            out.append((name, raw, net if net is not None else float("nan"), control))
    return out


def _client_ratios(records: Sequence[Rec]) -> dict[tuple[str, int], float]:
    """Median over rounds of (kind CPU per request / plain loop's), per window."""
    base = "plain pyzmq loop"
    by: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for r in _ok(records):
        by[(r["client"], r["window"])][r["round"]] = r["client_cpu_us"]
    out = {}
    for (kind, window), rounds in by.items():
        ref = by.get((base, window), {})
        ratios = [v / ref[k] for k, v in rounds.items() if ref.get(k)]
        m = _median(ratios)
        if m is not None:
            out[(kind, window)] = m
    return out


# --------------------------------------------------------------------------- plots


def _plots(results: Rec, perf: Path) -> list[str]:
    try:
        import matplotlib
    except ImportError:  # the ``bench`` extra is not installed: tables only
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []
    m = Main(results["main"], list(results.get("variants", {})))
    payloads = sorted({p for p, _ in m.configs})
    if m.variants and payloads:
        for key, title, fname, log in (
            ("rate", "requests/s (higher is better)", "throughput.png", True),
            (
                "broker_cpu_us",
                "broker CPU us per request (lower is better)",
                "broker_cpu.png",
                True,
            ),
        ):
            fig, axes = plt.subplots(
                1, len(payloads), figsize=(5 * len(payloads), 4.2), squeeze=False
            )
            for ax, payload in zip(axes[0], payloads, strict=True):
                windows = sorted({w for p, w in m.configs if p == payload}, reverse=True)
                width = 0.8 / max(1, len(windows))
                for j, w in enumerate(windows):
                    ys = [m.median(v, payload, w, key) or 0.0 for v in m.variants]
                    xs = [i + j * width for i in range(len(m.variants))]
                    ax.bar(xs, ys, width, label=f"window {w}")
                ax.set_xticks([i + width * (len(windows) - 1) / 2 for i in range(len(m.variants))])
                ax.set_xticklabels(m.variants, rotation=35, ha="right", fontsize=8)
                ax.set_title(_size(payload))
                if log:
                    ax.set_yscale("log")
                ax.grid(axis="y", alpha=0.3)
                ax.legend(fontsize=8)
            fig.suptitle(title)
            fig.tight_layout()
            fig.savefig(perf / fname, dpi=90)
            plt.close(fig)
            written.append(fname)

        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
        for ax, w in zip(axes, (1, 64), strict=True):
            p50 = [m.median(v, 16, w, "p50_us") or 0.0 for v in m.variants]
            p99 = [m.median(v, 16, w, "p99_us") or 0.0 for v in m.variants]
            xs = list(range(len(m.variants)))
            ax.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
            ax.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
            ax.set_xticks(xs)
            ax.set_xticklabels(m.variants, rotation=35, ha="right", fontsize=8)
            ax.set_title(f"16 B, window {w}: latency (us)")
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(perf / "latency.png", dpi=90)
        plt.close(fig)
        written.append("latency.png")

    groups = _sweep_groups(results.get("sweeps", []))
    if groups:
        names = list(groups)
        fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 7), squeeze=False)
        for col, name in enumerate(names):
            for row, key in enumerate(("broker_cpu_us", _mem_key(name))):
                ax = axes[row][col]
                for broker, style, color in ((DCP, "-", "C0"), (MINIMAL, ":", "C2")):
                    points = groups[name].get(broker)
                    if not points:
                        continue
                    pts = sorted(points)
                    for x in pts:
                        ys = [r[key] for r in points[x]]
                        ax.scatter([x] * len(ys), ys, s=8, alpha=0.35, color="gray")
                    med = [_median(r[key] for r in points[x]) or 0.0 for x in pts]
                    ax.plot(pts, med, marker="o", linestyle=style, color=color, label=broker)
                    if key == "broker_cpu_us" and broker == DCP:
                        net = [_median(r["net_cpu_us"] for r in points[x]) or 0.0 for x in pts]
                        ax.plot(
                            pts,
                            net,
                            marker="x",
                            linestyle="--",
                            color="C1",
                            label="dcp, net of idle",
                        )
                if key == "broker_cpu_us":
                    ax.set_ylim(bottom=0)
                ax.legend(fontsize=7)
                ax.set_xscale("log")
                ax.set_xlabel(_SWEEP_X[name])
                ax.set_ylabel("broker CPU us/request" if row == 0 else _SWEEP_MEM[name])
                ax.grid(alpha=0.3)
        fig.suptitle("dcp broker sweeps, minimal broker as control (16 B payloads)")
        fig.tight_layout()
        fig.savefig(perf / "sweeps.png", dpi=90)
        plt.close(fig)
        written.append("sweeps.png")

    clients = _ok(results.get("clients", []))
    if clients:
        kinds = list(dict.fromkeys(r["client"] for r in clients))
        windows = sorted({r["window"] for r in clients}, reverse=True)
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / len(windows)
        for j, w in enumerate(windows):
            ys = [
                _median(
                    r["client_cpu_us"] for r in clients if r["client"] == k and r["window"] == w
                )
                or 0.0
                for k in kinds
            ]
            ax.bar([i + j * width for i in range(len(kinds))], ys, width, label=f"window {w}")
        ax.set_xticks([i + width * (len(windows) - 1) / 2 for i in range(len(kinds))])
        ax.set_xticklabels(kinds, rotation=20, ha="right", fontsize=8)
        ax.set_title("client process CPU us per request (16 B, dcp broker)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(perf / "clients.png", dpi=90)
        plt.close(fig)
        written.append("clients.png")
    return written


_SWEEP_X = {
    "workers": "idle workers connected (+4 busy)",
    "services": "services (one idle worker each)",
    "clients": "client sockets",
    "queued": "requests in flight (queued in the broker)",
}
_SWEEP_MEM = {
    "workers": "RSS KiB per idle worker",
    "services": "RSS KiB per service",
    "clients": "broker RSS MiB",
    "queued": "peak RSS KiB per queued request",
}


def _mem_key(sweep: str) -> str:
    return "broker_rss_mb" if sweep == "clients" else "mem_per_item_kib"


# --------------------------------------------------------------------------- markdown


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _bind(m: Main, v: str, payload: int, window: int) -> Callable[[str], float | None]:
    return lambda key: m.median(v, payload, window, key)


def _main_section(m: Main) -> list[str]:
    out: list[str] = []
    for payload, window in m.configs:
        out += ["", f"### {_size(payload)}, window {window}", ""]
        rows = []
        for v in m.variants:
            ok, total = m.runs(v, payload, window)
            med = _bind(m, v, payload, window)
            peak = med("broker_peak_growth_mb")
            rows.append(
                [
                    v,
                    _fmt(med("rate")),
                    _fmt(med("p50_us")),
                    _fmt(med("p99_us")),
                    _fmt(med("broker_cpu_us"), 1),
                    _fmt(med("broker_thread_cpu_us"), 1),
                    _fmt(peak, 1) if peak is not None and peak >= 0 else "-",
                    _fmt(med("client_cpu_us"), 1),
                    str(m.lost(v, payload, window)),
                    f"{ok}/{total}",
                    _x(m.ratio(v, DCP, payload, window, "rate")),
                    _x(m.ratio(v, DCP, payload, window, "broker_cpu_us")),
                    _fmt(med("foreign_load"), 2),
                ]
            )
        out += _table(
            [
                "variant",
                "req/s",
                "p50 us",
                "p99 us",
                "broker CPU us/req",
                "broker Python threads us/req",
                "broker peak RSS growth MiB",
                "client CPU us/req",
                "lost",
                "runs ok",
                "req/s vs dcp",
                "CPU vs dcp",
                "other load (CPUs)",
            ],
            rows,
        )
    return out


def _ratio_matrix(m: Main, payload: int, window: int, key: str) -> list[str]:
    rows = [
        [a] + [_x(m.ratio(a, b, payload, window, key)) for b in m.variants] for a in m.variants
    ]
    return _table(["row / column", *m.variants], rows)


def _sweep_section(records: Sequence[Rec]) -> list[str]:
    out: list[str] = []
    for name, brokers in _sweep_groups(records).items():
        rows = []
        xs = sorted({x for points in brokers.values() for x in points})
        for x in xs:
            for broker in (DCP, MINIMAL):
                recs = brokers.get(broker, {}).get(x)
                if not recs:
                    continue
                mem = _median(r[_mem_key(name)] for r in recs)
                rows.append(
                    [
                        str(x),
                        broker,
                        _fmt(_median(r["rate"] for r in recs)),
                        _fmt(_median(r["broker_cpu_us"] for r in recs), 1),
                        _fmt(_median(r["net_cpu_us"] for r in recs), 1),
                        _fmt(_median(r["idle_cpu_per_s"] * 100 for r in recs), 1),
                        _fmt(_median(r["p50_us"] for r in recs)),
                        _fmt(_median(r["broker_rss_mb"] for r in recs), 1),
                        _fmt(mem, 2),
                        str(sum(int(r["lost"]) for r in recs)),
                    ]
                )
        out += ["", f"### {name}: {_SWEEP_X[name]}", ""]
        out += _table(
            [
                "x",
                "broker",
                "req/s",
                "broker CPU us/req",
                "net of idle load",
                "idle broker CPU %",
                "p50 us",
                "broker RSS MiB",
                _SWEEP_MEM[name],
                "lost",
            ],
            rows,
        )
    return out


def _client_section(records: Sequence[Rec]) -> list[str]:
    recs = _ok(records)
    if not recs:
        return []
    ratios = _client_ratios(records)
    kinds = list(dict.fromkeys(r["client"] for r in recs))
    windows = sorted({r["window"] for r in recs}, reverse=True)
    rows = []
    for k in kinds:
        for w in windows:
            sel = [r for r in recs if r["client"] == k and r["window"] == w]
            if not sel:
                continue
            rows.append(
                [
                    k,
                    str(w),
                    _fmt(_median(r["client_cpu_us"] for r in sel), 1),
                    _x(ratios.get((k, w))),
                    _fmt(_median(r["rate"] for r in sel)),
                    _fmt(_median(r["p50_us"] for r in sel)),
                    str(sum(int(r["lost"]) for r in sel)),
                ]
            )
    return _table(
        [
            "load generator",
            "window",
            "client CPU us/req",
            "vs plain loop",
            "req/s",
            "p50 us",
            "lost",
        ],
        rows,
    )


def render(results: Rec, plots: Sequence[str]) -> str:
    mach = results["machine"]
    m = Main(results["main"], list(results.get("variants", {})))
    targets = evaluate_targets(results)
    v = mach.get("versions", {})
    lines = [
        "# Performance",
        "",
        "Generated by the benchmark suite in `benchmarks/` (do not edit by hand). Made with:",
        "",
        "```console",
        f"$ {results.get('command') or 'scripts/bench'}",
        "```",
        "",
        f"Profile `{results['profile']}`, {results['rounds']} interleaved round(s), "
        f"{results.get('duration_s', 0):.0f} s in all, on {mach['date']}.",
        "",
        f"Machine: {mach['nproc']} CPUs ({mach['cpu']}), {mach['memory_gib']} GiB, "
        f"{mach['kernel']}; Python {mach['python']}, pyzmq {mach['pyzmq']}, libzmq "
        f"{mach['libzmq']}; dcp {v.get('dcp', '?')} (commit {mach.get('commit') or '?'}), "
        f"anyio {v.get('anyio', '?')}, trio {v.get('trio', '?')}, majortomo "
        f"{v.get('majortomo', '?')}.",
        "",
        "## How it is measured",
        "",
        "Every variant runs as separate processes over `tcp://127.0.0.1`: the broker, one "
        "process holding the 4 echo workers, and one load-generating process per measured "
        "load. The load generator keeps *window* requests in flight, first a warm-up (not "
        "measured), then the measured phase (bounded in count and time), then waits a "
        "bounded time for the outstanding replies: any that never came are *lost*. The "
        "broker's CPU is read from the OS (`utime + stime` of `/proc/<pid>/stat`, all threads "
        "including libzmq's I/O thread; and of its main thread alone) just before the first "
        "measured request and just after the last reply. Latency is per request, from send "
        "to reply. Each round starts every variant afresh, in a rotated order; figures are "
        "medians over rounds and ratios are medians of same-round ratios. The machine is "
        "shared and noisy: differences under ~10% are not significant.",
        "",
        _load_summary(results),
        "",
        "Variants:",
        "",
    ]
    lines += [f"- **{name}**: {desc}" for name, desc in results.get("variants", {}).items()]
    lines += ["", "## Targets (issue 4)", ""]
    lines += _table(
        ["target", "measured", "verdict", "note"],
        ([t.name, t.measured, t.verdict, t.note] for t in targets),
    )
    if m.variants:
        lines += ["", "## Throughput, latency, CPU per request", ""]
        for p in plots:
            if p in ("throughput.png", "broker_cpu.png", "latency.png"):
                lines += [f"![{p[:-4]}](perf/{p})", ""]
        lines += _main_section(m)
        for window in (64, 1):
            if (16, window) not in m.configs:
                continue
            for key, label in (
                ("rate", "throughput"),
                ("broker_cpu_us", "broker CPU per request"),
            ):
                lines += ["", f"### Same-round {label} ratios (16 B, window {window})", ""]
                lines += _ratio_matrix(m, 16, window, key)
    if results.get("clients"):
        lines += [
            "",
            "## Client CPU per request",
            "",
            "CPU seconds of the load-generating process (all its threads) per request, "
            "against the `dcp broker` and the common echo workers. The plain loop is the "
            "common load generator: one DEALER, ids in the metadata, a dict of pending "
            "requests, latency bookkeeping; dcp's clients do the same bookkeeping around "
            "`map_unordered` (window 64) and `request` (window 1).",
            "",
        ]
        if "clients.png" in plots:
            lines += ["![clients](perf/clients.png)", ""]
        lines += _client_section(results["clients"])
    if results.get("sweeps"):
        lines += [
            "",
            "## Sweeps of the dcp broker",
            "",
            "Fresh `dcp broker`, 4 busy echo workers on `echo`, 16 B payloads, window 64 "
            "unless the sweep varies it. The minimal broker runs the same points as a "
            "*control*: it has no per-request scan by construction, so a rise in its curve is "
            "the harness (fewer messages per wake-up, more sockets to poll), not a broker "
            "cost. Idle workers ping once a second (the default heartbeat), which costs the "
            "broker CPU while idle: the *net* column subtracts the broker's CPU rate measured "
            "for a second before the load.",
            "",
        ]
        if "sweeps.png" in plots:
            lines += ["![sweeps](perf/sweeps.png)", ""]
        lines += _sweep_section(results["sweeps"])
    failures = [
        r for sec in ("main", "clients", "sweeps") for r in results.get(sec, []) if "error" in r
    ]
    if failures:
        lines += ["", "## Failed runs", ""]
        for r in failures[:20]:
            what = {
                k: r[k]
                for k in ("variant", "client", "sweep", "x", "payload", "window", "round")
                if k in r
            }
            first = str(r["error"]).splitlines()[0]
            lines.append(f"- {what}: {first}")
    lines += [
        "",
        "## Notes",
        "",
        "- *majortomo* runs its `Broker` class with logging unconfigured (its per-message "
        "`log.info` calls are filtered out): its best case. *majortomo-cli* runs "
        "`python -m majortomo.broker` as shipped, which logs every message at INFO. "
        "majortomo's client allows one request in flight, so its window is that many "
        "clients. MDP 0.2 is a leaner wire format: a request's four trips through the "
        "broker carry 29 frames against DCP's 37 (no metadata delimiters, no service frame "
        "to the worker, no client-address frame back to the client), and each frame is a "
        "receive or a send in Python.",
        "- *dcp-mdp* and *dcp-majortomo-own* run the peers of *majortomo* and "
        "*majortomo-own* (MDP 0.2, majortomo's variant) through `dcp broker`: only the "
        "broker differs (`python -m benchmarks.mdp_peers` measures just these pairs).",
        "- The minimal broker does no heartbeat expiry, redelivery, validation, limits or "
        "statistics: it is the floor of per-request Python work, not a usable broker.",
        "- zmq.proxy does no routing by service and no readiness: its figures are the cost "
        "of moving the bytes (libzmq and the kernel) on this machine.",
        "- Broker peak RSS growth is the kernel's `VmHWM` (reset at the start of the window) "
        "minus the RSS at the start; the allocator keeps freed memory, so it shows growth "
        "beyond what earlier loads left, not every copy. The copy target therefore uses the "
        "broker's main-thread CPU: copying 4 MiB in Python costs a measurable, known time.",
        "",
    ]
    return "\n".join(lines)


def _load_summary(results: Rec) -> str:
    loads = [
        float(r["foreign_load"])
        for sec in ("main", "clients", "sweeps")
        for r in _ok(results.get(sec, []))
        if "foreign_load" in r
    ]
    if not loads:
        return ""
    busy = sum(1 for x in loads if x > 0.25)
    return (
        "*Other load*: CPUs' worth of work done on the machine by processes other than the "
        "measured ones during each window (`/proc/stat`). Median "
        f"{statistics.median(loads):.2f}, max {max(loads):.2f}; {busy} of {len(loads)} "
        "windows above 0.25 CPU. On a 2-CPU machine, anything above that skews the figures."
    )


def write(results: Rec, out_dir: Path) -> Path:
    """Write the plots into ``out_dir/perf`` and ``out_dir/performance.md``."""
    perf = out_dir / "perf"
    perf.mkdir(parents=True, exist_ok=True)
    plots = _plots(results, perf)
    page = out_dir / "performance.md"
    kept = kept_sections(page.read_text()) if page.exists() else ""
    page.write_text(render(results, plots) + kept)
    return page


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument("results", type=Path, nargs="?", default=Path("docs/perf/results.json"))
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    print(write(results, args.out))


if __name__ == "__main__":
    main()
