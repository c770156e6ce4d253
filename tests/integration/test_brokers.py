"""The async client and a dcp.Worker both given two brokers (needs worker28's Worker)."""

from __future__ import annotations

import anyio
import pytest

import dcp
from tests.client.test_brokers import free_port, live, start_broker
from tests.helpers import wait_for

pytestmark = pytest.mark.anyio


async def test_a_request_held_by_a_worker_of_both_brokers_runs_once_through_the_other() -> None:
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    runs: list[bytes] = []
    release = anyio.Event()

    async def slow(request: dcp.HandlerRequest) -> bytes:
        runs.append(request.data[0])
        await release.wait()
        return request.data[0].upper()

    outcome: list[dcp.Response] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            _, stop_b = await start_broker(tg, endpoints[1])
            _, stop_a = await start_broker(tg, endpoints[0])
            async with (
                dcp.Worker(endpoints, "slow", slow, concurrency=4),
                dcp.Client(endpoints, attempt_timeout=30, timeout=60) as client,
            ):
                await wait_for(lambda: all(live(client)))

                async def call() -> None:
                    outcome.append(await client.request("slow", b"x"))

                tg.start_soon(call)
                await wait_for(lambda: runs)
                brokers = client._receiver.brokers
                assert brokers is not None
                held_at = brokers.where(next(iter(brokers._where)))
                (stop_a if held_at == 0 else stop_b).cancel()
                await wait_for(lambda: brokers.held == 1)
                await anyio.sleep(3 * brokers.grace)  # past the grace: not moved
                assert brokers.moved == 0
                release.set()
                await wait_for(lambda: outcome)
                assert outcome[0].data == (b"X",)
                assert runs == [b"x"]
                assert client.statistics().retries == 0
                (stop_b if held_at == 0 else stop_a).cancel()
