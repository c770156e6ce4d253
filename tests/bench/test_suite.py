"""Smoke test of the benchmark suite (``benchmarks/``): the whole pipeline in its tiny mode.

It runs ``python -m benchmarks.run --tiny`` as a real subprocess (which starts the brokers,
workers and load generators as processes over tcp://127.0.0.1), then checks the raw records
and the generated page: no lost replies, no failed run, numbers in a sane range. The
majortomo variants need the ``bench`` extra and are skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.bench.run import ROOT, run_module


def _run_suite(out: Path, *args: str, timeout: float = 60.0) -> dict[str, Any]:
    run_module("benchmarks.run", "--tiny", "--out", out, *args, timeout=timeout)
    results: dict[str, Any] = json.loads((out / "perf" / "results.json").read_text())
    return results


def _check_load(rec: dict[str, Any]) -> None:
    assert "error" not in rec, rec.get("error")
    assert rec["lost"] == 0
    assert rec["errors"] == 0
    assert rec["unexpected"] == 0
    assert rec["requests"] >= 20
    assert 20 < rec["rate"] < 1_000_000
    assert 0 < rec["p50_us"] <= rec["p99_us"] < 5_000_000
    assert 0 <= rec["broker_cpu_us"] < 100_000
    # Both come from /proc in clock ticks, rounded separately by the kernel: allow two ticks.
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    assert rec["broker_thread_cpu_us"] <= rec["broker_cpu_us"] + 2 * tick_us / rec["requests"]
    assert 0 < rec["client_cpu_us"] < 100_000
    assert rec["broker_rss_mb"] > 1


@pytest.mark.timeout(90)
def test_tiny_suite_dcp_minimal_proxy(tmp_path: Path) -> None:
    results = _run_suite(tmp_path)

    main = results["main"]
    seen = {(r["variant"], r["payload"], r["window"]) for r in main}
    for variant in ("dcp", "minimal", "zmq.proxy"):
        assert (variant, 16, 64) in seen
        assert (variant, 16, 1) in seen
    for rec in main:
        _check_load(rec)
    # The broker does real work per request, the pipelined window beats one at a time.
    for variant in ("dcp", "minimal"):
        [w64] = [r for r in main if r["variant"] == variant and r["window"] == 64]
        [w1] = [r for r in main if r["variant"] == variant and r["window"] == 1]
        assert w64["broker_cpu_us"] > 0
        assert w64["p50_us"] > w1["p50_us"]

    kinds = {r["client"] for r in results["clients"]}
    assert {"plain pyzmq loop", "dcp.SyncClient"} <= kinds
    for rec in results["clients"]:
        _check_load(rec)

    sweeps = results["sweeps"]
    assert {r["x"] for r in sweeps if r["sweep"] == "workers"} == {1, 20}
    for rec in sweeps:
        _check_load(rec)
        assert rec["mem_per_item_kib"] >= 0

    page = (tmp_path / "performance.md").read_text()
    assert "## Targets (issue 4)" in page
    assert "### 16 B, window 64" in page
    assert "| dcp |" in page and "| minimal |" in page and "| zmq.proxy |" in page
    assert results["command"] in page
    if importlib.util.find_spec("matplotlib") is not None:
        for png in ("throughput.png", "broker_cpu.png", "latency.png", "sweeps.png"):
            assert (tmp_path / "perf" / png).stat().st_size > 1000
            assert f"perf/{png}" in page


@pytest.mark.timeout(60)
def test_tiny_suite_majortomo(tmp_path: Path) -> None:
    if importlib.util.find_spec("majortomo") is None:
        pytest.skip("majortomo is not installed (pip install -e '.[bench]')")
    results = _run_suite(
        tmp_path, "--variants", "majortomo,majortomo-own", "--parts", "main", timeout=45
    )
    main = results["main"]
    assert {r["variant"] for r in main} == {"majortomo", "majortomo-own"}
    for rec in main:
        _check_load(rec)


@pytest.mark.timeout(90)
def test_mdp_peers_through_the_dcp_broker(tmp_path: Path) -> None:
    """``benchmarks.mdp_peers --tiny``: majortomo's Client and Worker, and the common peers
    in MDP mode, answered through the dcp broker as through majortomo's; the page section."""
    if importlib.util.find_spec("majortomo") is None:
        pytest.skip("majortomo is not installed (pip install -e '.[bench]')")
    from benchmarks.variants import VARIANTS

    records = tmp_path / "mdp_peers.json"
    proc = run_module("benchmarks.mdp_peers", "--tiny", "--json", records, timeout=80)
    results = json.loads(records.read_text())
    main = results["main"]
    pairs = {("majortomo", "dcp-mdp"), ("majortomo-own", "dcp-majortomo-own")}
    assert {r["variant"] for r in main} == {v for pair in pairs for v in pair}
    for theirs, ours in pairs:
        assert VARIANTS[ours].broker == "dcp"
        assert VARIANTS[ours].peers == VARIANTS[theirs].peers
    assert VARIANTS["dcp-mdp"].common_proto == VARIANTS["majortomo"].common_proto == "mdp"
    for rec in main:
        _check_load(rec)
        assert (rec["payload"], rec["window"]) in {(16, 64), (16, 1)}
    assert sum(r["requests"] for r in main if r["variant"] == "dcp-majortomo-own") > 0
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| 64 |", "| 1 |"))]
    assert len(rows) == 4
    # The section again from the saved records, into a page that keeps its other parts.
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\nGenerated.\n")
    proc = run_module("benchmarks.mdp_peers", "--render", records, "--page", page, timeout=60)
    text = page.read_text()
    assert text.startswith("# Performance\n\nGenerated.\n")
    assert "<!-- section: mdp-peers -->" in text
    assert "$ python -m benchmarks.mdp_peers --tiny" in text


def test_wake_cost_benchmark_runs() -> None:
    proc = run_module("benchmarks.wake", "--count", "50", "--rounds", "1", timeout=60)
    rows = [
        line for line in proc.stdout.splitlines() if line.startswith("| ") and "us" not in line
    ]
    assert [row.split("|")[1].strip() for row in rows] == ["sync poll", "trio", "asyncio"]
    for row in rows:
        cpu, wall = (float(cell) for cell in row.split("|")[2:4])
        assert cpu > 0
        assert wall > 0


@pytest.mark.timeout(60)
def test_curve_benchmark_runs(tmp_path: Path) -> None:
    """``benchmarks.curve --tiny``: the same load with and without CURVE, both complete."""
    records = tmp_path / "curve.json"
    proc = run_module("benchmarks.curve", "--tiny", "--rounds", "1", "--json", records, timeout=50)
    [(label, modes)] = json.loads(records.read_text()).items()
    assert label == "16 B, window 64"
    assert set(modes) == {"plain", "curve"}
    for [rec] in modes.values():
        _check_load(rec)
    assert "| 16 B, window 64 | curve / plain |" in proc.stdout


def test_curve_micro_benchmark_functions() -> None:
    from benchmarks import curve

    assert 0 < curve._core_cycle_us(False, 200) < 10_000
    assert 0 < curve._core_cycle_us(True, 200) < 10_000
    assert 0 < curve._user_id_us(100) < 10_000


def test_curve_table_without_measured_cpu() -> None:
    """A tiny run may measure 0 broker CPU (clock ticks): the ratio is "-", not a crash."""
    from benchmarks import curve

    row = {"rate": 100.0, "p50_us": 50.0, "broker_cpu_us": 0.0, "broker_thread_cpu_us": 0.0}
    text = curve.table({"16 B": {"plain": [row], "curve": [{**row, "rate": 50.0}]}})
    assert "| 16 B | curve / plain | 0.50 | 1.00 | - | - |" in text


def test_ab_benchmark_compares_two_checkouts() -> None:
    """``benchmarks.ab`` against HEAD (present in any clone): one tiny round, a table."""
    command = ["--base", "HEAD", "--rounds", "1"]
    command += ["--windows", "4", "--count", "200", "--duration", "0.5"]
    proc = run_module("benchmarks.ab", *command, timeout=120)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 4 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["broker_cpu_us", "p50_us", "rate"]
    for row in rows:
        base, head = (float(cell.replace(",", "")) for cell in row.split("|")[3:5])
        assert base > 0 and head > 0
    # Its own checkout was removed (others' runs of benchmarks.ab may list theirs meanwhile).
    [checkout] = re.findall(r"HEAD checked out in (\S+)", proc.stderr)
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    )
    assert checkout not in listed.stdout
    assert not Path(checkout).exists()


@pytest.mark.timeout(120)
def test_the_whole_stack_comparison(tmp_path: Path) -> None:
    """``benchmarks.stack --tiny``: dcp's own Client and Workers (trio and asyncio) and
    majortomo's own, both worker shapes, windows 64 and 1: every request answered, the
    report printed, and the page section written from the saved records."""
    if importlib.util.find_spec("majortomo") is None:
        pytest.skip("majortomo is not installed (pip install -e '.[bench]')")
    from benchmarks.stack import SHAPES, SIDES

    # The nats side has its own smoke test (tests/bench/test_nats.py).
    sides = [side for side in SIDES if side != "nats"]
    records = tmp_path / "stack.json"
    proc = run_module(
        "benchmarks.stack", "--tiny", "--sides", ",".join(sides), "--json", records, timeout=110
    )
    stack = json.loads(records.read_text())["stack"]
    assert {(r["shape"], r["side"], r["window"]) for r in stack} == {
        (shape, side, window) for shape in SHAPES for side in sides for window in (64, 1)
    }
    for rec in stack:
        assert "error" not in rec, rec["error"]
        assert rec["lost"] == rec["errors"] == 0
        assert rec["requests"] >= 10
        assert 0 < rec["p50_us"] <= rec["p99_us"]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| 1x16 |", "| 4x1 |"))]
    assert len(rows) == len(SHAPES) * 2 * (len(sides) - 1)
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\nGenerated.\n")
    proc = run_module("benchmarks.stack", "--render", records, "--page", page, timeout=60)
    text = page.read_text()
    assert text.startswith("# Performance\n\nGenerated.\n")
    assert "<!-- section: stack -->" in text and "## Whole stack" in text


def test_trace_broker_runs_a_tool_on_the_broker_pid(tmp_path: Path) -> None:
    """benchmarks.trace_broker starts a broker under load and gives its PID to the tool."""
    out = tmp_path / "pid"
    proc = run_module(
        "benchmarks.trace_broker",
        "--variant",
        "minimal",
        "--seconds",
        "0.5",
        "--",
        "sh",
        "-c",
        f"echo {{pid}} > {out}",
        timeout=120,
    )
    assert int(out.read_text()) > 0
    assert proc.stdout.startswith("minimal window 1: ") and " req/s, broker " in proc.stdout


def test_an_ab_run_against_a_tree_without_the_prefetch_skips_its_base_copies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``benchmarks.stack --base TREE``: a tree whose peers have no ``--prefetch`` (from before
    the worker prefetch) gets no ``X@base`` copy of the prefetch sides, and stderr says so;
    a tree that has it does."""
    from benchmarks.stack import _in_tree

    old = tmp_path / "old" / "benchmarks"
    old.mkdir(parents=True)
    (old / "dcp_peers.py").write_text('p.add_argument("--concurrency")\n')
    assert _in_tree("dcp-trio", old.parent)
    assert not _in_tree("dcp-asyncio-prefetch", old.parent)
    assert "the base tree has no worker prefetch" in capsys.readouterr().err
    assert _in_tree("dcp-asyncio-prefetch", Path(__file__).parents[2])
