"""``dcp pub`` and ``dcp sub`` as a user runs them (real processes), and their errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dcp._cli import main
from tests.cli.procs import Proc, run, start, start_broker


def test_pub_reaches_sub(procs: list[Proc], tmp_path: Path) -> None:
    _, tcp = start_broker(procs, tmp_path)
    sub = start(procs, "sub", "--connect", tcp, "--count", "2", "orders.>")
    deadline = time.monotonic() + 15
    while True:  # until the subscription is in place
        code, out, err = run("pub", "--connect", tcp, "orders.eu", "first")
        assert code == 0, err
        if out == "1\n" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert out == "1\n"
    code, out, err = run("pub", "--connect", tcp, "orders.us.new", "second", "part")
    assert (code, out) == (0, "1\n"), err
    lines = sub.read_lines(2)
    assert lines[-1] == "orders.us.new second part"
    assert sub.finish(10)[0] == 0


def test_user_mistakes(capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = ["--connect", "tcp://127.0.0.1:1"]
    assert main(["pub", *endpoint, "a..b", "x"]) == 2
    assert "empty token" in capsys.readouterr().err
    assert main(["sub", *endpoint, "a.>.b"]) == 2
    assert "'>' may only be the last token" in capsys.readouterr().err
    assert main(["--backend", "asyncio", "pub", *endpoint, "--timeout", "0.1", "a", "x"]) == 1
    assert "dcp pub: RequestTimeout" in capsys.readouterr().err


def test_pub_and_sub_take_several_brokers(procs: list[Proc], tmp_path: Path) -> None:
    """``--connect`` twice (or a comma-separated list): the subscriber subscribes at both
    brokers, so a message published through either reaches it once."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, tcp_a = start_broker(procs, tmp_path / "a")
    _, tcp_b = start_broker(procs, tmp_path / "b")
    sub = start(procs, "sub", "--connect", tcp_a, "--connect", tcp_b, "--count", "2", "orders.>")
    for tcp, text in ((tcp_a, "first"), (tcp_b, "second")):
        deadline = time.monotonic() + 15
        while True:  # until the subscription is in place at this broker
            code, out, err = run("pub", "--connect", tcp, "orders.eu", text)
            assert code == 0, err
            if out == "1\n" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert out == "1\n"
    lines = sub.read_lines(2)
    assert sorted(lines[-2:]) == ["orders.eu first", "orders.eu second"]
    assert sub.finish(10)[0] == 0
    code, out, err = run("pub", "--connect", f"{tcp_a},{tcp_b}", "orders.eu", "third")
    assert (code, out) == (0, "0\n"), err  # the subscriber is gone: reached nobody
    code, _, err = run("pub", "--connect", f"{tcp_a},{tcp_a}", "orders.eu", "x")
    assert code == 2 and tcp_a in err, err
