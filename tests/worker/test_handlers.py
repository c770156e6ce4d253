"""Handlers and the caller's deadline on real tcp sockets, on both anyio backends: plain
``def`` handlers in threads, the blocked-loop warning, what a handler sees of the metadata,
and the broker's request options (expiry in the queue, retries that replace their queued
copy, no-wait) seen from raw DCP clients.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator, Sequence

import anyio
import pytest
import zmq

import dcp
from dcp._models import HandlerRequest
from dcp._worker.services import ServiceTable
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import parse_error_reply
from dcp.wire.options import (
    NO_WAIT_OPTION,
    REQUEST_ID_PREFIX,
    expires_in_option,
    work_timeout_option,
)
from tests.integration.test_end_to_end import HB, eventually, fast_broker, fast_worker
from tests.worker.test_worker import FakeBroker, raw_client, start

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.close()


def send(client: zmq.Socket[bytes], service: bytes, meta: Sequence[bytes], *data: bytes) -> None:
    client.send_multipart(
        serialize(dcp.wire.Request(service, None, tuple(meta), data)), zmq.NOBLOCK
    )


async def receive(client: zmq.Socket[bytes], limit: float = 5.0) -> dcp.wire.Reply:
    with anyio.fail_after(limit):
        while True:
            try:
                frames = client.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                await anyio.sleep(0.002)
                continue
            msg, _ = parse(frames)
            assert isinstance(msg, dcp.wire.Reply)
            return msg


def blocked_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "event loop was blocked" in r.getMessage()]


# -- plain def handlers and the watchdog ---------------------------------------------------


async def test_a_blocking_def_handler_runs_once_in_a_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """4 heartbeat intervals of blocking work (over the 3 of liveness) in a plain ``def``:
    heartbeats go on, the broker keeps the worker, the job runs once."""
    runs: list[int] = []
    loop_thread = threading.get_ident()

    def crunch(request: dcp.HandlerRequest) -> bytes:
        runs.append(threading.get_ident())
        time.sleep(4 * HB)
        return request.data[0].upper()

    async with fast_broker() as broker, fast_worker(broker.endpoints[0], "crunch", crunch):
        async with dcp.Client(broker.endpoints[0], timeout=10) as client:
            response = await client.request("crunch", b"abc", retries=0)
        stats = broker.statistics()
    assert response.data == (b"ABC",)
    assert len(runs) == 1 and runs[0] != loop_thread
    assert (stats.redeliveries, stats.expired_workers, stats.dispatched) == (0, 0, 1)
    assert blocked_warnings(caplog) == []


class Shout:
    """A callable object whose ``__call__`` is ``async def``: it runs on the event loop."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    async def __call__(self, request: dcp.HandlerRequest, suffix: bytes = b"") -> bytes:
        self.threads.append(threading.get_ident())
        return request.data[0].upper() + suffix


async def test_handler_kinds_are_told_apart() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def plain(request: dcp.HandlerRequest, suffix: bytes) -> bytes:
        threads.append(threading.get_ident())
        return request.data[0] + suffix

    shout = Shout()
    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        async with (
            fast_worker(ep, "plain", functools.partial(plain, suffix=b"!")),
            fast_worker(ep, "shout", functools.partial(shout, suffix=b"?")),
            dcp.Client(ep, timeout=5) as client,
        ):
            assert (await client.request("plain", b"a")).data == (b"a!",)
            assert (await client.request("shout", b"b")).data == (b"B?",)
    assert threads and threads[0] != loop_thread
    assert shout.threads == [loop_thread]


async def test_def_handlers_run_concurrently_up_to_the_concurrency() -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def slow(request: dcp.HandlerRequest) -> bytes:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return request.data[0]

    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        async with (
            fast_worker(ep, "slow", slow, concurrency=3),
            dcp.Client(ep) as client,
            anyio.create_task_group() as tg,
        ):
            for i in range(12):
                tg.start_soon(client.request, "slow", b"%d" % i)
    assert most == 3


async def test_a_blocked_event_loop_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def blocking(request: dcp.HandlerRequest) -> bytes:
        time.sleep(4 * HB)  # noqa: ASYNC251 - wrong in an async handler: what the warning is for
        return request.data[0]

    async with dcp.Broker("tcp://127.0.0.1:0", heartbeat_interval=HB, liveness=50) as broker:
        ep = broker.endpoints[0]
        worker = dcp.Worker(ep, "blocking", blocking, heartbeat_interval=HB, liveness=50)
        async with worker, dcp.Client(ep, timeout=10) as client:
            for _ in range(2):
                await client.request("blocking", b"x", retries=0)
    [warning] = blocked_warnings(caplog)
    assert "test_a_blocked_event_loop_is_warned_about_once.<locals>.blocking" in warning
    assert "worker for 'blocking' (handler " in warning
    assert "make it a plain def" in warning


# -- what the handler sees -----------------------------------------------------------------


async def test_handler_metadata_is_the_callers_own() -> None:
    seen: list[HandlerRequest] = []

    async def front(request: HandlerRequest) -> dcp.Forward:
        seen.append(request)
        return dcp.Forward("back", request.data[0])

    def back(request: HandlerRequest) -> list[bytes]:
        seen.append(request)
        return [request.data[0], *request.metadata]

    dcp_parts = (
        REQUEST_ID_PREFIX + b"1",
        work_timeout_option(5),
        expires_in_option(5),
        b"\xffDCP:an-option-to-come",
    )
    metadata = (dcp_parts[0], dcp_parts[1], b"mine", dcp_parts[2], b"\xffnot-dcp", dcp_parts[3])
    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        async with fast_worker(ep, "front", front), fast_worker(ep, "back", back):
            client = raw_client(ep)
            try:
                send(client, b"front", metadata, b"data")
                reply = await receive(client)
            finally:
                client.close(0)
    # On the wire, the metadata went through every hop unchanged.
    assert reply.metadata == metadata
    assert reply.data == (b"data", b"mine", b"\xffnot-dcp")
    for request in seen:
        assert request.metadata == (b"mine", b"\xffnot-dcp")
        assert request.dcp_metadata == dcp_parts
    assert broker.statistics().unmatched == 0  # the forward and reply released their holds


async def test_handlers_see_str_service_names_and_may_answer_str_and_json() -> None:
    """Finding 6 of issue 25: a handler sees its service's name as ``str``, may return ``str``
    (UTF-8) and sequences mixing ``str`` and ``bytes``, and answers a
    :meth:`dcp.Client.request_json` caller with :func:`dcp.json_reply`."""
    seen: list[object] = []

    async def insp(request: HandlerRequest) -> str:
        seen.append(request.service)
        return f"served by {request.service}: {request.text}"

    def mixed(request: HandlerRequest) -> list[str | bytes]:
        return ["é", b"\xff", request.service]

    async def add(request: HandlerRequest) -> bytes:
        numbers = request.json()
        return dcp.json_reply({"sum": numbers["a"] + numbers["b"], "by": request.service})

    async def relay(request: HandlerRequest) -> dcp.Forward:
        return dcp.Forward("insp", "relayed")

    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        services: ServiceTable = {"insp": insp, "mixed": mixed, "add": add, "relay": relay}
        async with dcp.Worker(ep, services=services), dcp.Client(ep, timeout=10) as client:
            assert (await client.request("insp", "hé")).text == "served by insp: hé"
            assert (await client.request("mixed")).data == ("é".encode(), b"\xff", b"mixed")
            assert await client.request_json("add", {"a": 1, "b": 2}) == {"sum": 3, "by": "add"}
            assert (await client.request("relay")).text == "served by insp: relayed"
    assert seen == ["insp", "insp"]
    # A handler's request made by hand (a unit test of a handler) takes either spelling.
    assert HandlerRequest(b"insp").service == HandlerRequest("insp").service == "insp"
    assert dcp.json_reply([1, "é"]) == '[1,"é"]'.encode()
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        dcp.json_reply(float("nan"))


async def test_a_backlogged_request_past_its_deadline_is_not_run(fake: FakeBroker) -> None:
    release = anyio.Event()
    ran: list[bytes] = []

    async def handler(request: dcp.HandlerRequest) -> bytes:
        ran.append(request.data[0])
        await release.wait()
        return request.data[0]

    worker = dcp.Worker(fake.endpoint, b"echo", handler, concurrency=1)
    async with anyio.create_task_group() as tg:
        ident = await start(tg, fake, worker)
        client = b"\x01client"
        fake.send(ident, dcp.wire.Request(b"echo", client, (b"id-1",), (b"one",)))
        fake.send(
            ident, dcp.wire.Request(b"echo", client, (b"id-2", expires_in_option(0.05)), (b"two",))
        )
        await eventually(lambda: worker.statistics().backlog == 1)
        await anyio.sleep(0.1)
        release.set()
        _, first = await fake.expect(dcp.wire.Reply)
        _, second = await fake.expect(dcp.wire.Reply)
        tg.cancel_scope.cancel()
    assert first.data == (b"one",)
    assert parse_error_reply(second.data) is not None
    assert parse_error_reply(second.data)[0] == "expired"  # type: ignore[index]
    assert second.metadata == (b"id-2", expires_in_option(0.05))
    assert ran == [b"one"]
    assert worker.statistics().expired == 1


# -- the broker's request options ----------------------------------------------------------


async def test_no_wait_for_a_service_nobody_serves_fails_at_once() -> None:
    async with fast_broker() as broker:
        client = raw_client(broker.endpoints[0])
        try:
            for width in (1, 4):
                request = dcp.wire.Request(b"nobody", None, (b"id", NO_WAIT_OPTION), (b"x",))
                client.send_multipart(serialize(request, width=width), zmq.NOBLOCK)
                reply = await receive(client, limit=1.0)
                assert parse_error_reply(reply.data) == (
                    "no_workers",
                    "no worker serves b'nobody'",
                )
        finally:
            client.close(0)
        assert broker.statistics().rejections == {"no_workers": 2}


async def test_an_expired_queued_request_is_dropped_before_a_worker_comes() -> None:
    runs: list[bytes] = []

    async def later(request: dcp.HandlerRequest) -> bytes:
        runs.append(request.data[0])
        return b"done"

    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        client = raw_client(ep)
        try:
            send(client, b"later", (b"id-1", expires_in_option(0.1)), b"abandoned")
            send(client, b"later", (b"id-2", expires_in_option(30)), b"wanted")
            await eventually(lambda: broker.statistics().expired_in_queue == 1)
            assert broker.statistics().services[b"later"].queued == 1
            async with fast_worker(ep, "later", later):
                reply = await receive(client)
        finally:
            client.close(0)
        assert reply.metadata == (b"id-2", expires_in_option(30))
        assert runs == [b"wanted"]


async def test_a_retry_replaces_its_queued_copy_and_the_job_runs_once() -> None:
    runs: list[bytes] = []

    async def later(request: dcp.HandlerRequest) -> bytes:
        runs.append(request.data[0])
        return b"done"

    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        client = raw_client(ep)
        try:
            rid = REQUEST_ID_PREFIX + b"1"  # a retry is known by its dcp request id
            for left in (4.0, 3.0, 2.0):  # each attempt carries the time its caller has left
                send(client, b"later", (rid, expires_in_option(left), b"mine"), b"job")
            await eventually(lambda: broker.statistics().replaced == 2)
            assert broker.statistics().services[b"later"].queued == 1
            async with fast_worker(ep, "later", later):
                reply = await receive(client)
                await anyio.sleep(0.1)  # room for a second run, if there were one
        finally:
            client.close(0)
        assert reply.metadata == (rid, expires_in_option(2.0), b"mine")
        assert runs == [b"job"]
        assert broker.statistics().requests == 1


async def test_the_blocked_warning_is_silent_for_a_healthy_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "dcp.worker")

    async def quick(request: dcp.HandlerRequest) -> bytes:
        return b"ok"

    # A loaded machine can stall the whole process for a few tenths of a second, which is a
    # blocked loop as far as the worker can tell (its heartbeats did stop): the interval here
    # is a second, so only a handler that blocks (or a stall no test survives) would warn.
    hb = 1.0
    async with (
        fast_broker(heartbeat=hb) as broker,
        fast_worker(broker.endpoints[0], "quick", quick, heartbeat=hb),
    ):
        await anyio.sleep(3 * hb)
    assert blocked_warnings(caplog) == []


def test_result_message_turns_every_kind_of_sequence_into_bytes_parts() -> None:
    """A tuple or list of ``bytes`` (the common case, taken first), any other sequence, and
    parts that are bytes-like but not ``bytes``: all become a reply of ``bytes`` parts."""
    from collections import UserList

    from dcp._worker.results import result_message
    from dcp.wire.messages import Reply, Request

    request = Request(b"svc", b"client", (b"meta",), (b"data",))
    for result in (
        (b"a", b"b"),
        [b"a", b"b"],
        UserList([b"a", b"b"]),
        [bytearray(b"a"), memoryview(b"b")],
        (b"a", bytearray(b"b")),
        ["a", b"b"],  # str parts are UTF-8 (issue 25, finding 6)
        UserList(["a", memoryview(b"b")]),
    ):
        reply = result_message(request, result)
        assert isinstance(reply, Reply)
        assert (reply.client, reply.metadata, reply.data) == (b"client", (b"meta",), (b"a", b"b"))
        assert all(type(part) is bytes for part in reply.data)
    with pytest.raises(TypeError, match="returned a list with a part of type int"):
        result_message(request, [b"a", 3])
