"""The broker's I/O thread and the work for its core from the event loop
(dcp._broker.thread): calls run where the core runs, woken while the socket is busy, at once
without the thread, and after the thread stopped if it did not take them."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
import zmq

from dcp._broker.link import CoreLink
from dcp._broker.thread import CoreCalls, IOThread
from dcp._core.broker.core import BrokerCore
from dcp._io.blocking import Waker
from dcp._io.sockets import AsyncSocket
from dcp.wire import Ping, Reconnect, Register, Reply, Request, serialize
from tests.helpers import Peers, wait_for

pytestmark = pytest.mark.anyio


class Router:
    """The broker's ROUTER socket, bound to a free TCP port, in a context of its own."""

    def __init__(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.bind("tcp://127.0.0.1:0")
        #: (The waker binds the socket to an inproc endpoint too.)
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.asock = AsyncSocket(sock)


@pytest.fixture
def router() -> Iterator[Router]:
    router = Router()
    yield router
    router.asock.close(0)
    router.context.destroy(linger=0)


async def test_io_thread_takes_calls_while_its_socket_is_busy(router: Router) -> None:
    """Wake-ups are fair-queued with the peers' messages, so work for the I/O thread (here
    a call into the core, as reload_security makes) is done while a client keeps the socket
    busy, and the thread still stops promptly."""
    core = BrokerCore()
    link = CoreLink(core, router.asock, max_message_size=-1)
    calls = CoreCalls(threaded=True)
    calls.link = link
    thread = IOThread(link, calls, router.context, batch=256, period=0.25)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(thread.run)
            await wait_for(lambda: link.waker is not None)
            with Peers(router.endpoint) as peers:
                worker, client = peers(b"W"), peers(b"C")
                worker.send(Register(b"echo"))
                await worker.expect(Register(b"echo"))
                # Many requests queued at once (no worker answers): a busy socket.
                for i in range(900):  # under the send high-water mark
                    client.send(Request(b"echo", None, (b"m%d" % i,), (b"d",)))
                calls_made = 0
                for _ in range(5):
                    assert await calls.run(lambda now: 7) == 7
                    calls_made += 1
                assert calls_made == 5
                await worker.expect(Request(b"echo", b"C", (b"m0",), (b"d",)))
                worker.send(Reply(b"C", (b"m0",), (b"ok",)))
                await client.expect(Reply(b"C", (b"m0",), (b"ok",)))
                await wait_for(lambda: core.statistics().requests == 900)
            tg.cancel_scope.cancel()
    assert link.waker is None  # the thread has stopped


class CountingCore(BrokerCore):
    """A broker core that counts the messages it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.received = 0

    def receive(self, frames: list[bytes], now: float, principal: str | None = None) -> None:
        self.received += 1
        super().receive(frames, now, principal)


class RecordingLink(CoreLink):
    """A link that records, at each flush, how many messages its core had been given."""

    def __init__(self, core: CountingCore, asock: AsyncSocket) -> None:
        super().__init__(core, asock, max_message_size=-1)
        self.counting = core
        self.flushed_at: list[int] = []

    def flush(self) -> None:
        self.flushed_at.append(self.counting.received)
        super().flush()


@pytest.mark.parametrize(("batch", "passes"), [(256, [40]), (16, [16, 32, 40]), (2, None)])
async def test_io_thread_reads_what_waits_before_it_sends(
    router: Router, batch: int, passes: list[int] | None
) -> None:
    """Rule I3 of dcp._io.blocking: messages waiting together are all given to the core
    before anything is sent (past the first few, read on until a read finds none), at most
    ``batch`` of them per pass; a pass ends when none is left."""
    core = CountingCore()
    link = RecordingLink(core, router.asock)
    calls = CoreCalls(threaded=True)
    calls.link = link
    # inproc: once the sends below have returned, every message waits at the ROUTER.
    address = f"inproc://test-io-thread-burst-{batch}"
    router.asock.sock.bind(address)
    dealer = router.context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.ROUTING_ID, b"C")
    dealer.connect(address)
    try:
        for _ in range(40):
            dealer.send_multipart(serialize(Ping()))  # from a non-worker: answered RECONNECT
        thread = IOThread(link, calls, router.context, batch=batch, period=0.25)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(thread.run)
                await wait_for(lambda: core.received == 40)
                answers = 0
                while answers < 40:
                    await wait_for(lambda: bool(dealer.poll(0)))
                    assert dealer.recv_multipart() == serialize(Reconnect())
                    answers += 1
                tg.cancel_scope.cancel()
    finally:
        dealer.close(0)
    # (A timer tick may flush between passes, or before the first: the same count again.)
    counts = sorted(set(link.flushed_at) - {0})
    if passes is not None:
        assert counts == passes
    else:
        assert counts == list(range(2, 41, 2))


async def test_without_the_thread_a_call_runs_at_once_and_is_sent(router: Router) -> None:
    """``io_thread=False``: a call runs in the event loop, on its clock, and what it put in
    the outbox is sent at once; with no serve (no link), it runs and nothing is sent."""
    core = BrokerCore()
    calls = CoreCalls(threaded=False)
    assert await calls.run(lambda now: now) <= anyio.current_time()  # not serving
    calls.link = CoreLink(core, router.asock, max_message_size=-1)
    with Peers(router.endpoint) as peers:
        stranger = peers(b"X")
        stranger.send(Ping())
        await wait_for(lambda: router.asock.has_input())
        received = router.asock.drain(1)

        def feed(now: float) -> str:
            core.receive(received[0].frames, now, None)
            return "fed"

        assert await calls.run(feed) == "fed"
        # Nothing else sends on this socket: the call's flush sent the answer.
        await stranger.expect(Reconnect())


async def test_calls_the_thread_did_not_take_run_after_it(router: Router) -> None:
    """A call queued for a thread that never takes it (it has stopped) runs when the
    thread's leftovers are run, and its caller gets its result."""
    core = BrokerCore()
    link = CoreLink(core, router.asock, max_message_size=-1)
    calls = CoreCalls(threaded=True)
    calls.link = link
    waker = Waker(router.context, router.asock.sock)  # no thread reads its wake-ups
    link.waker = waker
    results: list[int] = []

    async def call() -> None:
        results.append(await calls.run(lambda now: 42))

    try:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.sleep(0.05)
                assert results == []  # waiting for the thread
                calls.run_pending(None)
    finally:
        waker.close()
    assert results == [42]


class _AlwaysDue(BrokerCore):
    """A core with something due at every moment (as while a fan-out goes out in slices)."""

    def next_deadline(self) -> float | None:
        return 0.0


async def test_without_the_thread_a_batch_never_puts_the_timers_off(router: Router) -> None:
    """The receive loop brings the timers' sleep forward when the core's next deadline is
    sooner (at most to 1 ms after the batch), never later: moved later after every batch, a
    socket busier than once a millisecond would keep the timers from ever running."""
    core = _AlwaysDue()
    link = CoreLink(core, router.asock, max_message_size=-1)
    # The timers' task, asleep until a minute from now (never entered: it cannot fire).
    timers = anyio.CancelScope(deadline=anyio.current_time() + 60)
    link._timers = timers
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.receive_loop, 16)
            with Peers(router.endpoint) as peers:
                client = peers(b"C")
                client.send(Request(b"echo", None, (b"m0",), (b"d",)))
                await wait_for(lambda: core.statistics().requests == 1)
                first = timers.deadline
                assert first < anyio.current_time() + 1  # brought forward
                await anyio.sleep(0.01)  # past it: a later batch must not move it again
                client.send(Request(b"echo", None, (b"m1",), (b"d",)))
                await wait_for(lambda: core.statistics().requests == 2)
                assert timers.deadline == first
            tg.cancel_scope.cancel()
