"""``dcp.spark`` against the same synchronous client loop outside Spark, on a classic session
and over Spark Connect: rows/s, same service, same machine, same number of concurrent
request streams.

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
- **Spark Connect**: the same job, from a Spark Connect client session of a Connect server
  running in the same JVM as the classic session (its plugin, on 127.0.0.1): the same
  executors and cores, the plan sent over gRPC and run by the server. The rate includes the
  plan's round trips.

The three sides take turns (the order rotates between rounds). Figures are medians over
rounds; ratios are medians of same-round ratios. The machine's two
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
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import busy_seconds, cpu_seconds
from .procs import ROOT, Procs
from .sections import put_section

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "Measure",
    "connect_session",
    "local_session",
    "loop_rate",
    "main",
    "render_section",
    "spark_rate",
    "start_services",
    "summarise",
]

#: The figure issue 6 asks for: dcp.spark rows/s at least this fraction of the loop's.
TARGET = 0.9
#: The measured sides, in the order of the first round.
SIDES = ("loop", "spark", "connect")


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
            # It exits once it has printed its result (killing it then could cut short what
            # it writes on exit, e.g. coverage data); a stuck one is killed.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
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
    """``map_service`` over ``rows`` payloads in ``streams`` partitions, checked in the job.

    ``spark`` is the classic session this process started, or a Spark Connect session of
    the Connect server in its JVM (:func:`connect_session`).
    """
    from pyspark import SparkContext

    from dcp.spark import map_service

    gateway = SparkContext._gateway
    assert gateway is not None, "the classic (local) session of this process"
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


#: The token of the Spark Connect server in :func:`local_session`'s JVM.
_TOKEN = str(uuid.uuid4())


@contextlib.contextmanager
def local_session(work_dir: Path) -> Iterator[SparkSession]:
    """A local[2] session on 127.0.0.1 (quiet, fast JVM start), with a Spark Connect server
    in its JVM (127.0.0.1, an ephemeral port, a token); the JVM ends with it."""
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
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.address", "127.0.0.1")
        .config("spark.connect.grpc.binding.port", "0")
        .config("spark.connect.authenticate.token", _TOKEN)
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


@contextlib.contextmanager
def connect_session(spark: SparkSession) -> Iterator[SparkSession]:
    """A Spark Connect client session of the Connect server in ``spark``'s JVM (from
    :func:`local_session`). ``localhost``: pyspark sends a token without TLS only there."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    service = getattr(spark._jvm, "org.apache.spark.sql.connect.service.SparkConnectService$")
    port = int(getattr(service, "MODULE$").localPort())
    url = f"sc://localhost:{port}/;token={_TOKEN}"
    session: SparkSession = ConnectSession.builder.remote(url).getOrCreate()  # type: ignore[assignment]
    try:
        yield session
    finally:
        session.stop()


# --------------------------------------------------------------------- rounds and page


def run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    streams_list = [1, 2]
    records: list[dict[str, Any]] = []
    with (
        Procs(log_dir) as procs,
        local_session(log_dir) as spark,
        connect_session(spark) as connect,
    ):
        endpoint = start_services(procs)
        pids = [p.pid for p in procs.procs]
        options: dict[str, Any] = {"window": args.window, "size": args.payload}
        sessions = {"spark": spark, "connect": connect}
        # Warm-up: start the Python workers of both executor slots (classic and Connect
        # sessions have their own), import everything.
        for session in sessions.values():
            spark_rate(session, endpoint, rows=2000, streams=2, **options)
        for r in range(args.rounds):
            for streams in streams_list:
                turn = (r + streams) % len(SIDES)
                for side in SIDES[turn:] + SIDES[:turn]:
                    if side == "loop":
                        m = loop_rate(endpoint, rows=args.rows, streams=streams,
                                      service_pids=pids, **options)  # fmt: skip
                    else:
                        m = spark_rate(sessions[side], endpoint, rows=args.rows,
                                       streams=streams, service_pids=pids,
                                       **options)  # fmt: skip
                    rec = {"round": r, "streams": streams, "side": side, **asdict(m),
                           "rate": m.rate, "side_us_per_row": m.side_us_per_row}  # fmt: skip
                    records.append(rec)
                    print(
                        f"round {r + 1}/{args.rounds}  streams {streams}  {side:7}  "
                        f"{m.rate:9,.0f} rows/s  ({m.rows:,} rows in {m.seconds:.2f} s, "
                        f"{m.errors} errors; side CPU {m.side_us_per_row:.1f} us/row, "
                        f"other load {m.other_load:.2f} CPUs)",
                        flush=True,
                    )
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return {"records": records, "settings": settings, "machine": _machine(), "when": _now()}


Sides = dict[str, dict[int, dict[str, Any]]]


def _ratios(sides: Sides, top: str, bottom: str) -> list[float]:
    """Same-round ratios of the rates of two sides."""
    a, b = sides[top], sides[bottom]
    return [a[k]["rate"] / b[k]["rate"] for k in b if k in a]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stream count: median rates and CPU per row of each side, median same-round ratios
    (``ratio``: classic / loop; ``connect_ratio``: Connect / loop; ``connect_classic``:
    Connect / classic), errors. Records without a Connect side (older runs) give ``None``
    for the Connect figures."""
    rows = []
    for streams in sorted({r["streams"] for r in records}):
        mine = [r for r in records if r["streams"] == streams]
        sides: Sides = {s: {r["round"]: r for r in mine if r["side"] == s} for s in SIDES}
        figures: dict[str, Any] = {"streams": streams}
        for side in SIDES:
            figures[side] = _median([r["rate"] for r in sides[side].values()])
            cpu = [r["side_us_per_row"] for r in sides[side].values()]
            figures[f"{side}_cpu"] = _median(cpu)
        for key, rounds, top, bottom in (
            ("ratio", "ratios", "spark", "loop"),
            ("connect_ratio", "connect_ratios", "connect", "loop"),
            ("connect_classic", "connect_classic_ratios", "connect", "spark"),
        ):
            figures[rounds] = _ratios(sides, top, bottom)
            figures[key] = _median(figures[rounds])
        figures["other_load"] = max(r["other_load"] for r in mine)
        figures["other_load_median"] = statistics.median(r["other_load"] for r in mine)
        figures["errors"] = sum(r["errors"] for r in mine)
        rows.append(figures)
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


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def _ratio(value: float | None, rounds: Sequence[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x (rounds: {', '.join(f'{x:.2f}' for x in rounds)})"


def render_section(results: dict[str, Any], command: str) -> str:
    """The ``spark`` section of ``docs/performance.md``."""
    settings = results["settings"]
    lines = [
        "## dcp.spark against the synchronous client loop, classic and over Spark Connect",
        "",
        "Rows per second through `dcp.spark.map_service` (Spark local mode) on a classic",
        "session and over Spark Connect, and through a plain `dcp.SyncClient.map` loop",
        "outside Spark: the same `dcp broker`, the same echo service (one process, 4 worker",
        "sockets), the same machine, the same number of request streams, in the same run.",
        "Made with:",
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
        "- *classic*: one local[2] SparkSession, a DataFrame of the same payloads in S",
        "  partitions (S tasks at once, each one socket with W requests in flight),",
        "  `map_service(...)` and the check of every reply in one action; rate = rows / wall",
        "  time of that action, job scheduling and the JVM <-> Python Arrow transfer included",
        "  (session start and Python worker start excluded, as the loop processes' start is).",
        "- *Connect*: the same job from a Spark Connect client session; the Connect server runs",
        '  in the classic session\'s JVM (its plugin, as `builder.remote("local[2]")` starts',
        "  it), so both run on the same executors; the plan goes over gRPC, and the rate",
        "  includes its round trips.",
        "",
        "The sides take turns, the order rotating between rounds; figures are medians over",
        "rounds, ratios medians of same-round ratios.",
        "",
        "| streams S | loop rows/s | classic rows/s | Connect rows/s | classic / loop | "
        f"target >= {TARGET}x | Connect / loop | Connect / classic | "
        "CPU us/row: loop / classic / Connect | rows without the expected reply | "
        "other load (CPUs, median / max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summarise(results["records"]):
        verdict = "**met**" if row["ratio"] >= TARGET else "**not met**"
        cpu = " / ".join(_figure(row[k], ".1f") for k in ("loop_cpu", "spark_cpu", "connect_cpu"))
        lines.append(
            f"| {row['streams']} | {_figure(row['loop'], ',.0f')} | "
            f"{_figure(row['spark'], ',.0f')} | {_figure(row['connect'], ',.0f')} | "
            f"{_ratio(row['ratio'], row['ratios'])} | {verdict} | "
            f"{_ratio(row['connect_ratio'], row['connect_ratios'])} | "
            f"{_ratio(row['connect_classic'], row['connect_classic_ratios'])} | {cpu} | "
            f"{row['errors']} | {row['other_load_median']:.2f} / {row['other_load']:.2f} |"
        )
    lines += [
        "",
        "*CPU us/row*: CPU of the measured side per row: the loop processes (during their",
        "loops), or the Spark JVM and its Python workers (during the action; for Connect the",
        "client's own CPU, in the benchmark process, is not counted: it only sends the plan",
        "and reads one row). *Other load*: work done meanwhile by processes other than the",
        "broker, the echo worker, the measured side and the benchmark itself (`/proc/stat`);",
        "above ~0.25 CPU on this 2-CPU machine the rates are skewed, and single-round ratios",
        "swing widely: read the medians, and the CPU per row, which the other load disturbs",
        "much less.",
        "",
        "The broker is the bottleneck on all sides (about 100 us of broker CPU per request,",
        "see above), and the two cores are shared by the broker, the echo worker and the",
        "measured side; Spark's own work (the JVM's scan, the Arrow transfer to the Python",
        "worker and back, the check) takes CPU from the same two cores. Over Connect the",
        "per-row work is the classic session's: the same executors run the same Python",
        "function; what Connect adds is per job (the plan's gRPC round trips), not per row.",
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
            f"streams {row['streams']}: loop {_figure(row['loop'], ',.0f')} rows/s, classic "
            f"{_figure(row['spark'], ',.0f')} rows/s, Connect "
            f"{_figure(row['connect'], ',.0f')} rows/s; classic / loop {row['ratio']:.2f}x "
            f"(target {TARGET}x), Connect / loop {_figure(row['connect_ratio'], '.2f')}, "
            f"Connect / classic {_figure(row['connect_classic'], '.2f')}; errors "
            f"{row['errors']}"
        )
    if not args.no_page:
        page: Path = args.page
        text = page.read_text() if page.exists() else "# Performance\n"
        page.write_text(put_section(text, "spark", render_section(results, command)))
        print(f"wrote the spark section of {page}", file=sys.stderr)


if __name__ == "__main__":
    main()
