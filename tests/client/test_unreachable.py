"""A broker that is not there fails in under a second when the client says so
(``wait_for_broker=False``: dcp._io.handshake Rule H6, dcp._core.client.tracker Rule RT9,
dcp._client.receive Rule RX7, dcp._client.sync_receive Rule SX5); by default the client waits
for its broker, and a client that connected once never fails this way. Real sockets: a TCP
port taken from port 0 then closed (nothing listens), an ``ipc://`` path with no listener.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator

import anyio
import anyio.from_thread
import pytest

import dcp
from dcp import BrokerUnreachable, Client, HandlerRequest, RequestTimeout, SyncClient
from tests.helpers import wait_for

#: A hang guard only: every call below has a 30 s timeout and should fail in about 0.5 s.
GUARD = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ipc_path() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        yield f"ipc://{os.path.join(tmp, 'none.sock')}"


@pytest.fixture(params=["tcp", "ipc"])
def nowhere(request: pytest.FixtureRequest, ipc_path: str) -> str:
    """An endpoint where nothing listens."""
    return f"tcp://127.0.0.1:{free_port()}" if request.param == "tcp" else ipc_path


async def upper(request: HandlerRequest) -> bytes:
    return request.data[0].upper()


def _check(exc: BrokerUnreachable, *endpoints: str) -> None:
    assert isinstance(exc, RequestTimeout)
    assert exc.endpoints == endpoints
    assert "connection refused" in str(exc)
    for endpoint in endpoints:
        assert endpoint in str(exc)


@pytest.mark.anyio
async def test_a_client_that_does_not_wait_fails_when_no_broker_listens(nowhere: str) -> None:
    async with Client(nowhere, timeout=30, wait_for_broker=False) as client:
        with anyio.fail_after(GUARD):
            with pytest.raises(BrokerUnreachable) as caught:
                await client.request("svc", b"x")
            _check(caught.value, nowhere)
            # Later calls fail at once, whatever they are.
            with pytest.raises(BrokerUnreachable):
                await client.request("svc", b"y")
            outcomes = [o async for o in client.map_outcomes("svc", [b"a"])]  # maps Rule MP5
            assert [type(o) for o in outcomes] == [BrokerUnreachable]
            with pytest.raises(BrokerUnreachable):
                async with client.stream("svc", b"x") as parts:
                    async for _ in parts:
                        pass  # pragma: no cover
        assert client.statistics().pending == 0


@pytest.mark.anyio
async def test_pending_requests_of_every_caller_fail_together() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    failed: list[BaseException] = []

    async def call(client: Client, data: bytes) -> None:
        try:
            await client.request("svc", data)
        except BrokerUnreachable as exc:
            failed.append(exc)

    async with Client(endpoint, timeout=30, wait_for_broker=False) as client:
        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(call, client, b"%d" % i)
    assert len(failed) == 3


@pytest.mark.anyio
async def test_outcomes_pending_when_the_verdict_comes_are_outcomes() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    async with Client(endpoint, timeout=30, wait_for_broker=False) as client:
        with anyio.fail_after(GUARD):
            outcomes = [o async for o in client.map_outcomes("svc", [b"a", b"b"])]
    assert [type(o) for o in outcomes] == [BrokerUnreachable, BrokerUnreachable]


@pytest.mark.anyio
async def test_every_input_of_map_outcomes_has_an_outcome_across_the_verdict() -> None:
    """Maps Rule MP5: with a window of one, the first input is pending at the verdict, the
    others are started after it; each has its outcome. ``map`` and ``map_unordered`` raise."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    async with Client(endpoint, timeout=30, wait_for_broker=False) as client:
        with anyio.fail_after(GUARD):
            inputs = [b"a", b"b", b"c"]
            outcomes = [o async for o in client.map_outcomes("svc", inputs, window=1)]
            assert [type(o) for o in outcomes] == [BrokerUnreachable] * 3
            # Pending at the verdict, and started after it: the same error.
            assert len({str(o) for o in outcomes}) == 1
            with pytest.raises(BrokerUnreachable):
                async for _ in client.map("svc", inputs):
                    pass  # pragma: no cover
            with pytest.raises(BrokerUnreachable):
                async for _ in client.map_unordered("svc", inputs):
                    pass  # pragma: no cover
        # An early exit forgets the unsent inputs too.
        async with contextlib.aclosing(client.map_outcomes("svc", inputs, window=2)) as gen:
            async for outcome in gen:
                assert isinstance(outcome, BrokerUnreachable)
                break
        assert client.statistics().pending == 0


def test_every_input_of_the_sync_map_outcomes_has_an_outcome_across_the_verdict() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with SyncClient(endpoint, timeout=30, wait_for_broker=False) as client:
        inputs = [b"a", b"b", b"c"]
        outcomes = list(client.map_outcomes("svc", inputs, window=1))
        assert [type(o) for o in outcomes] == [BrokerUnreachable] * 3
        with pytest.raises(BrokerUnreachable):
            list(client.map("svc", inputs))
        with pytest.raises(BrokerUnreachable):
            list(client.map_unordered("svc", inputs))
        for outcome in client.map_outcomes("svc", inputs, window=2):
            assert isinstance(outcome, BrokerUnreachable)
            break
        assert client.statistics().pending == 0


@pytest.mark.anyio
async def test_several_brokers_none_listening(ipc_path: str) -> None:
    endpoints = (f"tcp://127.0.0.1:{free_port()}", ipc_path)
    async with Client(endpoints, timeout=30, wait_for_broker=False) as client:
        with anyio.fail_after(GUARD):
            with pytest.raises(BrokerUnreachable) as caught:
                await client.request("svc", b"x")
            with pytest.raises(BrokerUnreachable):  # each broker is asked: none is there
                await client.services()
    _check(caught.value, *endpoints)


@pytest.mark.anyio
async def test_endpoints_are_given_one_by_one_whatever_their_text() -> None:
    """``BrokerUnreachable.endpoints`` is the client's endpoints as given, not split out of
    the message (an ``ipc://`` path may hold ", " or " or ")."""
    with tempfile.TemporaryDirectory() as tmp:
        odd = f"ipc://{os.path.join(tmp, 'a, b or c.sock')}"
        endpoints = (odd, f"tcp://127.0.0.1:{free_port()}")
        async with Client(odd, timeout=30, wait_for_broker=False) as client:
            with anyio.fail_after(GUARD), pytest.raises(BrokerUnreachable) as caught:
                await client.request("svc", b"x")
        _check(caught.value, odd)
        async with Client(endpoints, timeout=30, wait_for_broker=False) as client:
            with anyio.fail_after(GUARD), pytest.raises(BrokerUnreachable) as caught:
                await client.request("svc", b"x")
        _check(caught.value, *endpoints)


def test_the_sync_client_gives_endpoints_one_by_one_whatever_their_text() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        odd = f"ipc://{os.path.join(tmp, 'a, b or c.sock')}"
        endpoints = (odd, f"tcp://127.0.0.1:{free_port()}")
        with (
            SyncClient(endpoints, timeout=30, wait_for_broker=False) as client,
            pytest.raises(BrokerUnreachable) as caught,
        ):
            client.request("svc", b"x")
        _check(caught.value, *endpoints)


def test_the_sync_client_fails_too(nowhere: str) -> None:
    with SyncClient(nowhere, timeout=30, wait_for_broker=False) as client:
        with pytest.raises(BrokerUnreachable) as caught:
            client.request("svc", b"x")
        _check(caught.value, nowhere)
        with pytest.raises(BrokerUnreachable):
            client.request("svc", b"y")
        outcomes = list(client.map_outcomes("svc", [b"a"]))  # maps Rule MP5
        assert [type(o) for o in outcomes] == [BrokerUnreachable]


def test_the_sync_client_of_several_brokers_fails_too(ipc_path: str) -> None:
    endpoints = (f"tcp://127.0.0.1:{free_port()}", ipc_path)
    with SyncClient(endpoints, timeout=30, wait_for_broker=False) as client:
        with pytest.raises(BrokerUnreachable):  # waits for no first handshake
            client.services()
        with pytest.raises(BrokerUnreachable) as caught:
            client.request("svc", b"x")
    _check(caught.value, *endpoints)


@pytest.mark.anyio
async def test_by_default_a_client_waits_for_a_broker_that_starts_later() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    async with Client(endpoint, timeout=30) as client:
        with anyio.fail_after(GUARD * 2):
            async with anyio.create_task_group() as tg:
                replies: list[bytes] = []
                answered = anyio.Event()

                async def call() -> None:
                    response = await client.request("late", b"q", wait_for_worker=True)
                    replies.append(response.data[0])
                    answered.set()

                tg.start_soon(call)
                await anyio.sleep(0.3)  # the broker comes 0.3 s after the client's call
                async with dcp.Broker(endpoint), dcp.Worker(endpoint, "late", upper):
                    await answered.wait()
    assert replies == [b"Q"]


@pytest.mark.anyio
async def test_a_client_that_connected_once_never_fails_as_unreachable() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    async with Client(endpoint, timeout=30, wait_for_broker=False) as client:
        async with dcp.Broker(endpoint):
            with anyio.fail_after(GUARD):
                assert await client.services() == []  # connected and heard
        # The broker is gone: the reconnections are refused, far more than four times
        # during this call, which still waits its whole time.
        with anyio.fail_after(GUARD), pytest.raises(RequestTimeout) as caught:
            await client.request("svc", b"x", timeout=1.5)
        assert type(caught.value) is RequestTimeout
        # A broker back on the same endpoint answers, as with the default.
        async with dcp.Broker(endpoint), dcp.Worker(endpoint, "svc", upper):
            with anyio.fail_after(GUARD * 2):
                response = await client.request("svc", b"x", wait_for_worker=True)
        assert response.data == (b"X",)


@pytest.mark.anyio
async def test_inproc_gives_no_refusal_and_waits() -> None:
    async with Client("inproc://dcp-nobody-here", timeout=0.7, wait_for_broker=False) as c:
        with anyio.fail_after(GUARD), pytest.raises(RequestTimeout) as caught:
            await c.request("svc", b"x")
    assert type(caught.value) is RequestTimeout


@pytest.mark.anyio
async def test_a_broker_that_comes_after_the_refusals_is_used() -> None:
    """Unreachable is not for good: once a connection succeeds, calls go through."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    async with Client(endpoint, timeout=30, wait_for_broker=False) as client:
        with anyio.fail_after(GUARD):
            with pytest.raises(BrokerUnreachable):
                await client.request("svc", b"x")
            async with dcp.Broker(endpoint):
                while True:  # until zmq's next attempt connects (within 0.2 s)
                    try:
                        assert await client.services() == []
                        break
                    except BrokerUnreachable:
                        await anyio.sleep(0.02)


# -- Rules RX7 / SX5: a request ended as unreachable is never delivered later ---------------


def _counting(ran: list[bytes]) -> Callable[[HandlerRequest], Awaitable[bytes]]:
    async def handler(request: HandlerRequest) -> bytes:
        ran.append(request.data[0])
        return request.data[0].upper()

    return handler


async def _nothing_delivered(broker: dcp.Broker, ran: list[bytes]) -> None:
    """Wait for the worker's registration, then a little beyond (zmq connects within its
    reconnection interval, 0.1-0.2 s, and sends what it queued at once); nothing ran."""
    await wait_for(lambda: broker.statistics().workers == 1)
    await anyio.sleep(0.5)
    assert ran == []
    assert broker.statistics().requests == 0


@pytest.mark.anyio
@pytest.mark.parametrize("several", [False, True])
async def test_a_request_ended_as_unreachable_never_reaches_a_later_broker(
    several: bool, ipc_path: str
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    endpoints: str | tuple[str, ...] = (endpoint, ipc_path) if several else endpoint
    ran: list[bytes] = []
    async with Client(endpoints, timeout=30, wait_for_broker=False) as client:
        with anyio.fail_after(GUARD):
            with pytest.raises(BrokerUnreachable):
                await client.request("svc", b"x")
        async with dcp.Broker(endpoint) as broker, dcp.Worker(endpoint, "svc", _counting(ran)):
            with anyio.fail_after(GUARD * 2):
                await _nothing_delivered(broker, ran)
                while True:  # the client still works: until zmq's next attempt connects
                    try:
                        response = await client.request("svc", b"y")
                        break
                    except BrokerUnreachable:
                        await anyio.sleep(0.02)
    assert response.data == (b"Y",)
    assert ran == [b"y"]


@pytest.mark.parametrize("several", [False, True])
def test_the_sync_client_never_delivers_a_request_ended_as_unreachable(
    several: bool, ipc_path: str
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    endpoints: str | tuple[str, ...] = (endpoint, ipc_path) if several else endpoint
    ran: list[bytes] = []
    with SyncClient(endpoints, timeout=30, wait_for_broker=False) as client:
        with pytest.raises(BrokerUnreachable):
            client.request("svc", b"x")
        with (
            anyio.from_thread.start_blocking_portal() as portal,
            portal.wrap_async_context_manager(dcp.Broker(endpoint)) as broker,
            portal.wrap_async_context_manager(dcp.Worker(endpoint, "svc", _counting(ran))),
        ):
            portal.call(_nothing_delivered, broker, ran)
            response = None
            deadline = time.monotonic() + GUARD
            while response is None and time.monotonic() < deadline:
                try:  # the client still works: until zmq's next attempt connects
                    response = client.request("svc", b"y", timeout=5)
                except BrokerUnreachable:
                    time.sleep(0.02)
    assert response is not None
    assert response.data == (b"Y",)
    assert ran == [b"y"]


@pytest.mark.parametrize("several", [False, True])
def test_the_sync_client_uses_a_broker_that_comes_after_the_refusals(
    anyio_backend: str, ipc_path: str, several: bool
) -> None:
    """Rule SX5: the sync client reads its monitors only while it waits for replies, so a
    request started after the verdict reads the events waiting there first: the broker's
    connection since is seen (it was refused from the stale verdict for good)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    endpoints = (endpoint, ipc_path) if several else (endpoint,)
    with SyncClient(endpoints, timeout=30, wait_for_broker=False) as client:
        with pytest.raises(BrokerUnreachable):
            client.request("svc", b"x")
        with anyio.from_thread.start_blocking_portal(backend=anyio_backend) as portal:
            future, _ = portal.start_task(dcp.Broker(endpoint).serve)
            try:
                deadline = time.monotonic() + GUARD
                while True:  # until zmq's next attempt connects (within 0.2 s)
                    try:
                        assert client.services() == []
                        break
                    except BrokerUnreachable:
                        assert time.monotonic() < deadline, "the broker was never used"
                        time.sleep(0.02)
            finally:
                future.cancel()


#: A process with an idle SyncClient whose broker is not there (zmq retries every 1 ms, a
#: default pyzmq gives every socket of the context), then another socket of its context.
_IDLE = """
import sys, time, zmq, dcp
ctx = zmq.Context()
ctx.setsockopt(zmq.RECONNECT_IVL, 1)
with dcp.SyncClient(sys.argv[1], timeout=30, context=ctx):
    time.sleep(4)  # thousands of refusals (not a speed: 2,000 are all it takes)
    server, other = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    other.connect(f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}")
    other.send(b"ping")
    print("delivered" if server.poll(5000) else "stalled", flush=True)
    server.close(0)
    other.close(0)
ctx.term()
print("closed", flush=True)
"""


def test_an_idle_sync_client_that_waits_for_its_broker_does_not_stall_zmq(
    nowhere: str,
) -> None:
    """Handshakes Rule H6's events are watched only with ``wait_for_broker=False``: a sync
    client reads its monitor only while it waits for replies, and an unread monitor that fills
    (2,000 events: a refusal every 0.1-0.2 s, 5 minutes of a broker down) blocks the context's
    I/O thread, every socket of the process with it, and the client's close hangs. In a
    process of its own, which is killed if it hangs."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _IDLE, nowhere],
            capture_output=True,
            text=True,
            timeout=GUARD * 3,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process hung: {exc.stdout!r}")
    assert done.stdout.split() == ["delivered", "closed"], done.stderr
