"""Who reads the async client's socket (Rule RX5 of :mod:`dcp._client.receive`): a lone
``request()`` reads it itself; other calls, a second call, a cancelled reader and the socket
left unread all go back to the receive task, and no reply is lost; and Rule RX3, what ends a
reader (a request or a receive task) ends the client. Real sockets, both anyio backends;
white-box checks of the receiver's reader."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence

import anyio
import pytest
import zmq

from dcp import RequestTimeout
from dcp._client import receive
from dcp._client.client import Client
from dcp._models import Response
from dcp.wire import Request
from tests.fakes import FakeBroker, silent

pytestmark = pytest.mark.anyio


def delayed(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    """Echo after the delay the request's second part names (seconds), else at once."""
    delay = float(req.data[1]) if len(req.data) > 1 else 0.0
    return [(delay, req.data[:1])]


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    with anyio.fail_after(within):
        while not condition():  # noqa: ASYNC110 (state changed by other threads)
            await anyio.sleep(0.005)


def reader(client: Client) -> int:
    return client._receiver._reader


def caller(client: Client) -> bytes | None:
    return client._receiver._caller


def assert_clean(client: Client) -> None:
    assert client.statistics().pending == 0
    assert client._receiver.waiters == {}


async def test_a_lone_request_reads_the_socket_and_leaves_it_free() -> None:
    with FakeBroker(delayed) as broker:
        async with Client(broker.endpoint) as client:
            for i in range(3):
                assert await client.request("echo", b"%d" % i) == Response((b"%d" % i,))
            # Nothing pending: the socket is free, the receive task parked.
            assert reader(client) == receive._FREE
            assert caller(client) is None
            got: list[Response] = []

            async def one() -> None:
                got.append(await client.request("echo", b"slow", b"0.3"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one)
                await eventually(lambda: caller(client) is not None)
                assert reader(client) == receive._CALLER
                assert client._receiver._park is not None  # the receive task waits aside
            assert got == [Response((b"slow",))]
            assert reader(client) == receive._FREE
            # Left unread, the socket goes back to the receive task within _LEND seconds.
            await eventually(lambda: reader(client) == receive._RECEIVER)
            assert await client.request("echo", b"again") == Response((b"again",))
            assert_clean(client)


async def test_a_second_call_is_answered_by_the_reading_request() -> None:
    """The reader delivers another call's reply; when it ends with that call still pending,
    the receive task reads again."""
    order: list[bytes] = []
    with FakeBroker(delayed) as broker:
        async with Client(broker.endpoint) as client:
            await client.request("echo", b"warm")

            async def one(name: bytes, delay: bytes) -> None:
                response = await client.request("echo", name, delay)
                assert response == Response((name,))
                order.append(name)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, b"first", b"0.4")
                await eventually(lambda: caller(client) is not None)
                reading = caller(client)
                tg.start_soon(one, b"second", b"0.0")  # answered at once, read by "first"
                await eventually(lambda: order == [b"second"])
                assert caller(client) == reading
            assert order == [b"second", b"first"]
            assert reader(client) == receive._FREE
            assert_clean(client)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, b"third", b"0.1")  # the reader, answered first
                await eventually(lambda: caller(client) is not None)
                tg.start_soon(one, b"fourth", b"0.6")
                await eventually(lambda: order[-1:] == [b"third"])
                assert caller(client) is None
                assert reader(client) == receive._RECEIVER  # "fourth" still pending
            assert order[2:] == [b"third", b"fourth"]
            assert_clean(client)


async def test_the_reading_request_cancelled_loses_no_other_reply() -> None:
    with FakeBroker(delayed) as broker:
        async with Client(broker.endpoint) as client:
            await client.request("echo", b"warm")
            got: list[Response] = []

            async def other() -> None:
                got.append(await client.request("echo", b"other", b"0.7"))

            scope = anyio.CancelScope()

            async def reading() -> None:
                with scope:
                    await client.request("echo", b"reader", b"0.5")
                    raise AssertionError("not cancelled")  # pragma: no cover

            async with anyio.create_task_group() as tg:
                tg.start_soon(reading)
                await eventually(lambda: caller(client) is not None)
                tg.start_soon(other)
                await eventually(lambda: client.statistics().pending == 2)
                scope.cancel()
                await eventually(lambda: caller(client) is None)
                # Cancelled with a call pending: the receive task reads for it.
                assert reader(client) == receive._RECEIVER
            assert got == [Response((b"other",))]
            await eventually(lambda: client.statistics().late == 1)  # the reader's reply
            s = client.statistics()
            assert (s.cancelled, s.replies, s.duplicates, s.unknown) == (1, 2, 0, 0)
            assert_clean(client)


async def test_a_lone_reader_cancelled_hands_the_socket_back() -> None:
    with FakeBroker(delayed) as broker:
        async with Client(broker.endpoint) as client:
            await client.request("echo", b"warm")
            with anyio.move_on_after(0.1):
                await client.request("echo", b"late", b"0.5")
            assert caller(client) is None
            assert reader(client) == receive._RECEIVER
            assert_clean(client)
            # Its reply, arriving with nothing pending, is read and counted as late.
            await eventually(lambda: client.statistics().late == 1)
            assert await client.request("echo", b"next") == Response((b"next",))
            assert_clean(client)


async def test_the_reading_request_runs_the_deadlines_itself() -> None:
    """Resends and the timeout of a lone request: made by the request reading the socket."""
    with FakeBroker(silent) as broker:
        async with Client(broker.endpoint, backoff=0.01, jitter=0) as client:
            assert reader(client) == receive._FREE  # nothing pending since entry
            with pytest.raises(RequestTimeout, match="2 attempts sent"):
                await client.request("quiet", timeout=0.6, attempt_timeout=0.2, retries=1)
            assert client._receiver._park is not None  # the receive task never read
            assert reader(client) == receive._FREE
            assert_clean(client)
    assert sorted(broker.attempts.values()) == [1, 2]  # the probe, the request
    assert {r.service for r in broker.requests} == {b"quiet", b"mmi.service"}


async def test_other_calls_take_the_socket_back() -> None:
    """A map (or anything but a lone request) starting while the socket is free wakes the
    receive task; a request with a call pending does not read."""
    with FakeBroker(delayed) as broker:
        async with Client(broker.endpoint) as client:
            await client.request("echo", b"warm")
            assert reader(client) == receive._FREE
            got = [r async for r in client.map("echo", [b"a", b"b", b"c"], window=2)]
            assert got == [Response((b"a",)), Response((b"b",)), Response((b"c",))]
            assert caller(client) is None
            assert_clean(client)

            # The stream is pending meanwhile.
            async with (
                anyio.create_task_group() as tg,
                client.stream("echo", b"x", b"0.3") as stream,
            ):
                assert reader(client) == receive._RECEIVER
                tg.start_soon(client.request, "echo", b"y")
                await eventually(lambda: client.statistics().replies >= 5)
                assert caller(client) is None
                assert [part async for part in stream] == [(b"x",)]  # the reply's
            assert_clean(client)


async def test_close_while_a_request_reads() -> None:
    with FakeBroker(silent) as broker:
        async with Client(broker.endpoint) as client:

            async def closer() -> None:
                await eventually(lambda: caller(client) is not None)
                await client.aclose()

            async with anyio.create_task_group() as tg:
                tg.start_soon(closer)
                with pytest.raises(anyio.ClosedResourceError):
                    await client.request("quiet")
            assert_clean(client)


async def test_a_bug_while_a_request_reads_fails_the_callers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a zmq error (dcp._io.errors Rule Z4 covers those: test_client.py): logged, and
    the client is shut down with it as the cause (Rule RX3), as in the receive task."""
    bug = RuntimeError("a bug")
    with FakeBroker(delayed) as broker:
        async with Client(broker.endpoint) as client:
            socket = client._receiver.socket
            assert socket is not None

            def broken_drain(batch: int) -> list[object]:
                raise bug

            monkeypatch.setattr(socket, "drain", broken_drain)
            with pytest.raises(anyio.BrokenResourceError) as info:
                await client.request("echo", b"x")
            assert info.value.__cause__ is bug
            assert client.closed
            assert_clean(client)
    assert "failed reading its reply" in caplog.text


@pytest.mark.parametrize("second", [False, True], ids=["one-broker", "second-of-two"])
@pytest.mark.parametrize("zmq_error", [False, True], ids=["bug", "zmq-error"])
async def test_what_ends_a_receive_task_ends_the_client(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    second: bool,
    zmq_error: bool,
) -> None:
    """Rule RX3 in the receive task of each socket (one per broker, Rule RX6): a zmq error
    (the socket failed) or a bug (logged) shuts the client down with it as the cause."""
    failure = zmq.ZMQError(errno.EFAULT) if zmq_error else RuntimeError("a bug")
    with FakeBroker(silent) as a, FakeBroker(silent) as b:
        async with Client([a.endpoint, b.endpoint] if second else a.endpoint) as client:
            receiver = client._receiver
            socket = receiver.sockets[1] if second else receiver.socket
            assert socket is not None

            def broken_drain(batch: int) -> list[object]:
                raise failure

            monkeypatch.setattr(socket, "drain", broken_drain)
            # No call reads (Rule RX5): the receive task reads what arrives.
            with anyio.fail_after(5):
                while not client.closed:
                    (b if second else a).inject([client.routing_id, b"wake up"])
                    await anyio.sleep(0.01)
            with pytest.raises(anyio.BrokenResourceError) as info:
                await client.request("echo", b"x")
            assert info.value.__cause__ is failure
            assert_clean(client)
    assert ("receive task failed" in caplog.text) is not zmq_error


@pytest.mark.parametrize("reading", [True, False], ids=["reading-request", "two-calls"])
async def test_a_call_cancelled_as_its_client_closes_is_cancelled(reading: bool) -> None:
    """A cancel scope around both the client and a call ends the call with the cancellation,
    not ``ClosedResourceError``, when the client's shutdown wakes the call first (``dcp
    call --backend asyncio`` printed a traceback after Ctrl-C, rarely, this way)."""
    with FakeBroker(silent) as broker:
        async with Client(broker.endpoint, timeout=30) as client:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:

                    async def stop() -> None:
                        calls = 1 if reading else 2
                        await eventually(lambda: len(client._receiver.waiters) == calls)
                        if reading:
                            await eventually(lambda: reader(client) == receive._CALLER)
                        client._receiver.shutdown(None)  # wakes the call with "closed" ...
                        scope.cancel()  # ... and then its scope is cancelled

                    if not reading:  # two calls pending
                        tg.start_soon(client.request, "echo", b"first")
                        await eventually(lambda: bool(client._receiver.waiters))
                    tg.start_soon(stop)
                    await client.request("echo", b"x")
            assert scope.cancelled_caught
