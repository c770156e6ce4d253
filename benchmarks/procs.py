"""Starting, watching and killing the suite's processes.

Every process is started through a :class:`Procs` group and killed by its PID (SIGTERM, then
SIGKILL after a grace period) when the group is left, whatever happened. Every wait is
bounded. A process's stderr goes to a log file, whose tail is shown when something fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["Proc", "ProcessFailed", "Procs", "ROOT", "alive", "count_tracebacks"]

ROOT = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a reused PID of another user: not ours
        return False
    return True


def count_tracebacks(log_dir: Path) -> dict[str, int]:
    """Python tracebacks in the stderr logs of ``log_dir``, per log file that has any."""
    counts: dict[str, int] = {}
    for path in sorted(log_dir.glob("*.log")):
        n = path.read_text(errors="replace").count("Traceback (most recent call last)")
        if n:
            counts[path.name] = n
    return counts


class ProcessFailed(RuntimeError):
    """A process exited early, printed garbage or did not answer in time."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) if not path else os.pathsep.join([str(ROOT), path])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc:
    """One child process with bounded reads of its stdout lines."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.{time.monotonic_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        self.pid = self.popen.pid
        self._buffer = b""

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _fail(self, what: str) -> ProcessFailed:
        return ProcessFailed(
            f"{self.name} (pid {self.pid}): {what}\n  argv: {' '.join(self.argv)}\n"
            f"  stderr tail:\n{self.log_tail()}"
        )

    def read_line(self, timeout: float) -> str:
        """The next line of stdout (without the newline)."""
        stdout = self.popen.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"no output line within {timeout:.0f}s")
            readable, _, _ = select.select([stdout], [], [], left)
            if readable:
                chunk = os.read(stdout.fileno(), 65536)
                if not chunk:
                    raise self._fail(f"exited (code {self.popen.wait(5)}) before printing")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def wait_ready(self, timeout: float) -> list[str]:
        """Wait for the ``READY ...`` line; returns the words after READY."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.read_line(max(0.0, deadline - time.monotonic()))
            words = line.split()
            if words and words[0] == "READY":
                return words[1:]
            if line.startswith("tcp://"):  # ``dcp broker`` prints its endpoints
                return words

    def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the exit and parse the last stdout line as JSON."""
        try:
            out, _ = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise self._fail(f"still running after {timeout:.0f}s") from None
        text = (self._buffer + out).decode().strip()
        if self.popen.returncode != 0:
            raise self._fail(f"exit code {self.popen.returncode}; stdout: {text[-500:]}")
        try:
            data: dict[str, Any] = json.loads(text.splitlines()[-1])
        except (IndexError, ValueError):
            raise self._fail(f"no JSON result; stdout: {text[-500:]}") from None
        return data

    def kill(self, grace: float = 2.0) -> None:
        """SIGTERM by PID, then SIGKILL if still alive after ``grace`` seconds; reap."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.communicate(timeout=10)


class Procs:
    """A group of processes killed together (by PID) when the ``with`` block ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def start(self, name: str, *args: str, module: bool = True) -> Proc:
        argv = [sys.executable, "-m", *args] if module else list(args)
        proc = Proc(name, argv, self.log_dir)
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Procs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill_all()

    def tails(self, lines: int = 8) -> str:
        """The last stderr lines of every process of the group (for error reports)."""
        return "\n".join(
            f"--- {p.name} (pid {p.pid}, exit {p.popen.poll()}):\n{p.log_tail(lines)}"
            for p in self.procs
        )

    def kill_all(self) -> None:
        # Clients and workers first, the broker (started first) last.
        for proc in reversed(self.procs):
            proc.kill()
        self.procs.clear()
