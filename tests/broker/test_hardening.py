"""Hardening, end to end on real sockets and both backends: work timeouts, limits that
answer with error replies, and peers that stop reading (high-water marks).

Every test is bounded with ``fail_after``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest
import zmq

import dcp
from dcp._io.context import get_context
from dcp._models import HandlerRequest
from dcp.wire.options import NO_WAIT_OPTION, OPTION_PREFIX, work_timeout_option
from tests.integration.test_end_to_end import HB, eventually, fast_worker

pytestmark = pytest.mark.anyio

_EXPIRES_IN = OPTION_PREFIX + b"expires-in="


async def echo(request: dcp.HandlerRequest) -> bytes:
    return b"echo:" + b"".join(request.data)


def queued(broker: dcp.Broker, service: bytes) -> int:
    stats = broker.statistics().services.get(service)
    return 0 if stats is None else stats.queued


# ------------------------------------------------------------------ work timeouts


async def test_a_request_held_past_its_work_timeout_is_answered_by_another_worker() -> None:
    calls: list[bytes] = []
    cancelled: list[bytes] = []

    async def hangs_once(request: dcp.HandlerRequest) -> bytes:
        calls.append(request.data[0])
        if len(calls) == 1:
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.append(request.data[0])
        return b"done"

    with anyio.fail_after(10):
        async with (
            dcp.Broker("tcp://127.0.0.1:0", heartbeat_interval=HB) as broker,
            anyio.create_task_group() as tg,
        ):
            endpoint = broker.endpoints[0]
            for _ in range(2):
                await tg.start(fast_worker(endpoint, "svc", hangs_once).serve)
            async with dcp.Client(endpoint, timeout=5, retries=0) as client:
                # A slow service's job next to it, with a long work timeout, is untouched.
                response = await client.request("svc", b"job", work_timeout=0.3)
                assert response.data == (b"done",)
                assert response.metadata == ()  # the option is dcp's, not the user's
                stats = broker.statistics()
                assert (stats.work_timeouts, stats.redeliveries) == (1, 1)
                # The stuck handler was cancelled by its worker (the broker took the job).
                await eventually(lambda: cancelled == [b"job"])
                # The dropped worker registered again and serves.
                await eventually(lambda: broker.statistics().workers == 2)
                for n in range(4):
                    response = await client.request("svc", b"%d" % n, work_timeout=60)
                    assert response.data == (b"done",)
            tg.cancel_scope.cancel()


async def test_a_request_every_worker_holds_too_long_ends_in_redelivery_limit() -> None:
    async def hangs(request: dcp.HandlerRequest) -> bytes:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    with anyio.fail_after(10):
        async with (
            dcp.Broker(
                "tcp://127.0.0.1:0", heartbeat_interval=HB, max_redeliveries=2, work_timeout=0.2
            ) as broker,
            anyio.create_task_group() as tg,
        ):
            endpoint = broker.endpoints[0]
            for _ in range(2):
                await tg.start(fast_worker(endpoint, "svc", hangs).serve)
            async with dcp.Client(endpoint, timeout=8, retries=0) as client:
                with pytest.raises(dcp.RemoteError) as info:
                    await client.request("svc", b"x")
            assert info.value.code == "redelivery_limit"
            stats = broker.statistics()
            assert stats.work_timeouts == 3
            assert stats.rejections == {"redelivery_limit": 1}
            assert stats.clients == 0
            tg.cancel_scope.cancel()


# -------------------------------------------------- limits answer with error replies


async def test_limits_answer_the_client_with_error_replies() -> None:
    with anyio.fail_after(10):
        async with (
            dcp.Broker(
                "tcp://127.0.0.1:0",
                max_message_size=1024,
                max_frames=16,
                max_client_queued=3,
            ) as broker,
            # Its requests wait for a worker (the queue is what is tested).
            dcp.Client(broker.endpoints[0], timeout=5, retries=0, wait_for_worker=True) as client,
        ):
            cases = [
                ("message_too_large", [b"x" * 400] * 3),
                ("too_many_frames", [b"d"] * 20),
            ]
            for code, data in cases:
                with pytest.raises(dcp.RemoteError) as info:
                    await client.request("svc", *data)
                assert info.value.code == code
            # No worker: three requests wait in the queue, the fourth is refused.
            async with anyio.create_task_group() as tg:
                for n in range(3):
                    tg.start_soon(client.request, "svc", b"%d" % n)
                await eventually(lambda: queued(broker, b"svc") == 3)
                with pytest.raises(dcp.RemoteError) as info:
                    await client.request("svc", b"one too many")
                assert info.value.code == "client_limit"
                tg.cancel_scope.cancel()
            assert broker.statistics().rejections == {
                "message_too_large": 1,
                "too_many_frames": 1,
                "client_limit": 1,
            }


# ------------------------------------------------------- peers that stop reading


@pytest.fixture
async def small_hwm_broker() -> AsyncIterator[dcp.Broker]:
    # inproc: no kernel buffers, so a peer's queue holds exactly the two high-water marks.
    endpoint = f"inproc://hardening-{uuid.uuid4().hex}"
    async with dcp.Broker(endpoint, heartbeat_interval=HB, send_hwm=8, receive_hwm=8) as broker:
        yield broker


def matched_replies(broker: dcp.Broker) -> int:
    """Replies that answered a request their worker held (each request at most once)."""
    stats = broker.statistics()
    return stats.replies - stats.unmatched


def stalled_dealer(endpoint: str, ident: bytes) -> zmq.Socket[bytes]:
    """A DEALER that will never read (a receive high-water mark of 1)."""
    sock: zmq.Socket[bytes] = get_context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, ident)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.connect(endpoint)
    return sock


async def test_a_client_that_stops_reading_loses_only_its_own_replies(
    small_hwm_broker: dcp.Broker,
) -> None:
    broker = small_hwm_broker
    endpoint = broker.endpoints[0]
    n = 2000
    payload = b"p" * 4096
    with anyio.fail_after(50):  # a hang guard: seconds of work under coverage and load
        async with anyio.create_task_group() as tg:
            await tg.start(fast_worker(endpoint, "echo", echo, concurrency=4).serve)
            stalled = stalled_dealer(endpoint, b"STALLED")
            try:
                for i in range(n):
                    frames = dcp.wire.serialize(
                        dcp.wire.Request(b"echo", None, (b"%d" % i,), (payload,))
                    )
                    while True:
                        try:
                            stalled.send_multipart(frames, zmq.NOBLOCK)
                            break
                        except zmq.Again:
                            await anyio.sleep(0.001)
                # Everything it sent is answered, each request once by the worker that held
                # it; replies beyond its buffers are dropped. (A worker the broker dropped
                # for silence on a loaded machine, its requests redelivered, may answer one
                # again: such a reply is unmatched, still routed and counted in replies.)
                await eventually(lambda: matched_replies(broker) == n)
                # A reply that found the queue full is dropped at once; one sent after that
                # in the same flush is kept a moment (Rule U1) and dropped after the grace.
                await eventually(lambda: broker.statistics().dropped_replies > n // 2)
                stats = broker.statistics()
                assert stats.clients == 0  # nothing is kept for it
                # Meanwhile a well-behaved client is served normally.
                async with dcp.Client(endpoint, timeout=5, retries=0) as client:
                    response = await client.request("echo", b"hi")
                assert response.data == (b"echo:hi",)
            finally:
                stalled.close(0)
            tg.cancel_scope.cancel()


async def test_a_worker_that_stops_reading_is_dropped_and_its_work_redelivered(
    small_hwm_broker: dcp.Broker,
) -> None:
    broker = small_hwm_broker
    endpoint = broker.endpoints[0]
    with anyio.fail_after(20):
        stalled = stalled_dealer(endpoint, b"STUCK-WORKER")
        try:
            stalled.send_multipart(dcp.wire.serialize(dcp.wire.Register(b"echo")))
            await eventually(lambda: broker.statistics().workers == 1)
            async with (
                dcp.Client(endpoint, timeout=10, retries=0) as client,
                anyio.create_task_group() as tg,
            ):
                results: list[bytes] = []

                async def call(n: int) -> None:
                    response = await client.request("echo", b"%d" % n)
                    results.append(response.data[0])

                tg.start_soon(call, 0)  # the stalled worker takes it
                await eventually(lambda: broker.statistics().dispatched == 1)
                # Its heartbeats ask for pongs it never reads: its queue fills up.
                ping = dcp.wire.serialize(dcp.wire.Ping())
                for _ in range(5000):
                    if broker.statistics().rejections:
                        break
                    with contextlib.suppress(zmq.Again):
                        stalled.send_multipart(ping, zmq.NOBLOCK)
                    await anyio.sleep(0.001)
                stats = broker.statistics()
                assert stats.rejections == {"worker_unreachable_full": 1}
                assert stats.redeliveries == 1
                await tg.start(fast_worker(endpoint, "echo", echo).serve)
                await eventually(lambda: results == [b"echo:0"])
                tg.cancel_scope.cancel()
        finally:
            stalled.close(0)


async def test_every_request_path_carries_the_work_timeout() -> None:
    """``work_timeout`` per call, and the client's default, reach the worker as the option
    on every way of sending (and come back without it)."""
    seen: list[tuple[bytes, ...]] = []

    async def record(request: HandlerRequest) -> bytes:
        # After dcp's request id (dcp's parts are in dcp_metadata, the caller's in metadata);
        # not the deadline (expires-in) nor no-wait, tested on their own.
        own, ours = request.dcp_metadata, request.metadata
        seen.append(
            tuple(
                m
                for m in (*own[1:], *ours)
                if not m.startswith(_EXPIRES_IN) and m != NO_WAIT_OPTION
            )
        )
        return b"ok"

    option = work_timeout_option(1.5)
    default = work_timeout_option(9.0)
    with anyio.fail_after(20):
        async with (
            dcp.Broker("tcp://127.0.0.1:0", heartbeat_interval=HB) as broker,
            anyio.create_task_group() as tg,
        ):
            endpoint = broker.endpoints[0]
            await tg.start(fast_worker(endpoint, "svc", record).serve)
            async with dcp.Client(endpoint, timeout=5, work_timeout=9.0) as client:
                response = await client.request("svc", b"x", metadata=(b"u",), work_timeout=1.5)
                assert response.metadata == (b"u",)
                await client.request("svc", b"x")
                assert [r.data async for r in client.map("svc", [b"x"], work_timeout=1.5)]
                async for _ in client.map_unordered("svc", [b"x"], work_timeout=1.5):
                    pass
            assert seen == [(option, b"u"), (default,), (option,), (option,)]
            seen.clear()

            def sync_calls() -> None:
                with dcp.SyncClient(endpoint, timeout=5, work_timeout=9.0) as sync:
                    sync.request("svc", b"x", work_timeout=1.5)
                    sync.request("svc", b"x")
                    list(sync.map("svc", [b"x"], work_timeout=1.5))
                    list(sync.map_outcomes("svc", [b"x"], work_timeout=1.5))
                    list(sync.map_unordered("svc", [b"x"], work_timeout=1.5))

            await anyio.to_thread.run_sync(sync_calls)
            assert seen == [(option,), (default,), (option,), (option,), (option,)]
            tg.cancel_scope.cancel()
