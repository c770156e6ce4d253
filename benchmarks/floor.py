"""The floor: what an event-loop wake-up per message costs a worker at concurrency 1 and a
client at window 1, against the smallest blocking pyzmq peers (issue 27).

``python -m benchmarks.floor [--rounds 3] [--quick | --tiny] [--tables workers,clients]
[--workers SIDES] [--clients SIDES] [--out FILE]``

Two tables, every side through ``dcp broker`` (trio, as shipped) on tcp://127.0.0.1:

- **Workers, concurrency 1** (the *4x1* shape of :mod:`benchmarks.stack`): four worker
  processes of one kind, one :class:`dcp.Client` on asyncio at window 64
  (``map_unordered``; :mod:`benchmarks.dcp_peers`), 16 B echo. Kinds: *block*, the smallest
  blocking pyzmq DCP worker (receive, parse, reply; :mod:`benchmarks.floor_peers`);
  *zmq-asyncio*, the same loop on ``zmq.asyncio``; *asyncio-fd* and *trio-fd*, the same
  loop on asyncio without ``zmq.asyncio`` and on trio: a non-blocking receive, and a wait
  on the zmq socket's FD when it finds nothing (asyncio: a reader callback registered once
  and a future per wait, as dcp's own wait; trio: :func:`trio.lowlevel.wait_readable`);
  *dcp-asyncio* and *dcp-trio*, :class:`dcp.Worker` (``concurrency=1``) on that backend;
  *majortomo*, majortomo 0.2.0's blocking ``Worker`` (the ``bench`` extra; skipped with a
  reason without it), which speaks MDP: ``dcp broker`` serves it to the same dcp client
  (docs/protocol.md, Majordomo).
  Figures: req/s, and the workers' CPU per request from ``/proc/<pid>/task/*`` summed over
  the four processes (each request is served by one): their Python threads (the event loop
  is the main thread; majortomo's ``Worker`` runs in a thread of its own) and libzmq's I/O
  threads apart.
- **Clients, window 1**: one ``dcp broker`` and one *block* worker per round, the same for
  every client; one request in flight. Kinds: *block*, a blocking pyzmq DCP client (send,
  blocking receive); *zmq-asyncio*, the same on ``zmq.asyncio``; *asyncio-fd*, *trio-fd*,
  the same bare loop waiting on the zmq FD as the workers of those names do; *dcp-asyncio*
  and *dcp-trio*, :class:`dcp.Client` (``request`` one at a time). Figures: p50 latency,
  and the client's CPU per request in the thread that runs its loop
  (:func:`time.thread_time`) and in the whole process.

Each round runs every side of a table, in an order rotated by the round; the figures are
medians over rounds and the ratios medians of same-round ratios side / *block* and, for dcp's
sides, side / the bare loop on the same backend (*asyncio-fd*, *trio-fd*). Every process is
killed by its PID when its run ends; every wait is bounded. Prints two markdown tables;
``--out FILE`` saves the raw records as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from .common import pid_list, raise_fd_limit
from .procs import Proc, ProcessFailed, Procs
from .variants import START_TIMEOUT, Load, start_broker

__all__ = ["CLIENT_SIDES", "TABLES", "WORKER_SIDES", "main", "render", "run", "summarise"]

#: Worker processes in the workers table, and the requests each serves at once.
WORKERS = 4
#: The side every ratio is taken against, in both tables.
ANCHOR = "block"
MAJORTOMO = "majortomo"
#: Worker side: the command (after ``python -m``) that starts one worker process, which
#: prints ``READY`` once it can serve.
WORKER_SIDES: dict[str, tuple[str, ...]] = {
    "block": ("benchmarks.floor_peers", "worker", "--kind", "block"),
    "zmq-asyncio": ("benchmarks.floor_peers", "worker", "--kind", "asyncio"),
    "asyncio-fd": ("benchmarks.floor_peers", "worker", "--kind", "asyncio-fd"),
    "trio-fd": ("benchmarks.floor_peers", "worker", "--kind", "trio"),
    "dcp-asyncio": ("benchmarks.dcp_peers", "--backend", "asyncio", "workers", "--count", "1"),
    "dcp-trio": ("benchmarks.dcp_peers", "--backend", "trio", "workers", "--count", "1"),
    MAJORTOMO: ("benchmarks.mdp", "workers", "--count", "1"),
}
#: Client side: the command of the load generator (the common result record).
CLIENT_SIDES: dict[str, tuple[str, ...]] = {
    "block": ("benchmarks.floor_peers", "client", "--kind", "block"),
    "zmq-asyncio": ("benchmarks.floor_peers", "client", "--kind", "asyncio"),
    "asyncio-fd": ("benchmarks.floor_peers", "client", "--kind", "asyncio-fd"),
    "trio-fd": ("benchmarks.floor_peers", "client", "--kind", "trio"),
    "dcp-asyncio": ("benchmarks.dcp_peers", "--backend", "asyncio", "client"),
    "dcp-trio": ("benchmarks.dcp_peers", "--backend", "trio", "client"),
}
#: The client that loads the workers table, and the worker that serves the clients table.
WORKERS_CLIENT = ("benchmarks.dcp_peers", "--backend", "asyncio", "client")
CLIENTS_WORKER = WORKER_SIDES[ANCHOR]
TABLES = ("workers", "clients")
#: dcp's sides and the bare loop on the same backend, the second ratio of their rows.
BARE = {"dcp-asyncio": "asyncio-fd", "dcp-trio": "trio-fd"}


@dataclass(frozen=True)
class Profile:
    """The loads of one run: (workers table at window 64, clients table at window 1)."""

    workers: Load
    clients: Load


PROFILES = {
    "full": Profile(Load(16, 64, 500, 200_000, 3.0), Load(16, 1, 200, 50_000, 2.0)),
    "quick": Profile(Load(16, 64, 300, 100_000, 1.5), Load(16, 1, 100, 20_000, 1.0)),
    "tiny": Profile(Load(16, 64, 64, 2_000, 0.4), Load(16, 1, 20, 300, 0.3)),
}
#: Seconds a load generator may take beyond its load's duration (start, warm-up, drain).
CLIENT_SLACK = 90.0

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"[floor {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def missing(side: str) -> str | None:
    """Why a worker side cannot run here, or None."""
    if side == MAJORTOMO and find_spec("majortomo") is None:
        return "majortomo is not installed (the `bench` extra)"
    return None


def _workers(procs: Procs, argv: Sequence[str], endpoint: str, count: int) -> list[int]:
    started = [
        procs.start(f"{argv[0]}-worker", *argv, "--endpoint", endpoint) for _ in range(count)
    ]
    for proc in started:
        proc.wait_ready(START_TIMEOUT)
    return [p.pid for p in started]


def _client(
    procs: Procs, argv: Sequence[str], load: Load, endpoint: str, bpid: int, wpids: list[int]
) -> dict[str, Any]:
    args = [*argv, "--endpoint", endpoint, *load.argv()]
    args += ["--broker-pid", str(bpid), "--worker-pids", pid_list(wpids)]
    proc: Proc = procs.start("client", *args)
    return proc.result(CLIENT_SLACK + load.duration)


def _rotated(sides: Sequence[str], r: int) -> list[str]:
    k = r % len(sides) if sides else 0
    return [*sides[k:], *sides[:k]]


def _check(rec: dict[str, Any]) -> None:
    """A run whose replies did not all come back is a failure, not a figure."""
    if rec["lost"] or rec["errors"] or rec["unexpected"] or not rec["requests"]:
        raise ProcessFailed(
            f"{rec['requests']} requests, lost {rec['lost']}, errors {rec['errors']}, "
            f"unexpected {rec['unexpected']}"
        )


def workers_round(
    r: int, sides: Sequence[str], load: Load, log_dir: Path, log: Log
) -> list[dict[str, Any]]:
    """One round of the workers table: each side with a broker and workers of its own."""
    out: list[dict[str, Any]] = []
    for side in _rotated(sides, r):
        rec: dict[str, Any] = {"table": "workers", "round": r, "side": side, **asdict(load)}
        with Procs(log_dir) as procs:
            try:
                endpoint, _, bpid = start_broker(procs, "dcp")
                wpids = _workers(procs, WORKER_SIDES[side], endpoint, WORKERS)
                rec.update(_client(procs, WORKERS_CLIENT, load, endpoint, bpid, wpids))
                _check(rec)
            except ProcessFailed as exc:
                rec["error"] = f"{exc}\n{procs.tails()}"
                log(f"workers {side} round {r}: FAILED {rec['error']}")
            else:
                log(
                    f"workers {side} round {r}: {rec['rate']:.0f} req/s, workers "
                    f"{_python(rec):.1f} us/req (Python), {rec['workers_zmq_cpu_us']:.1f} (zmq)"
                )
        out.append(rec)
    return out


def clients_round(
    r: int, sides: Sequence[str], load: Load, log_dir: Path, log: Log
) -> list[dict[str, Any]]:
    """One round of the clients table: one broker and one worker for every side."""
    out: list[dict[str, Any]] = []
    with Procs(log_dir) as procs:
        try:
            endpoint, _, bpid = start_broker(procs, "dcp")
            wpids = _workers(procs, CLIENTS_WORKER, endpoint, 1)
        except ProcessFailed as exc:
            log(f"clients round {r}: failed to start: {exc}\n{procs.tails()}")
            return [
                {"table": "clients", "round": r, "side": s, **asdict(load), "error": str(exc)}
                for s in sides
            ]
        for side in _rotated(sides, r):
            rec: dict[str, Any] = {"table": "clients", "round": r, "side": side, **asdict(load)}
            try:
                rec.update(_client(procs, CLIENT_SIDES[side], load, endpoint, bpid, wpids))
                _check(rec)
            except ProcessFailed as exc:
                rec["error"] = f"{exc}\n{procs.tails()}"
                log(f"clients {side} round {r}: FAILED {rec['error']}")
            else:
                log(
                    f"clients {side} round {r}: p50 {rec['p50_us']:.0f} us, client "
                    f"{rec['client_thread_cpu_us']:.1f} us/req (loop thread)"
                )
            out.append(rec)
    return out


def run(
    rounds: int,
    profile: str,
    log_dir: Path,
    log: Log = _log,
    tables: Sequence[str] = TABLES,
    worker_sides: Sequence[str] = tuple(WORKER_SIDES),
    client_sides: Sequence[str] = tuple(CLIENT_SIDES),
) -> dict[str, Any]:
    """Run the rounds; the raw records and what they were measured on."""
    from .run import machine

    raise_fd_limit()
    skipped: dict[str, str] = {}
    for side in worker_sides:
        if (why := missing(side)) is not None:
            log(f"worker side {side} skipped: {why}")
            skipped[side] = why
    worker_sides = [s for s in worker_sides if s not in skipped]
    loads = PROFILES[profile]
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    for r in range(rounds):
        if "workers" in tables:
            records += workers_round(r, worker_sides, loads.workers, log_dir, log)
        if "clients" in tables:
            records += clients_round(r, client_sides, loads.clients, log_dir, log)
    return {
        "rounds": rounds,
        "profile": profile,
        "skipped": skipped,
        "machine": machine(),
        "duration_s": round(time.monotonic() - started, 1),
        "records": records,
    }


def _python(rec: dict[str, Any]) -> float:
    """The workers' CPU per request in their Python threads (all but libzmq's)."""
    return float(rec["workers_main_cpu_us"] + rec["workers_other_cpu_us"])


#: Per table: (figure name, how to read it from a record, decimals, ratio to the anchor).
_Figure = tuple[str, Callable[[dict[str, Any]], float], int, bool]
FIGURES: dict[str, tuple[_Figure, ...]] = {
    "workers": (
        ("req/s", lambda r: float(r["rate"]), 0, True),
        ("worker Python CPU us/req", _python, 1, True),
        ("of which main thread", lambda r: float(r["workers_main_cpu_us"]), 1, False),
        ("zmq I/O thread", lambda r: float(r["workers_zmq_cpu_us"]), 1, False),
        ("client CPU us/req", lambda r: float(r["client_cpu_us"]), 1, False),
    ),
    "clients": (
        ("p50 us", lambda r: float(r["p50_us"]), 0, True),
        ("client loop-thread CPU us/req", lambda r: float(r["client_thread_cpu_us"]), 1, True),
        ("client process CPU us/req", lambda r: float(r["client_cpu_us"]), 1, False),
        ("worker CPU us/req", lambda r: _python(r) + float(r["workers_zmq_cpu_us"]), 1, False),
    ),
}


def summarise(records: Sequence[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    """One row per side of ``table``: per figure the median over rounds and (where the
    figure has one) the median of the same-round ratios side / :data:`ANCHOR`."""
    mine = [r for r in records if r["table"] == table]
    ok = [r for r in mine if "error" not in r]
    anchor = {r["round"]: r for r in ok if r["side"] == ANCHOR}
    rows = []
    for side in dict.fromkeys(r["side"] for r in mine):
        runs = {r["round"]: r for r in ok if r["side"] == side}
        row: dict[str, Any] = {
            "side": side,
            "runs": (len(runs), sum(r["side"] == side for r in mine)),
        }
        for name, get, _, ratio in FIGURES[table]:
            values = [get(r) for r in runs.values()]
            row[name] = statistics.median(values) if values else None
            if ratio:
                row[f"{name} ratio"] = _ratios(runs, anchor, get)
                bare = {r["round"]: r for r in ok if r["side"] == BARE.get(side)}
                row[f"{name} loop ratio"] = _ratios(runs, bare, get)
        rows.append(row)
    return rows


def _ratios(
    runs: dict[int, dict[str, Any]],
    anchor: dict[int, dict[str, Any]],
    get: Callable[[dict[str, Any]], float],
) -> float | None:
    """The median of the same-round ratios ``runs`` / ``anchor``; None without a pair."""
    ratios = [get(runs[n]) / get(anchor[n]) for n in runs if n in anchor and get(anchor[n])]
    return statistics.median(ratios) if ratios else None


def _num(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


_TITLES = {
    "workers": f"Workers at concurrency 1 ({WORKERS} processes, one dcp.Client on asyncio at "
    "window 64, 16 B echo, `dcp broker`)",
    "clients": "Clients at window 1 (one `dcp broker`, one blocking pyzmq worker, 16 B echo)",
}


def render_table(records: Sequence[dict[str, Any]], table: str) -> str:
    """The markdown table of one of :data:`TABLES`."""
    figures = FIGURES[table]
    head = ["side"]
    for name, _, _, ratio in figures:
        head += [name, f"x {ANCHOR}", "x loop"] if ratio else [name]
    lines = [
        f"### {_TITLES[table]}",
        "",
        "| " + " | ".join([*head, "runs ok"]) + " |",
        "|" + "---|" * (len(head) + 1),
    ]
    for row in summarise(records, table):
        cells = [row["side"]]
        for name, _, digits, ratio in figures:
            cells.append(_num(row[name], digits))
            if ratio:
                cells += [_ratio(row[f"{name} ratio"]), _ratio(row[f"{name} loop ratio"])]
        cells.append(f"{row['runs'][0]}/{row['runs'][1]}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _foreign(records: Sequence[dict[str, Any]]) -> str:
    """The median of the load other processes put on the machine during the runs."""
    loads = [float(r["foreign_load"]) for r in records if "foreign_load" in r]
    return f"{statistics.median(loads):.2f}" if loads else "-"


def render(results: dict[str, Any]) -> str:
    """Both tables, with what they were measured on."""
    mach = results["machine"]
    out = [
        f"{results['rounds']} interleaved round(s) ({results['profile']}), "
        f"{results['duration_s']:.0f} s, {mach['date']}; {mach['nproc']} CPUs; Python "
        f"{mach['python']}, pyzmq {mach['pyzmq']}, libzmq {mach['libzmq']}; dcp commit "
        f"{mach['commit']}. Medians over rounds; *x {ANCHOR}*: median of same-round ratios "
        f"side / {ANCHOR}; *x loop*: the same against the bare loop on the side's backend "
        f"({', '.join(f'{k}: {v}' for k, v in BARE.items())}); other processes used "
        f"{_foreign(results['records'])} CPUs meanwhile (median).",
        "",
    ]
    for table in TABLES:
        if any(r["table"] == table for r in results["records"]):
            out += [render_table(results["records"], table)]
    for side, why in results.get("skipped", {}).items():
        out += [f"Side *{side}* skipped: {why}.", ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="shorter loads")
    group.add_argument("--tiny", action="store_true", help="seconds (the smoke test)")
    parser.add_argument("--tables", default=",".join(TABLES), help="comma-separated subset")
    parser.add_argument(
        "--workers", default=",".join(WORKER_SIDES), help="worker sides, comma-separated"
    )
    parser.add_argument(
        "--clients", default=",".join(CLIENT_SIDES), help="client sides, comma-separated"
    )
    parser.add_argument("--out", type=Path, default=None, help="save the raw records (JSON)")
    args = parser.parse_args(argv)
    tables = [t for t in args.tables.split(",") if t]
    worker_sides = [s for s in args.workers.split(",") if s]
    client_sides = [s for s in args.clients.split(",") if s]
    for names, known in (
        (tables, TABLES),
        (worker_sides, WORKER_SIDES),
        (client_sides, CLIENT_SIDES),
    ):
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"unknown: {', '.join(unknown)} (known: {', '.join(known)})")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    profile = "tiny" if args.tiny else "quick" if args.quick else "full"
    from .run import exclusive

    # A tiny run (the smoke test) neither waits for nor blocks a real run.
    lock = exclusive(1800.0) if not args.tiny else contextlib.nullcontext()
    with lock, tempfile.TemporaryDirectory(prefix="dcp-bench-floor-") as tmp:
        results = run(
            args.rounds, profile, Path(tmp), tables=tables,
            worker_sides=worker_sides, client_sides=client_sides,
        )  # fmt: skip
    results["command"] = "python -m " + " ".join(["benchmarks.floor", *(argv or sys.argv[1:])])
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    failed = [r for r in results["records"] if "error" in r]
    if failed:
        print(f"{len(failed)} failed runs", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
