"""``docs/cli.md``, the ``dcp`` command's page: its three-shell session prints what the page
shows, its table of exit statuses is the command's own, and its reference (the ``dcp-cli``
block of ``docs/_ext/dcp_cli.py``) has every command and option."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from dcp._cli._parser import build_parser
from tests.cli.procs import Proc, run, start_broker

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "cli.md").read_text()
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import dcp_cli  # noqa: E402 (docs/_ext is no package)


def test_the_reference_has_every_command_and_option() -> None:
    assert "```{dcp-cli}\n```" in PAGE
    text = dcp_cli.render()
    parser = build_parser()
    for name, sub in parser.commands.items():
        assert f"### `dcp {name}`" in text
        for action in sub._actions:
            for option in action.option_strings:
                assert option in text, (name, option)
    # Descriptions keep their line breaks (and a group's title is never wrapped): written
    # for a terminal of 80 columns, they fit the page's too.
    long = [line for line in text.splitlines() if len(line) > dcp_cli.COLUMNS]
    assert long == []


def test_the_exit_statuses_are_the_commands() -> None:
    """The page's table and ``dcp --help``'s epilog name the same statuses."""
    table = re.findall(r"^\| (\d+) \|", PAGE, flags=re.MULTILINE)
    epilog = " ".join(build_parser().format_help().split())
    said = re.findall(r"(\d+) (?:done|error|usage|the broker|no worker|dcp call|stopped)", epilog)
    assert table == sorted(set(said), key=int) == ["0", "1", "2", "3", "4", "5", "6", "130"]


def test_three_shells(procs: list[Proc], tmp_path: Path) -> None:
    """The page's handler saved as ``mymodule.py``, its broker (on a free port), worker and
    calls print what the page shows, the endpoint aside."""
    [handler] = re.findall(r"```python\n# mymodule\.py\n(.*?)```", PAGE, flags=re.DOTALL)
    (tmp_path / "mymodule.py").write_text(handler)
    [session] = re.findall(r"```console\n(shell-1.*?)```", PAGE, flags=re.DOTALL)
    lines = session.replace("tcp://127.0.0.1:5555", "{endpoint}").splitlines()
    _, tcp = start_broker(procs, tmp_path)
    assert lines[:2] == ["shell-1$ dcp broker --bind {endpoint}", "{endpoint}"]
    command = lines[2].removeprefix("shell-2$ dcp ").format(endpoint=tcp).split()
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    worker = subprocess.Popen(
        [sys.executable, "-m", "dcp", *command],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        assert worker.stderr.readline() == lines[3].format(endpoint=tcp) + "\n"
        rest = lines[4:]
        while rest:
            call, printed = rest[0], rest[1]
            argv = call.removeprefix("shell-3$ dcp ").format(endpoint=tcp).split()
            assert run(*argv) == (0, printed + "\n", "")
            rest = rest[2:]
    finally:
        worker.kill()
        worker.communicate(timeout=10)
