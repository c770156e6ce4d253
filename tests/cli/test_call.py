"""``dcp call`` as a new user meets it (:mod:`dcp._cli._call` Rules CL1 and CL2): what ``-v``
and ``-vv`` say, and a call to a service nobody serves. In process (so coverage sees the
command), against a real ``dcp broker`` and ``dcp worker`` subprocesses on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest

import dcp
from dcp._cli import main
from dcp._cli._call import ERROR_REPLY, NO_WORKERS, TIMED_OUT
from tests.cli.procs import HANDLER, Proc, start, start_broker


def _lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dcp.cli" and r.levelno == level]


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_verbose_call_says_where_what_and_how_long(
    procs: list[Proc],
    tmp_path: Path,
    backend: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, tcp = start_broker(procs, tmp_path, backend)
    start(procs, "worker", "--connect", tcp, "--service", "echo", HANDLER)
    argv = ["--backend", backend, "call", "--connect", tcp, "--wait", "echo", "hello", "world"]
    # The worker has registered once a call is answered: a process slow to start (a loaded
    # machine) would otherwise make the call below resend while it waits for the worker.
    assert main([*argv, "--timeout", "60"]) == 0
    capsys.readouterr()
    caplog.clear()
    assert main([*argv, "-v", "--metadata", "m"]) == 0
    assert capsys.readouterr().out == "HELLO\nWORLD\n"
    broker, request, reply = _lines(caplog)
    assert broker == f"broker {tcp}; timeout 5 s, 2 resend(s) after 1.67 s"
    assert request == (
        "request to 'echo': data 2 part(s), 10 bytes, metadata 1 part(s), 1 bytes; waits for "
        "a worker (--wait)"
    )
    assert reply.startswith("reply after ")
    assert reply.endswith(": data 2 part(s), 10 bytes, metadata 1 part(s), 1 bytes")
    assert not _lines(caplog, logging.DEBUG)
    # -vv: the frames too (the client's DEBUG line for each message from the broker).
    caplog.clear()
    assert main([*argv, "-vv"]) == 0
    assert capsys.readouterr().out == "HELLO\nWORLD\n"
    debug = [r.getMessage() for r in caplog.records if r.name == "dcp.client"]
    assert any(line.startswith(f"from broker {tcp}: ") for line in debug), debug


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_call_to_nobody_fails_at_once_and_verbose_says_so(
    procs: list[Proc],
    tmp_path: Path,
    backend: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, tcp = start_broker(procs, tmp_path, backend)
    argv = ["--backend", backend, "call", "-v", "--connect", tcp, "--timeout", "30", "nobody"]
    assert main(argv) == NO_WORKERS == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dcp call: no worker serves 'nobody' (start one with")
    assert _lines(caplog)[-1].startswith("the broker says no worker serves 'nobody' (after ")
    # --wait: queued, resent as attempts time out (each resend logged), then told why. The
    # broker's answer to the probe must come before the end (Rule RT5 of the tracker: sent
    # 10% of the call's time before it): 0.6 s, time enough on a loaded machine.
    caplog.clear()
    waiting = ["--timeout", "6", "--retries", "2", "--wait"]
    assert main([*argv[:-3], *waiting, "nobody"]) == NO_WORKERS
    assert capsys.readouterr().err == (
        "dcp call: no worker serves 'nobody' (the broker says so; no reply after 6s "
        "(3 attempts sent))\n"
    )
    assert "no reply yet: resent the request (attempt 2 of 3)" in _lines(caplog)


def test_verbose_stream_logs_each_part(
    procs: list[Proc],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, tcp = start_broker(procs, tmp_path)
    start(procs, "worker", "--connect", tcp, "--service", "trickle", "tests.cli.handlers:trickle")
    # The worker has registered once a call is answered (its process may take longer to
    # start on a loaded machine than the call below waits).
    warm = ["call", "--connect", tcp, "--wait", "--timeout", "60", "--stream", "trickle", "1"]
    assert main(warm) == 0
    capsys.readouterr()
    caplog.clear()
    assert main(["call", "-v", "--connect", tcp, "--wait", "--stream", "trickle", "2"]) == 0
    assert capsys.readouterr().out == "part 0\npart 1\n"
    lines = _lines(caplog)
    assert lines[0] == f"broker {tcp}; timeout 5 s, no resends"
    assert lines[-2:] == ["part 1: 1 part(s), 6 bytes", "part 2: 1 part(s), 6 bytes"]
    # Without --wait the stream asks mmi.service first: the worker is there, so it runs.
    assert main(["call", "--connect", tcp, "--stream", "trickle", "1"]) == 0
    assert capsys.readouterr().out == "part 0\n"


def test_stream_to_a_silent_endpoint_times_out(capsys: pytest.CaptureFixture[str]) -> None:
    """No answer to ``mmi.service`` (nobody listens): the stream is tried, and times out."""
    argv = ["call", "--connect", "tcp://127.0.0.1:1", "--stream", "--timeout", "0.2", "x"]
    argv.append("--wait-for-broker")  # not BrokerUnreachable: the stream times out
    assert main(argv) == TIMED_OUT
    assert capsys.readouterr().err.startswith("dcp call: RequestTimeout: ")


def test_a_timeout_says_whether_the_broker_answers(
    procs: list[Proc], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rule CL3: the client's probe (``mmi.service``) tells a missing broker from a slow
    worker."""
    _, tcp = start_broker(procs, tmp_path)
    start(procs, "worker", "--connect", tcp, "--service", "slow", "tests.cli.handlers:slow")
    assert main(["call", "--connect", tcp, "--wait", "--timeout", "30", "slow", "0"]) == 0
    assert capsys.readouterr().out == "done\n"  # the worker has registered
    argv = ["call", "--connect", tcp, "--retries", "0", "--timeout", "0.5"]
    assert main([*argv, "slow", "10"]) == TIMED_OUT
    assert capsys.readouterr().err == (
        "dcp call: RequestTimeout: no reply after 0.5s (1 attempt sent); the broker answers, "
        "and a worker serves 'slow': it did not reply in time\n"
    )
    # A DagBox C++ broker (--type-width 4) has no mmi.service: nothing to ask; nothing heard.
    silent = ["call", "--connect", "tcp://127.0.0.1:1", "--type-width", "4", "--retries", "0"]
    assert main([*silent, "--timeout", "0.1", "x"]) == TIMED_OUT
    assert capsys.readouterr().err == (
        "dcp call: RequestTimeout: no reply after 0.1s (1 attempt sent); nothing heard from "
        "tcp://127.0.0.1:1: is a dcp broker running there?\n"
    )


@pytest.mark.anyio
async def test_broker_logs_no_workers_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """The answer to a no-wait request nobody serves is news (INFO), not a WARNING."""
    caplog.set_level(logging.INFO, logger="dcp")
    ep = f"inproc://call-{uuid.uuid4().hex}"
    async with dcp.Broker(ep), dcp.Client(ep, timeout=5) as client:
        with pytest.raises(dcp.NoWorkers):
            await client.request("nobody", b"x", no_wait=True)
    (record,) = [r for r in caplog.records if "no_workers" in r.getMessage()]
    assert (record.name, record.levelno) == ("dcp.broker", logging.INFO)


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_json_errors_and_an_exit_status_for_each_failure(
    procs: list[Proc], tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25, finding 11 (Rules CL4 and CL5): an error reply, a timeout and "no worker"
    each have their own exit status; with ``--json`` each is also one JSON object on stdout,
    and stderr and the exit status are the same as without."""
    _, tcp = start_broker(procs, tmp_path, backend)
    start(
        procs, "worker", "--connect", tcp, "--service", "boom", "tests.cli.handlers:boom",
        "--service", "slow", "tests.cli.handlers:slow",
    )  # fmt: skip
    argv = ["--backend", backend, "call", "--connect", tcp, "--retries", "0"]
    assert main([*argv, "--wait", "--timeout", "30", "slow", "0"]) == 0
    assert capsys.readouterr().out == "done\n"  # the worker has registered
    timeout = ["--timeout", "0.5", "slow", "10"]
    cases = [
        (["boom", "x"], ERROR_REPLY, "RemoteError", "handler_error", "ValueError: cannot do 'x'"),
        (
            timeout,
            TIMED_OUT,
            "RequestTimeout",
            "timeout",
            "no reply after 0.5s (1 attempt sent); the broker answers, and a worker serves "
            "'slow': it did not reply in time",
        ),
        (["nobody"], NO_WORKERS, "NoWorkers", "no_workers", "no worker serves 'nobody' ("),
    ]
    assert len({case[1] for case in cases} | {0, 1, 2}) == 6  # all distinct
    for call, status, kind, code, message in cases:
        assert main([*argv, *call]) == status
        plain = capsys.readouterr()
        assert plain.out == ""
        assert plain.err.startswith("dcp call: ") and plain.err.count("\n") == 1, plain.err
        assert main([*argv, "--json", *call]) == status
        captured = capsys.readouterr()
        assert captured.err == plain.err
        error = json.loads(captured.out)["error"]
        assert (error["type"], error["code"]) == (kind, code)
        assert error["message"].startswith(message)
        assert captured.out.count("\n") == 1


def test_help_documents_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["call", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for line in [
        "4 no worker serves the service",
        "5 an error reply: the worker's handler failed",
        "6 no reply in time",
    ]:
        assert line in text
