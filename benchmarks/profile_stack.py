"""Profile dcp's own Client and Worker processes under load: where does their CPU go?

``python -m benchmarks.profile_stack [--shape 4x1] [--window 1] [--backend trio]
[--seconds 4] [--top 25]``

Starts ``dcp broker``, the worker processes of the shape (:mod:`benchmarks.stack`) and one
client (:mod:`benchmarks.dcp_peers`) running for ``--seconds``, samples the client and the
first worker process with ``py-spy record --format raw --nonblocking`` (``pip install
py-spy``; the ``bench`` extra has it), and prints per process the functions with the most
samples, own (*self*) and with what they call (*total*), as a share of the samples where
the process was running Python (idle waits in ``epoll``/``select`` are not sampled). Every
process is killed by its PID at the end.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .procs import Procs
from .stack import _start
from .variants import Load

__all__ = ["main", "summarise"]


def summarise(raw: str, top: int) -> list[str]:
    """Top functions of a py-spy raw (collapsed stacks) file, by own and total samples."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [
            f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].rstrip(")") for f in stack.split(";")
        ]
        frames = [f for f in frames if not f.startswith("<module>")]
        if not frames:
            continue
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    out = [f"{samples} samples"]
    for title, counter in (("self", own), ("total", total)):
        out.append(f"  by {title}:")
        for name, n in counter.most_common(top):
            out.append(f"    {100 * n / max(1, samples):5.1f}%  {name}")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_stack", description=__doc__
    )
    parser.add_argument("--shape", choices=["1x16", "4x1"], default="4x1")
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with (
        tempfile.TemporaryDirectory(prefix="dcp-profile-stack-") as tmp,
        Procs(Path(tmp)) as procs,
    ):
        side = f"dcp-{args.backend}"
        endpoint, bpid, wpids = _start(procs, side, args.shape)
        load = Load(16, args.window, 200, 10**7, args.seconds)
        client = procs.start(
            "client",
            "benchmarks.dcp_peers",
            "--backend",
            args.backend,
            "client",
            "--endpoint",
            endpoint,
            *load.argv(),
        )
        spies = {}
        for name, pid in (("client", client.pid), ("worker", wpids[0]), ("broker", bpid)):
            out = Path(tmp) / f"{name}.txt"
            command = [spy, "record", "-f", "raw", "--nonblocking", "-r", "200"]
            command += ["-d", str(int(args.seconds)), "-p", str(pid), "-o", str(out)]
            spies[name] = (subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL), out)  # fmt: skip
        result = client.result(60 + args.seconds)
        for name, (spy_proc, out) in spies.items():
            spy_proc.wait(30)
            print(f"== {name} ({args.shape}, window {args.window}, {args.backend})")
            print("\n".join(summarise(out.read_text() if out.exists() else "", args.top)))
        print(
            f"client: {result['rate']:.0f} req/s, p50 {result['p50_us']:.0f} us, client CPU "
            f"{result['client_cpu_us']:.0f} us/req"
        )


if __name__ == "__main__":
    main()
