"""The per-request deadline scenario of the chaos test (``python -m benchmarks.chaos
--scenario deadlines``): long jobs and short ones side by side, each with its own work
timeout.

Processes (``tcp://127.0.0.1``, killed by PID whatever happens): the broker
(``--max-redeliveries``), and :mod:`benchmarks.chaos_peers` workers:

- ``slow``: two workers whose jobs take ``slow_work`` seconds;
- ``fast``: two workers answering in a millisecond, and one more that hangs (``await``, so
  its heartbeats go on) on its first request;
- ``doomed``: two workers that hang on every request.

One client (:mod:`benchmarks.chaos_peers` ``deadline-client``, no client retries) sends one
``slow`` job with a work timeout ten times its length, one ``doomed`` job with a short work
timeout, and a stream of ``fast`` requests with a short work timeout, until the slow job
should be done. Expected: the slow job completes, run once; every fast request is answered,
the hung one by another worker about one work timeout later; the doomed job ends in a
``redelivery_limit`` error after ``max_redeliveries + 1`` runs.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import chaos_figures
from .chaos_peers import read_events, worker_argv
from .procs import Proc, Procs, alive, count_tracebacks
from .variants import free_port

__all__ = ["DeadlineConfig", "render", "run"]

START_TIMEOUT = 30.0


@dataclass(frozen=True)
class DeadlineConfig:
    """One deadline run. Times in seconds."""

    slow_work: float = 3.0
    fast_work_timeout: float = 0.5
    doomed_work_timeout: float = 0.3
    max_redeliveries: int = 3
    #: Requests the hanging ``fast`` worker hangs on (then it works normally).
    fast_hangs: int = 1
    #: Liveness (2 s) is not what this scenario is about: long enough that a busy machine
    #: does not make the broker drop a worker for silence.
    heartbeat: float = 0.25
    liveness: int = 8
    window: int = 8
    #: Seconds between starting the client and the start of the load.
    client_start: float = 1.0
    logs: str | None = None

    @property
    def slow_work_timeout(self) -> float:
        return 10 * self.slow_work

    @property
    def fast_timeout(self) -> float:
        """The fast requests' attempt timeout: long enough for every broker rescue."""
        return 10 * self.fast_work_timeout + 5.0


def run(cfg: DeadlineConfig) -> dict[str, Any]:
    """Run the scenario; returns its record (settings, figures, leftovers)."""
    tmp = None
    if cfg.logs is None:
        tmp = tempfile.TemporaryDirectory(prefix="dcp-deadlines-")
        log_dir = Path(tmp.name)
    else:
        log_dir = Path(cfg.logs)
        log_dir.mkdir(parents=True, exist_ok=True)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    events = str(log_dir / "events.jsonl")
    Path(events).unlink(missing_ok=True)  # a reused --logs directory starts afresh
    pids: list[int] = []
    try:
        with Procs(log_dir) as procs:
            try:
                client, broker_log = _drive(cfg, procs, endpoint, events, pids)
            except BaseException:
                sys.stderr.write(procs.tails(12) + "\n")
                raise
        leftovers = [pid for pid in pids if alive(pid)]
        tracebacks = count_tracebacks(log_dir)
        worker_events = read_events(events)
    finally:
        if tmp is not None:
            tmp.cleanup()
    figures = compute(
        client, worker_events, chaos_figures.broker_statistics(broker_log), cfg.max_redeliveries
    )
    return {
        "scenario": "deadlines",
        "config": asdict(cfg),
        "endpoint": endpoint,
        "figures": figures,
        "processes": len(pids),
        "leftovers": leftovers,
        "tracebacks": tracebacks,
    }


def _drive(
    cfg: DeadlineConfig, procs: Procs, endpoint: str, events: str, pids: list[int]
) -> tuple[dict[str, Any], str]:
    def start(name: str, *args: str) -> Proc:
        proc = procs.start(name, *args)
        pids.append(proc.pid)
        return proc

    def worker(name: str, service: str, **options: Any) -> Proc:
        argv = worker_argv(
            endpoint,
            events,
            service=service,
            heartbeat=cfg.heartbeat,
            liveness=cfg.liveness,
            **options,
        )
        return start(name, *argv)

    broker = start(
        "broker",
        "dcp",
        "broker",
        "-v",  # INFO: its counters are logged when it stops
        "--bind",
        endpoint,
        "--heartbeat-interval",
        str(cfg.heartbeat),
        "--liveness",
        str(cfg.liveness),
        "--max-redeliveries",
        str(cfg.max_redeliveries),
    )
    broker.wait_ready(START_TIMEOUT)
    hang = {"mode": "hang-async", "hang_for": 600.0}
    workers = [
        worker("slow", "slow", count=2, work=cfg.slow_work),
        worker("fast", "fast", count=2, backend="asyncio"),
        worker("fast-hang", "fast", hang_count=cfg.fast_hangs, **hang),
        worker("doomed", "doomed", count=2, hang_count=10**6, backend="asyncio", **hang),
    ]
    for proc in workers:
        proc.wait_ready(START_TIMEOUT)
    t0 = time.monotonic() + cfg.client_start
    until = t0 + cfg.slow_work + 1.0
    client = start(
        "client",
        "benchmarks.chaos_peers",
        "deadline-client",
        "--endpoint",
        endpoint,
        "--start",
        repr(t0),
        "--until",
        repr(until),
        "--drain",
        str(cfg.slow_work_timeout + cfg.fast_timeout),
        "--window",
        str(cfg.window),
        "--slow-work-timeout",
        str(cfg.slow_work_timeout),
        "--slow-timeout",
        str(cfg.slow_work_timeout + 5.0),
        "--doomed-work-timeout",
        str(cfg.doomed_work_timeout),
        "--fast-work-timeout",
        str(cfg.fast_work_timeout),
        "--fast-timeout",
        str(cfg.fast_timeout),
    )
    client.wait_ready(START_TIMEOUT)
    record = client.result(cfg.client_start + cfg.slow_work_timeout * 2 + cfg.fast_timeout + 30)
    broker.kill(grace=5.0)  # a graceful stop: the broker logs its counters
    return record, broker.log_path.read_text(errors="replace")


def compute(
    client: Mapping[str, Any],
    worker_events: list[dict[str, Any]],
    broker_stats: Mapping[str, Any],
    max_redeliveries: int,
) -> dict[str, Any]:
    """The scenario's figures."""
    runs = Counter(str(ev["id"]) for ev in worker_events if ev.get("ev") == "run")
    hang_ends = {str(ev["id"]): ev for ev in worker_events if ev.get("ev") == "hang_end"}
    fast = client["fast"]
    slow = dict(client.get("slow") or {"error": "unfinished"})
    doomed = dict(client.get("doomed") or {"error": "unfinished"})
    slow["runs"] = runs["slow:0"]
    doomed["runs"] = runs["doomed:0"]
    hangs = chaos_figures.hangs(
        [ev for ev in worker_events if ev.get("ev") == "hang" and ev["id"] != "doomed:0"],
        [fast],
    )
    for hang in hangs:
        end = hang_ends.get(hang["id"])
        hang["worker_cancelled"] = bool(end and end.get("cancelled"))
    return {
        "slow": slow,
        "doomed": doomed,
        "doomed_runs_expected": max_redeliveries + 1,
        "fast": {
            key: fast[key]
            for key in ("sent", "replies", "wrong", "duplicates", "timeouts", "unfinished")
        }
        | {"errors": fast["errors"], "retries": fast["stats"]["retries"]},
        "fast_hangs": hangs,
        "broker_last": dict(broker_stats),
    }


def _rows(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    cfg = record["config"]
    fig = record["figures"]
    slow, doomed, fast = fig["slow"], fig["doomed"], fig["fast"]
    hangs = fig["fast_hangs"]
    answered = [h for h in hangs if h["answered"]]
    latencies = sorted(h["latency_s"] for h in answered)
    broker = fig["broker_last"]
    return [
        (f"slow job ({cfg['slow_work']:g} s of work, work timeout {cfg['slow_work'] * 10:g} s)",
         _outcome(slow)),
        ("slow job: runs", str(slow["runs"])),
        (f"fast requests (work timeout {cfg['fast_work_timeout']:g} s): sent / answered",
         f"{fast['sent']} / {fast['replies']}"),
        ("fast: lost / wrong / duplicates / client retries",
         f"{fast['timeouts'] + fast['unfinished']} / {fast['wrong']} / {fast['duplicates']} / "
         f"{fast['retries']}"),
        ("fast: error replies", _codes(fast["errors"])),
        ("fast: hung requests answered / by another worker process",
         f"{len(answered)} / {sum(h['elsewhere'] for h in hangs)} of {len(hangs)}"),
        ("fast: hung request answered after, s (median)",
         f"{latencies[len(latencies) // 2]:.2f}" if latencies else "-"),
        ("fast: hung handlers cancelled by their worker",
         str(sum(h["worker_cancelled"] for h in hangs))),
        (f"doomed job (work timeout {cfg['doomed_work_timeout']:g} s, every worker hangs)",
         _outcome(doomed)),
        (f"doomed job: runs (max_redeliveries {cfg['max_redeliveries']} + 1)",
         str(doomed["runs"])),
        ("broker: work timeouts / redeliveries / workers dropped for silence",
         f"{broker.get('work_timeouts')} / {broker.get('redeliveries')} / "
         f"{broker.get('expired_workers')}"),
    ]  # fmt: skip


def render(records: Sequence[Mapping[str, Any]]) -> str:
    """The figures of one or more rounds as a Markdown table (a column per round)."""
    columns = [_rows(rec) for rec in records]
    if len(columns) == 1:
        head = ["| figure | value |", "|---|---:|"]
    else:
        rounds = " | ".join(f"round {i + 1}" for i in range(len(columns)))
        head = [f"| figure | {rounds} |", "|---|" + "---:|" * len(columns)]
    lines = [
        f"| {name} | " + " | ".join(col[i][1] for col in columns) + " |"
        for i, (name, _) in enumerate(columns[0])
    ]
    return "\n".join(head + lines)


def _codes(errors: Mapping[str, int]) -> str:
    return ", ".join(f"{code} {n}" for code, n in sorted(errors.items())) or "0"


def _outcome(job: Mapping[str, Any]) -> str:
    if "error" in job:
        return f"error `{job['error']}` after {job.get('latency_s', 0):.2f} s"
    return f"{'answered' if job.get('ok') else 'WRONG reply'} after {job['latency_s']:.2f} s"
