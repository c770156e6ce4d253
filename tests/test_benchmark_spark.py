"""Smoke test of ``benchmarks.spark`` in its tiny form, on the test session's SparkSession:
both sides answer every row, the figures are sane, and the page section is written and kept
when the rest of the page is regenerated."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from benchmarks.procs import Procs
from benchmarks.sections import kept_sections, put_section
from benchmarks.spark import loop_rate, render_section, spark_rate, start_services, summarise


@pytest.mark.timeout(120)
def test_tiny_spark_benchmark(spark: SparkSession, tmp_path: Path) -> None:
    records = []
    with Procs(tmp_path) as procs:
        endpoint = start_services(procs)
        pids = [p.pid for p in procs.procs]
        for streams in (2,):  # the two-task case; one stream is the same code
            loop = loop_rate(endpoint, rows=1000, streams=streams, window=32, size=16,
                             service_pids=pids)  # fmt: skip
            sp = spark_rate(spark, endpoint, rows=1000, streams=streams, window=32, size=16,
                            service_pids=pids)  # fmt: skip
            for side, m in (("loop", loop), ("spark", sp)):
                assert (m.rows, m.errors) == (1000, 0)
                assert 20 < m.rate < 1_000_000
                assert 0 < m.side_us_per_row < 100_000
                assert m.other_load >= 0
                records.append({"round": 0, "streams": streams, "side": side,
                                "rate": m.rate, "side_us_per_row": m.side_us_per_row,
                                "other_load": m.other_load, "errors": m.errors})  # fmt: skip
    [row] = summarise(records)
    assert row["streams"] == 2 and row["errors"] == 0
    results = {
        "records": records,
        "settings": {"rows": 1000, "payload": 16, "window": 32, "rounds": 1},
        "machine": "test machine",
        "when": "now",
    }
    section = render_section(results, "python -m benchmarks.spark --tiny")
    assert "$ python -m benchmarks.spark --tiny" in section
    assert section.count("\n| 2 |") == 1


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
