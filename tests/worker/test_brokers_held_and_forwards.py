"""Review of issue 28's worker (several brokers): real dcp brokers on tcp 127.0.0.1 port 0,
raw DEALER clients, both anyio backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

from dcp._broker.broker import Broker
from dcp._models import Forward, HandlerRequest
from dcp._worker.worker import Worker
from dcp.wire.messages import HELD_MARKER
from dcp.wire.options import work_timeout_option
from tests.helpers import wait_for
from tests.worker.test_brokers import RawClient, data_of, rid, upper

pytestmark = pytest.mark.anyio


class Served:
    """A :class:`Broker` serving in a task of its own; :meth:`stop` cancels it."""

    def __init__(self, **options: Any) -> None:
        self.broker = Broker("tcp://127.0.0.1:0", **options)
        self.scope = anyio.CancelScope()
        self.endpoint = ""

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[list[str]]) -> None:
        with self.scope:
            await self.broker.serve(task_status=task_status)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        (self.endpoint,) = await tg.start(self._serve)

    def stop(self) -> None:
        self.scope.cancel()


@asynccontextmanager
async def served(n: int) -> AsyncIterator[tuple[anyio.abc.TaskGroup, list[Served]]]:
    async with anyio.create_task_group() as tg:
        running = [Served() for _ in range(n)]
        for one in running:
            await one.start(tg)
        yield tg, running
        tg.cancel_scope.cancel()


async def test_no_held_notice_through_a_broker_whose_copy_the_worker_holds() -> None:
    """Rule WB4 with Rule WB3: a request brought by A and, joined, by B. When A is lost, a
    HELD notice through B would match B's copy (the worker holds it there): B takes it for
    the answer (its copy released, +1 credit where the worker mirrors a PING) and then
    grants more than the worker's free slots."""
    runs = 0
    release = anyio.Event()

    async def slow(request: HandlerRequest) -> bytes:
        nonlocal runs
        runs += 1
        await release.wait()
        return request.data[0].upper()

    async with served(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "slow", slow, concurrency=2)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            same = rid(1)
            client.send(0, b"slow", (same,), b"r1")
            await wait_for(lambda: runs == 1)
            client.send(1, b"slow", (same,), b"r1")  # the client failed over to B
            await wait_for(lambda: worker.statistics().duplicates == 1)
            a.stop()
            await wait_for(lambda: not worker.brokers()[a.endpoint].registered)
            await anyio.sleep(0.1)
            # B still holds its copy, given to this worker: nothing answered it yet.
            assert b.broker.statistics().replies == 0
            for n in (2, 3, 4):
                client.send(1, b"slow", (rid(n),), b"r%d" % n)
            await wait_for(lambda: worker.brokers()[b.endpoint].received >= 2)
            await anyio.sleep(0.1)
            # B never grants more than the worker's free slots (credit mirrored exactly).
            assert worker.brokers()[b.endpoint].backlogged == 0
            release.set()
            got = [data_of(await client.recv(1)) for _ in range(4)]
        finally:
            client.close()
        assert [HELD_MARKER] not in got
        assert sorted(got) == [[b"R1"], [b"R2"], [b"R3"], [b"R4"]]
        assert b.broker.statistics().unmatched == 0
        await worker.aclose()


async def test_a_forward_ends_every_brokers_copy_of_a_joined_request() -> None:
    """Rule WB2 with Rule WB3: a request brought by A and, joined, by B, whose handler
    forwards. The forward goes through A; B's copy must not stay held by this worker there
    (no answer, no credit): a broker that keeps it gives it to another worker when this one
    leaves (Rule R5), and the request runs twice."""
    runs: list[str] = []
    release = anyio.Event()

    async def first(request: HandlerRequest) -> Forward:
        runs.append("first")
        await release.wait()
        return Forward("second", request.data[0])

    async def first_again(request: HandlerRequest) -> Forward:
        runs.append("first again")
        return Forward("second", request.data[0])

    async def second(request: HandlerRequest) -> bytes:
        runs.append("second")
        return request.data[0].upper()

    async with served(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "first", first, concurrency=2)
        seconds = Worker([a.endpoint, b.endpoint], "second", second, concurrency=2)
        await tg.start(worker.serve)
        await tg.start(seconds.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        await wait_for(lambda: all(s.registered for s in seconds.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            same = rid(1)
            client.send(0, b"first", (same,), b"x")
            await wait_for(lambda: runs == ["first"])
            client.send(1, b"first", (same,), b"x")  # the client failed over to B
            await wait_for(lambda: worker.statistics().duplicates == 1)
            release.set()
            assert data_of(await client.recv(0)) == [b"X"]
            await worker.aclose(grace=5)  # leaves every broker (a RECONNECT)
            other = Worker(b.endpoint, "first", first_again)
            await tg.start(other.serve)
            await anyio.sleep(0.3)
        finally:
            client.close()
        assert runs == ["first", "second"]
        await other.aclose()
        await seconds.aclose()


async def test_a_stop_past_its_grace_sends_no_held_notice() -> None:
    """Rule WB4: HELD notices are for a lost broker. A stop whose grace passed cancels the
    handlers and leaves every broker (a RECONNECT: each requeues what it gave): the requests
    are not held by anyone, and a notice would tell their clients the opposite."""
    started = 0

    async def hang(request: HandlerRequest) -> bytes:
        nonlocal started
        started += 1
        await anyio.sleep_forever()
        raise AssertionError

    async with served(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "hang", hang, concurrency=2)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            client.send(0, b"hang", (rid(1),), b"a")
            client.send(1, b"hang", (rid(2),), b"b")
            await wait_for(lambda: started == 2)
            await worker.aclose(grace=0.2)
            await client.silent(0, 0.3)
            await client.silent(1, 0.1)
        finally:
            client.close()
        assert worker.statistics().cancelled == 2


async def test_a_request_forwarded_lately_is_not_run_again_through_another_broker() -> None:
    """Rule WB3: a request the worker finished lately is not run again when it comes through
    another broker (a client's failover resend). A forward finishes it as an answer does:
    running it again would run the next service twice."""
    runs: list[str] = []

    async def first(request: HandlerRequest) -> Forward:
        runs.append("first")
        return Forward("second", request.data[0])

    async def second(request: HandlerRequest) -> bytes:
        runs.append("second")
        return request.data[0].upper()

    async with served(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "first", first)
        seconds = Worker([a.endpoint, b.endpoint], "second", second)
        await tg.start(worker.serve)
        await tg.start(seconds.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        await wait_for(lambda: all(s.registered for s in seconds.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            same = rid(1)
            client.send(0, b"first", (same,), b"x")
            assert data_of(await client.recv(0)) == [b"X"]
            client.send(1, b"first", (same,), b"x")  # a failover resend, say
            got = data_of(await client.recv(1))
        finally:
            client.close()
        assert runs == ["first", "second"]
        assert got == [HELD_MARKER]
        assert worker.statistics().duplicates == 1
        await worker.aclose()
        await seconds.aclose()


async def test_a_request_its_broker_gave_back_is_not_run_from_the_pool() -> None:
    """Rule WB1 with core Rule W8: a broker that expels the worker (a RECONNECT, here for a
    work timeout while the request waited for the one slot) gave back what it held, to run
    elsewhere: the copy waiting in the pool is dropped, as the core drops its backlog."""
    runs: list[bytes] = []
    release = anyio.Event()

    async def slow(request: HandlerRequest) -> bytes:
        runs.append(request.data[0])
        if request.data[0] == b"first":
            await release.wait()
        return request.data[0].upper()

    async def quick(request: HandlerRequest) -> bytes:
        runs.append(b"elsewhere " + request.data[0])
        return request.data[0].upper()

    async with anyio.create_task_group() as tg:
        a, b = Served(), Served(work_timeout=0.3)
        await a.start(tg)
        await b.start(tg)
        worker = Worker([a.endpoint, b.endpoint], "slow", slow)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            client.send(0, b"slow", (rid(1),), b"first")
            await wait_for(lambda: runs == [b"first"])
            client.send(1, b"slow", (rid(2),), b"second")
            await wait_for(lambda: worker.brokers()[b.endpoint].received == 1)
            # B gives up on the worker (work timeout): it is expelled, "second" given back.
            await wait_for(lambda: b.broker.statistics().work_timeouts == 1)
            other = Worker(b.endpoint, "slow", quick)
            await tg.start(other.serve)
            assert data_of(await client.recv(1)) == [b"SECOND"]
            release.set()
            assert data_of(await client.recv(0)) == [b"FIRST"]
            await anyio.sleep(0.2)
        finally:
            client.close()
        assert runs == [b"first", b"elsewhere second"]
        await other.aclose()
        await worker.aclose()
        tg.cancel_scope.cancel()


async def test_a_forward_and_its_held_notice_never_go_through_the_same_broker() -> None:
    """Rule WB2: a request the same broker brought twice (it gave it back, here at a work
    timeout, and gave it to this worker again) and whose handler forwards: the forward
    finishes the broker's copy and queues the next service's; a HELD notice for the second
    copy through that broker would match nothing there and end the queued forward (routing
    Rule R11): the request would be lost."""
    runs: list[bytes] = []
    release = anyio.Event()
    gate = anyio.Event()

    async def first(request: HandlerRequest) -> Forward:
        runs.append(b"first")
        await release.wait()
        return Forward("second", request.data[0])

    async def second(request: HandlerRequest) -> bytes:
        runs.append(b"second " + request.data[0])
        if request.data[0] == b"block":
            await gate.wait()
        return request.data[0].upper()

    async with anyio.create_task_group() as tg:
        a = Served(work_timeout=0.5, heartbeat_interval=0.1)
        b = Served()
        await a.start(tg)
        await b.start(tg)
        worker = Worker(
            [a.endpoint, b.endpoint], "first", first, concurrency=2, heartbeat_interval=0.1
        )
        seconds = Worker(a.endpoint, "second", second, heartbeat_interval=0.1)
        await tg.start(worker.serve)
        await tg.start(seconds.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            client.send(0, b"second", (rid(0), work_timeout_option(30)), b"block")
            await wait_for(lambda: runs == [b"second block"])
            client.send(0, b"first", (rid(1),), b"x")
            # A gives up on the worker at the work timeout and gives the request to it again.
            await wait_for(lambda: worker.statistics().duplicates == 1, within=10)
            release.set()
            await wait_for(lambda: a.broker.statistics().forwards == 1)
            await anyio.sleep(0.1)
            gate.set()
            got: list[list[bytes]] = []
            with anyio.move_on_after(3):
                while [b"X"] not in got:
                    got.append(data_of(await client.recv(0)))
            assert [b"BLOCK"] in got and [b"X"] in got, got
        finally:
            client.close()
        assert a.broker.statistics().answered_elsewhere == 0
        await seconds.aclose()
        await worker.aclose()
        tg.cancel_scope.cancel()


async def test_answers_relayed_at_a_loss_are_not_replayed_to_the_successor() -> None:
    """Rule WB4 with core Rule W15: the answers replayed through B when A is lost are taken
    from A's core: A's successor (a new broker on A's port) does not get them again."""
    async with served(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "echo", upper)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            client.send(0, b"echo", (rid(1),), b"once")
            assert data_of(await client.recv(0)) == [b"ONCE"]
            a.stop()
            assert data_of(await client.recv(1)) == [b"ONCE"]  # replayed through B
            successor = Served()
            successor.broker = Broker(a.endpoint)
            await successor.start(tg)
            await wait_for(lambda: worker.brokers()[a.endpoint].registered)
            client.send(0, b"echo", (rid(2),), b"twice")  # a fresh one through A's successor
            assert data_of(await client.recv(0)) == [b"TWICE"]
            await client.silent(0)
            await client.silent(1)
        finally:
            client.close()
        assert successor.broker.statistics().unmatched == 0
        assert worker.statistics().replayed == 1
        assert worker.statistics().replays_dropped == 0
        await worker.aclose()
