"""``python -m dcp ...`` subprocesses for the command-line tests (test_cli*.py,
test_security_cli.py).

Every process is started with :class:`subprocess.Popen`, every wait is bounded, and every
process is killed by its PID (the ``procs`` fixture of each test module does it at the end).
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "tests.cli.handlers:echo"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) if not path else os.pathsep.join([str(ROOT), path])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc:
    """A ``python -m dcp ...`` subprocess, with bounded reads of its stdout. ``stdin``:
    bytes for its standard input (else it reads from ``/dev/null``)."""

    def __init__(self, *args: str, stdin: bytes | None = None) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "dcp", *args],
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._stdin = stdin
        self._buffer = b""

    def read_lines(self, count: int, timeout: float = 10.0) -> list[str]:
        """The next ``count`` lines of stdout; fails after ``timeout`` seconds."""
        stdout = self.popen.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout
        while self._buffer.count(b"\n") < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {count} lines after {timeout}s: {self._buffer!r}")
            readable, _, _ = select.select([stdout], [], [], left)
            if readable:
                chunk = os.read(stdout.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"stdout closed early: {self.finish(5)}")
                self._buffer += chunk
        lines = self._buffer.split(b"\n")
        self._buffer = b"\n".join(lines[count:])
        return [line.decode() for line in lines[:count]]

    def wait_stderr(self, text: bytes, timeout: float = 10.0) -> bytes:
        """Read stderr until it contains ``text``; return what was read (fails after
        ``timeout`` seconds). The rest of stderr still comes out of :meth:`finish`."""
        stderr = self.popen.stderr
        assert stderr is not None
        deadline = time.monotonic() + timeout
        seen = b""
        while text not in seen:
            assert time.monotonic() < deadline, seen
            if select.select([stderr], [], [], 0.1)[0]:
                chunk = os.read(stderr.fileno(), 4096)
                assert chunk, seen
                seen += chunk
        return seen

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Wait for the exit (at most ``timeout`` s): return code, rest of stdout, stderr."""
        stdin, self._stdin = self._stdin, None
        out, err = self.popen.communicate(stdin, timeout=timeout)
        return self.popen.returncode, (self._buffer + out).decode(), err.decode()

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.communicate(timeout=10)


def run(*args: str, stdin: bytes | None = None, timeout: float = 20.0) -> tuple[int, str, str]:
    """Run ``python -m dcp *args`` to completion (bounded); return code, stdout, stderr."""
    proc = Proc(*args, stdin=stdin)
    try:
        return proc.finish(timeout)
    finally:
        proc.kill()


def start(procs: list[Proc], *args: str) -> Proc:
    proc = Proc(*args)
    procs.append(proc)
    return proc


def start_broker(
    procs: list[Proc], tmp_path: Path, backend: str = "trio", *options: str
) -> tuple[Proc, str]:
    """A ``dcp broker`` on 127.0.0.1 (a free port) and ``ipc://{tmp_path}/b.sock``; returns
    it and its tcp endpoint."""
    ipc = f"ipc://{tmp_path}/b.sock"
    broker = start(
        procs, "--backend", backend, "broker", "--bind", "tcp://127.0.0.1:0", "--bind", ipc,
        *options,
    )  # fmt: skip
    tcp, bound_ipc = broker.read_lines(2)
    assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", tcp) and not tcp.endswith(":0")
    assert bound_ipc == ipc
    return broker, tcp
