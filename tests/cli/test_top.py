"""``dcp top``: against a real broker subprocess (both backends), the ``mmi.broker`` figures
it reads (an in-process broker on both anyio backends), its rates and rendering (pure), and
its one-line errors."""

from __future__ import annotations

import io
import socket
import sys
import uuid
from pathlib import Path
from typing import cast

import anyio
import pytest

import dcp
from dcp._broker.broker import Broker
from dcp._cli import main
from dcp._cli._top import Row, Snapshot, cells, header, poll, render, rows, sort_rows
from dcp._client.client import Client
from dcp._core.broker.directory import PAGE_ENTRIES
from dcp._worker.worker import Worker
from dcp.wire import Request, serialize
from tests.cli.procs import HANDLER, Proc, start, start_broker
from tests.helpers import Peers


def _service_line(out: str, name: str) -> list[str]:
    lines = [line.split() for line in out.splitlines() if line.split()[:1] == [name]]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_top_once_shows_a_service_and_its_requests(
    backend: str, procs: list[Proc], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, tcp = start_broker(procs, tmp_path, backend)
    start(procs, "--backend", backend, "worker", "--connect", tcp, "--service", "echo", HANDLER)
    for _ in range(3):
        assert main(["--backend", backend, "call", "--connect", tcp, "--wait", "echo", "hi"]) == 0
    assert capsys.readouterr().out == "HI\n" * 3

    assert main(["top", "--connect", tcp, "--once", "--backend", backend]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a terminal: plain text
    assert out.startswith(f"dcp top - {tcp}  up ")
    assert "workers 1" in out and "requests 3" in out
    # SERVICE REQ/S REQS REPLIES ERRS ERR/S QUEUED OLDEST IDLE BUSY AVG-MS
    line = _service_line(out, "echo")
    assert line[:10] == ["echo", "-", "3", "3", "0", "-", "0", "-", "1", "0"]

    # Live mode, bounded: rates appear from the second poll on.
    argv = ["top", "--connect", tcp, "--interval", "0.05", "--count", "3", "--sort", "requests"]
    assert main(["--backend", backend, *argv]) == 0
    out = capsys.readouterr().out
    line = _service_line(out.split("dcp top - ")[-1], "echo")
    assert line[1] == "0.0" and line[2] == "3"


def test_top_finds_its_broker_by_beacon(
    procs: list[Proc], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    beacon = ("--beacon", str(port), "--beacon-address", "127.0.0.1")
    _, tcp = start_broker(procs, tmp_path, "trio", *beacon)
    assert main(["top", "--connect", f"beacon://127.0.0.1:{port}", "--once"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dcp top - {tcp}  up ") and "workers 0" in out


def test_top_unreachable_broker_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--once", "--wait-for-broker"], []):
        code = main(["top", "--connect", "tcp://127.0.0.1:1", "--timeout", "0.3", *extra])
        assert code == 1
        err = capsys.readouterr().err
        assert err == (
            "dcp top: no answer from tcp://127.0.0.1:1 within 0.3 s: "
            "is a dcp broker running there?\n"
        )


def test_top_once_does_not_wait_for_a_broker_that_is_not_there(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rule TP8: one line within about half a second, not a wait of --timeout (100 s here:
    the test's own timeout would end it first)."""
    refused = ": connection refused (nothing listens there): is a dcp broker running there?\n"
    one, two = _free_tcp(), _free_tcp()
    assert main(["top", "--connect", one, "--timeout", "100", "--once"]) == 1
    assert capsys.readouterr().err == f"dcp top: cannot connect to {one}{refused}"
    argv = ["top", "--connect", one, "--connect", two, "--timeout", "100", "--once"]
    assert main(argv) == 1
    assert capsys.readouterr().err == f"dcp top: cannot connect to any of {one}, {two}{refused}"


def _free_tcp() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_top_without_rich_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    assert main(["top", "--connect", "tcp://127.0.0.1:1", "--once"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'dagbox-dcp[top]'" in err and err.count("\n") == 1


def test_top_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--interval", "0"], ["--sort", "nope"], ["--count", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(["top", "--connect", "tcp://127.0.0.1:1", *bad])
        assert exit_.value.code == 2
    assert "dcp top: argument" in capsys.readouterr().err
    # --keys without --server-key: CURVE options are checked as every command checks them.
    assert main(["top", "--connect", "tcp://127.0.0.1:1", "--keys", "x.key_secret"]) == 2


# -------------------------------------------------------------------------- mmi.broker


async def _answer(request: dcp.HandlerRequest) -> bytes:
    if request.data[0] == b"fail":
        raise RuntimeError("no")
    return b"ok"


@pytest.mark.anyio
async def test_poll_reads_every_page_of_stats() -> None:
    """More services than one ``mmi.stats`` page holds (directory Rule D6): all shown."""
    ep = f"inproc://top-{uuid.uuid4().hex}"
    names = [f"s{n:04d}" for n in range(PAGE_ENTRIES + 5)]
    async with Broker(ep) as broker, Client(ep, timeout=5) as client:
        with Peers(ep) as peers:
            queuer = peers(b"queuer")
            for n, name in enumerate(names):  # one queued request makes each known
                queuer.send_frames(serialize(Request(name.encode(), None, (b"%d" % n,), ())))
            with anyio.fail_after(10):
                while len(broker.statistics().services) < len(names):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            snap = await poll(client, 5.0)
    assert [s["name"] for s in snap.services] == names


@pytest.mark.anyio
async def test_poll_reads_the_broker_figures() -> None:
    ep = f"inproc://top-{uuid.uuid4().hex}"
    async with (
        Broker(ep) as broker,
        Worker(ep, b"svc", _answer),
        Client(ep, timeout=5) as client,
    ):
        await client.request("svc", b"x")
        with pytest.raises(dcp.RemoteError):
            await client.request("svc", b"fail")
        await anyio.sleep(0.01)
        snap = await poll(client, 5.0)
        stats = broker.statistics()
    (svc,) = snap.services
    assert (svc["name"], svc["num_requests"], svc["num_answered"], svc["num_errors"]) == (
        "svc",
        2,
        2,
        1,
    )
    doc = snap.broker
    assert doc is not None
    assert doc["type"] == "io.dcp.v1.broker_stats"
    assert doc["uptime"] > 0
    assert (doc["requests"], doc["errors"], doc["workers"], doc["services"]) == (
        stats.requests,
        1,
        1,
        1,
    )
    assert doc["replies"] == stats.replies == 2
    assert doc["rejections"] == {} and doc["queued"] == 0


@pytest.mark.anyio
async def test_broker_figures_reconcile_with_the_rows() -> None:
    """Rule TP5: ``requests`` = the rows' requests + those of services forgotten since (a
    worker that left took its service along); ``errors`` is the rows' sum."""
    ep = f"inproc://top-{uuid.uuid4().hex}"
    async with Broker(ep), Client(ep, timeout=5) as client:
        async with Worker(ep, b"gone", _answer):
            for _ in range(3):
                await client.request("gone", b"x")
            with pytest.raises(dcp.RemoteError):
                await client.request("gone", b"fail")
        async with Worker(ep, b"svc", _answer):
            await client.request("svc", b"x")
            for _ in range(100):  # the broker forgets "gone" once its worker has left
                snap = await poll(client, 5.0)
                if [s["name"] for s in snap.services] == ["svc"]:
                    break
                await anyio.sleep(0.01)
    doc = snap.broker
    assert doc is not None
    rows_total = sum(s["num_requests"] for s in snap.services)
    assert (rows_total, doc["forgotten_requests"], doc["requests"]) == (1, 4, 5)
    assert doc["errors"] == sum(s["num_errors"] for s in snap.services) == 0
    assert (doc["expired_in_queue"], doc["replaced"]) == (0, 0)
    text = header(ep, None, snap, "")
    assert "  requests = rows 1 + forgotten services 4  " in text
    assert "expired in queue 0  replaced retries 0" in text


# ------------------------------------------------------------------- rates, rendering


def _stats(name: str, requests: int, errors: int = 0, queued: int = 0) -> dict[str, object]:
    return {
        "name": name,
        "num_requests": requests,
        "num_answered": requests - queued,
        "num_errors": errors,
        "average_processing_time": 2_000_000,
        "queued": queued,
        "oldest_queued_age": 1.5 if queued else 0.0,
        "workers": 1,
        "idle": 0 if queued else 1,
        "busy": 1 if queued else 0,
    }


def _broker(requests: int, uptime: float, **more: object) -> dict[str, object]:
    return {"uptime": uptime, "requests": requests, "replies": requests, **more}


def test_rates_are_deltas_over_the_time_between_polls() -> None:
    first = Snapshot(10.0, (_stats("a", 10), _stats("b", 50, 1)), _broker(60, 5.0))
    second = Snapshot(
        12.0, (_stats("a", 30), _stats("b", 40, 3), _stats("c", 1, queued=1)), _broker(71, 7.0)
    )
    table = {r.name: r for r in rows(first, second)}
    assert table["a"].rate == 10.0 and table["a"].error_rate == 0.0
    assert table["b"].rate is None  # went down: known again, or a restart (Rule TP1)
    assert table["b"].error_rate == 1.0
    assert table["c"].rate is None and table["c"].queued == 1
    assert [r.name for r in rows(None, second)] == ["a", "b", "c"]
    assert all(r.rate is None for r in rows(None, second))
    assert [r.name for r in sort_rows(rows(first, second), "rate")] == ["a", "b", "c"]
    assert [r.name for r in sort_rows(rows(first, second), "requests")] == ["b", "a", "c"]
    assert [r.name for r in sort_rows(rows(first, second), "name")] == ["a", "b", "c"]
    assert cells(table["c"])[7] == "1.5s"
    assert cells(table["a"])[-1] == "2.00"


def test_header_lines() -> None:
    first = Snapshot(0.0, (), _broker(5, 59.0, rejections={"queue_full": 2}))
    second = Snapshot(
        1.0, (), _broker(7, 3 * 86400 + 3700, rejections={"queue_full": 4, "client_limit": 1})
    )
    text = header("tcp://h:1", first, second, "")
    assert "up 3d01h01m" in text
    assert "req/s 2.0" in text and "requests 7 (+2)" in text
    assert "refusals (not requests): queue_full 4 (+2), client_limit 1" in text
    assert "since start: " in text and "rows: since each service became known" in text
    assert "forgotten" not in text  # an older broker: no forgotten_requests
    assert "up 59s" in header("e", None, first, "")
    assert "up 1m01s" in header("e", None, Snapshot(0.0, (), _broker(0, 61.0)), "")
    assert "up 1h00m05s" in header("e", None, Snapshot(0.0, (), _broker(0, 3605.0)), "")
    stale = header("e", None, Snapshot(0.0, (), None), "no reply")
    assert stale.splitlines() == [
        "dcp top - e  [stale: no reply]",
        "this broker does not answer mmi.broker: services only",
    ]


def test_render_marks_errors_and_waiting_queues() -> None:
    from rich.console import Console

    first = Snapshot(0.0, (_stats("a", 1), _stats("q", 1, queued=1)), None)
    second = Snapshot(1.0, (_stats("a", 2, errors=1), _stats("q", 2, queued=2)), None)
    console = Console(width=120, force_terminal=True, color_system="standard")
    with console.capture() as captured:
        console.print(render("e", first, second, "name"))
    out = captured.get()
    assert "\x1b[31m" in out and "\x1b[33m" in out  # red: errors now; yellow: queued, none idle
    with console.capture() as captured:
        console.print(render("e", None, Snapshot(0.0, (), None), "name"))
    assert "no services yet" in captured.get()


def test_row_is_a_value() -> None:
    row = Row("a", None, 1, 1, 0, None, 0, 0.0, 1, 1, 0, 0.0)
    assert cells(row)[:2] == ("a", "-")


# ------------------------------------------------------ stale polls, a broker that is not dcp


class _Answers:
    """Stands in for a :class:`dcp.Client` in :func:`poll`: answers from a list."""

    def __init__(self, *answers: tuple[bytes, ...]) -> None:
        self.answers = list(answers)

    async def request(self, name: str, **options: object) -> dcp.Response:
        data = self.answers.pop(0)
        return dcp.Response(data=data, metadata=())


@pytest.mark.anyio
async def test_poll_of_an_older_or_foreign_broker() -> None:
    older = cast("Client", _Answers((b"[]",), (b"501",)))
    snap = await poll(older, 1.0)
    assert (snap.services, snap.broker) == ((), None)
    foreign = cast("Client", _Answers((b"501",)))
    with pytest.raises(RuntimeError, match=r"does not answer mmi\.stats"):
        await poll(foreign, 1.0)


def test_live_view_keeps_stale_figures_and_reports_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dcp._cli._top as top

    script: list[object] = [
        Snapshot(0.0, (_stats("a", 1),), _broker(1, 1.0)),
        dcp.RequestTimeout("no reply after 1 attempt(s)"),
        Snapshot(1.0, (_stats("a", 3),), _broker(3, 2.0)),
        RuntimeError("the broker does not answer mmi.stats (not a dcp broker?)"),
    ]

    async def scripted(client: Client, wait: float) -> Snapshot:
        item = script.pop(0)
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, Snapshot)
        return item

    monkeypatch.setattr(top, "poll", scripted)
    argv = ["top", "--connect", "tcp://127.0.0.1:1", "--interval", "0.01", "--count", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[stale: no reply after 1 attempt(s)]" in out
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == "dcp top: the broker does not answer mmi.stats (not a dcp broker?)\n"


def test_beacon_that_cannot_be_heard_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: listening there fails at once.
    assert main(["top", "--connect", "beacon://192.0.2.1:5000", "--once"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dcp top: cannot listen for a beacon: ") and err.count("\n") == 1


def test_live_view_in_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    import dcp._cli._top as top

    screen = io.StringIO()
    monkeypatch.setattr(
        top, "make_console", lambda: Console(file=screen, force_terminal=True, width=100)
    )
    script = [Snapshot(float(i), (_stats("a", i),), _broker(i, float(i))) for i in range(3)]

    async def scripted(client: Client, wait: float) -> Snapshot:
        return script.pop(0)

    monkeypatch.setattr(top, "poll", scripted)
    argv = ["top", "--connect", "tcp://127.0.0.1:1", "--interval", "0.01", "--count", "3"]
    assert main(argv) == 0
    drawn = screen.getvalue()
    assert "\x1b[" in drawn and drawn.count("dcp top - ") >= 3  # redrawn in place
    assert not script


def test_console_follows_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    import dcp._cli._top as top

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    assert top.make_console().width != 160
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert top.make_console().width == 160


# -------------------------------------------------------------------------- several brokers


def _blocks(out: str) -> dict[str, str]:
    """Each broker's block of a ``dcp top`` view with several brokers, by endpoint."""
    blocks = out.split("\ndcp top - ")[1:]
    return {block.split()[0]: block for block in blocks}


def test_top_shows_each_broker_and_one_that_is_down(
    procs: list[Proc], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    _, tcp_a = start_broker(procs, tmp_path / "a")
    broker_b, tcp_b = start_broker(procs, tmp_path / "b")
    start(procs, "worker", "--connect", tcp_a, "--service", "echo", HANDLER)
    start(procs, "worker", "--connect", tcp_b, "--service", "other", HANDLER)
    for service, tcp in (("echo", tcp_a), ("other", tcp_b)):
        assert main(["call", "--connect", tcp, "--wait", service, "hi"]) == 0
    capsys.readouterr()

    both = ["top", "--connect", tcp_a, "--connect", tcp_b]
    assert main([*both, "--once"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dcp top - 2 brokers: 2 up, 0 down\n")
    blocks = _blocks(out)
    assert list(blocks) == [tcp_a, tcp_b]  # in the order given
    # Each broker answered its own question: its own services and figures.
    assert _service_line(blocks[tcp_a], "echo")[2] == "1"
    assert "other" not in blocks[tcp_a]
    assert _service_line(blocks[tcp_b], "other")[2] == "1"
    assert "echo" not in blocks[tcp_b]

    broker_b.kill()  # SIGKILL: B is down, A is still shown
    argv = [*both, "--timeout", "0.3", "--interval", "0.05", "--count", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    views = out.split("dcp top - 2 brokers: ")[1:]
    assert len(views) == 2
    for view in views:
        assert view.startswith("1 up, 1 down\n")
        blocks = _blocks(view)
        assert _service_line(blocks[tcp_a], "echo")[2] == "1"
        assert blocks[tcp_b].startswith(f"{tcp_b}  [down: ")
    assert main([*both, "--once", "--timeout", "0.3"]) == 0
    assert "[down: " in _blocks(capsys.readouterr().out)[tcp_b]


def test_top_with_no_broker_answering_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["top", "--connect", "tcp://127.0.0.1:1", "--connect", "tcp://127.0.0.1:2"]
    assert main([*argv, "--timeout", "0.3", "--once", "--wait-for-broker"]) == 1  # Rule TP8
    assert capsys.readouterr().err == (
        "dcp top: no answer from any of tcp://127.0.0.1:1, tcp://127.0.0.1:2 within 0.3 s: "
        "is a dcp broker running there?\n"
    )
