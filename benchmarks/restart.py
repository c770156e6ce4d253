"""A broker SIGKILLed and restarted while long jobs run (issue 17's figure).

``python -m benchmarks.restart [--jobs 8] [--work 3] [--downtime 0.5] [--rounds 3]``

Processes (``tcp://127.0.0.1`` on a free port, killed by PID whatever happens): a ``dcp
broker``, and :mod:`benchmarks.chaos_peers` worker processes (``--jobs`` slots in all, each
job taking ``--work`` seconds). This process runs one :class:`dcp.Client` that sends
``--jobs`` requests at once (attempt timeout ``--attempt-timeout``, 10 s by default:
longer than a restart), waits until every job has started (the workers' event file says
so) and then until the jobs are about to end, SIGKILLs the broker, starts a new one on the
same port ``--downtime`` seconds later (the jobs end about 0.3 s after that, before the
workers' next heartbeat), and waits for every reply. Expected: every job answered, each
run exactly once, no client retry, nothing refused by the new broker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

import dcp

from .chaos_peers import read_events, worker_argv
from .procs import Procs, alive
from .variants import free_port

__all__ = ["main", "run_round"]

START_TIMEOUT = 30.0


def run_round(
    *, jobs: int, work: float, downtime: float, attempt_timeout: float, log_dir: Path
) -> dict[str, Any]:
    """One round; its figures."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    events = log_dir / "events.jsonl"
    events.unlink(missing_ok=True)
    pids: list[int] = []
    with Procs(log_dir) as procs:
        broker_argv = ["dcp", "broker", "--bind", endpoint, "--heartbeat-interval", "0.25"]
        broker = procs.start("broker", *broker_argv)
        broker.wait_ready(START_TIMEOUT)
        pids.append(broker.pid)
        workers = []
        for i in range(jobs // 2):
            argv = worker_argv(endpoint, str(events), count=2, work=work)  # heartbeat 1 s
            workers.append(procs.start(f"worker-{i}", *argv))
        for w in workers:
            w.wait_ready(START_TIMEOUT)
            pids.append(w.pid)
        kill_at: list[float] = []

        async def drive() -> dict[str, Any]:
            nonlocal broker
            replies: dict[bytes, bytes] = {}
            errors: Counter[str] = Counter()
            async with (
                dcp.Client(
                    endpoint,
                    timeout=attempt_timeout * 3,
                    attempt_timeout=attempt_timeout,
                    retries=2,
                    wait_for_worker=True,  # a restarted broker has no workers for a moment
                ) as client,
                anyio.create_task_group() as tg,
            ):

                async def call(i: int) -> None:
                    payload = b"job:%d" % i
                    try:
                        reply = await client.request("chaos", payload)
                    except dcp.DCPError as exc:  # counted: the round fails
                        errors[type(exc).__name__ + ": " + str(exc)[:60]] += 1
                        return
                    replies[payload] = reply.data[0]

                for i in range(jobs):
                    tg.start_soon(call, i)
                with anyio.fail_after(START_TIMEOUT):
                    while _started(events) < jobs:  # noqa: ASYNC110 - another process's file
                        await anyio.sleep(0.02)
                # The worst moment: the jobs end just after the new broker is up, before the
                # workers' next heartbeat could tell them it does not know them.
                await anyio.sleep(max(0.0, work - downtime - 0.3))
                os.kill(broker.pid, signal.SIGKILL)
                kill_at.append(time.monotonic())
                broker.popen.wait(10)
                await anyio.sleep(downtime)
                broker = procs.start("broker-2", *broker_argv)
                await anyio.to_thread.run_sync(broker.wait_ready, START_TIMEOUT)
                pids.append(broker.pid)
            stats = client.statistics()
            return {
                "answered": sum(1 for p, r in replies.items() if r == b"ok:" + p),
                "errors": dict(errors),
                "client_retries": stats.retries,
                "client_duplicates_dropped": stats.duplicates,
                "reply_after_kill_s": round(time.monotonic() - kill_at[0], 2),
            }

        figures = anyio.run(drive, backend="trio")
        broker.popen.send_signal(signal.SIGINT)  # a graceful stop logs its statistics
        broker.popen.wait(10)
        log = broker.log_path.read_text(errors="replace")
    runs = Counter(str(e["id"]) for e in read_events(str(events)) if e.get("ev") == "run")
    rejections: dict[str, int] = {}
    for line in log.splitlines():
        if "rejections=" in line:
            rejections = _rejections(line)
    figures.update(
        jobs=jobs,
        handler_runs=sum(runs.values()),
        jobs_run_more_than_once=sum(1 for n in runs.values() if n > 1),
        new_broker_rejections=rejections,
        leftovers=[pid for pid in pids if alive(pid)],
    )
    return figures


def _started(events: Path) -> int:
    return sum(1 for e in read_events(str(events)) if e.get("ev") == "run")


def _rejections(line: str) -> dict[str, int]:
    text = line.split("rejections=", 1)[1].split("}", 1)[0] + "}"
    out: dict[str, int] = {}
    for item in text.strip("{}").split(","):
        if ":" in item:
            key, value = item.split(":", 1)
            out[key.strip().strip("'\"")] = int(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.restart", description=__doc__)
    parser.add_argument("--jobs", type=int, default=8, help="jobs (even: 2 per worker process)")
    parser.add_argument("--work", type=float, default=3.0, help="seconds per job")
    parser.add_argument("--downtime", type=float, default=0.5, help="seconds without a broker")
    parser.add_argument("--attempt-timeout", type=float, default=10.0, help="client, seconds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the rounds' figures here")
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.jobs % 2:
        parser.error("--jobs must be even and at least 2")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="dcp-restart-") as tmp:
        for i in range(args.rounds):
            fig = run_round(
                jobs=args.jobs,
                work=args.work,
                downtime=args.downtime,
                attempt_timeout=args.attempt_timeout,
                log_dir=Path(tmp),
            )
            rounds.append(fig)
            print(f"round {i + 1}: {json.dumps(fig)}", flush=True)
    ok = all(
        f["answered"] == f["jobs"]
        and f["handler_runs"] == f["jobs"]
        and f["client_retries"] == 0
        and not f["new_broker_rejections"]
        and not f["leftovers"]
        for f in rounds
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "ok": ok}, indent=1))
    print("every job answered, run once, no retry, nothing refused" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
