"""The chaos test's worker and client processes (started by :mod:`benchmarks.chaos`).

``python -m benchmarks.chaos_peers worker --endpoint E --events FILE [--mode M]`` runs one
:class:`dcp.Worker`. Its handler answers ``[b"ok:" + payload, pid]`` after ``--work``
seconds. In a hang mode the first ``--hang-count`` requests hang for ``--hang-for`` seconds
first: ``M=hang-async`` awaits (the event loop runs on, so the worker
keeps sending keep-alives and the broker keeps it), ``hang-block`` calls :func:`time.sleep`
(the whole process stalls, heartbeats stop, the broker drops the worker). Every handler run
and every hang is appended to the ``--events`` file with one ``write`` each (``O_APPEND``), so
the lines survive a SIGKILL. It prints ``READY <pid>`` once the broker has echoed its
registration and stops gracefully on SIGTERM. With ``--park`` it first prints
``PARKED <pid>`` once started and connects only on SIGUSR1 (so the chaos run can have it
join at a given moment however long the process took to start).

``python -m benchmarks.chaos_peers client --endpoint E --name c0 --start T --until T
[--mode async|sync]`` sends requests with unique payloads ``<name>:<seq>`` from
``time.monotonic()`` ``--start`` until ``--until`` (the clock is shared by every process on
the machine); with ``--start-file F --run-for S`` instead, from the time the orchestrator
writes to ``F`` once every client is ready (``READY``) for ``S`` seconds. It sends
``--window`` at a time, with the client's retries, and checks every reply: it
must carry its own payload (else *wrong*), and no payload may reach the application twice
(else *duplicate*). ``async`` runs :class:`dcp.Client` with ``window`` tasks calling
``request()``; ``sync`` runs :class:`dcp.SyncClient.map_unordered`. After ``--until`` the
requests in flight get ``--drain`` more seconds; those still open then are *unfinished*. The
last stdout line is a JSON record (counts, the client's ``statistics()``, replies per
``--bucket`` of time since ``--start``, a latency histogram in ms, replies per worker pid and
the slow replies).

``python -m benchmarks.chaos_peers broker ARGS...`` is a parked ``dcp broker ARGS...``: it
imports dcp, prints ``PARKED <pid>`` and runs the broker only on SIGUSR1 (so the chaos run
restarts a broker at once, whatever a new process takes to start on a loaded machine).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs

import dcp

from .common import ready

__all__ = ["EventLog", "Tally", "main", "read_events"]

#: Most slow replies listed (see ``--slow``).
MAX_SLOW = 5000


class EventLog:
    """Append-only JSON lines, one ``os.write`` each, so they survive SIGKILL."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **fields: Any) -> None:
        os.write(self._fd, (json.dumps(fields, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def read_events(path: str) -> list[dict[str, Any]]:
    """The records of an event file (a torn last line, from a SIGKILL mid-write, is skipped)."""
    events: list[dict[str, Any]] = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return events


# --------------------------------------------------------------------------- worker


def worker_argv(
    endpoint: str,
    events: str,
    *,
    backend: str = "trio",
    service: str = "chaos",
    mode: str = "normal",
    count: int = 1,
    work: float = 0.001,
    hang_for: float = 3.0,
    hang_count: int = 1,
    heartbeat: float = 1.0,
    liveness: int = 3,
    kind: str = "dcp",
    park: bool = False,
) -> list[str]:
    """The arguments of ``python -m`` for a worker process."""
    return [
        "benchmarks.chaos_peers",
        "--backend",
        backend,
        "worker",
        "--endpoint",
        endpoint,
        "--events",
        events,
        "--service",
        service,
        "--mode",
        mode,
        "--count",
        str(count),
        "--work",
        str(work),
        "--hang-for",
        str(hang_for),
        "--hang-count",
        str(hang_count),
        "--heartbeat-interval",
        str(heartbeat),
        "--liveness",
        str(liveness),
        "--kind",
        kind,
        *(["--park"] if park else []),
    ]


async def _serve_workers(args: argparse.Namespace) -> None:
    if args.park:
        with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as sigs:
            sys.stdout.write(f"PARKED {os.getpid()}\n")
            sys.stdout.flush()
            async for signum in sigs:
                if signum != signal.SIGUSR1:
                    return  # stopped before it joined
                break
    log = EventLog(args.events)
    pid = os.getpid()
    pid_bytes = str(pid).encode()
    hangs_left = args.hang_count if args.mode != "normal" else 0

    async def handler(request: dcp.HandlerRequest) -> list[bytes]:
        nonlocal hangs_left
        payload = request.data[0] if request.data else b""
        rid = payload.decode(errors="replace")
        log.write(ev="run", id=rid, pid=pid, t=time.monotonic())
        if hangs_left > 0:
            hangs_left -= 1
            log.write(ev="hang", mode=args.mode, id=rid, pid=pid, t=time.monotonic())
            cancelled = True
            try:
                if args.mode == "hang-block":
                    time.sleep(args.hang_for)  # noqa: ASYNC251 (the point: a stalled process)
                else:
                    await anyio.sleep(args.hang_for)
                cancelled = False
            finally:
                # Cancelled: the worker gave up at the request's work timeout.
                log.write(ev="hang_end", id=rid, pid=pid, t=time.monotonic(), cancelled=cancelled)
        elif args.work > 0:
            await anyio.sleep(args.work)
        return [b"ok:" + payload, pid_bytes]

    workers = [
        dcp.Worker(
            args.endpoint,
            args.service,
            handler,
            concurrency=args.concurrency,
            heartbeat_interval=args.heartbeat_interval,
            liveness=args.liveness,
        )
        for _ in range(args.count)
    ]
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            for worker in workers:
                await tg.start(worker.serve)
            log.write(ev="ready", pid=pid, t=time.monotonic(), service=args.service)
            ready(str(pid))
            async for _ in signals:
                for worker in workers:
                    worker.stop(grace=0.5)
                break
    for worker in workers:
        log.write(
            ev="stopped", pid=pid, t=time.monotonic(), stats=attrs.asdict(worker.statistics())
        )
    log.close()


# --------------------------------------------------------------------------- client


class Tally:
    """What one client process saw, checked reply by reply."""

    def __init__(self, name: str, start: float, bucket: float, slow: float = 0.3) -> None:
        self.name = name
        self.slow_after = slow
        self.start = start
        self.bucket = bucket
        self.sent = 0
        self.replies = 0
        self.wrong = 0
        self.duplicates = 0
        self.timeouts = 0
        self.errors: Counter[str] = Counter()
        self.delivered: set[bytes] = set()
        #: Replies per time bucket since ``start``.
        self.timeline: Counter[int] = Counter()
        #: Replies per whole millisecond of latency.
        self.latency_ms: Counter[int] = Counter()
        self.by_worker: Counter[str] = Counter()
        #: ``[payload, worker pid, latency s]`` of replies slower than ``slow`` seconds.
        self.slow: list[list[Any]] = []

    def payload(self, seq: int) -> bytes:
        self.sent += 1
        return f"{self.name}:{seq}".encode()

    def reply(self, payload: bytes, data: Sequence[bytes], sent_at: float) -> None:
        now = time.monotonic()
        if len(data) != 2 or data[0] != b"ok:" + payload:
            self.wrong += 1
            return
        if payload in self.delivered:
            self.duplicates += 1
            return
        self.delivered.add(payload)
        self.replies += 1
        self.timeline[int((now - self.start) / self.bucket)] += 1
        latency = now - sent_at
        self.latency_ms[int(latency * 1000)] += 1
        worker = data[1].decode(errors="replace")
        self.by_worker[worker] += 1
        if latency >= self.slow_after and len(self.slow) < MAX_SLOW:
            self.slow.append([payload.decode(), worker, round(latency, 4)])

    def record(self, stats: dcp.ClientStatistics, mode: str) -> dict[str, Any]:
        answered = self.replies + self.wrong + sum(self.errors.values()) + self.timeouts
        return {
            "name": self.name,
            "mode": mode,
            "sent": self.sent,
            "replies": self.replies,
            "wrong": self.wrong,
            "duplicates": self.duplicates,
            "timeouts": self.timeouts,
            "unfinished": max(0, self.sent - answered),
            "errors": dict(self.errors),
            "stats": attrs.asdict(stats),
            "timeline": {str(k): v for k, v in sorted(self.timeline.items())},
            "latency_ms": {str(k): v for k, v in sorted(self.latency_ms.items())},
            "by_worker": dict(self.by_worker),
            "slow": self.slow,
        }


def _client_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        # --timeout is per attempt (as the chaos figures were measured): the attempts alone
        # bound each call.
        "timeout": math.inf,
        "attempt_timeout": args.timeout,
        "retries": args.retries,
        "backoff": args.backoff,
        "backoff_max": args.backoff_max,
        "work_timeout": args.work_timeout,
        # Through broker restarts: a new broker has no workers until they re-register.
        "wait_for_worker": True,
    }


async def _wait_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await anyio.sleep(delay)


#: Seconds a client waits for its ``--start-file`` (a hang guard).
START_FILE_WAIT = 300.0


def _start_known(args: argparse.Namespace) -> bool:
    """Whether the start time is known: given (``--start``), or written to ``--start-file``
    (then ``args.start`` and ``args.until`` are set from it)."""
    if args.start_file is None:
        return True
    try:
        text = Path(args.start_file).read_text()
    except FileNotFoundError:
        return False
    args.start = float(text)
    args.until = args.start + args.run_for
    return True


async def _run_async_client(args: argparse.Namespace) -> dict[str, Any]:
    service = args.service.encode()
    seq = itertools.count()
    async with dcp.Client(args.endpoint, **_client_options(args)) as client:
        ready(args.name)
        with anyio.fail_after(START_FILE_WAIT):
            while not _start_known(args):  # noqa: ASYNC110 - polling a file
                await anyio.sleep(0.01)
        tally = Tally(args.name, args.start, args.bucket, args.slow)
        await _wait_until(args.start)

        async def loop() -> None:
            while time.monotonic() < args.until:
                payload = tally.payload(next(seq))
                sent_at = time.monotonic()
                try:
                    response = await client.request(service, payload)
                except dcp.RequestTimeout:
                    tally.timeouts += 1
                except dcp.RemoteError as exc:
                    tally.errors[exc.code] += 1
                else:
                    tally.reply(payload, response.data, sent_at)

        with anyio.move_on_after(args.until + args.drain - time.monotonic()):
            async with anyio.create_task_group() as tg:
                for _ in range(args.window):
                    tg.start_soon(loop)
        return tally.record(client.statistics(), f"async/{args.backend}")


def _run_sync_client(args: argparse.Namespace) -> dict[str, Any]:
    service = args.service.encode()
    seq = itertools.count()
    with dcp.SyncClient(args.endpoint, **_client_options(args)) as client:
        ready(args.name)
        give_up = time.monotonic() + START_FILE_WAIT
        while not _start_known(args):
            if time.monotonic() > give_up:
                raise SystemExit(f"chaos_peers client: nothing in {args.start_file}")
            time.sleep(0.01)
        tally = Tally(args.name, args.start, args.bucket, args.slow)
        time.sleep(max(0.0, args.start - time.monotonic()))
        while time.monotonic() < args.until:
            batch: list[tuple[bytes, float]] = []

            def payloads(batch: list[tuple[bytes, float]] = batch) -> Iterator[bytes]:
                while time.monotonic() < args.until:
                    payload = tally.payload(next(seq))
                    batch.append((payload, time.monotonic()))
                    yield payload

            try:
                for i, response in client.map_unordered(service, payloads(), window=args.window):
                    tally.reply(batch[i][0], response.data, batch[i][1])
            except dcp.RequestTimeout:
                tally.timeouts += 1  # the map's other requests in flight end unfinished
            except dcp.RemoteError as exc:
                tally.errors[exc.code] += 1
        return tally.record(client.statistics(), "sync")


async def _one(
    client: dcp.Client, service: str, payload: bytes, work_timeout: float, attempt: float
) -> dict[str, Any]:
    """One request, no retries: what came back and when."""
    sent_at = time.monotonic()
    out: dict[str, Any] = {"id": payload.decode()}
    try:
        response = await client.request(
            service, payload, work_timeout=work_timeout, timeout=attempt, retries=0
        )
    except dcp.RemoteError as exc:
        out.update(error=exc.code, message=exc.message)
    except dcp.RequestTimeout:
        out.update(error="timeout")
    else:
        data = response.data
        out.update(ok=len(data) == 2 and data[0] == b"ok:" + payload, pid=int(data[1]))
    out["latency_s"] = round(time.monotonic() - sent_at, 4)
    return out


async def _run_deadline_client(args: argparse.Namespace) -> dict[str, Any]:
    """One long job (``slow``), one job no worker finishes (``doomed``) and a stream of
    short ones (``fast``), each with its own work timeout and no client retries: every
    rescue is the broker's."""
    tally = Tally("fast", args.start, args.bucket, 0.5 * args.fast_work_timeout)
    result: dict[str, Any] = {}
    seq = itertools.count()
    async with dcp.Client(args.endpoint, retries=0) as client:
        ready("deadlines")
        await _wait_until(args.start)

        async def slow() -> None:
            result["slow"] = await _one(
                client, "slow", b"slow:0", args.slow_work_timeout, args.slow_timeout
            )

        async def doomed() -> None:
            await anyio.sleep(0.2)
            result["doomed"] = await _one(
                client, "doomed", b"doomed:0", args.doomed_work_timeout, args.slow_timeout
            )

        async def fast() -> None:
            while time.monotonic() < args.until:
                payload = tally.payload(next(seq))
                sent_at = time.monotonic()
                try:
                    response = await client.request(
                        "fast",
                        payload,
                        work_timeout=args.fast_work_timeout,
                        timeout=args.fast_timeout,
                        retries=0,
                    )
                except dcp.RequestTimeout:
                    tally.timeouts += 1
                except dcp.RemoteError as exc:
                    tally.errors[exc.code] += 1
                else:
                    tally.reply(payload, response.data, sent_at)

        with anyio.move_on_after(args.until + args.drain - time.monotonic()):
            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                tg.start_soon(doomed)
                for _ in range(args.window):
                    tg.start_soon(fast)
        result["fast"] = tally.record(client.statistics(), f"async/{args.backend}")
    return result


# --------------------------------------------------------------------------- main


def _parked_broker(dcp_args: list[str]) -> int:
    """``dcp broker dcp_args`` once SIGUSR1 comes (the module docstring); 0 if SIGTERM or
    SIGINT came first."""
    wake = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}
    # Blocked before anything starts a thread, so that sigwait() gets them all.
    signal.pthread_sigmask(signal.SIG_BLOCK, wake)
    from dcp._cli import main as dcp_main

    sys.stdout.write(f"PARKED {os.getpid()}\n")
    sys.stdout.flush()
    received = signal.sigwait(wake)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, wake)
    if received != signal.SIGUSR1:
        return 0
    return dcp_main(["broker", *dcp_args])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos_peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("worker")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--service", default="chaos")
    p.add_argument("--events", required=True, help="file to append events to")
    p.add_argument("--mode", choices=["normal", "hang-async", "hang-block"], default="normal")
    p.add_argument("--hang-count", type=int, default=1, help="requests that hang")
    p.add_argument("--hang-for", type=float, default=3.0, help="seconds")
    p.add_argument("--work", type=float, default=0.001, help="seconds per request")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--count", type=int, default=1, help="workers in this process")
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--liveness", type=int, default=3)
    p.add_argument(
        "--kind",
        choices=["dcp", "majortomo", "dagbox"],
        default="dcp",
        help="dcp.Worker, or a worker that is silent while busy (benchmarks.chaos_silent)",
    )
    p.add_argument(
        "--park", action="store_true", help="print PARKED, connect only on SIGUSR1 (dcp only)"
    )

    p = sub.add_parser("client")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--service", default="chaos")
    p.add_argument("--name", required=True, help="prefix of this client's payloads")
    p.add_argument("--mode", choices=["async", "sync"], default="async")
    p.add_argument("--start", type=float, help="time.monotonic() to start at")
    p.add_argument("--until", type=float, help="time.monotonic() to stop at")
    p.add_argument("--start-file", help="instead of --start: a file to read it from, once ready")
    p.add_argument("--run-for", type=float, help="with --start-file: seconds of load")
    p.add_argument("--drain", type=float, default=20.0, help="seconds for the last replies")
    p.add_argument("--window", type=int, default=16, help="requests in flight")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds per attempt")
    p.add_argument("--retries", type=int, default=10)
    p.add_argument("--backoff", type=float, default=0.05)
    p.add_argument("--backoff-max", type=float, default=1.0)
    p.add_argument("--bucket", type=float, default=0.01, help="timeline resolution, seconds")
    p.add_argument("--work-timeout", type=float, default=None, help="per request, seconds")
    p.add_argument("--slow", type=float, default=0.3, help="list replies slower than this, s")

    p = sub.add_parser("deadline-client")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--start", type=float, required=True, help="time.monotonic() to start at")
    p.add_argument("--until", type=float, required=True, help="time.monotonic() to stop at")
    p.add_argument("--drain", type=float, default=20.0, help="seconds for the last replies")
    p.add_argument("--window", type=int, default=8, help="fast requests in flight")
    p.add_argument("--bucket", type=float, default=0.01, help="timeline resolution, seconds")
    p.add_argument("--slow-work-timeout", type=float, required=True)
    p.add_argument("--slow-timeout", type=float, required=True, help="slow and doomed jobs")
    p.add_argument("--doomed-work-timeout", type=float, required=True)
    p.add_argument("--fast-work-timeout", type=float, required=True)
    p.add_argument("--fast-timeout", type=float, required=True)

    sub.add_parser("broker", help="a parked `dcp broker` (the arguments that follow)")

    args, rest = parser.parse_known_args(argv)
    if args.command == "broker":
        sys.exit(_parked_broker(rest))
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "worker":
        if args.kind == "dcp":
            anyio.run(_serve_workers, args, backend=args.backend)
        else:
            from . import chaos_silent

            serve = {
                "majortomo": chaos_silent.serve_majortomo,
                "dagbox": chaos_silent.serve_dagbox,
            }
            serve[args.kind](args, EventLog(args.events).write)
        return
    if getattr(args, "start_file", None) is not None:
        if args.run_for is None or args.run_for < 0:
            raise SystemExit("chaos_peers client: --start-file needs --run-for seconds")
    elif args.start is None or args.until is None:
        raise SystemExit("chaos_peers client: give --start and --until, or --start-file")
    elif not math.isfinite(args.until) or args.until < args.start:
        raise SystemExit("chaos_peers client: --until must be a time after --start")
    if args.command == "deadline-client":
        record = anyio.run(_run_deadline_client, args, backend=args.backend)
    elif args.mode == "sync":
        record = _run_sync_client(args)
    else:
        record = anyio.run(_run_async_client, args, backend=args.backend)
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
