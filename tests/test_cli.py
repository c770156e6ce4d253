"""The ``dcp`` command line, run as real subprocesses (``python -m dcp``), plus in-process
calls of :func:`dcp._cli.main` for argument errors.

Every process is started with :class:`subprocess.Popen`, every wait is bounded, and every
process is killed by its PID in a ``finally``.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from _fake_peers import DagBoxBroker

from dcp._cli import main
from dcp._messages import Reconnect, Register, Reply, Request
from dcp.wire import mdp

ROOT = Path(__file__).resolve().parent.parent
HANDLER = "tests.cli_handlers:echo"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) if not path else os.pathsep.join([str(ROOT), path])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc:
    """A ``python -m dcp ...`` subprocess, with bounded reads of its stdout."""

    def __init__(self, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "dcp", *args],
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
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

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Wait for the exit (at most ``timeout`` s): return code, rest of stdout, stderr."""
        out, err = self.popen.communicate(timeout=timeout)
        return self.popen.returncode, (self._buffer + out).decode(), err.decode()

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.communicate(timeout=10)


def run(*args: str, timeout: float = 20.0) -> tuple[int, str, str]:
    """Run ``python -m dcp *args`` to completion (bounded); return code, stdout, stderr."""
    proc = Proc(*args)
    try:
        return proc.finish(timeout)
    finally:
        proc.kill()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts; each is killed by its PID at the end, whatever happened."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


def start(procs: list[Proc], *args: str) -> Proc:
    proc = Proc(*args)
    procs.append(proc)
    return proc


def start_broker(procs: list[Proc], tmp_path: Path, backend: str = "trio") -> tuple[Proc, str]:
    ipc = f"ipc://{tmp_path}/b.sock"
    broker = start(
        procs, "--backend", backend, "broker", "--bind", "tcp://127.0.0.1:0", "--bind", ipc
    )
    tcp, bound_ipc = broker.read_lines(2)
    assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", tcp) and not tcp.endswith(":0")
    assert bound_ipc == ipc
    return broker, tcp


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_broker_prints_endpoints_and_stops_cleanly_on_signal(
    procs: list[Proc], tmp_path: Path, backend: str, signum: signal.Signals
) -> None:
    broker, _ = start_broker(procs, tmp_path, backend)
    assert Path(tmp_path, "b.sock").exists()
    broker.popen.send_signal(signum)
    code, out, err = broker.finish(5)
    assert code == 0, err
    assert out == ""
    assert "Traceback" not in err
    assert f"received {signum.name}, stopping" in err


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_worker_and_call_through_the_broker(
    procs: list[Proc], tmp_path: Path, backend: str
) -> None:
    broker, tcp = start_broker(procs, tmp_path, backend)
    worker = start(
        procs, "--backend", backend, "worker", "--connect", tcp, "--service", "echo", HANDLER
    )
    # The call may be sent before the worker has registered: the broker queues it.
    code, out, err = run(
        "--backend", backend, "call", "--connect", f"ipc://{tmp_path}/b.sock", "echo", "hello",
        "world",
    )  # fmt: skip
    assert (code, out, err) == (0, "HELLO\nWORLD\n", "")
    # The worker leaves gracefully on SIGTERM, the broker on SIGINT; both exit with 0.
    worker.popen.send_signal(signal.SIGTERM)
    code, _, err = worker.finish(5)
    assert code == 0, err
    broker.popen.send_signal(signal.SIGINT)
    code, _, err = broker.finish(5)
    assert code == 0, err


def test_worker_and_call_with_type_width_4_through_a_dagbox_broker(procs: list[Proc]) -> None:
    """``--type-width 4``: every message either process writes has a 4-byte type frame, as
    the DagBox C++ reference broker needs (the stand-in fails the test on any other)."""
    with DagBoxBroker() as dagbox:
        worker = start(
            procs, "worker", "--connect", dagbox.endpoint, "--service", "echo",
            "--type-width", "4", HANDLER,
        )  # fmt: skip
        code, out, err = run(
            "call", "--connect", dagbox.endpoint, "--type-width", "4", "echo", "hello", "world"
        )
        assert (code, out, err) == (0, "HELLO\nWORLD\n", "")
        worker.popen.send_signal(signal.SIGTERM)
        code, _, err = worker.finish(10)
        assert code == 0, err
        deadline = time.monotonic() + 5
        while not dagbox.received(Reconnect) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert set(dagbox.widths) == {4}
    (worker_id,) = dagbox.received(Register)
    assert dagbox.received(Reply) == [worker_id]
    assert dagbox.received(Reconnect) == [worker_id]
    assert len(dagbox.received(Request)) == 1


def test_worker_finishes_its_request_on_sigterm(procs: list[Proc], tmp_path: Path) -> None:
    """SIGTERM is a graceful stop: the request in progress is answered, then it leaves."""
    _, tcp = start_broker(procs, tmp_path)
    worker = start(
        procs, "worker", "--connect", tcp, "--service", "slow", "tests.cli_handlers:slow"
    )
    call = start(procs, "call", "--connect", tcp, "--retries", "0", "--timeout", "10", "slow", "1")
    # Signal the worker while its handler sleeps: wait for its log line first.
    stderr = worker.popen.stderr
    assert stderr is not None
    deadline = time.monotonic() + 10
    seen = b""
    while b"connecting" not in seen:
        assert time.monotonic() < deadline, seen
        if select.select([stderr], [], [], 0.1)[0]:
            seen += os.read(stderr.fileno(), 4096)
    time.sleep(0.5)  # the request reaches the worker; its handler sleeps 1 s
    began = time.monotonic()
    worker.popen.send_signal(signal.SIGTERM)
    assert call.finish(10)[:2] == (0, "done\n")
    code, _, err = worker.finish(10)
    assert code == 0, err
    assert "stopping gracefully" in err
    assert time.monotonic() - began < 5


def test_call_to_a_service_nobody_serves_fails_after_its_timeout(
    procs: list[Proc], tmp_path: Path
) -> None:
    _, tcp = start_broker(procs, tmp_path)
    began = time.monotonic()
    code, out, err = run("call", "--connect", tcp, "--timeout", "0.3", "--retries", "0", "nobody")
    assert time.monotonic() - began >= 0.3
    assert code == 1
    assert out == ""
    # The client asks the broker (mmi.service) before giving up: nobody serves it.
    assert err == (
        "dcp call: NoWorkers: no worker serves 'nobody' (the broker says so; no reply after "
        "1 attempt(s))\n"
    )


def test_demo_runs_clean() -> None:
    code, out, err = run("demo", "--requests", "200", "--no-progress")
    assert code == 0, err
    assert out.startswith("dcp demo summary\n")
    assert "  requests     200\n" in out
    assert "  replies ok   200\n" in out
    assert "  errors       0\n" in out
    assert err == ""  # --no-progress: no progress bar on stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "dcp worker: handler must be module:function, not 'no_colon'"),
        (
            "tests.no_such_module:echo",
            "dcp worker: cannot load handler 'tests.no_such_module:echo': "
            "No module named 'tests.no_such_module'",
        ),
        (
            "tests.cli_handlers:missing",
            "dcp worker: cannot load handler 'tests.cli_handlers:missing': "
            "module 'tests.cli_handlers' has no attribute 'missing'",
        ),
        ("tests.cli_handlers:not_callable", "'tests.cli_handlers:not_callable' is not callable"),
    ],
)
def test_bad_handler_spec_is_a_clear_error(spec: str, message: str) -> None:
    code, out, err = run("worker", "--connect", "tcp://127.0.0.1:1", "--service", "x", spec)
    assert out == ""
    assert code == 1
    assert message in err
    assert "Traceback" not in err


# -- in process, so coverage sees the argument handling -----------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "required: command"),
        (["broker"], "required: --bind"),
        (["worker", "--connect", "tcp://x:1", HANDLER], "required: --service"),
        (["call", "echo"], "required: --connect"),
        (["call", "--connect", "tcp://x:1", "--timeout", "soon", "echo"], "invalid float"),
        (["--backend", "curio", "demo"], "invalid choice: 'curio'"),
        (["call", "--connect", "tcp://x:1", "--type-width", "2", "echo"], "invalid choice: 2"),
        (["worker", "--type-width", "one", HANDLER], "invalid int value: 'one'"),
        (["fly"], "invalid choice: 'fly'"),
    ],
)
def test_argument_errors_in_process(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dcp")
    assert message in err


def test_bad_handler_spec_in_process() -> None:
    with pytest.raises(SystemExit) as info:
        main(["worker", "--connect", "tcp://127.0.0.1:1", "--service", "x", "tests.cli_handlers"])
    assert (
        info.value.code == "dcp worker: handler must be module:function, not 'tests.cli_handlers'"
    )


def test_call_timeout_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--backend", "asyncio", "call", "--connect", "tcp://127.0.0.1:1"]
    assert main([*argv, "--timeout", "0.1", "--retries", "0", "echo", "x"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "dcp call: RequestTimeout: no reply after 1 attempt(s) of 0.1s\n"


@pytest.mark.parametrize("width", ["1", "4"])
def test_demo_in_process(width: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--requests", "40", "--clients", "2", "--window", "4", "--type-width", width]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "  replies ok   40\n  errors       0\n" in captured.out
    assert "40/40" in captured.err  # the progress bar


def test_broker_limits_from_the_command_line(procs: list[Proc]) -> None:
    broker = start(procs, "broker", "--bind", "tcp://127.0.0.1:0", "--max-client-queued", "0")
    (tcp,) = broker.read_lines(1)
    # No worker, and no client may queue anything: refused at once with an error reply.
    code, out, err = run("call", "--connect", tcp, "--retries", "0", "nobody", "x")
    assert code != 0
    assert out == ""
    assert "client_limit" in err


def test_broker_mdp_timeout_from_the_command_line(procs: list[Proc]) -> None:
    """An idle Majordomo worker silent for --mdp-timeout is gone: mmi.service says 404."""
    broker = start(procs, "broker", "--bind", "tcp://127.0.0.1:0", "--mdp-timeout", "0.5")
    (tcp,) = broker.read_lines(1)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    worker, client = ctx.socket(zmq.DEALER), ctx.socket(zmq.REQ)
    try:
        for sock in (worker, client):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.connect(tcp)
        worker.send_multipart(
            mdp.peer(mdp.Form.V01, envelope=True, worker=True).worker_ready(b"w")
        )
        answers = []
        for delay in (0.2, 1.5):  # within the timeout, then well past it
            time.sleep(delay)
            client.send_multipart([b"MDPC01", b"mmi.service", b"w"])
            answers.append(client.recv_multipart())
        assert answers == [
            [b"MDPC01", b"mmi.service", b"200"],
            [b"MDPC01", b"mmi.service", b"404"],
        ]
    finally:
        worker.close(0)
        client.close(0)
