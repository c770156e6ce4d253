"""Issue 16's goals for the broker alone, in one run of many interleaved rounds.

``python -m benchmarks.broker_goals [--rounds 8]``

Each round starts, in a rotated order, the dcp broker, the minimal synchronous broker and
majortomo's broker, each with the 4 common echo workers, and runs the common load generator
(16 B) at 1 and at 64 requests in flight. Prints each run, then the medians of the
same-round ratios dcp / minimal and dcp / majortomo for p50 latency, throughput and broker
CPU per request (all threads), and the median *other load* (CPUs' worth of foreign work
during the runs). Shorter than ``benchmarks.run`` (16 B only), so more rounds fit.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .procs import Procs
from .variants import VARIANTS, Load, start

__all__ = ["main"]

NAMES = ("dcp", "minimal", "majortomo")
LOADS = (Load(16, 1, 200, 10_000, 2.0), Load(16, 64, 1000, 40_000, 2.5))
FIGURES = ("p50_us", "rate", "broker_cpu_us")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.broker_goals", description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--scale", type=float, default=1.0, help="of each load's duration")
    args = parser.parse_args(argv)
    loads = [Load(x.payload, x.window, x.warmup, x.count, x.duration * args.scale) for x in LOADS]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        order = NAMES[r % len(NAMES) :] + NAMES[: r % len(NAMES)]
        for name in order:
            with (
                tempfile.TemporaryDirectory(prefix="dcp-goals-") as tmp,
                Procs(Path(tmp)) as procs,
            ):
                running = start(procs, VARIANTS[name])
                for load in loads:
                    result = running.run(procs, load)
                    runs.setdefault((name, load.window), []).append(result)
                    print(
                        f"round {r} {name} window {load.window}: {result['rate']:.0f} req/s, "
                        f"p50 {result['p50_us']:.0f} us, broker {result['broker_cpu_us']:.1f} "
                        f"us/req, other load {result['foreign_load']:.2f}",
                        flush=True,
                    )
    print("| window | figure | dcp | other | dcp / other (median of same-round ratios) |")
    print("|---|---|---|---|---|")
    for load in loads:
        w = load.window
        mine = runs[("dcp", w)]
        for figure in FIGURES:
            for other in NAMES[1:]:
                theirs = runs[(other, w)]
                ratios = [a[figure] / b[figure] for a, b in zip(mine, theirs, strict=True)]
                print(
                    f"| {w} | {figure} | {statistics.median(x[figure] for x in mine):,.1f} "
                    f"| {other} {statistics.median(x[figure] for x in theirs):,.1f} "
                    f"| {statistics.median(ratios):.2f}x |"
                )
    load_median = statistics.median(x["foreign_load"] for v in runs.values() for x in v)
    print(f"other load: median {load_median:.2f} CPUs")


if __name__ == "__main__":
    main()
