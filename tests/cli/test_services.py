"""``dcp services``, ``dcp find``, ``dcp broker --beacon`` and ``dcp worker`` with several
``--service NAME MODULE:FUNC`` pairs: a real broker and worker as subprocesses, the
listing commands in process (so coverage sees them), loopback only."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from dcp._cli import main
from dcp._cli._services import render_table
from tests.cli.procs import HANDLER, Proc, run, start, start_broker


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_services_find_and_several_services(
    procs: list[Proc], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_udp_port()
    beacon = ("--beacon", str(port), "--beacon-address", "127.0.0.1")
    broker, tcp = start_broker(procs, tmp_path, "trio", *beacon)
    worker = start(
        procs, "worker", "--connect", tcp, "--service", "echo", HANDLER,
        "--service", "slow", "tests.cli.handlers:slow", "--concurrency", "2",
    )  # fmt: skip
    code, out, err = run("call", "--connect", tcp, "--wait", "echo", "hi")
    assert (code, out, err) == (0, "HI\n", "")
    code, out, err = run("call", "--connect", tcp, "slow", "0")
    assert (code, out, err) == (0, "done\n", "")

    assert main(["services", "--connect", tcp, "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {e["name"] for e in listing} == {"echo", "slow"}
    for entry in listing:
        assert entry["workers"] == 1
        assert {"name", "workers", "queued", "version", "description"} <= set(entry)
    assert main(["services", "--connect", tcp]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "name",
        "workers",
        "idle",
        "busy",
        "queued",
        "version",
        "description",
    ]
    assert sorted(line.split()[0] for line in table[1:]) == ["echo", "slow"]

    assert main(["find", "--beacon", str(port), "--host", "127.0.0.1", "--timeout", "5"]) == 0
    assert capsys.readouterr().out.strip() == tcp
    # A beacon instead of an endpoint, for any command that connects.
    assert run("call", "--connect", f"beacon://127.0.0.1:{port}", "echo", "hi") == (
        0,
        "HI\n",
        "",
    )
    code, _, err = run("call", "--connect", "beacon://127.0.0.1", "echo", "hi")
    assert code == 2 and "expected beacon://[HOST]:PORT" in err
    worker.kill()
    broker.kill()


def test_find_times_out_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_udp_port()
    code = main(["find", "--beacon", str(port), "--host", "127.0.0.1", "--timeout", "0.2"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("dcp find: no broker beacon on UDP port")
    assert "Traceback" not in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv",
    [["call", "x"], ["services"], ["pub", "a.b", "x"], ["worker", "--service", "s", HANDLER]],
    ids=lambda argv: argv[0],
)
def test_a_beacon_nobody_sends_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """:mod:`dcp._cli._run` Rule CR4: ``--connect beacon://...`` where no broker announces
    itself (after the 5 s the client listens), or a beacon address this machine cannot listen
    on, is one line and exit status 1, as in ``dcp find``; not a ``TimeoutError``
    traceback."""
    port = free_udp_port()
    command, rest = argv[0], argv[1:]
    assert main([command, "--connect", f"beacon://127.0.0.1:{port}", *rest]) == 1
    assert capsys.readouterr() == (
        "",
        f"dcp {command}: no broker beacon on UDP port {port} within 5 s\n",
    )
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is no address of this machine's.
    assert main([command, "--connect", f"beacon://192.0.2.1:{port}", *rest]) == 1
    assert capsys.readouterr() == (
        "",
        f"dcp {command}: cannot listen for a beacon: Cannot assign requested address\n",
    )


def test_services_times_out_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["services", "--connect", "tcp://127.0.0.1:1", "--timeout", "0.3"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("dcp services: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--service", "a"], "--service NAME needs a handler"),
        ([HANDLER, "--service", "a", HANDLER, "--service", "b", HANDLER], "goes after one"),
        (["--service", "a", HANDLER, "--service", "b"], "takes NAME MODULE:FUNC"),
        (["--service", "a", HANDLER, "--service", "a", HANDLER], "given twice"),
    ],
)
def test_worker_service_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", "--connect", "tcp://127.0.0.1:1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_beacon_port_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("x", "0", "70000"):
        with pytest.raises(SystemExit) as exit_:
            main(["find", "--beacon", bad])
        assert exit_.value.code == 2
    assert "--beacon" in capsys.readouterr().err
    assert main(["broker", "--bind", "ipc:///tmp/x.sock", "--beacon", "5"]) == 2
    assert "tcp://" in capsys.readouterr().err


def test_render_table() -> None:
    rows = [{"name": "a", "workers": 1, "idle": 1, "busy": 0, "queued": 0, "version": "1.0.0"}]
    lines = render_table(rows).splitlines()
    assert lines[1].split() == ["a", "1", "1", "0", "0", "1.0.0"]


def test_call_and_services_with_several_brokers(
    procs: list[Proc], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, tcp_a = start_broker(procs, tmp_path / "a")
    _, tcp_b = start_broker(procs, tmp_path / "b")
    ready = [tmp_path / f"ready-{i}" for i in range(3)]
    for tcp, file in ((tcp_a, ready[0]), (tcp_b, ready[1])):
        start(
            procs,
            "worker",
            "--connect",
            tcp,
            "--service",
            "echo",
            HANDLER,
            "--ready-file",
            str(file),
        )
    start(
        procs, "worker", "--connect", tcp_b, "--service", "slow", "tests.cli.handlers:slow",
        "--ready-file", str(ready[2]),
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not all(file.exists() for file in ready):  # each registered
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # --connect given twice, or a comma-separated list: the call goes to either broker.
    code, out, err = run(
        "-v", "call", "--connect", tcp_a, "--connect", tcp_b, "--wait", "echo", "hi"
    )
    assert (code, out) == (0, "HI\n"), err
    assert f"brokers {tcp_a}, {tcp_b};" in err
    assert main(["services", "--connect", f"{tcp_a},{tcp_b}", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {e["name"]: e["workers"] for e in listing} == {"echo": 2, "slow": 1}
    code, _, err = run("call", "--connect", tcp_a, "--connect", tcp_a, "echo", "hi")
    assert code == 2 and "given twice" in err
