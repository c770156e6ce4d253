"""Run the whole suite and write ``docs/performance.md`` and ``docs/perf/*.png``.

``python -m benchmarks.run [--quick | --tiny] [--out DIR] [--rounds N] [--variants a,b]
[--parts main,clients,sweeps]``

Sections, each repeated in ``rounds`` interleaved rounds (round ``r`` runs the variants in
an order rotated by ``r``):

1. *main*: every variant x payload (16 B, 64 KiB, 4 MiB) x window (64, 1);
2. *clients*: CPU per request of the load-generating process, dcp's clients against a plain
   pyzmq loop, on the dcp broker;
3. *sweeps*: the dcp broker with 1..1000 idle workers, 1..1000 services, 1..200 clients and
   up to 10,000 queued requests (:mod:`benchmarks.sweep`);
4. *stack*: dcp's own Client and Workers against majortomo's own stack
   (:mod:`benchmarks.stack`), written as the page's ``stack`` section.

Raw records go to ``<out>/perf/results.json``; :mod:`benchmarks.report` turns them into the
page. A failed run is recorded with its error and the suite goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import zmq

from . import report, sweep
from .common import raise_fd_limit
from .procs import ROOT, ProcessFailed, Procs
from .variants import CLIENT_KINDS, VARIANTS, Load, Running, start, start_broker
from .variants import start_echo_workers as _start_echo

__all__ = ["PROFILES", "Profile", "main", "run_suite"]

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class Profile:
    name: str
    rounds: int
    variants: tuple[str, ...]
    loads: tuple[Load, ...]
    client_loads: tuple[Load, ...]
    client_kinds: tuple[str, ...]
    sweeps: dict[str, tuple[int, ...]] = field(default_factory=dict)
    sweep_load: Load = field(default_factory=lambda: Load(16, 64, 500, 30_000, 2.0))
    sweep_brokers: tuple[str, ...] = sweep.BROKERS
    #: Loads of the *stack* part (:data:`benchmarks.stack.LOADS`); empty: no such part.
    stack: str = ""


ALL_VARIANTS = tuple(VARIANTS)
ALL_KINDS = tuple(CLIENT_KINDS)

PROFILES: dict[str, Profile] = {
    "full": Profile(
        name="full",
        rounds=3,
        variants=ALL_VARIANTS,
        loads=(
            Load(16, 64, 1000, 40_000, 2.5),
            Load(16, 1, 200, 10_000, 2.0),
            Load(64 * KIB, 64, 300, 20_000, 2.0),
            Load(64 * KIB, 1, 100, 5_000, 1.5),
            Load(4 * MIB, 64, 64, 300, 1.5),
            Load(4 * MIB, 1, 8, 100, 1.0),
        ),
        client_loads=(Load(16, 64, 1000, 40_000, 2.5), Load(16, 1, 200, 10_000, 2.0)),
        client_kinds=ALL_KINDS,
        sweeps={
            "workers": (1, 10, 100, 1000),
            "services": (1, 10, 100, 1000),
            "clients": (1, 10, 50, 200),
            "queued": (64, 1000, 10_000),
        },
        sweep_load=Load(16, 64, 500, 40_000, 2.0),
        stack="full",
    ),
    "quick": Profile(
        name="quick",
        rounds=3,
        variants=ALL_VARIANTS,
        loads=(
            Load(16, 64, 500, 10_000, 0.8),
            Load(16, 1, 100, 2_000, 0.6),
            Load(64 * KIB, 64, 200, 5_000, 0.6),
            Load(64 * KIB, 1, 50, 1_000, 0.5),
            Load(4 * MIB, 64, 64, 120, 0.6),
            Load(4 * MIB, 1, 4, 40, 0.4),
        ),
        client_loads=(Load(16, 64, 500, 10_000, 0.8), Load(16, 1, 100, 2_000, 0.6)),
        client_kinds=ALL_KINDS,
        sweeps={
            "workers": (1, 1000),
            "services": (1, 1000),
            "clients": (1, 200),
            "queued": (64, 10_000),
        },
        sweep_load=Load(16, 64, 300, 10_000, 0.8),
        stack="quick",
    ),
    "tiny": Profile(
        name="tiny",
        rounds=1,
        variants=("dcp", "minimal", "zmq.proxy"),
        loads=(Load(16, 64, 100, 1_000, 0.3), Load(16, 1, 20, 200, 0.2)),
        client_loads=(Load(16, 64, 100, 1_000, 0.3),),
        client_kinds=("plain pyzmq loop", "dcp.SyncClient"),
        sweeps={"workers": (1, 20)},
        sweep_load=Load(16, 64, 100, 1_000, 0.3),
        sweep_brokers=("dcp",),
    ),
}


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import dcp

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(dcp.__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    versions: dict[str, str] = {}
    for dist in ("dcp", "majortomo", "anyio", "trio"):
        try:
            from importlib.metadata import version

            versions[dist] = version(dist)
        except Exception:
            versions[dist] = "not installed"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "commit": commit,
        "versions": versions,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "memcpy_4mib_us": _memcpy_cost(),
    }


def _memcpy_cost() -> float:
    """Microseconds to copy 4 MiB into a fresh buffer here (what ``recv(copy=True)`` pays)."""
    src = b"x" * (4 * MIB)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(10):
            bytearray(src)
        best = min(best, (time.perf_counter() - t) / 10)
    return best * 1e6


def _rotate(items: Sequence[str], r: int) -> list[str]:
    r %= max(1, len(items))
    return [*items[r:], *items[:r]]


def _record(
    base: dict[str, Any], load: Load, data: dict[str, Any] | None, error: str = ""
) -> dict[str, Any]:
    rec = {**base, **asdict(load)}
    if data is not None:
        rec.update(data)
    if error:
        rec["error"] = error
    return rec


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_main(profile: Profile, variants: Sequence[str], log_dir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in range(profile.rounds):
        for name in _rotate(variants, r):
            variant = VARIANTS[name]
            base = {"round": r, "variant": name}
            with Procs(log_dir) as procs:
                try:
                    running = start(procs, variant)
                except ProcessFailed as exc:
                    error = f"{exc}\n{procs.tails()}"
                    _log(f"round {r} {name}: failed to start: {error}")
                    out += [_record(base, load, None, error) for load in profile.loads]
                    continue
                for load in profile.loads:
                    out.append(_one(procs, running, load, base, None))
    return out


def _one(
    procs: Procs, running: Running, load: Load, base: dict[str, Any], kind: list[str] | None
) -> dict[str, Any]:
    try:
        data = running.run(procs, load, kind)
    except ProcessFailed as exc:
        error = f"{exc}\n{procs.tails()}"
        _log(f"{base} {load.payload}B w{load.window}: FAILED {error}")
        return _record(base, load, None, error)
    _log(
        f"{base} {load.payload}B w{load.window}: {data['rate']:.0f} req/s, "
        f"p50 {data['p50_us']:.0f} us, broker {data['broker_cpu_us']:.1f} us/req, "
        f"client {data['client_cpu_us']:.1f} us/req, lost {data['lost']}"
    )
    return _record(base, load, data)


def run_clients(profile: Profile, log_dir: Path) -> list[dict[str, Any]]:
    """CPU per request of each kind of load generator against the same dcp broker."""
    out: list[dict[str, Any]] = []
    variant = VARIANTS["dcp"]
    for r in range(profile.rounds):
        with Procs(log_dir) as procs:
            try:
                endpoint, _, pid = start_broker(procs, "dcp")
                wpid = _start_echo(procs, endpoint, "dcp", 4)
            except ProcessFailed as exc:
                _log(f"clients round {r}: failed to start: {exc}\n{procs.tails()}")
                continue
            running = Running(variant, endpoint, pid, [wpid])
            for kind in _rotate(profile.client_kinds, r):
                for load in profile.client_loads:
                    base = {"round": r, "client": kind}
                    out.append(_one(procs, running, load, base, CLIENT_KINDS[kind]))
    return out


def run_suite(
    profile: Profile,
    out_dir: Path,
    *,
    variants: Sequence[str] | None = None,
    parts: Sequence[str] = ("main", "clients", "sweeps", "stack"),
    command: str = "",
) -> dict[str, Any]:
    """Run the suite, write ``out_dir/perf/results.json``, the plots and
    ``out_dir/performance.md``; return the results."""
    raise_fd_limit()
    perf = out_dir / "perf"
    perf.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "profile": profile.name,
        "rounds": profile.rounds,
        "command": command,
        "machine": machine(),
        "variants": {n: VARIANTS[n].description for n in (variants or profile.variants)},
        "main": [],
        "clients": [],
        "sweeps": [],
    }
    kept: dict[str, Any] = {}  # the stack part's results, for its own page section
    with tempfile.TemporaryDirectory(prefix="dcp-bench-") as tmp:
        log_dir = Path(tmp)
        if "main" in parts:
            results["main"] = run_main(profile, variants or profile.variants, log_dir)
        if "clients" in parts:
            results["clients"] = run_clients(profile, log_dir)
        if "sweeps" in parts and profile.sweeps:
            results["sweeps"] = sweep.run_sweeps(
                profile.sweeps,
                profile.sweep_load,
                profile.rounds,
                log_dir,
                _log,
                profile.sweep_brokers,
            )
        if "stack" in parts and profile.stack:
            from . import stack

            kept = stack.run(profile.rounds, profile.stack, log_dir, _log)
            kept["command"] = command
            (perf / "stack.json").write_text(json.dumps(kept, indent=1) + "\n")
            results["stack"] = kept["stack"]
    results["duration_s"] = round(time.monotonic() - started, 1)
    (perf / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    page = report.write(results, out_dir)
    if kept:
        from . import stack

        stack.write_section(page, kept, command)
    return results


@contextlib.contextmanager
def exclusive(wait: float) -> Iterator[None]:
    """Hold the machine-wide benchmark lock: two suites measuring at once spoil both.
    Waits at most ``wait`` seconds for another run to finish."""
    path = Path(tempfile.gettempdir()) / "dcp-bench.lock"
    with open(path, "a") as f:
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"another benchmark run holds {path}; gave up") from None
                if not told:
                    _log(f"waiting for another benchmark run to finish ({path})")
                    told = True
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM: unwind like Ctrl-C, so every started process is killed by the finally."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="a few minutes")
    group.add_argument("--tiny", action="store_true", help="seconds; for the smoke test")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="default: docs/")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--variants", default="", help="comma-separated subset")
    parser.add_argument("--parts", default="main,clients,sweeps,stack")
    parser.add_argument("--command", default="", help="the command to show in the report")
    args = parser.parse_args(argv)
    profile = PROFILES["quick" if args.quick else "tiny" if args.tiny else "full"]
    if args.rounds:
        profile = Profile(**{**profile.__dict__, "rounds": args.rounds})
    variants = [v for v in args.variants.split(",") if v] or None
    for v in variants or ():
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    command = args.command or " ".join(["python -m benchmarks.run", *(argv or sys.argv[1:])])
    signal.signal(signal.SIGTERM, _terminate)
    # The tiny profile (the smoke test) does not wait for, nor block, a real run.
    lock = exclusive(1800.0) if profile.name != "tiny" else contextlib.nullcontext()
    with lock:
        results = run_suite(
            profile,
            args.out,
            variants=variants,
            parts=[p for p in args.parts.split(",") if p],
            command=command,
        )
    failures = sum(
        1
        for sec in ("main", "clients", "sweeps", "stack")
        for r in results.get(sec, [])
        if "error" in r
    )
    _log(f"done in {results['duration_s']} s; {failures} failed runs; wrote {args.out}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
