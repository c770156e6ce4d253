"""The async client given several brokers (receive Rule RX6, :mod:`dcp._core.client.brokers`):
real :class:`dcp.Broker` s on tcp 127.0.0.1 port 0, real workers, both anyio backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

import dcp
from dcp._core.client.brokers import BrokerState
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import HELD_MARKER, Reply, Request
from tests.helpers import Peers, RawPeer, wait_for

pytestmark = pytest.mark.anyio

HB = 0.1  # the brokers' and workers' heartbeat (a stopped worker is noticed soon)


def fast_broker(endpoint: str = "tcp://127.0.0.1:0") -> dcp.Broker:
    return dcp.Broker(endpoint, heartbeat_interval=HB)


async def echo(request: dcp.HandlerRequest) -> bytes:
    return request.data[0]


@asynccontextmanager
async def brokers_with_workers(n: int = 2) -> AsyncIterator[list[dcp.Broker]]:
    """``n`` brokers, each with its own echo worker (registered before this yields)."""
    async with AsyncExitStack() as stack:
        brokers = [await stack.enter_async_context(fast_broker()) for _ in range(n)]
        for broker in brokers:
            worker = dcp.Worker(broker.endpoints[0], "echo", echo, heartbeat_interval=HB)
            await stack.enter_async_context(worker)
        for broker in brokers:
            await wait_for(lambda b=broker: b.statistics().workers == 1)  # type: ignore[misc]
        yield brokers


def live(client: dcp.Client) -> list[bool]:
    brokers = client._receiver.brokers
    assert brokers is not None
    return [info.state is BrokerState.LIVE for info in brokers.info()]


async def test_one_endpoint_or_a_list_of_one_takes_the_path_of_old() -> None:
    async with fast_broker() as broker:
        async with dcp.Worker(broker.endpoints[0], "echo", echo, heartbeat_interval=HB):
            for endpoint in (broker.endpoints[0], broker.endpoints):
                async with dcp.Client(endpoint) as client:
                    assert client._receiver.brokers is None
                    assert client.endpoints == (broker.endpoints[0],)
                    assert (await client.request("echo", b"x", wait_for_worker=True)).data == (
                        b"x",
                    )


def test_a_bad_list_is_refused_before_any_socket() -> None:
    with pytest.raises(ValueError, match="empty list"):
        dcp.Client([])
    with pytest.raises(ValueError, match="given twice"):
        dcp.Client(["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"])
    with pytest.raises(ValueError, match="tcp://\\*:5555"):
        dcp.Client(["tcp://127.0.0.1:5555", "tcp://*:5555"])
    with pytest.raises(ValueError, match="failover_grace"):
        dcp.Client("tcp://127.0.0.1:5555", failover_grace=-1.0)


async def test_requests_spread_over_two_brokers() -> None:
    async with brokers_with_workers() as (a, b):
        endpoints = [a.endpoints[0], b.endpoints[0]]
        async with dcp.Client(endpoints) as client:
            assert client.endpoint == endpoints[0]
            assert client.endpoints == tuple(endpoints)
            await wait_for(lambda: all(live(client)))
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(client.request, "echo", b"%d" % i)
            replies = [r.data async for r in client.map("echo", [b"%d" % i for i in range(40)])]
            assert replies == [(b"%d" % i,) for i in range(40)]
            stats = client.statistics()
            assert (stats.replies, stats.retries, stats.pending) == (80, 0, 0)
        # Both carried traffic.
        assert a.statistics().requests > 0 and b.statistics().requests > 0
        assert a.statistics().requests + b.statistics().requests == 80
