"""What tracing costs a client: CPU per request with tracing off, before and after a change,
and with tracing on.

``python -m benchmarks.tracing --base REV [--rounds 5] [--windows 1,64] [--mode async|sync]``

One dcp broker and the common echo workers (4 sockets), from this checkout, serve every run.
Each round runs, for each window and in an order rotated by round, one client process of
:mod:`benchmarks.dcp_peers` (``dcp.Client`` on trio, or ``dcp.SyncClient``) per case:

- ``base``: ``REV``'s dcp and its ``benchmarks.dcp_peers`` (checked out in a temporary
  ``git worktree``), tracing off (there was none);
- ``off``: this tree, tracing off;
- ``on``: this tree, ``--trace`` (an OpenTelemetry SDK provider, batch processor, spans
  dropped on export: the client's own cost, no network export).

It prints the medians of the client's CPU per request (from ``/proc``), p50 latency and
rate per case and window, and the medians of the same-round ratios ``off / base`` and
``on / off``. Every process is killed by its PID when its run ends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .ab import _tree
from .procs import ROOT, Procs
from .variants import start_broker, start_echo_workers

__all__ = ["main"]

CASES = ("base", "off", "on")
FIGURES = ("client_cpu_us", "p50_us", "rate")


def _client(
    tree: Path, endpoint: str, broker_pid: int, window: int, args: argparse.Namespace, trace: bool
) -> dict[str, float]:
    """One client process from ``tree``: its result record."""
    command = [sys.executable, "-m", "benchmarks.dcp_peers", "client", "--mode", args.mode]
    if trace:
        command.append("--trace")
    command += ["--endpoint", endpoint, "--window", str(window), "--count", str(args.count)]
    command += ["--duration", str(args.duration), "--broker-pid", str(broker_pid)]
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        command, cwd=tree, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"client from {tree} failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if result.get("lost"):
        raise RuntimeError(f"{result['lost']} requests lost")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing", description=__doc__)
    parser.add_argument("--base", required=True, help="the revision before the change")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--windows", default="1,64")
    parser.add_argument("--mode", choices=["async", "sync"], default="async")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--duration", type=float, default=3.0)
    args = parser.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    figures: dict[tuple[str, int], list[dict[str, float]]] = {
        (case, w): [] for case in CASES for w in windows
    }
    with (
        _tree(args.base) as base,
        tempfile.TemporaryDirectory(prefix="dcp-trace-") as logs,
        Procs(Path(logs)) as procs,
    ):
        endpoint, _, broker_pid = start_broker(procs, "dcp")
        start_echo_workers(procs, endpoint, "dcp", 4)
        trees = {"base": base, "off": ROOT, "on": ROOT}
        for rnd in range(args.rounds):
            for window in windows:
                order = CASES[rnd % 3 :] + CASES[: rnd % 3]
                for case in order:
                    result = _client(
                        trees[case], endpoint, broker_pid, window, args, trace=case == "on"
                    )
                    figures[case, window].append(result)
                    print(
                        f"round {rnd} w{window} {case}: client {result['client_cpu_us']:.1f} "
                        f"us/req, p50 {result['p50_us']:.0f} us, {result['rate']:.0f} req/s",
                        file=sys.stderr,
                    )
    print(f"client: dcp.{'Client (trio)' if args.mode == 'async' else 'SyncClient'}")
    print("| window | case | client CPU us/req | p50 us | req/s |")
    print("|---|---|---|---|---|")
    for window in windows:
        for case in CASES:
            runs = figures[case, window]
            med = {f: statistics.median(r[f] for r in runs) for f in FIGURES}
            print(
                f"| {window} | {case} | {med['client_cpu_us']:.1f} | {med['p50_us']:.0f} "
                f"| {med['rate']:.0f} |"
            )
    for window in windows:
        cpu = {c: [r["client_cpu_us"] for r in figures[c, window]] for c in CASES}
        off = statistics.median(o / b for b, o in zip(cpu["base"], cpu["off"], strict=True))
        on = statistics.median(n / o for o, n in zip(cpu["off"], cpu["on"], strict=True))
        print(f"window {window}: client CPU off/base {off:.3f}, on/off {on:.3f}")


if __name__ == "__main__":
    main()
