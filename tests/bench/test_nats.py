"""Smoke tests of NATS in the benchmark suite (issue 27): ``benchmarks.stack``'s *nats* side
(nats-server from ``PATH`` with nats-py services and client, real processes over
127.0.0.1) answers every request with real CPU figures and shows in the page's tables,
``benchmarks.pubsub``'s NATS broker delivers every message, and both skip NATS with a
one-line reason where ``nats-server`` is missing. Speeds are not asserted here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import nats_peers
from tests.bench.run import run_module

needs_nats = pytest.mark.skipif(
    nats_peers.missing() is not None, reason=f"NATS: {nats_peers.missing()}"
)


@needs_nats
@pytest.mark.timeout(120)
def test_the_stack_nats_side_answers_with_real_figures(tmp_path: Path) -> None:
    from benchmarks import stack
    from benchmarks.variants import Load

    loads = [Load(16, 64, 64, 5000, 2.0), Load(16, 1, 10, 300, 1.0)]
    sides = ["majortomo", "nats"] if "majortomo" in stack.SIDES else ["nats"]
    records = stack.run_rounds(1, loads, tmp_path, log=lambda _: None, sides=sides)
    nats = [r for r in records if r["side"] == "nats"]
    assert {(r["shape"], r["window"]) for r in nats} == {
        (shape, window) for shape in stack.SHAPES for window in (64, 1)
    }
    for rec in records:
        assert "error" not in rec, rec["error"]
        assert rec["lost"] == rec["errors"] == 0
    for rec in nats:
        assert rec["requests"] >= 100
        assert 0 < rec["p50_us"] <= rec["p99_us"]
        assert rec["client_cpu_us"] > 0
        assert rec["workers_cpu_us"] > 0
        assert rec["broker_cpu_us"] > 0  # nats-server's, from /proc
    results: dict[str, Any] = {
        "rounds": 1,
        "duration_s": 1.0,
        "machine": {
            "date": "today", "nproc": 2, "kernel": "k", "python": "3", "pyzmq": "z",
            "libzmq": "l", "commit": "c", "versions": {"majortomo": "0.2.0"},
        },
        "nats_server": nats_peers.versions(),
        "stack": records,
    }  # fmt: skip
    text = stack.render_section(results, "python -m benchmarks.stack")
    assert "### Against NATS" in text
    assert f"nats-server {nats_peers.versions()['nats-server']}" in text
    nats_rows = [
        line for line in text.splitlines() if line.startswith("| ") and "| nats |" in line
    ]
    anchored = [line for line in text.splitlines() if line.startswith(("| 1x16 |", "| 4x1 |"))]
    if "majortomo" in sides:
        # NATS in both tables: a row of its own against majortomo, the anchor of the other.
        assert len(nats_rows) == len(stack.SHAPES) * 2
        assert len(anchored) == len(stack.SHAPES) * 2 * 2
        assert "### Against majortomo" in text


@pytest.mark.timeout(60)
def test_nats_is_skipped_with_a_reason_without_nats_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import stack

    monkeypatch.setenv("PATH", str(tmp_path))  # no nats-server there
    why = nats_peers.missing()
    assert why is not None and "nats-server" in why and "\n" not in why
    logged: list[str] = []
    results = stack.run(1, "tiny", tmp_path, log=logged.append, sides=["nats"])
    assert results["stack"] == []
    assert results["skipped"] == {"nats": why}
    assert logged == [f"side nats skipped: {why}"]
    assert f"Side *nats* skipped: {why}." in stack.render_section(results, "cmd")


@needs_nats
@pytest.mark.timeout(120)
def test_pubsub_through_nats_delivers_every_message(tmp_path: Path) -> None:
    out = tmp_path / "pubsub.json"
    proc = run_module("benchmarks.pubsub", "--tiny", "--kinds", "nats", "--json", out, timeout=110)
    records: list[dict[str, Any]] = json.loads(out.read_text())
    cases = [r for r in records if "kind" in r]
    assert {(r["kind"], r["subscribers"]) for r in cases} == {("nats", 1), ("nats", 3)}
    for r in cases:
        assert r["publish_rate"] > 0 and r["delivery_rate"] > 0
        assert r["lost"] == 0
        assert r["delivered"] == r["published"] * r["subscribers"]
    assert "| nats | 3 | 16 |" in proc.stdout
