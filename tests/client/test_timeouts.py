"""The timeout story from end to end (issue 15, item 2), with dcp's own client, broker and
worker on real sockets, both anyio backends: a call to a service nobody serves ends as
``NoWorkers`` within its timeout, its abandoned attempts do not run later, ``no_wait`` fails
at once, and a call to a port where no broker listens ends within its timeout."""

from __future__ import annotations

import socket

import anyio
import pytest

import dcp
from tests.helpers import wait_for

pytestmark = pytest.mark.anyio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_an_abandoned_call_ends_as_no_workers_and_never_runs_later() -> None:
    runs: list[bytes] = []

    async def job(request: dcp.HandlerRequest) -> bytes:
        runs.append(request.data[0])
        return b"done"

    async with dcp.Broker("tcp://127.0.0.1:0", heartbeat_interval=0.1) as broker:
        endpoint = broker.endpoints[0]
        # 3 s: the broker is asked 0.3 s before the end (10%), time for it to answer.
        async with dcp.Client(endpoint, timeout=3, retries=3, wait_for_worker=True) as client:
            started = anyio.current_time()
            with anyio.fail_after(30), pytest.raises(dcp.NoWorkers) as info:
                await client.request("later", b"abandoned")
            elapsed = anyio.current_time() - started
        assert elapsed >= 2.85  # at its timeout (fail_after above is the hang guard)
        assert "later" in str(info.value)
        # Its attempts replaced each other in the queue and expired there: a worker that
        # registers now runs nothing (before: it ran the abandoned job once per attempt).
        # The broker counts the deadline from its arrival there, a little after the client
        # counted it (on a loaded machine, tens of ms): wait for the broker's own count.
        stats = broker.statistics()
        assert stats.replaced >= 1
        await wait_for(lambda: broker.statistics().expired_in_queue == 1)
        async with dcp.Worker(endpoint, "later", job, heartbeat_interval=0.1):
            await anyio.sleep(0.5)
        assert runs == []
        assert broker.statistics().expired_in_queue == 1


async def test_no_wait_fails_at_once_against_a_real_broker() -> None:
    async with (
        dcp.Broker("tcp://127.0.0.1:0") as broker,
        dcp.Client(broker.endpoints[0], timeout=60, no_wait=True) as client,
    ):
        started = anyio.current_time()
        with pytest.raises(dcp.NoWorkers):
            await client.request("nobody", b"x")
        assert anyio.current_time() - started < 10  # a hang guard: at once, not in 60 s
        assert broker.statistics().rejections.get("no_workers") == 1


async def test_no_broker_listening_ends_within_the_timeout() -> None:
    async with dcp.Client(f"tcp://127.0.0.1:{free_port()}", timeout=1.0) as client:
        started = anyio.current_time()
        with pytest.raises(dcp.RequestTimeout):
            await client.request("echo", b"x")
        assert anyio.current_time() - started < 10  # a hang guard (10x the timeout)
