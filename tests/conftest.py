from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.cli.procs import Proc


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on both anyio backends."""
    return str(request.param)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts (``_cli_procs.start``); each is killed by its PID at the end,
    whatever happened."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (soaks, long chaos runs) run only when ``-m`` names them."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: a long run; select it with `pytest -m slow`")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark_classic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local[2] SparkSession for the whole run, whose JVM also runs the Spark Connect
    server (see ``_spark_session.py``); skipped only when Java is missing. Stopped, JVM
    included, at the end of the run."""
    from tests.spark.session import environment, java_missing, start_session, stop_session

    reason = java_missing()
    if reason:
        pytest.skip(reason)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment().items():
            patch.setenv(name, value)
        session = start_session(tmp_path_factory.mktemp("spark"))
        try:
            yield session
        finally:
            stop_session(session)


@pytest.fixture(scope="session")
def spark_connect(spark_classic: SparkSession) -> Iterator[SparkSession]:
    """A Spark Connect session of the same JVM's Connect server, for the whole run; skipped
    only when pyspark's connect extra (grpcio, ...) is missing."""
    from tests.spark.session import connect_missing, connect_session

    reason = connect_missing()
    if reason:
        pytest.skip(reason)
    session = connect_session(spark_classic)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(params=["classic", "connect"])
def spark(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> SparkSession:
    """Each test that takes ``spark`` runs twice: on the classic session and over Spark
    Connect (the shared sessions above).

    pyspark picks classic or Connect objects for ``functions``, UDFs and
    ``SparkSession.getActiveSession()`` by one process-wide switch, which
    ``builder.remote(...)`` sets: the environment variable ``SPARK_CONNECT_MODE_ENABLED``.
    It is set for the Connect runs only, as it would be in a Connect client's process.
    """
    if request.param == "classic":
        monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
        session: SparkSession = request.getfixturevalue("spark_classic")
        return session
    session = request.getfixturevalue("spark_connect")
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return session
