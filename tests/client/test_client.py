"""The async client over real sockets, on both anyio backends.

Most tests talk to a :class:`FakeBroker` (a plain ROUTER that misbehaves on purpose); the last
ones go through the real :class:`dcp.Broker` to a plain-pyzmq worker.
"""

from __future__ import annotations

import errno
import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing
from typing import Any

import anyio
import pytest
import zmq

from dcp import NoWorkers, RemoteError, RequestTimeout
from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._models import Response
from dcp.wire import Request
from dcp.wire.messages import error_reply_data
from dcp.wire.options import NO_WAIT_OPTION, REQUEST_ID_PREFIX, request_expires_in
from tests.fakes import FakeBroker, RawWorker, drop_first, echo, fail, random_delay, silent, twice

pytestmark = pytest.mark.anyio


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Wait (bounded) for something another thread or task does."""
    with anyio.fail_after(within):
        while not condition():  # noqa: ASYNC110 (state changed by other threads)
            await anyio.sleep(0.005)


def assert_clean(client: Client) -> None:
    assert client.statistics().pending == 0
    assert client._receiver.waiters == {}  # white-box: no waiter left


# ---------------------------------------------------------------- basics


async def test_request_round_trip_with_metadata() -> None:
    with FakeBroker(echo) as broker:
        async with Client(broker.endpoint) as client:
            response = await client.request("echo", b"a", b"", b"c", metadata=[b"m1", b"m2"])
            assert response == Response((b"a", b"", b"c"), (b"m1", b"m2"))
            assert await client.request(b"echo") == Response(())
    req = broker.requests[0]
    assert req.service == b"echo"
    assert req.metadata[0].startswith(REQUEST_ID_PREFIX)  # dcp's id comes first
    assert len(req.metadata[0]) == len(REQUEST_ID_PREFIX) + 16
    assert 29 < (request_expires_in(req.metadata[1:2]) or 0) <= 30  # then the time left
    # Then the no-wait option (a call fails at once when no worker serves the service:
    # options Rule CO4), then the user's metadata.
    assert req.metadata[2:] == (NO_WAIT_OPTION, b"m1", b"m2")
    assert broker.peers == {client.routing_id}
    assert client.routing_id[0] != 0
    s = client.statistics()
    assert (s.requests, s.replies, s.pending, s.retries) == (2, 2, 0, 0)


async def test_200_concurrent_requests_are_matched() -> None:
    results: dict[int, Response] = {}
    with FakeBroker(random_delay(0.02, seed=1)) as broker:
        async with Client(broker.endpoint) as client:

            async def one(i: int) -> None:
                results[i] = await client.request(
                    "echo", b"payload-%d" % i, str(i).encode() * (i % 5), metadata=[b"%d" % i]
                )

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for i in range(200):
                        tg.start_soon(one, i)
            assert_clean(client)
    assert len(results) == 200
    for i, response in results.items():
        assert response == Response((b"payload-%d" % i, str(i).encode() * (i % 5)), (b"%d" % i,))
    assert len(broker.requests) == 200  # no retries were needed


async def test_cancel_in_the_middle_many_times() -> None:
    rng = random.Random(11)
    completed = cancelled = 0
    with FakeBroker(random_delay(0.01, seed=2)) as broker:
        async with Client(broker.endpoint, timeout=5.0) as client:

            async def one(i: int, patience: float) -> None:
                nonlocal completed, cancelled
                with anyio.move_on_after(patience):
                    response = await client.request("echo", b"%d" % i)
                    assert response.data == (b"%d" % i,)
                    completed += 1
                    return
                cancelled += 1

            n = 0
            for _ in range(100):
                async with anyio.create_task_group() as tg:
                    for _ in range(4):
                        tg.start_soon(one, n, rng.random() * 0.012)
                        n += 1
                assert_clean(client)
            # Replies to cancelled requests come later: dropped as late, never delivered.
            assert await client.request("echo", b"after") == Response((b"after",))
            await eventually(lambda: broker.replies_sent == n + 1)
            await eventually(lambda: client.statistics().late == client.statistics().cancelled)
            s = client.statistics()
            assert_clean(client)
    assert completed > 0
    assert cancelled > 0
    assert completed + cancelled == n
    # A reply can arrive just as its caller is cancelled: the tracker counts it as a reply,
    # and the caller still sees the cancellation (the result is discarded, never misrouted).
    assert s.cancelled <= cancelled
    assert s.cancelled + s.replies == n + 1
    assert (s.duplicates, s.unknown) == (0, 0)


async def test_cancel_while_sending_is_clean() -> None:
    """Cancelled before the first checkpoint: the entry is still removed."""
    with FakeBroker(silent) as broker:
        async with Client(broker.endpoint) as client:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await client.request("echo", b"x")
            assert_clean(client)
            assert client.statistics().cancelled == 1


async def test_retry_after_a_dropped_reply() -> None:
    with FakeBroker(drop_first) as broker:
        async with Client(
            broker.endpoint, timeout=5.0, attempt_timeout=0.1, retries=2, backoff=0.01
        ) as client:
            assert await client.request("echo", b"x") == Response((b"x",))
            s = client.statistics()
    assert [r.data for r in broker.requests] == [(b"x",), (b"x",)]
    first, second = (r.metadata for r in broker.requests)
    assert first[0] == second[0]  # same id resent
    # Each attempt carries the time left of the 5 s.
    assert 4.8 < request_expires_in(first) <= 5.0  # type: ignore[operator]
    assert 4.0 < request_expires_in(second) < request_expires_in(first)  # type: ignore[operator]
    assert (s.retries, s.timeouts, s.replies) == (1, 0, 1)


async def test_duplicate_reply_is_dropped_and_counted() -> None:
    with FakeBroker(twice) as broker:
        async with Client(broker.endpoint) as client:
            assert await client.request("echo", b"one") == Response((b"one",))
            await eventually(lambda: client.statistics().duplicates == 1)
            assert await client.request("echo", b"two") == Response((b"two",))
            await eventually(lambda: client.statistics().duplicates == 2)
            s = client.statistics()
    assert (s.replies, s.duplicates, s.unknown) == (2, 2, 0)


async def test_timeout_after_the_last_retry() -> None:
    """Attempts shorter than the call: the last one's end ends the call (the timeout is
    the whole call's since issue 15; this test used to set 0.05 s per attempt as timeout).

    The probe goes 10% of the call's time before its end (Rule RT5): attempts of 1 s give
    it 0.3 s, so that a loaded machine that wakes the client late still sends it (with
    attempts of 0.05 s, 15 ms late was too late: the end came first)."""
    with FakeBroker(silent) as broker:
        async with Client(
            broker.endpoint, timeout=10.0, attempt_timeout=1.0, retries=2, backoff=0.01
        ) as client:
            start = time.monotonic()
            with anyio.fail_after(10), pytest.raises(RequestTimeout) as info:
                await client.request("echo", b"x")
            elapsed = time.monotonic() - start
            s = client.statistics()
            assert_clean(client)
            # The probe was sent before the end; the fake broker's thread takes it in.
            await eventually(lambda: len(broker.requests) >= 4)
    assert type(info.value) is RequestTimeout  # the fake broker did not say 404
    assert 3.0 <= elapsed < 10  # three attempts of 1 s, well before the call's 10 s
    assert [r.service for r in broker.requests] == [b"echo"] * 3 + [b"mmi.service"]
    assert broker.requests[-1].data == (b"echo",)  # the question asked before the end
    assert (s.retries, s.timeouts, s.probes) == (2, 1, 1)


async def test_short_timeout_rearms_the_timer() -> None:
    """A later request with an earlier deadline must not wait for an earlier one's."""
    with FakeBroker(silent) as broker:
        async with (
            Client(broker.endpoint, timeout=30.0) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(client.request, "echo", b"long")
            await eventually(lambda: client.statistics().pending == 1)
            await anyio.sleep(0.01)  # the receive task is now parked until the 30 s deadline
            with anyio.fail_after(2), pytest.raises(RequestTimeout):
                await client.request("echo", b"short", timeout=0.05, retries=0)
            tg.cancel_scope.cancel()


async def test_remote_error() -> None:
    with FakeBroker(fail) as broker:
        async with Client(broker.endpoint) as client:
            with pytest.raises(RemoteError) as info:
                await client.request("echo", b"x")
            assert_clean(client)
    assert (info.value.code, info.value.message) == ("boom", "the handler failed")
    assert client.statistics().errors == 1


async def test_malformed_and_unknown_replies_are_counted() -> None:
    with FakeBroker(echo) as broker:
        async with Client(broker.endpoint) as client:
            # A ROUTER drops messages to a peer it has not heard from yet: talk first.
            assert await client.request("echo", b"hello") == Response((b"hello",))
            ident = client.routing_id
            broker.inject([ident, b"garbage"])
            broker.inject([ident, b"", b"DGBX\x01", b"\x05", b"", b"", b"no-id"])
            broker.inject([ident, b"", b"DGBX\x01", b"\x05", b"", b"x" * 16, b"", b"data"])
            await eventually(lambda: client.statistics().unknown == 1)
            assert await client.request("echo", b"still fine") == Response((b"still fine",))
            s = client.statistics()
    assert s.malformed == {"too_few_frames": 1, "missing_request_id": 1}


# ---------------------------------------------------------------- map


async def test_map_yields_in_order_and_respects_the_window() -> None:
    payloads = [b"%d" % i for i in range(40)]
    with FakeBroker(echo, hold_until_idle=0.05) as broker:
        async with Client(broker.endpoint) as client:
            with anyio.fail_after(10):
                got = [r.data[0] async for r in client.map("echo", payloads, window=8)]
            assert_clean(client)
    assert got == payloads
    assert broker.max_held == 8


async def test_map_unordered_yields_every_index_once_within_the_window() -> None:
    payloads = [b"%d" % i for i in range(40)]
    with FakeBroker(echo, hold_until_idle=0.05) as broker:
        async with Client(broker.endpoint) as client:
            with anyio.fail_after(10):
                got = [
                    (i, r.data[0])
                    async for i, r in client.map_unordered("echo", payloads, window=6)
                ]
            assert_clean(client)
    assert sorted(got) == sorted(enumerate(payloads))
    assert broker.max_held == 6


async def test_map_payloads_may_have_several_parts() -> None:
    payloads: list[bytes | Sequence[bytes]] = [b"one", (b"two", b"parts"), [], b""]
    with FakeBroker(random_delay(0.01)) as broker:
        async with Client(broker.endpoint) as client:
            got = [r.data async for r in client.map(b"echo", payloads, metadata=[b"m"])]
    assert got == [(b"one",), (b"two", b"parts"), (), (b"",)]
    assert all(r.metadata[-1:] == (b"m",) for r in broker.requests)


def _bad_is_an_error(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    if req.data == (b"bad",):
        return [(0.0, error_reply_data("bad_input", "no"))]
    return [(0.02, req.data)]


async def test_map_raises_the_first_error_and_forgets_the_rest() -> None:
    payloads = [b"a", b"b", b"bad", b"c", b"d", b"e"]
    with FakeBroker(_bad_is_an_error) as broker:
        async with Client(broker.endpoint) as client:
            got = []
            with pytest.raises(RemoteError, match="bad_input"):
                async for r in client.map("echo", payloads, window=4):
                    got.append(r.data[0])
            assert got == [b"a", b"b"]
            assert_clean(client)
            with pytest.raises(RemoteError, match="bad_input"):
                async for _ in client.map_unordered("echo", payloads, window=4):
                    pass
            assert_clean(client)


async def test_leaving_map_early_forgets_outstanding_requests() -> None:
    with FakeBroker(random_delay(0.01)) as broker:
        async with Client(broker.endpoint) as client:
            async with aclosing(client.map("echo", [b"%d" % i for i in range(100)])) as it:
                async for r in it:
                    if r.data == (b"2",):
                        break
            assert_clean(client)
            assert client.statistics().cancelled > 0
            async with aclosing(client.map_unordered("echo", [b"x"] * 100, window=10)) as it2:
                async for _ in it2:
                    break
            assert_clean(client)


async def test_map_rejects_a_bad_window_at_once() -> None:
    with FakeBroker(echo) as broker:
        async with Client(broker.endpoint) as client:
            with pytest.raises(ValueError, match="window"):
                client.map("echo", [], window=0)
            with pytest.raises(ValueError, match="window"):
                client.map_unordered("echo", [], window=0)
            assert [r async for r in client.map("echo", [])] == []


def _bad_or_silent(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    if req.data == (b"mute",):
        return []
    return _bad_is_an_error(req, attempt)


async def test_map_outcomes_yields_failures_in_place_and_goes_on() -> None:
    """As :meth:`dcp.SyncClient.map_outcomes` (its test in test_sync_client.py)."""
    payloads = [b"a", b"bad", b"b", b"mute", b"c", b"bad", b"d"]
    with FakeBroker(_bad_or_silent) as broker:
        async with Client(broker.endpoint, timeout=0.2, retries=0) as client:
            with anyio.fail_after(10):
                got = [o async for o in client.map_outcomes("echo", payloads, window=3)]
            assert_clean(client)
            assert [o.data[0] if isinstance(o, Response) else type(o) for o in got] == [
                b"a", RemoteError, b"b", RequestTimeout, b"c", RemoteError, b"d"
            ]  # fmt: skip
            assert isinstance(got[1], RemoteError) and got[1].code == "bad_input"
            # Closing early forgets the outstanding requests, as map() does: the nine
            # unanswered ones the window let out are cancelled.
            payloads = [b"x"] + [b"mute"] * 49
            it = client.map_outcomes("echo", payloads, window=10, timeout=60)
            async with aclosing(it):
                assert await anext(it) == Response((b"x",))
            assert_clean(client)
            assert client.statistics().cancelled == 9
            with pytest.raises(ValueError, match="window"):
                client.map_outcomes("echo", [], window=0)
        # The client closing is not an outcome: it is raised.
        with pytest.raises(anyio.ClosedResourceError):
            async for _ in client.map_outcomes("echo", [b"x"]):
                pass  # pragma: no cover


# ---------------------------------------------------------------- lifecycle


async def test_aclose_is_idempotent_and_fails_pending_and_new_requests() -> None:
    errors: list[BaseException] = []
    with FakeBroker(silent) as broker:
        async with Client(broker.endpoint) as client:

            async def waiting() -> None:
                try:
                    await client.request("echo", b"x")
                except anyio.ClosedResourceError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting)
                await eventually(lambda: client.statistics().pending == 1)
                await client.aclose()
                await client.aclose()
            assert client.closed
            assert len(errors) == 1
            assert_clean(client)
            with pytest.raises(anyio.ClosedResourceError):
                await client.request("echo", b"y")
            with pytest.raises(anyio.ClosedResourceError):
                async for _ in client.map("echo", [b"z"]):
                    pass
        await client.aclose()


async def test_one_error_in_the_body_is_not_wrapped_in_a_group() -> None:
    with FakeBroker(fail) as broker:
        with pytest.raises(RemoteError) as info:
            async with Client(broker.endpoint) as client:
                await client.request("echo")
        assert type(info.value) is RemoteError
        with pytest.raises(ValueError) as info2:
            async with Client(broker.endpoint):
                raise ValueError("mine")
        assert type(info2.value) is ValueError
    assert client.closed


async def test_cancelled_body_exits_cleanly() -> None:
    with FakeBroker(silent) as broker:
        with anyio.move_on_after(0.05) as scope:
            async with Client(broker.endpoint) as client:
                await client.request("echo", b"x")
        assert scope.cancelled_caught
        assert client.closed
        assert_clean(client)


async def test_misuse() -> None:
    client = Client("tcp://127.0.0.1:1")
    with pytest.raises(RuntimeError, match="async with"):
        await client.request("echo")
    with pytest.raises(ValueError, match="routing_id"):
        Client("tcp://127.0.0.1:1", routing_id=b"\x00abc")
    with pytest.raises(ValueError, match="routing_id"):
        Client("tcp://127.0.0.1:1", routing_id=b"")
    async with client:
        with pytest.raises(RuntimeError, match="once"):
            await client.__aenter__()
    with pytest.raises(RuntimeError, match="once"):
        await client.__aenter__()
    # A malformed endpoint: a ValueError naming it when the client is made (not zmq's EINVAL).
    with pytest.raises(ValueError, match="scheme must be tcp, ipc or inproc"):
        Client("no-such-transport://x")


async def test_broken_socket_fails_pending_and_new_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failure = zmq.ZMQError(errno.EFAULT)
    errors: list[BaseException] = []
    with FakeBroker(silent) as broker:
        async with Client(broker.endpoint) as client:
            socket = client._receiver.socket  # white-box: make it fail
            assert socket is not None

            def broken_drain(batch: int) -> list[object]:
                raise failure

            async def one() -> None:
                try:
                    await client.request("echo", b"x")
                except anyio.BrokenResourceError as exc:
                    errors.append(exc)

            # The socket "fails" on its next read; a message makes the receive task read.
            monkeypatch.setattr(socket, "drain", broken_drain)
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one)
                    # The broker must know the client's address before it can send to it.
                    await eventually(lambda: len(broker.requests) == 1)
                    broker.inject([client.routing_id, b"wake up"])
            assert client.closed
            assert len(errors) == 1
            assert errors[0].__cause__ is failure
            with pytest.raises(anyio.BrokenResourceError) as info:
                await client.request("echo", b"y")
            assert info.value.__cause__ is failure
            assert_clean(client)


async def test_send_queue_full_waits_then_times_out() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.setsockopt(zmq.SNDHWM, 2)
    try:
        # Nobody listens there: sends queue up to the high-water mark, then zmq says EAGAIN.
        # Short attempts within a long call: each request's one resend is due 10-20 ms after
        # its first attempt is lost, however late the client's task runs (with the call's
        # time as short as its attempts, a late wake-up finds the call over: no resend).
        async with Client(
            "tcp://127.0.0.1:1",
            context=ctx,
            timeout=30,
            attempt_timeout=0.05,
            retries=1,
            backoff=0.02,
        ) as client:
            outcomes: list[BaseException] = []

            async def one() -> None:
                try:
                    await client.request("echo", b"x" * 100)
                except RequestTimeout as exc:
                    outcomes.append(exc)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for _ in range(20):
                        tg.start_soon(one)
            s = client.statistics()
            assert_clean(client)
    finally:
        ctx.term()
    assert len(outcomes) == 20
    assert s.send_waits > 0
    assert s.resends_dropped > 0
    assert s.timeouts == 20


# ---------------------------------------------------------------- the real broker


async def test_through_the_real_broker() -> None:
    async with Broker("tcp://127.0.0.1:0", heartbeat_interval=1.0) as broker:
        endpoint = broker.endpoints[0]
        with RawWorker(endpoint, b"upper", lambda data: [d.upper() for d in data]) as worker:
            await eventually(worker.registered.is_set)
            async with Client(endpoint, timeout=5.0) as client:
                results: dict[int, Response] = {}

                async def one(i: int) -> None:
                    results[i] = await client.request("upper", b"abc%d" % i, metadata=[b"m"])

                with anyio.fail_after(10):
                    async with anyio.create_task_group() as tg:
                        for i in range(200):
                            tg.start_soon(one, i)
                    ordered = [r.data async for r in client.map("upper", [b"x", (b"y", b"z")])]
                assert all(results[i] == Response((b"ABC%d" % i,), (b"m",)) for i in range(200))
                assert ordered == [(b"X",), (b"Y", b"Z")]
                s = client.statistics()
                assert (s.replies, s.retries, s.pending) == (202, 0, 0)
        assert worker.handled == 202
        assert broker.statistics().replies == 202


async def test_map_outcomes_through_the_real_broker() -> None:
    def upper_or_fail(data: Sequence[bytes]) -> Sequence[bytes]:
        if data == (b"bad",):
            return error_reply_data("bad_input", "no")
        return [d.upper() for d in data]

    async with Broker("tcp://127.0.0.1:0") as broker:
        endpoint = broker.endpoints[0]
        with RawWorker(endpoint, b"upper", upper_or_fail) as worker:
            await eventually(worker.registered.is_set)
            async with Client(endpoint, timeout=5.0) as client:
                with anyio.fail_after(10):
                    got = [o async for o in client.map_outcomes("upper", [b"a", b"bad", b"c"])]
                [nobody] = [o async for o in client.map_outcomes("nobody", [b"x"])]
                assert_clean(client)
    assert got[0] == Response((b"A",)) and got[2] == Response((b"C",))
    assert isinstance(got[1], RemoteError) and got[1].code == "bad_input"
    assert isinstance(nobody, NoWorkers)


async def test_real_broker_queues_until_a_worker_registers() -> None:
    async with (
        Broker("tcp://127.0.0.1:0") as broker,
        Client(broker.endpoints[0], wait_for_worker=True) as client,
        anyio.create_task_group() as tg,
    ):

        async def later() -> None:
            await eventually(lambda: broker.statistics().requests == 1)
            with RawWorker(broker.endpoints[0]):
                await eventually(lambda: client.statistics().replies == 1)

        tg.start_soon(later)
        with anyio.fail_after(10):
            assert await client.request("echo", b"early") == Response((b"early",))


async def test_real_broker_queue_full_is_a_remote_error() -> None:
    async with (
        Broker("tcp://127.0.0.1:0", max_queue=1) as broker,
        Client(broker.endpoints[0], timeout=30.0, wait_for_worker=True) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(client.request, "nobody", b"queued")
        await eventually(lambda: broker.statistics().requests == 1)
        with pytest.raises(RemoteError) as info:
            await client.request("nobody", b"refused")
        assert info.value.code == "queue_full"
        tg.cancel_scope.cancel()
    assert_clean(client)


async def test_infinite_timeout() -> None:
    with FakeBroker(random_delay(0.01)) as broker:
        async with Client(broker.endpoint, timeout=math.inf) as client:
            assert await client.request("echo", b"x") == Response((b"x",))
            assert await client.request("echo", b"y", timeout=math.inf) == Response((b"y",))
            assert_clean(client)


# ---------------------------------------------------------------- bad parts (issue 15, item 1)

#: Requests that must be refused before their first frame is sent: (call, what the error names).
_BAD_REQUESTS: list[tuple[str, dict[str, object], type[Exception], str]] = [
    ("data part", {"data": (b"first", 123)}, TypeError, r"data\[1\]"),
    ("None part", {"data": (None,)}, TypeError, r"data\[0\]"),
    ("service", {"service": 7}, TypeError, "service"),
    ("metadata part", {"metadata": [b"ok", 5]}, TypeError, r"metadata\[1\]"),
    ("empty metadata", {"metadata": [b""]}, ValueError, r"metadata\[0\]"),
    ("bare metadata", {"metadata": b"m"}, TypeError, "metadata"),
]


@pytest.mark.parametrize(
    ("bad", "error", "names"),
    [pytest.param(b, e, n, id=i) for i, b, e, n in _BAD_REQUESTS],
)
async def test_a_bad_part_sends_nothing_and_the_next_request_is_intact(
    bad: dict[str, object], error: type[Exception], names: str
) -> None:
    """A bad part is refused before the first frame is sent: the next request is whole."""
    with FakeBroker(echo) as broker:
        async with Client(broker.endpoint, timeout=2.0, retries=0) as client:
            args: dict[str, Any] = {"service": "echo", "data": (b"first",), "metadata": ()}
            args.update(bad)
            with pytest.raises(error, match=names):
                await client.request(
                    args["service"],
                    *args["data"],
                    metadata=args["metadata"],
                )
            assert_clean(client)
            with anyio.fail_after(5):
                assert await client.request("echo", b"second") == Response((b"second",))
            s = client.statistics()
    [req] = broker.requests
    assert (req.service, req.data) == (b"echo", (b"second",))
    assert (s.retries, s.timeouts, s.malformed) == (0, 0, {})


async def test_a_bad_map_payload_sends_nothing_of_it() -> None:
    payloads: list[object] = [b"a", "b", (b"c", "d"), (b"e", 5), b"f"]
    with FakeBroker(echo) as broker:
        async with Client(broker.endpoint, timeout=2.0, retries=0) as client:
            got = []
            with pytest.raises(TypeError, match=r"payloads\[3\]\[1\]"):
                async for r in client.map("echo", payloads, window=1):  # type: ignore[arg-type]
                    got.append(r.data)
            assert got == [(b"a",), (b"b",), (b"c", b"d")]
            with pytest.raises(TypeError, match=r"payloads\[0\]"):
                async for _ in client.map_unordered("echo", [42]):  # type: ignore[list-item]
                    pass  # pragma: no cover
            assert_clean(client)
            with anyio.fail_after(5):
                assert await client.request("echo", b"next") == Response((b"next",))
    assert [r.data for r in broker.requests] == [(b"a",), (b"b",), (b"c", b"d"), (b"next",)]


# ---------------------------------------------------------------- str and JSON (item 5)


async def test_str_service_data_and_metadata_are_sent_as_utf8() -> None:
    with FakeBroker(echo) as broker:
        async with Client(broker.endpoint) as client:
            response = await client.request("écho", "héllo", b"raw", metadata=["mé"])
            assert response == Response(("héllo".encode(), b"raw"), ("mé".encode(),))
            assert response.data[0].decode() == "héllo"
            got = [r.text async for r in client.map("écho", ["a", ("b",), b"c"])]
            assert got == ["a", "b", "c"]
    assert {r.service for r in broker.requests} == {"écho".encode()}


async def test_request_json_round_trip_and_bad_objects_send_nothing() -> None:
    with FakeBroker(echo) as broker:
        async with Client(broker.endpoint) as client:
            obj = {"a": [1, 2.5, None], "b": "Zoë"}
            assert await client.request_json("echo", obj) == obj
            with pytest.raises(TypeError, match="obj is not JSON-serialisable"):
                await client.request_json("echo", {1, 2})
            with pytest.raises(ValueError, match="obj is not JSON-serialisable"):
                await client.request_json("echo", math.nan)
            assert_clean(client)
    [req] = broker.requests
    assert req.data == (b'{"a":[1,2.5,null],"b":"Zo\xc3\xab"}',)


def _two_parts(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    return [(0.0, (*req.data, b"more"))]


async def test_request_json_refuses_a_reply_that_is_not_one_json_part() -> None:
    with FakeBroker(_two_parts) as broker:
        async with Client(broker.endpoint) as client:
            with pytest.raises(ValueError, match="2 data parts"):
                await client.request_json("echo", [1], metadata=[b"m"])
            assert_clean(client)
    assert broker.requests[0].metadata[-1] == b"m"


# ---------------------------------------------------------------- whole-call timeout (item 2)


def _closed_port() -> str:
    """A tcp endpoint where nothing listens (bound, then released)."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        sock.bind("tcp://127.0.0.1:0")
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        sock.close(0)


async def test_no_broker_fails_within_the_timeout() -> None:
    async with Client(_closed_port(), timeout=0.5) as client:
        start = anyio.current_time()
        with anyio.fail_after(5), pytest.raises(RequestTimeout) as info:
            await client.request("echo", b"x")
        elapsed = anyio.current_time() - start
        s = client.statistics()
        assert_clean(client)
    assert type(info.value) is RequestTimeout  # nobody said "no workers"
    assert 0.45 <= elapsed < 1.5  # the timeout, plus scheduling on a loaded machine
    # Attempts of 0.5 / 3 s: a resend or two, as the backoff delays allow; then the probe.
    assert (s.retries >= 1, s.probes, s.timeouts) == (True, 1, 1)


async def test_the_whole_call_is_bounded_whatever_the_attempts() -> None:
    with FakeBroker(silent) as broker:
        async with Client(broker.endpoint, attempt_timeout=0.05, retries=100) as client:
            start = anyio.current_time()
            with anyio.fail_after(5), pytest.raises(RequestTimeout):
                await client.request("echo", b"x", timeout=0.4)
            elapsed = anyio.current_time() - start
    assert 0.35 <= elapsed < 1.4
    attempts = [r for r in broker.requests if r.service == b"echo"]
    assert 2 <= len(attempts) < 100
    left = [request_expires_in(r.metadata) or 0.0 for r in attempts]
    assert left == sorted(left, reverse=True)  # each attempt: the time left, less and less
    assert all(0 < x <= 0.4 for x in left)


async def test_a_service_nobody_serves_raises_no_workers_within_the_timeout() -> None:
    # A call that waits for a worker (a failing-at-once one is test_first_contact.py's).
    async with (
        Broker("tcp://127.0.0.1:0") as broker,
        Client(broker.endpoints[0], wait_for_worker=True) as client,
    ):
        start = anyio.current_time()
        # The client asks the broker 10% of the timeout before its end: 0.3 s for the answer.
        with anyio.fail_after(30), pytest.raises(NoWorkers) as info:
            await client.request("nobody", b"x", timeout=3.0)
        elapsed = anyio.current_time() - start
        assert_clean(client)
    assert isinstance(info.value, RequestTimeout)  # old except clauses still catch it
    assert info.value.service == b"nobody"
    assert str(info.value).startswith("no worker serves 'nobody' (the broker says so; ")
    assert elapsed >= 2.85  # at its timeout, not before (fail_after bounds it above)
    assert client.statistics().no_workers == 1


def _sleepy(data: tuple[bytes, ...]) -> tuple[bytes, ...]:
    time.sleep(1.5)
    return data


async def test_a_served_service_that_is_slow_is_a_plain_timeout() -> None:
    async with Broker("tcp://127.0.0.1:0") as broker:
        endpoint = broker.endpoints[0]
        with RawWorker(endpoint, b"slow", _sleepy) as worker:
            await eventually(worker.registered.is_set)
            async with Client(endpoint) as client:
                with anyio.fail_after(5), pytest.raises(RequestTimeout) as info:
                    await client.request("slow", b"x", timeout=0.5, retries=0)
    assert type(info.value) is RequestTimeout


def _no_responders(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    """A broker that knows the no-wait option and has no worker for anything."""
    if NO_WAIT_OPTION in req.metadata:
        return [(0.0, error_reply_data("no_workers", "no worker serves this service"))]
    return []


async def test_no_wait_fails_at_once_with_no_workers() -> None:
    with FakeBroker(_no_responders) as broker:
        async with Client(broker.endpoint, timeout=10.0) as client:
            with anyio.fail_after(2), pytest.raises(NoWorkers) as info:
                await client.request("echo", b"x", no_wait=True)
            assert str(info.value) == "no worker serves 'echo'"  # said once
            with anyio.fail_after(2), pytest.raises(NoWorkers):
                await client.request_json("echo", [1], no_wait=True)
            assert_clean(client)
        async with Client(broker.endpoint, no_wait=True, timeout=0.3, retries=0) as client2:
            with anyio.fail_after(2), pytest.raises(NoWorkers):
                async for _ in client2.map("echo", [b"a"]):
                    pass  # pragma: no cover
            # Per request, no_wait=False wins over the client's default: it waits.
            with anyio.fail_after(2), pytest.raises(RequestTimeout) as info2:
                await client2.request("echo", b"y", no_wait=False)
            assert type(info2.value) is RequestTimeout
    echo_requests = [r for r in broker.requests if r.service == b"echo"]
    assert [NO_WAIT_OPTION in r.metadata for r in echo_requests] == [True, True, True, False]
    # dcp's options come after the id and before the user's metadata.
    assert echo_requests[0].metadata[2] == NO_WAIT_OPTION
    assert client.statistics().no_workers == 2
