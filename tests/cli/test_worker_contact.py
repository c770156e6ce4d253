"""``dcp worker`` before its broker answers (:mod:`dcp._cli._worker` Rule CW2): a connection
refused is said at once, at default verbosity, and a signal then stops it in one line."""

from __future__ import annotations

import os
import signal
import socket
import time

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


def listening(port: int, timeout: float = 10.0) -> None:
    """Wait until a UDP socket is bound to 127.0.0.1:``port`` (Linux's /proc/net/udp)."""
    wanted = f"0100007F:{port:04X}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/net/udp") as table:
            if any(line.split()[1] == wanted for line in list(table)[1:]):
                return
        time.sleep(0.01)
    raise AssertionError(f"nothing listens at udp port {port}")


@pytest.mark.skipif(not os.path.exists("/proc/net/udp"), reason="reads /proc/net/udp")
@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_a_signal_while_listening_for_a_beacon_stops_at_once(backend: str) -> None:
    """Rule CW2 with a ``beacon://`` endpoint no beacon comes to: the signal stops the worker
    as before the echo (130, one line), not after the listening's end with its error."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    worker = Proc(
        "--backend", backend, "worker", "--connect", f"beacon://127.0.0.1:{port}",
        "--service", "echo", "-v", HANDLER,
    )  # fmt: skip
    try:
        worker.wait_stderr(b"connecting to beacon://")
        listening(port)  # the signal receiver is open by then (until_signal's tasks ran)
        worker.popen.send_signal(signal.SIGINT)
        code, out, err = worker.finish(10)
    finally:
        worker.kill()
    assert (code, out) == (130, ""), err
    assert (
        "dcp worker: SIGINT: stopping (the broker has not confirmed the registration yet)"
    ) in err.splitlines()
    assert "Traceback" not in err
    assert "beacon" not in err  # nothing of the beacon not heard
