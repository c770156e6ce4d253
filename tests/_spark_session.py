"""One local Spark session for the whole test run (``spark`` fixture in ``conftest.py``).

local[2] on 127.0.0.1 only, quiet logs, a JVM tuned to start fast, executors running this
interpreter and importing this checkout's ``dcp``. :func:`stop_session` also ends the JVM
(pyspark leaves it running until the Python process exits), so no process outlives the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

__all__ = ["java_missing", "start_session", "stop_session"]

ROOT = Path(__file__).resolve().parent.parent

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


def start_session(work_dir: Path) -> SparkSession:
    """Start the session (``work_dir`` holds its log config and scratch space)."""
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
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop the session, then the JVM (by its process, which pyspark started for us)."""
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
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
