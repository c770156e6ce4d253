"""Two brokers, one SIGKILLed and restarted again and again (issue 28's failover figure).

``python -m benchmarks.failover [--brokers 2] [--workers 4] [--clients 2] [--in-flight 16]
[--duration 60] [--period 10] [--downtime 0] [--sync] [--failover-grace S] [--json FILE]
[--raw FILE] [--logs DIR]``

Processes (``tcp://127.0.0.1`` on free ports, each started here and ended by its PID
whatever happens): ``--brokers`` ``dcp broker`` processes; ``--workers`` worker processes and
``--clients`` client processes of this module (the ``worker`` and ``client`` sub-commands),
each given every broker's endpoint. Each client keeps ``--in-flight`` requests of a unique
payload (``<client>:<seq>``) in flight with :meth:`dcp.Client.request` for ``--duration``
seconds (``wait_for_worker=True``: a restarted broker has no workers until they register
again); each worker echoes the payload after appending it to an event file (one ``write``
each). Every ``--period`` seconds one broker is SIGKILLed (the first, then the second, ...)
and a new ``dcp broker`` is started on the same port ``--downtime`` seconds later (it was
started beforehand and parked, so a slow process start does not add to the downtime).

Figures (also the ``--json`` document):

- *sent*, *answered*, *lost* (a call that raised: its error's type is counted), *hung*
  (a call still pending ``--drain`` seconds after the load stopped; each call is bounded by
  its ``--timeout`` anyway), *wrong* (a reply that is not the request's payload);
- *run twice*: payloads the workers ran more than once, all workers together (their event
  files), each with how long after the last kill it was sent, and the handler runs in all;
- latency p50 / p99 / max of the answered calls, overall and *around the kills*: the calls in
  flight at any moment of the ``--window`` seconds (2) after a kill;
- per kill: which broker, when the new one had bound (seconds after the kill), and when it
  carried traffic again: the first of its ``mmi.broker`` documents (polled every 20 ms from
  its restart) that counts a worker reply;
- broker CPU (``/proc/<pid>/stat``, every incarnation, read just before its kill or stop) per
  answered request, and the requests each incarnation carried (its last ``mmi.broker``).

``--sync`` runs the clients with :meth:`dcp.SyncClient.map_unordered` (window
``--in-flight``; a call that raises ends its map, whose other calls count as *hung*).
``--brokers 1`` is the single-broker restart path for comparison (the clients wait for the
broker to come back). ``--raw`` writes every call (sent at, latency, payload), ``--logs``
keeps every process's stderr and the run file. ``python -m benchmarks.capacity`` reuses the
peers.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import attrs

import dcp

from .chaos_peers import EventLog, read_events
from .common import cpu_seconds, percentile, ready
from .procs import Proc, Procs, alive
from .variants import free_port

__all__ = [
    "Settings",
    "broker_document",
    "client_argv",
    "endpoint_arg",
    "main",
    "render",
    "run",
    "summarise",
    "worker_argv",
]

#: Seconds a process has to start (and a parked broker to bind) on a loaded machine.
START_TIMEOUT = 60.0
#: Seconds between two ``mmi.broker`` polls of a restarted broker.
POLL_EVERY = 0.02
#: The echo service the peers serve and call.
SERVICE = "failover"


def endpoint_arg(endpoints: Sequence[str]) -> Any:
    """What :class:`dcp.Client` and :class:`dcp.Worker` are given: one endpoint as a ``str``
    (exactly today's single-broker path), several as a list."""
    return endpoints[0] if len(endpoints) == 1 else list(endpoints)


# --------------------------------------------------------------------------- worker


def worker_argv(
    endpoints: Sequence[str], events: str | None, *, concurrency: int, work: float = 0.0
) -> list[str]:
    """The arguments of ``python -m`` for a worker process (``events``: ``None`` logs no
    run)."""
    argv = ["benchmarks.failover", "worker", "--endpoints", ",".join(endpoints)]
    argv += ["--concurrency", str(concurrency), "--work", str(work)]
    return argv + (["--events", events] if events else [])


async def _serve_worker(args: argparse.Namespace) -> None:
    log = EventLog(args.events) if args.events else None
    work = args.work

    async def handler(request: dcp.HandlerRequest) -> bytes:
        payload = request.data[0] if request.data else b""
        if log is not None:
            log.write(id=payload.decode(errors="replace"))
        if work > 0:
            await anyio.sleep(work)
        return payload

    worker = dcp.Worker(
        endpoint_arg(args.endpoints.split(",")),
        SERVICE,
        handler,
        concurrency=args.concurrency,
    )
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            await tg.start(worker.serve)
            ready(str(os.getpid()))
            async for _ in signals:
                worker.stop(grace=1.0)
                break
    record: dict[str, Any] = {"pid": os.getpid(), "stats": attrs.asdict(worker.statistics())}
    per_broker = getattr(worker, "brokers", None)  # issue 28: per-broker counters
    if callable(per_broker):  # {endpoint: WorkerStatistics}
        record["brokers"] = {str(ep): _plain(b) for ep, b in per_broker().items()}
    if log is not None:
        log.close()
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _plain(value: Any) -> Any:
    """A JSON-able form of an attrs or dataclass value (else its ``repr``)."""
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if isinstance(value, dict | list | str | int | float | bool) or value is None:
        return value
    return repr(value)


# --------------------------------------------------------------------------- client


def client_argv(
    endpoints: Sequence[str],
    name: str,
    start_file: str,
    *,
    run_for: float,
    in_flight: int,
    timeout: float,
    drain: float,
    calls: bool = True,
    rate: float = 0.0,
    sync: bool = False,
    failover_grace: float | None = None,
) -> list[str]:
    """The arguments of ``python -m`` for a client process (``calls=False``: no per-call
    record, counts only; ``rate``: requests per second, at most ``in_flight`` at once; 0: as
    fast as ``in_flight`` allows, not with ``sync``; ``sync``: a :class:`dcp.SyncClient`;
    ``failover_grace``: the client's, ``None`` its default)."""
    argv = ["benchmarks.failover", "client", "--endpoints", ",".join(endpoints)]
    argv += ["--name", name, "--start-file", start_file, "--run-for", str(run_for)]
    argv += ["--in-flight", str(in_flight), "--timeout", str(timeout), "--drain", str(drain)]
    argv += ["--rate", str(rate)]
    if failover_grace is not None:
        argv += ["--failover-grace", str(failover_grace)]
    return argv + ([] if calls else ["--no-calls"]) + (["--sync"] if sync else [])


def _start_time(path: str) -> float | None:
    """The start time the run wrote to ``path`` (``None``: not yet)."""
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    return float(text) if text else None


class Tally:
    """What one client process saw, call by call."""

    def __init__(self, name: str, keep_calls: bool) -> None:
        self.name = name
        self.keep_calls = keep_calls
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        #: (sent at, latency, payload) of the answered calls, monotonic seconds.
        self.answered: list[tuple[float, float, bytes]] = []
        #: (sent at, ended at, error type) of the calls that raised.
        self.failed: list[tuple[float, float, str]] = []

    def payload(self, k: int) -> bytes:
        self.counts["sent"] += 1
        return f"{self.name}:{k}".encode()

    def reply(self, payload: bytes, data: Sequence[bytes], sent_at: float) -> None:
        if tuple(data) != (payload,):
            self.counts["wrong"] += 1
            return
        self.counts["answered"] += 1
        if self.keep_calls:
            self.answered.append((sent_at, time.monotonic() - sent_at, payload))

    def error(self, exc: BaseException, sent_at: float) -> None:
        what = type(exc).__name__
        self.errors[what] += 1
        if self.keep_calls:
            self.failed.append((sent_at, time.monotonic(), what))

    def record(self, stats: Any) -> dict[str, Any]:
        c = self.counts
        lost = sum(self.errors.values())
        return {
            "name": self.name,
            "pid": os.getpid(),
            "sent": c["sent"],
            "answered": c["answered"],
            "wrong": c["wrong"],
            "lost": lost,
            "hung": c["sent"] - c["answered"] - c["wrong"] - lost,
            "errors": dict(self.errors),
            "stats": attrs.asdict(stats),
            "calls": [
                [round(s, 6), round(latency, 6), p.decode()] for s, latency, p in self.answered
            ],
            "failed": [[round(s, 6), round(e, 6), what] for s, e, what in self.failed],
        }


def _client_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"timeout": args.timeout, "wait_for_worker": True}
    if args.failover_grace is not None:
        options["failover_grace"] = args.failover_grace
    return options


async def _run_client(args: argparse.Namespace) -> dict[str, Any]:
    seq = itertools.count()
    tally = Tally(args.name, args.calls)
    async with dcp.Client(
        endpoint_arg(args.endpoints.split(",")), **_client_options(args)
    ) as client:
        ready(args.name)
        with anyio.fail_after(START_TIMEOUT * 5):
            while (start := _start_time(args.start_file)) is None:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        until = start + args.run_for
        await anyio.sleep(max(0.0, start - time.monotonic()))

        async def loop() -> None:
            while time.monotonic() < until:
                k = next(seq)
                if args.rate > 0:  # the k-th request's time; late ones go at once
                    await anyio.sleep(max(0.0, start + k / args.rate - time.monotonic()))
                    if time.monotonic() >= until:
                        break
                payload = tally.payload(k)
                sent_at = time.monotonic()
                try:
                    response = await client.request(SERVICE, payload)
                except dcp.DCPError as exc:
                    tally.error(exc, sent_at)
                else:
                    tally.reply(payload, response.data, sent_at)

        with anyio.move_on_after(max(0.0, until + args.drain - time.monotonic())):
            async with anyio.create_task_group() as tg:
                for _ in range(args.in_flight):
                    tg.start_soon(loop)
        return tally.record(client.statistics())


def _run_async_client(args: argparse.Namespace) -> dict[str, Any]:
    record: dict[str, Any] = anyio.run(_run_client, args, backend="trio")
    return record


def _run_sync_client(args: argparse.Namespace) -> dict[str, Any]:
    """The same load through :meth:`dcp.SyncClient.map_unordered` (``--in-flight`` its
    window). A call that raises ends the map (its other calls in flight end *hung*); the next
    map starts at once. Each call is bounded by ``--timeout``."""
    seq = itertools.count()
    tally = Tally(args.name, args.calls)
    endpoint = endpoint_arg(args.endpoints.split(","))
    with dcp.SyncClient(endpoint, **_client_options(args)) as client:
        ready(args.name)
        give_up = time.monotonic() + START_TIMEOUT * 5
        while (start := _start_time(args.start_file)) is None:
            if time.monotonic() > give_up:
                raise SystemExit(f"no start time in {args.start_file}")
            time.sleep(0.01)
        until = start + args.run_for
        time.sleep(max(0.0, start - time.monotonic()))
        while time.monotonic() < until:
            batch: list[tuple[bytes, float]] = []

            def payloads(batch: list[tuple[bytes, float]] = batch) -> Iterator[bytes]:
                while time.monotonic() < until:
                    payload = tally.payload(next(seq))
                    batch.append((payload, time.monotonic()))
                    yield payload

            try:
                for i, response in client.map_unordered(
                    SERVICE, payloads(), window=args.in_flight
                ):
                    tally.reply(batch[i][0], response.data, batch[i][1])
            except dcp.DCPError as exc:
                tally.error(exc, time.monotonic())
        return tally.record(client.statistics())


# --------------------------------------------------------------------------- brokers


def broker_document(endpoint: str, timeout: float = 1.0) -> dict[str, Any] | None:
    """One broker's ``mmi.broker`` document (``None``: no answer within ``timeout``)."""
    try:
        with dcp.SyncClient(endpoint, timeout=timeout, retries=0) as client:
            doc: dict[str, Any] = json.loads(client.request("mmi.broker").data[0])
            return doc
    except (dcp.DCPError, ValueError, IndexError):
        return None


def broker_argv(endpoint: str, *, parked: bool) -> list[str]:
    """``python -m`` arguments of a broker on ``endpoint`` (``parked``: it binds on SIGUSR1,
    :mod:`benchmarks.chaos_peers`)."""
    head = ["benchmarks.chaos_peers", "broker"] if parked else ["dcp", "broker"]
    return [*head, "--bind", endpoint]


@dataclass
class Incarnation:
    """One broker process: its figures once it is gone."""

    slot: int
    pid: int
    cpu_s: float = 0.0
    replies: int = 0
    requests: int = 0


class Slot:
    """One broker endpoint: the process serving it now and a parked one to take over."""

    def __init__(self, procs: Procs, index: int, endpoint: str) -> None:
        self.procs = procs
        self.index = index
        self.endpoint = endpoint
        self.generation = 0
        self.live: Proc | None = None
        self.spare: Proc | None = None
        self.done: list[Incarnation] = []

    def start(self) -> None:
        self.live = self.procs.start(
            f"broker{self.index}", *broker_argv(self.endpoint, parked=False)
        )

    def park(self) -> None:
        self.generation += 1
        name = f"broker{self.index}-{self.generation}"
        self.spare = self.procs.start(name, *broker_argv(self.endpoint, parked=True))

    def wait_parked(self) -> None:
        assert self.spare is not None
        line = self.spare.read_line(START_TIMEOUT)
        if not line.startswith("PARKED"):
            raise RuntimeError(f"parked broker said {line!r}")

    def retire(self, *, kill: bool) -> float:
        """Record the live broker's figures, then SIGKILL it (``kill``) or stop it; returns
        the (monotonic) time of the signal."""
        proc = self.live
        assert proc is not None
        doc = broker_document(self.endpoint, timeout=0.2 if kill else 1.0)
        inc = Incarnation(self.index, proc.pid)
        with contextlib.suppress(OSError):
            inc.cpu_s = cpu_seconds(proc.pid)
        if doc is not None:
            inc.replies, inc.requests = int(doc["replies"]), int(doc["requests"])
        signalled = time.monotonic()
        if kill:
            os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait(10)
        else:
            proc.kill()
        self.done.append(inc)
        self.live = None
        return signalled

    def restart(self) -> None:
        """The parked broker binds (SIGUSR1); returns once it printed its endpoint."""
        assert self.spare is not None
        self.live, self.spare = self.spare, None
        os.kill(self.live.pid, signal.SIGUSR1)
        self.live.wait_ready(START_TIMEOUT)


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Settings:
    """One failover run."""

    brokers: int = 2
    workers: int = 4
    clients: int = 2
    in_flight: int = 16
    concurrency: int = 8
    duration: float = 60.0
    period: float = 10.0
    downtime: float = 0.0
    window: float = 2.0
    timeout: float = 30.0
    drain: float = 35.0
    sync: bool = False
    failover_grace: float | None = None


def kill_times(settings: Settings) -> list[float]:
    """Seconds after the start of the load at which a broker is killed."""
    n = int((settings.duration - 1e-9) // settings.period)
    return [settings.period * (k + 1) for k in range(n)]


def run(settings: Settings, log_dir: Path, log: Any = print) -> dict[str, Any]:
    """Run once; the raw figures (:func:`summarise` makes the report)."""
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(settings.brokers)]
    events = log_dir / "runs.jsonl"
    start_file = log_dir / "start"
    for path in (events, start_file):
        path.unlink(missing_ok=True)
    kills: list[dict[str, Any]] = []
    pids: list[int] = []
    with Procs(log_dir) as procs:
        slots = [Slot(procs, i, ep) for i, ep in enumerate(endpoints)]
        for slot in slots:
            slot.start()
        for slot in slots:
            assert slot.live is not None
            slot.live.wait_ready(START_TIMEOUT)
            slot.park()
        workers = [
            procs.start(
                f"worker{i}",
                *worker_argv(endpoints, str(events), concurrency=settings.concurrency),
            )
            for i in range(settings.workers)
        ]
        clients = [
            procs.start(
                f"client{i}",
                *client_argv(
                    endpoints,
                    f"c{i}",
                    str(start_file),
                    run_for=settings.duration,
                    in_flight=settings.in_flight,
                    timeout=settings.timeout,
                    drain=settings.drain,
                    sync=settings.sync,
                    failover_grace=settings.failover_grace,
                ),
            )
            for i in range(settings.clients)
        ]
        for proc in [*workers, *clients]:
            proc.wait_ready(START_TIMEOUT)
        for slot in slots:
            slot.wait_parked()
        pids += [p.pid for p in procs.procs]
        for slot in slots:  # each answers (and the first SyncClient's imports are done)
            if broker_document(slot.endpoint, timeout=START_TIMEOUT) is None:
                raise RuntimeError(f"broker {slot.endpoint} does not answer mmi.broker")
        log(f"{len(endpoints)} brokers, {len(workers)} workers, {len(clients)} clients ready")
        start = time.monotonic() + 0.2
        start_file.write_text(repr(start))
        for k, at in enumerate(kill_times(settings)):
            slot = slots[k % len(slots)]
            time.sleep(max(0.0, start + at - time.monotonic()))
            killed_at = slot.retire(kill=True)
            time.sleep(settings.downtime)
            restart_at = time.monotonic()
            slot.restart()
            bound_at = time.monotonic()
            traffic_at = _wait_for_traffic(slot.endpoint, start + at + settings.period)
            kills.append(
                {
                    "at": round(killed_at - start, 3),
                    "broker": slot.index,
                    "restart_s": round(restart_at - killed_at, 3),
                    "bound_s": round(bound_at - killed_at, 3),
                    "traffic_s": None if traffic_at is None else round(traffic_at - killed_at, 3),
                    "killed_monotonic": killed_at,
                }
            )
            log(f"kill {k + 1}: broker {slot.index} at {killed_at - start:.1f} s: {kills[-1]}")
            slot.park()
            slot.wait_parked()
            if slot.spare is not None:
                pids.append(slot.spare.pid)
            if slot.live is not None:
                pids.append(slot.live.pid)
        wait = settings.duration + settings.drain + START_TIMEOUT
        client_records = [c.result(wait) for c in clients]
        for w in workers:
            os.kill(w.pid, signal.SIGTERM)
        worker_records = [w.result(START_TIMEOUT) for w in workers]
        for slot in slots:
            slot.retire(kill=False)
        incarnations = [asdict(inc) for slot in slots for inc in slot.done]
    runs = Counter(str(e.get("id")) for e in read_events(str(events)))
    return {
        "settings": asdict(settings),
        "start_monotonic": start,
        "kills": kills,
        "clients": client_records,
        "workers": worker_records,
        "brokers": incarnations,
        "handler_runs": sum(runs.values()),
        "run_twice": sum(1 for n in runs.values() if n > 1),
        "run_twice_ids": sorted(i for i, n in runs.items() if n > 1),
        "leftovers": [pid for pid in pids if alive(pid)],
    }


def _wait_for_traffic(endpoint: str, give_up: float) -> float | None:
    """When the broker at ``endpoint`` first counted a worker reply (``None``: not before
    ``give_up``, a monotonic time)."""
    with dcp.SyncClient(endpoint, timeout=0.5, retries=0) as client:
        while time.monotonic() < give_up:
            try:
                doc = json.loads(client.request("mmi.broker").data[0])
            except dcp.DCPError:
                continue
            if doc.get("replies", 0) > 0:
                return time.monotonic()
            time.sleep(POLL_EVERY)
    return None


# --------------------------------------------------------------------------- report


def _latencies(calls: Iterator[list[float]]) -> dict[str, float]:
    values = sorted(c[1] for c in calls)
    return {
        "calls": len(values),
        "p50_ms": round(percentile(values, 0.5) * 1000, 2),
        "p99_ms": round(percentile(values, 0.99) * 1000, 2),
        "max_ms": round((values[-1] if values else 0.0) * 1000, 2),
    }


def _after_kill(raw: dict[str, Any], ids: set[str], calls: list[list[Any]]) -> list[list[Any]]:
    """``[payload, seconds from the last kill before it was sent]`` of each answered call in
    ``ids`` (``None``: sent before the first kill)."""
    kills = sorted(k["killed_monotonic"] for k in raw["kills"])
    out: list[list[Any]] = []
    for call in calls:
        if len(call) > 2 and call[2] in ids:
            before = [k for k in kills if k <= call[0]]
            out.append([call[2], round(call[0] - before[-1], 3) if before else None])
    return sorted(out, key=lambda x: str(x[0]))


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run (the module docstring)."""
    settings = raw["settings"]
    clients = raw["clients"]
    total = {k: sum(c[k] for c in clients) for k in ("sent", "answered", "lost", "hung", "wrong")}
    errors: Counter[str] = Counter()
    for c in clients:
        errors.update(c["errors"])
    calls = [call for c in clients for call in c["calls"]]
    window = settings["window"]
    kills = raw["kills"]

    def around(kill: dict[str, Any]) -> Iterator[list[float]]:
        at = kill["killed_monotonic"]
        return (c for c in calls if c[0] < at + window and c[0] + c[1] > at)

    per_kill = []
    for kill in kills:
        row = {k: v for k, v in kill.items() if k != "killed_monotonic"}
        row.update(_latencies(around(kill)))
        per_kill.append(row)
    in_failover = [c for kill in kills for c in around(kill)]
    cpu = sum(b["cpu_s"] for b in raw["brokers"])
    worker_stats: Counter[str] = Counter()
    for w in raw["workers"]:
        worker_stats.update({k: v for k, v in w["stats"].items() if isinstance(v, int)})
    traffic = [k["traffic_s"] for k in kills if k["traffic_s"] is not None]
    return {
        "settings": settings,
        **total,
        "errors": dict(errors),
        "run_twice": raw["run_twice"],
        "run_twice_after_kill": _after_kill(raw, set(raw["run_twice_ids"]), calls),
        "handler_runs": raw["handler_runs"],
        "latency": _latencies(iter(calls)),
        "latency_in_failover": _latencies(iter(in_failover)),
        "kills": per_kill,
        "traffic_s_max": max(traffic) if traffic else None,
        "traffic_missing": sum(1 for k in kills if k["traffic_s"] is None),
        "broker_cpu_s": round(cpu, 3),
        "broker_cpu_us_per_request": round(cpu * 1e6 / total["answered"], 1)
        if total["answered"]
        else None,
        "brokers": raw["brokers"],
        "client_stats": [c["stats"] for c in clients],
        "worker_stats": dict(worker_stats),
        "leftovers": raw["leftovers"],
    }


def render(summary: dict[str, Any], command: str) -> str:
    """A short Markdown report of :func:`summarise`'s figures."""
    s = summary["settings"]
    lat, fo = summary["latency"], summary["latency_in_failover"]
    lines = [
        f"`{command}`: {s['brokers']} brokers, {s['workers']} workers (concurrency "
        f"{s['concurrency']}), {s['clients']} {'SyncClients' if s.get('sync') else 'clients'} "
        f"x {s['in_flight']} in flight, "
        f"{s['duration']:g} s, a broker SIGKILLed every {s['period']:g} s "
        f"(restarted after {s['downtime']:g} s)"
        + (
            ""
            if s.get("failover_grace") is None
            else f", failover_grace {s['failover_grace']:g} s"
        ),
        "",
        "| sent | answered | lost | hung | wrong | run twice | p50 | p99 | p99 in failover "
        "| max | broker CPU / request |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {summary['sent']} | {summary['answered']} | {summary['lost']} | {summary['hung']} "
        f"| {summary['wrong']} | {summary['run_twice']} | {lat['p50_ms']:.1f} ms "
        f"| {lat['p99_ms']:.1f} ms | {fo['p99_ms']:.1f} ms | {fo['max_ms']:.0f} ms "
        f"| {_us(summary['broker_cpu_us_per_request'])} |",
        "",
        f"| kill at | broker | bound after | traffic after | calls in the {s['window']:g} s after "
        "| p50 | p99 | max |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k in summary["kills"]:
        traffic = "never" if k["traffic_s"] is None else f"{k['traffic_s']:.2f} s"
        lines.append(
            f"| {k['at']:.1f} s | {k['broker']} | {k['bound_s']:.2f} s | {traffic} "
            f"| {k['calls']} | {k['p50_ms']:.1f} ms | {k['p99_ms']:.1f} ms "
            f"| {k['max_ms']:.0f} ms |"
        )
    after = summary.get("run_twice_after_kill") or []
    if after:
        text = ", ".join(f"{i} {'-' if t is None else f'{t:.2f} s'}" for i, t in after[:20])
        lines += ["", f"Run twice (sent this long after the last kill): {text}"]
    if summary["errors"]:
        lines += ["", "Errors: " + ", ".join(f"{k} {v}" for k, v in summary["errors"].items())]
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} µs"


# --------------------------------------------------------------------------- main


def _peer_parser(sub: Any) -> None:
    p = sub.add_parser("worker", help="a worker process (started by the run)")
    p.add_argument("--endpoints", required=True, help="comma-separated")
    p.add_argument("--events", help="append each run's payload here")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--work", type=float, default=0.0, help="seconds per request")
    p = sub.add_parser("client", help="a client process (started by the run)")
    p.add_argument("--endpoints", required=True, help="comma-separated")
    p.add_argument("--name", required=True)
    p.add_argument("--start-file", required=True, help="the start time appears here")
    p.add_argument("--run-for", type=float, required=True, help="seconds of load")
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--timeout", type=float, default=30.0, help="per call, seconds")
    p.add_argument("--drain", type=float, default=35.0, help="seconds for the last calls")
    p.add_argument("--rate", type=float, default=0.0, help="requests/s (0: closed loop)")
    p.add_argument("--sync", action="store_true", help="dcp.SyncClient.map_unordered")
    p.add_argument("--failover-grace", type=float, help="the client's (default: its own)")
    p.add_argument("--no-calls", dest="calls", action="store_false", help="counts only")


def peer_main(args: argparse.Namespace) -> None:
    """Run the ``worker`` or ``client`` sub-command."""
    if args.command == "worker":
        anyio.run(_serve_worker, args, backend="trio")
        return
    run_client = _run_sync_client if args.sync else _run_async_client
    record = run_client(args)
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.failover",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = Settings()
    parser.add_argument("--brokers", type=int, default=d.brokers)
    parser.add_argument("--workers", type=int, default=d.workers, help="worker processes")
    parser.add_argument("--clients", type=int, default=d.clients, help="client processes")
    parser.add_argument("--in-flight", type=int, default=d.in_flight, help="per client")
    parser.add_argument("--concurrency", type=int, default=d.concurrency, help="per worker")
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds of load")
    parser.add_argument("--period", type=float, default=d.period, help="seconds between kills")
    parser.add_argument("--downtime", type=float, default=d.downtime, help="kill to restart, s")
    parser.add_argument("--window", type=float, default=d.window, help="after a kill, s")
    parser.add_argument("--timeout", type=float, default=d.timeout, help="per call, seconds")
    parser.add_argument("--drain", type=float, default=d.drain, help="after the load, s")
    parser.add_argument(
        "--sync", action="store_true", help="clients: dcp.SyncClient.map_unordered"
    )
    parser.add_argument("--failover-grace", type=float, help="the clients' (default: theirs)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--raw", help="write every call's record here")
    parser.add_argument("--logs", help="keep the processes' logs in this directory")
    sub = parser.add_subparsers(dest="command")
    _peer_parser(sub)
    args = parser.parse_args(argv)
    if args.command is not None:
        peer_main(args)
        return 0
    if args.brokers < 1 or args.workers < 1 or args.clients < 1 or args.in_flight < 1:
        parser.error("--brokers, --workers, --clients and --in-flight must be at least 1")
    if args.period <= 0 or args.duration <= 0:
        parser.error("--period and --duration must be positive")
    settings = Settings(
        brokers=args.brokers,
        workers=args.workers,
        clients=args.clients,
        in_flight=args.in_flight,
        concurrency=args.concurrency,
        duration=args.duration,
        period=args.period,
        downtime=args.downtime,
        window=args.window,
        timeout=args.timeout,
        drain=args.drain,
        sync=args.sync,
        failover_grace=args.failover_grace,
    )

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.logs:  # kept: every process's stderr and the workers' run file
        Path(args.logs).mkdir(parents=True, exist_ok=True)
        raw = run(settings, Path(args.logs), log=say)
    else:
        with tempfile.TemporaryDirectory(prefix="dcp-failover-") as tmp:
            raw = run(settings, Path(tmp), log=say)
    summary = summarise(raw)
    summary["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    summary["command"] = "python -m benchmarks.failover " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    if args.raw:
        Path(args.raw).write_text(json.dumps(raw))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(render(summary, summary["command"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
