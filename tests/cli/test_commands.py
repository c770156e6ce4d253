"""The ``dcp`` command line, run as real subprocesses (``python -m dcp``; helpers in
``tests/cli/procs.py``), plus in-process calls of :func:`dcp._cli.main` so coverage sees the
argument handling. User errors (one line, exit codes) are in ``test_cli_errors.py``.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path

import pytest
import zmq

import dcp
from dcp._cli import main
from dcp._cli._call import ERROR_REPLY, TIMED_OUT
from dcp._cli._parser import build_parser
from dcp._cli.demo import DemoSummary
from dcp.wire import mdp
from dcp.wire.messages import Reconnect, Register, Reply, Request
from tests.cli.procs import HANDLER, Proc, run, start, start_broker
from tests.fakes import DagBoxBroker


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_broker_prints_endpoints_and_stops_cleanly_on_signal(
    procs: list[Proc], tmp_path: Path, backend: str, signum: signal.Signals
) -> None:
    """SIGTERM is a clean stop (0); Ctrl-C is one too, reported as 130, without a word
    beyond the broker's log lines."""
    broker, _ = start_broker(procs, tmp_path, backend, "-v")  # INFO: the signal is logged
    assert Path(tmp_path, "b.sock").exists()
    broker.popen.send_signal(signum)
    code, out, err = broker.finish(5)
    assert code == (130 if signum == signal.SIGINT else 0), err
    assert out == ""
    assert "Traceback" not in err
    assert f"received {signum.name}, stopping" in err


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_worker_and_call_through_the_broker(
    procs: list[Proc], tmp_path: Path, backend: str
) -> None:
    broker, tcp = start_broker(procs, tmp_path, backend)
    worker = start(
        procs, "--backend", backend, "worker", "--connect", tcp, "--service", "echo", HANDLER
    )
    # The call may be sent before the worker has registered: with --wait the broker queues it.
    code, out, err = run(
        "--backend", backend, "call", "--connect", f"ipc://{tmp_path}/b.sock", "--wait", "echo",
        "hello", "world",
    )  # fmt: skip
    assert (code, out, err) == (0, "HELLO\nWORLD\n", "")
    # The worker leaves gracefully on SIGTERM (0), the broker on SIGINT (130).
    worker.popen.send_signal(signal.SIGTERM)
    code, _, err = worker.finish(5)
    assert code == 0, err
    broker.popen.send_signal(signal.SIGINT)
    code, _, err = broker.finish(5)
    assert code == 130, err
    assert "Traceback" not in err


def test_worker_and_call_with_type_width_4_through_a_dagbox_broker(procs: list[Proc]) -> None:
    """``--type-width 4``: every message either process writes has a 4-byte type frame, as
    the DagBox C++ reference broker needs (the stand-in fails the test on any other)."""
    with DagBoxBroker() as dagbox:
        worker = start(
            procs, "worker", "--connect", dagbox.endpoint, "--service", "echo",
            "--type-width", "4", HANDLER,
        )  # fmt: skip
        code, out, err = run(
            "call",
            "--connect",
            dagbox.endpoint,
            "--type-width",
            "4",
            "--wait",
            "echo",
            "hello",
            "world",
        )
        assert (code, out, err) == (0, "HELLO\nWORLD\n", "")
        worker.popen.send_signal(signal.SIGTERM)
        code, _, err = worker.finish(10)
        assert code == 0, err
        deadline = time.monotonic() + 5
        while not dagbox.received(Reconnect) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert set(dagbox.widths) == {4}
    (worker_id,) = dagbox.received(Register)
    assert dagbox.received(Reply) == [worker_id]
    assert dagbox.received(Reconnect) == [worker_id]
    assert len(dagbox.received(Request)) == 1


def wait_for_file(path: Path, proc: Proc, timeout: float = 30.0) -> str:
    """``path``'s text once it exists (fails after ``timeout`` s, or if ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.popen.poll() is None, proc.finish(5)
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.02)
    return path.read_text()


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_worker_says_when_it_serves_and_finishes_its_request_on_sigterm(
    procs: list[Proc], tmp_path: Path, backend: str
) -> None:
    """Issue 25, finding 8 (:mod:`dcp._cli._worker` Rules CW2 and CW3): at default verbosity
    the worker says on stderr when it serves and, on SIGTERM, what it is finishing; the
    ready file is there once the broker has echoed the registration, gone at exit. SIGTERM is
    a graceful stop: the request in progress is answered, then it leaves (once it is
    answered: not at the end of its --grace)."""
    _, tcp = start_broker(procs, tmp_path)
    ready = tmp_path / "worker.ready"
    ready.write_text("stale\n")  # from a worker killed earlier: removed at start
    worker = start(
        procs, "--backend", backend, "worker", "--connect", tcp,
        "--service", "slow", "tests.cli.handlers:slow_announced", "--service", "echo", HANDLER,
        "--grace", "120", "--ready-file", str(ready),
    )  # fmt: skip
    serving = worker.wait_stderr(b"\n", timeout=30)
    assert serving.decode() == (
        f"dcp worker: serving 'slow', 'echo' at {tcp} (concurrency 1 each)\n"
    )
    doc = json.loads(wait_for_file(ready, worker))
    assert doc == {"pid": worker.popen.pid, "endpoint": tcp, "services": ["slow", "echo"]}
    # The file is written after the broker echoed the registration: a call needs no --wait.
    assert run("call", "--connect", tcp, "echo", "ready")[:2] == (0, "READY\n")
    call = start(procs, "call", "--connect", tcp, "--retries", "0", "--timeout", "60", "slow", "2")
    # Signal the worker while its handler sleeps (2 s): once the handler says it started.
    worker.wait_stderr(b"handling\n", timeout=60)
    worker.popen.send_signal(signal.SIGTERM)
    assert call.finish(60)[:2] == (0, "done\n")
    code, _, err = worker.finish(60)  # well before the 120 s of grace
    assert code == 0, err
    # (A loaded machine may add the library's blocked-loop warning: not this test's business.)
    assert err.splitlines()[0] == (
        "dcp worker: SIGTERM: stopping; finishing 1 request(s), for at most 120 s "
        "(SIGTERM again to force)"
    ), err
    assert not ready.exists()


def test_call_wait_to_a_service_nobody_serves_fails_after_its_timeout(
    procs: list[Proc], tmp_path: Path
) -> None:
    """--wait queues the call; nobody came: the client asked mmi.service before giving up,
    so it is exit status 4 (no worker), not 1 (a timeout)."""
    _, tcp = start_broker(procs, tmp_path)
    began = time.monotonic()
    # The client asks the broker (mmi.service) min(1 s, 10%) before giving up: 0.5 s here
    # for the answer to come back, so a loaded machine does not turn it into a plain
    # timeout (with 0.3 s, the broker had 30 ms).
    code, out, err = run(
        "call", "--connect", tcp, "--wait", "--timeout", "5", "--retries", "0", "nobody"
    )
    assert time.monotonic() - began >= 5
    assert (code, out) == (4, "")
    assert err == (
        "dcp call: no worker serves 'nobody' (the broker says so; no reply after 5s "
        "(1 attempt sent))\n"
    )


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
@pytest.mark.parametrize("flag", [[], ["--no-wait"]], ids=["default", "no-wait"])
def test_call_fails_at_once_when_nobody_serves(
    procs: list[Proc], tmp_path: Path, backend: str, flag: list[str]
) -> None:
    """As ``nats req``'s "no responders": one line, exit status 4, not the 30 s timeout."""
    _, tcp = start_broker(procs, tmp_path)
    began = time.monotonic()
    code, out, err = run(
        "--backend", backend, "call", "--connect", tcp, "--timeout", "30", *flag, "nobody"
    )
    assert time.monotonic() - began < 10  # not the 30 s timeout
    assert (code, out) == (4, "")
    assert err == (
        "dcp call: no worker serves 'nobody' (start one with 'dcp worker', or use --wait to "
        "queue the call until one registers)\n"
    )


def test_call_wait_and_no_wait_exclude_each_other() -> None:
    code, out, err = run("call", "--connect", "tcp://127.0.0.1:1", "--wait", "--no-wait", "x")
    assert (code, out) == (2, "")
    assert "not allowed with argument" in err


def test_demo_runs_clean() -> None:
    code, out, err = run("demo", "--requests", "200", "--no-progress")
    assert code == 0, err
    assert out.startswith("dcp demo summary\n")
    assert "  requests     200\n" in out
    assert "  replies ok   200\n" in out
    assert "  errors       0\n" in out
    assert err == ""  # --no-progress: no progress bar on stderr


# -- in process, so coverage sees the argument handling -----------------------------------


def test_call_timeout_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--backend", "asyncio", "call", "--connect", "tcp://127.0.0.1:1"]
    assert main([*argv, "--timeout", "0.1", "--retries", "0", "echo", "x"]) == TIMED_OUT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "dcp call: RequestTimeout: no reply after 0.1s (1 attempt sent); nothing heard from "
        "tcp://127.0.0.1:1: is a dcp broker running there?\n"
    )


@pytest.mark.parametrize("width", ["1", "4"])
def test_demo_in_process(width: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--requests", "40", "--clients", "2", "--window", "4", "--type-width", width]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "  replies ok   40\n  errors       0\n" in captured.out
    assert "40/40" in captured.err  # the progress bar


def test_demo_window_beyond_its_requests(capsys: pytest.CaptureFixture[str]) -> None:
    """``--window`` larger than the requests starts one lane per request, not a million tasks
    that blocked the event loop (and the workers' heartbeats) until every request failed."""
    argv = ["demo", "--requests", "3", "--clients", "1", "--window", "1000000", "--no-progress"]
    assert main(argv) == 0
    assert "  replies ok   3\n  errors       0\n" in capsys.readouterr().out


def test_demo_summary_without_replies() -> None:
    """No reply at all: the latency line says so (it printed ``p50 nan ms``)."""
    summary = DemoSummary(requests=5, ok=0, errors=5, seconds=1.0, latencies=())
    assert "  throughput   0 req/s\n  latency      - (no reply)" in summary.render()


def test_broker_limits_from_the_command_line(procs: list[Proc]) -> None:
    broker = start(procs, "broker", "--bind", "tcp://127.0.0.1:0", "--max-client-queued", "0")
    (tcp,) = broker.read_lines(1)
    # No worker, and no client may queue anything: refused at once with an error reply.
    code, out, err = run("call", "--connect", tcp, "--wait", "--retries", "0", "nobody", "x")
    assert code == ERROR_REPLY
    assert out == ""
    assert "client_limit" in err


def test_broker_mdp_timeout_from_the_command_line(procs: list[Proc]) -> None:
    """An idle Majordomo worker silent for --mdp-timeout is gone: mmi.service says 404."""
    broker = start(procs, "broker", "--bind", "tcp://127.0.0.1:0", "--mdp-timeout", "0.5")
    (tcp,) = broker.read_lines(1)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    worker, client = ctx.socket(zmq.DEALER), ctx.socket(zmq.REQ)
    try:
        for sock in (worker, client):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.connect(tcp)
        worker.send_multipart(
            mdp.peer(mdp.Form.V01, envelope=True, worker=True).worker_ready(b"w")
        )
        answers = []
        for delay in (0.2, 1.5):  # within the timeout, then well past it
            time.sleep(delay)
            client.send_multipart([b"MDPC01", b"mmi.service", b"w"])
            answers.append(client.recv_multipart())
        assert answers == [
            [b"MDPC01", b"mmi.service", b"200"],
            [b"MDPC01", b"mmi.service", b"404"],
        ]
    finally:
        worker.close(0)
        client.close(0)


def test_broker_mdp_work_timeout_from_the_command_line(procs: list[Proc]) -> None:
    """Finding 12 (b), majordomo Rule M5: a Majordomo worker holding a request past
    --mdp-work-timeout is sent DISCONNECT."""
    broker = start(procs, "broker", "--bind", "tcp://127.0.0.1:0", "--mdp-work-timeout", "0.5")
    (tcp,) = broker.read_lines(1)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    worker, client = ctx.socket(zmq.DEALER), ctx.socket(zmq.REQ)
    form = mdp.peer(mdp.Form.V01, envelope=True, worker=True)
    try:
        for sock in (worker, client):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 10_000)
            sock.connect(tcp)
        worker.send_multipart(form.worker_ready(b"w"))
        client.send_multipart([b"MDPC01", b"w", b"job"])
        got = []
        while form.worker_disconnect() not in got:  # it drops the request, says nothing
            frames = worker.recv_multipart()
            if frames != form.worker_heartbeat():
                got.append(frames)
        assert [f[4:] for f in got[:1]] == [[b"", b"job"]]
        assert got[1:] == [form.worker_disconnect()]
    finally:
        worker.close(0)
        client.close(0)


# -- dcp call: stdin, --metadata, --json, --work-timeout -----------------------------------


def test_call_reads_stdin_sends_metadata_and_prints_json(
    procs: list[Proc], tmp_path: Path
) -> None:
    _, tcp = start_broker(procs, tmp_path)
    start(procs, "worker", "--connect", tcp, "--service", "echo", HANDLER)
    # '-' is one data part: stdin's bytes as they are (the newline included).
    code, out, err = run(
        "call", "--connect", tcp, "--wait", "echo", "-", "x", stdin=b"from stdin\n"
    )
    assert (code, out, err) == (0, "FROM STDIN\n\nX\n", "")
    # Options may follow the positional arguments.
    code, out, err = run(
        "call", "--connect", tcp, "echo", "hi", "-", "--json", "--metadata", "m1",
        "--metadata", "\u00e9t\u00e9", stdin=b"\xff\x00",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out.endswith("\n") and out.count("\n") == 1
    assert json.loads(out) == {
        "data": ["HI", {"base64": "/wA="}],  # not UTF-8: base64
        "metadata": ["m1", "\u00e9t\u00e9"],  # the worker returns the caller's metadata
    }
    code, out, err = run("call", "--connect", tcp, "--json", "echo")
    assert (code, out, err) == (0, '{"data": [], "metadata": []}\n', "")


def test_call_work_timeout(procs: list[Proc], tmp_path: Path) -> None:
    """--work-timeout reaches the broker: a worker holding the request longer is treated as
    lost, and with --max-redeliveries 0 the call ends in an error reply at once."""
    _, tcp = start_broker(procs, tmp_path, "trio", "--max-redeliveries", "0")
    start(procs, "worker", "--connect", tcp, "--service", "slow", "tests.cli.handlers:slow")
    began = time.monotonic()
    code, out, err = run(
        "call", "--connect", tcp, "--wait", "--timeout", "20", "--retries", "0",
        "--work-timeout", "0.5", "slow", "10",
    )  # fmt: skip
    assert time.monotonic() - began < 8  # not the handler's 10 s
    assert (code, out) == (ERROR_REPLY, "")
    assert err.startswith("dcp call: RemoteError: redelivery_limit")
    assert err.count("\n") == 1


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_ctrl_c_on_call_exits_130_quietly(backend: str) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)  # a broker that never answers
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVTIMEO, 15_000)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        call = Proc("call", "--connect", f"tcp://127.0.0.1:{port}", "--backend", backend, "x")
        try:
            router.recv_multipart()  # the request: the call is waiting for its reply
            call.popen.send_signal(signal.SIGINT)
            assert call.finish(10) == (130, "", "")
        finally:
            call.kill()
    finally:
        router.close(0)


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_before_the_registration_stops_the_worker_quietly(
    backend: str, signum: signal.Signals
) -> None:
    """:mod:`dcp._cli._worker` Rule CW2: a worker whose broker never confirms its registration
    (here a ROUTER that reads it and says nothing) stops at the first signal, says so in one
    line and exits as after a stop, not with a traceback."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVTIMEO, 15_000)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        worker = Proc(
            "--backend", backend, "worker", "--connect", f"tcp://127.0.0.1:{port}",
            "--service", "echo", HANDLER,
        )  # fmt: skip
        try:
            router.recv_multipart()  # its registration: it waits for the broker's echo
            worker.popen.send_signal(signum)
            code, out, err = worker.finish(10)
        finally:
            worker.kill()
    finally:
        router.close(0)
    assert (code, out) == (130 if signum is signal.SIGINT else 0, "")
    assert err == (
        f"dcp worker: {signum.name}: stopping (the broker has not confirmed the registration "
        "yet)\n"
    )


# -- the command line itself ----------------------------------------------------------------


def test_version_and_help_show_defaults() -> None:
    assert run("--version") == (0, f"dcp (dagbox-dcp) {dcp.__version__}\n", "")
    code, out, err = run("broker", "--help")
    assert (code, err) == (0, "")
    flat = " ".join(out.split())
    for text in [
        "--liveness N heartbeats missed before the peer is considered gone (default: 3)",
        "--max-queue N requests queued per service (default: 100000)",
        "--max-service-name BYTES longest service name (default: 1024)",
        "--receive-hwm MESSAGES zmq's receive high-water mark per peer (0: none) (default: 1000)",
    ]:
        assert text in flat
    code, out, _ = run("call", "--help")
    assert (
        "--timeout SECONDS seconds the whole call may take, every attempt included (default: 5.0)"
        in " ".join(out.split())
    )


def test_global_options_after_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []

    def cmd_call(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr("dcp._cli._call.cmd_call", cmd_call)
    call = ["call", "--connect", "tcp://127.0.0.1:1", "echo"]
    assert main(["-v", *call, "--backend", "asyncio", "-v"]) == 0
    assert main([*call, "-v"]) == 0
    assert main(["--backend", "asyncio", *call]) == 0
    assert [(a.backend, a.verbose) for a in seen] == [("asyncio", 2), ("trio", 1), ("asyncio", 0)]


def test_broker_limit_flags_reach_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every limit of docs/reliability.md has a flag, passed on to ``Broker``."""
    options: dict[str, object] = {}

    class Recorder:
        def __init__(self, *endpoints: str, **kwargs: object) -> None:
            options.update(kwargs)
            raise ValueError("recorded")

    monkeypatch.setattr("dcp._broker.broker.Broker", Recorder)
    flags = [
        "--max-message-size", "-1", "--max-frames", "7", "--max-service-name", "8",
        "--max-services", "9", "--max-services-per-worker", "10", "--max-queue", "11",
        "--max-client-queued", "12", "--max-client-inflight", "13", "--max-redeliveries", "14",
        "--work-timeout", "1.5", "--send-hwm", "15", "--receive-hwm", "16",
        "--max-memory", "17M",
        "--max-client-services", "18", "--max-queue-wait", "19",
    ]  # fmt: skip
    assert main(["broker", "--bind", "tcp://127.0.0.1:0", *flags]) == 2
    assert {k: options[k] for k in options if k.startswith(("max_", "work_", "send_", "rec"))} == {
        "max_message_size": -1, "max_frames": 7, "max_service_name": 8, "max_services": 9,
        "max_services_per_worker": 10, "max_queue": 11, "max_client_queued": 12,
        "max_client_inflight": 13, "max_redeliveries": 14, "work_timeout": 1.5,
        "send_hwm": 15, "receive_hwm": 16, "max_memory": 17 << 20, "max_client_services": 18,
        "max_queue_wait": 19.0,
    }  # fmt: skip


def test_worker_connect_repeated_serves_every_broker(procs: list[Proc], tmp_path: Path) -> None:
    """``dcp worker --connect A --connect B`` (:mod:`dcp._cli._worker` Rule CW4): registered
    at both, each broker's calls answered; the ready file names both."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, a = start_broker(procs, tmp_path / "a")
    _, b = start_broker(procs, tmp_path / "b")
    ready = tmp_path / "worker.ready"
    worker = start(
        procs, "worker", "--connect", a, "--connect", b, "--service", "echo", HANDLER,
        "--ready-file", str(ready),
    )  # fmt: skip
    serving = worker.wait_stderr(b"\n", timeout=30)
    assert serving.decode() == f"dcp worker: serving 'echo' at {a}, {b} (concurrency 1)\n"
    doc = json.loads(wait_for_file(ready, worker))
    assert doc["endpoint"] == a and doc["endpoints"] == [a, b]
    for endpoint in (a, b):  # --wait: the second broker may not have the registration yet
        assert run("call", "--connect", endpoint, "--wait", "echo", "hi")[:2] == (0, "HI\n")
    worker.popen.send_signal(signal.SIGTERM)
    code, _, err = worker.finish(30)
    assert code == 0, err


def test_worker_prefetch_flag_reaches_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    options: dict[str, object] = {}

    class Recorder:
        def __init__(self, *args: object, **kwargs: object) -> None:
            options.update(kwargs)
            raise ValueError("recorded")

    monkeypatch.setattr("dcp._worker.worker.Worker", Recorder)
    argv = ["worker", "--connect", "tcp://127.0.0.1:1", "--service", "echo", HANDLER]
    seen: list[object] = []
    for extra in (["--prefetch", "4"], []):
        assert main([*argv, *extra]) == 2
        seen.append(options["prefetch"])
    assert seen == [4, 0]
    with pytest.raises(SystemExit) as exit_:  # not a count
        build_parser().parse_args([*argv, "--prefetch", "-1"])
    assert exit_.value.code == 2


def test_worker_connect_takes_a_comma_separated_list() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["worker", "--connect", "tcp://127.0.0.1:1,tcp://127.0.0.1:2", "--connect",
         "tcp://127.0.0.1:3", "--service", "echo", HANDLER]
    )  # fmt: skip
    assert args.connect == ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"]
    with pytest.raises(SystemExit) as exit_:  # a usage error naming the bad one
        parser.parse_args(["worker", "--connect", "tcp://127.0.0.1:1,nonsense", "s", HANDLER])
    assert exit_.value.code == 2
