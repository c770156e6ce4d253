"""Smoke test of ``python -m benchmarks.floor`` (issue 27): one tiny round as a real
subprocess (``dcp broker``, worker and client processes over 127.0.0.1) gives every side of
both tables a positive rate and positive CPU figures, and prints both tables; and the
per-thread CPU split the workers' figures come from. Speeds are not asserted here."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from benchmarks import floor
from benchmarks.common import thread_cpu_seconds
from tests.bench.run import run_module


@pytest.mark.timeout(150)
def test_one_tiny_round_measures_every_side(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    proc = run_module("benchmarks.floor", "--tiny", "--rounds", "1", "--out", out, timeout=140)
    results: dict[str, Any] = json.loads(out.read_text())
    records = results["records"]
    for rec in records:
        assert "error" not in rec, rec["error"]
        assert rec["lost"] == rec["errors"] == rec["unexpected"] == 0
        assert rec["requests"] > 0 and rec["rate"] > 0
        assert 0 < rec["p50_us"] <= rec["p99_us"]
        assert rec["client_cpu_us"] > 0 and rec["client_thread_cpu_us"] > 0

    workers = {r["side"]: r for r in records if r["table"] == "workers"}
    expected = [s for s in floor.WORKER_SIDES if floor.missing(s) is None]
    assert sorted(workers) == sorted(expected)
    assert set(results["skipped"]) == set(floor.WORKER_SIDES) - set(expected)
    for rec in workers.values():
        assert rec["window"] == 64
        assert rec["workers_main_cpu_us"] + rec["workers_other_cpu_us"] > 0  # Python threads
        assert rec["workers_zmq_cpu_us"] > 0  # libzmq's I/O threads
    for side in ("block", "zmq-asyncio", "trio-fd", "dcp-asyncio", "dcp-trio"):
        assert workers[side]["workers_main_cpu_us"] > 0  # the loop is the main thread

    clients = {r["side"]: r for r in records if r["table"] == "clients"}
    assert sorted(clients) == sorted(floor.CLIENT_SIDES)
    for rec in clients.values():
        assert rec["window"] == 1
        assert rec["workers_main_cpu_us"] > 0  # the one blocking worker served them all

    for table in floor.TABLES:
        rows_of = {row["side"]: row for row in floor.summarise(records, table)}
        for side, bare in floor.BARE.items():  # dcp's sides against the bare loop too
            assert bare in rows_of
            name = floor.FIGURES[table][1][0]  # the CPU figure
            assert rows_of[side][f"{name} loop ratio"] > 0
            assert rows_of[floor.ANCHOR][f"{name} ratio"] == 1.0
    assert "### Workers at concurrency 1" in proc.stdout
    assert "### Clients at window 1" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    for side in {*workers, *clients}:
        assert any(line.startswith(f"| {side} | ") for line in rows)
    # Ratios to the blocking side: 1.00x for itself.
    assert proc.stdout.count("| block | ") == 2
    for line in proc.stdout.splitlines():
        if line.startswith("| block | "):
            assert "| 1.00x |" in line


def test_thread_cpu_seconds_tells_the_threads_apart() -> None:
    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    busy, gate = threading.Event(), threading.Event()

    def busy_then_wait() -> None:
        burn(0.05)
        busy.set()
        gate.wait(10)  # alive while measured: an ended thread's time is not counted

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.PAIR)  # starts libzmq's threads
    other = threading.Thread(target=busy_then_wait)
    try:
        before = thread_cpu_seconds(os.getpid())
        other.start()
        burn(0.05)
        assert busy.wait(10)
        after = thread_cpu_seconds(os.getpid())
    finally:
        gate.set()
        other.join(10)
        sock.close(0)
        ctx.term()
    assert set(after) == {"main", "other", "zmq"}
    assert after["main"] - before["main"] >= 0.04
    assert after["other"] - before["other"] >= 0.04
    assert after["zmq"] >= 0.0
    # Past Linux's largest PID: no such process, nothing counted.
    assert thread_cpu_seconds(2**22 + 1) == {"main": 0.0, "other": 0.0, "zmq": 0.0}
