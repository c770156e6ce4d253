"""Inline runs (dcp/_worker/worker.py Rules WL1-WL3, dcp/_worker/handlers.py Rule WH6): the
serving task runs a request it read itself, and hands the socket to another serving task
when the handler suspends. Real zmq sockets, both anyio backends."""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest

import dcp
from dcp._models import HandlerRequest
from dcp._worker.worker import Worker
from dcp.wire.messages import Ping, Pong, Reply
from tests.integration.test_end_to_end import HB, eventually, fast_broker, fast_worker
from tests.worker.test_worker import FakeBroker, Result, req, start, upper, worker_for

pytestmark = pytest.mark.anyio

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.close()


async def test_requests_that_never_suspend_are_answered_in_order() -> None:
    ran: list[bytes] = []

    async def quick(request: HandlerRequest) -> Result:
        ran.append(request.data[0])
        return request.data[0].upper()

    # inproc: all eight arrive before the worker looks (a fresh name: unbinding is lazy).
    fake = FakeBroker(f"inproc://test-inline-order-{uuid.uuid4().hex}")
    try:
        worker = worker_for(fake, quick, concurrency=4)
        async with anyio.create_task_group() as tg:
            ident = await start(tg, fake, worker)
            # More than the concurrency at once (a real broker would not): the core's
            # backlog holds the rest (its Rule W4), which slots run as the first ones finish.
            for i in range(1, 9):
                fake.send(ident, req(i))
            replies: list[tuple[bytes, ...]] = []
            while len(replies) < 8:
                _, msg = await fake.recv()
                if isinstance(msg, Reply):
                    replies.append(msg.data)
            assert replies == [(b"DATA-%d" % i,) for i in range(1, 9)]
            assert ran == [b"data-%d" % i for i in range(1, 9)]
            s = worker.statistics()
            assert (s.replies, s.in_progress, s.backlogged) == (8, 0, 4)
            tg.cancel_scope.cancel()
    finally:
        fake.close()


async def test_a_batch_goes_on_while_one_of_its_requests_waits(fake: FakeBroker) -> None:
    """A handler that suspends hands the socket on (Rule WL1): the requests read in the same
    batch after it are answered while it waits, and heartbeats go on."""
    release = anyio.Event()

    async def some_slow(request: HandlerRequest) -> Result:
        if request.data[0] == b"slow":
            await release.wait()
        return request.data[0]

    worker = worker_for(fake, some_slow, concurrency=4, heartbeat_interval=0.05, liveness=5)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1, b"slow"))
        fake.send(ident, req(2, b"slow"))
        for i in range(3, 5):
            fake.send(ident, req(i, b"quick"))
        quick = 0
        while quick < 2:
            _, msg = await fake.recv()
            if isinstance(msg, Reply):
                assert msg.data == (b"quick",)
                quick += 1
        # The slow ones still run: the worker beats (and the broker answers, as it would).
        await fake.expect(Pong, limit=1)
        fake.send(ident, Pong())
        assert worker.statistics().in_progress == 2
        release.set()
        slow = 0
        while slow < 2:
            _, msg = await fake.recv()
            if isinstance(msg, Reply):
                assert msg.data == (b"slow",)
                slow += 1
        # And the tasks that ran them serve again.
        fake.send(ident, req(5, b"again"))
        while not isinstance((msg := (await fake.recv())[1]), Reply):
            pass
        assert msg.data == (b"again",)
        tg.cancel_scope.cancel()


async def test_an_inline_request_does_not_see_the_previous_ones_context() -> None:
    """Rule WL2: also when the handler never suspends; it sees the context serve ran in."""
    seen: list[str] = []

    async def handler(request: dcp.HandlerRequest) -> bytes:
        seen.append(VAR.get())
        VAR.set(request.data[0].decode())
        return request.data[0]

    VAR.set("serve's")
    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        async with fast_worker(ep, "ctx", handler), dcp.Client(ep) as client:
            for i in range(3):
                assert (await client.request("ctx", b"%d" % i)).data[0] == b"%d" % i
    assert seen == ["serve's"] * 3


async def test_a_handler_sleeping_three_heartbeats_keeps_the_worker_registered() -> None:
    """The serving duties pass on while an inline handler sleeps: the broker keeps the
    worker, which answers, and serves the next request on the same registration."""

    async def sleepy(request: dcp.HandlerRequest) -> bytes:
        if request.data[0] == b"sleep":
            await anyio.sleep(4 * HB)  # longer than the broker's liveness (3 beats)
        return request.data[0]

    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        worker = fast_worker(ep, "sleepy", sleepy)
        async with worker, dcp.Client(ep) as client:
            for _ in range(2):
                assert (await client.request("sleepy", b"sleep")).data == (b"sleep",)
                assert (await client.request("sleepy", b"quick")).data == (b"quick",)
            s = worker.statistics()
            assert (s.reconnects, s.reregistrations, s.replies) == (0, 0, 4)


async def test_stopping_cancels_a_suspended_inline_handler(fake: FakeBroker) -> None:
    """Rule WL1: the serving tasks are the handlers' tasks; a stop's grace cancels them."""
    cancelled = anyio.Event()

    async def forever(request: HandlerRequest) -> Result:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")  # pragma: no cover

    worker: Worker = worker_for(fake, forever, concurrency=2)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        await eventually(lambda: worker.statistics().in_progress == 1)
        with anyio.fail_after(5):
            await worker.aclose(grace=0.05)
            await cancelled.wait()
        s = worker.statistics()
        assert (s.cancelled, s.in_progress) == (1, 0)


@pytest.mark.parametrize("kind", ["thread", "several"])
async def test_handlers_that_cannot_run_inline_still_run_in_slots(kind: str) -> None:
    """Rule WH6: plain ``def`` handlers and several services run in slots as before."""

    def plain(request: dcp.HandlerRequest) -> bytes:
        return request.data[0]

    async def asynchronous(request: dcp.HandlerRequest) -> bytes:
        return request.data[0]

    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        if kind == "thread":
            worker = Worker(ep, "a", plain, heartbeat_interval=HB)
        else:
            worker = Worker(ep, services={"a": asynchronous, "b": plain}, heartbeat_interval=HB)
        async with worker, dcp.Client(ep) as client:
            for i in range(3):
                assert (await client.request("a", b"%d" % i)).data == (b"%d" % i,)
    assert worker.statistics().replies == 3


async def test_a_batch_is_seen_whole_before_its_requests_run() -> None:
    """Rule WL1: the core sees every request of a batch before the first runs, so it asks
    for more work as they pile up (core Rule W2; answered at once one by one, the worker
    would never ask for more than two): the PING leaves before the answers."""
    # inproc: both sends arrive before the worker looks (a fresh name: unbinding is lazy).
    fake = FakeBroker(f"inproc://test-inline-batch-{uuid.uuid4().hex}")
    try:
        worker = worker_for(fake, upper, concurrency=4)
        async with anyio.create_task_group() as tg:
            ident = await start(tg, fake, worker)
            fake.send(ident, req(1))
            await fake.expect(Ping)
            await fake.expect(Reply)
            # Credit: REGISTER 1, request 1 took it (hence the PING: 1), its reply added 1.
            fake.send(ident, req(2))
            fake.send(ident, req(3))
            await fake.expect(Ping)  # both received: credit 0 with slots free
            assert (await fake.expect(Reply))[1].data == (b"DATA-2",)
            assert (await fake.expect(Reply))[1].data == (b"DATA-3",)
            tg.cancel_scope.cancel()
    finally:
        fake.close()


async def test_serving_tasks_do_not_pile_up(fake: FakeBroker) -> None:
    """Rule WL1: a task that handed the socket on parks, and leads again at the next
    suspension; however many requests suspend, the worker's tasks stay as many."""

    async def suspends(request: HandlerRequest) -> Result:
        await anyio.lowlevel.checkpoint()
        return request.data[0]

    worker = worker_for(fake, suspends, concurrency=2)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)

        async def serve(first: int, count: int) -> None:
            for i in range(first, first + count):
                fake.send(ident, req(i))
                while not isinstance((await fake.recv())[1], Reply):
                    pass

        await serve(1, 5)
        tasks = len(anyio.get_running_tasks())
        await serve(6, 40)
        assert len(anyio.get_running_tasks()) == tasks
        assert worker.statistics().replies == 45
        tg.cancel_scope.cancel()
