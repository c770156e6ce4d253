"""Chaos test: real broker, worker and client processes under load, with faults on a seeded
schedule, and the figures that show nothing was lost or delivered twice.

``python -m benchmarks.chaos [--duration S] [--workers N] [--clients N] [--seed N]
[--rounds N] [--work-timeout S] [--json FILE]``; ``--scenario deadlines`` runs
:mod:`benchmarks.chaos_deadlines` instead. ``--rounds`` repeats the run with the next seeds
and prints medians.

Processes (all on ``tcp://127.0.0.1``, each started by :class:`benchmarks.procs.Procs` and
killed by its PID whatever happens):

- the broker: ``python -m dcp broker --bind tcp://127.0.0.1:PORT`` (a port picked free
  first, so a restarted broker comes back on the same address); each successor is started
  with the others, parked (:mod:`benchmarks.chaos_peers` ``broker``), and only woken at its
  restart, so a restart does not wait for a new process to start;
- ``--workers`` echo workers (:mod:`benchmarks.chaos_peers` ``worker``, one
  :class:`dcp.Worker` each, trio and asyncio in turn);
- ``--clients`` load generators (:mod:`benchmarks.chaos_peers` ``client``: even ones
  :class:`dcp.Client` on trio or asyncio with ``--window`` tasks calling ``request()``, odd
  ones :class:`dcp.SyncClient` ``map_unordered``), every request with a unique payload, every
  reply checked. The load (and the schedule below) starts ``client_start`` seconds after
  every client is ready, however long their processes took to start.

The run is ``--cycles`` cycles (default: one per 20 s), each split into phases:

1. *steady* (20%): load only; its last seconds are the throughput baseline;
2. *broker down*: the broker is SIGKILLed, and restarted on the same port ``--downtime``
   seconds later; *broker recovery* lasts until 45% of the cycle;
3. *worker kills* (to 70%): a random worker is SIGKILLed about every ``--kill-every``
   seconds and a fresh one started in its place;
4. *hangs* (to the end): two extra workers join, each hanging on its first request for
   ``--hang-for`` seconds: ``hang-async`` awaits (it keeps heartbeating, so it keeps
   its request and answers it when the hang ends, the client's retries joining it, routing
   Rule R8; with ``--work-timeout`` the broker gives it to another worker), ``hang-block``
   stalls its process (its heartbeats
   stop and the broker drops it and redelivers the request). Both leave at the end of the
   cycle. Their processes are started with the others and wait, parked, for their moment
   (``chaos_peers worker --park``): a process that is slow to start (a loaded machine) would
   otherwise join after the load ended and never hang.

Figures: requests sent, replies received (each checked against its payload), lost
(``RequestTimeout`` or not answered by the end of the drain), wrong replies, duplicates
delivered to the application, the clients' retries and dropped duplicate or late replies,
handler runs (work done, at least once per request), per-fault confirmation, recovery after
each broker restart (first reply, and 50% / 90% of the baseline throughput), and the replies
per second of each phase. See ``docs/reliability.md``, "Chaos test".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import chaos_deadlines, chaos_figures
from .chaos_deadlines import DeadlineConfig
from .chaos_figures import Phase
from .chaos_peers import read_events, worker_argv
from .procs import Proc, ProcessFailed, Procs, alive, count_tracebacks
from .variants import free_port

__all__ = ["Config", "Event", "main", "run", "schedule"]

_KINDS = ("dcp", "majortomo", "dagbox")
#: Seconds a process may take to start (import, connect, register).
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class Config:
    """One chaos run. Times in seconds."""

    duration: float = 60.0
    #: Fault cycles; 0: one per 20 s of ``duration``.
    cycles: int = 0
    workers: int = 4
    clients: int = 2
    window: int = 16
    seed: int = 1
    heartbeat: float = 0.2
    liveness: int = 3
    #: Client: seconds per attempt, resends, first and largest backoff.
    timeout: float = 1.5
    retries: int = 10
    backoff: float = 0.05
    backoff_max: float = 1.0
    #: Work timeout each request carries (``None``: none; the async hang then keeps its
    #: request until it ends).
    work_timeout: float | None = None
    #: Mean seconds between worker SIGKILLs in the worker-kills phase.
    kill_every: float = 0.8
    #: Seconds between a broker's SIGKILL and the start of its successor.
    downtime: float = 0.5
    hang_for: float = 2.5
    #: Seconds a worker spends on each request.
    work: float = 0.001
    #: Seconds the clients get, after the load stops, for their last replies.
    drain: float = 20.0
    #: Seconds between the clients being ready and the start of the load.
    client_start: float = 1.5
    bucket: float = 0.01
    #: ``dcp``: every worker is a :class:`dcp.Worker`; ``mixed``: the workers take turns
    #: being a dcp worker, majortomo's MDP/0.2 Worker and a DagBox-style DCP worker (4-byte
    #: types), the last two silent while busy (:mod:`benchmarks.chaos_silent`).
    peers: str = "dcp"
    #: Extra ``dcp broker`` arguments.
    broker_args: tuple[str, ...] = ()
    #: Where the logs and event files go (default: a temporary directory, removed).
    logs: str | None = None

    @property
    def slow(self) -> float:
        """Replies slower than this are listed one by one (a hung request's is)."""
        shortest = min(self.timeout, self.heartbeat * self.liveness, self.work_timeout or 1.0)
        return min(0.3, 0.5 * shortest)

    @property
    def n_cycles(self) -> int:
        return self.cycles or max(1, round(self.duration / 20.0))


@dataclass(frozen=True)
class Event:
    """A fault, ``t`` seconds after the load started."""

    t: float
    #: ``kill_broker``, ``start_broker``, ``kill_worker`` (``arg``: slot), ``hang`` (mode),
    #: ``end_hangs``.
    kind: str
    arg: str = ""


def schedule(cfg: Config) -> tuple[list[Event], list[Phase]]:
    """The faults and phases of a run (seeded by ``cfg.seed``)."""
    rng = random.Random(cfg.seed)
    events: list[Event] = []
    phases: list[Phase] = []
    length = cfg.duration / cfg.n_cycles
    for k in range(cfg.n_cycles):
        base = k * length
        kill = base + 0.2 * length
        restart = kill + cfg.downtime
        kills_start = base + 0.45 * length
        hangs_start = base + 0.7 * length
        end = base + length
        phases += [
            Phase("steady", base, kill),
            Phase("broker down", kill, restart),
            Phase("broker recovery", restart, kills_start),
            Phase("worker kills", kills_start, hangs_start),
            Phase("hangs", hangs_start, end),
        ]
        events += [Event(kill, "kill_broker"), Event(restart, "start_broker")]
        t = kills_start + rng.uniform(0.2, 1.0) * cfg.kill_every
        while t < hangs_start - 0.1:
            events.append(Event(t, "kill_worker", str(rng.randrange(cfg.workers))))
            t += rng.uniform(0.5, 1.5) * cfg.kill_every
        events += [
            Event(hangs_start, "hang", "hang-async"),
            Event(hangs_start + 0.05, "hang", "hang-block"),
        ]
        if k + 1 < cfg.n_cycles:
            events.append(Event(end - 0.05, "end_hangs"))
    return events, phases


@dataclass
class _Run:
    """The processes of one run and what happened to them."""

    cfg: Config
    procs: Procs
    log_dir: Path
    endpoint: str
    t0: float = 0.0
    broker: Proc | None = None
    slots: list[Proc] = field(default_factory=list)
    #: Brokers parked until their ``start_broker`` event, in the events' order.
    spare_brokers: list[Proc] = field(default_factory=list)
    #: The hanging workers, parked until their ``hang`` event, in the events' order.
    parked: list[tuple[str, Proc]] = field(default_factory=list)
    hangers: list[Proc] = field(default_factory=list)
    clients: list[Proc] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    workers_started: int = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self, name: str, *args: str) -> Proc:
        proc = self.procs.start(name, *args)
        self.pids.append(proc.pid)
        return proc

    def broker_args(self) -> list[str]:
        """The arguments of ``dcp broker``."""
        cfg = self.cfg
        return [
            "-v",  # INFO: its counters are logged when it stops
            "--bind",
            self.endpoint,
            "--heartbeat-interval",
            str(cfg.heartbeat),
            "--liveness",
            str(cfg.liveness),
            *cfg.broker_args,
        ]

    def start_broker(self) -> Proc:
        argv = ["dcp", "broker", *self.broker_args()]
        # The dead broker's port is normally free at once; retry briefly if it is not.
        for attempt in range(50):
            proc = self.start("broker", *argv)
            try:
                proc.wait_ready(START_TIMEOUT)
            except ProcessFailed:
                if proc.popen.poll() is None or attempt == 49:
                    raise
                time.sleep(0.05)
                continue
            self.broker = proc
            return proc
        raise AssertionError("unreachable")  # pragma: no cover

    def start_worker(self, mode: str = "normal", *, park: bool = False) -> Proc:
        cfg = self.cfg
        index = self.workers_started
        self.workers_started += 1
        argv = worker_argv(
            self.endpoint,
            str(self.log_dir / "events.jsonl"),
            backend=("trio", "asyncio")[index % 2],
            mode=mode,
            work=cfg.work,
            hang_for=cfg.hang_for,
            heartbeat=cfg.heartbeat,
            liveness=cfg.liveness,
            kind=_KINDS[index % 3] if cfg.peers == "mixed" and mode == "normal" else "dcp",
            park=park,
        )
        return self.start(f"worker-{index}-{mode}", *argv)

    def park_hanger(self, mode: str) -> None:
        """Start a hanging worker now, to join at its ``hang`` event (:meth:`do`)."""
        proc = self.start_worker(mode, park=True)
        _wait_parked(proc)
        self.parked.append((mode, proc))

    def park_broker(self) -> None:
        """Start a broker now, to run at a ``start_broker`` event (:meth:`restart_broker`)."""
        proc = self.start("broker", "benchmarks.chaos_peers", "broker", *self.broker_args())
        _wait_parked(proc)
        self.spare_brokers.append(proc)

    def restart_broker(self) -> Proc:
        """Wake the next parked broker; a new one if that one could not bind (its port not
        free yet)."""
        proc = self.spare_brokers.pop(0)
        os.kill(proc.pid, signal.SIGUSR1)
        try:
            proc.wait_ready(START_TIMEOUT)
        except ProcessFailed:
            if proc.popen.poll() is None:
                raise
            return self.start_broker()
        self.broker = proc
        return proc

    def start_client(self, index: int, start_file: Path) -> Proc:
        cfg = self.cfg
        mode = "sync" if index % 2 else "async"
        backend = ("trio", "asyncio")[(index // 2) % 2]
        return self.start(
            f"client-{index}",
            "benchmarks.chaos_peers",
            "--backend",
            backend,
            "client",
            "--endpoint",
            self.endpoint,
            "--name",
            f"c{index}",
            "--mode",
            mode,
            "--start-file",
            str(start_file),
            "--run-for",
            str(cfg.duration),
            "--drain",
            str(cfg.drain),
            "--window",
            str(cfg.window),
            "--timeout",
            str(cfg.timeout),
            "--retries",
            str(cfg.retries),
            "--backoff",
            str(cfg.backoff),
            "--backoff-max",
            str(cfg.backoff_max),
            "--bucket",
            str(cfg.bucket),
            "--slow",
            str(cfg.slow),
            *(["--work-timeout", str(cfg.work_timeout)] if cfg.work_timeout else []),
        )

    def check_alive(self) -> None:
        for proc in [*self.clients, *([self.broker] if self.broker else [])]:
            if proc.popen.poll() is not None:
                raise ProcessFailed(
                    f"{proc.name} (pid {proc.pid}) exited with {proc.popen.returncode}:\n"
                    f"{proc.log_tail()}"
                )

    def sigkill(self, proc: Proc) -> int | None:
        """SIGKILL ``proc`` by PID and reap it; its exit signal (9), or None if it had
        already exited."""
        if proc.popen.poll() is not None:
            return None
        os.kill(proc.pid, signal.SIGKILL)
        code = proc.popen.wait(10)
        return -code if code < 0 else None

    def do(self, ev: Event) -> None:
        t = self.now()
        if ev.kind == "kill_broker":
            assert self.broker is not None
            sig = self.sigkill(self.broker)
            self.faults.append({"kind": ev.kind, "t": t, "pid": self.broker.pid, "signal": sig})
            self.broker = None
        elif ev.kind == "start_broker":
            # "woken": when the parked broker was told to start; "t": when it said it serves
            # (on a loaded machine the two can be far apart, and replies flow in between).
            proc = self.restart_broker()
            self.faults.append({"kind": ev.kind, "t": self.now(), "woken": t, "pid": proc.pid})
        elif ev.kind == "kill_worker":
            slot = int(ev.arg)
            victim = self.slots[slot]
            sig = self.sigkill(victim)
            self.slots[slot] = self.start_worker()
            self.faults.append(
                {
                    "kind": ev.kind,
                    "t": t,
                    "pid": victim.pid,
                    "signal": sig,
                    "clock": time.monotonic(),  # the workers' clock, for chaos_figures
                }
            )
        elif ev.kind == "hang":
            mode, proc = self.parked.pop(0)
            assert mode == ev.arg, (mode, ev)
            os.kill(proc.pid, signal.SIGUSR1)  # join now
            self.hangers.append(proc)
            self.faults.append({"kind": ev.kind, "t": t, "pid": proc.pid, "mode": ev.arg})
        elif ev.kind == "end_hangs":
            for proc in self.hangers:
                if proc.popen.poll() is None:
                    os.kill(proc.pid, signal.SIGTERM)  # reaped when the run ends
            self.hangers.clear()
        else:  # pragma: no cover
            raise ValueError(ev.kind)


def _wait_parked(proc: Proc) -> None:
    """Wait for ``proc``'s ``PARKED`` line (:mod:`benchmarks.chaos_peers` ``--park``)."""
    deadline = time.monotonic() + START_TIMEOUT
    while proc.read_line(max(0.0, deadline - time.monotonic())).split()[:1] != ["PARKED"]:
        pass


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def run(cfg: Config) -> dict[str, Any]:
    """Run the chaos test; returns its record (settings, faults, figures, leftovers)."""
    events, phases = schedule(cfg)
    tmp = None
    if cfg.logs is None:
        tmp = tempfile.TemporaryDirectory(prefix="dcp-chaos-")
        log_dir = Path(tmp.name)
    else:
        log_dir = Path(cfg.logs)
        log_dir.mkdir(parents=True, exist_ok=True)
        # Workers append to it, clients read it: a --logs directory reused from an earlier
        # run starts afresh.
        (log_dir / "events.jsonl").unlink(missing_ok=True)
        (log_dir / "start").unlink(missing_ok=True)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    try:
        with Procs(log_dir) as procs:
            state = _Run(cfg, procs, log_dir, endpoint)
            try:
                records, broker_log = _drive(state, events)
            except BaseException:
                sys.stderr.write(procs.tails(12) + "\n")
                raise
        leftovers = [pid for pid in state.pids if alive(pid)]
        tracebacks = count_tracebacks(log_dir)
        worker_events = read_events(str(log_dir / "events.jsonl"))
    finally:
        if tmp is not None:
            tmp.cleanup()
    phases = _actual_phases(phases, state.faults)
    figures = chaos_figures.compute(
        records=records,
        worker_events=worker_events,
        faults=state.faults,
        phases=phases,
        bucket=cfg.bucket,
        duration=cfg.duration,
        broker_stats=chaos_figures.broker_statistics(broker_log),
    )
    return {
        "config": asdict(cfg),
        "endpoint": endpoint,
        "faults": state.faults,
        "figures": figures,
        "clients": [{k: r[k] for k in ("name", "mode", "sent", "replies")} for r in records],
        "processes": len(state.pids),
        "leftovers": leftovers,
        "tracebacks": tracebacks,
    }


def _actual_phases(phases: list[Phase], faults: list[dict[str, Any]]) -> list[Phase]:
    """The scheduled phases, with each broker restart at the time it really happened."""
    # The broker is down until it is told to start ("woken"), not until this process heard
    # that it serves: replies that come between belong to the recovery.
    restarts = iter([f.get("woken", f["t"]) for f in faults if f["kind"] == "start_broker"])
    out: list[Phase] = []
    for p in phases:
        if p.name == "broker down":
            t = next(restarts, p.end)
            out.append(Phase(p.name, p.start, t))
        elif p.name == "broker recovery":
            out.append(Phase(p.name, out[-1].end, p.end))
        else:
            out.append(p)
    return out


def _drive(state: _Run, events: list[Event]) -> tuple[list[dict[str, Any]], str]:
    cfg = state.cfg
    state.start_broker()
    state.slots = [state.start_worker() for _ in range(cfg.workers)]
    for proc in state.slots:
        proc.wait_ready(START_TIMEOUT)
    for ev in events:
        if ev.kind == "hang":
            state.park_hanger(ev.arg)
        elif ev.kind == "start_broker":
            state.park_broker()
    start_file = state.log_dir / "start"
    state.clients = [state.start_client(i, start_file) for i in range(cfg.clients)]
    for proc in state.clients:
        proc.wait_ready(START_TIMEOUT)
    # The load starts once every client is ready, however long they took to start.
    start = time.monotonic() + cfg.client_start
    (state.log_dir / "start.tmp").write_text(repr(start))
    os.replace(state.log_dir / "start.tmp", start_file)
    state.t0 = start
    for ev in events:
        _sleep_until(start + ev.t)
        state.check_alive()
        state.do(ev)
    _sleep_until(start + cfg.duration)
    records = [proc.result(cfg.drain + 30.0) for proc in state.clients]
    # A graceful stop makes the broker log its counters.
    broker = state.broker
    assert broker is not None
    broker.kill(grace=5.0)
    return records, broker.log_path.read_text(errors="replace")


def settings_line(cfg: Config) -> str:
    return (
        f"{cfg.duration:.0f} s, {cfg.n_cycles} cycle(s), seed {cfg.seed}; {cfg.workers} "
        f"{'mixed (dcp, majortomo, DagBox-style) ' if cfg.peers == 'mixed' else ''}"
        f"workers (+2 hanging per cycle), {cfg.clients} clients x window {cfg.window}; "
        f"heartbeat {cfg.heartbeat} s x liveness {cfg.liveness}; client timeout "
        f"{cfg.timeout} s x {cfg.retries} retries; broker down {cfg.downtime} s; hangs "
        f"{cfg.hang_for} s"
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line. SIGTERM and SIGINT (even where a shell started it in the background
    with SIGINT ignored) stop the run and kill its processes."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _main(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = Config()
    dd = DeadlineConfig()
    parser.add_argument("--scenario", choices=["faults", "deadlines"], default="faults")
    parser.add_argument("--rounds", type=int, default=1, help="runs, seeds --seed, +1, ...")
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds of load")
    parser.add_argument("--cycles", type=int, default=d.cycles, help="0: one per 20 s")
    parser.add_argument("--workers", type=int, default=d.workers)
    parser.add_argument("--clients", type=int, default=d.clients)
    parser.add_argument("--window", type=int, default=d.window, help="in flight per client")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--peers",
        choices=["dcp", "mixed"],
        default=d.peers,
        help="mixed: dcp workers, majortomo's Worker and DagBox-style DCP workers in turn",
    )
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=None,
        help=f"seconds (default {d.heartbeat}; deadlines: {dd.heartbeat})",
    )
    parser.add_argument(
        "--liveness",
        type=int,
        default=None,
        help=f"default {d.liveness} (deadlines: {dd.liveness})",
    )
    parser.add_argument("--timeout", type=float, default=d.timeout, help="client, per attempt")
    parser.add_argument("--retries", type=int, default=d.retries, help="client resends")
    parser.add_argument(
        "--work-timeout", type=float, default=None, help="seconds, carried by every request"
    )
    parser.add_argument("--kill-every", type=float, default=d.kill_every, help="seconds")
    parser.add_argument("--downtime", type=float, default=d.downtime, help="seconds")
    parser.add_argument("--hang-for", type=float, default=d.hang_for, help="seconds")
    parser.add_argument("--work", type=float, default=d.work, help="seconds per request")
    parser.add_argument(
        "--slow-work", type=float, default=dd.slow_work, help="deadlines: the long job, s"
    )
    parser.add_argument(
        "--fast-hangs",
        type=int,
        default=dd.fast_hangs,
        help="deadlines: requests the hanging fast worker hangs on",
    )
    parser.add_argument("--logs", default=None, help="keep logs and events in this directory")
    parser.add_argument("--json", default=None, help="write the records to this file")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.chaos " + shlex.join(
        list(argv) if argv is not None else sys.argv[1:]
    )
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        logs = None if args.logs is None else str(Path(args.logs) / f"round-{r}")
        if args.scenario == "deadlines":
            dcfg = DeadlineConfig(
                slow_work=args.slow_work,
                fast_hangs=args.fast_hangs,
                heartbeat=dd.heartbeat if args.heartbeat is None else args.heartbeat,
                liveness=dd.liveness if args.liveness is None else args.liveness,
                logs=logs,
            )
            record = chaos_deadlines.run(dcfg)
            print(f"round {r + 1}:\n{chaos_deadlines.render([record])}\n", flush=True)
        else:
            cfg = Config(
                duration=args.duration,
                cycles=args.cycles,
                workers=args.workers,
                clients=args.clients,
                window=args.window,
                seed=args.seed + r,
                heartbeat=d.heartbeat if args.heartbeat is None else args.heartbeat,
                liveness=d.liveness if args.liveness is None else args.liveness,
                timeout=args.timeout,
                retries=args.retries,
                work_timeout=args.work_timeout,
                kill_every=args.kill_every,
                downtime=args.downtime,
                hang_for=args.hang_for,
                work=args.work,
                peers=args.peers,
                logs=logs,
            )
            record = run(cfg)
            table = chaos_figures.render(record["figures"], settings_line(cfg))
            print(f"round {r + 1}: {table}\n", flush=True)
        runs.append(record)
    summary: dict[str, Any] = {}
    if args.scenario == "faults" and len(runs) > 1:
        summary = chaos_figures.summarize([rec["figures"] for rec in runs])
        print(f"{len(runs)} rounds:\n{chaos_figures.render_summary(summary)}")
    elif len(runs) > 1:
        print(f"{len(runs)} rounds:\n{chaos_deadlines.render(runs)}")
    if args.json:
        out = {"command": command, "scenario": args.scenario, "runs": runs, "summary": summary}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(_passed(rec) for rec in runs) else 1


def _passed(record: dict[str, Any]) -> bool:
    """Whether a run kept the guarantees: nothing lost, wrong or delivered twice, no
    process left behind (and, for the deadline scenario, the expected outcomes)."""
    if record["leftovers"] or record["tracebacks"]:
        return False
    fig = record["figures"]
    if record.get("scenario") == "deadlines":
        fast = fig["fast"]
        return bool(
            fig["slow"].get("ok")
            and fig["doomed"].get("error") == "redelivery_limit"
            and fast["replies"] == fast["sent"]
            and not (fast["wrong"] or fast["duplicates"] or fast["errors"])
        )
    return not (fig["lost"] or fig["wrong"] or fig["duplicates_delivered"] or fig["errors"])


if __name__ == "__main__":
    sys.exit(main())
