"""A Spark job that pushes a real dataset through a two-service dcp DAG: normalise -> score.

Run: ``python examples/spark_pipeline.py [--rows 200000] [--out DIR] [--workers 1]
[--connect]`` (needs ``pip install 'dagbox-dcp[spark]'``, ``'dagbox-dcp[spark-connect]'``
for ``--connect``, and Java 17+).

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
- ``--connect``: the same job, the same code, over **Spark Connect**: a local Spark Connect
  server (its own JVM, ``local[*]``, on 127.0.0.1, started with pyspark's ``spark-submit``)
  runs the plan, and this process is only its client (no JVM here):
  ``SparkSession.builder.remote("sc://localhost:PORT")``, as a job reaches a cluster's
  Connect server.

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
import secrets
import socket
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


async def normalise(request: dcp.HandlerRequest) -> dcp.Forward:
    """A raw source line -> ``{"indent": n, "text": "..."}``, forwarded to ``score``."""
    line = request.data[0].decode(errors="replace")
    indent = len(line) - len(line.lstrip(" "))
    text = " ".join(line.split()).lower()
    return dcp.Forward(b"score", json.dumps({"indent": indent, "text": text}).encode())


async def score(request: dcp.HandlerRequest) -> bytes:
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


def _java_options() -> str:
    return "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


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
        .config("spark.driver.extraJavaOptions", _java_options())
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def connect_server(work: Path) -> Iterator[str]:
    """A local Spark Connect server in its own JVM (``local[*]``, 127.0.0.1, a free port, a
    token); yields its ``sc://`` URL and stops it (by its PID) at the end."""
    import pyspark

    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    with socket.socket() as probe:  # a free port (another process could take it meanwhile)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.authenticate.token": token,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": _java_options(),
        "spark.ui.enabled": "false",
    }
    argv = [str(spark_home / "bin" / "spark-submit"), "--master", "local[*]",
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]  # fmt: skip
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    argv.append("spark-internal")
    # The executors' Python: this interpreter, and the dcp this process imports.
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    log = work / "connect-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:  # until its port answers
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the Spark Connect server did not start: {log.read_text()}")
            time.sleep(0.2)
        yield f"sc://localhost:{port}/;token={token}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def session(work: Path, connect: bool) -> Iterator[SparkSession]:
    """A classic local session, or a Spark Connect client of a local server."""
    from pyspark.sql import SparkSession

    if not connect:
        spark = spark_session()
        try:
            yield spark
        finally:
            spark.stop()
        return
    with connect_server(work) as url:
        # localhost, not 127.0.0.1: pyspark sends a token without TLS to localhost only.
        spark = SparkSession.builder.remote(url).getOrCreate()
        try:
            yield spark
        finally:
            spark.stop()


def run(rows: int, out: Path, workers: int, connect: bool = False) -> None:
    from pyspark.sql import functions as F

    from dcp.spark import map_service

    out.mkdir(parents=True, exist_ok=True)
    source = out / "input.parquet"
    count = write_dataset(source, rows)
    print(f"dataset: {count:,} lines of the Python standard library -> {source}")
    with services(out, workers) as endpoint, session(out, connect) as spark:
        print(f"spark: {'Spark Connect' if connect else 'classic'} session, local mode")
        # local[*] runs one task per core: one partition per core.
        df = spark.read.parquet(str(source)).repartition(os.cpu_count() or 2)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="lines to process")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: temp)")
    parser.add_argument("--workers", type=int, default=1, help="processes per service")
    parser.add_argument(
        "--connect", action="store_true", help="run the job over Spark Connect (a local server)"
    )
    args = parser.parse_args()
    if args.out is not None:
        run(args.rows, args.out, args.workers, args.connect)
    else:
        with tempfile.TemporaryDirectory(prefix="dcp-spark-pipeline-") as tmp:
            run(args.rows, Path(tmp), args.workers, args.connect)


if __name__ == "__main__":
    main()
