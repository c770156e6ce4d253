"""Run a tool on a broker's PID while it serves the common load: where do its system calls and
CPU go? (``docs/performance-broker.md``)

``python -m benchmarks.trace_broker [--variant dcp] [--window 1] [--seconds 4] -- TOOL...``

Starts the broker variant (``dcp``, ``majortomo``, ``minimal``, ...), the 4 common echo
workers and the common load generator (16 B) over ``tcp://127.0.0.1``; once the load runs,
runs ``TOOL`` with ``{pid}`` replaced by the broker's PID and ``{seconds}`` by
``--seconds``, e.g.::

    python -m benchmarks.trace_broker --window 1 -- \\
        timeout 8 strace -c -f -p {pid} -o /tmp/strace.txt
    python -m benchmarks.trace_broker --window 64 -- \\
        py-spy record -p {pid} -d {seconds} --threads --format raw -o /tmp/spy.txt
    python -m benchmarks.trace_broker --window 64 -- \\
        perf record -F 2000 -p {pid} -o /tmp/perf.data -- sleep {seconds}

then prints the load generator's figures (requests, broker CPU per request: the tool slows
the broker down, so count system calls per request from the tool's own totals and the
number of requests). Every process is killed by its PID at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from .procs import Procs
from .variants import VARIANTS, Load, Running, start_broker, start_echo_workers

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trace_broker", description=__doc__)
    parser.add_argument("--variant", default="dcp", choices=["dcp", "majortomo", "minimal"])
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=4.0, help="how long the tool runs")
    parser.add_argument("tool", nargs=argparse.REMAINDER, help="after --: the command")
    args = parser.parse_args(argv)
    tool = [a for a in args.tool if a != "--"]
    if not tool:
        parser.error("give the tool to run after --, e.g. -- strace -c -f -p {pid}")
    with tempfile.TemporaryDirectory(prefix="dcp-trace-") as tmp, Procs(Path(tmp)) as procs:
        endpoint, worker_endpoint, pid = start_broker(procs, args.variant)
        proto = "mdp" if args.variant == "majortomo" else "dcp"
        workers = start_echo_workers(procs, worker_endpoint, proto, 4)
        # The load outlasts the tool: warm-up, a second's head start, the tool, a margin.
        load = Load(16, args.window, 300, 10**9, args.seconds + 3.0)
        running = Running(VARIANTS[args.variant], endpoint, pid, [workers])
        result: dict[str, object] = {}

        def drive() -> None:
            result.update(running.run(procs, load))

        driver = threading.Thread(target=drive)
        driver.start()
        time.sleep(1.0)
        command = [a.format(pid=pid, seconds=int(args.seconds)) for a in tool]
        subprocess.run(command, check=False, timeout=args.seconds + 60)
        driver.join(timeout=load.duration + 120)
    print(
        f"{args.variant} window {args.window}: {result.get('requests')} requests, "
        f"{result.get('rate', 0):.0f} req/s, broker {result.get('broker_cpu_us', 0):.1f} us/req "
        f"(Python threads {result.get('broker_thread_cpu_us', 0):.1f}), "
        f"other load {result.get('foreign_load', 0):.2f} CPUs"
    )


if __name__ == "__main__":
    main()
