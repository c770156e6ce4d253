"""``dcp.spark`` in a real local[2] Spark session, each test twice: on the classic session
and over Spark Connect (the ``spark`` fixture): every row answered in order, a worker killed
during a job, ``on_error``, the column function, how the broker address reaches the
executors, and large replies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import PythonException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dcp.spark import BROKER_ENV, BROKER_KEY, map_service, service_column
from tests.spark.services import Services, services
from tests.spark.session import is_connect, memory, python_workers, reset_peaks

ROOT = Path(__file__).resolve().parents[2]
#: Nobody listens there: a job that picks it fails fast (timeout 0.5 s, no retry).
NOWHERE = "tcp://127.0.0.1:9"


@pytest.fixture(scope="module")
def svc() -> Iterator[Services]:
    with services() as s:
        yield s


@pytest.fixture
def rec(svc: Services) -> Services:
    svc.recorder.clear()
    return svc


@pytest.fixture
def small_batches(spark: SparkSession) -> Iterator[None]:
    """Arrow batches of 10 rows, so each task streams many batches."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(key)
    spark.conf.set(key, "10")
    yield
    spark.conf.set(key, str(old))


def texts(spark: SparkSession, n: int, partitions: int = 2) -> DataFrame:
    """Rows ``id, text``: ``slow<id>``, null for every 7th."""
    return spark.range(0, n, numPartitions=partitions).select(
        "id",
        F.when(F.col("id") % 7 == 3, F.lit(None))
        .otherwise(F.concat(F.lit("slow"), F.col("id").cast("string")))
        .alias("text"),
    )


def expected(i: int) -> str | None:
    return None if i % 7 == 3 else f"SLOW{i}"


def test_every_row_answered_in_order(
    spark: SparkSession, rec: Services, small_batches: None, tmp_path: Path
) -> None:
    df = texts(spark, 2000, partitions=3)
    out = map_service(
        df, "svc", input_col="text", output_col="up", output_type="string", window=32,
        broker=rec.endpoint,
    )  # fmt: skip
    assert out.columns == ["id", "text", "up"]
    assert out.schema["up"].dataType.simpleString() == "string"
    out.write.parquet(str(tmp_path / "out"))
    rows = spark.read.parquet(str(tmp_path / "out")).orderBy("id").collect()
    assert [(r.id, r.up) for r in rows] == [(i, expected(i)) for i in range(2000)]
    # Order within each task is the input's: collect() keeps the partitions' order.
    assert [r.up for r in out.collect()] == [expected(i) for i in range(2000)]
    # Null rows are not sent; a task's window spans its batches of 10 rows.
    assert len(rec.recorder.ids) == 2 * sum(expected(i) is not None for i in range(2000))
    assert 10 < rec.recorder.max_in_flight <= 2 * 32


def test_service_column_in_select_and_with_column(spark: SparkSession, rec: Services) -> None:
    df = texts(spark, 300)
    up = service_column("text", "svc", output_type="string", window=8, broker=rec.endpoint)
    rows = df.withColumn("up", up).orderBy("id").collect()
    assert [r.up for r in rows] == [expected(i) for i in range(300)]
    bad = spark.createDataFrame([("ok",), ("bad",), (None,)], "text string")
    checked = service_column(F.col("text"), "svc", on_error="column", broker=rec.endpoint)
    got = bad.select("text", checked.alias("r")).select("text", "r.value", "r.error").collect()
    assert [tuple(r) for r in got] == [
        ("ok", b"OK", None),
        ("bad", None, "handler_error: ValueError: refused b'bad'"),
        (None, None, None),
    ]
    nulls = bad.select(
        service_column("text", "svc", on_error="null", broker=rec.endpoint).alias("v")
    ).collect()
    assert [r.v for r in nulls] == [b"OK", None, None]


def test_on_error(spark: SparkSession, rec: Services) -> None:
    broker = rec.endpoint
    df = spark.createDataFrame(
        [(1, "a"), (2, "bad input"), (3, "two"), (4, None), (5, "b")], "id long, text string"
    )
    as_column = map_service(
        df, "svc", input_col="text", output_col="v", on_error="column", broker=broker
    )
    assert as_column.columns == ["id", "text", "v", "v_error"]
    assert [tuple(r) for r in as_column.select("v", "v_error").collect()] == [
        (b"A", None),
        (None, "handler_error: ValueError: refused b'bad input'"),
        (None, "bad_reply: the reply has 2 data parts, not 1"),
        (None, None),
        (b"B", None),
    ]
    named = map_service(
        df, "svc", input_col="text", output_col="v", on_error="column", error_col="why",
        broker=broker,
    )  # fmt: skip
    assert named.columns == ["id", "text", "v", "why"]
    as_null = map_service(
        df, "svc", input_col="text", output_col="text", on_error="null", broker=broker
    )
    assert as_null.columns == ["id", "text"]
    assert [r.text for r in as_null.collect()] == [b"A", None, None, None, b"B"]
    one_bad = df.where("id <= 2")
    raising = map_service(one_bad, "svc", input_col="text", output_col="v", broker=broker)
    with pytest.raises(PythonException, match="RemoteError: handler_error: ValueError: refused"):
        raising.collect()


def test_bad_arguments(spark: SparkSession, svc: Services) -> None:
    df = spark.createDataFrame([(1, "a")], "id long, text string")
    with pytest.raises(TypeError, match="column 'id' is bigint"):
        map_service(df, "svc", input_col="id", output_col="v", broker=svc.endpoint)
    with pytest.raises(ValueError, match="no column 'nope'"):
        map_service(df, "svc", input_col="nope", output_col="v", broker=svc.endpoint)
    with pytest.raises(ValueError, match="error_col is only for on_error='column'"):
        map_service(
            df, "svc", input_col="text", output_col="v", broker=svc.endpoint, error_col="e"
        )
    with pytest.raises(ValueError, match="window"):
        map_service(df, "svc", input_col="text", output_col="v", broker=svc.endpoint, window=0)


def _answers(df: DataFrame, broker: str | None = None) -> list[bytes]:
    out = map_service(df, "svc", input_col="text", output_col="v", timeout=0.5, retries=0,
                      broker=broker)  # fmt: skip
    return [r.v for r in out.collect()]


def test_config_shipping(
    spark: SparkSession, svc: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The address is found on the driver (argument, then local property, then conf, then
    environment) and shipped inside the tasks: the executors need no configuration. Spark
    Connect has no local properties: there it is argument, conf, environment."""
    df = spark.createDataFrame([("x",)], "text string")
    monkeypatch.delenv(BROKER_ENV, raising=False)
    assert spark.conf.get(BROKER_KEY, None) is None
    with pytest.raises(ValueError, match="no dcp broker"):
        map_service(df, "svc", input_col="text", output_col="v")
    with pytest.raises(ValueError, match="no dcp broker"):
        service_column("text", "svc")

    def column_answers() -> list[bytes]:
        return [r.v for r in df.select(service_column("text", "svc").alias("v")).collect()]

    monkeypatch.setenv(BROKER_ENV, svc.endpoint)
    assert _answers(df) == [b"X"]
    assert column_answers() == [b"X"]
    # Split on commas: the tasks' clients use every broker, the live one answers.
    monkeypatch.setenv(BROKER_ENV, f"{NOWHERE},{svc.endpoint}")
    assert _answers(df) == [b"X"]
    monkeypatch.setenv(BROKER_ENV, NOWHERE)
    try:
        spark.conf.set(BROKER_KEY, f"{NOWHERE}, {svc.endpoint}")
        assert _answers(df) == [b"X"]  # split on commas too
        spark.conf.set(BROKER_KEY, svc.endpoint)
        assert _answers(df) == [b"X"]  # the conf beats the environment
        assert column_answers() == [b"X"]  # (service_column: the active session's conf)
        spark.conf.set(BROKER_KEY, NOWHERE)
        assert _answers(df, broker=svc.endpoint) == [b"X"]  # the argument beats it
        with pytest.raises(PythonException, match="RequestTimeout"):
            _answers(df)  # and the conf really is used when there is none
        if is_connect(spark):
            with pytest.raises(AttributeError, match="sparkContext"):
                spark.sparkContext  # noqa: B018  # no SparkContext, no local properties
            return
        context = spark.sparkContext
        context.setLocalProperty(BROKER_KEY, svc.endpoint)
        try:
            assert _answers(df) == [b"X"]  # the local property beats the conf
            assert column_answers() == [b"X"]
            context.setLocalProperty(BROKER_KEY, NOWHERE)
            assert _answers(df, broker=svc.endpoint) == [b"X"]  # the argument beats them all
            with pytest.raises(PythonException, match="RequestTimeout"):
                _answers(df)  # and the local property really is used when there is none
        finally:
            context.setLocalProperty(BROKER_KEY, None)  # type: ignore[arg-type]
    finally:
        spark.conf.unset(BROKER_KEY)


def test_large_arrow_types(spark: SparkSession, rec: Services) -> None:
    key = "spark.sql.execution.arrow.useLargeVarTypes"
    old = spark.conf.get(key)
    spark.conf.set(key, "true")
    try:
        df = spark.createDataFrame([("a", b"b"), (None, b"c")], "s string, b binary")
        broker = rec.endpoint
        out = map_service(
            df, "svc", input_col="s", output_col="s2", output_type="string", broker=broker
        )
        out = map_service(out, "svc", input_col="b", output_col="b2", broker=broker)
        out = out.withColumn("c", service_column("b", "svc", output_type="string", broker=broker))
        assert [tuple(r) for r in out.collect()] == [
            ("a", b"b", "A", b"B", "B"),
            (None, b"c", None, b"C", "C"),
        ]
    finally:
        spark.conf.set(key, str(old))


def _start_worker(endpoint: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) if not path else os.pathsep.join([str(ROOT), path])
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "dcp", "worker", "--connect", endpoint, "--service", "slow",
             "tests.spark.services:slow_echo", "--concurrency", "8",
             "--heartbeat-interval", "0.2"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


def _wait(condition: str, check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {condition}")
        time.sleep(0.02)


def test_a_worker_killed_during_the_job(
    spark: SparkSession, small_batches: None, tmp_path: Path
) -> None:
    """Two worker processes; one is killed (SIGKILL) mid-job. The broker sees it go (silent
    or unreachable), gives its requests to the other, and the job completes with every row,
    in order."""
    n = 3000
    with services(concurrency=0, heartbeat_interval=0.2, liveness=3) as s:
        workers = [_start_worker(s.endpoint, tmp_path / f"worker{i}.log") for i in range(2)]
        killed: list[int] = []
        try:
            _wait("two workers registered", lambda: s.statistics().workers == 2)

            def kill_one() -> None:
                _wait("a third of the rows answered", lambda: s.statistics().replies >= n // 3)
                os.kill(workers[0].pid, signal.SIGKILL)
                killed.append(s.statistics().replies)

            killer = threading.Thread(target=kill_one, daemon=True)
            killer.start()
            df = spark.range(0, n, numPartitions=2).selectExpr("id", "cast(id as string) AS t")
            out = map_service(df, "slow", input_col="t", output_col="u", output_type="string",
                              window=16, timeout=5.0, broker=s.endpoint)  # fmt: skip
            rows = out.collect()
            killer.join(5)
        finally:
            for proc in workers:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(10)
        assert [r.u for r in rows] == [str(i) for i in range(n)]
        assert killed and killed[0] < n, "the worker was killed after the job had finished"
        stats = s.statistics()
        # The broker noticed the death either by its silence or by a send that found it
        # gone (ROUTER_MANDATORY), whichever came first; either way exactly once.
        unreachable = sum(
            n for reason, n in stats.rejections.items() if reason.startswith("worker_unreachable")
        )
        assert stats.expired_workers + unreachable == 1
        assert stats.redeliveries >= 1
        assert stats.workers == 1


MIB = 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_large_replies_memory_is_bounded_by_the_window(spark: SparkSession, rec: Services) -> None:
    """200 rows answered with 1 MiB each, in two tasks whose Arrow batches hold all their 100
    rows (200 MiB of replies): per task, never more than ``window`` requests unanswered, and
    the Python worker's peak memory grows by about ``window`` x reply size (the rule in
    docs/spark.md), where handing on whole batches grew it by about 330 MiB."""
    window, rows, size = 8, 200, MIB
    # Both executor slots' Python workers exist before the measured job, and it reuses them.
    warm = spark.range(0, 20, numPartitions=2).selectExpr("cast(id AS string) AS text")
    warm_out = map_service(warm, "svc", input_col="text", output_col="r", broker=rec.endpoint)
    assert warm_out.count() == 20
    df = spark.range(0, rows, numPartitions=2).selectExpr(
        "id", f"concat('big:{size}:', id) AS text"
    )
    out = map_service(df, "svc", input_col="text", output_col="reply", broker=rec.endpoint,
                      window=window)  # fmt: skip
    check = out.selectExpr(
        "count(*) AS n",
        f"count_if(length(reply) = {size} AND substring(reply, 1, length(text)) = "
        "cast(text AS binary)) AS good",
    )
    workers = python_workers()
    reset_peaks(list(workers))
    rec.recorder.clear()
    row = check.first()
    grown = {pid: memory(pid)["VmHWM"] - kb for pid, kb in workers.items()}
    assert row is not None and (row["n"], row["good"]) == (rows, rows)
    assert python_workers().keys() == workers.keys(), "a new Python worker: not measured"
    # One client per task, each with its window full but never more.
    in_flight = rec.recorder.client_max_in_flight
    assert len(in_flight) == 2 and all(1 < n <= window for n in in_flight.values()), in_flight
    # The tasks' workers grew (by at least one reply), and by about window x reply size.
    peak = max(grown.values()) * 1024
    assert size <= peak <= (window + 4) * size + 16 * MIB, grown
