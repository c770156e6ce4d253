from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on both anyio backends."""
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (soaks, long chaos runs) run only when ``-m`` names them."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: a long run; select it with `pytest -m slow`")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local[2] SparkSession for the whole run (see ``_spark_session.py``); skipped only
    when Java is missing. Stopped, JVM included, at the end of the run."""
    from _spark_session import environment, java_missing, start_session, stop_session

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
