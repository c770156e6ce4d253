"""A prefetching worker (``Worker(..., prefetch=P)``, core Rules W2, W4; Rule WH6) on real zmq
sockets, both anyio backends: against a hand-driven ROUTER (:class:`FakeBroker`), then through
a real :class:`Broker` with :class:`Client` callers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import anyio
import anyio.abc
import pytest

from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._models import HandlerRequest
from dcp._worker.services import Service
from dcp._worker.worker import Worker
from dcp.wire.messages import Ping, Pong, Reply, Request, parse_error_reply
from dcp.wire.options import expires_in_option, work_timeout_option
from tests.integration.test_end_to_end import fast_broker
from tests.worker.test_worker import (
    CLIENT,
    SVC,
    FakeBroker,
    Result,
    eventually,
    start,
)

pytestmark = pytest.mark.anyio


def req(i: int, *options: bytes) -> Request:
    return Request(SVC, CLIENT, (b"rid-%d" % i, *options), (b"%d" % i,))


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.close()


async def replies(fake: FakeBroker, n: int) -> list[tuple[bytes, ...]]:
    """The data of the next ``n`` REPLYs, skipping heartbeats."""
    got: list[tuple[bytes, ...]] = []
    while len(got) < n:
        _, msg = await fake.recv()
        if isinstance(msg, Reply):
            got.append(msg.data)
        else:
            assert isinstance(msg, (Ping, Pong)), msg
    return got


class Gate:
    """A handler that records what runs, and how many at once, until released."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.ran: list[bytes] = []
        self.running = self.most = 0

    async def __call__(self, request: HandlerRequest) -> Result:
        self.ran.append(request.data[0])
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return request.data[0]


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_a_bad_prefetch_is_refused_at_construction(bad: object) -> None:
    with pytest.raises(ValueError, match="prefetch"):
        Worker("tcp://127.0.0.1:5555", "echo", Gate(), prefetch=bad)  # type: ignore[arg-type]


async def test_asks_for_p_more_runs_n_and_starts_them_in_order(fake: FakeBroker) -> None:
    gate = Gate()
    worker = Worker(fake.endpoint, SVC, gate, concurrency=1, prefetch=2)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        await fake.expect(Ping)  # busy, room for two more
        fake.send(ident, req(2))
        await fake.expect(Ping)
        fake.send(ident, req(3))
        await fake.expect_silence(0.2)  # N + P held: asks for no more
        s = worker.statistics()
        assert (s.in_progress, s.backlog) == (1, 2)
        assert gate.ran == [b"1"]
        gate.release.set()
        got = [(await fake.expect(Reply))[1].data for _ in range(3)]
        assert got == [(b"1",), (b"2",), (b"3",)]
        await worker.aclose()
    assert gate.most == 1


async def test_a_prefetched_request_starts_in_the_task_that_finished_the_last(
    fake: FakeBroker,
) -> None:
    """Rule WH6: a handler that never suspends, run inline, starts the next prefetched
    request itself: one task runs them all, with no task switch."""
    tasks: list[int] = []

    async def plain(request: HandlerRequest) -> Result:
        tasks.append(anyio.get_current_task().id)
        return request.data[0]

    worker = Worker(fake.endpoint, SVC, plain, concurrency=1, prefetch=4)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        for i in range(5):  # one burst: the first runs, four wait (prefetched)
            fake.send(ident, req(i))
        got = await replies(fake, 5)
        assert got == [(b"%d" % i,) for i in range(5)]
        await worker.aclose()
    assert len(tasks) == 5 and len(set(tasks)) == 1
    assert worker.statistics().backlogged >= 1


async def test_a_prefetched_request_whose_caller_gave_up_is_answered_expired(
    fake: FakeBroker,
) -> None:
    gate = Gate()
    worker = Worker(fake.endpoint, SVC, gate, concurrency=1, prefetch=1)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        await fake.expect(Ping)
        fake.send(ident, req(2, expires_in_option(0.05)))
        await eventually(lambda: worker.statistics().backlog == 1)
        await anyio.sleep(0.1)
        gate.release.set()
        first = (await fake.expect(Reply))[1]
        second = (await fake.expect(Reply))[1]
        assert first.data == (b"1",)
        error = parse_error_reply(second.data)
        assert error is not None and error[0] == "expired"
        await worker.aclose()
    assert gate.ran == [b"1"]
    assert worker.statistics().expired == 1


async def test_a_work_timeout_counts_from_the_handlers_start(fake: FakeBroker) -> None:
    """A prefetched request that waited longer than its work timeout still gets the whole of
    it once its handler starts (Rule WH2)."""
    first_done = anyio.Event()

    async def slow(request: HandlerRequest) -> Result:
        if request.data[0] == b"1":
            await anyio.sleep(0.3)
            first_done.set()
        else:
            await anyio.sleep(0.15)
        return request.data[0]

    worker = Worker(fake.endpoint, SVC, slow, concurrency=1, prefetch=1)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        await fake.expect(Ping)
        fake.send(ident, req(2, work_timeout_option(0.25)))  # waits 0.3 s, runs 0.15 s
        got = await replies(fake, 2)
        assert got == [(b"1",), (b"2",)]
        await worker.aclose()
    s = worker.statistics()
    assert (s.replies, s.cancelled) == (2, 0)


async def _broker(tg: anyio.abc.TaskGroup, **kw: float) -> str:
    (endpoint,) = await tg.start(Broker("tcp://127.0.0.1:0", **kw).serve)  # type: ignore[arg-type]
    return str(endpoint)


async def _serve(
    tg: anyio.abc.TaskGroup, worker: Worker, *, cancel: anyio.CancelScope | None = None
) -> None:
    async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with cancel or anyio.CancelScope():
            await worker.serve(task_status=task_status)

    await tg.start(run)


async def _ask_all(tg: anyio.abc.TaskGroup, client: Client, n: int, got: dict[bytes, int]) -> None:
    async def one(i: int) -> None:
        response = await client.request("echo", b"%d" % i)
        got[response.bytes] = got.get(response.bytes, 0) + 1

    for i in range(n):
        tg.start_soon(one, i)


async def test_a_graceful_stop_gives_its_prefetched_requests_back() -> None:
    """A stopping worker drops what waits (core Rule W9) and leaves (RECONNECT): the broker
    puts it back at the front of the queue; another worker runs it. Each answered once."""
    slow, fast = Gate(), Gate()
    fast.release.set()
    async with anyio.create_task_group() as tg:
        endpoint = await _broker(tg)
        a = Worker(endpoint, "echo", slow, concurrency=1, prefetch=2)
        await _serve(tg, a)
        got: dict[bytes, int] = {}
        async with Client(endpoint, timeout=10) as client, anyio.create_task_group() as calls:
            await _ask_all(calls, client, 3, got)
            await eventually(lambda: a.statistics().backlog == 2)
            b = Worker(endpoint, "echo", fast, concurrency=1)
            await _serve(tg, b)
            a.stop(grace=5)
            slow.release.set()
        assert got == {b"0": 1, b"1": 1, b"2": 1}
        assert len(slow.ran) == 1 and len(fast.ran) == 2
        assert sorted(slow.ran + fast.ran) == [b"0", b"1", b"2"]
        assert a.statistics().dropped == 2
        await b.aclose()
        tg.cancel_scope.cancel()


async def test_a_killed_workers_prefetched_requests_are_redelivered() -> None:
    """Whatever a worker held, running or waiting, goes to another once the broker knows it is
    gone (the broker's Rule R5)."""
    stuck, fast = Gate(), Gate()
    fast.release.set()
    async with anyio.create_task_group() as tg:
        endpoint = await _broker(tg, heartbeat_interval=0.1)
        kill = anyio.CancelScope()
        a = Worker(endpoint, "echo", stuck, concurrency=1, prefetch=2, heartbeat_interval=0.1)
        await _serve(tg, a, cancel=kill)
        got: dict[bytes, int] = {}
        async with Client(endpoint, timeout=10) as client, anyio.create_task_group() as calls:
            await _ask_all(calls, client, 3, got)
            await eventually(lambda: a.statistics().backlog == 2)
            b = Worker(endpoint, "echo", fast, concurrency=1, heartbeat_interval=0.1)
            await _serve(tg, b)
            kill.cancel()  # no goodbye: the socket closes, the broker finds out
        assert got == {b"0": 1, b"1": 1, b"2": 1}
        assert sorted(fast.ran) == [b"0", b"1", b"2"]
        await b.aclose()
        tg.cancel_scope.cancel()


def _thread_echo(request: HandlerRequest) -> bytes:
    return request.data[0]


async def _stream(request: HandlerRequest) -> AsyncIterator[bytes]:
    for i in range(int(request.data[0])):
        yield b"%d" % i


@pytest.mark.parametrize("kind", ["thread", "services", "brokers"])
async def test_prefetch_with_def_handlers_services_and_several_brokers(kind: str) -> None:
    async with anyio.create_task_group() as tg:
        endpoint = await _broker(tg)
        endpoints = [endpoint]
        if kind == "brokers":  # the prefetch is per broker (each link's core)
            endpoints.append(await _broker(tg))
            worker = Worker(endpoints, "echo", _thread_echo, concurrency=1, prefetch=2)
        elif kind == "services":
            worker = Worker(
                endpoint,
                services={"echo": Service(_thread_echo), "other": Service(_thread_echo)},
                concurrency=1,
                prefetch=2,
            )
        else:
            worker = Worker(endpoint, "echo", _thread_echo, concurrency=1, prefetch=2)
        await _serve(tg, worker)
        for one in endpoints:
            got: dict[bytes, int] = {}
            async with Client(one, timeout=10) as client, anyio.create_task_group() as calls:
                await _ask_all(calls, client, 8, got)
            assert got == {b"%d" % i: 1 for i in range(8)}
        assert worker.statistics().in_progress == 0
        await worker.aclose()
        tg.cancel_scope.cancel()


async def test_prefetch_with_a_stream_handler() -> None:
    async with anyio.create_task_group() as tg:
        endpoint = await _broker(tg)
        worker = Worker(endpoint, "count", _stream, concurrency=1, prefetch=2)
        await _serve(tg, worker)
        results: list[list[tuple[bytes, ...]]] = []
        async with Client(endpoint, timeout=10) as client:

            async def one() -> None:
                async with client.stream("count", b"20", window=4) as parts:
                    results.append([part async for part in parts])

            async with anyio.create_task_group() as calls:
                for _ in range(4):
                    calls.start_soon(one)
        assert results == [[(b"%d" % i,) for i in range(20)]] * 4
        await worker.aclose()
        tg.cancel_scope.cancel()


async def test_the_serving_log_line_names_the_prefetch(caplog: pytest.LogCaptureFixture) -> None:
    """The library's INFO line on ``dcp.worker`` says the prefetch when there is one, as
    ``dcp worker`` does (one broker, and each broker of several); none without one."""

    async def echo(request: HandlerRequest) -> bytes:
        return request.data[0]

    def serving() -> list[str]:
        return sorted(r.getMessage() for r in caplog.records if "serving" in r.getMessage())

    line = "worker serving 'echo' at {} ({})"
    async with fast_broker() as a, fast_broker() as b:
        ea, eb = a.endpoints[0], b.endpoints[0]
        cases = [
            (Worker(ea, SVC, echo, prefetch=4), [line.format(ea, "concurrency 1, prefetch 4")]),
            (Worker(ea, SVC, echo, concurrency=2), [line.format(ea, "concurrency 2")]),
            (
                Worker([ea, eb], SVC, echo, prefetch=2),
                sorted(line.format(ep, "concurrency 1, prefetch 2") for ep in (ea, eb)),
            ),
        ]
        for worker, expected in cases:
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="dcp.worker"):
                async with anyio.create_task_group() as tg:
                    await tg.start(worker.serve)
                    with anyio.fail_after(5):
                        while len(serving()) < len(expected):  # noqa: ASYNC110 - polling the log
                            await anyio.sleep(0.005)
                    tg.cancel_scope.cancel()
            assert serving() == expected
