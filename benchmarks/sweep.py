"""Scaling sweeps of the dcp broker: does the cost per request stay flat?

Each point starts a fresh ``dcp broker`` (and, as a control, the minimal broker) with the 4
common echo workers serving ``echo`` and runs the common load generator (16 B payloads)
against it, with:

- ``workers``: N more *idle* workers connected (registered for service ``idle``, pinging
  every second), as DEALER sockets in processes of at most 250 sockets;
- ``services``: N idle workers each registered for its own service (N services);
- ``clients``: N client sockets in the load generator, ``max(1, 64 // N)`` in flight each;
- ``queued``: a window of N requests in flight, so about N - 4 wait in the broker's queue.

Memory per idle worker (or service) is the broker's RSS growth when they connect, divided by
N; memory per queued request is the peak RSS growth during the window divided by N. The
broker's idle CPU (heartbeats of the idle workers) is measured for a second before the load,
so the per-request cost can also be shown net of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .common import cpu_seconds, rss_bytes
from .procs import ProcessFailed, Procs
from .variants import VARIANTS, Load, Running, start_broker, start_echo_workers

__all__ = ["BROKERS", "SOCKETS_PER_PROCESS", "run_sweeps"]

#: The brokers swept: dcp, and the minimal broker as a control (it has no per-request scan
#: by construction, so whatever its curve does is the harness, not a broker).
BROKERS = ("dcp", "minimal")
#: Idle worker sockets per process.
SOCKETS_PER_PROCESS = 250
_IDLE_SAMPLE = 1.0


def run_sweeps(
    sweeps: dict[str, tuple[int, ...]],
    load: Load,
    rounds: int,
    log_dir: Path,
    log: Callable[[str], None],
    brokers: tuple[str, ...] = BROKERS,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in range(rounds):
        for name, points in sweeps.items():
            for x in points:
                for broker in brokers if r % 2 == 0 else brokers[::-1]:
                    out.append(_logged_point(broker, name, x, load, r, log_dir, log))
    return out


def _logged_point(
    broker: str,
    name: str,
    x: int,
    load: Load,
    r: int,
    log_dir: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    rec: dict[str, Any] = {"round": r, "broker": broker, "sweep": name, "x": x}
    try:
        rec.update(_point(broker, name, x, load, log_dir))
    except ProcessFailed as exc:
        rec["error"] = str(exc)
        log(f"sweep {broker} {name}={x} round {r}: FAILED {exc}")
    else:
        log(
            f"sweep {broker} {name}={x} round {r}: {rec['rate']:.0f} req/s, broker "
            f"{rec['broker_cpu_us']:.1f} us/req (net {rec['net_cpu_us']:.1f}), "
            f"{rec['mem_per_item_kib']:.2f} KiB/item, lost {rec['lost']}"
        )
    return rec


def _point(broker: str, name: str, x: int, load: Load, log_dir: Path) -> dict[str, Any]:
    with Procs(log_dir) as procs:
        try:
            return _measure(procs, broker, name, x, load)
        except ProcessFailed as exc:
            raise ProcessFailed(f"{exc}\n{procs.tails()}") from None


def _measure(procs: Procs, broker: str, name: str, x: int, load: Load) -> dict[str, Any]:
    endpoint, _, pid = start_broker(procs, broker)
    wpid = start_echo_workers(procs, endpoint, "dcp", 4)
    mem_per_item = 0.0
    if name in ("workers", "services"):
        time.sleep(0.2)
        rss0 = rss_bytes(pid)
        for offset in range(0, x, SOCKETS_PER_PROCESS):
            n = min(SOCKETS_PER_PROCESS, x - offset)
            if name == "workers":
                opts = ["--service", "idle"]
            else:
                opts = ["--service", "svc", "--distinct", "--offset", str(offset)]
            start_echo_workers(procs, endpoint, "dcp", n, *opts)
        time.sleep(0.2)
        mem_per_item = (rss_bytes(pid) - rss0) / x
    if name == "clients":
        load = replace(load, clients=x, window=max(1, 64 // x))
    elif name == "queued":
        load = replace(load, window=x, count=max(load.count, 3 * x))
    idle_rate = 0.0
    if name in ("workers", "services"):
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        time.sleep(_IDLE_SAMPLE)
        idle_rate = (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)
    data: dict[str, Any] = Running(VARIANTS[broker], endpoint, pid, [wpid]).run(procs, load)
    n = max(1, int(data["requests"]))
    if name == "queued" and data["broker_peak_growth_mb"] >= 0:
        mem_per_item = data["broker_peak_growth_mb"] * 2**20 / x
    net = max(0.0, data["broker_cpu_s"] - idle_rate * data["elapsed_s"]) * 1e6 / n
    return {
        **asdict(load),
        **data,
        "idle_cpu_per_s": idle_rate,
        "net_cpu_us": net,
        "mem_per_item_kib": mem_per_item / 1024,
    }
