"""What ``import dcp``, a program and the ``dcp`` command load (issue 25, finding 9).

``import dcp`` imports each public name's module on first use; the optional parts are imported
where they are used: cryptography when a broker runs with CURVE, trio when a program runs on
trio, the HTTP stack (hypercorn, prometheus_client) when a broker is given ``http=``. Each test
runs a fresh interpreter (real zmq sockets where it runs dcp) and reads the modules it loaded.
Figures: ``docs/performance.md``, "Start-up".
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

import dcp
from tests.cli.procs import HANDLER, ROOT, Proc, _env, start, start_broker

#: Never loaded by ``import dcp``, whatever names the program then takes from it.
OPTIONAL = ("cryptography", "ssl", "trio", "asyncio", "hypercorn", "prometheus_client")
#: The parts of dcp that the ``dcp`` command's parser and ``--version`` never need.
HEAVY = ("dcp._broker", "dcp._core", "dcp._client", "dcp._worker", "dcp._http")

_IMPORT_TIME = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", re.M)


def _within(modules: Iterable[str], packages: Iterable[str]) -> list[str]:
    """The modules that are one of ``packages`` or inside one."""
    packages = tuple(packages)
    return sorted(
        m for m in modules if m in packages or m.startswith(tuple(p + "." for p in packages))
    )


def _modules_after(code: str) -> set[str]:
    """``sys.modules`` of a fresh interpreter once it has run ``code``."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_import_dcp_loads_no_optional_dependency_and_no_part() -> None:
    modules = _modules_after("import dcp")
    assert _within(modules, OPTIONAL) == []
    assert _within(modules, HEAVY) == []


def test_every_public_name_loads_no_optional_dependency() -> None:
    """Taking the whole API (Broker, Client, Worker, CurveServer, ...) loads the parts, not
    cryptography, trio, asyncio (nor ssl) or the HTTP stack."""
    modules = _modules_after("from dcp import *")
    assert _within(modules, OPTIONAL) == []
    assert {"dcp._broker", "dcp._client", "dcp._worker"} <= modules


def test_public_names_show_as_dcp_when_first_used() -> None:
    """A name taken from ``dcp`` shows as ``dcp.Name``, and so do the names loaded with it
    (the errors a client raises, the statistics it returns)."""
    code = "import dcp\nclient = dcp.Client\nimport dcp._errors, dcp._stats\n"
    code += "assert dcp._errors.RequestTimeout.__module__ == 'dcp', 'errors'\n"
    code += "assert dcp._stats.ClientStatistics.__module__ == 'dcp', 'stats'\n"
    assert "dcp._client" in _modules_after(code)


def test_dcp_wire_is_reachable_after_import_dcp() -> None:
    """``import dcp`` then ``dcp.wire.X`` works as when ``import dcp`` imported every part."""
    modules = _modules_after("import dcp\nassert dcp.wire.messages.Request\n")
    assert "dcp.wire" in modules
    assert _within(modules, [*OPTIONAL, *HEAVY]) == []


_PROGRAM = """\
import anyio
import dcp


async def echo(request: dcp.HandlerRequest) -> bytes:
    return b"".join(request.data)


async def main() -> None:
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(dcp.Broker("tcp://127.0.0.1:0").serve)
        await tg.start(dcp.Worker(endpoint, "echo", echo).serve)
        async with dcp.Client(endpoint) as client:
            reply = await client.request("echo", "hi", timeout=30)
            assert reply.data == (b"hi",), reply
        tg.cancel_scope.cancel()


anyio.run(main, backend={backend!r})
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_program_loads_only_the_backend_it_runs_on(backend: str) -> None:
    """A broker, a worker and a client at work, without CURVE or HTTP: no cryptography nor
    zmq's key-file helpers, no HTTP stack, and on asyncio no trio."""
    modules = _modules_after(_PROGRAM.format(backend=backend))
    unused = ["cryptography", "zmq.auth", "hypercorn", "prometheus_client"]
    if backend == "asyncio":
        unused.append("trio")
    assert _within(modules, unused) == []
    assert backend in modules


def _dcp_importtime(*args: str) -> tuple[str, set[str]]:
    """Run ``python -X importtime -m dcp *args`` (it must succeed): its stdout, and the
    modules it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dcp", *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, set(_IMPORT_TIME.findall(done.stderr))


def test_dcp_version_loads_no_part_of_the_package() -> None:
    out, modules = _dcp_importtime("--version")
    assert out == f"dcp (dagbox-dcp) {dcp.__version__}\n"
    # Answered before the command's parts (nor anyio, zmq, attrs) are imported.
    assert "dcp._cli" in modules
    heavy = [*HEAVY, "dcp._cli._main", "dcp._cli._parser", "cryptography", "trio", "asyncio"]
    assert _within(modules, [*heavy, "anyio", "zmq", "attrs", "attr"]) == []


def test_dcp_call_loads_the_client_only(procs: list[Proc], tmp_path: Path) -> None:
    """``dcp call`` (here on asyncio) loads the client's parts, not the broker's or the
    worker's, nor trio, cryptography or (without ``--keys``) zmq's key-file helpers."""
    _, tcp = start_broker(procs, tmp_path, "asyncio")
    start(procs, "--backend", "asyncio", "worker", "--connect", tcp, "--service", "echo", HANDLER)
    out, modules = _dcp_importtime(
        "--backend", "asyncio", "call", "--connect", tcp, "--wait", "--timeout", "30", "echo",
        "hello",
    )  # fmt: skip
    assert out == "HELLO\n"
    assert "dcp._client.client" in modules
    heavy = ["dcp._broker", "dcp._worker", "dcp._core.broker.core", "dcp._core.worker"]
    assert _within(modules, [*heavy, "trio", "cryptography", "zmq.auth", "hypercorn"]) == []


def test_the_readme_counts_the_runtime_dependencies() -> None:
    """The README names as many runtime dependencies as ``pyproject.toml`` declares."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.M | re.S)
    assert block is not None
    declared = re.findall(r'^\s*"([A-Za-z0-9_-]+)', block[1], re.M)
    readme = (ROOT / "README.md").read_text()
    words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
    said = re.findall(r"(\w+) runtime dependencies(?: only)? \(([^)]*)\)", readme)
    assert said, "the README names the runtime dependencies"
    for count, names in said:
        assert count == words[len(declared)]
        assert sorted(re.findall(r"[\w-]+", names)) == sorted(declared)


def test_type_checkers_see_every_name_where_it_is_imported_from() -> None:
    """The imports ``dcp/__init__.py`` shows type checkers are the names it imports on first
    use, from the same modules."""
    tree = ast.parse((ROOT / "dcp" / "__init__.py").read_text())
    [block] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "typing.TYPE_CHECKING"
    ]
    shown = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert shown == dcp._DEFINED_IN
    assert sorted(shown) == sorted(dcp.__all__)
