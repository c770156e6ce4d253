"""The worker's parts on their own, on real zmq sockets and both anyio backends: the
:class:`~dcp._worker.connection.Connection` (open, send, the monitor's events given to the
core, close) and the :class:`~dcp._worker.handlers.Handlers` (a run's answer given to the core
and sent at once, the backlog's next request started, a stopping worker woken).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import anyio
import pytest

from dcp._core.worker.core import Run, State, WorkerCore
from dcp._io.sockets import AsyncSocket
from dcp._worker.connection import Connection
from dcp._worker.handlers import Handlers
from dcp._worker.services import served_services
from dcp._worker.slots import HandlerSlots
from dcp._worker.streams import WorkerStreams
from dcp.wire.dcp1 import serialize
from dcp.wire.messages import Ping, Pong, Register, Reply, Request
from tests.helpers import wait_for
from tests.worker.test_worker import FakeBroker

pytestmark = pytest.mark.anyio

SVC = b"echo"
CLIENT = b"\x01client"


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.close()


class Woken:
    """A ``wake`` callback that counts its calls."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def parts(
    endpoint: str, *, concurrency: int = 1
) -> tuple[WorkerCore, WorkerStreams, Connection, Woken]:
    core = WorkerCore(SVC, concurrency=concurrency, random=lambda: 0.0)
    streams = WorkerStreams()
    woken = Woken()
    connection = Connection(
        core,
        streams,
        endpoint=endpoint,
        services="'echo'",
        context=None,
        security=None,
        wake=woken,
    )
    return core, streams, connection, woken


def socket_of(connection: Connection) -> AsyncSocket | None:
    """``connection.socket``, read through a call so mypy does not narrow it between steps."""
    return connection.socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_a_connection_sends_the_cores_frames_and_closes_once(fake: FakeBroker) -> None:
    core, _, connection, _ = parts(fake.endpoint)
    async with anyio.create_task_group() as tg:
        asock = connection.open(tg)
        assert socket_of(connection) is asock
        core.connect(0.0)
        outbox, events = core.drain()
        for frames in outbox:
            connection.send(frames)
        _, msg = await fake.expect(Register)
        assert msg == Register(SVC) and events == []
        connection.close(0)
        assert socket_of(connection) is None
        assert asock.closed
        connection.close(0)  # idempotent
        await connection.send_part([b"", b"x"])  # no connection: dropped, at once
    assert connection.send_failures == 0 and connection.failure is None


async def test_a_send_that_fails_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    # Nobody listens: zmq queues up to its high-water mark, then refuses (zmq.Again); what
    # is sent then waits for room (Rule WC6) until the connection is closed: then it is
    # counted and logged.
    _, _, connection, _ = parts(f"tcp://127.0.0.1:{free_port()}")
    async with anyio.create_task_group() as tg:
        connection.open(tg)
        try:
            with caplog.at_level(logging.WARNING, logger="dcp.worker"):
                for _ in range(1_001):
                    connection.send(serialize(Ping(), width=4))
                connection.send(serialize(Ping(), width=4))
                assert connection.send_failures == 0
        finally:
            with caplog.at_level(logging.WARNING, logger="dcp.worker"):
                connection.close(0)
    assert connection.send_failures == 2
    assert "could not send 2 message(s) to broker" in caplog.text


async def test_the_monitor_gives_a_lost_and_a_new_connection_to_the_core() -> None:
    """Connection Rule WC2 and the core's Rule W12: the broker restarts on the same port."""
    first = FakeBroker()
    endpoint = first.endpoint
    core, _, connection, woken = parts(endpoint)
    try:
        async with anyio.create_task_group() as tg:
            connection.open(tg)
            core.connect(0.0)
            for frames in core.drain()[0]:
                connection.send(frames)
            ident, _ = await first.expect(Register)
            first.send(ident, Register(SVC))
            # The echo, read as the serving task would.
            asock = connection.socket
            assert asock is not None
            await wait_for(lambda: asock.drain(1))
            core.receive(serialize(Register(SVC)), 0.1)
            assert core.state is State.READY
            core.drain()
            first.close()
            await wait_for(lambda: core.state is State.DISCONNECTED)  # by the monitor's task
            assert woken.count >= 1
            second = FakeBroker(endpoint)
            try:
                await wait_for(lambda: core.state is State.REGISTERING)
                outbox, _ = core.drain()
                assert outbox == [serialize(Register(SVC))]
            finally:
                second.close()
            connection.close(0)
    finally:
        first.close()


async def test_handlers_give_the_answer_to_the_core_and_send_it(fake: FakeBroker) -> None:
    release = anyio.Event()

    async def upper(request: object) -> bytes:
        await release.wait()
        return b"DONE"

    core, streams, connection, _ = parts(fake.endpoint)
    woken = Woken()  # the connection's monitor wakes its own
    served = served_services("echo", upper, None, 1)
    handlers = Handlers(core, connection, streams, served, tracing=None, wake=woken)
    first = Request(SVC, CLIENT, (b"id-1",), (b"a",))
    second = Request(SVC, CLIENT, (b"id-2",), (b"b",))
    async with anyio.create_task_group() as tg:
        slots: HandlerSlots[Run] = await tg.start(handlers.host)
        assert handlers.slots is slots
        try:
            connection.open(tg)
            core.connect(0.0)
            core.receive(serialize(Register(SVC)), 0.0)
            core.receive(serialize(first), 0.0)
            core.receive(serialize(second), 0.0)  # concurrency 1: waits in the core's backlog
            outbox, events = core.drain()
            for frames in outbox:
                connection.send(frames)
            assert events == [Run(first)]
            slots.submit(Run(first))
            await fake.expect(Register)
            await fake.expect(Pong)
            release.set()
            # The answer leaves at once, and the backlog's request is started in its place.
            _, reply = await fake.expect(Reply)
            assert reply == Reply(CLIENT, (b"id-1",), (b"DONE",))
            _, reply = await fake.expect(Reply)
            assert reply == Reply(CLIENT, (b"id-2",), (b"DONE",))
            assert core.statistics().replies == 2 and core.in_progress == 0
            assert woken.count == 0  # not stopping: nobody to wake
            # A stopping worker is woken when a run ends (it may be done).
            core.receive(serialize(Request(SVC, CLIENT, (b"id-3",), (b"c",))), 1.0)
            _, events = core.drain()
            assert len(events) == 1 and isinstance(events[0], Run)
            core.stop()
            slots.submit(events[0])
            await wait_for(lambda: core.in_progress == 0)
            assert woken.count == 1
        finally:
            handlers.cancel()
            connection.close(0)
