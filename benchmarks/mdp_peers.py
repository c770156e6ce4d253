"""MDP peers through the dcp broker against the same peers through majortomo's broker.

``python -m benchmarks.mdp_peers [--rounds 7] [--tiny] [--page docs/performance.md |
--no-page] [--json FILE] [--render JSON]``

Two pairs of variants (:mod:`benchmarks.variants`), where only the broker differs:

- *common MDP peers*: the common load generator and echo workers in MDP 0.2 mode
  (majortomo's variant of it), through majortomo 0.2.0's ``Broker`` (*majortomo*) and
  through ``dcp broker`` (*dcp-mdp*);
- *majortomo's own peers*: majortomo's ``Client`` (one per request in flight) and
  ``Worker`` (one thread each), through majortomo's ``Broker`` (*majortomo-own*) and through
  ``dcp broker`` (*dcp-majortomo-own*).

Each round starts the four variants afresh in a rotated order (:func:`benchmarks.run.
run_main`) and runs 16 B requests at window 64 and window 1. The figures are medians over
rounds, the ratios medians of same-round ratios dcp / majortomo. The result is the
``mdp-peers`` section of ``docs/performance.md`` (:mod:`benchmarks.sections`, kept when
the suite regenerates the page) and the raw records in ``docs/perf/mdp_peers.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import raise_fd_limit
from .procs import ROOT
from .report import Main
from .run import Profile, exclusive, machine, run_main
from .sections import put_section
from .variants import VARIANTS, Load

__all__ = ["PAIRS", "main", "render_section", "run", "summarise"]

#: (peers, majortomo's broker, dcp's broker): variant names, only the broker differs.
PAIRS: tuple[tuple[str, str, str], ...] = (
    ("common MDP peers (load generator, echo workers)", "majortomo", "dcp-mdp"),
    ("majortomo's own Client and Worker", "majortomo-own", "dcp-majortomo-own"),
)
#: The issue's target: MDP peers through dcp at least as fast as through majortomo.
TARGET = 1.0
PAYLOAD = 16
LOADS = (Load(PAYLOAD, 64, 1000, 40_000, 2.5), Load(PAYLOAD, 1, 200, 10_000, 2.0))
TINY_LOADS = (Load(PAYLOAD, 64, 100, 1_000, 0.3), Load(PAYLOAD, 1, 20, 200, 0.2))
FIGURES = (("rate", "req/s"), ("p50_us", "p50 us"), ("broker_cpu_us", "broker CPU us/req"))


def _variants() -> list[str]:
    return [v for _, *pair in PAIRS for v in pair]


def run(rounds: int, tiny: bool, log_dir: Path) -> dict[str, Any]:
    """Run the pairs; return the raw records and what they were measured on."""
    raise_fd_limit()
    profile = Profile(
        name="mdp-peers",
        rounds=rounds,
        variants=tuple(_variants()),
        loads=TINY_LOADS if tiny else LOADS,
        client_loads=(),
        client_kinds=(),
    )
    started = time.monotonic()
    records = run_main(profile, profile.variants, log_dir)
    return {
        "rounds": rounds,
        "variants": {v: VARIANTS[v].description for v in profile.variants},
        "machine": machine(),
        "duration_s": round(time.monotonic() - started, 1),
        "main": records,
    }


def summarise(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per pair and window: medians of each side and same-round ratios."""
    m = Main(results["main"], list(results["variants"]))
    rows: list[dict[str, Any]] = []
    for window in sorted({int(r["window"]) for r in results["main"]}, reverse=True):
        for peers, theirs, ours in PAIRS:
            row: dict[str, Any] = {"window": window, "peers": peers, "ours": ours}
            for key, _ in FIGURES:
                row[key] = (
                    m.median(theirs, PAYLOAD, window, key),
                    m.median(ours, PAYLOAD, window, key),
                    m.ratio(ours, theirs, PAYLOAD, window, key),
                )
            row["runs"] = (m.runs(theirs, PAYLOAD, window), m.runs(ours, PAYLOAD, window))
            row["lost"] = m.lost(theirs, PAYLOAD, window) + m.lost(ours, PAYLOAD, window)
            loads = [
                float(r.get("foreign_load", 0.0))
                for r in results["main"]
                if r["variant"] in (theirs, ours) and r["window"] == window and "error" not in r
            ]
            row["other_load"] = (sorted(loads)[len(loads) // 2], max(loads)) if loads else None
            rows.append(row)
    return rows


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def render_section(results: dict[str, Any], command: str) -> str:
    """The ``mdp-peers`` section of ``docs/performance.md``."""
    mach = results["machine"]
    lines = [
        "## MDP peers: dcp's broker against majortomo's",
        "",
        "The same Majordomo (MDP 0.2, majortomo's variant) peers through majortomo 0.2.0's",
        "broker and through `dcp broker` (trio), which speaks MDP on its one port beside",
        "DCP; only the broker differs. Made with:",
        "",
        "```console",
        f"$ {command}",
        "```",
        "",
        f"{PAYLOAD} B requests, {results['rounds']} interleaved round(s) (each round starts "
        f"the four variants afresh in a rotated order), {results['duration_s']:.0f} s in all, "
        f"on {mach['date']}. {mach['nproc']} CPUs, {mach['kernel']}; Python {mach['python']}, "
        f"pyzmq {mach['pyzmq']}, libzmq {mach['libzmq']}; dcp commit {mach['commit']}, "
        f"majortomo {mach['versions'].get('majortomo', '?')}.",
        "",
        "- *common MDP peers*: the common load generator (one socket, *window* requests in",
        "  flight) and the 4 common echo workers (one process), in MDP mode: variants",
        "  *majortomo* and *dcp-mdp*.",
        "- *majortomo's own Client and Worker*: *window* `majortomo.Client`s (it allows one",
        "  request in flight each) and 4 `majortomo.Worker` threads in one process: variants",
        "  *majortomo-own* and *dcp-majortomo-own*.",
        "",
        f"Target: MDP peers through dcp at least as fast (req/s dcp / majortomo >= "
        f"{TARGET:.1f}x). *m*: majortomo's broker, *d*: dcp's; *d/m*: the median of the "
        "same-round ratios.",
        "",
        "| window | peers | req/s m | req/s d | d/m | p50 us m | p50 us d | d/m | "
        "broker CPU us/req m | broker CPU us/req d | d/m | target | lost | runs ok | "
        "other load (CPUs, median / max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summarise(results):
        cells = []
        for key, _ in FIGURES:
            theirs, ours, ratio = row[key]
            digits = 1 if key == "broker_cpu_us" else 0
            cells += [_num(theirs, digits), _num(ours, digits), _ratio(ratio)]
        ratio = row["rate"][2]
        verdict = "-" if ratio is None else "**met**" if ratio >= TARGET else "**not met**"
        (ok_a, all_a), (ok_b, all_b) = row["runs"]
        load = row["other_load"]
        lines.append(
            f"| {row['window']} | {row['peers']} | {' | '.join(cells)} | {verdict} | "
            f"{row['lost']} | {ok_a + ok_b}/{all_a + all_b} | "
            + ("-" if load is None else f"{load[0]:.2f} / {load[1]:.2f}")
            + " |"
        )
    lines += [
        "",
        "Broker CPU is the broker process's (all threads, `/proc`) over the measured window,",
        "per request. *Other load*: work done meanwhile by processes other than the broker,",
        "the workers and the load generator; on this shared 2-CPU machine differences under",
        "~10% are within the noise of single rounds: read the medians of the ratios.",
        "",
        "At window 1 each message wakes the broker on its own: dcp's broker pays an event",
        "loop's wake-up (trio: epoll, a task switch, a cancel scope) where majortomo's",
        "blocks in `zmq.Poller` (`python -m benchmarks.wake` measures the difference). At",
        "window 64 the wake-ups are shared by batches and the per-message work dominates.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.mdp_peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tiny", action="store_true", help="seconds: 1 round, short loads")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--no-page", action="store_true", help="print only")
    parser.add_argument(
        "--json", type=Path, default=None,
        help="save the raw records here (default with a page: perf/mdp_peers.json beside it)",
    )  # fmt: skip
    parser.add_argument(
        "--render", type=Path, default=None, metavar="JSON",
        help="only rewrite the page section from the records a --json run saved",
    )  # fmt: skip
    args = parser.parse_args(argv)
    command = f"python -m benchmarks.mdp_peers --rounds {args.rounds}"
    if args.tiny:
        args.rounds, args.no_page = 1, True
        command = "python -m benchmarks.mdp_peers --tiny"
    if args.render is not None:
        results = json.loads(args.render.read_text())
    else:
        # The tiny run (the smoke test) neither waits for nor blocks a real run.
        lock = exclusive(1800.0) if not args.tiny else contextlib.nullcontext()
        with lock, tempfile.TemporaryDirectory(prefix="dcp-bench-mdp-") as tmp:
            results = run(args.rounds, args.tiny, Path(tmp))
        results["command"] = command
        if args.json is None and not args.no_page:
            args.json = args.page.parent / "perf" / "mdp_peers.json"
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    section = render_section(results, results.get("command", command))
    print(section)
    if not args.no_page:
        page: Path = args.page
        text = page.read_text() if page.exists() else "# Performance\n"
        page.write_text(put_section(text, "mdp-peers", section))
        print(f"wrote the mdp-peers section of {page}", file=sys.stderr)
    failed = [r for r in results["main"] if "error" in r]
    if failed:
        print(f"{len(failed)} failed runs", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
