"""A Spark job that pushes a real dataset through a two-service dcp DAG: normalise -> score.

Run: ``python examples/spark_pipeline.py [--rows 200000] [--out DIR] [--workers 1]``
(needs ``pip install 'dagbox-dcp[spark]'`` and Java 17+).

- **Data**: the non-blank lines of the Python standard library's own source files (real
  text, on every machine), written as ``DIR/input.parquet`` (path, lineno, line).
- **Services**, each in its own ``dcp worker`` process(es), behind a ``dcp broker``
  process, all on 127.0.0.1: ``normalise`` strips, collapses whitespace and lower-cases a
  line, then *forwards* it to ``score``, which counts tokens, keywords and operators and
  replies with a JSON record straight to the Spark task. ``score`` refuses lines longer
  than 120 characters (an error reply), to show per-row errors.
- **Job** (Spark local mode): read the Parquet, ``dcp.spark.map_service`` with
  ``on_error="column"``, parse the JSON, write ``DIR/scored`` as Parquet. It prints rows/s,
  the errors, and the most complex lines.

The broker and the workers are stopped (by PID) when the job ends. The result is written
once and read back for the summary: an uncached result used by two actions would call the
services twice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import keyword
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import dcp

if TYPE_CHECKING:  # pyspark is imported by the job only, not by the worker processes
    from pyspark.sql import SparkSession

HERE = Path(__file__).resolve().parent
MAX_LENGTH = 120
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?|\S")


# ------------------------------------------------------------------ the services


async def normalise(request: dcp.Request) -> dcp.Forward:
    """A raw source line -> ``{"indent": n, "text": "..."}``, forwarded to ``score``."""
    line = request.data[0].decode(errors="replace")
    indent = len(line) - len(line.lstrip(" "))
    text = " ".join(line.split()).lower()
    return dcp.Forward(b"score", json.dumps({"indent": indent, "text": text}).encode())


async def score(request: dcp.Request) -> bytes:
    """``{"indent", "text"}`` -> the record the job stores (JSON): a toy complexity score
    from the nesting, the keywords, the distinct operators and the tokens of the code."""
    record = json.loads(request.data[0])
    text: str = record["text"]
    if len(text) > MAX_LENGTH:
        raise ValueError(f"line too long: {len(text)} characters (max {MAX_LENGTH})")
    tokens = _TOKEN.findall(text.split("#", 1)[0])  # code only, not comments
    keywords = sum(1 for t in tokens if keyword.iskeyword(t))
    operators = {t for t in tokens if not (t[0].isalnum() or t[0] == "_")}
    value = 0.25 * record["indent"] / 4 + keywords + 0.5 * len(operators) + 0.1 * len(tokens)
    out = {"text": text, "tokens": len(tokens), "keywords": keywords, "score": round(value, 2)}
    return json.dumps(out).encode()


# ------------------------------------------------------------------ the processes


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "dcp", *argv],
            cwd=HERE,  # ``dcp worker`` imports spark_pipeline:... from here
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        )


@contextlib.contextmanager
def services(work: Path, workers: int) -> Iterator[str]:
    """A broker and the workers of the DAG; yields the broker's endpoint."""
    procs = [_start(["broker", "--bind", "tcp://127.0.0.1:0"], work / "broker.log")]
    try:
        assert procs[0].stdout is not None
        endpoint = procs[0].stdout.readline().decode().strip()
        if not endpoint.startswith("tcp://"):
            raise SystemExit(f"the broker did not start: {(work / 'broker.log').read_text()}")
        for name in ("normalise", "score"):
            for i in range(workers):
                argv = ["worker", "--connect", endpoint, "--service", name,
                        f"spark_pipeline:{name}", "--concurrency", "16"]  # fmt: skip
                procs.append(_start(argv, work / f"{name}{i}.log"))
        _wait_for_services(endpoint)
        yield endpoint
    finally:
        for proc in reversed(procs):  # workers first (they leave gracefully), then broker
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def _wait_for_services(endpoint: str) -> None:
    """Until the whole DAG answers (workers register within a second or so)."""
    deadline = time.monotonic() + 30
    with dcp.SyncClient(endpoint, timeout=1.0, retries=0) as client:
        while True:
            try:
                client.request("normalise", b"x = 1")
                return
            except dcp.RequestTimeout:
                if time.monotonic() > deadline:
                    raise SystemExit("the services did not answer within 30 s") from None


# ------------------------------------------------------------------ the data and the job


def write_dataset(path: Path, rows: int) -> int:
    """The first ``rows`` non-blank lines of the standard library's sources, as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths: list[str] = []
    numbers: list[int] = []
    lines: list[str] = []
    for source in sorted(stdlib.rglob("*.py")):
        if "site-packages" in source.parts:
            continue
        text = source.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                paths.append(str(source.relative_to(stdlib)))
                numbers.append(number)
                lines.append(line)
        if len(lines) >= rows:
            break
    table = pa.table(
        {"path": paths[:rows], "lineno": numbers[:rows], "line": lines[:rows]},
    )
    pq.write_table(table, path)
    return len(lines[:rows])


def spark_session() -> SparkSession:
    """Local mode on this machine's cores, bound to 127.0.0.1, quiet."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[*]")
        .appName("dcp spark_pipeline example")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(rows: int, out: Path, workers: int) -> None:
    from pyspark.sql import functions as F

    from dcp.spark import map_service

    out.mkdir(parents=True, exist_ok=True)
    source = out / "input.parquet"
    count = write_dataset(source, rows)
    print(f"dataset: {count:,} lines of the Python standard library -> {source}")
    with services(out, workers) as endpoint:
        spark = spark_session()
        try:
            df = spark.read.parquet(str(source)).repartition(spark.sparkContext.defaultParallelism)
            scored = map_service(
                df, "normalise", input_col="line", output_col="result", broker=endpoint,
                window=64, output_type="string", on_error="column",
            )  # fmt: skip
            schema = "text string, tokens int, keywords int, score double"
            table = scored.select(
                "path", "lineno", "line",
                F.from_json("result", schema).alias("r"), F.col("result_error").alias("error"),
            ).select("path", "lineno", "line", "r.*", "error")  # fmt: skip
            start = time.perf_counter()
            table.write.mode("overwrite").parquet(str(out / "scored"))
            seconds = time.perf_counter() - start

            result = spark.read.parquet(str(out / "scored"))  # read back: no second call
            done = result.count()
            errors = result.where("error IS NOT NULL").groupBy("error").count()
            n_errors = sum(row["count"] for row in errors.collect())
            print(f"rows: {done:,} in {seconds:.1f} s: {done / seconds:,.0f} rows/s "
                  f"through normalise -> score -> {out / 'scored'}")  # fmt: skip
            print(f"errors: {n_errors:,}", end="")
            example = result.where("error IS NOT NULL").select("error").first()
            print(f" (e.g. {example['error']})" if example else "")
            print("most complex lines:")
            top = result.where("error IS NULL").orderBy(F.desc("score"), "path", "lineno")
            for row in top.limit(3).collect():
                print(f"  {row['score']:6.2f}  {row['path']}:{row['lineno']}  {row['text']}")
        finally:
            spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="lines to process")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: temp)")
    parser.add_argument("--workers", type=int, default=1, help="processes per service")
    args = parser.parse_args()
    if args.out is not None:
        run(args.rows, args.out, args.workers)
    else:
        with tempfile.TemporaryDirectory(prefix="dcp-spark-pipeline-") as tmp:
            run(args.rows, Path(tmp), args.workers)


if __name__ == "__main__":
    main()
