"""``dcp broker --max-memory``, ``--http-host``, the plaintext notice, and the byte budget in
``dcp top`` (``docs/security.md``). Real processes where a broker runs."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest
import zmq

import dcp
from dcp._broker.broker import plaintext_notice
from dcp._cli import main
from dcp._cli._parser import memory_size
from dcp._cli._top import Snapshot, header, memory_lines
from dcp._core.broker.budget import DEFAULT_MAX_MEMORY
from tests.cli.procs import Proc, run, start
from tests.http.test_endpoint import fetch


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512M", 512 << 20),
        ("1G", 1 << 30),
        ("1.5g", 3 << 29),
        ("64KiB", 64 << 10),
        ("64kb", 64 << 10),
        ("1048576", 1 << 20),
        ("0", None),
        ("none", None),
        ("NONE", None),
    ],
)
def test_memory_sizes(text: str, value: int | None) -> None:
    assert memory_size(text) == value


@pytest.mark.parametrize("text", ["", "x", "-1", "1Q", "M", "0.1", "1ib", "1e9", "512 MB x"])
def test_bad_memory_sizes(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected bytes such as 512M"):
        memory_size(text)


def test_the_default_is_the_budget_default() -> None:
    assert memory_size("512M") == DEFAULT_MAX_MEMORY


def test_max_memory_reaches_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    options: dict[str, object] = {}

    class Recorder:
        def __init__(self, *endpoints: str, **kwargs: object) -> None:
            options.update(kwargs)
            raise ValueError("recorded")

    monkeypatch.setattr("dcp._broker.broker.Broker", Recorder)
    for flags, expected in (
        ([], DEFAULT_MAX_MEMORY),
        (["--max-memory", "1G"], 1 << 30),
        (["--max-memory", "none"], None),
    ):
        assert main(["broker", "--bind", "tcp://127.0.0.1:0", *flags]) == 2
        assert options["max_memory"] == expected
    flags = ["--http", "127.0.0.1:0", "--http-host", "a.lan", "--http-host", "b.lan:80"]
    assert main(["broker", "--bind", "tcp://127.0.0.1:0", *flags]) == 2
    assert options["http_hosts"] == ["a.lan", "b.lan:80"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-memory", "lots"], "argument --max-memory: expected bytes such as 512M"),
        (["--max-memory", "-5"], "argument --max-memory: expected bytes"),
        (["--http-host", "a.lan"], "need --http"),
        (["--http", "127.0.0.1:0", "--http-host", "http://x/"], "is not NAME or NAME:PORT"),
    ],
)
def test_bad_values_are_one_line(args: list[str], message: str) -> None:
    code, out, err = run("broker", "--bind", "tcp://127.0.0.1:0", *args)
    assert (code, out) == (2, "")
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_broker_without_curve_says_what_anyone_can_do(procs: list[Proc]) -> None:
    """Bound where other hosts may reach it: a WARNING (printed without -v), once."""
    broker = start(procs, "broker", "--bind", "tcp://0.0.0.0:0", "--http", "127.0.0.1:0")
    endpoint, url = broker.read_lines(2)
    address = url[len("http://") : -1]
    assert fetch(address, "/metrics")[0] == 200  # serving; the notice is out
    broker.popen.terminate()
    code, _, err = broker.finish(10)
    assert code == 0, err
    assert err.count("no CURVE") == 1, err
    assert f"anyone who can reach {endpoint} can register any service" in err
    assert "https://dagbox.github.io/dcp/security.html#modes" in err


def test_a_local_broker_says_it_mildly(procs: list[Proc], tmp_path: Path) -> None:
    """Loopback and ipc only: an INFO line (not shown without -v)."""
    ipc = f"ipc://{tmp_path}/b.sock"
    quiet = start(procs, "broker", "--bind", "tcp://127.0.0.1:0", "--bind", ipc)
    loud = start(procs, "broker", "--bind", "tcp://127.0.0.1:0", "-v")
    quiet.read_lines(2)
    loud.read_lines(1)
    for proc in (quiet, loud):
        proc.popen.terminate()
    assert "no CURVE" not in quiet.finish(10)[2]
    err = loud.finish(10)[2]
    assert "INFO no CURVE: any process on this host can register any service" in err


def test_plaintext_notice_levels() -> None:
    assert plaintext_notice(["tcp://127.0.0.1:5555", "ipc:///x", "inproc://y"])[0] == logging.INFO
    assert plaintext_notice(["tcp://[::1]:5555", "tcp://localhost:1"])[0] == logging.INFO
    level, text = plaintext_notice(["tcp://127.0.0.1:1", "tcp://0.0.0.0:2"], beacon=True)
    assert level == logging.WARNING
    assert "tcp://0.0.0.0:2 can register" in text and "127.0.0.1" not in text
    assert "forge replies to Majordomo clients" in text and "spoof" in text
    assert "spoof" not in plaintext_notice(["tcp://10.0.0.1:1"])[1]


@pytest.mark.anyio
async def test_a_curve_broker_says_nothing_of_it(caplog: pytest.LogCaptureFixture) -> None:
    public, secret = zmq.curve_keypair()
    caplog.set_level(logging.INFO, "dcp.broker")
    async with dcp.Broker("tcp://127.0.0.1:0", security=dcp.CurveServer(public, secret)):
        pass
    async with dcp.Broker("tcp://127.0.0.1:0"):
        pass
    notices = [r for r in caplog.records if "no CURVE" in r.getMessage()]
    assert len(notices) == 1 and notices[0].levelno == logging.INFO


def test_top_shows_the_budget() -> None:
    doc = {
        "uptime": 1.0,
        "max_memory": 512 << 20,
        "memory": {
            "queued": {"used": 3 << 20, "peak": 4 << 20, "limit": 179 << 20, "refused": 2},
            "replies": {"used": 0, "peak": 0, "limit": 51 << 20, "refused": 0},
            "streams": {"used": 1536, "peak": 1536, "limit": 76 << 20, "refused": 0},
        },
    }
    assert memory_lines(doc) == [
        "memory 3.0 MiB held of 512.0 MiB  refused: queued 2",
        "  queued 3.0 MiB/179.0 MiB  streams 1.5 KiB/76.0 MiB",
    ]
    text = header("e", None, Snapshot(0.0, (), doc), "")
    assert "memory 3.0 MiB held of 512.0 MiB" in text
    unbounded = {"max_memory": None, "memory": {"queued": {"used": 10, "limit": None}}}
    assert memory_lines(unbounded) == [
        "memory 10 B held of no budget  refused: none",
        "  queued 10 B/-",
    ]
    assert memory_lines({"uptime": 1.0}) == []  # an older broker does not say


@pytest.mark.anyio
async def test_mmi_broker_carries_the_budget() -> None:
    async with dcp.Broker("tcp://127.0.0.1:0", max_memory=1 << 20, io_thread=False) as broker:
        broker._core.memory.account("replies").charge(b"p", 1000)
        async with dcp.Client(broker.endpoints[0]) as client:
            reply = await client.request("mmi.broker")
    doc = json.loads(reply.data[0])
    assert doc["max_memory"] == 1 << 20
    assert doc["memory"]["replies"] == {
        "used": 1000,
        "peak": 1000,
        "limit": (1 << 20) // 10,
        "refused": 0,
    }
