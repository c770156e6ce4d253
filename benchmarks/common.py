"""What every load-generating process shares: wire constants, the CPU and memory probe of
the broker (read from the OS's own accounting), the run settings, and the result record.

A load generator runs in three phases: *warm-up* (requests whose replies are awaited but not
measured), *measure* (the probe samples the broker before the first measured request and
after the last measured reply) and *drain* (outstanding replies are awaited for a bounded
time; the ones that never arrive are *lost*). Every phase is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "DCP",
    "MDPC",
    "MDPW",
    "LoadSettings",
    "Probe",
    "Result",
    "add_load_arguments",
    "busy_seconds",
    "cpu_seconds",
    "emit",
    "percentile",
    "pid_list",
    "raise_fd_limit",
    "ready",
    "rss_bytes",
    "settings_from_args",
    "thread_cpu_seconds",
]

#: DCP v1 protocol frame.
DCP = b"DGBX\x01"
#: MDP 0.2 client and worker protocol frames (majortomo).
MDPC = b"MDPC02"
MDPW = b"MDPW02"


@dataclass(frozen=True)
class LoadSettings:
    """One load: what to send and the bounds of each phase."""

    endpoint: str
    service: bytes = b"echo"
    payload: int = 16
    window: int = 64
    clients: int = 1
    warmup: int = 200
    count: int = 10_000
    duration: float = 2.0
    warmup_timeout: float = 30.0
    drain_timeout: float = 15.0
    broker_pid: int = 0
    worker_pids: tuple[int, ...] = ()


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every load generator takes."""
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--service", default="echo")
    parser.add_argument("--payload", type=int, default=16, help="bytes per request")
    parser.add_argument("--window", type=int, default=64, help="requests in flight per client")
    parser.add_argument("--clients", type=int, default=1, help="client sockets")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--count", type=int, default=10_000, help="most measured requests")
    parser.add_argument("--duration", type=float, default=2.0, help="most seconds sending")
    parser.add_argument("--warmup-timeout", type=float, default=30.0)
    parser.add_argument("--drain-timeout", type=float, default=15.0)
    parser.add_argument("--broker-pid", type=int, default=0)
    parser.add_argument("--worker-pids", default="", help="comma-separated")


def settings_from_args(args: argparse.Namespace) -> LoadSettings:
    pids = tuple(int(p) for p in str(args.worker_pids).split(",") if p)
    return LoadSettings(
        endpoint=args.endpoint,
        service=str(args.service).encode(),
        payload=args.payload,
        window=args.window,
        clients=args.clients,
        warmup=args.warmup,
        count=args.count,
        duration=args.duration,
        warmup_timeout=args.warmup_timeout,
        drain_timeout=args.drain_timeout,
        broker_pid=args.broker_pid,
        worker_pids=pids,
    )


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """``utime + stime`` of a process (all its threads) or of one of its threads, from
    ``/proc/<pid>/stat`` (the kernel's own accounting, in clock ticks)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        data = f.read()
    # Fields after the command name (which may hold spaces): state is field 3, so utime
    # (field 14) and stime (field 15) are at indices 11 and 12.
    fields = data[data.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def python_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process's own threads, without libzmq's (named ``ZMQbg/...``): the
    Python work, wherever it runs (dcp's broker routes in a thread of its own)."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().startswith("ZMQbg"):
                    continue
            total += cpu_seconds(pid, int(tid))
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
    return total


#: The kinds of thread :func:`thread_cpu_seconds` tells apart.
THREAD_KINDS = ("main", "other", "zmq")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads by kind: ``main`` (the thread whose id is the PID:
    the event loop of an asyncio or trio program), ``zmq`` (libzmq's, named ``ZMQbg/...``)
    and ``other`` (every other thread), from each thread's ``/proc/<pid>/task/<tid>/schedstat``
    (nanoseconds on a CPU; ``stat``'s clock ticks where the kernel keeps no schedstat).
    Threads that ended are not counted; a process that ended counts nothing."""
    out = dict.fromkeys(THREAD_KINDS, 0.0)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        task = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{task}/comm") as f:
                comm = f.read()
            try:
                with open(f"{task}/schedstat") as f:
                    seconds = int(f.read().split()[0]) / 1e9
            except FileNotFoundError:
                seconds = cpu_seconds(pid, int(tid))
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
        kind = "main" if tid == str(pid) else "zmq" if comm.startswith("ZMQbg") else "other"
        out[kind] += seconds
    return out


def _status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all CPUs, from ``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait.
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS``)."""
    return _status_kib(pid, "VmRSS:") or 0


def _reset_peak_rss(pid: int) -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of ``pid``; False where unsupported."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss(pid: int) -> int | None:
    return _status_kib(pid, "VmHWM:")


class Probe:
    """Samples the broker's (and the workers') CPU and memory around the measured window.

    CPU is ``utime + stime`` from ``/proc/<pid>/stat``: all threads of the process,
    including libzmq's I/O thread, and separately its own (Python) threads without libzmq's.
    The workers' CPU is also split by kind of thread (:func:`thread_cpu_seconds`), and the
    load generator's own is also taken for the thread that runs the probe alone
    (:func:`time.thread_time`: its event loop or its blocking loop).
    Memory is the RSS at the start and the kernel's peak RSS (``VmHWM``, reset at the
    start) during the window.
    """

    def __init__(self, broker_pid: int, worker_pids: Sequence[int] = ()) -> None:
        self.broker = broker_pid
        self.workers = list(worker_pids)
        self.start_values: dict[str, float] = {}
        self.values: dict[str, float] = {}
        self.rss_start = 0
        self.peak_reset = False

    def start(self) -> None:
        s = self.start_values
        s["client"] = time.process_time()
        s["machine"] = busy_seconds()
        s["client_thread"] = time.thread_time()
        s["workers"] = sum(cpu_seconds(w) for w in self.workers)
        s.update(self._worker_threads())
        if self.broker:
            self.rss_start = rss_bytes(self.broker)
            self.peak_reset = _reset_peak_rss(self.broker)
            s["broker"] = cpu_seconds(self.broker)
            s["broker_thread"] = python_cpu_seconds(self.broker)
        s["wall"] = time.perf_counter()

    def stop(self) -> None:
        v = self.values
        s = self.start_values
        v["wall"] = time.perf_counter() - s["wall"]
        v["client"] = time.process_time() - s["client"]
        v["machine"] = busy_seconds() - s["machine"]
        v["client_thread"] = time.thread_time() - s["client_thread"]
        v["workers"] = sum(cpu_seconds(w) for w in self.workers) - s["workers"]
        v.update({k: x - s[k] for k, x in self._worker_threads().items()})
        if self.broker:
            v["broker"] = cpu_seconds(self.broker) - s["broker"]
            v["broker_thread"] = python_cpu_seconds(self.broker) - s["broker_thread"]
            peak = _peak_rss(self.broker) if self.peak_reset else None
            rss = rss_bytes(self.broker)
            v["rss_end"] = rss
            v["peak_growth"] = float(max(peak, rss) - self.rss_start) if peak else -1.0

    def _worker_threads(self) -> dict[str, float]:
        """``workers_main``, ``workers_other``, ``workers_zmq``: summed over the workers."""
        out = {f"workers_{kind}": 0.0 for kind in THREAD_KINDS}
        for w in self.workers:
            for kind, seconds in thread_cpu_seconds(w).items():
                out[f"workers_{kind}"] += seconds
        return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values (nearest rank); 0 if empty."""
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[i])


@dataclass
class Result:
    """What a load generator prints, as one JSON line on stdout."""

    requests: int = 0
    elapsed_s: float = 0.0
    rate: float = 0.0
    p50_us: float = 0.0
    p90_us: float = 0.0
    p99_us: float = 0.0
    lost: int = 0
    errors: int = 0
    unexpected: int = 0
    broker_cpu_s: float = 0.0
    broker_thread_cpu_s: float = 0.0
    broker_cpu_us: float = 0.0
    broker_thread_cpu_us: float = 0.0
    broker_rss_mb: float = 0.0
    broker_peak_growth_mb: float = -1.0
    workers_cpu_us: float = 0.0
    #: The workers' CPU by kind of thread (:func:`thread_cpu_seconds`), summed over them.
    workers_main_cpu_us: float = 0.0
    workers_other_cpu_us: float = 0.0
    workers_zmq_cpu_us: float = 0.0
    client_cpu_us: float = 0.0
    #: The load generator's CPU in the thread that ran the load (its event loop's).
    client_thread_cpu_us: float = 0.0
    #: CPUs' worth of work done by processes other than the broker, the workers and the
    #: load generator during the window (another job on the machine skews the figures).
    foreign_load: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        latencies_ns: list[int],
        probe: Probe,
        *,
        lost: int,
        errors: int = 0,
        unexpected: int = 0,
        extra: dict[str, Any] | None = None,
    ) -> Result:
        latencies_ns.sort()
        n = len(latencies_ns)
        v = probe.values
        per = 1e6 / n if n else 0.0
        wall = v.get("wall", 0.0)
        return cls(
            requests=n,
            elapsed_s=wall,
            rate=n / wall if wall > 0 else 0.0,
            p50_us=percentile(latencies_ns, 0.50) / 1e3,
            p90_us=percentile(latencies_ns, 0.90) / 1e3,
            p99_us=percentile(latencies_ns, 0.99) / 1e3,
            lost=lost,
            errors=errors,
            unexpected=unexpected,
            broker_cpu_s=v.get("broker", 0.0),
            broker_thread_cpu_s=v.get("broker_thread", 0.0),
            broker_cpu_us=v.get("broker", 0.0) * per,
            broker_thread_cpu_us=v.get("broker_thread", 0.0) * per,
            broker_rss_mb=probe.rss_start / 2**20,
            broker_peak_growth_mb=(
                v["peak_growth"] / 2**20 if v.get("peak_growth", -1.0) >= 0 else -1.0
            ),
            workers_cpu_us=v.get("workers", 0.0) * per,
            workers_main_cpu_us=v.get("workers_main", 0.0) * per,
            workers_other_cpu_us=v.get("workers_other", 0.0) * per,
            workers_zmq_cpu_us=v.get("workers_zmq", 0.0) * per,
            client_cpu_us=v.get("client", 0.0) * per,
            client_thread_cpu_us=v.get("client_thread", 0.0) * per,
            foreign_load=_foreign(v),
            extra=extra or {},
        )


def _foreign(v: dict[str, float]) -> float:
    wall = v.get("wall", 0.0)
    if wall <= 0 or "machine" not in v:
        return 0.0
    ours = v.get("broker", 0.0) + v.get("workers", 0.0) + v.get("client", 0.0)
    return max(0.0, v["machine"] - ours) / wall


def emit(result: Result) -> None:
    """Print the result as the last line of stdout."""
    sys.stdout.write(json.dumps(asdict(result)) + "\n")
    sys.stdout.flush()


def raise_fd_limit() -> None:
    """Raise this process's open-file limit to the hard limit (many sockets)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def ready(message: str = "") -> None:
    """Tell the orchestrator (which waits for a line starting with READY) we are up."""
    sys.stdout.write(f"READY {message}\n".rstrip() + "\n")
    sys.stdout.flush()


def pid_list(pids: Sequence[int]) -> str:
    return ",".join(str(p) for p in pids)


if os.name != "posix":  # pragma: no cover
    raise ImportError("the benchmark suite needs a POSIX system (Linux for memory figures)")
