"""What the worker's connection does with a full send queue (dcp._worker.connection Rules WC6
and WC7): fresh messages wait for room, in order, while the connection lives; replayed answers
are best effort. Real zmq sockets on tcp 127.0.0.1 (a peer that does not read, small buffers
and high-water marks make the queue full for sure), both anyio backends."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator

import anyio
import pytest
import zmq

from dcp._core.worker.core import State, WorkerCore
from dcp._models import HandlerRequest
from dcp._worker.connection import Connection
from dcp._worker.results import result_message
from dcp._worker.streams import WorkerStreams
from dcp._worker.worker import Worker
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import HELD_MARKER, Message, Ping, Pong, Register, Reply, Request
from dcp.wire.options import REQUEST_ID_PREFIX
from tests.helpers import wait_for

pytestmark = pytest.mark.anyio

SVC = b"echo"
CLIENT = b"\x01client"
#: Big enough that a few fill the kernel's small buffers.
BIG = b"x" * 100_000
#: More than a stalled peer's buffers and queues can take of :data:`BIG` messages.
MANY = 200


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    """A context whose sockets have a send high-water mark of 8 and small kernel buffers."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.setsockopt(zmq.SNDHWM, 8)
    ctx.setsockopt(zmq.SNDBUF, 65536)
    ctx.setsockopt(zmq.LINGER, 0)
    yield ctx
    ctx.destroy(linger=0)


class Peer:
    """A ROUTER the test reads when it wants (nothing is read meanwhile: the queue fills)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        sock: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.RCVHWM, 2)
        sock.setsockopt(zmq.RCVBUF, 65536)
        sock.bind("tcp://127.0.0.1:0")
        self.endpoint = str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self.sock = sock

    async def recv_raw(self, within: float = 10.0) -> list[bytes]:
        """The next message, the routing id first."""
        with anyio.fail_after(within):
            while True:
                try:
                    return self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    await anyio.sleep(0.001)

    async def recv(self, within: float = 10.0) -> list[bytes]:
        """The next message, without the routing id."""
        return (await self.recv_raw(within))[1:]

    async def register(self) -> bytes:
        """Echo the worker's registration; its routing id."""
        while True:
            frames = await self.recv_raw()
            msg, _ = parse(frames[1:])
            if isinstance(msg, Register):
                self.send(frames[0], msg)
                return frames[0]

    def send(self, ident: bytes, msg: Message) -> None:
        self.sock.send_multipart([ident, *serialize(msg)], zmq.NOBLOCK)

    async def silent(self, seconds: float = 0.1) -> None:
        with anyio.move_on_after(seconds):
            frames = await self.recv(seconds + 1)
            raise AssertionError(f"unexpected {frames!r}")

    def close(self) -> None:
        self.sock.close(0)


def connection_to(
    peer: Peer, ctx: zmq.Context[zmq.Socket[bytes]]
) -> tuple[WorkerCore, Connection]:
    core = WorkerCore(SVC, concurrency=1, random=lambda: 0.0)
    connection = Connection(
        core,
        WorkerStreams(),
        endpoint=peer.endpoint,
        services="'echo'",
        context=ctx,
        security=None,
        wake=lambda: None,
    )
    return core, connection


def state_of(core: WorkerCore) -> State:
    """``core.state``, read through a call so mypy does not narrow it between steps."""
    return core.state


def answer(i: int, data: bytes = BIG) -> list[bytes]:
    return serialize(Reply(CLIENT, (REQUEST_ID_PREFIX + b"%d" % i,), (data,)))


def id_of(frames: list[bytes]) -> bytes:
    return frames[5]  # "", header, type, client, "", the id


async def test_fresh_messages_wait_for_room_in_order_and_none_is_dropped(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """Rule WC6: more answers than the queue can take while the broker reads nothing: none
    is refused; each reaches the broker, in order, once it reads."""
    peer = Peer(context)
    _, connection = connection_to(peer, context)
    try:
        async with anyio.create_task_group() as tg:
            connection.open(tg)
            for i in range(MANY):
                connection.send(answer(i))
            assert connection.send_failures == 0
            got = [id_of(await peer.recv()) for _ in range(MANY)]
            assert got == [REQUEST_ID_PREFIX + b"%d" % i for i in range(MANY)]
            # Sending goes on as before once the queue has room.
            connection.send(answer(MANY, b"small"))
            assert id_of(await peer.recv()) == REQUEST_ID_PREFIX + b"%d" % MANY
            assert connection.send_failures == 0
            connection.close(0)
    finally:
        peer.close()


async def test_what_waits_when_the_connection_is_lost_is_dropped_and_replayed(
    context: zmq.Context[zmq.Socket[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    """Rule WC6's bound: the connection is lost while answers wait for room. They are dropped
    (counted, logged once) and the core is told the connection was congested: it keeps the
    whole replay window (an answer 2 s old, beyond the last ``I`` seconds) for the next
    registration (core Rule W13)."""
    peer = Peer(context)
    core, connection = connection_to(peer, context)
    try:
        async with anyio.create_task_group() as tg:
            connection.open(tg)
            now = anyio.current_time()
            core.connect(now)
            for frames in core.drain()[0]:
                connection.send(frames)
            await peer.recv()  # the REGISTER (the echo is given to the core directly)
            core.receive(serialize(Register(SVC)), now)
            request = Request(SVC, CLIENT, (REQUEST_ID_PREFIX + b"old",), (b"d",))
            core.receive(serialize(request), now)
            old = result_message(request, b"r")
            core.finish(old, now - 2.0)  # sent 2 s ago (L x I is 3 s, I is 1 s)
            core.drain()
            assert state_of(core) is State.READY
            for i in range(MANY):
                connection.send(answer(i))
            with caplog.at_level(logging.WARNING, logger="dcp.worker"):
                peer.close()
                await wait_for(lambda: connection.send_failures > 0)
            assert state_of(core) is State.DISCONNECTED
            assert core.take_replays() == [old]
            assert "while they waited for room" in caplog.text
            connection.close(0)
    finally:
        peer.close()


async def test_replays_go_only_while_the_queue_has_room_and_never_before_what_waits(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """Rule WC7: at most half the send high-water mark (8) at once; none while fresh
    messages wait; the rest dropped and counted."""
    peer = Peer(context)
    _, connection = connection_to(peer, context)
    try:
        async with anyio.create_task_group() as tg:
            connection.open(tg)
            replays = [answer(1000 + i, b"r") for i in range(10)]
            connection.send_replays(replays)
            assert connection.replays_dropped == 6
            got = [id_of(await peer.recv()) for _ in range(4)]
            assert got == [id_of(frames) for frames in replays[:4]]
            await peer.silent()
            # The queue full: fresh answers wait; replays are not sent, none delays them.
            for i in range(MANY):
                connection.send(answer(i))
            connection.send_replays(replays[:3])
            assert connection.replays_dropped == 9
            got = [id_of(await peer.recv()) for _ in range(MANY)]
            assert got == [REQUEST_ID_PREFIX + b"%d" % i for i in range(MANY)]
            await peer.silent()
            assert connection.send_failures == 0
            connection.close(0)
    finally:
        peer.close()


async def test_held_notices_wait_for_room_and_go_before_the_replays(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """Rule WB4 with WC6 and WC7: A is lost while B's queue is full (B reads nothing). The
    HELD notice for the request A brought waits for room and reaches B after what was
    queued before it; the answer the worker would replay through B is dropped (counted),
    never sent ahead of the notice nor instead of it."""
    release = anyio.Event()

    async def handler(request: HandlerRequest) -> bytes:
        if request.data[0] == b"hold":
            await release.wait()
        return request.data[0]

    a, b = Peer(context), Peer(context)
    worker = Worker([a.endpoint, b.endpoint], "echo", handler, concurrency=4, context=context)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve)
            ident_a = await a.register()
            ident_b = await b.register()
            await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
            done = Request(SVC, CLIENT, (REQUEST_ID_PREFIX + b"done",), (b"d",))
            a.send(ident_a, done)
            while parse(await a.recv())[0] != Reply(CLIENT, done.metadata, (b"d",)):
                pass
            held = Request(SVC, CLIENT, (REQUEST_ID_PREFIX + b"held",), (b"hold",))
            a.send(ident_a, held)
            await wait_for(lambda: worker.brokers()[a.endpoint].in_progress == 1)

            # B's queue fills with big answers it does not read.
            def answered_at_b(n: int) -> bool:
                return worker.brokers()[b.endpoint].replies == n

            for i in range(MANY // 4):
                b.send(ident_b, Request(SVC, CLIENT, (REQUEST_ID_PREFIX + b"%d" % i,), (BIG,)))
                await wait_for(functools.partial(answered_at_b, i + 1))
            b.send(ident_b, Ping())  # B is alive (the worker's liveness rule, core Rule W6)
            a.close()
            await wait_for(lambda: not worker.brokers()[a.endpoint].registered)
            got: list[Message] = []
            while True:
                msg, _ = parse(await b.recv())
                if isinstance(msg, (Ping, Pong)):
                    continue
                got.append(msg)
                if isinstance(msg, Reply) and msg.data == (HELD_MARKER,):
                    break
            assert len(got) == MANY // 4 + 1
            assert got[-1] == Reply(CLIENT, held.metadata, (HELD_MARKER,))
            release.set()
            while True:  # the held request's answer, through B: no replay of "done" on B
                msg, _ = parse(await b.recv())
                if isinstance(msg, Reply):
                    assert msg == Reply(CLIENT, held.metadata, (b"hold",))
                    break
            stats = worker.brokers()[b.endpoint]
            assert stats.send_failures == 0
            assert worker.statistics().replays_dropped == 1
            await worker.aclose()
    finally:
        a.close()
        b.close()
