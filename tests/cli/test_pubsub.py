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
