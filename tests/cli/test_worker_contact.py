"""``dcp worker`` before its broker answers (:mod:`dcp._cli._worker` Rule CW2): a connection
refused is said at once, at default verbosity, and a signal then stops it in one line."""

from __future__ import annotations

import signal
import socket

import pytest

from tests.cli.procs import HANDLER, Proc

REFUSED = b"was refused (is a dcp broker running there?); still trying"


def closed_port() -> str:
    """A tcp endpoint where nothing listens: a port taken from port 0, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return f"tcp://127.0.0.1:{port}"


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_a_refused_connection_is_said_at_default_verbosity(backend: str) -> None:
    endpoint = closed_port()
    worker = Proc(
        "--backend", backend, "worker", "--connect", endpoint, "--service", "echo", HANDLER
    )
    try:
        seen = worker.wait_stderr(REFUSED)
        worker.popen.send_signal(signal.SIGTERM)
        code, out, err = worker.finish(10)
    finally:
        worker.kill()
    err = seen.decode() + err
    lines = err.splitlines()
    assert (code, out) == (0, "")
    (said,) = [line for line in lines if REFUSED.decode() in line]
    assert said.endswith(
        f" dcp.worker WARNING worker for 'echo': the connection to {endpoint} {REFUSED.decode()}"
    )
    assert lines[-1] == (
        "dcp worker: SIGTERM: stopping (the broker has not confirmed the registration yet)"
    )
    assert "Traceback" not in err
