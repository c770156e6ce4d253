"""User errors of the ``dcp`` command line: each is exactly one line on stderr and a non-zero
exit code (2 for usage errors), never a traceback. Every case runs ``python -m dcp`` as a
subprocess (``tests/cli/procs.py``) and compares the whole of stderr."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest
import zmq

from dcp._cli import main
from dcp._cli._run import CLIError, interrupted
from dcp._cli._worker import load_handler
from dcp._io.errors import endpoint_problem
from dcp._io.lifecycle import BaseExceptionGroup
from tests.cli.procs import HANDLER, Proc, run

CALL = ["call", "--connect", "tcp://127.0.0.1:1"]
WORKER = ["worker", "--connect", "tcp://127.0.0.1:1", "--service", "s"]
BROKER = ["broker", "--bind", "tcp://127.0.0.1:0"]


def see(command: str) -> str:
    return f" (see '{command} --help')"


USAGE_ERRORS = [
    # Endpoints, checked before any socket exists.
    (
        ["call", "--connect", "tcp://*:5555", "echo"],
        "dcp call: argument --connect: bad endpoint 'tcp://*:5555': host '*' (every "
        "interface) is for binding only; connect to a host name or address, e.g. "
        "tcp://127.0.0.1:5555" + see("dcp call"),
    ),
    (
        ["call", "--connect", "tcp://127.0.0.1:99999", "echo"],
        "dcp call: argument --connect: bad endpoint 'tcp://127.0.0.1:99999': port 99999 is "
        "out of range (0 to 65535)" + see("dcp call"),
    ),
    (
        ["broker", "--bind", "tcp://127.0.0.1:99999"],
        "dcp broker: argument --bind: bad endpoint 'tcp://127.0.0.1:99999': port 99999 is "
        "out of range (0 to 65535)" + see("dcp broker"),
    ),
    (
        ["worker", "--connect", "localhost:5555", "--service", "s", HANDLER],
        "dcp worker: argument --connect: bad endpoint 'localhost:5555': expected "
        "tcp://HOST:PORT, ipc://PATH or inproc://NAME" + see("dcp worker"),
    ),
    (
        ["call", "--connect", "tcp://127.0.0.1", "echo"],
        "dcp call: argument --connect: bad endpoint 'tcp://127.0.0.1': no port (expected "
        "tcp://HOST:PORT)" + see("dcp call"),
    ),
    (
        ["broker", "--bind", "udp://127.0.0.1:5555"],
        "dcp broker: argument --bind: bad endpoint 'udp://127.0.0.1:5555': scheme must be "
        "tcp, ipc or inproc" + see("dcp broker"),
    ),
    (
        ["broker", "--bind", "inproc://broker"],
        "dcp broker: argument --bind: bad endpoint 'inproc://broker': inproc:// reaches only "
        "the same process; use tcp:// or ipc://" + see("dcp broker"),
    ),
    # Numbers out of range.
    (
        [*WORKER, "--concurrency", "0", HANDLER],
        "dcp worker: argument --concurrency: must be at least 1, not 0" + see("dcp worker"),
    ),
    (
        [*WORKER, "--grace", "-1", HANDLER],
        "dcp worker: argument --grace: must be a finite number >= 0, not '-1'" + see("dcp worker"),
    ),
    (
        [*CALL, "--timeout", "0", "echo"],
        "dcp call: argument --timeout: must be a finite number > 0, not '0'" + see("dcp call"),
    ),
    (
        [*CALL, "--timeout", "soon", "echo"],
        "dcp call: argument --timeout: expected seconds, not 'soon'" + see("dcp call"),
    ),
    (
        [*CALL, "--retries", "-1", "echo"],
        "dcp call: argument --retries: must be at least 0, not -1" + see("dcp call"),
    ),
    (
        [*BROKER, "--heartbeat-interval", "nan"],
        "dcp broker: argument --heartbeat-interval: must be a finite number > 0, not 'nan'"
        + see("dcp broker"),
    ),
    (
        [*BROKER, "--max-queue", "lots"],
        "dcp broker: argument --max-queue: expected a whole number, not 'lots'"
        + see("dcp broker"),
    ),
    (
        ["demo", "--requests", "0"],
        "dcp demo: argument --requests: must be at least 1, not 0" + see("dcp demo"),
    ),
    # Other arguments.
    (
        [*CALL, "echo", "-", "-"],
        "dcp call: '-' (stdin) may be given as DATA only once" + see("dcp call"),
    ),
    (
        [*CALL, "--metadata", "", "echo"],
        "dcp call: --metadata parts must not be empty" + see("dcp call"),
    ),
    (
        [*WORKER, "no_colon"],
        "dcp worker: handler must be module:function, not 'no_colon'" + see("dcp worker"),
    ),
    (
        [*BROKER, "--allow-client", "x"],
        "dcp broker: --allow-client/--allow-worker need --keys" + see("dcp broker"),
    ),
    (
        ["demo", "--backend", "curio"],
        "dcp demo: argument --backend: invalid choice: 'curio' (choose from 'trio', "
        "'asyncio')" + see("dcp demo"),
    ),
    (
        ["fly"],
        "dcp: argument COMMAND: invalid choice: 'fly' (choose from 'broker', 'worker', "
        "'call', 'demo', 'keys', 'pub', 'sub', 'services', 'find', 'top')" + see("dcp"),
    ),
    ([], "dcp: the following arguments are required: COMMAND" + see("dcp")),
    (
        ["call", "echo"],
        "dcp call: the following arguments are required: --connect" + see("dcp call"),
    ),
]


@pytest.mark.parametrize(("argv", "line"), USAGE_ERRORS)
def test_usage_error_is_one_line_and_exit_2(argv: list[str], line: str) -> None:
    assert run(*argv) == (2, "", line + "\n")


@pytest.mark.parametrize(("argv", "line"), USAGE_ERRORS[:4])
def test_usage_error_in_process(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr() == ("", line + "\n")


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        (
            "tests.no_such_module:echo",
            "dcp worker: cannot load handler 'tests.no_such_module:echo': "
            "No module named 'tests.no_such_module'",
        ),
        (
            "tests.cli.handlers:missing",
            "dcp worker: cannot load handler 'tests.cli.handlers:missing': "
            "module 'tests.cli.handlers' has no attribute 'missing'",
        ),
        (
            "tests.cli.handlers:not_callable",
            "dcp worker: 'tests.cli.handlers:not_callable' is not callable",
        ),
        # Issue 25, finding 5: a handler the worker refuses, and specs that printed a
        # traceback.
        (
            "tests.cli.handlers:gen",
            "dcp worker: service 's': the handler tests.cli.handlers.gen is a generator "
            "function (a def with yield): a stream handler is an async def with yield",
        ),
        (
            "tests.cli.handlers:no_parameter",
            "dcp worker: service 's': the handler tests.cli.handlers.no_parameter() cannot be "
            "called with one argument, the request (too many positional arguments)",
        ),
        (
            ".handlers:echo",
            "dcp worker: handler '.handlers:echo': the module must be an absolute name (e.g. "
            "mypackage.handlers), not a relative one",
        ),
        (
            "tests.cli.failing_module:echo",
            "dcp worker: cannot load handler 'tests.cli.failing_module:echo': importing "
            "tests.cli.failing_module raised RuntimeError: this module fails on import (at "
            f"{Path(__file__).parent / 'failing_module.py'}:4)",
        ),
    ],
)
def test_handler_that_cannot_be_used_is_a_usage_error(spec: str, line: str) -> None:
    """:mod:`dcp._cli._worker` Rule CW1: one line, exit status 2, never a traceback."""
    assert run(*WORKER, spec) == (2, "", line + see("dcp worker") + "\n")
    assert run(*WORKER[:-2], "--service", "s", spec, "--service", "t", HANDLER) == (
        2,
        "",
        line + see("dcp worker") + "\n",
    )


def test_handler_module_with_a_syntax_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule CW1: a module that does not compile is named with its file and line, not with
    importlib's frame (``(at <frozen importlib._bootstrap>:241)``)."""
    (tmp_path / "broken_syntax.py").write_text("x = 1\ndef f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CLIError) as info:
        load_handler("broken_syntax:f")
    assert info.value.code == 2
    assert info.value.message == (
        "cannot load handler 'broken_syntax:f': importing broken_syntax raised SyntaxError: "
        f"invalid syntax (at {tmp_path / 'broken_syntax.py'}:2)"
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["call", "--connect", "tcp://127.0.0.1:1"], "dcp call: the following arguments are "
         "required: SERVICE (see 'dcp call --help')"),
        (["pub", "--connect", "tcp://127.0.0.1:1"], "dcp pub: the following arguments are "
         "required: SUBJECT (see 'dcp pub --help')"),
        (["call", "x"], "dcp call: the following arguments are required: --connect (see "
         "'dcp call --help')"),
    ],
)  # fmt: skip
def test_a_missing_argument_names_only_what_is_required(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """DATA may be left out (``nargs="*"``): argparse's intermixed parsing named it as
    required too (``required: SERVICE, DATA``)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr() == ("", line + "\n")


def test_ipc_endpoint_in_use(tmp_path: Path) -> None:
    """zmq binds an ``ipc://`` path another process listens on without an error (it unlinks
    the socket file), so a second broker took the first one's endpoint silently: it is a port
    in use, as for tcp://. A stale socket file, nobody listening, is replaced as before."""
    path = tmp_path / "b.sock"
    endpoint = f"ipc://{path}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(endpoint)
        assert run("broker", "--bind", "tcp://127.0.0.1:0", "--bind", endpoint) == (
            1,
            "",
            f"dcp broker: cannot bind {endpoint}: Address already in use (a process listens "
            "there)\n",
        )
    finally:
        sock.close(0)
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        unix.bind(str(stale))  # a file nobody listens on, as a killed broker leaves
    broker = Proc("broker", "--bind", f"ipc://{stale}")
    try:
        assert broker.read_lines(1) == [f"ipc://{stale}"]
    finally:
        broker.kill()


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_port_in_use(backend: str) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    try:
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        assert run("--backend", backend, "broker", "--bind", endpoint) == (
            1,
            "",
            f"dcp broker: cannot bind {endpoint}: Address already in use\n",
        )
    finally:
        sock.close(0)


def test_address_of_another_machine() -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): no machine has it.
    assert run("broker", "--bind", "tcp://192.0.2.1:5555") == (
        1,
        "",
        "dcp broker: cannot bind tcp://192.0.2.1:5555: Cannot assign requested address\n",
    )


def test_missing_key_file() -> None:
    keys = ["--keys", "/no/such", "--server-key", "/no/such"]
    assert run(*WORKER, *keys, HANDLER) == (
        1,
        "",
        "dcp worker: --keys /no/such: no such file\n",
    )


def test_ctrl_c_on_demo_exits_130() -> None:
    # One request at a time: it runs for many seconds, however fast the machine.
    demo = Proc("demo", "--requests", "100000", "--clients", "1", "--window", "1")
    try:
        demo.wait_stderr(b"req/s", timeout=30)  # the progress bar: the demo is running
        demo.popen.send_signal(signal.SIGINT)
        code, out, err = demo.finish(20)
        assert (code, out) == (130, "")
        assert err.endswith("\n")  # the progress bar's line is ended
        assert "Traceback" not in err
    finally:
        demo.kill()


def test_run_time_helpers() -> None:
    assert interrupted(KeyboardInterrupt())
    assert interrupted(BaseExceptionGroup("", [KeyboardInterrupt(), KeyboardInterrupt()]))
    assert not interrupted(BaseExceptionGroup("", [KeyboardInterrupt(), ValueError()]))
    assert not interrupted(ValueError())
    # pyzmq names the endpoint of a failed bind; when it does not, the command's are used.
    error = zmq.ZMQError(zmq.EADDRINUSE, "Address already in use (addr='tcp://h:1')")
    assert (
        endpoint_problem(error, "bind", ["tcp://x:2"])
        == "cannot bind tcp://h:1: Address already in use"
    )
    error = zmq.ZMQError(zmq.EINVAL, "Invalid argument")
    assert endpoint_problem(error, "connect to", ["tcp://x:2"]) == (
        "cannot connect to tcp://x:2: Invalid argument"
    )
