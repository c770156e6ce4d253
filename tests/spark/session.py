"""One local Spark JVM for the whole test run, reached two ways (fixtures in ``conftest.py``):
a classic session, and a Spark Connect session.

local[2] on 127.0.0.1 only, quiet logs, a JVM tuned to start fast, executors running this
interpreter and importing this checkout's ``dcp``. The same JVM runs Spark Connect's server
(its plugin, as ``SparkSession.builder.remote("local[2]")`` does) on an ephemeral port of
127.0.0.1, with a random token; :func:`connect_session` is a Spark Connect client of it (the
pure-Python client: plans sent as protobuf over gRPC, functions pickled by the client), so
one server serves the whole run. :func:`stop_session` also ends the JVM (pyspark leaves it
running until the Python process exits), so no process outlives the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

__all__ = [
    "connect_missing",
    "connect_session",
    "is_connect",
    "java_missing",
    "memory",
    "python_workers",
    "reset_peaks",
    "start_session",
    "stop_session",
]

ROOT = Path(__file__).resolve().parents[2]

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def java_missing() -> str | None:
    """Why Spark cannot start here, or ``None``."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").exists():
        return None
    if shutil.which("java"):
        return None
    return "Java is missing: pyspark needs a JRE 17+ (java on PATH or JAVA_HOME)"


def connect_missing() -> str | None:
    """Why a Spark Connect client cannot run here, or ``None``."""
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as exc:
        return (
            f"Spark Connect's client needs pyspark's connect extra ({exc}); install it with: "
            "pip install 'dagbox-dcp[spark-connect]'"
        )
    return None


def is_connect(spark: SparkSession) -> bool:
    """A Spark Connect session (not a classic one)?"""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def environment() -> dict[str, str]:
    """Environment for the driver's JVM and, through it, the Python executors."""
    path = os.environ.get("PYTHONPATH")
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # The executors must import this checkout's dcp, whatever is installed.
        "PYTHONPATH": str(ROOT) if not path else os.pathsep.join([str(ROOT), path]),
    }


#: The Spark Connect server's token (a client must send it).
TOKEN = str(uuid.uuid4())


def start_session(work_dir: Path) -> SparkSession:
    """Start the classic session, with the Spark Connect server in its JVM (``work_dir``
    holds its log config and scratch space)."""
    log4j = work_dir / "log4j2.properties"
    log4j.write_text(_LOG4J)
    java_options = (
        f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dlog4j2.configurationFile=file:{log4j}"
    )
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("dcp-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .config("spark.local.dir", str(work_dir))
        # Spark Connect's server, as pyspark's own local mode starts it, but on 127.0.0.1,
        # on a port of its own (0: ephemeral) and with a token.
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.address", "127.0.0.1")
        .config("spark.connect.grpc.binding.port", "0")
        .config("spark.connect.authenticate.token", TOKEN)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _gateway() -> Any:
    """pyspark's py4j gateway to the JVM it started for this process (``None`` before; pyspark
    has no public handle on it)."""
    return SparkContext._gateway


def connect_session(spark: SparkSession) -> SparkSession:
    """A Spark Connect client session of the server in ``spark``'s JVM.

    ``localhost`` (127.0.0.1), not the address: pyspark sends a token over a plain local
    channel only to ``localhost`` (to any other host, only over TLS).
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    gateway = _gateway()
    assert gateway is not None, "the classic session of this process"
    service = getattr(gateway.jvm, "org.apache.spark.sql.connect.service.SparkConnectService$")
    port = int(getattr(service, "MODULE$").localPort())
    url = f"sc://localhost:{port}/;token={TOKEN}"
    session: SparkSession = ConnectSession.builder.remote(url).getOrCreate()  # type: ignore[assignment]
    return session


def python_workers() -> dict[int, int]:
    """Spark's Python processes (the daemon and its forked workers, all below the JVM) and
    their resident memory (kB)."""
    gateway = _gateway()
    assert gateway is not None, "the classic session of this process"
    found: dict[int, int] = {}
    pending = [int(gateway.proc.pid)]
    while pending:
        pid = pending.pop()
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                python = b"python" in f.read().split(b"\0")[0]
            if python:
                found[pid] = memory(pid)["VmRSS"]
        except (OSError, KeyError):  # it exited meanwhile
            continue
    return found


def memory(pid: int) -> dict[str, int]:
    """The ``Vm*`` lines of ``/proc/<pid>/status``, in kB."""
    with open(f"/proc/{pid}/status") as f:
        return {
            key: int(value.split()[0])
            for key, _, value in (line.partition(":") for line in f)
            if key.startswith("Vm")
        }


def reset_peaks(pids: list[int]) -> None:
    """Reset each process's peak resident memory (``VmHWM``) to its current one."""
    for pid in pids:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")


def stop_session(spark: SparkSession) -> None:
    """Stop the session, then the JVM (by its process, which pyspark started for us)."""
    spark.stop()
    gateway = _gateway()
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    gateway.shutdown()
    # A later session launches a JVM of its own (pyspark launches one while these are None).
    SparkContext._gateway = None  # see _gateway
    SparkContext._jvm = None  # see _gateway
    if proc is None:
        return
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the JVM exits when its stdin closes
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
