"""The blocking client over real sockets: the fake broker, then the real broker in a thread
(or on the event loop, the client in a thread, on both anyio backends)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import pytest
import zmq

from dcp import (
    Broker,
    HandlerRequest,
    NoWorkers,
    RemoteError,
    RequestTimeout,
    Service,
    ServiceChange,
    Worker,
)
from dcp._client.sync_client import SyncClient
from dcp._core.broker.directory import PAGE_ENTRIES
from dcp._models import Response
from dcp.wire import Request, serialize
from dcp.wire.messages import error_reply_data
from dcp.wire.options import NO_WAIT_OPTION, REQUEST_ID_PREFIX
from tests.fakes import (
    FakeBroker,
    RawWorker,
    broker_in_thread,
    drop_first,
    echo,
    fail,
    random_delay,
    silent,
    twice,
)


def assert_clean(client: SyncClient) -> None:
    assert client.statistics().pending == 0
    assert client._receiver.done == {}  # white-box: no outcome left


def test_request_round_trip_with_metadata() -> None:
    with FakeBroker(echo) as broker, SyncClient(broker.endpoint) as client:
        assert client.request("echo", b"a", b"", metadata=[b"m"]) == Response((b"a", b""), (b"m",))
        assert client.request(b"echo") == Response(())
        assert_clean(client)
    assert client.closed
    assert broker.peers == {client.routing_id}
    assert all(r.metadata[0].startswith(REQUEST_ID_PREFIX) for r in broker.requests)
    assert [len(r.metadata[0]) for r in broker.requests] == [24, 24]


def test_many_requests_in_a_row_are_matched() -> None:
    with FakeBroker(echo) as broker, SyncClient(broker.endpoint) as client:
        for i in range(500):
            assert client.request("echo", b"%d" % i).data == (b"%d" % i,)
        s = client.statistics()
    assert (s.requests, s.replies, s.retries, s.pending) == (500, 500, 0, 0)


def test_map_in_order_with_the_window_respected() -> None:
    payloads = [b"%d" % i for i in range(40)]
    with FakeBroker(echo, hold_until_idle=0.05) as broker, SyncClient(broker.endpoint) as client:
        assert [r.data[0] for r in client.map("echo", payloads, window=8)] == payloads
        assert_clean(client)
    assert broker.max_held == 8


def test_map_unordered_yields_every_index_once() -> None:
    payloads = [b"%d" % i for i in range(40)]
    with FakeBroker(echo, hold_until_idle=0.05) as broker, SyncClient(broker.endpoint) as client:
        got = [(i, r.data[0]) for i, r in client.map_unordered("echo", payloads, window=5)]
        assert_clean(client)
    assert sorted(got) == sorted(enumerate(payloads))
    assert broker.max_held == 5


def test_map_with_reordered_replies_and_multipart_payloads() -> None:
    payloads: list[bytes | Sequence[bytes]] = [(b"%d" % i, b"part") for i in range(200)]
    with FakeBroker(random_delay(0.005)) as broker, SyncClient(broker.endpoint) as client:
        got = [r.data for r in client.map("echo", payloads, window=32)]
    assert got == [tuple(p) for p in payloads]


def test_retry_after_a_dropped_reply() -> None:
    with (
        FakeBroker(drop_first) as broker,
        SyncClient(broker.endpoint, timeout=0.1, retries=2, backoff=0.01) as client,
    ):
        assert client.request("echo", b"x") == Response((b"x",))
        assert client.statistics().retries == 1
    assert list(broker.attempts.values()) == [2]


def test_duplicate_reply_is_dropped_and_counted() -> None:
    with FakeBroker(twice) as broker, SyncClient(broker.endpoint) as client:
        assert client.request("echo", b"one") == Response((b"one",))
        # Duplicates are read while waiting for something else: keep asking (bounded).
        for i in range(200):
            assert client.request("echo", b"%d" % i) == Response((b"%d" % i,))
            if client.statistics().duplicates:
                break
            time.sleep(0.005)
        s = client.statistics()
    assert s.duplicates >= 1
    assert (s.replies, s.unknown) == (i + 2, 0)


def test_timeout_after_the_last_retry() -> None:
    with (
        FakeBroker(silent) as broker,
        SyncClient(
            broker.endpoint, timeout=5.0, attempt_timeout=0.05, retries=2, backoff=0.01
        ) as client,
    ):
        start = time.monotonic()
        with pytest.raises(RequestTimeout):
            client.request("echo", b"x")
        assert 0.15 <= time.monotonic() - start < 2
        s = client.statistics()
        assert_clean(client)
    # Three attempts, then the mmi.service question asked before the end.
    assert [r.service for r in broker.requests] == [b"echo"] * 3 + [b"mmi.service"]
    assert (s.retries, s.timeouts, s.probes) == (2, 1, 1)


def test_remote_error() -> None:
    with FakeBroker(fail) as broker, SyncClient(broker.endpoint) as client:
        with pytest.raises(RemoteError) as info:
            client.request("echo", b"x")
        assert (info.value.code, info.value.message) == ("boom", "the handler failed")
        assert_clean(client)


def _bad_is_an_error(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    if req.data == (b"bad",):
        return [(0.0, error_reply_data("bad_input", "no"))]
    return [(0.01, req.data)]


def test_map_error_and_early_exit_forget_outstanding_requests() -> None:
    payloads = [b"a", b"b", b"bad", b"c", b"d", b"e"]
    with FakeBroker(_bad_is_an_error) as broker, SyncClient(broker.endpoint) as client:
        got = []
        with pytest.raises(RemoteError, match="bad_input"):
            for r in client.map("echo", payloads, window=4):
                got.append(r.data[0])
        assert got == [b"a", b"b"]
        assert_clean(client)
        with pytest.raises(RemoteError, match="bad_input"):
            for _ in client.map_unordered("echo", payloads, window=4):
                pass
        assert_clean(client)
        gen = client.map("echo", [b"x"] * 50, window=10)
        assert next(gen).data == (b"x",)
        gen.close()
        assert_clean(client)
        gen2 = client.map_unordered("echo", [b"y"] * 50, window=10)
        assert next(gen2)[1].data == (b"y",)
        gen2.close()
        assert_clean(client)
        # Late replies to the forgotten requests are dropped, later requests unaffected.
        assert client.request("echo", b"after") == Response((b"after",))
        with pytest.raises(ValueError, match="window"):
            client.map("echo", [], window=0)


def _bad_or_silent(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    if req.data == (b"mute",):
        return []
    return _bad_is_an_error(req, attempt)


def test_map_outcomes_yields_failures_in_place_and_goes_on() -> None:
    payloads = [b"a", b"bad", b"b", b"mute", b"c", b"bad", b"d"]
    with (
        FakeBroker(_bad_or_silent) as broker,
        SyncClient(broker.endpoint, timeout=0.2, retries=0) as client,
    ):
        got = list(client.map_outcomes("echo", payloads, window=3))
        assert_clean(client)
        assert [o.data[0] if isinstance(o, Response) else type(o) for o in got] == [
            b"a", RemoteError, b"b", RequestTimeout, b"c", RemoteError, b"d"
        ]  # fmt: skip
        assert isinstance(got[1], RemoteError) and got[1].code == "bad_input"
        # Closing early forgets the outstanding requests, as map() does.
        gen = client.map_outcomes("echo", [b"x"] * 50, window=10)
        assert next(gen) == Response((b"x",))
        gen.close()
        assert_clean(client)
        with pytest.raises(ValueError, match="window"):
            client.map_outcomes("echo", [], window=0)


def test_malformed_replies_are_counted() -> None:
    with FakeBroker(echo) as broker, SyncClient(broker.endpoint) as client:
        # A ROUTER drops messages to a peer it has not heard from yet: talk first.
        assert client.request("echo", b"hello") == Response((b"hello",))
        broker.inject([client.routing_id, b"garbage"])
        for _ in range(200):
            assert client.request("echo", b"ok") == Response((b"ok",))
            if client.statistics().malformed:
                break
            time.sleep(0.005)
        assert client.statistics().malformed == {"too_few_frames": 1}


def test_close_is_idempotent_and_later_requests_fail() -> None:
    with FakeBroker(echo) as broker:
        client = SyncClient(broker.endpoint)
        client.close()
        client.close()
        with pytest.raises(anyio.ClosedResourceError):
            client.request("echo", b"x")
        gen = client.map("echo", [b"x"])
        with pytest.raises(anyio.ClosedResourceError):
            next(gen)


def test_a_forked_child_must_not_use_the_parents_client() -> None:
    with FakeBroker(echo) as broker, SyncClient(broker.endpoint) as client:
        receiver = client._receiver  # white-box: fake a fork
        pid, receiver.pid = receiver.pid, -1  # what the client sees after os.fork()
        with pytest.raises(RuntimeError, match="forked"):
            client.request("echo", b"x")
        receiver.pid = pid


def test_bad_routing_id() -> None:
    with pytest.raises(ValueError, match="routing_id"):
        SyncClient("tcp://127.0.0.1:1", routing_id=b"\x00x")


def test_send_queue_full_waits_then_times_out() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.setsockopt(zmq.SNDHWM, 2)
    try:
        with SyncClient("tcp://127.0.0.1:1", context=ctx, timeout=0.05, retries=1) as client:
            with pytest.raises(RequestTimeout):
                list(client.map("echo", [b"x" * 100] * 10, window=10))
            s = client.statistics()
            assert_clean(client)
    finally:
        ctx.term()
    assert s.send_waits > 0


def _upper(data: tuple[bytes, ...]) -> list[bytes]:
    return [d.upper() for d in data]


def test_through_the_real_broker() -> None:
    payloads = [b"p%d" % i for i in range(300)]
    with (
        broker_in_thread() as endpoint,
        RawWorker(endpoint, b"upper", _upper) as worker,
        SyncClient(endpoint, timeout=5.0) as client,
    ):
        assert worker.registered.wait(10)
        assert client.request("upper", b"abc", metadata=[b"m"]) == Response((b"ABC",), (b"m",))
        assert [r.data[0] for r in client.map("upper", payloads)] == _upper(tuple(payloads))
        got = dict(client.map_unordered("upper", payloads, window=16))
        assert [got[i].data[0] for i in range(300)] == _upper(tuple(payloads))
        s = client.statistics()
    assert (s.replies, s.retries, s.pending) == (601, 0, 0)


def test_real_broker_queue_full_is_a_remote_error() -> None:
    with (
        broker_in_thread(max_queue=0) as endpoint,
        SyncClient(endpoint, wait_for_worker=True) as client,
    ):
        with pytest.raises(RemoteError) as info:
            client.request("nobody", b"refused")
        assert info.value.code == "queue_full"
        assert_clean(client)


def test_services_lists_every_service_page_by_page() -> None:
    """More services than one page holds (directory Rule D6): ``SyncClient.services()``
    asks page after page and returns each service once."""
    names = [f"made-up-{n:04d}" for n in range(PAGE_ENTRIES + 20)]
    with broker_in_thread() as endpoint, SyncClient(endpoint, timeout=5.0) as client:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
            for n, name in enumerate(names):  # one queued request makes each known
                sock.send_multipart(serialize(Request(name.encode(), None, (b"%d" % n,), ())))
            deadline = time.monotonic() + 10
            while client.request("mmi.broker").json()["services"] < len(names):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert len(client.request("mmi.services").data) == 2  # there is more
            assert [s.name for s in client.services()] == names
        finally:
            sock.close()


def test_infinite_timeout() -> None:
    with FakeBroker(random_delay(0.01)) as broker, SyncClient(broker.endpoint) as client:
        assert client.request("echo", b"x", timeout=math.inf) == Response((b"x",))
        assert_clean(client)


@pytest.mark.parametrize(
    ("bad", "error", "names"),
    [
        ({"data": (b"first", 123)}, TypeError, r"data\[1\]"),
        ({"service": 7}, TypeError, "service"),
        ({"metadata": [b"ok", 5]}, TypeError, r"metadata\[1\]"),
        ({"metadata": [b""]}, ValueError, r"metadata\[0\]"),
    ],
)
def test_a_bad_part_sends_nothing_and_the_next_request_is_intact(
    bad: dict[str, object], error: type[Exception], names: str
) -> None:
    """Issue 15, item 1: a bad part is refused before the first frame is sent."""
    with (
        FakeBroker(echo) as broker,
        SyncClient(broker.endpoint, timeout=2.0, retries=0) as client,
    ):
        args: dict[str, Any] = {"service": "echo", "data": (b"first",), "metadata": ()}
        args.update(bad)
        with pytest.raises(error, match=names):
            client.request(
                args["service"],
                *args["data"],
                metadata=args["metadata"],
            )
        assert_clean(client)
        assert client.request("echo", b"second") == Response((b"second",))
        s = client.statistics()
    [req] = broker.requests
    assert (req.service, req.data) == (b"echo", (b"second",))
    assert (s.retries, s.timeouts, s.malformed) == (0, 0, {})


def test_a_bad_map_payload_sends_nothing_of_it() -> None:
    payloads: list[object] = [b"a", "b", (b"c", "d"), (b"e", 5), b"f"]
    with (
        FakeBroker(echo) as broker,
        SyncClient(broker.endpoint, timeout=2.0, retries=0) as client,
    ):
        got = []
        with pytest.raises(TypeError, match=r"payloads\[3\]\[1\]"):
            for r in client.map("echo", payloads, window=1):  # type: ignore[arg-type]
                got.append(r.data)
        assert got == [(b"a",), (b"b",), (b"c", b"d")]
        with pytest.raises(TypeError, match=r"payloads\[0\]"):
            list(client.map_outcomes("echo", [42]))  # type: ignore[list-item]
        assert_clean(client)
        assert client.request("echo", b"next") == Response((b"next",))
    assert [r.data for r in broker.requests] == [(b"a",), (b"b",), (b"c", b"d"), (b"next",)]


def test_str_parts_and_request_json() -> None:
    with FakeBroker(echo) as broker, SyncClient(broker.endpoint) as client:
        response = client.request("écho", "héllo", b"raw", metadata=["mé"])
        assert response == Response(("héllo".encode(), b"raw"), ("mé".encode(),))
        assert [r.text for r in client.map("écho", ["a", ("b",), b"c"])] == ["a", "b", "c"]
        obj = {"a": [1, None], "b": "Zoë"}
        assert client.request_json("echo", obj, metadata=[b"m"]) == obj
        with pytest.raises(TypeError, match="obj is not JSON-serialisable"):
            client.request_json("echo", object())
        assert_clean(client)
    assert {r.service for r in broker.requests} == {"écho".encode(), b"echo"}
    assert len(broker.requests) == 5


def _closed_port() -> str:
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        sock.bind("tcp://127.0.0.1:0")
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        sock.close(0)


def test_no_broker_fails_within_the_timeout() -> None:
    with SyncClient(_closed_port(), timeout=0.5) as client:
        start = time.monotonic()
        with pytest.raises(RequestTimeout) as info:
            client.request("echo", b"x")
        assert 0.45 <= time.monotonic() - start < 1.5
        assert_clean(client)
    assert type(info.value) is RequestTimeout


def test_a_service_nobody_serves_raises_no_workers_within_the_timeout() -> None:
    # A call that waits for a worker (a failing-at-once one is test_first_contact.py's).
    with (
        broker_in_thread() as endpoint,
        SyncClient(endpoint, timeout=1.0, wait_for_worker=True) as client,
    ):
        start = time.monotonic()
        with pytest.raises(NoWorkers, match="no worker serves 'nobody'"):
            client.request("nobody", b"x")
        assert 0.85 <= time.monotonic() - start < 2.0
        # map_outcomes yields it in place, like any other failure.
        [outcome] = client.map_outcomes("nobody", [b"y"], timeout=0.3)
        assert isinstance(outcome, NoWorkers)
        assert client.statistics().no_workers == 2


def _no_responders(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    if NO_WAIT_OPTION in req.metadata:
        return [(0.0, error_reply_data("no_workers", "none"))]
    return []


def test_no_wait_fails_at_once_with_no_workers() -> None:
    with (
        FakeBroker(_no_responders) as broker,
        SyncClient(broker.endpoint, no_wait=True, timeout=10.0) as client,
    ):
        start = time.monotonic()
        with pytest.raises(NoWorkers, match=r"^no worker serves 'echo': none$"):
            client.request("echo", b"x")
        assert time.monotonic() - start < 2
        with pytest.raises(RequestTimeout) as info:
            client.request("echo", b"x", no_wait=False, timeout=0.2, retries=0)
        assert type(info.value) is RequestTimeout
    assert [NO_WAIT_OPTION in r.metadata for r in broker.requests if r.service == b"echo"] == [
        True,
        False,
    ]


def _in_thread(fn: Callable[[], object]) -> BaseException | None:
    """Run ``fn`` in a new thread; what it raised, if anything."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, name="intruder")
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    return raised[0] if raised else None


def test_a_second_thread_is_refused_at_once_and_the_owner_goes_on() -> None:
    """Issue 15, item 8: one SyncClient shared by threads failed with an occasional
    IndexError; now the second thread gets a clear RuntimeError before touching anything."""
    with FakeBroker(echo) as broker, SyncClient(broker.endpoint) as client:
        assert client.request("echo", b"mine") == Response((b"mine",))
        gen = client.map("echo", [b"a", b"b", b"c"], window=1)
        assert next(gen) == Response((b"a",))
        for attempt in (
            lambda: client.request("echo", b"theirs"),
            lambda: client.request_json("echo", [1]),
            lambda: list(client.map_unordered("echo", [b"x"])),
        ):
            exc = _in_thread(attempt)
            assert isinstance(exc, RuntimeError)
            assert str(exc) == (
                "a SyncClient may be used by one thread only: this one belongs to thread "
                "'MainThread', the first to send on it, and 'intruder' tried to use it; "
                "create one SyncClient per thread"
            )
        # The owner's requests are intact, the half-consumed map too.
        assert [r.data for r in gen] == [(b"b",), (b"c",)]
        assert client.request("echo", b"again") == Response((b"again",))
        assert_clean(client)
    assert [r.data for r in broker.requests] == [
        (b"mine",),
        (b"a",),
        (b"b",),
        (b"c",),
        (b"again",),
    ]


def test_the_owner_is_the_first_thread_that_sends() -> None:
    with FakeBroker(echo) as broker:
        client = SyncClient(broker.endpoint)  # created here, used only over there
        got: list[Response] = []
        assert _in_thread(lambda: got.append(client.request("echo", b"x"))) is None
        assert got == [Response((b"x",))]
        with pytest.raises(RuntimeError, match="one thread only"):
            client.request("echo", b"y")
        client.close()  # from any thread, once nobody uses it
        assert client.closed


# ---------------------------------------------------------------- discovery


async def _upper_handler(request: HandlerRequest) -> bytes:
    return request.data[0].upper()


UPPER = Service(
    _upper_handler,
    version="1.2.0",
    description="Upper-cases text",
    metadata={"team": "text"},
    request_schema={"type": "string"},
    response_schema={"type": "string"},
)


@pytest.mark.anyio
async def test_discovery_through_the_real_broker() -> None:
    """``services``, ``service_info``, ``service_stats`` and ``watch_services`` (a plain
    iterator), blocking in a thread while the broker and a worker run on the event loop."""
    async with Broker("tcp://127.0.0.1:0") as broker, anyio.create_task_group() as tg:
        endpoint = broker.endpoints[0]
        leave = anyio.Event()

        async def serve(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            async with Worker(endpoint, services={"upper": UPPER}):
                task_status.started()
                await leave.wait()

        await tg.start(serve)

        def discover() -> list[ServiceChange]:
            with SyncClient(endpoint, timeout=10) as client:
                assert client.request("upper", b"ab").bytes == b"AB"
                [summary] = client.services(timeout=5)
                assert (summary.name, summary.workers, summary.version) == ("upper", 1, "1.2.0")
                assert summary.description == "Upper-cases text"
                info = client.service_info("upper")
                assert info is not None
                assert (info.version, info.versions, info.workers) == ("1.2.0", ("1.2.0",), 1)
                assert info.metadata == {"team": "text"}
                assert info.request_schema == info.response_schema == {"type": "string"}
                assert client.service_info(b"nope") is None
                stats = client.service_stats(b"upper", timeout=5)
                assert stats is not None
                assert (stats.num_requests, stats.num_errors, stats.queued) == (1, 0, 0)
                assert stats.average_processing_time >= 0
                assert client.service_stats("nope") is None
                changes = client.watch_services(interval=0.05)
                seen = [next(changes)]  # what is served now
                anyio.from_thread.run_sync(leave.set)  # the worker leaves
                seen.append(next(changes))
                changes.close()  # type: ignore[attr-defined]
                with pytest.raises(ValueError, match="interval"):
                    next(client.watch_services(interval=math.inf))
                assert_clean(client)
                return seen

        seen = await anyio.to_thread.run_sync(discover)
    assert seen == [ServiceChange("upper", True, 1), ServiceChange("upper", False, 0)]
