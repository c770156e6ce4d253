"""``dcp keys`` and the CURVE flags of ``dcp broker``, ``dcp worker`` and ``dcp call``, as
real subprocesses (killed by PID at the end), plus in-process argument errors."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest
import zmq.auth

from dcp._cli import main
from tests.cli.procs import HANDLER, Proc, run, start


def test_keys_command(tmp_path: Path) -> None:
    code, out, err = run("keys", "alice", "--dir", str(tmp_path))
    assert (code, err) == (0, "")
    public, secret = tmp_path / "alice.key", tmp_path / "alice.key_secret"
    assert out.splitlines() == [str(public), str(secret)]
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    key, secret_key = zmq.auth.load_certificate(secret)
    assert secret_key is not None and zmq.auth.load_certificate(public) == (key, None)
    code, out, err = run("keys", "alice", "--dir", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == f"dcp keys: {public} exists (overwrite it with --force)\n"
    assert run("keys", "alice", "--dir", str(tmp_path), "--force")[0] == 0
    assert zmq.auth.load_certificate(public)[0] != key


def test_secure_broker_worker_and_call(procs: list[Proc], tmp_path: Path) -> None:
    clients = tmp_path / "clients"
    clients.mkdir()
    for directory, name in [
        (tmp_path, "broker"),
        (tmp_path, "worker"),
        (tmp_path, "stranger"),
        (clients, "alice"),
    ]:
        assert main(["keys", name, "--dir", str(directory)]) == 0
    broker = start(
        procs, "broker", "--bind", "tcp://127.0.0.1:0",
        "--keys", str(tmp_path / "broker.key_secret"),
        "--allow-client", str(clients),
        "--allow-worker", f"echo={tmp_path / 'worker.key'}",
    )  # fmt: skip
    [tcp] = broker.read_lines(1)

    def peer(name: str, directory: Path = tmp_path) -> list[str]:
        return [
            "--keys", str(directory / f"{name}.key_secret"),
            "--server-key", str(tmp_path / "broker.key"),
        ]  # fmt: skip

    worker = start(
        procs, "worker", "--connect", tcp, "--service", "echo", HANDLER, *peer("worker")
    )
    code, out, err = run(
        "call", "--connect", tcp, "--wait", "echo", "hello", *peer("alice", clients)
    )
    assert (code, out, err) == (0, "HELLO\n", "")
    # dcp top takes the same CURVE options (docs/operations.md).
    code, out, err = run("top", "--connect", tcp, "--once", *peer("alice", clients))
    assert (code, err) == (0, "")
    assert [line.split()[:4] for line in out.splitlines() if line.startswith("echo ")] == [
        ["echo", "-", "1", "1"]
    ]
    # A key on no list is told so at once, in one line; a worker key may not serve another
    # service; a worker without keys is told the broker requires them.
    code, out, err = run("call", "--connect", tcp, "echo", "x", *peer("stranger"))
    assert (code, out) == (1, "")
    assert err == (
        f"dcp call: AuthenticationFailed: {tcp}: the broker refused this client's CURVE key"
        " (ZAP status 400)\n"
    )
    code, _, err = run("worker", "--connect", tcp, "--service", "echo", HANDLER)
    assert code == 3
    last = err.splitlines()[-1]
    assert last.startswith(f"dcp worker: AuthenticationFailed: {tcp}: ")
    assert "CURVE" in last
    assert "Traceback" not in err
    code, _, err = run(
        "worker", "--connect", tcp, "--service", "payroll", HANDLER, *peer("worker")
    )
    assert code == 3
    refused = "dcp worker: RegistrationRefused: the broker refused the registration for 'payroll'"
    assert refused in err
    assert "Traceback" not in err
    worker.kill()
    broker.kill()


@pytest.mark.parametrize(
    ("argv", "code", "line"),
    [
        (["broker", "--bind", "tcp://127.0.0.1:0", "--allow-client", "x"], 2,
         "dcp broker: --allow-client/--allow-worker need --keys (see 'dcp broker --help')"),
        (["broker", "--bind", "tcp://127.0.0.1:0", "--allow-any-client"], 2,
         "dcp broker: --allow-client/--allow-worker need --keys (see 'dcp broker --help')"),
        (
            ["broker", "--bind", "tcp://127.0.0.1:0", "--keys", "K", "--allow-worker", "echo"], 2,
            "dcp broker: --allow-worker takes SERVICE=PATH, not 'echo' (see 'dcp broker --help')",
        ),
        (["broker", "--bind", "tcp://127.0.0.1:0", "--keys", "/no/such"], 1,
         "dcp broker: --keys /no/such: no such file"),
        (
            ["call", "--connect", "tcp://127.0.0.1:1", "--keys", "K", "echo"], 2,
            "dcp call: --keys and --server-key go together (see 'dcp call --help')",
        ),
        (
            ["worker", "--connect", "tcp://127.0.0.1:1", "--service", "s", HANDLER,
             "--server-key", "K"], 2,
            "dcp worker: --keys and --server-key go together (see 'dcp worker --help')",
        ),
        (
            ["call", "--connect", "tcp://127.0.0.1:1", "--keys", "/no/such", "--server-key",
             "/no/such", "echo"], 1,
            "dcp call: --keys /no/such: no such file",
        ),
    ],
)  # fmt: skip
def test_security_argument_errors(
    argv: list[str], code: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    assert capsys.readouterr() == ("", line + "\n")


def test_a_missing_key_file_is_named_with_its_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """zmq says ``Invalid certificate file`` for a file that is not there: the command says
    which option named it, and that it is missing (exit status 1, one line)."""
    assert main(["keys", "broker", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()  # the files written
    secret, public = str(tmp_path / "broker.key_secret"), str(tmp_path / "broker.key")
    missing = str(tmp_path / "nope.key")
    broker = ["broker", "--bind", "tcp://127.0.0.1:0", "--keys", secret]
    cases = [
        (["call", "--connect", "tcp://127.0.0.1:1", "--keys", secret, "--server-key", missing,
          "echo"], f"dcp call: --server-key {missing}: no such file"),
        ([*broker, "--allow-client", missing],
         f"dcp broker: --allow-client {missing}: no such file or directory"),
        ([*broker, "--allow-worker", f"echo={missing}"],
         f"dcp broker: --allow-worker echo={missing}: no such file or directory"),
    ]  # fmt: skip
    for argv, line in cases:
        assert main(argv) == 1
        assert capsys.readouterr() == ("", line + "\n")
    # Files that are there go on to be read (a public file is not a key pair).
    assert main(["call", "--connect", "tcp://127.0.0.1:1", "--keys", public, "--server-key",
                 public, "echo"]) == 1  # fmt: skip
    assert (
        capsys.readouterr().err
        == f"dcp call: {public!r} holds no secret key (use NAME.key_secret)\n"
    )


def test_any_client_and_wildcard_flags(tmp_path: Path) -> None:
    from dcp._cli._parser import build_parser
    from dcp._cli._security import server_security

    main(["keys", "broker", "--dir", str(tmp_path)])
    args = build_parser().parse_args(
        [
            "broker", "--bind", "tcp://127.0.0.1:0",
            "--keys", str(tmp_path / "broker.key_secret"),
            "--allow-any-client", "--allow-worker", "*=*",
        ]
    )  # fmt: skip
    security = server_security(args)
    assert security is not None and security.clients is None
    assert security.workers == {b"*": frozenset([b"*"])}


def test_sighup_reloads_the_allow_lists(procs: list[Proc], tmp_path: Path) -> None:
    clients = tmp_path / "clients"
    clients.mkdir()
    for directory, name in [(tmp_path, "broker"), (tmp_path, "bob"), (clients, "alice")]:
        assert main(["keys", name, "--dir", str(directory)]) == 0
    broker = start(
        procs, "broker", "--bind", "tcp://127.0.0.1:0",
        "--keys", str(tmp_path / "broker.key_secret"), "--allow-client", str(clients),
        "--allow-worker", f"echo={clients}",
    )  # fmt: skip
    [tcp] = broker.read_lines(1)

    def call(name: str, directory: Path) -> tuple[int, str, str]:
        return run(
            "call", "--connect", tcp, "--timeout", "5", "mmi.service", "echo",
            "--keys", str(directory / f"{name}.key_secret"),
            "--server-key", str(tmp_path / "broker.key"),
        )  # fmt: skip

    assert call("alice", clients) == (0, "404\n", "")  # no echo worker, but heard
    code, _, err = call("bob", tmp_path)
    assert code == 1 and "AuthenticationFailed" in err
    # Bob's key joins the directory, Alice's leaves it; SIGHUP.
    (tmp_path / "bob.key").rename(clients / "bob.key")
    (clients / "alice.key").unlink()
    broker.popen.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while (result := call("bob", clients.parent)) != (0, "404\n", "") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert result == (0, "404\n", "")
    code, _, err = call("alice", clients)
    assert code == 1 and "AuthenticationFailed" in err
    # A SIGHUP that finds a broken list keeps the lists in force, and the broker runs on.
    (clients / "broken.key").write_text("not a key\n")
    broker.popen.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    assert call("bob", clients.parent) == (0, "404\n", "")
    assert broker.popen.poll() is None
    broker.kill()
    _, _, err = broker.finish(5)
    assert "SIGHUP: kept the allow-lists in force" in err
