"""What docs/cancellation.md says about closing a worker, checked with a real broker, worker
and client on both backends: cancelling the caller of ``Worker.aclose()`` does not cancel
the graceful stop it began; leaving ``async with Worker`` by a cancellation is the
cancellation path (handlers cancelled, no reply)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._errors import RequestTimeout
from dcp._models import HandlerRequest
from dcp._worker.worker import Worker

pytestmark = pytest.mark.anyio


def slow_handler(started: anyio.Event) -> Callable[[HandlerRequest], Awaitable[bytes]]:
    async def slow(request: HandlerRequest) -> bytes:
        started.set()
        await anyio.sleep(0.5)
        return b"done"

    return slow


async def test_cancelling_aclose_leaves_the_graceful_stop_running() -> None:
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(Broker("tcp://127.0.0.1:0").serve)
        started = anyio.Event()
        worker = Worker(endpoint, b"slow", slow_handler(started))
        serving = anyio.Event()

        async def serve() -> None:
            async with anyio.create_task_group() as inner:
                await inner.start(worker.serve)
                serving.set()
            serving.set()

        tg.start_soon(serve)
        await serving.wait()
        async with Client(endpoint, timeout=5, retries=0) as client:
            replies = []

            async def call() -> None:
                replies.append((await client.request(b"slow", b"x")).data)

            async with anyio.create_task_group() as calls:
                calls.start_soon(call)
                with anyio.fail_after(5):
                    await started.wait()
                with anyio.move_on_after(0.05) as scope:
                    await worker.aclose(grace=5)
                assert scope.cancelled_caught
            # The handler kept its grace: its reply arrived after aclose() was cancelled.
            assert replies == [(b"done",)]
        stats = worker.statistics()
        assert (stats.replies, stats.cancelled) == (1, 0)
        tg.cancel_scope.cancel()


async def test_leaving_async_with_worker_by_cancellation_cancels_handlers() -> None:
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(Broker("tcp://127.0.0.1:0").serve)
        started = anyio.Event()
        worker = Worker(endpoint, b"slow", slow_handler(started))
        async with Client(endpoint, timeout=0.3, retries=0) as client:

            async def call() -> None:
                with pytest.raises(RequestTimeout):  # no reply: the handler was cancelled
                    await client.request(b"slow", b"x")

            with anyio.move_on_after(5) as scope:
                async with worker:
                    tg.start_soon(call)
                    with anyio.fail_after(5):
                        await started.wait()
                    scope.cancel()
                    await anyio.sleep_forever()
            stats = worker.statistics()
            assert (stats.replies, stats.cancelled) == (0, 1)
            await anyio.sleep(0.5)  # the call times out
        tg.cancel_scope.cancel()
