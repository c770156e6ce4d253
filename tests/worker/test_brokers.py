"""A worker serving several brokers (dcp._worker.brokers, Rules WB1-WB5): real dcp brokers on
tcp 127.0.0.1 port 0, raw DEALER clients, both anyio backends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest
import zmq

from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._errors import RegistrationRefused
from dcp._io.context import get_context
from dcp._io.security import CurveClient, CurveServer
from dcp._models import HandlerRequest
from dcp._worker.worker import Worker
from dcp.wire.dcp1 import PROTOCOL, serialize
from dcp.wire.messages import ERROR_MARKER, HELD_MARKER, Request
from dcp.wire.options import REQUEST_ID_PREFIX, expires_in_option
from tests.helpers import wait_for

pytestmark = pytest.mark.anyio

T_REPLY = b"\x05"


class RunningBroker:
    """A :class:`Broker` serving in a task of its own, stopped by :meth:`stop` (its task
    cancelled: the broker closes its socket at once)."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:0") -> None:
        self.endpoint = endpoint
        self.scope = anyio.CancelScope()

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[list[str]]) -> None:
        with self.scope:
            await Broker(self.endpoint).serve(task_status=task_status)

    async def start(self, tg: anyio.abc.TaskGroup) -> str:
        (self.endpoint,) = await tg.start(self._serve)
        return self.endpoint

    def stop(self) -> None:
        self.scope.cancel()


@asynccontextmanager
async def brokers(n: int) -> AsyncIterator[tuple[anyio.abc.TaskGroup, list[RunningBroker]]]:
    async with anyio.create_task_group() as tg:
        running = [RunningBroker() for _ in range(n)]
        for broker in running:
            await broker.start(tg)
        yield tg, running
        tg.cancel_scope.cancel()


class RawClient:
    """One DEALER per broker, all with the same routing id (a client's address is the same
    at every broker, design of issue 28)."""

    def __init__(self, *endpoints: str) -> None:
        ident = b"\x00c-" + uuid.uuid4().bytes[:8]
        self.socks: list[zmq.Socket[bytes]] = []
        for endpoint in endpoints:
            sock: zmq.Socket[bytes] = get_context().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, ident)
            sock.connect(endpoint)
            self.socks.append(sock)

    def send(self, at: int, service: bytes, meta: tuple[bytes, ...], data: bytes) -> None:
        self.socks[at].send_multipart(serialize(Request(service, None, meta, (data,))))

    async def recv(self, at: int, within: float = 10.0) -> list[bytes]:
        with anyio.fail_after(within):
            while True:
                try:
                    return self.socks[at].recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    await anyio.sleep(0.002)

    async def silent(self, at: int, seconds: float = 0.1) -> None:
        with anyio.move_on_after(seconds):
            frames = await self.recv(at, seconds + 1)
            raise AssertionError(f"unexpected {frames!r}")

    def close(self) -> None:
        for sock in self.socks:
            sock.close(0)


def rid(n: int) -> bytes:
    return REQUEST_ID_PREFIX + f"{uuid.uuid4().hex[:8]}-{n}".encode()


def data_of(frames: list[bytes]) -> list[bytes]:
    """A reply's data parts, as a raw client gets it (after the metadata's delimiter)."""
    assert frames[:3] == [b"", PROTOCOL, T_REPLY], frames
    rest = frames[3:]  # the client's frame, "", metadata, "", data
    rest = rest[rest.index(b"") + 1 :]
    return rest[rest.index(b"") + 1 :]


async def upper(request: HandlerRequest) -> bytes:
    return request.data[0].upper()


async def test_a_worker_registers_at_every_broker_and_serves_both() -> None:
    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "echo", upper, concurrency=2)
        assert worker.endpoints == (a.endpoint, b.endpoint)
        assert worker.endpoint == a.endpoint
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            client.send(0, b"echo", (rid(1),), b"via a")
            client.send(1, b"echo", (rid(2),), b"via b")
            assert data_of(await client.recv(0)) == [b"VIA A"]
            assert data_of(await client.recv(1)) == [b"VIA B"]
        finally:
            client.close()
        each = worker.brokers()
        assert list(each) == [a.endpoint, b.endpoint]
        assert [s.received for s in each.values()] == [1, 1]
        assert [s.replies for s in each.values()] == [1, 1]
        totals = worker.statistics()
        assert totals.received == 2 and totals.replies == 2 and totals.registered
        assert totals.duplicates == 0
        await worker.aclose()
        assert not worker.registered


async def test_endpoints_are_checked_before_any_socket() -> None:
    with pytest.raises(ValueError, match="empty"):
        Worker([], "echo", upper)
    with pytest.raises(ValueError, match="twice"):
        Worker(["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"], "echo", upper)
    with pytest.raises(ValueError):
        Worker(["tcp://127.0.0.1:5555", "nonsense"], "echo", upper)
    with pytest.raises(ValueError, match="5555,tcp"):  # a str is one endpoint: not split
        Worker("tcp://127.0.0.1:5555,tcp://127.0.0.1:5556", "echo", upper)
    assert Worker(("tcp://127.0.0.1:5555",), "echo", upper).endpoints == ("tcp://127.0.0.1:5555",)


async def test_one_pool_bounds_the_handlers_across_brokers() -> None:
    running = 0
    most = 0
    release = anyio.Event()

    async def slow(request: HandlerRequest) -> bytes:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await release.wait()
        finally:
            running -= 1
        return request.data[0]

    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "slow", slow, concurrency=2)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            for n in range(6):
                client.send(n % 2, b"slow", (rid(n),), b"%d" % n)
            # Each broker grants up to 2: 4 held, 2 running, 2 waiting in the worker.
            await wait_for(lambda: worker.statistics().received == 4)
            await wait_for(lambda: running == 2)
            await anyio.sleep(0.05)
            assert running == 2
            release.set()
            got = [data_of(await client.recv(n % 2)) for n in range(6)]
        finally:
            client.close()
        assert sorted(d[0] for d in got) == [b"%d" % n for n in range(6)]
        assert most == 2
        assert worker.statistics().replies == 6
        await worker.aclose()


async def test_the_same_request_id_through_both_brokers_runs_once() -> None:
    runs = 0
    release = anyio.Event()

    async def once(request: HandlerRequest) -> bytes:
        nonlocal runs
        runs += 1
        await release.wait()
        return request.data[0] + b"!"

    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "once", once, concurrency=2)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            same = rid(1)
            client.send(0, b"once", (same,), b"x")
            await wait_for(lambda: runs == 1)
            client.send(1, b"once", (same,), b"x")  # a failover resend, say
            await wait_for(lambda: worker.statistics().duplicates == 1)
            release.set()
            assert data_of(await client.recv(0)) == [b"x!"]
            assert data_of(await client.recv(1)) == [b"x!"]
            # Answered lately: answered again from the kept answer, not run (Rule WB3).
            client.send(0, b"once", (same,), b"x")
            assert data_of(await client.recv(0)) == [b"x!"]
        finally:
            client.close()
        assert runs == 1
        each = worker.brokers()
        assert [s.duplicates for s in each.values()] == [1, 1]
        assert worker.statistics().duplicates == 2
        await worker.aclose()


async def test_a_lost_broker_held_notice_then_the_answer_through_the_other() -> None:
    started = anyio.Event()
    release = anyio.Event()

    async def slow(request: HandlerRequest) -> bytes:
        started.set()
        await release.wait()
        return request.data[0].upper()

    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "slow", slow)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            request_id = rid(1)
            client.send(0, b"slow", (request_id,), b"held")
            await started.wait()
            a.stop()  # broker A is gone while the handler runs
            notice = await client.recv(1)
            assert data_of(notice) == [HELD_MARKER]
            assert request_id in notice
            await wait_for(lambda: not worker.brokers()[a.endpoint].registered)
            release.set()
            reply = await client.recv(1)
            assert data_of(reply) == [b"HELD"]
            assert request_id in reply
        finally:
            client.close()
        await worker.aclose()


async def test_a_restarted_broker_gets_the_worker_registered_again() -> None:
    async with brokers(2) as (tg, (a, b)):
        worker = Worker(
            [a.endpoint, b.endpoint], "echo", upper, heartbeat_interval=0.2, reconnect_max=0.5
        )
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        a.stop()
        await wait_for(lambda: not worker.brokers()[a.endpoint].registered)
        assert worker.registered  # still at B
        again = RunningBroker(a.endpoint)  # the same tcp port
        await again.start(tg)
        await wait_for(lambda: worker.brokers()[a.endpoint].registered, within=10)
        client = RawClient(a.endpoint)
        try:
            client.send(0, b"echo", (rid(1),), b"back")
            assert data_of(await client.recv(0)) == [b"BACK"]
        finally:
            client.close()
        await worker.aclose()


async def test_a_request_that_waited_past_its_deadline_is_answered_expired() -> None:
    started = anyio.Event()
    release = anyio.Event()
    runs: list[bytes] = []

    async def slow(request: HandlerRequest) -> bytes:
        runs.append(request.data[0])
        started.set()
        await release.wait()
        return request.data[0]

    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "slow", slow)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            client.send(0, b"slow", (rid(1),), b"first")
            await started.wait()
            client.send(1, b"slow", (rid(2), expires_in_option(0.05)), b"late")
            await wait_for(lambda: worker.brokers()[b.endpoint].received == 1)
            await anyio.sleep(0.1)  # past its deadline, waiting for the one slot
            release.set()
            assert data_of(await client.recv(0)) == [b"first"]
            late = data_of(await client.recv(1))
        finally:
            client.close()
        assert late[:2] == [ERROR_MARKER, b"expired"]
        assert runs == [b"first"]
        assert worker.statistics().expired == 1
        await worker.aclose()


async def test_a_stop_finishes_the_running_request_and_leaves_every_broker() -> None:
    started = anyio.Event()

    async def slow(request: HandlerRequest) -> bytes:
        started.set()
        await anyio.sleep(0.2)
        return b"done"

    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "slow", slow)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            client.send(1, b"slow", (rid(1),), b"x")
            await started.wait()
            await worker.aclose(grace=30)
            assert data_of(await client.recv(1)) == [b"done"]
        finally:
            client.close()
        assert not worker.registered
        assert worker.statistics().replies == 1


async def test_a_stream_goes_through_the_broker_that_brought_it() -> None:
    async def count(request: HandlerRequest) -> AsyncIterator[bytes]:
        for i in range(int(request.data[0])):
            yield b"%d" % i

    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "count", count)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        for endpoint in (b.endpoint, a.endpoint):
            async with (
                Client(endpoint, timeout=10) as client,
                client.stream("count", b"50", window=4) as parts,
            ):
                got = [part async for part in parts]
            assert got == [(b"%d" % i,) for i in range(50)]
        await worker.aclose()


async def test_a_refusal_at_one_broker_ends_serving() -> None:
    """Rule WB5: the same keys and services serve every broker; a refusal is a mistake."""
    server, worker_keys = zmq.curve_keypair(), zmq.curve_keypair()
    allowed = CurveServer(*server, clients=[], workers={"echo": [worker_keys[0]]})
    refused = CurveServer(*server, clients=[], workers={"other": [worker_keys[0]]})
    async with anyio.create_task_group() as tg:
        (a,) = await tg.start(Broker("tcp://127.0.0.1:0", security=allowed).serve)
        (b,) = await tg.start(Broker("tcp://127.0.0.1:0", security=refused).serve)
        worker = Worker([a, b], "echo", upper, security=CurveClient(server[0], *worker_keys))
        with anyio.fail_after(10), pytest.raises(RegistrationRefused):
            await worker.serve()
        assert not worker.registered
        tg.cancel_scope.cancel()


async def test_answers_a_lost_broker_may_have_taken_down_go_through_the_other() -> None:
    """Rule WB4: the answers the worker would replay to the lost broker (core Rule W13) go
    through the other brokers at once."""
    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "echo", upper)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            request_id = rid(1)
            client.send(0, b"echo", (request_id,), b"once")
            assert data_of(await client.recv(0)) == [b"ONCE"]
            a.stop()
            again = await client.recv(1)  # the same answer, through B
            assert data_of(again) == [b"ONCE"] and request_id in again
        finally:
            client.close()
        assert worker.statistics().replayed == 1
        await worker.aclose()
