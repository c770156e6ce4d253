"""Profile the dcp broker under the common load: where does its CPU per request go?

``python -m benchmarks.profile_broker [--payload 16] [--window 64] [--seconds 3] [--backend trio]
[--proto dcp|mdp]``

Runs ``dcp broker`` under :mod:`cProfile` (in its own process, over tcp://127.0.0.1) with
the 4 common echo workers, drives it with the common load generator (both speaking DCP, or
MDP 0.2 with ``--proto mdp``), stops it with SIGTERM (the CLI stops cleanly, so the profile
is written) and prints the top functions by own time. ``--out FILE`` keeps the raw profile
for ``python -m pstats`` or snakeviz.
"""

from __future__ import annotations

import argparse
import pstats
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .procs import Procs
from .variants import VARIANTS, Load, Running, start_echo_workers

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_broker", description=__doc__
    )
    parser.add_argument("--payload", type=int, default=16)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--proto", choices=["dcp", "mdp"], default="dcp", help="the peers'")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sort", default="tottime", help="pstats sort key")
    parser.add_argument("--out", type=Path, default=None, help="keep the raw profile here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dcp-profile-") as tmp:
        out = args.out or Path(tmp) / "broker.prof"
        with Procs(Path(tmp)) as procs:
            broker = procs.start(
                "dcp-broker",
                "cProfile",
                "-o",
                str(out),
                "-m",
                "dcp",
                "--backend",
                args.backend,
                "broker",
                "--bind",
                "tcp://127.0.0.1:0",
            )
            [endpoint] = broker.wait_ready(30)
            wpid = start_echo_workers(procs, endpoint, args.proto, 4)
            load = Load(args.payload, args.window, 200, 10**9, args.seconds)
            variant = VARIANTS["dcp-mdp" if args.proto == "mdp" else "dcp"]
            result = Running(variant, endpoint, broker.pid, [wpid]).run(procs, load)
            broker.popen.send_signal(signal.SIGTERM)
            broker.popen.wait(30)
        print(
            f"{result['rate']:.0f} req/s, broker {result['broker_cpu_us']:.1f} us/req "
            f"(Python threads {result['broker_thread_cpu_us']:.1f}; profiling inflates both)"
        )
        stats = pstats.Stats(str(out))
        stats.strip_dirs().sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
