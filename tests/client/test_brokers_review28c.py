"""Review of issue 28's client side: every broker down, cancellation, counts per broker
(real dcp.Brokers on tcp 127.0.0.1, both anyio backends)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import pytest
import zmq

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


@pytest.mark.parametrize("several", [False, True])
async def test_a_stream_timed_out_is_cancelled_at_its_worker(several: bool) -> None:
    """Streams Rule CS4: a stream that timed out locally is cancelled at its worker, with
    one broker or several (the CANCEL goes to the stream's broker)."""
    cancelled = anyio.Event()

    async def stall(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        try:
            yield b"one"
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    async with dcp.Broker("tcp://127.0.0.1:0") as a, dcp.Broker("tcp://127.0.0.1:0") as b:
        endpoints = [a.endpoints[0], b.endpoints[0]]
        async with (
            dcp.Worker(endpoints, "stall", stall),
            dcp.Client(endpoints if several else endpoints[0], timeout=0.5) as client,
        ):
            await wait_for(lambda: a.statistics().workers == 1 and b.statistics().workers == 1)
            got: list[tuple[bytes, ...]] = []
            with pytest.raises(dcp.RequestTimeout):
                async with client.stream("stall") as parts:
                    async for part in parts:
                        got.append(part)
            assert got == [(b"one",)]
            with anyio.fail_after(5):
                await cancelled.wait()


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("several", [False, True])
async def test_a_sync_stream_timed_out_or_left_is_cancelled_at_its_worker(
    several: bool, early: bool
) -> None:
    """Streams Rule CS4 for the blocking client: a stream that timed out, or was left early,
    is cancelled at its worker; with several brokers the CANCEL goes to the stream's broker,
    not the home broker."""
    cancelled = anyio.Event()

    async def stall(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        try:
            yield b"one"
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    async with dcp.Broker("tcp://127.0.0.1:0") as a, dcp.Broker("tcp://127.0.0.1:0") as b:
        endpoints = [a.endpoints[0], b.endpoints[0]]
        # The worker is only at the second broker: the stream cannot start at the home one.
        async with dcp.Worker(endpoints[1], "stall", stall):
            await wait_for(lambda: b.statistics().workers == 1)

            def read() -> list[tuple[bytes, ...]]:
                got: list[tuple[bytes, ...]] = []
                with dcp.SyncClient(endpoints if several else endpoints[1], timeout=0.5) as c:
                    if several:
                        c.services()  # both brokers live (their first handshakes)
                        # The least outstanding, round-robin: use up the first broker's turn.
                        c.request("mmi.services", wait_for_worker=True, retries=0)
                    if early:
                        with c.stream("stall") as parts:
                            got.append(next(parts))
                    else:
                        with pytest.raises(dcp.RequestTimeout), c.stream("stall") as parts:
                            got.extend(parts)
                return got

            assert await anyio.to_thread.run_sync(read) == [(b"one",)]
            with anyio.fail_after(5):
                await cancelled.wait()


async def test_a_publish_with_every_broker_down_does_not_block_for_ever() -> None:
    """A publish without ack is at most once: with one broker down it is queued and returns
    at once; with every broker of several down it must not wait for one to come back
    (the blocking client drops it, Rule SM3)."""
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    async with dcp.Client(endpoints[0]) as one:
        with anyio.fail_after(2):
            assert await one.publish("t.a", b"x") is None
    async with dcp.Client(endpoints) as client:
        with anyio.fail_after(3):
            assert await client.publish("t.a", b"x") is None


def test_a_sync_publish_with_every_broker_down_returns() -> None:
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    with dcp.SyncClient(endpoints) as client:
        assert client.publish("t.a", b"x") is None


async def test_a_sync_publish_just_after_making_the_client_is_not_dropped() -> None:
    """One broker: a publish right after the client is made is queued and delivered; with
    several it goes through the first live broker once it connected (not dropped)."""
    down = f"tcp://127.0.0.1:{free_port()}"
    async with dcp.Broker("tcp://127.0.0.1:0") as a:
        endpoint = a.endpoints[0]
        async with dcp.Client(endpoint) as sub_client, sub_client.subscribe("t.>") as sub:

            def publish() -> None:
                with dcp.SyncClient([endpoint, down]) as client:
                    client.publish("t.a", b"x")
                    client.request("mmi.services", wait_for_worker=True, retries=0)

            await anyio.to_thread.run_sync(publish)
            with anyio.fail_after(3):
                msg = await anext(sub)
            assert msg.data == (b"x",)


async def test_a_question_to_a_broker_not_live_fails_at_once_in_both_clients() -> None:
    """A request asked of one broker (receive Rule RX6, sync Rule SM4) whose broker is not
    live ends at once with ``broker_lost``, in the async client and the blocking one."""
    down = f"tcp://127.0.0.1:{free_port()}"
    async with dcp.Broker("tcp://127.0.0.1:0") as a:
        endpoints = [a.endpoints[0], down]
        async with dcp.Client(endpoints, timeout=5) as client:
            timing = client._tracker.timing(5, None, 0)
            with anyio.fail_after(2), pytest.raises(dcp.RemoteError, match="broker_lost"):
                await client._receiver.ask_at(1, b"mmi.services", (), (), timing)

        def sync() -> None:
            with dcp.SyncClient(endpoints, timeout=5) as client:
                receiver = client._receiver
                receiver.settle()  # type: ignore[attr-defined]
                receiver.pin = 1  # type: ignore[attr-defined]
                start = time.monotonic()
                try:
                    with pytest.raises(dcp.RemoteError, match="broker_lost"):
                        client.request("mmi.services", retries=0)
                finally:
                    receiver.pin = None  # type: ignore[attr-defined]
                assert time.monotonic() - start < 2

        await anyio.to_thread.run_sync(sync)


async def test_a_subscription_refused_by_a_live_broker_is_asked_there_again() -> None:
    """Pubsub Rule CP5: a subscription subscribes at every live broker; one whose SUB went
    unanswered (a live broker, busy) is asked again at a later refresh, not left out for
    good."""
    # Live (its handshakes succeed) but never answers.
    fake: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    fake.linger = 0
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    subs = 0
    try:
        async with dcp.Broker("tcp://127.0.0.1:0") as a:
            endpoints = [a.endpoints[0], f"tcp://127.0.0.1:{port}"]
            async with (
                dcp.Client(endpoints, timeout=0.5) as client,
                client.subscribe("t.>", refresh=0.2),
            ):
                with anyio.move_on_after(4):
                    while subs < 2:
                        while fake.poll(0):
                            frames = fake.recv_multipart()
                            subs += any(f == b"\xffDCP:sub" for f in frames)
                        await anyio.sleep(0.05)
    finally:
        fake.close(0)
    assert subs >= 2


def test_a_sync_subscription_refused_by_a_live_broker_is_asked_there_again() -> None:
    """Pubsub Rule CP5 for the blocking client (as the async one)."""
    # Live (its handshakes succeed) but never answers.
    fake: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    fake.linger = 0
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    subs = 0

    async def main() -> None:
        async with dcp.Broker("tcp://127.0.0.1:0") as a:
            endpoints = [a.endpoints[0], f"tcp://127.0.0.1:{port}"]

            def sync() -> None:
                with dcp.SyncClient(endpoints, timeout=0.5) as client:
                    client._receiver.settle()  # type: ignore[attr-defined]
                    with client.subscribe("t.>", refresh=0.2) as sub:
                        time.sleep(0.1)
                        while fake.poll(0):  # the first SUB's attempts: not counted
                            fake.recv_multipart()
                        end = time.monotonic() + 2
                        while time.monotonic() < end:
                            sub.next(0.1)

            await anyio.to_thread.run_sync(sync)

    try:
        anyio.run(main)
        while fake.poll(100):
            subs += any(f == b"\xffDCP:sub" for f in fake.recv_multipart())
    finally:
        fake.close(0)
    assert subs >= 1  # asked again after the first SUB failed


async def test_two_tasks_waiting_for_the_first_handshakes_both_wake() -> None:
    """Receive Rule RX6: every task waiting for the brokers' first handshakes wakes when
    they are made, not only the last one to wait (the others waited for the settle bound)."""
    async with (
        dcp.Broker("tcp://127.0.0.1:0") as a,
        dcp.Broker("tcp://127.0.0.1:0") as b,
        dcp.Client([a.endpoints[0], b.endpoints[0]]) as client,
    ):
        took: list[float] = []

        async def wait() -> None:
            start = anyio.current_time()
            await client._receiver.wait_connected()
            took.append(anyio.current_time() - start)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            tg.start_soon(wait)
        assert len(took) == 2 and max(took) < 0.5
