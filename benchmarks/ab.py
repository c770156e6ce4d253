"""The dcp broker from two source trees, side by side: did a change cost anything?

``python -m benchmarks.ab --base REV [--head REV] [--rounds 8] [--windows 1,64]``, or
``... --core`` for the broker cores alone, in process (``benchmarks/core_cycle.py``).

Either side's broker may get extra arguments (``--base-args``, ``--head-args``, e.g.
``--head-args "--http 127.0.0.1:0"``), so one tree can be compared with itself under other
options (``--base`` and ``--head`` default to the working tree). With ``--scrape-interval
S``, a scraper GETs ``/metrics`` from every side that serves HTTP once per ``S`` seconds
while the load runs (docs/operations.md has the endpoint's cost measured this way).

Each revision is checked out in a temporary ``git worktree`` (``--head`` defaults to the
working tree itself). Every round starts, for each window and in alternating order, a fresh
``python -m dcp broker`` from each tree, the common echo workers (4 sockets) and the common
load generator, all from *this* checkout, over ``tcp://127.0.0.1``; only the broker's code
differs. It prints the medians of broker CPU per request (all threads, from ``/proc``),
p50 latency and throughput, and the median of the same-round ratios head / base. Every
process is killed by its PID when its run ends; the worktrees are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from .procs import ROOT

__all__ = ["main"]

FIGURES = ("broker_cpu_us", "p50_us", "rate")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _tree(rev: str | None) -> Iterator[Path]:
    """A checkout of ``rev`` (``None``: this working tree), removed afterwards."""
    if rev is None:
        yield ROOT
        return
    with tempfile.TemporaryDirectory(prefix="dcp-ab-") as tmp:
        path = Path(tmp) / "tree"
        git = ["git", "-C", str(ROOT)]
        subprocess.run([*git, "worktree", "add", "--detach", "-q", str(path), rev], check=True)
        print(f"{rev} checked out in {path}", file=sys.stderr)
        try:
            yield path
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(path)], check=False)


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


class _Scraper:
    """GETs ``url`` every ``interval`` seconds (the first after half of one) until stopped."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        wait = self.interval / 2
        while not self._stop.wait(wait):
            with urllib.request.urlopen(self.url, timeout=10) as response:
                response.read()
            self.scrapes += 1
            wait = self.interval


def run_once(
    tree: Path,
    window: int,
    count: int,
    duration: float,
    broker_args: Sequence[str] = (),
    scrape_interval: float | None = None,
) -> dict[str, float]:
    """One broker from ``tree`` (with ``broker_args``) under the common load: the load
    generator's figures (and ``scrapes``: how many ``/metrics`` GETs it served meanwhile)."""
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    py = sys.executable
    env = dict(os.environ, PYTHONPATH=str(tree))
    broker = subprocess.Popen(
        [py, "-m", "dcp", "broker", "--bind", endpoint, *broker_args],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    procs = [broker]
    try:
        assert broker.stdout is not None
        broker.stdout.readline()  # the bound endpoint: it is listening
        # With --http, the next line is the HTTP endpoint's URL.
        url = broker.stdout.readline().strip() if "--http" in broker_args else None
        worker = subprocess.Popen(
            [py, "-m", "benchmarks.echo_worker", "--endpoint", endpoint, "--sockets", "4"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        procs.append(worker)
        assert worker.stdout is not None
        worker.stdout.readline()  # READY
        command = [py, "-m", "benchmarks.loadgen", "--endpoint", endpoint]
        command += ["--window", str(window), "--count", str(count)]
        command += ["--duration", str(duration), "--broker-pid", str(broker.pid)]
        scraper = _Scraper(url + "metrics", scrape_interval) if url and scrape_interval else None
        with scraper or contextlib.nullcontext():
            load = subprocess.run(
                command,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
        result: dict[str, float] = json.loads(load.stdout.strip().splitlines()[-1])
        result["scrapes"] = scraper.scrapes if scraper is not None else 0
        if result.get("lost"):
            raise RuntimeError(f"{result['lost']} requests lost")
        return result
    finally:
        for proc in procs:
            _kill(proc)


def core_once(tree: Path, count: int) -> float:
    """The broker core of ``tree`` alone, in process: microseconds per request/reply cycle
    (``benchmarks/core_cycle.py``, run as a script so that ``PYTHONPATH`` picks the tree)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    script = ROOT / "benchmarks" / "core_cycle.py"
    done = subprocess.run(
        [sys.executable, str(script), "--count", str(count)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def core_main(base: Path, head: Path, rounds: int, count: int) -> None:
    """``--core``: the two trees' broker cores, interleaved rounds, medians and ratios."""
    figures: dict[str, list[float]] = {"base": [], "head": []}
    trees = {"base": base, "head": head}
    names = ("base", "head")
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            figures[name].append(core_once(trees[name], count))
        print(
            f"round {rnd}: base {figures['base'][-1]} head {figures['head'][-1]}", file=sys.stderr
        )
    ratio = statistics.median(h / b for b, h in zip(figures["base"], figures["head"], strict=True))
    b, h = (statistics.median(figures[n]) for n in names)
    print("| figure | base | head | head / base (median of rounds) |")
    print("|---|---|---|---|")
    print(f"| broker core us per request/reply (in process) | {b:.2f} | {h:.2f} | {ratio:.2f}x |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__)
    parser.add_argument(
        "--base", default=None, help="git revision to compare against (default: working tree)"
    )
    parser.add_argument("--head", default=None, help="git revision (default: working tree)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--windows", default="1,64", help="comma-separated")
    parser.add_argument("--count", type=int, default=4000, help="most requests per run")
    parser.add_argument("--duration", type=float, default=2.0, help="most seconds per run")
    parser.add_argument(
        "--core", action="store_true", help="only the broker core, in process (no sockets)"
    )
    parser.add_argument("--base-args", default="", help="extra arguments of the base broker")
    parser.add_argument("--head-args", default="", help="extra arguments of the head broker")
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=None,
        metavar="S",
        help="GET /metrics every S seconds from each side that serves --http",
    )
    args = parser.parse_args(argv)
    extra = {"base": shlex.split(args.base_args), "head": shlex.split(args.head_args)}
    if args.core:
        with _tree(args.base) as base, _tree(args.head) as head:
            print(f"base {args.base}, head {args.head or 'working tree'}, {args.rounds} rounds")
            core_main(base, head, args.rounds, args.count if args.count != 4000 else 20_000)
        return
    windows = [int(w) for w in args.windows.split(",")]
    names = ("base", "head")
    records: dict[tuple[str, int], list[dict[str, float]]] = {}
    with _tree(args.base) as base, _tree(args.head) as head:
        trees = {"base": base, "head": head}
        for rnd in range(args.rounds):
            for window in windows:
                for name in names if rnd % 2 == 0 else names[::-1]:
                    rec = run_once(
                        trees[name],
                        window,
                        args.count,
                        args.duration,
                        extra[name],
                        args.scrape_interval,
                    )
                    records.setdefault((name, window), []).append(rec)
                    print(
                        f"round {rnd} window {window} {name}: "
                        + ", ".join(f"{f} {rec[f]:.1f}" for f in FIGURES)
                        + f", scrapes {rec['scrapes']:.0f}",
                        file=sys.stderr,
                    )
    print(
        f"base {args.base or 'working tree'} {args.base_args}, head "
        f"{args.head or 'working tree'} {args.head_args}, {args.rounds} rounds"
        + (f", /metrics every {args.scrape_interval} s" if args.scrape_interval else "")
    )
    print("| window | figure | base | head | head / base (median of rounds) |")
    print("|---|---|---|---|---|")
    for window in windows:
        a, b = records[("base", window)], records[("head", window)]
        for figure in FIGURES:
            ratio = statistics.median(y[figure] / x[figure] for x, y in zip(a, b, strict=True))
            print(
                f"| {window} | {figure} | {statistics.median(x[figure] for x in a):,.1f} "
                f"| {statistics.median(y[figure] for y in b):,.1f} | {ratio:.2f}x |"
            )


if __name__ == "__main__":
    main()
