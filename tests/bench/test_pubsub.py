"""Smoke test of ``benchmarks/pubsub.py`` in its tiny mode (real processes over
tcp://127.0.0.1): every broker kind ran, the dcp broker delivered every message to every
subscriber, and the scaling runs delivered theirs. Speeds are not asserted here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.run import run_module


@pytest.mark.timeout(120)
def test_tiny_pubsub_benchmark(tmp_path: Path) -> None:
    out = tmp_path / "pubsub.json"
    # NATS has its own smoke test (tests/bench/test_nats.py).
    kinds = "proxy,python,dcp"
    proc = run_module("benchmarks.pubsub", "--tiny", "--kinds", kinds, "--json", out, timeout=110)
    records: list[dict[str, Any]] = json.loads(out.read_text())
    cases = [r for r in records if "kind" in r]
    assert {(r["kind"], r["subscribers"]) for r in cases} == {
        (k, n) for k in ("proxy", "python", "dcp") for n in (1, 3)
    }
    for r in cases:
        assert r["publish_rate"] > 0 and r["delivery_rate"] > 0
        if r["kind"] == "dcp":
            assert r["lost"] == 0
            assert r["delivered"] == r["published"] * r["subscribers"]
    scaling = [r for r in records if "idle_subscriptions" in r]
    assert [r["idle_subscriptions"] for r in scaling] == [0, 200]
    assert all(r["delivered"] == 2000 for r in scaling)
    assert "| dcp | 3 | 16 |" in proc.stdout
