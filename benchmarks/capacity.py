"""The same load spread over 1, 2 and 4 brokers: broker CPU per request (issue 28's capacity
figure).

``python -m benchmarks.capacity [--brokers 1,2,4] [--rate 2000] [--workers 4] [--clients 2]
[--in-flight 16] [--warmup 2] [--duration 8] [--rounds 3] [--taskset] [--static] [--control]
[--json FILE]``

For each number of brokers: that many ``dcp broker`` processes on ``tcp://127.0.0.1`` (free
ports), ``--workers`` worker processes and ``--clients`` client processes of
:mod:`benchmarks.failover` (an echo service), each given every broker's endpoint, the
clients offering ``--rate`` requests per second together (at most ``--in-flight`` each at
once; ``--rate 0``: as many as that window allows) for ``--warmup`` + ``--duration``
seconds. Over the ``--duration`` window each broker's CPU (``/proc/<pid>/stat``, all its
threads) and the worker replies it counted (its ``mmi.broker`` document) are read at both
ends; the figure is CPU per request, per broker and all brokers together, beside the
replies per second of the whole system and how busy the machine was (``/proc/stat``).

- ``--static`` gives client ``i`` broker ``i mod N`` only (at least N clients, the same
  requests in flight in all): the brokers' shares without the clients' spreading.
- ``--control`` adds, for each N > 1, one broker offered 1/N of the rate: what one broker
  costs per request at the rate each of the N brokers had (a broker's CPU per request grows
  as its rate falls: fewer messages per wake-up), so the N-broker rows compare with it.
- ``--taskset`` adds runs with broker ``i`` pinned to core ``i mod nproc``
  (``sched_setaffinity`` on every thread; clients and workers float).

If brokers are independent, the CPU a request costs its broker is the same whether the
broker is alone or one of N at the same rate, so N brokers each on a core of its own carry N
times what one broker can: one broker saturates at ``1 / cpu_per_request`` requests per
second of one core. On a machine with few cores the clients, workers and brokers share them,
so the total rate cannot show that gain; the per-broker CPU predicts it.

The rounds alternate the order of the cases (1, 2, 4, then 4, 2, 1, ...); the table gives
the medians. Every process is ended by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import busy_seconds, cpu_seconds, python_cpu_seconds
from .failover import START_TIMEOUT, broker_document, client_argv, worker_argv
from .procs import Proc, Procs, alive
from .variants import free_port

__all__ = ["main", "measure", "render", "summarise"]


def _snapshot(brokers: Sequence[Proc], endpoints: Sequence[str]) -> list[tuple[float, float, int]]:
    """(CPU seconds, of which its Python threads', worker replies counted) of each broker
    now."""
    out = []
    for proc, endpoint in zip(brokers, endpoints, strict=True):
        cpu = cpu_seconds(proc.pid)
        python = python_cpu_seconds(proc.pid)
        doc = broker_document(endpoint, timeout=5.0)
        if doc is None:
            raise RuntimeError(f"broker {endpoint} (pid {proc.pid}) did not answer mmi.broker")
        out.append((cpu, python, int(doc["replies"])))
    return out


def _pin(pid: int, core: int) -> None:
    """Every thread of ``pid`` (a thread's affinity is its own) on ``core``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {core})


def measure(
    n: int,
    log_dir: Path,
    *,
    workers: int = 4,
    clients: int = 2,
    in_flight: int = 16,
    concurrency: int = 8,
    warmup: float = 2.0,
    duration: float = 8.0,
    pin: bool = False,
    static: bool = False,
    load_of: int = 0,
    rate: float = 0.0,
) -> dict[str, Any]:
    """One load through ``n`` brokers; its figures (``static``: client ``i`` is given broker
    ``i mod n`` only, and there are at least ``n`` clients, the same requests in flight in
    all; ``rate``: requests per second offered by all clients together, 0: as many as
    ``in_flight`` allows; ``load_of``: the control for ``load_of`` brokers, ``rate`` (else
    each client's ``in_flight``) divided by it)."""
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(n)]
    if load_of and rate:
        rate /= load_of
    elif load_of:
        in_flight = max(1, in_flight // load_of)
    total = clients * in_flight
    if static and clients < n:
        clients, in_flight = n, max(1, total // n)
    start_file = log_dir / f"start-{n}"
    start_file.unlink(missing_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    with Procs(log_dir) as procs:
        brokers = [
            procs.start(f"broker{i}", "dcp", "broker", "--bind", ep)
            for i, ep in enumerate(endpoints)
        ]
        for i, b in enumerate(brokers):
            b.wait_ready(START_TIMEOUT)
            if pin:
                _pin(b.pid, cores[i % len(cores)])
        peers = [
            procs.start(f"worker{i}", *worker_argv(endpoints, None, concurrency=concurrency))
            for i in range(workers)
        ]
        run_for = warmup + duration + 0.5
        peers += [
            procs.start(
                f"client{i}",
                *client_argv(
                    [endpoints[i % n]] if static else endpoints,
                    f"c{i}",
                    str(start_file),
                    run_for=run_for,
                    in_flight=in_flight,
                    timeout=30.0,
                    drain=10.0,
                    calls=False,
                    rate=rate / clients,
                ),
            )
            for i in range(clients)
        ]
        for p in peers:
            p.wait_ready(START_TIMEOUT)
        pids = [p.pid for p in procs.procs]
        start = time.monotonic() + 0.2
        start_file.write_text(repr(start))
        time.sleep(max(0.0, start + warmup - time.monotonic()))
        busy0, t0 = busy_seconds(), time.monotonic()
        before = _snapshot(brokers, endpoints)
        time.sleep(max(0.0, start + warmup + duration - time.monotonic()))
        after = _snapshot(brokers, endpoints)
        busy1, t1 = busy_seconds(), time.monotonic()
        records = [p.result(run_for + 10.0 + START_TIMEOUT) for p in peers[workers:]]
    elapsed = t1 - t0
    per_broker: list[dict[str, Any]] = []
    for (cpu0, py0, rep0), (cpu1, py1, rep1) in zip(before, after, strict=True):
        replies = rep1 - rep0
        cpu = cpu1 - cpu0
        per_broker.append(
            {
                "replies": replies,
                "cpu_s": round(cpu, 3),
                "python_cpu_s": round(py1 - py0, 3),
                "cpu_us_per_request": round(cpu * 1e6 / replies, 1) if replies else None,
            }
        )
    replies = sum(b["replies"] for b in per_broker)
    cpu = sum(b["cpu_s"] for b in per_broker)
    return {
        "brokers": n,
        "pinned": pin,
        "static": static,
        "load_of": load_of or n,
        "offered": rate,
        "clients": clients,
        "in_flight": in_flight,
        "elapsed_s": round(elapsed, 3),
        "replies": replies,
        "rate": round(replies / elapsed, 1),
        "cpu_us_per_request": round(cpu * 1e6 / replies, 1) if replies else None,
        "python_us_per_request": round(
            sum(b["python_cpu_s"] for b in per_broker) * 1e6 / replies, 1
        )
        if replies
        else None,
        "broker_cpu_share": round(cpu / elapsed, 3),
        "machine_busy": round((busy1 - busy0) / elapsed / (os.cpu_count() or 1), 3),
        "per_broker": per_broker,
        "lost": sum(r["lost"] for r in records),
        "hung": sum(r["hung"] for r in records),
        "wrong": sum(r["wrong"] for r in records),
        "leftovers": [pid for pid in pids if alive(pid)],
    }


def summarise(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the rounds, one row per (brokers, pinned)."""
    rows = []

    def key_of(r: dict[str, Any]) -> tuple[int, bool, int]:
        return r["brokers"], r["pinned"], r.get("load_of", r["brokers"])

    for key in sorted({key_of(r) for r in records}, key=lambda k: (k[1], k[2], k[0])):
        group = [r for r in records if key_of(r) == key]
        per_broker = [
            b["cpu_us_per_request"]
            for r in group
            for b in r["per_broker"]
            if b["cpu_us_per_request"] is not None
        ]
        cpu = [r["cpu_us_per_request"] for r in group if r["cpu_us_per_request"] is not None]
        rows.append(
            {
                "brokers": key[0],
                "pinned": key[1],
                "load_of": key[2],
                "rounds": len(group),
                "rate": statistics.median(r["rate"] for r in group),
                "cpu_us_per_request": statistics.median(cpu) if cpu else None,
                "per_broker_min": min(per_broker) if per_broker else None,
                "per_broker_max": max(per_broker) if per_broker else None,
                "broker_cpu_share": statistics.median(r["broker_cpu_share"] for r in group),
                "machine_busy": statistics.median(r["machine_busy"] for r in group),
                "lost": sum(r["lost"] + r["hung"] + r["wrong"] for r in group),
            }
        )
    return rows


def render(rows: Sequence[dict[str, Any]], command: str, settings: str) -> str:
    """The Markdown table of :func:`summarise`'s rows."""

    def us(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} µs"

    lines = [
        f"`{command}`: {settings}",
        "",
        "| brokers | pinned | replies/s | broker CPU / request | per broker (min-max) "
        "| brokers' CPUs busy | machine busy | lost |",
        "|---:|:--|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        brokers = str(r["brokers"])
        if r["load_of"] != r["brokers"]:
            brokers += f" (1/{r['load_of']} of the load)"
        lines.append(
            f"| {brokers} | {'yes' if r['pinned'] else 'no'} | {r['rate']:.0f} "
            f"| {us(r['cpu_us_per_request'])} | {us(r['per_broker_min'])} - "
            f"{us(r['per_broker_max'])} | {r['broker_cpu_share']:.2f} "
            f"| {r['machine_busy']:.0%} | {r['lost']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.capacity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--brokers", default="1,2,4", help="comma-separated broker counts")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--in-flight", type=int, default=16, help="per client")
    parser.add_argument("--concurrency", type=int, default=8, help="per worker")
    parser.add_argument(
        "--rate",
        type=float,
        default=2000.0,
        help="requests/s offered by all clients together (0: as fast as --in-flight allows)",
    )
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--taskset", action="store_true", help="also pin each broker to a core")
    parser.add_argument(
        "--static",
        action="store_true",
        help="give client i broker i mod N only (no spreading by the clients)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="also one broker with 1/N of the requests in flight, for each N > 1",
    )
    parser.add_argument("--json", help="write every round's figures and the medians here")
    args = parser.parse_args(argv)
    try:
        counts = [int(x) for x in args.brokers.split(",") if x]
    except ValueError:
        parser.error("--brokers: comma-separated numbers")
    if not counts or min(counts) < 1 or args.rounds < 1 or args.duration <= 0:
        parser.error("--brokers, --rounds and --duration must be positive")
    cases = [(n, False, 0) for n in counts]
    if args.taskset:
        cases += [(n, True, 0) for n in counts]
    if args.control:
        cases += [(1, False, n) for n in counts if n > 1]
    records = []
    with tempfile.TemporaryDirectory(prefix="dcp-capacity-") as tmp:
        for r in range(args.rounds):
            for n, pin, load_of in cases if r % 2 == 0 else reversed(cases):
                rec = measure(
                    n,
                    Path(tmp),
                    workers=args.workers,
                    clients=args.clients,
                    in_flight=args.in_flight,
                    concurrency=args.concurrency,
                    warmup=args.warmup,
                    duration=args.duration,
                    pin=pin,
                    static=args.static,
                    load_of=load_of,
                    rate=args.rate,
                )
                rec["round"] = r
                records.append(rec)
                print(f"round {r + 1}: {json.dumps(rec)}", file=sys.stderr, flush=True)
    rows = summarise(records)
    command = "python -m benchmarks.capacity " + " ".join(
        sys.argv[1:] if argv is None else list(argv)
    )
    settings = (
        f"{args.workers} workers (concurrency {args.concurrency}), {args.clients} clients x "
        f"{args.in_flight} in flight, "
        + (f"offering {args.rate:g} requests/s, " if args.rate else "closed loop, ")
        + f"{args.duration:g} s measured, median of {args.rounds} "
        f"rounds, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d', time.gmtime())}"
    )
    if args.static:
        settings += "; static: client i given broker i mod N only (at least N clients)"
    if args.json:
        document = {"command": command, "settings": settings, "rows": rows, "records": records}
        Path(args.json).write_text(json.dumps(document, indent=1))
    print(render(rows, command, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
