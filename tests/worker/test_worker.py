"""The worker on real zmq sockets, on both anyio backends.

First against a hand-driven ROUTER playing broker with raw frames (:class:`FakeBroker`), then
end to end with :class:`dcp._broker.broker.Broker`, raw DEALER clients and
:class:`dcp._client.client.Client`.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

import anyio
import anyio.abc
import pytest
import zmq

from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._errors import RemoteError
from dcp._io.context import get_context
from dcp._models import Forward, HandlerRequest
from dcp._worker.worker import Worker
from dcp.wire.dcp1 import PROTOCOL, parse, serialize
from dcp.wire.messages import (
    ERROR_MARKER,
    Message,
    Ping,
    Pong,
    Reconnect,
    Register,
    Reply,
    Request,
    parse_error_reply,
)

pytestmark = pytest.mark.anyio

SVC = b"echo"
CLIENT = b"\x01client-address"
META = (b"rid-1", b"m2")
T_REGISTER, T_PING, T_PONG, T_REQUEST, T_REPLY, T_RECONNECT = (bytes([i]) for i in range(1, 7))

Result = bytes | Sequence[bytes] | Forward
M = TypeVar("M", bound=Message)


async def eventually(predicate: Callable[[], bool], limit: float = 5.0) -> None:
    """Wait until ``predicate()`` holds, checking every 5 ms, at most ``limit`` seconds."""
    with anyio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - polling a plain attribute
            await anyio.sleep(0.005)


def registered(worker: Worker) -> bool:
    return worker.registered


class FakeBroker:
    """A ROUTER socket driven by the test: raw frames in and out, no dcp logic."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:0") -> None:
        sock: zmq.Socket[bytes] = get_context().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        self.endpoint = str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self.sock = sock
        self._buffer: deque[list[bytes]] = deque()

    async def recv_raw(self, limit: float = 5.0) -> list[bytes]:
        """The next message as the ROUTER sees it: routing id first."""
        with anyio.fail_after(limit):
            while not self._buffer:
                try:
                    self._buffer.append(self.sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    await anyio.sleep(0.001)
        return self._buffer.popleft()

    async def recv(self, limit: float = 5.0) -> tuple[bytes, Message]:
        frames = await self.recv_raw(limit)
        msg, width = parse(frames[1:])
        assert width == 1
        return frames[0], msg

    async def expect(self, cls: type[M], limit: float = 5.0) -> tuple[bytes, M]:
        ident, msg = await self.recv(limit)
        assert isinstance(msg, cls), f"expected {cls.__name__}, got {msg!r}"
        return ident, msg

    async def expect_silence(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            frames = await self.recv_raw(seconds + 1)
            raise AssertionError(f"unexpected {frames!r}")

    async def register(self, limit: float = 5.0) -> bytes:
        """Receive the registration and echo it; returns the worker's routing id."""
        ident, msg = await self.expect(Register, limit)
        assert msg == Register(SVC)
        self.send(ident, msg)
        # The keep-alive that says the worker beats while busy (worker core Rule W1).
        await self.expect(Pong, limit)
        return ident

    def send(self, ident: bytes, msg: Message) -> None:
        self.sock.send_multipart([ident, *serialize(msg)], zmq.NOBLOCK)

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.close()


def req(i: int = 1, *data: bytes, client: bytes = CLIENT) -> Request:
    return Request(SVC, client, (b"rid-%d" % i, b"m2"), data or (b"data-%d" % i,))


async def start(tg: anyio.abc.TaskGroup, fake: FakeBroker, worker: Worker) -> bytes:
    """Start ``worker.serve`` in ``tg``; play the echo; return once ``tg.start`` returned."""
    started = anyio.Event()

    async def run() -> None:
        await tg.start(worker.serve)
        started.set()

    tg.start_soon(run)
    ident = await fake.register()
    with anyio.fail_after(5):
        await started.wait()
    return ident


def worker_for(
    fake: FakeBroker,
    handler: Callable[[HandlerRequest], Awaitable[Result]],
    **kw: float,
) -> Worker:
    return Worker(fake.endpoint, SVC, handler, **kw)  # type: ignore[arg-type]


async def upper(request: HandlerRequest) -> Result:
    return [part.upper() for part in request.data]


# -- against a fake broker ----------------------------------------------------------------


async def test_serve_starts_only_after_the_echo(fake: FakeBroker) -> None:
    worker = worker_for(fake, upper)
    async with anyio.create_task_group() as tg:
        started = anyio.Event()

        async def run() -> None:
            await tg.start(worker.serve)
            started.set()

        tg.start_soon(run)
        frames = await fake.recv_raw()
        assert frames[1:] == [b"", PROTOCOL, T_REGISTER, SVC]
        await anyio.sleep(0.05)
        assert not started.is_set()
        assert not registered(worker)
        fake.send(frames[0], Register(SVC))
        with anyio.fail_after(5):
            await started.wait()
        assert registered(worker)
        # No PING after the echo: the registration already told the broker we are ready.
        # A PONG instead: a keep-alive saying the worker beats while busy (core Rule W1).
        await fake.expect(Pong)
        await fake.expect_silence(0.1)
        tg.cancel_scope.cancel()


async def test_reply_frames_copy_client_and_metadata(fake: FakeBroker) -> None:
    worker = worker_for(fake, upper)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1, b"abc", b""))
        frames = await fake.recv_raw()
        assert frames == [ident, b"", PROTOCOL, T_REPLY, CLIENT, b"", *META, b"", b"ABC", b""]
        tg.cancel_scope.cancel()
    s = worker.statistics()
    assert (s.received, s.replies, s.errors, s.in_progress) == (1, 1, 0, 0)


async def test_ping_for_more_while_a_slot_is_free(fake: FakeBroker) -> None:
    release = anyio.Event()

    async def blocked(request: HandlerRequest) -> Result:
        await release.wait()
        return request.data[0]

    worker = worker_for(fake, blocked, concurrency=2)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        assert await fake.recv_raw() == [ident, b"", PROTOCOL, T_PING]
        fake.send(ident, Pong())
        fake.send(ident, req(2))
        # Both slots busy: no more asking.
        await fake.expect_silence(0.15)
        release.set()
        got = sorted([(await fake.expect(Reply))[1].data for _ in range(2)])
        assert got == [(b"data-1",), (b"data-2",)]
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("collapse", [True, False], ids=["collapsed", "per-signal"])
async def test_concurrency_is_exactly_n(fake: FakeBroker, collapse: bool) -> None:
    """The fake broker dispatches a request for each readiness signal (REGISTER, PING, REPLY);
    ``collapse`` keeps readiness a boolean as DCP brokers do, else every signal counts."""
    n, total = 3, 30
    running = 0
    most = 0
    rng = random.Random(7)

    async def handler(request: HandlerRequest) -> Result:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await anyio.sleep(rng.random() * 0.02)
        finally:
            running -= 1
        return request.data[0]

    worker = worker_for(fake, handler, concurrency=n)
    queue = deque(req(i) for i in range(total))
    replies: list[bytes] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.serve)
        credit = 0
        with anyio.fail_after(10):
            while len(replies) < total:
                ident, msg = await fake.recv()
                if isinstance(msg, Register):
                    fake.send(ident, msg)
                elif isinstance(msg, (Ping, Pong)):
                    fake.send(ident, Pong())
                elif isinstance(msg, Reply):
                    replies.append(msg.data[0])
                if isinstance(msg, (Register, Ping, Reply)):
                    credit = 1 if collapse else credit + 1
                while credit and queue:
                    credit -= 1
                    fake.send(ident, queue.popleft())
        tg.cancel_scope.cancel()
    assert sorted(replies) == sorted(b"data-%d" % i for i in range(total))
    assert most == n
    s = worker.statistics()
    assert (s.received, s.replies, s.in_progress, s.backlog) == (total, total, 0, 0)


async def test_backlog_never_runs_more_than_n(fake: FakeBroker) -> None:
    """The rare race: a request arrives while all N slots are busy; it waits its turn."""
    release = anyio.Event()
    running = 0
    most = 0

    async def handler(request: HandlerRequest) -> Result:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await release.wait()
        finally:
            running -= 1
        return request.data[0]

    worker = worker_for(fake, handler, concurrency=1)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        fake.send(ident, req(2))
        await eventually(lambda: worker.statistics().backlog == 1)
        assert running == 1
        release.set()
        got = [(await fake.expect(Reply))[1].data for _ in range(2)]
        assert got == [(b"data-1",), (b"data-2",)]
        tg.cancel_scope.cancel()
    assert most == 1
    s = worker.statistics()
    assert (s.received, s.replies, s.backlogged, s.backlog) == (2, 2, 1, 0)


async def test_pong_keepalive_when_full_ping_when_free(fake: FakeBroker) -> None:
    release = anyio.Event()

    async def blocked(request: HandlerRequest) -> Result:
        await release.wait()
        return b"ok"

    worker = worker_for(fake, blocked, heartbeat_interval=0.1, liveness=5)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        for _ in range(3):
            assert await fake.recv_raw(limit=1) == [ident, b"", PROTOCOL, T_PONG]
            fake.send(ident, Pong())
        release.set()
        await fake.expect(Reply)
        assert await fake.recv_raw(limit=1) == [ident, b"", PROTOCOL, T_PING]
        tg.cancel_scope.cancel()


async def test_broker_silence_reconnects_on_a_new_socket(fake: FakeBroker) -> None:
    release = anyio.Event()

    async def blocked(request: HandlerRequest) -> Result:
        await release.wait()
        return b"late"

    worker = worker_for(
        fake,
        blocked,
        heartbeat_interval=0.1,
        liveness=3,
        reconnect_min=0.05,
        reconnect_max=0.1,
    )
    async with anyio.create_task_group() as tg:
        first = await start(tg, fake, worker)
        fake.send(first, req(1))
        # Say nothing more: the worker keeps beating (PONGs: its one slot is busy)...
        with anyio.fail_after(5):
            while True:
                ident, msg = await fake.recv()
                if isinstance(msg, Register):
                    break
                assert (ident, msg) == (first, Pong())
        # ... then registers again from a fresh socket, with a new routing id.
        second = ident
        assert second != first
        assert worker.statistics().reconnects == 1
        fake.send(second, Register(SVC))
        await eventually(lambda: registered(worker))
        # The request in progress survived; its reply goes out on the current socket.
        release.set()
        with anyio.fail_after(5):
            while True:
                ident, msg = await fake.recv()
                if isinstance(msg, Reply):
                    break
                fake.send(ident, Pong())  # keep the worker's liveness fed meanwhile
        assert ident == second
        assert msg == Reply(CLIENT, META, (b"late",))
        tg.cancel_scope.cancel()
    assert worker.statistics().reconnects == 1


async def test_no_broker_at_all_keeps_retrying(fake: FakeBroker) -> None:
    worker = worker_for(
        fake, upper, heartbeat_interval=0.02, liveness=2, reconnect_min=0.01, reconnect_max=0.02
    )
    idents: set[bytes] = set()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.serve)
        with anyio.fail_after(5):
            while len(idents) < 3:
                ident, _ = await fake.expect(Register)
                idents.add(ident)
        assert worker.statistics().reconnects >= 2
        await worker.aclose(grace=1)
        # Never registered: nothing is owed to the broker, serve() returned.
    assert not registered(worker)


async def test_reconnect_message_reregisters_at_once(fake: FakeBroker) -> None:
    worker = worker_for(fake, upper)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, Reconnect())
        assert await fake.recv_raw(limit=1) == [ident, b"", PROTOCOL, T_REGISTER, SVC]
        fake.send(ident, Register(SVC))
        await fake.expect(Pong)
        fake.send(ident, req(7, b"x"))
        _, msg = await fake.expect(Reply)
        assert msg == Reply(CLIENT, (b"rid-7", b"m2"), (b"X",))
        tg.cancel_scope.cancel()
    s = worker.statistics()
    assert (s.reregistrations, s.reconnects) == (1, 0)


async def test_handler_exception_is_an_error_reply(
    fake: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(request: HandlerRequest) -> Result:
        raise ValueError("no such thing")

    worker = worker_for(fake, boom)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        with caplog.at_level(logging.ERROR, logger="dcp.worker"):
            fake.send(ident, req(1))
            frames = await fake.recv_raw()
        assert frames == [
            ident,
            *[b"", PROTOCOL, T_REPLY, CLIENT, b"", *META, b""],
            *[ERROR_MARKER, b"handler_error", b"ValueError: no such thing"],
        ]
        tg.cancel_scope.cancel()
    assert any(r.name == "dcp.worker" and r.exc_info for r in caplog.records)
    assert worker.statistics().errors == 1


@pytest.mark.parametrize("bad", [None, 42, [b"ok", 3], {"a": 1}])
async def test_bad_handler_result_is_an_error_reply(fake: FakeBroker, bad: object) -> None:
    async def wrong(request: HandlerRequest) -> Result:
        return bad  # type: ignore[return-value]

    worker = worker_for(fake, wrong)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        _, msg = await fake.expect(Reply)
        assert isinstance(msg, Reply)
        assert (msg.client, msg.metadata) == (CLIENT, META)
        error = parse_error_reply(msg.data)
        assert error is not None
        assert error[0] == "bad_handler_result"
        tg.cancel_scope.cancel()


async def test_forward_frames_keep_client_and_metadata(fake: FakeBroker) -> None:
    async def forward(request: HandlerRequest) -> Result:
        if request.data[0] == b"other":
            return Forward(b"other", b"p")
        return Forward("next", b"p", b"")

    worker = worker_for(fake, forward)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        frames = await fake.recv_raw()
        head = [ident, b"", PROTOCOL, T_REQUEST]
        assert frames == [*head, b"next", CLIENT, b"", *META, b"", b"p", b""]
        fake.send(ident, req(2, b"other"))
        frames = await fake.recv_raw()
        assert frames == [*head, b"other", CLIENT, b"", b"rid-2", b"m2", b"", b"p"]
        tg.cancel_scope.cancel()
    assert worker.statistics().forwards == 2


async def test_graceful_stop_finishes_in_flight_then_leaves(fake: FakeBroker) -> None:
    release = anyio.Event()
    ran: list[bytes] = []

    async def blocked(request: HandlerRequest) -> Result:
        ran.append(request.data[0])
        await release.wait()
        return b"done-" + request.data[0]

    worker = worker_for(fake, blocked, concurrency=2)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        await fake.expect(Ping)
        fake.send(ident, req(2))
        await eventually(lambda: len(ran) == 2)
        worker.stop(grace=5)
        # A request arriving while stopping is not run (the broker requeues it on leave).
        fake.send(ident, req(3))
        await fake.expect_silence(0.1)
        release.set()
        got = sorted([(await fake.expect(Reply))[1].data for _ in range(2)])
        assert got == [(b"done-data-1",), (b"done-data-2",)]
        assert await fake.recv_raw() == [ident, b"", PROTOCOL, T_RECONNECT]
        with anyio.fail_after(5):
            await worker.aclose()
    assert ran == [b"data-1", b"data-2"]
    s = worker.statistics()
    assert (s.received, s.replies, s.dropped, s.cancelled) == (3, 2, 1, 0)


async def test_stop_grace_cancels_slow_handlers(fake: FakeBroker) -> None:
    cancelled = anyio.Event()

    async def forever(request: HandlerRequest) -> Result:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")  # pragma: no cover

    worker = worker_for(fake, forever)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        await eventually(lambda: worker.statistics().in_progress == 1)
        before = anyio.current_time()
        with anyio.fail_after(5):
            await worker.aclose(grace=0.2)
        assert anyio.current_time() - before >= 0.19
        assert cancelled.is_set()
        # No reply for the cancelled request, only the leave.
        assert await fake.recv_raw() == [ident, b"", PROTOCOL, T_RECONNECT]
    s = worker.statistics()
    assert (s.cancelled, s.replies, s.in_progress) == (1, 0, 0)


async def test_async_with_leaves_on_exit(fake: FakeBroker) -> None:
    async def play() -> None:
        ident = await fake.register()
        fake.send(ident, req(1, b"q"))
        _, msg = await fake.expect(Reply)
        assert msg.data == (b"Q",)
        assert await fake.recv_raw() == [ident, b"", PROTOCOL, T_RECONNECT]

    async with anyio.create_task_group() as tg:
        tg.start_soon(play)
        async with worker_for(fake, upper) as worker:
            await eventually(lambda: worker.statistics().replies == 1)
    assert not registered(worker)


async def test_async_with_body_error_is_not_wrapped(fake: FakeBroker) -> None:
    async def play() -> None:
        await fake.register()

    async with anyio.create_task_group() as tg:
        tg.start_soon(play)
        with pytest.raises(KeyError):
            async with worker_for(fake, upper):
                raise KeyError("body")


async def test_cancelling_the_task_group_closes_the_socket_promptly(fake: FakeBroker) -> None:
    handler_cancelled = anyio.Event()

    async def forever(request: HandlerRequest) -> Result:
        try:
            await anyio.sleep_forever()
        finally:
            handler_cancelled.set()
        raise AssertionError("unreachable")  # pragma: no cover

    worker = worker_for(fake, forever)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            ident = await start(tg, fake, worker)
            fake.send(ident, req(1))
            await eventually(lambda: worker.statistics().in_progress == 1)
            socket = worker._connection.socket
            assert socket is not None
            sock = socket.sock
            tg.cancel_scope.cancel()
    assert sock.closed
    assert handler_cancelled.is_set()
    # Cancellation tells the broker nothing: it finds out by liveness.
    await fake.expect_silence(0.05)


async def test_serve_only_once(fake: FakeBroker) -> None:
    worker = worker_for(fake, upper)
    async with anyio.create_task_group() as tg:
        await start(tg, fake, worker)
        with pytest.raises(RuntimeError):
            await worker.serve()
        tg.cancel_scope.cancel()


async def test_malformed_and_unexpected_messages_are_counted(fake: FakeBroker) -> None:
    worker = worker_for(fake, upper)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.sock.send_multipart([ident, b"", b"nonsense"])
        fake.send(ident, Reply(CLIENT, (), (b"?",)))
        fake.send(ident, req(1, b"still works"))
        _, msg = await fake.expect(Reply)
        assert msg.data == (b"STILL WORKS",)
        tg.cancel_scope.cancel()
    s = worker.statistics()
    assert (s.malformed, s.unexpected) == (1, 1)


# -- end to end with the real broker -----------------------------------------------------


async def raw_request(
    client: zmq.Socket[bytes], service: bytes, meta: Sequence[bytes], *data: bytes
) -> list[bytes]:
    """Send a request from a raw DEALER and wait for the reply's frames."""
    client.send_multipart(serialize(Request(service, None, tuple(meta), data)), zmq.NOBLOCK)
    with anyio.fail_after(5):
        while True:
            try:
                return client.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                await anyio.sleep(0.002)


def raw_client(endpoint: str) -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = get_context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


async def test_end_to_end_with_broker_and_raw_client() -> None:
    async with anyio.create_task_group() as tg:
        (endpoint,) = await tg.start(Broker("tcp://127.0.0.1:0").serve)
        worker = Worker(endpoint, "echo", upper, concurrency=2)
        await tg.start(worker.serve)
        client = raw_client(endpoint)
        try:
            frames = await raw_request(client, b"echo", [b"id-1"], b"hello", b"")
        finally:
            client.close(0)
        # The broker inserted the client's address; the reply carries it back.
        assert frames[:3] == [b"", PROTOCOL, T_REPLY]
        assert frames[3] and frames[4:] == [b"", b"id-1", b"", b"HELLO", b""]
        await worker.aclose()
        tg.cancel_scope.cancel()


async def test_forwarding_dag_of_three_services() -> None:
    async def a(request: HandlerRequest) -> Result:
        return Forward("b", request.data[0] + b"-a")

    async def b(request: HandlerRequest) -> Result:
        return Forward("c", request.data[0] + b"-b")

    async def c(request: HandlerRequest) -> Result:
        return [request.data[0] + b"-c", request.metadata[0]]

    async with anyio.create_task_group() as tg:
        (endpoint,) = await tg.start(Broker("tcp://127.0.0.1:0").serve)
        workers = [Worker(endpoint, name, h) for name, h in (("a", a), ("b", b), ("c", c))]
        for w in workers:
            await tg.start(w.serve)
        client = raw_client(endpoint)
        try:
            for i in range(5):
                frames = await raw_request(client, b"a", [b"req-%d" % i, b"x"], b"in%d" % i)
                msg, _ = parse(frames)
                assert isinstance(msg, Reply)
                assert (msg.metadata, msg.data) == (
                    (b"req-%d" % i, b"x"),
                    (b"in%d-a-b-c" % i, b"req-%d" % i),
                )
        finally:
            client.close(0)
        assert [w.statistics().forwards for w in workers] == [5, 5, 0]
        assert workers[2].statistics().replies == 5
        tg.cancel_scope.cancel()


async def test_broker_restart_on_the_same_port() -> None:
    hb = dict(heartbeat_interval=0.05, liveness=3)
    async with anyio.create_task_group() as tg:
        first = Broker("tcp://127.0.0.1:0", **hb)  # type: ignore[arg-type]
        broker_scope = anyio.CancelScope()

        async def run_first(*, task_status: anyio.abc.TaskStatus[str]) -> None:
            with broker_scope:
                async with first:
                    task_status.started(first.endpoints[0])
                    await anyio.sleep_forever()

        endpoint: str = await tg.start(run_first)
        worker = Worker(endpoint, "echo", upper, reconnect_min=0.05, reconnect_max=0.2, **hb)  # type: ignore[arg-type]
        await tg.start(worker.serve)
        client = raw_client(endpoint)
        try:
            assert (await raw_request(client, b"echo", [b"1"], b"one"))[-1] == b"ONE"
        finally:
            client.close(0)
        # Kill the broker, then start a new one on the same port.
        broker_scope.cancel()
        await eventually(lambda: not registered(worker))  # broker gone
        second = Broker(endpoint, **hb)  # type: ignore[arg-type]
        await tg.start(second.serve)
        await eventually(lambda: registered(worker))
        assert worker.statistics().reconnects >= 1
        client = raw_client(endpoint)
        try:
            assert (await raw_request(client, b"echo", [b"2"], b"two"))[-1] == b"TWO"
        finally:
            client.close(0)
        await worker.aclose()
        tg.cancel_scope.cancel()


async def test_handler_calls_another_service_through_a_client() -> None:
    async def front(request: HandlerRequest) -> Result:
        async with Client(endpoint, timeout=5) as client:
            response = await client.request("back", request.data[0])
        return [b"front:" + response.data[0]]

    async def back(request: HandlerRequest) -> Result:
        return request.data[0][::-1]

    async def failing(request: HandlerRequest) -> Result:
        raise RuntimeError("nope")

    async with anyio.create_task_group() as tg:
        (endpoint,) = await tg.start(Broker("tcp://127.0.0.1:0").serve)
        for name, h in (("front", front), ("back", back), ("failing", failing)):
            await tg.start(Worker(endpoint, name, h).serve)
        async with Client(endpoint, timeout=5) as client:
            response = await client.request("front", b"abc", metadata=[b"mine"])
            assert response.data == (b"front:cba",)
            assert response.metadata == (b"mine",)
            with pytest.raises(RemoteError) as info:
                await client.request("failing", b"x", retries=0)
        assert info.value.code == "handler_error"
        assert info.value.message == "RuntimeError: nope"
        tg.cancel_scope.cancel()


async def test_bad_endpoint_raises_unwrapped() -> None:
    with pytest.raises(ValueError, match="scheme must be tcp, ipc or inproc"):
        async with Worker("nonsense://nowhere", "echo", upper):
            pass  # pragma: no cover


async def test_cancelling_the_async_with_body_closes_at_once(fake: FakeBroker) -> None:
    async def play() -> None:
        ident = await fake.register()
        fake.send(ident, req(1))

    handler_cancelled = anyio.Event()

    async def forever(request: HandlerRequest) -> Result:
        try:
            await anyio.sleep_forever()
        finally:
            handler_cancelled.set()
        raise AssertionError("unreachable")  # pragma: no cover

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(play)
            with anyio.CancelScope() as scope:
                async with worker_for(fake, forever) as worker:
                    await eventually(lambda: worker.statistics().in_progress == 1)
                    scope.cancel()
                    await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert handler_cancelled.is_set()
    assert worker._connection.socket is None
    # Not a graceful stop: nothing was sent (no reply, no leave).
    await fake.expect_silence(0.05)


async def test_stop_while_the_broker_is_gone_waits_for_handlers(fake: FakeBroker) -> None:
    release = anyio.Event()

    async def blocked(request: HandlerRequest) -> Result:
        await release.wait()
        return b"never delivered"

    worker = worker_for(
        fake, blocked, heartbeat_interval=0.05, liveness=2, reconnect_min=5, reconnect_max=5
    )
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        fake.send(ident, req(1))
        await eventually(lambda: worker.statistics().reconnects == 0 and not registered(worker))
        # The broker is silent: the worker is waiting 5 s before it reconnects.
        worker.stop(grace=5)
        await anyio.sleep(0.05)
        assert worker.statistics().in_progress == 1
        release.set()
        with anyio.fail_after(2):
            await worker.aclose()
    s = worker.statistics()
    assert (s.replies, s.in_progress, s.reconnects) == (1, 0, 0)


async def test_a_burst_larger_than_one_batch(fake: FakeBroker) -> None:
    worker = worker_for(fake, upper, concurrency=1)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        for _ in range(200):
            fake.send(ident, Pong())
        fake.send(ident, req(1, b"after"))
        _, msg = await fake.expect(Reply)
        assert msg.data == (b"AFTER",)
        tg.cancel_scope.cancel()
