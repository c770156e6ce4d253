"""Smoke test of ``benchmarks.spark`` in its tiny form, on the test run's sessions (classic and
Spark Connect): every side answers every row, the figures are sane, and the page section is
written and kept when the rest of the page is regenerated."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from benchmarks.procs import Procs
from benchmarks.sections import kept_sections, put_section
from benchmarks.spark import loop_rate, render_section, spark_rate, start_services, summarise


@pytest.mark.timeout(300)  # a hang guard: under load the three sides take minutes
def test_tiny_spark_benchmark(
    spark_classic: SparkSession, spark_connect: SparkSession, tmp_path: Path
) -> None:
    records = []
    with Procs(tmp_path) as procs:
        endpoint = start_services(procs)
        pids = [p.pid for p in procs.procs]
        for streams in (2,):  # the two-task case; one stream is the same code
            loop = loop_rate(endpoint, rows=1000, streams=streams, window=32, size=16,
                             service_pids=pids)  # fmt: skip
            measures = [("loop", loop)]
            for side, session in (("spark", spark_classic), ("connect", spark_connect)):
                m = spark_rate(session, endpoint, rows=1000, streams=streams, window=32,
                               size=16, service_pids=pids)  # fmt: skip
                measures.append((side, m))
            for side, m in measures:
                assert (m.rows, m.errors) == (1000, 0)
                assert 20 < m.rate < 1_000_000
                assert 0 < m.side_us_per_row < 100_000
                assert m.other_load >= 0
                records.append({"round": 0, "streams": streams, "side": side,
                                "rate": m.rate, "side_us_per_row": m.side_us_per_row,
                                "other_load": m.other_load, "errors": m.errors})  # fmt: skip
    [row] = summarise(records)
    assert row["streams"] == 2 and row["errors"] == 0
    assert all(row[k] > 0 for k in ("ratio", "connect_ratio", "connect_classic"))
    results = {
        "records": records,
        "settings": {"rows": 1000, "payload": 16, "window": 32, "rounds": 1},
        "machine": "test machine",
        "when": "now",
    }
    section = render_section(results, "python -m benchmarks.spark --tiny")
    assert "$ python -m benchmarks.spark --tiny" in section
    assert section.count("\n| 2 |") == 1
    # A run saved before the Connect column renders with dashes there.
    old = {**results, "records": [r for r in records if r["side"] != "connect"]}
    [line] = [x for x in render_section(old, "x").splitlines() if x.startswith("| 2 |")]
    assert line.split(" | ")[3] == "-"


def test_page_sections_are_replaced_and_kept() -> None:
    page = "# Performance\n\ngenerated text\n"
    once = put_section(page, "spark", "## Spark\nfigures 1\n")
    assert once == (
        "# Performance\n\ngenerated text\n\n<!-- section: spark -->\n## Spark\nfigures 1\n"
        "<!-- /section: spark -->\n"
    )
    twice = put_section(put_section(once, "other", "x"), "spark", "## Spark\nfigures 2")
    assert twice.count("figures") == 1 and "figures 2" in twice
    assert twice.index("spark -->") < twice.index("other -->")
    regenerated = "# Performance\n\nnew text\n" + kept_sections(twice)
    assert kept_sections(regenerated) == kept_sections(twice)
    assert "figures 2" in regenerated and "generated text" not in regenerated
