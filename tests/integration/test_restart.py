"""A broker restart while handlers run (the same endpoint, a new broker process state):
the worker notices its socket's new connection, registers again before it sends anything
(worker core Rule W12), and its finished work is delivered through the new broker, which
keeps a reply until the client has reconnected too (``dcp._core.broker.unreachable``). Nothing is
run twice and the client does not retry. Real tcp on 127.0.0.1, both backends."""

from __future__ import annotations

from typing import TypeVar

import anyio
import pytest
import zmq

from dcp import Broker, Client, CurveClient, CurveServer, Worker
from dcp._io.context import get_context
from dcp._models import HandlerRequest
from dcp.wire import Message, Register, Reply, Request, parse, serialize

pytestmark = pytest.mark.anyio

M = TypeVar("M", bound=Message)


BROKER = zmq.curve_keypair()
PEER = zmq.curve_keypair()


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
async def test_work_finished_across_a_broker_restart_is_delivered_once(secure: bool) -> None:
    # With CURVE the new broker opens the client addresses the old one sealed (the sealing
    # key comes from the broker's secret key).
    server = CurveServer(*BROKER, clients=[PEER[0]], workers={"slow": [PEER[0]]})
    security = server if secure else None
    peer = CurveClient(BROKER[0], *PEER) if secure else None
    runs: list[bytes] = []
    running = anyio.Event()
    release = anyio.Event()

    async def slow(request: HandlerRequest) -> bytes:
        runs.append(request.data[0])
        if len(runs) == 3:
            running.set()
        await release.wait()
        return request.data[0].upper()

    async with anyio.create_task_group() as outer:
        first = Broker("tcp://127.0.0.1:0", security=security)
        scope = anyio.CancelScope()

        async def serve_first(*, task_status: anyio.abc.TaskStatus[list[str]]) -> None:
            with scope:
                await first.serve(task_status=task_status)

        [endpoint] = await outer.start(serve_first)
        replies: dict[bytes, bytes] = {}
        async with (
            # A slow heartbeat: the worker must not learn of the restart from a heartbeat's
            # answer (a RECONNECT) before its handlers finish; its socket tells it.
            Worker(
                endpoint, "slow", slow, concurrency=3, heartbeat_interval=5, security=peer
            ) as worker,
            Client(endpoint, timeout=20, security=peer) as client,
        ):

            async def call(word: bytes) -> None:
                replies[word] = (await client.request("slow", word)).data[0]

            async with anyio.create_task_group() as calls:
                for word in (b"a", b"b", b"c"):
                    calls.start_soon(call, word)
                with anyio.fail_after(5):
                    await running.wait()
                scope.cancel()  # the broker goes away while the three handlers run
                await anyio.sleep(0.1)
                second = Broker(endpoint, security=security)
                await outer.start(second.serve)
                await anyio.sleep(0.3)  # the peers reconnect (zmq retries every 0.1 s)
                release.set()
        stats = second.statistics()
        outer.cancel_scope.cancel()
    assert replies == {b"a": b"A", b"b": b"B", b"c": b"C"}
    assert sorted(runs) == [b"a", b"b", b"c"]  # each ran once
    assert client.statistics().retries == 0
    assert (stats.replies, stats.requests, stats.dropped_replies) == (3, 0, 0)
    assert stats.rejections == {}
    assert worker.statistics().reconnects >= 1


async def _recv(sock: zmq.Socket[bytes], within: float = 5.0) -> list[bytes]:
    with anyio.fail_after(within):
        while True:
            try:
                return sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                await anyio.sleep(0.001)


async def _recv_message(sock: zmq.Socket[bytes], kind: type[M]) -> tuple[bytes, M]:
    """The next message of type ``kind`` (heartbeats skipped), with its sender."""
    while True:
        frames = await _recv(sock)
        msg, _ = parse(frames[1:])
        if isinstance(msg, kind):
            return frames[0], msg


async def test_a_reply_the_dead_broker_never_passed_on_is_delivered_once() -> None:
    # Worker core Rule W13. The first "broker" takes the worker's reply and dies without
    # passing it on (what a SIGKILL between the two does); the worker sends it again to
    # the new broker after registering, and the client gets it without a retry.
    runs: list[bytes] = []

    async def echo(request: HandlerRequest) -> bytes:
        runs.append(request.data[0])
        return request.data[0].upper()

    old = get_context().socket(zmq.ROUTER)
    old.setsockopt(zmq.LINGER, 0)
    old.bind("tcp://127.0.0.1:0")
    endpoint = old.getsockopt_string(zmq.LAST_ENDPOINT)
    worker = Worker(endpoint, "echo", echo, heartbeat_interval=5)
    async with anyio.create_task_group() as outer:
        outer.start_soon(worker.serve)  # ready once the echo below reaches it
        async with Client(endpoint, timeout=30, retries=1) as client:  # a retry after 15 s
            wid, register = await _recv_message(old, Register)
            old.send_multipart([wid, *serialize(register)])  # the echo: READY
            result: list[bytes] = []
            answered = anyio.Event()

            async def call() -> None:
                result.append((await client.request("echo", b"once")).data[0])
                answered.set()

            outer.start_soon(call)
            cid, request = await _recv_message(old, Request)
            old.send_multipart(
                [wid, *serialize(Request(b"echo", cid, request.metadata, request.data))]
            )
            await _recv_message(old, Reply)  # taken, never passed on
            old.close(0)
            await anyio.sleep(0.1)
            new = Broker(endpoint)
            await outer.start(new.serve)
            with anyio.fail_after(10):  # well before the client's retry
                await answered.wait()
            stats = new.statistics()
            outer.cancel_scope.cancel()
    assert result == [b"ONCE"]
    assert runs == [b"once"]
    assert client.statistics().retries == 0
    assert worker.statistics().replayed == 1
    assert (stats.replies, stats.unmatched, stats.rejections) == (1, 1, {})
