"""The adversarial suite (``benchmarks/attacks``) in its short mode, against real broker
processes over tcp://127.0.0.1: every attack is run and reported, and each one not listed in
:data:`benchmarks.attacks.KNOWN_OPEN` passes its bounds (RSS, probe latency, nobody refused).
The known-open ones must be reported too; the lead removes each name as its fix lands."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.attacks import ATTACKS, KNOWN_OPEN
from benchmarks.attacks.__main__ import markdown
from benchmarks.attacks.frames import mc0, register, reply, request
from benchmarks.attacks.harness import MB, Result
from dcp import wire
from dcp.wire import mc0 as mc0_codec
from tests.bench.run import run_module

NAMES = [a.name for a in ATTACKS]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("attacks") / "attacks.json"
    proc = run_module("benchmarks.attacks", "--short", "--json", out, "--markdown", timeout=280)
    records: list[dict[str, Any]] = json.loads(out.read_text())
    return {r["name"]: r for r in records}, proc.stdout + proc.stderr


def test_known_open_names_attacks() -> None:
    assert set(NAMES) >= KNOWN_OPEN
    assert len(set(NAMES)) == len(NAMES)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", NAMES)
def test_attack_verdict(name: str, short_run: tuple[dict[str, Any], str]) -> None:
    results, output = short_run
    assert name in results, f"{name} was not reported"
    result = results[name]
    assert result["probe_calls"] > 0
    assert f"| {name} |" in output
    if name in KNOWN_OPEN:
        assert f"{name}: " in output and "(known open)" in output
    else:
        assert result["passed"], f"{name}: {result['failures']} ({result['notes']})"


def test_attack_frames_are_what_peers_send() -> None:
    message, _ = wire.parse(request(b"echo", b"x", metadata=[b"m"]))
    assert message == wire.Request(service=b"echo", metadata=(b"m",), data=(b"x",))
    message, _ = wire.parse(reply(b"\x00abc", b"y", metadata=[b"m"]))
    assert message == wire.Reply(client=b"\x00abc", metadata=(b"m",), data=(b"y",))
    message, _ = wire.parse(register(b"svc"))
    assert message == wire.Register(service=b"svc")
    command = mc0_codec.parse(mc0(b"SUB", [(b"ID", b"1")], b"a.b"))
    assert (command.verb, command.headers, command.positional) == (
        b"SUB",
        {b"ID": b"1"},
        (b"a.b",),
    )


def test_markdown_table() -> None:
    result = Result(
        name="x",
        finding="1",
        size="tiny",
        idle_rss=40 * MB,
        peak_over_idle=3 * MB,
        after_over_idle=1 * MB,
        probe_p50=0.001,
        probe_max=0.5,
        probe_calls=10,
        refused={"wait": "no"},
        violations=[],
        notes={},
        cut=None,
        seconds=1.0,
        failures=["refused: wait"],
    )
    table = markdown([result], "python -m benchmarks.attacks --markdown")
    assert table.splitlines()[0] == "`python -m benchmarks.attacks --markdown`"
    assert "| x | 1 | tiny | 3 MB | 1 MB | 0.00 s / 0.50 s | wait | FAIL: refused: wait |" in table
