"""Smoke tests of ``benchmarks.failover`` and ``benchmarks.capacity`` (issue 28), real
processes over tcp://127.0.0.1: a short failover run (two brokers, each SIGKILLed and
restarted once under load) ends every call, its counts add up, no answer is wrong, and each
restarted broker carries traffic again; a short capacity run measures every broker. The
issue's full failover run (60 s) is the slow test, which also asserts the issue's promise:
nothing lost, nothing run twice. Speeds are not asserted here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import capacity, failover
from tests.bench.run import run_module

#: Brokers of the short runs.
BROKERS = 2


def _check_failover(summary: dict[str, Any], kills: int) -> None:
    assert summary["hung"] == 0, summary["errors"]
    assert summary["wrong"] == 0
    assert summary["sent"] == summary["answered"] + summary["lost"]
    assert summary["answered"] > 0
    assert summary["run_twice"] >= 0 and summary["handler_runs"] >= summary["answered"]
    assert [k["broker"] for k in summary["kills"]] == [i % BROKERS for i in range(kills)]
    for kill in summary["kills"]:
        assert kill["traffic_s"] is not None, kill  # the restarted broker carried traffic
        assert 0 <= kill["bound_s"] <= kill["traffic_s"]
    assert 0 < summary["latency"]["p50_ms"] <= summary["latency"]["p99_ms"]
    assert summary["latency_in_failover"]["calls"] > 0
    assert summary["broker_cpu_us_per_request"] > 0
    assert len(summary["brokers"]) == BROKERS + kills  # every incarnation measured
    assert summary["leftovers"] == []


@pytest.mark.timeout(120)
def test_short_failover_run(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    # Every call ends within its 10 s timeout, well inside the drain: none can be left hung.
    args = ["--brokers", BROKERS, "--duration", 11, "--period", 4, "--timeout", 10]
    args += ["--drain", 15]
    proc = run_module("benchmarks.failover", *args, "--json", out, timeout=110)
    summary = json.loads(out.read_text())
    _check_failover(summary, kills=2)
    assert "| sent | answered | lost |" in proc.stdout
    assert "| kill at | broker | bound after | traffic after |" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_issues_failover_run(tmp_path: Path) -> None:
    """Issue 28's figure: 2 brokers, 4 workers, 2 clients x 16, a kill every 10 s for 60 s."""
    out = tmp_path / "failover.json"
    run_module("benchmarks.failover", "--json", out, timeout=280)
    summary = json.loads(out.read_text())
    _check_failover(summary, kills=5)
    assert summary["lost"] == 0, summary["errors"]
    assert summary["run_twice"] == 0, summary["run_twice_after_kill"]


@pytest.mark.timeout(120)
def test_short_capacity_run(tmp_path: Path) -> None:
    out = tmp_path / "capacity.json"
    counts = sorted({1, BROKERS})
    args = ["--brokers", ",".join(map(str, counts)), "--warmup", 0.5, "--duration", 1.5]
    args += ["--rounds", 1]
    proc = run_module("benchmarks.capacity", *args, "--json", out, timeout=110)
    document = json.loads(out.read_text())
    assert [(r["brokers"], r["pinned"]) for r in document["rows"]] == [(n, False) for n in counts]
    for rec in document["records"]:
        assert rec["lost"] == rec["hung"] == rec["wrong"] == 0
        assert len(rec["per_broker"]) == rec["brokers"]
        for b in rec["per_broker"]:  # every broker carried a share of the load
            assert b["replies"] > 0 and b["cpu_us_per_request"] > 0
        assert rec["leftovers"] == []
    assert f"| {BROKERS} | no |" in proc.stdout


def _call(sent: float, latency: float, payload: str = "c0:0") -> list[Any]:
    return [sent, latency, payload]


def test_the_figures_around_a_kill() -> None:
    settings = failover.Settings(brokers=2, duration=10, period=5, window=2)
    assert failover.kill_times(settings) == [5.0]
    assert failover.kill_times(failover.Settings(duration=60, period=10)) == [10, 20, 30, 40, 50]
    calls = [
        _call(100.0, 0.01),  # before the kill: not around it
        _call(104.9, 0.2),  # in flight at the kill
        _call(105.5, 0.5, "c0:1"),  # sent in the window
        _call(107.5, 0.01),  # after the window
    ]
    raw: dict[str, Any] = {
        "settings": {**settings.__dict__},
        "kills": [
            {
                "at": 5.0,
                "broker": 0,
                "restart_s": 0.0,
                "bound_s": 0.1,
                "traffic_s": 0.3,
                "killed_monotonic": 105.0,
            }
        ],
        "clients": [
            {
                "sent": 5,
                "answered": 4,
                "lost": 1,
                "hung": 0,
                "wrong": 0,
                "errors": {"RequestTimeout": 1},
                "stats": {},
                "calls": calls,
                "failed": [],
            }
        ],
        "workers": [{"stats": {"requests": 5, "duplicates": 1}}],
        "brokers": [
            {"slot": 0, "pid": 1, "cpu_s": 0.002, "replies": 2, "requests": 2},
            {"slot": 1, "pid": 2, "cpu_s": 0.002, "replies": 2, "requests": 2},
        ],
        "handler_runs": 6,
        "run_twice": 1,
        "run_twice_ids": ["c0:1"],
        "leftovers": [],
    }
    summary = failover.summarise(raw)
    assert summary["latency"]["calls"] == 4
    assert summary["latency_in_failover"] == {
        "calls": 2, "p50_ms": 200.0, "p99_ms": 500.0, "max_ms": 500.0,
    }  # fmt: skip
    assert summary["kills"][0]["calls"] == 2
    assert summary["broker_cpu_us_per_request"] == 1000.0
    assert summary["worker_stats"] == {"requests": 5, "duplicates": 1}
    text = failover.render(summary, "cmd")
    assert "| 5 | 4 | 1 | 0 | 0 | 1 |" in text
    assert "| 5.0 s | 0 | 0.10 s | 0.30 s | 2 |" in text
    assert "Errors: RequestTimeout 1" in text
    assert summary["run_twice_after_kill"] == [["c0:1", 0.5]]
    assert "Run twice (sent this long after the last kill): c0:1 0.50 s" in text


def test_capacity_medians() -> None:
    def rec(n: int, rate: float, us: float) -> dict[str, Any]:
        return {
            "brokers": n, "pinned": False, "rate": rate, "cpu_us_per_request": us,
            "broker_cpu_share": 0.3, "machine_busy": 0.9, "lost": 0, "hung": 0, "wrong": 0,
            "per_broker": [{"cpu_us_per_request": us + i} for i in range(n)],
        }  # fmt: skip

    rows = capacity.summarise([rec(1, 100, 50), rec(1, 300, 70), rec(1, 200, 60), rec(2, 9, 5)])
    assert [(r["brokers"], r["rounds"], r["rate"], r["cpu_us_per_request"]) for r in rows] == [
        (1, 3, 200, 60),
        (2, 1, 9, 5),
    ]
    assert (rows[1]["per_broker_min"], rows[1]["per_broker_max"]) == (5, 6)
    assert "| 2 | no | 9 | 5 µs | 5 µs - 6 µs |" in capacity.render(rows, "cmd", "s")
