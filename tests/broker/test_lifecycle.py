"""Starting and stopping the broker: cancellation, the context-manager form, bind failures.

Each test gives the broker its own zmq context and terminates it at the end: ``term()`` only
returns once every socket of the context is closed, so a leaked socket fails the test.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import anyio
import pytest
import zmq

from dcp._broker.broker import Broker
from dcp._errors import BindFailed
from dcp.wire import Ping, Pong, Reconnect, Register, Request
from tests.helpers import Peers, wait_for

pytestmark = pytest.mark.anyio


#: Contexts whose ``term()`` outlived its bound, still running in a thread: never destroyed
#: (``destroy()`` would term them again from this thread, and libzmq aborts the process:
#: "Assertion failed: pfd.revents & POLLIN (src/signaler.cpp:238)").
_STUCK: set[int] = set()


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    if id(ctx) not in _STUCK:
        ctx.destroy(linger=0)


async def terminate(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """Terminate ``ctx``, failing if a socket of it was left open.

    ``term()`` waits for every socket of the context, so an open one is named at once
    instead of waited for. The bound on ``term()`` itself is only a hang guard: zmq's I/O
    thread finishes closing sockets in its own time, slowly on a loaded machine.
    """
    made = list(ctx._sockets)  # pyzmq lists a context's sockets only there
    left = [sock for sock in made if not sock.closed]
    if left:
        ctx.destroy(linger=0)
        pytest.fail(f"{len(left)} socket(s) of the broker's context left open: {left}")
    try:
        with anyio.fail_after(30):
            await anyio.to_thread.run_sync(ctx.term, abandon_on_cancel=True)
    except TimeoutError:
        _STUCK.add(id(ctx))
        pytest.fail("the broker's context did not terminate within 30 s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def bind_once(endpoint: str) -> bool:
    """Whether a TCP listener could bind ``endpoint``'s port (released synchronously)."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.socket() as sock:
        # As zmq does: a port whose old connections are in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            return False
    return True


async def assert_bindable(endpoint: str) -> None:
    """The endpoint's address can be bound again soon (the broker let go of it).

    zmq closes a socket asynchronously: its I/O thread releases the listening port a moment
    after ``close()`` returns (later on a loaded machine), so this retries for up to 10 s.
    """
    await wait_for(lambda: bind_once(endpoint), within=10.0)


async def test_cancel_stops_a_busy_broker_promptly_and_closes_its_socket(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    broker = Broker("tcp://127.0.0.1:0", context=context)
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(broker.serve)
        assert broker.endpoints == [endpoint]
        with Peers(endpoint) as peers:
            w = peers(b"W1")
            w.send(Register(b"echo"))
            await w.expect(Register(b"echo"))
            client = peers(b"C1")
            for n in range(500):
                client.send(Request(b"echo", None, (b"%d" % n,), (b"x",)))
            await w.recv()
            # Cancel with requests still arriving and queued.
            start = anyio.current_time()
            tg.cancel_scope.cancel()
    assert anyio.current_time() - start < 1.0
    assert broker.endpoints == []
    assert broker.statistics().requests > 0
    await assert_bindable(endpoint)
    await terminate(context)


async def test_a_cancelled_broker_can_serve_again(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    broker = Broker(endpoint, context=context)
    for _ in range(2):
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                assert await tg.start(broker.serve) == [endpoint]
                with Peers(endpoint) as peers:
                    stranger = peers(b"X")
                    stranger.send(Ping())
                    await stranger.expect(Reconnect())
                tg.cancel_scope.cancel()
        assert broker.endpoints == []
        # zmq releases the port a few milliseconds after the close, not during it: binding
        # it again at once can fail with EADDRINUSE.
        await assert_bindable(endpoint)
    assert broker.statistics().reconnects_sent == 2
    assert broker.statistics().rejections == {}
    await terminate(context)


async def test_cancel_right_after_start(context: zmq.Context[zmq.Socket[bytes]]) -> None:
    broker = Broker("tcp://127.0.0.1:0", "inproc://cancel-right-after-start", context=context)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            endpoints = await tg.start(broker.serve)
            tg.cancel_scope.cancel()
    assert endpoints[1] == "inproc://cancel-right-after-start"
    assert broker.endpoints == []
    await assert_bindable(endpoints[0])
    await terminate(context)


async def test_async_with_form(context: zmq.Context[zmq.Socket[bytes]]) -> None:
    async with Broker("tcp://127.0.0.1:0", context=context) as broker:
        [endpoint] = broker.endpoints
        assert endpoint.startswith("tcp://127.0.0.1:")
        with Peers(endpoint) as peers:
            stranger = peers(b"X")
            stranger.send(Ping())
            await stranger.expect(Reconnect())
        # A serving broker cannot be entered or served a second time.
        with pytest.raises(RuntimeError, match="already serving"):
            async with broker:
                pytest.fail("entered a serving broker twice")
        with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="already serving")):
            async with anyio.create_task_group() as tg:
                await tg.start(broker.serve)
        assert broker.endpoints == [endpoint]
    assert broker.endpoints == []
    await assert_bindable(endpoint)
    await terminate(context)


async def test_async_with_form_lets_the_bodys_error_through_unwrapped(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    with pytest.raises(ValueError, match="from the body"):
        async with Broker("tcp://127.0.0.1:0", context=context):
            raise ValueError("from the body")
    await terminate(context)


async def test_async_with_form_is_cancellable(context: zmq.Context[zmq.Socket[bytes]]) -> None:
    with anyio.move_on_after(0.05) as scope:
        async with Broker("tcp://127.0.0.1:0", context=context) as broker:
            await anyio.sleep(5)
    assert scope.cancelled_caught
    assert broker.endpoints == []
    await terminate(context)


async def test_unbindable_endpoint_raises_and_leaks_nothing(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    busy: zmq.Socket[bytes] = context.socket(zmq.ROUTER)
    try:
        busy.bind("tcp://127.0.0.1:0")
        taken = busy.getsockopt_string(zmq.LAST_ENDPOINT)
        first = f"tcp://127.0.0.1:{free_port()}"
        broker = Broker(first, taken, context=context)
        # The context-manager form raises the one real error, not a group.
        with pytest.raises(BindFailed) as info:  # dcp's own error, zmq's errno
            async with broker:
                pytest.fail("a broker that could not bind started")
        assert info.value.errno == zmq.EADDRINUSE
        assert broker.endpoints == []
        # The first endpoint, bound before the failure, was released.
        await assert_bindable(first)
        # In the caller's own task group the error arrives as that group's error.
        with pytest.RaisesGroup(BindFailed):
            async with anyio.create_task_group() as tg:
                await tg.start(broker.serve)
        assert broker.endpoints == []
        await assert_bindable(first)
    finally:
        busy.close(0)
    await terminate(context)


async def test_bad_endpoint_syntax_raises(context: zmq.Context[zmq.Socket[bytes]]) -> None:
    with pytest.raises(BindFailed, match=r"^cannot bind nonsense://nowhere: "):
        async with Broker("nonsense://nowhere", context=context):
            pytest.fail("a broker with a bad endpoint started")
    await terminate(context)


async def test_exit_without_enter_does_nothing() -> None:
    broker = Broker("tcp://127.0.0.1:0")
    assert await broker.__aexit__(None, None, None) is None
    assert broker.endpoints == []


def test_a_broker_needs_an_endpoint() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        Broker()


@pytest.mark.parametrize("io_thread", [True, False], ids=["io-thread", "event-loop"])
async def test_both_io_loops_route_expire_and_stop(io_thread: bool) -> None:
    """The broker's I/O loop in its own thread (the default) and in the event loop: each
    routes a request, answers a stranger's ping, expires a silent worker (the timers), and
    stops promptly when cancelled."""
    broker = Broker("tcp://127.0.0.1:0", heartbeat_interval=0.05, liveness=2, io_thread=io_thread)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            [endpoint] = await tg.start(broker.serve)
            with Peers(endpoint) as peers:
                worker, client = peers(b"W"), peers(b"C")
                worker.send(Register(b"echo"))
                await worker.expect(Register(b"echo"))
                client.send(Request(b"echo", None, (b"m",), (b"d",)))
                await worker.expect(Request(b"echo", b"C", (b"m",), (b"d",)))
                client.send(Ping())
                await client.expect(Reconnect())
                # The worker beat while busy (a pong): silent now, it expires (Rule L3).
                worker.send(Pong())
                await wait_for(lambda: broker.statistics().expired_workers == 1)
            tg.cancel_scope.cancel()
    assert broker.endpoints == []
