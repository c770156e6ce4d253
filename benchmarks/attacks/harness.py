"""Running one attack: its broker, the echo worker, the probe, the attacker, the check.

For each attack, :func:`run_attack` starts a broker in a process of its own
(:mod:`.broker`), an echo worker (:mod:`benchmarks.echo_worker`) and the probe
(:mod:`.probe`); samples the broker's RSS (``/proc/PID/status``) every 20 ms; runs the attack
in this process (plain pyzmq, through an :class:`Attacker`, bounded in time and stopping
when the broker's RSS passes the ceiling); closes the attacker's sockets; waits a few seconds
and reads the RSS again; runs the legitimate peers' check (:mod:`.check`); and kills every
process it started, by PID.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import zmq

from ..procs import Proc, Procs

__all__ = ["Attack", "Attacker", "Bounds", "Result", "Settings", "run_attack"]

MB = 1024 * 1024
N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Bounds:
    """What an attack must stay within to pass."""

    #: the broker's peak RSS over its idle RSS, bytes
    rss_over_idle: int = 300 * MB
    #: the slowest probe call during the attack, seconds
    probe_max: float = 2.0


@dataclass(frozen=True)
class Settings:
    """How big and how long: the full sizes of the issue, or ``--short`` ones."""

    short: bool
    #: seconds an attack may send for
    duration: float
    #: the attacker stops sending once the broker's RSS passes this, bytes
    ceiling: int
    #: seconds between the attacker leaving and the RSS "after"
    settle: float
    #: the broker's ``max_memory`` (``None``: its default)
    max_memory: int | None
    bounds: Bounds


FULL = Settings(
    short=False, duration=20.0, ceiling=2048 * MB, settle=3.0, max_memory=None, bounds=Bounds()
)
SHORT = Settings(
    short=True,
    duration=4.0,
    ceiling=256 * MB,
    settle=0.5,
    max_memory=16 * MB,
    bounds=Bounds(rss_over_idle=48 * MB, probe_max=2.0),
)


def rss(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in bytes (0, 0 once it is gone)."""
    values = {"VmRSS": 0, "VmHWM": 0}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, rest = line.partition(":")
                if key in values:
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values["VmRSS"], values["VmHWM"]


class Sampler:
    """The broker's RSS, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.now = rss(pid)[0]
        self.peak = self.now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.now = rss(self.pid)[0]
            self.peak = max(self.peak, self.now)

    def reset_peak(self) -> None:
        self.peak = self.now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1)


class Attacker:
    """What an attack works with: the broker's endpoint, sockets it closes when the attack
    leaves, the time and memory bounds, and where it writes what it saw."""

    def __init__(self, endpoint: str, settings: Settings, sampler: Sampler, procs: Procs) -> None:
        self.endpoint = endpoint
        self.settings = settings
        self.short = settings.short
        self.deadline = time.monotonic() + settings.duration
        self._sampler = sampler
        self._procs = procs
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sockets: list[zmq.Socket[bytes]] = []
        #: Figures the attack reports (what it sent, what the broker answered).
        self.notes: dict[str, Any] = {}
        #: What went wrong that the generic bounds do not see (e.g. a reserved name taken).
        self.violations: list[str] = []
        #: Whether the attack stopped early at the RSS ceiling or the deadline.
        self.cut: str | None = None

    def size(self, full: N, short: N) -> N:
        """``full`` in a full run, ``short`` with ``--short``."""
        return short if self.short else full

    def socket(
        self, *, rcvhwm: int = 1000, sndhwm: int = 0, kind: int = zmq.DEALER
    ) -> zmq.Socket[bytes]:
        """A socket connected to the broker, closed (LINGER 0) when the attacker leaves."""
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, rcvhwm)
        sock.setsockopt(zmq.SNDHWM, sndhwm)
        sock.connect(self.endpoint)
        self._sockets.append(sock)
        return sock

    def go_on(self) -> bool:
        """Whether to keep sending: within the time bound and under the RSS ceiling."""
        if time.monotonic() >= self.deadline:
            self.cut = self.cut or "time bound"
            return False
        if self._sampler.now >= self.settings.ceiling:
            self.cut = self.cut or "RSS ceiling"
            return False
        return True

    def send(self, sock: zmq.Socket[bytes], frames: Sequence[bytes]) -> bool:
        """Send unless a bound is reached (waiting for room at most until the deadline)."""
        while self.go_on():
            if sock.poll(50, zmq.POLLOUT):
                sock.send_multipart(frames, copy=False)
                return True
        return False

    def wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait (bounded by ``timeout`` and the deadline) until ``condition()`` holds."""
        end = min(time.monotonic() + timeout, self.deadline)
        while time.monotonic() < end:
            if condition():
                return True
            time.sleep(0.02)
        return condition()

    def recv(self, sock: zmq.Socket[bytes], timeout: float) -> list[bytes] | None:
        """One message from ``sock`` within ``timeout`` seconds (``None``: none came)."""
        if sock.poll(int(timeout * 1000), zmq.POLLIN):
            return sock.recv_multipart()
        return None

    def hold(self, seconds: float) -> None:
        """Stay connected (and silent) for ``seconds``, within the bounds (:meth:`go_on`)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and self.go_on():
            time.sleep(0.02)

    def start(self, name: str, *args: str) -> Proc:
        """A helper process of the attack (killed with the others); waits for its READY."""
        proc = self._procs.start(name, *args)
        proc.wait_ready(30)
        return proc

    def leave(self) -> None:
        """Close every socket at once (LINGER 0): the attacker is gone."""
        for sock in self._sockets:
            sock.close(0)
        self._sockets.clear()
        self._ctx.term()


@dataclass(frozen=True)
class Attack:
    """One attack of the suite."""

    #: short name (``--only``)
    name: str
    #: which finding of the issue it is
    finding: str
    #: what it does, full sizes
    size: str
    #: what it does, ``--short`` sizes
    short_size: str
    #: the attack itself
    run: Callable[[Attacker], None]
    #: extra ``benchmarks.attacks.broker`` arguments, full and short
    broker_args: tuple[str, ...] = ()
    short_broker_args: tuple[str, ...] = ()
    #: run the legitimate peers' check while the attacker is still there (not after it left)
    check_during: bool = False
    #: the check entries that matter for this attack (others are reported, not judged)
    judged: tuple[str, ...] = ("subscribe", "service", "wait", "mc0_sub")


@dataclass
class Result:
    """What one attack did to the broker."""

    name: str
    finding: str
    size: str
    idle_rss: int
    peak_over_idle: int
    after_over_idle: int
    probe_p50: float | None
    probe_max: float | None
    probe_calls: int
    refused: dict[str, str]
    violations: list[str]
    notes: dict[str, Any]
    cut: str | None
    seconds: float
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["passed"] = self.passed
        return data


def _broker_args(attack: Attack, settings: Settings) -> list[str]:
    args = list(attack.short_broker_args if settings.short else attack.broker_args)
    if settings.max_memory is not None:
        args += ["--max-memory", str(settings.max_memory)]
    return args


def _check(procs: Procs, endpoint: str, settings: Settings) -> dict[str, str | None]:
    timeout = 3.0 if settings.short else 6.0
    proc = procs.start("check", "benchmarks.attacks.check", endpoint, "--timeout", str(timeout))
    data: dict[str, str | None] = proc.result(timeout=60)
    return data


def run_attack(attack: Attack, settings: Settings, log_dir: Path | None = None) -> Result:
    """Run ``attack`` against a broker of its own; every process is killed by PID after."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dcp-attack-") as tmp:
        logs = log_dir or Path(tmp)
        with Procs(logs) as procs:
            broker = procs.start(
                "broker", "benchmarks.attacks.broker", *_broker_args(attack, settings)
            )
            [endpoint] = broker.wait_ready(30)
            sampler = Sampler(broker.pid)
            try:
                return _measure(attack, settings, procs, broker, endpoint, sampler, started)
            finally:
                sampler.stop()


def _measure(
    attack: Attack,
    settings: Settings,
    procs: Procs,
    broker: Proc,
    endpoint: str,
    sampler: Sampler,
    started: float,
) -> Result:
    worker = procs.start(
        "echo", "benchmarks.echo_worker", "--endpoint", endpoint, "--sockets", "1"
    )
    probe = procs.start("probe", "benchmarks.attacks.probe", endpoint)
    worker.wait_ready(30)
    probe.wait_ready(30)  # after its first answer from echo
    time.sleep(0.3)
    idle = sampler.now
    sampler.reset_peak()
    attacker = Attacker(endpoint, settings, sampler, procs)
    refused: dict[str, str | None] = {}
    try:
        attack.run(attacker)
        if attack.check_during:
            refused = _check(procs, endpoint, settings)
    finally:
        attacker.leave()
    # The broker may still be working through what it was sent: the peak includes the wait.
    time.sleep(settings.settle)
    after = sampler.now
    peak = max(sampler.peak, rss(broker.pid)[1] if broker.popen.poll() is None else 0)
    os.kill(probe.pid, signal.SIGTERM)
    latencies: list[float] = probe.result(timeout=30)["latencies"]
    if not attack.check_during:
        refused = _check(procs, endpoint, settings)
    alive = broker.popen.poll() is None
    failures: list[str] = []
    bounds = settings.bounds
    over = peak - idle
    if not alive:
        failures.append(f"broker died (exit {broker.popen.returncode})")
    if over > bounds.rss_over_idle:
        failures.append(f"peak RSS over idle {over / MB:.0f} MB > {bounds.rss_over_idle // MB} MB")
    worst = max(latencies) if latencies else None
    if worst is None or worst > bounds.probe_max:
        failures.append(
            "no probe call" if worst is None else f"probe max {worst:.1f} s > {bounds.probe_max} s"
        )
    judged = {k: v for k, v in refused.items() if v is not None and k in attack.judged}
    if judged:
        failures.append("refused: " + ", ".join(sorted(judged)))
    failures += attacker.violations
    return Result(
        name=attack.name,
        finding=attack.finding,
        size=attack.short_size if settings.short else attack.size,
        idle_rss=idle,
        peak_over_idle=over,
        after_over_idle=after - idle,
        probe_p50=statistics.median(latencies) if latencies else None,
        probe_max=worst,
        probe_calls=len(latencies),
        refused={k: v for k, v in refused.items() if v is not None},
        violations=attacker.violations,
        notes=attacker.notes,
        cut=attacker.cut,
        seconds=time.monotonic() - started,
        failures=failures,
    )


def dump(results: Sequence[Result]) -> str:
    return json.dumps([r.as_json() for r in results], indent=1)
