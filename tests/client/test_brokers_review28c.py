"""Review of issue 28's client side: every broker down, cancellation, counts per broker
(real dcp.Brokers on tcp 127.0.0.1, both anyio backends)."""

from __future__ import annotations

import anyio
import pytest

import dcp
from tests.client.test_brokers import free_port, hang, start_broker
from tests.helpers import wait_for

pytestmark = pytest.mark.anyio


def counts(client: dcp.Client) -> list[int]:
    brokers = client._receiver.brokers
    assert brokers is not None
    return [info.outstanding for info in brokers.info()]


async def test_every_broker_down_a_request_times_out_at_its_deadline() -> None:
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    async with dcp.Client(endpoints, timeout=0.6) as client:
        start = anyio.current_time()
        with anyio.fail_after(5), pytest.raises(dcp.RequestTimeout):
            await client.request("echo", b"x")
        took = anyio.current_time() - start
        assert 0.5 <= took < 1.5
        brokers = client._receiver.brokers
        assert brokers is not None
        assert counts(client) == [0, 0] and len(brokers) == 0 and not brokers._parked


async def test_a_cancelled_parked_request_leaves_nothing_behind() -> None:
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    async with dcp.Client(endpoints, timeout=30) as client:
        with anyio.move_on_after(0.3):
            await client.request("echo", b"x")
        brokers = client._receiver.brokers
        assert brokers is not None
        assert counts(client) == [0, 0] and len(brokers) == 0 and not brokers._parked
        assert not client._receiver.waiters


async def test_a_request_on_a_lost_broker_with_none_left_times_out_at_its_deadline() -> None:
    endpoint_a = f"tcp://127.0.0.1:{free_port()}"
    endpoint_b = f"tcp://127.0.0.1:{free_port()}"  # never up
    async with dcp.Client([endpoint_a, endpoint_b], timeout=2, retries=0) as client:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                a, stop_a = await start_broker(tg, endpoint_a)
                worker = dcp.Worker(endpoint_a, "echo", hang)
                async with worker:
                    await wait_for(lambda: a.statistics().workers == 1)
                    failed: list[BaseException] = []
                    took: list[float] = []

                    async def one() -> None:
                        start = anyio.current_time()
                        try:
                            await client.request("echo", b"x")
                        except dcp.RequestTimeout as exc:
                            failed.append(exc)
                        took.append(anyio.current_time() - start)

                    tg.start_soon(one)
                    await wait_for(lambda: a.statistics().dispatched == 1)
                    stop_a.cancel()
                    await wait_for(lambda: bool(took))
                    worker.stop(grace=0)
        assert len(failed) == 1 and 1.9 <= took[0] < 3
        brokers = client._receiver.brokers
        assert brokers is not None
        assert counts(client) == [0, 0] and len(brokers) == 0 and not brokers._parked


async def test_a_subscription_with_a_broker_down_from_the_start_does_not_wait_for_it() -> None:
    down = f"tcp://127.0.0.1:{free_port()}"  # no broker ever listens there
    async with dcp.Broker("tcp://127.0.0.1:0") as a:
        endpoint_a = a.endpoints[0]
        async with (
            dcp.Client(endpoint_a) as pub,
            dcp.Client([endpoint_a, down]) as client,
        ):
            with anyio.fail_after(5):  # subscribing asks the live broker at once
                async with client.subscribe("t.>") as sub:
                    assert await pub.publish("t.a", b"x", ack=True) == 1
                    msg = await anext(sub)
            assert msg.data == (b"x",)
