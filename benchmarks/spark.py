"""``dcp.spark`` against the same synchronous client loop outside Spark: rows/s, same service,
same machine, same number of concurrent request streams.

``python -m benchmarks.spark [--rows 100000] [--rounds 3] [--window 64] [--payload 16]
[--tiny] [--page docs/performance.md | --no-page] [--json FILE] [--render FILE]``

Everything runs on 127.0.0.1: ``dcp broker`` (trio) and one echo-worker process with 4 DCP
worker sockets (:mod:`benchmarks.echo_worker`); both are killed by PID at the end. Then, for
``S`` = 1 and 2 concurrent streams, in every round (the order alternates between rounds):

- **loop**: ``S`` processes, each a :class:`dcp.SyncClient` running
  ``for reply in client.map("echo", payloads, window=W)`` over ``rows / S`` payloads built
  beforehand, each reply checked. They warm up (200 requests), wait for a common start
  signal, and report when their loop started and ended; rate = rows / (last end - first
  start).
- **dcp.spark**: one local[2] SparkSession (started once; one warm-up job), a DataFrame of
  ``rows`` payloads (``lpad(id, payload)``, the same bytes) in ``S`` partitions, so ``S``
  tasks, each one stream of ``W`` requests in flight; ``map_service(df, "echo", window=W)``
  and, in the same action, the count of rows and of rows whose reply differs from the
  payload. Rate = rows / wall time of that action: job scheduling, the JVM <-> Python Arrow
  transfer and the check are included, the session start and the Python workers' start are
  not (as the loop processes' start is not).

Figures are medians over rounds; ratios are medians of same-round ratios. The machine's two
cores are shared by the broker, the workers and the measured side, so both sides compete
with the same broker for CPU. Without ``--no-page`` (and not in ``--tiny`` mode) the figures
are written into ``docs/performance.md`` as its ``spark`` section
(:mod:`benchmarks.sections`) and the raw records into ``docs/perf/spark.json``;
``--render docs/perf/spark.json`` rewrites the section from them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import busy_seconds, cpu_seconds
from .procs import ROOT, Procs
from .sections import put_section

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Measure", "loop_rate", "main", "render_section", "spark_rate", "start_services"]

#: The figure issue 6 asks for: dcp.spark rows/s at least this fraction of the loop's.
TARGET = 0.9


@dataclass(frozen=True)
class Measure:
    """One measured run."""

    rows: int
    seconds: float
    #: Rows without the expected reply (error, timeout or wrong bytes).
    errors: int
    #: CPU seconds of the measured side: the loop processes, or the Spark JVM and its
    #: Python workers.
    side_cpu: float = 0.0
    #: CPUs' worth of work done meanwhile by processes other than ours (``/proc/stat``).
    other_load: float = 0.0

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def side_us_per_row(self) -> float:
        return self.side_cpu / self.rows * 1e6 if self.rows else 0.0


class _Machine:
    """The CPU spent by the machine and by the service processes, around one run."""

    def __init__(self, service_pids: Sequence[int]) -> None:
        self._pids = service_pids
        self._start = (busy_seconds(), self._ours(), time.monotonic())

    def _ours(self) -> float:
        own = os.times()
        return own.user + own.system + sum(_cpu(pid) for pid in self._pids)

    def other_load(self, side_cpu: float) -> float:
        """CPUs' worth of work by other processes since this object was made."""
        busy, ours, start = self._start
        elapsed = time.monotonic() - start
        other = (busy_seconds() - busy) - (self._ours() - ours) - side_cpu
        return max(0.0, other / elapsed) if elapsed > 0 else 0.0


def _cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except (OSError, ValueError, IndexError):
        return 0.0  # it exited


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children of any of its threads)."""
    found = [pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = f.read().split()
        except OSError:
            continue
        for child in children:
            found += _descendants(int(child))
    return found


def payload(i: int, size: int) -> bytes:
    """Row ``i``'s payload: its number, zero-padded to ``size`` bytes (Spark's ``lpad``)."""
    return str(i).rjust(size, "0")[-size:].encode()


# --------------------------------------------------------------------- the services


def start_services(procs: Procs, *, timeout: float = 30.0) -> str:
    """``dcp broker`` and a 4-socket DCP echo worker; returns the broker's endpoint."""
    broker = procs.start("broker", "dcp", "broker", "--bind", "tcp://127.0.0.1:0")
    [endpoint] = broker.wait_ready(timeout)
    worker = procs.start(
        "echo", "benchmarks.echo_worker", "--proto", "dcp", "--endpoint", endpoint,
        "--sockets", "4",
    )  # fmt: skip
    worker.wait_ready(timeout)
    return endpoint


# --------------------------------------------------------------------- the plain loop


def _loop_child(endpoint: str, first: int, rows: int, window: int, size: int) -> None:
    """One loop process: warm up, say READY, wait for ``go`` on stdin, measure, print JSON."""
    from dcp import SyncClient

    payloads = [payload(i, size) for i in range(first, first + rows)]
    with SyncClient(endpoint, timeout=10.0) as client:
        for _ in client.map("echo", [b"warm-up"] * 200, window=window):
            pass
        print("READY", flush=True)
        sys.stdin.readline()
        errors = 0
        start, cpu = time.time(), time.process_time()
        replies = client.map("echo", payloads, window=window)
        for sent, reply in zip(payloads, replies, strict=True):
            if reply.data != (sent,):
                errors += 1
        end, cpu = time.time(), time.process_time() - cpu
    result = {"start": start, "end": end, "cpu": cpu, "rows": rows, "errors": errors}
    print(json.dumps(result), flush=True)


def _read_line(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"loop process {proc.pid}: no output in time")
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if readable:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"loop process {proc.pid} exited ({proc.wait(5)})")
            return line.strip()


def loop_rate(
    endpoint: str,
    *,
    rows: int,
    streams: int,
    window: int,
    size: int,
    service_pids: Sequence[int] = (),
    timeout: float = 300.0,
) -> Measure:
    """``streams`` SyncClient processes sharing ``rows``, started together."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) if not path else os.pathsep.join([str(ROOT), path])
    share = rows // streams
    procs: list[subprocess.Popen[str]] = []
    deadline = time.monotonic() + timeout
    try:
        for k in range(streams):
            argv = [sys.executable, "-m", "benchmarks.spark", "--loop-child", endpoint,
                    str(k * share), str(share), str(window), str(size)]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=env,
                    text=True,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            )
        for proc in procs:
            if _read_line(proc, deadline) != "READY":
                raise RuntimeError(f"loop process {proc.pid}: no READY")
        machine = _Machine(service_pids)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(_read_line(proc, deadline)) for proc in procs]
        side_cpu = sum(float(r["cpu"]) for r in results)
        other = machine.other_load(side_cpu)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    return Measure(
        sum(int(r["rows"]) for r in results),
        seconds,
        sum(int(r["errors"]) for r in results),
        side_cpu,
        other,
    )


# --------------------------------------------------------------------- Spark


def spark_rate(
    spark: SparkSession,
    endpoint: str,
    *,
    rows: int,
    streams: int,
    window: int,
    size: int,
    service_pids: Sequence[int] = (),
) -> Measure:
    """``map_service`` over ``rows`` payloads in ``streams`` partitions, checked in the job."""
    from pyspark import SparkContext

    from dcp.spark import map_service

    gateway = SparkContext._gateway
    assert gateway is not None, "a classic (local) session started by this process"
    jvm: int = gateway.proc.pid

    df = spark.range(0, rows, numPartitions=streams).selectExpr(
        f"lpad(cast(id AS string), {size}, '0') AS payload"
    )
    out = map_service(df, "echo", input_col="payload", output_col="reply", broker=endpoint,
                      window=window, on_error="null")  # fmt: skip
    check = out.selectExpr(
        "count(*) AS n", "count_if(reply IS NULL OR reply != cast(payload AS binary)) AS bad"
    )
    side = {pid: _cpu(pid) for pid in _descendants(jvm)}
    machine = _Machine(service_pids)
    start = time.perf_counter()
    row = check.first()
    seconds = time.perf_counter() - start
    side_cpu = sum(_cpu(pid) - side.get(pid, 0.0) for pid in _descendants(jvm))
    other = machine.other_load(side_cpu)
    assert row is not None
    errors = int(row["bad"]) + rows - int(row["n"])
    return Measure(int(row["n"]), seconds, errors, side_cpu, other)


_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@contextlib.contextmanager
def local_session(work_dir: Path) -> Iterator[SparkSession]:
    """A local[2] session on 127.0.0.1 (quiet, fast JVM start); the JVM ends with it."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) if not path else os.pathsep.join([str(ROOT), path])
    log4j = work_dir / "log4j2.properties"
    log4j.write_text(_LOG4J)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("dcp-benchmark")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config(
            "spark.driver.extraJavaOptions",
            f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dlog4j2.configurationFile=file:{log4j}",
        )
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.local.dir", str(work_dir))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        if gateway is not None:
            gateway.shutdown()
            SparkContext._gateway = None
            SparkContext._jvm = None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the JVM exits when its stdin closes
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


# --------------------------------------------------------------------- rounds and page


def run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    streams_list = [1, 2]
    records: list[dict[str, Any]] = []
    with Procs(log_dir) as procs, local_session(log_dir) as spark:
        endpoint = start_services(procs)
        pids = [p.pid for p in procs.procs]
        options: dict[str, Any] = {"window": args.window, "size": args.payload}
        # Warm-up: start the Python workers of both executor slots, import everything.
        spark_rate(spark, endpoint, rows=2000, streams=2, **options)
        for r in range(args.rounds):
            for streams in streams_list:
                order = ["loop", "spark"] if (r + streams) % 2 == 0 else ["spark", "loop"]
                for side in order:
                    if side == "loop":
                        m = loop_rate(endpoint, rows=args.rows, streams=streams,
                                      service_pids=pids, **options)  # fmt: skip
                    else:
                        m = spark_rate(spark, endpoint, rows=args.rows, streams=streams,
                                       service_pids=pids, **options)  # fmt: skip
                    rec = {"round": r, "streams": streams, "side": side, **asdict(m),
                           "rate": m.rate, "side_us_per_row": m.side_us_per_row}  # fmt: skip
                    records.append(rec)
                    print(
                        f"round {r + 1}/{args.rounds}  streams {streams}  {side:5}  "
                        f"{m.rate:9,.0f} rows/s  ({m.rows:,} rows in {m.seconds:.2f} s, "
                        f"{m.errors} errors; side CPU {m.side_us_per_row:.1f} us/row, "
                        f"other load {m.other_load:.2f} CPUs)",
                        flush=True,
                    )
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return {"records": records, "settings": settings, "machine": _machine(), "when": _now()}


def summarise(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stream count: median rates and CPU per row, median same-round ratio, errors."""
    rows = []
    for streams in sorted({r["streams"] for r in records}):
        mine = [r for r in records if r["streams"] == streams]
        loop = {r["round"]: r for r in mine if r["side"] == "loop"}
        spark = {r["round"]: r for r in mine if r["side"] == "spark"}
        ratios = [spark[k]["rate"] / loop[k]["rate"] for k in loop if k in spark]
        rows.append(
            {
                "streams": streams,
                "loop": statistics.median(r["rate"] for r in loop.values()),
                "spark": statistics.median(r["rate"] for r in spark.values()),
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "loop_cpu": statistics.median(r["side_us_per_row"] for r in loop.values()),
                "spark_cpu": statistics.median(r["side_us_per_row"] for r in spark.values()),
                "other_load": max(r["other_load"] for r in mine),
                "other_load_median": statistics.median(r["other_load"] for r in mine),
                "errors": sum(r["errors"] for r in mine),
            }
        )
    return rows


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def _machine() -> str:
    import pyspark
    import zmq

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
        check=False,
    ).stdout.strip()  # fmt: skip
    return (
        f"{os.cpu_count()} CPUs, Linux {platform.release()}; Python {platform.python_version()}, "
        f"pyspark {pyspark.__version__}, pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}; "
        f"dcp commit {commit or 'unknown'}"
    )


def render_section(results: dict[str, Any], command: str) -> str:
    """The ``spark`` section of ``docs/performance.md``."""
    settings = results["settings"]
    lines = [
        "## dcp.spark against the synchronous client loop",
        "",
        "Rows per second through `dcp.spark.map_service` (Spark local mode) and through a plain",
        "`dcp.SyncClient.map` loop outside Spark: the same `dcp broker`, the same echo",
        "service (one process, 4 worker sockets), the same machine, the same number of",
        "request streams. Made with:",
        "",
        "```console",
        f"$ {command}",
        "```",
        "",
        f"{settings['rows']:,} rows of {settings['payload']} B, window {settings['window']} "
        f"per stream, {settings['rounds']} round(s), on {results['when']}. "
        f"{results['machine']}.",
        "",
        '- *loop*: S processes, each one SyncClient running `client.map("echo", payloads,',
        "  window=W)` over its share of the rows, started together; rate = rows / (last end -",
        "  first start).",
        "- *dcp.spark*: one local[2] SparkSession, a DataFrame of the same payloads in S",
        "  partitions (S tasks at once, each one socket with W requests in flight),",
        "  `map_service(...)` and the check of every reply in one action; rate = rows / wall",
        "  time of that action, job scheduling and the JVM <-> Python Arrow transfer included",
        "  (session start and Python worker start excluded, as the loop processes' start is).",
        "",
        "| streams S | loop rows/s | dcp.spark rows/s | dcp.spark / loop | "
        f"target >= {TARGET}x | loop CPU us/row | dcp.spark CPU us/row | "
        "rows without the expected reply | other load (CPUs, median / max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summarise(results["records"]):
        verdict = "**met**" if row["ratio"] >= TARGET else "**not met**"
        per_round = ", ".join(f"{x:.2f}" for x in row["ratios"])
        lines.append(
            f"| {row['streams']} | {row['loop']:,.0f} | {row['spark']:,.0f} | "
            f"{row['ratio']:.2f}x (rounds: {per_round}) | {verdict} | "
            f"{row['loop_cpu']:.1f} | {row['spark_cpu']:.1f} | {row['errors']} | "
            f"{row['other_load_median']:.2f} / {row['other_load']:.2f} |"
        )
    lines += [
        "",
        "*CPU us/row*: CPU of the measured side per row: the loop processes (during their",
        "loops), or the Spark JVM and its Python workers (during the action). *Other load*:",
        "work done meanwhile by processes other than the broker, the echo worker, the",
        "measured side and the benchmark itself (`/proc/stat`); above ~0.25 CPU on this",
        "2-CPU machine the rates are skewed, and single-round ratios swing widely: read the",
        "medians, and the CPU per row, which the other load disturbs much less.",
        "",
        "The broker is the bottleneck on both sides (about 100 us of broker CPU per request,",
        "see above), and the two cores are shared by the broker, the echo worker and the",
        "measured side; Spark's own work (the JVM's scan, the Arrow transfer to the Python",
        "worker and back, the check) takes CPU from the same two cores.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--loop-child"]:
        endpoint, first, rows, window, size = argv[1:6]
        _loop_child(endpoint, int(first), int(rows), int(window), int(size))
        return
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.spark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--payload", type=int, default=16, help="bytes per row")
    parser.add_argument("--tiny", action="store_true", help="2,000 rows, 1 round, no page")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--no-page", action="store_true", help="print only")
    parser.add_argument(
        "--json", type=Path, default=None,
        help="save the raw records here (default with a page: perf/spark.json beside it)",
    )  # fmt: skip
    parser.add_argument(
        "--render", type=Path, default=None, metavar="JSON", help="only rewrite the page "
        "section from the records a --json run saved"
    )  # fmt: skip
    args = parser.parse_args(argv)
    command = f"python -m benchmarks.spark --rows {args.rows} --rounds {args.rounds}"
    if (args.window, args.payload) != (64, 16):
        command += f" --window {args.window} --payload {args.payload}"
    if args.tiny:
        args.rows, args.rounds, args.no_page = 2000, 1, True
    if args.render is not None:  # the page section again, from a saved run
        results = json.loads(args.render.read_text())
        command = results["command"]
    else:
        with tempfile.TemporaryDirectory(prefix="dcp-bench-spark-") as tmp:
            results = run(args, Path(tmp))
        results["command"] = command
        if args.json is None and not args.no_page:
            args.json = args.page.parent / "perf" / "spark.json"
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    for row in summarise(results["records"]):
        print(
            f"streams {row['streams']}: loop {row['loop']:,.0f} rows/s, dcp.spark "
            f"{row['spark']:,.0f} rows/s, ratio {row['ratio']:.2f}x (target {TARGET}x), "
            f"CPU us/row loop {row['loop_cpu']:.1f} vs dcp.spark {row['spark_cpu']:.1f}, "
            f"errors {row['errors']}"
        )
    if not args.no_page:
        page: Path = args.page
        text = page.read_text() if page.exists() else "# Performance\n"
        page.write_text(put_section(text, "spark", render_section(results, command)))
        print(f"wrote the spark section of {page}", file=sys.stderr)


if __name__ == "__main__":
    main()
