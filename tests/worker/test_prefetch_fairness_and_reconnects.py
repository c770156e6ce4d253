"""Review of the worker prefetch (``Worker(..., prefetch=P)``, core Rules W2, W4; Rules WH6,
WL1, WB1): what an attacker or a demanding user would try, on real zmq sockets, both anyio
backends."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import anyio.abc
import pytest

from dcp._models import HandlerRequest
from dcp._worker.worker import Worker
from dcp.wire.messages import Ping, Pong, Reply, Request
from tests.worker.test_worker import CLIENT, SVC, FakeBroker, Result, eventually

pytestmark = pytest.mark.anyio


def req(name: bytes) -> Request:
    return Request(SVC, CLIENT, (b"rid-" + name,), (name,))


class Gates:
    """A handler whose request ``x`` runs until :meth:`open` ``x``; records the start order."""

    def __init__(self) -> None:
        self.gates: dict[bytes, anyio.Event] = {}
        self.started: list[bytes] = []

    def gate(self, name: bytes) -> anyio.Event:
        return self.gates.setdefault(name, anyio.Event())

    def open(self, name: bytes) -> None:
        self.gate(name).set()

    async def __call__(self, request: HandlerRequest) -> Result:
        name = request.data[0]
        self.started.append(name)
        await self.gate(name).wait()
        return name


@pytest.fixture
def two() -> Iterator[tuple[FakeBroker, FakeBroker]]:
    a, b = FakeBroker(), FakeBroker()
    yield a, b
    a.close()
    b.close()


async def reply_data(fake: FakeBroker) -> bytes:
    """The data of the next REPLY, skipping heartbeats."""
    while True:
        _, msg = await fake.recv()
        if isinstance(msg, Reply):
            return msg.data[0]
        assert isinstance(msg, (Ping, Pong)), msg


async def test_a_broker_that_keeps_a_prefetch_full_does_not_starve_another(
    two: tuple[FakeBroker, FakeBroker],
) -> None:
    """Rule WB1: one pool, first come first run. A request from B waiting for the one slot
    runs before one A brought later: A's prefetched requests, started by its core as the
    slot frees, must not jump ahead of it (while A keeps the prefetch full, B's would wait
    for ever)."""
    a, b = two
    gates = Gates()
    worker = Worker([a.endpoint, b.endpoint], SVC, gates, concurrency=1, prefetch=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.serve)
        ida, idb = await a.register(), await b.register()
        a.send(ida, req(b"a1"))
        await a.expect(Ping)  # busy, room for one more
        a.send(ida, req(b"a2"))  # waits in A's core (its prefetch)
        await eventually(lambda: worker.brokers()[a.endpoint].backlog == 1)
        b.send(idb, req(b"b1"))  # waits in the pool for the one slot
        await b.expect(Ping)
        await eventually(lambda: worker.brokers()[b.endpoint].received == 1)
        gates.open(b"a1")
        assert await reply_data(a) == b"a1"
        await eventually(lambda: len(gates.started) == 2)
        a.send(ida, req(b"a3"))  # A fills its prefetch again, after b1 came
        await eventually(lambda: worker.brokers()[a.endpoint].received == 3)
        for name in (b"a2", b"b1", b"a3"):
            gates.open(name)
        for fake, name in ((a, b"a2"), (b, b"b1"), (a, b"a3")):
            assert await reply_data(fake) == name
        await worker.aclose()
    assert gates.started.index(b"b1") < gates.started.index(b"a3"), gates.started


class Proxy:
    """A TCP relay to ``target`` whose connections :meth:`cut` closes: zmq makes them again
    (the same socket, the same routing id) to the same broker."""

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("tcp://").rpartition(":")
        self._host, self._port = host, int(port)
        self._streams: list[anyio.abc.SocketStream] = []
        self.endpoint = ""

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self.endpoint = f"tcp://127.0.0.1:{port}"
        async with listener:
            task_status.started()
            await listener.serve(self._relay)

    async def _relay(self, inbound: anyio.abc.SocketStream) -> None:
        try:
            outbound = await anyio.connect_tcp(self._host, self._port)
        except OSError:
            await inbound.aclose()
            return
        self._streams += [inbound, outbound]

        async def pipe(src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream) -> None:
            try:
                async for chunk in src:
                    await dst.send(chunk)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            finally:
                await src.aclose()
                await dst.aclose()

        async with inbound, outbound, anyio.create_task_group() as tg:
            tg.start_soon(pipe, inbound, outbound)
            tg.start_soon(pipe, outbound, inbound)

    async def cut(self) -> None:
        streams, self._streams = self._streams, []
        for stream in streams:
            await stream.aclose()


async def test_a_cut_connection_made_again_loses_no_prefetched_request() -> None:
    """Core Rule W12 with a prefetch: the same broker at the other end still holds the
    prefetched requests (a retry joins the held copy, its Rule R8): the worker keeps and runs
    them. Dropped, they were never answered while the worker lived."""
    from dcp._broker.broker import Broker
    from dcp._client.client import Client

    gates = Gates()
    async with anyio.create_task_group() as tg:
        (endpoint,) = await tg.start(Broker("tcp://127.0.0.1:0").serve)
        proxy = Proxy(endpoint)
        await tg.start(proxy.serve)
        worker = Worker(proxy.endpoint, "echo", gates, concurrency=1, prefetch=2)
        await tg.start(worker.serve)
        got: dict[bytes, bytes] = {}
        async with Client(endpoint, timeout=10, attempt_timeout=1) as client:

            async def one(name: bytes) -> None:
                got[name] = (await client.request("echo", name)).bytes

            async with anyio.create_task_group() as calls:
                for name in (b"0", b"1", b"2"):
                    calls.start_soon(one, name)
                await eventually(lambda: worker.statistics().backlog == 2)
                await proxy.cut()
                await eventually(lambda: worker.statistics().reconnects == 1 and worker.registered)
                for name in (b"0", b"1", b"2"):
                    gates.open(name)
        assert got == {b"0": b"0", b"1": b"1", b"2": b"2"}
        assert sorted(gates.started) == [b"0", b"1", b"2"]  # each run once
        await worker.aclose()
        tg.cancel_scope.cancel()
