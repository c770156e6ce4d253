"""``type_width=4``: dcp's clients and workers talking to the DagBox C++ reference broker.

DagBox writes the type frame as a 4-byte little-endian ``int`` and aborts on a 1-byte one.
:class:`~tests.fakes.DagBoxBroker` stands in for it on a real ROUTER socket and fails the test
on any type frame that is not exactly 4 bytes. The last tests go through the real
:class:`dcp.Broker`, which reads both widths and answers each peer in kind.
"""

from __future__ import annotations

import math
import time

import anyio
import anyio.to_thread
import pytest
import zmq

from dcp import Forward, RequestTimeout
from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._client.sync_client import SyncClient
from dcp._core.client.tracker import RequestTracker
from dcp._core.worker.core import WorkerCore
from dcp._models import HandlerRequest
from dcp._worker.worker import Worker
from dcp.wire import Request
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import Ping, Reconnect, Register, Reply
from tests.fakes import DagBoxBroker
from tests.helpers import take_tracker as take
from tests.helpers import wait_for

UPPER = [(b"%d x" % i,) for i in range(20)]
FOUR = b"\x04\x00\x00\x00"  # REQUEST, as a 4-byte little-endian int


async def upper(request: HandlerRequest) -> list[bytes]:
    return [part.upper() for part in request.data]


async def front(request: HandlerRequest) -> Forward:
    """Passes the request on to ``upper`` (the reply goes straight to the client)."""
    return Forward(b"upper", *request.data, b"via front")


# ---------------------------------------------------------------- through a DagBox broker


@pytest.mark.anyio
@pytest.mark.parametrize(
    "answer_width", [4, 1], ids=["dagbox-writes-4", "broker-writes-1-explicit-width-wins"]
)
async def test_client_and_workers_write_only_4_byte_types(answer_width: int) -> None:
    """Registrations, pings, requests, forwards, replies and the leaving Reconnect: every
    message is 4 bytes from the first one on (also when the broker writes 1 byte)."""
    with DagBoxBroker(answer_width=answer_width) as dagbox:
        endpoint = dagbox.endpoint
        async with (
            Worker(endpoint, "upper", upper, heartbeat_interval=0.05, type_width=4) as w1,
            Worker(endpoint, "front", front, heartbeat_interval=0.05, type_width=4) as w2,
            Client(endpoint, timeout=5, retries=0, type_width=4) as client,
        ):
            assert (await client.request("upper", b"a", b"b")).data == (b"A", b"B")
            replies = [r.data async for r in client.map("upper", UPPER, window=4)]
            assert replies == [tuple(p.upper() for p in parts) for parts in UPPER]
            assert (await client.request("front", b"c")).data == (b"C", b"VIA FRONT")
            await wait_for(lambda: len(dagbox.received(Ping)) >= 2)  # heartbeats too
            assert (w1._core.width, w2._core.width) == (4, 4)
        await wait_for(lambda: len(dagbox.received(Reconnect)) == 2)  # both left
    assert set(dagbox.widths) == {4}
    workers = {msg.service: ident for ident, msg in dagbox.seen if isinstance(msg, Register)}
    assert set(dagbox.received(Reply)) == {workers[b"upper"]}
    assert set(dagbox.received(Request)) == {client.routing_id, workers[b"front"]}  # a forward


@pytest.mark.anyio
async def test_sync_client_writes_only_4_byte_types() -> None:
    def calls(endpoint: str) -> list[tuple[bytes, ...]]:
        with SyncClient(endpoint, timeout=5, retries=0, type_width=4) as client:
            first = client.request("upper", b"a").data
            return [first, *(r.data for r in client.map("upper", UPPER, window=4))]

    with DagBoxBroker() as dagbox:
        async with Worker(dagbox.endpoint, "upper", upper, type_width=4):
            got = await anyio.to_thread.run_sync(calls, dagbox.endpoint)
    assert got == [(b"A",), *(tuple(p.upper() for p in parts) for parts in UPPER)]
    assert set(dagbox.widths) == {4}


def test_the_stand_in_aborts_on_a_1_byte_type() -> None:
    """The DagBox stand-in is not vacuous: a default (1-byte) client makes it fail."""
    dagbox = DagBoxBroker()
    with (
        pytest.raises(AssertionError, match=r"DagBox aborts: .* sent a 1-byte type frame"),
        dagbox,
        SyncClient(dagbox.endpoint, timeout=0.3, retries=0) as client,
    ):
        with pytest.raises(RequestTimeout):
            client.request("upper", b"a")
        deadline = time.monotonic() + 5
        while not dagbox.widths and time.monotonic() < deadline:
            time.sleep(0.005)
    assert dagbox.widths == {1: 1}


# ---------------------------------------------------------------- through the dcp broker


@pytest.mark.anyio
@pytest.mark.parametrize(("client_width", "worker_width"), [(4, 4), (1, 4), (4, 1)])
async def test_round_trip_through_the_dcp_broker(client_width: int, worker_width: int) -> None:
    """The dcp broker reads both widths and answers in kind, so widths can be mixed."""
    async with Broker("tcp://127.0.0.1:0") as broker:
        endpoint = broker.endpoints[0]
        async with (
            Worker(endpoint, "upper", upper, type_width=worker_width) as w1,
            Worker(endpoint, "front", front, type_width=worker_width),
            Client(endpoint, timeout=5, retries=0, type_width=client_width) as client,
        ):
            assert (await client.request("upper", b"a")).data == (b"A",)
            assert (await client.request("front", b"b")).data == (b"B", b"VIA FRONT")
            replies = [r.data async for r in client.map("upper", UPPER, window=8)]
            assert replies == [tuple(p.upper() for p in parts) for parts in UPPER]
            assert w1._core.width == worker_width  # the broker answered in kind
        stats = broker.statistics()
    assert stats.forwards == 1


# ---------------------------------------------------------------- the option itself


@pytest.mark.parametrize("width", [0, 2, 3, 8, -4])
def test_a_width_other_than_1_or_4_is_refused_before_any_socket(width: int) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.term()  # a socket from it would raise ZMQError, not ValueError
    message = rf"^type_width must be 1 or 4 \(4: the DagBox C\+\+ reference broker\), not {width}$"
    with pytest.raises(ValueError, match=message):
        Client("tcp://127.0.0.1:1", context=ctx, type_width=width)
    with pytest.raises(ValueError, match=message):
        SyncClient("tcp://127.0.0.1:1", context=ctx, type_width=width)
    with pytest.raises(ValueError, match=message):
        Worker("tcp://127.0.0.1:1", "svc", upper, context=ctx, type_width=width)
    with pytest.raises(ValueError, match=message):
        RequestTracker(type_width=width)
    with pytest.raises(ValueError, match=message):
        WorkerCore(b"svc", type_width=width)


def test_tracker_builds_requests_and_resends_in_its_width() -> None:
    tracker = RequestTracker(
        type_width=4, timeout=math.inf, attempt_timeout=1.0, retries=1, jitter=0.0, backoff=0.1
    )
    rid = tracker.request(b"svc", [b"x"], 0.0)
    (frames,) = take(tracker)
    assert frames[2] == FOUR
    msg, width = parse(frames)
    assert (msg, width) == (Request(b"svc", None, (rid,), (b"x",)), 4)
    tracker.expire(1.0)
    assert take(tracker) == []  # the backoff delay starts
    tracker.expire(1.1)
    (resend,) = take(tracker)
    assert resend[2] == FOUR
    # Replies are read in either width.
    rid2 = tracker.request(b"svc", [b"y"], 0.0)
    take(tracker)
    for r, w in ((rid, 1), (rid2, 4)):
        got = tracker.receive(serialize(Reply(None, (r,), (b"ok",)), width=w))
        assert got is not None and got[0] == r


def test_worker_core_keeps_an_explicit_4_and_follows_the_broker_with_1() -> None:
    explicit = WorkerCore(b"svc", type_width=4)
    assert explicit.width == 4
    explicit.connect(0.0)
    explicit.receive(serialize(Register(b"svc"), width=1), 0.0)
    assert explicit.width == 4
    default = WorkerCore(b"svc")
    assert default.width == 1
    default.connect(0.0)
    default.receive(serialize(Register(b"svc"), width=4), 0.0)
    assert default.width == 4
    default.receive(serialize(Ping(), width=1), 0.0)
    assert default.width == 1
