"""The ``dcp.*`` loggers for operators (docs/operations.md): worker registered, left,
expired and redelivery lines at INFO, nothing at INFO per request, the periodic summary, and
``-v``/``-vv`` after every command's name. Real sockets (inproc), both anyio backends."""

from __future__ import annotations

import argparse
import logging
import uuid

import anyio
import pytest

import dcp
import dcp._cli
from dcp._broker.broker import Broker
from dcp._broker.oplog import Frames, summary_line
from dcp._cli import main
from dcp._cli._parser import build_parser
from dcp._client.client import Client
from dcp._util import LogEvery, PeerId
from dcp._worker.worker import Worker
from dcp.wire.messages import Reconnect, Register, Request
from tests.helpers import Peers, wait_for

HEARTBEAT = {"heartbeat_interval": 0.1, "liveness": 3}


def _endpoint() -> str:
    return f"inproc://logs-{uuid.uuid4().hex}"


async def _upper(request: dcp.HandlerRequest) -> bytes:
    return request.data[0].upper()


def _messages(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name.startswith("dcp") and r.levelno == level
    ]


@pytest.mark.anyio
async def test_worker_registered_left_expired_and_redelivery_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ep = _endpoint()
    caplog.set_level(logging.INFO, logger="dcp")
    async with Broker(ep, **HEARTBEAT), Client(ep, timeout=10) as client:  # type: ignore[arg-type]
        with Peers(ep) as peers:
            w1 = peers(b"W1")
            w1.send(Register(b"svc"))
            await w1.expect(Register(b"svc"))
            async with anyio.create_task_group() as tg:
                answers: list[bytes] = []

                async def call() -> None:
                    answers.append((await client.request("svc", b"hi")).bytes)

                tg.start_soon(call)
                while not isinstance((await w1.recv())[0], Request):
                    pass
                w1.send(Reconnect())  # it leaves holding the request: redelivered
                async with Worker(ep, b"svc", _upper, **HEARTBEAT):  # type: ignore[arg-type]
                    await wait_for(lambda: answers)
            assert answers == [b"HI"]
            w3 = peers(b"W3")
            w3.send(Register(b"quiet"))
            await w3.expect(Register(b"quiet"))
            # W3 never beats: it expires after liveness x heartbeat_interval.
            await wait_for(lambda: any("expired" in m for m in _messages(caplog)))
    infos = _messages(caplog)
    assert f"worker {b'W1'.hex()} (DCP/1) registered for 'svc'" in infos
    assert (
        f"worker {b'W1'.hex()} left: served 'svc'; 1 held request(s) redelivered, "
        "0 failed (redelivery_limit)"
    ) in infos
    assert (
        f"worker {b'W3'.hex()} expired: served 'quiet'; 0 held request(s) redelivered, "
        "0 failed (redelivery_limit)"
    ) in infos
    assert any(m.startswith("broker bound to inproc://") for m in infos)


@pytest.mark.anyio
async def test_nothing_at_info_per_request_and_detail_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ep = _endpoint()
    caplog.set_level(logging.INFO, logger="dcp")
    async with (
        Broker(ep, io_thread=False),
        Worker(ep, b"svc", _upper),
        Client(ep, timeout=10) as client,
    ):
        await client.request("svc", b"warm")
        caplog.clear()
        for i in range(20):
            await client.request("svc", b"x%d" % i)
        assert [r for r in caplog.records if r.name.startswith("dcp")] == []
        caplog.set_level(logging.DEBUG, logger="dcp")
        await client.request("svc", b"seen")
    debug = _messages(caplog, logging.DEBUG)
    assert any(m.startswith("from ") and "frame(s)" in m for m in debug)
    assert any(m.startswith("to ") and "frame(s)" in m for m in debug)
    # The worker and the client say what they receive and send too.
    by = {r.name for r in caplog.records if r.levelno == logging.DEBUG}
    assert {"dcp.broker", "dcp.worker", "dcp.client"} <= by
    worker = [r.getMessage() for r in caplog.records if r.name == "dcp.worker"]
    assert any(m.startswith(f"from broker {ep}: ") for m in worker)
    assert any(m.startswith(f"to broker {ep}: ") for m in worker)


@pytest.mark.anyio
@pytest.mark.parametrize("io_thread", [True, False], ids=["io_thread", "event_loop"])
async def test_summary_line(caplog: pytest.LogCaptureFixture, io_thread: bool) -> None:
    ep = _endpoint()
    caplog.set_level(logging.INFO, logger="dcp")
    async with (
        Broker(ep, log_summary=0.05, io_thread=io_thread),
        Worker(ep, b"svc", _upper),
        Client(ep, timeout=10) as client,
    ):
        for i in range(5):
            await client.request("svc", b"%d" % i)

        def summaries() -> list[str]:
            return [m for m in _messages(caplog) if m.startswith("summary: ")]

        await wait_for(lambda: any("workers 1 (1 idle, 0 busy)" in m for m in summaries()))
    line = summaries()[-1]
    assert "req/s" in line and "errors 0 (+0)" in line and "queued 0" in line


def test_summary_line_text() -> None:
    before = {"requests": 10, "replies": 10, "errors": 1, "rejections": {"a": 1}}
    now = {
        "requests": 30,
        "replies": 28,
        "errors": 2,
        "queued": 2,
        "workers": 3,
        "busy": 2,
        "clients": 1,
        "redeliveries": 1,
        "rejections": {"a": 2, "b": 1},
    }
    assert summary_line(before, now, 2.0) == (
        "summary: 10.0 req/s, 9.0 replies/s, errors 2 (+1), queued 2, workers 3 (1 idle, "
        "2 busy), clients 1, redelivered +1, refused +2"
    )
    # A counter that went down (another broker) counts from zero; no time: per 1 s.
    assert summary_line(now, before, 0.0).startswith("summary: 10.0 req/s, 10.0 replies/s")


def test_broker_log_summary_is_checked() -> None:
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="log_summary"):
            Broker("inproc://x", log_summary=bad)


def test_lazy_log_arguments() -> None:
    assert str(PeerId(b"\x00\x01")) == "0001"
    assert str(PeerId(bytes(range(10)))) == "0001020304050607..."
    assert str(Frames([b"id", b"", b"DGBX1"])) == "3 frame(s), 7 bytes: - 4447425831"


def test_log_every_forgets_the_oldest_key() -> None:
    log = LogEvery(interval=10.0, size=1)
    assert log("a", 0.0, "a %s", 1) == ("a %s", (1,))
    assert log("b", 1.0, "b") == ("b", ())  # "a" forgotten
    assert log("a", 2.0, "a") == ("a", ())
    assert log("a", 3.0, "a") is None
    assert log("a", 12.0, "a") == ("a (and %d more like it in the last %.0f s)", (1, 10.0))


# --------------------------------------------------------------------------- -v / -vv

EP = "tcp://127.0.0.1:1"
#: A minimal command line per command (every command of ``dcp --help``).
COMMANDS: dict[str, list[str]] = {
    "broker": ["broker", "--bind", "tcp://127.0.0.1:0"],
    "worker": ["worker", "--connect", EP, "--service", "s", "m:f"],
    "call": ["call", "--connect", EP, "echo"],
    "demo": ["demo"],
    "keys": ["keys", "name"],
    "pub": ["pub", "--connect", EP, "subject"],
    "sub": ["sub", "--connect", EP, "subject"],
    "services": ["services", "--connect", EP],
    "find": ["find", "--beacon", "5000"],
    "top": ["top", "--connect", EP],
}


def _record_levels(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make every command record the ``dcp`` loggers' level instead of running."""
    levels: list[int] = []
    build = build_parser

    def record(args: argparse.Namespace) -> int:
        levels.append(logging.getLogger("dcp.broker").getEffectiveLevel())
        return 0

    def build_recording() -> argparse.ArgumentParser:
        parser = build()
        assert set(parser.commands) == set(COMMANDS), "add the new command to COMMANDS"
        for sub in parser.commands.values():
            sub.set_defaults(func=record)
        return parser

    monkeypatch.setattr("dcp._cli._main.build_parser", build_recording)
    return levels


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_verbose_after_the_command_sets_the_level(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    levels = _record_levels(monkeypatch)
    argv = COMMANDS[command]
    before = logging.getLogger("dcp").level
    assert main(argv) == 0
    assert main([*argv, "-v"]) == 0
    assert main([argv[0], "-v", *argv[1:], "-v"]) == 0
    assert main(["-v", *argv]) == 0
    assert main([*argv, "-vv"]) == 0
    assert levels == [logging.WARNING, logging.INFO, logging.DEBUG, logging.INFO, logging.DEBUG]
    assert logging.getLogger("dcp").level == before  # put back after the command
