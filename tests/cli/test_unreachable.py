"""One-shot commands do not wait for a broker that is not there (dcp._cli._run Rule CR5):
one line, no traceback, well before ``--timeout``; ``--wait-for-broker`` (and ``dcp call
--wait``) wait as before. Nothing listens on a TCP port taken from port 0 then closed."""

from __future__ import annotations

import socket

import pytest

from dcp._cli import main
from dcp._cli._call import TIMED_OUT
from tests.cli.procs import run

#: What every refusal line says after the endpoint.
REFUSED = ": connection refused (nothing listens there): is a dcp broker running there?"


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_dcp_call_fails_in_one_line_long_before_its_timeout() -> None:
    endpoint = free_endpoint()
    # --timeout 30: the process must be long gone by the bound of 20 s (it takes < 1 s).
    code, out, err = run("call", "--connect", endpoint, "--timeout", "30", "svc", "x", timeout=20)
    assert code == TIMED_OUT
    assert out == ""
    assert err == (
        f"dcp call: BrokerUnreachable: cannot connect to {endpoint}{REFUSED} "
        "(--wait-for-broker waits for one)\n"
    )


def test_services_and_pub_fail_in_one_line_too() -> None:
    endpoint = free_endpoint()
    code, out, err = run("services", "--connect", endpoint, "--timeout", "30", timeout=20)
    assert (code, out) == (1, "")
    assert err == f"dcp services: cannot connect to {endpoint}{REFUSED}\n"
    code, out, err = run("pub", "--connect", endpoint, "--timeout", "30", "a.b", "x", timeout=20)
    assert (code, out) == (1, "")
    assert err == f"dcp pub: BrokerUnreachable: cannot connect to {endpoint}{REFUSED}\n"


@pytest.mark.parametrize("flag", ["--wait-for-broker", "--wait"])
def test_call_waits_for_the_broker_when_asked(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["call", "--connect", free_endpoint(), flag, "--timeout", "0.6", "--retries", "0"]
    assert main([*argv, "svc", "x"]) == TIMED_OUT
    err = capsys.readouterr().err
    assert err.startswith("dcp call: RequestTimeout: no reply after 0.6s (1 attempt sent); ")
    assert "nothing heard from" in err


def test_services_waits_for_the_broker_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["services", "--connect", free_endpoint(), "--wait-for-broker", "--timeout", "0.6"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("dcp services: ") and "connection refused" not in err
