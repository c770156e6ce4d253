"""Majordomo peers on a live dcp broker (real sockets, both anyio backends): raw frames in each
form (a REQ socket too), majortomo 0.2.0's own Client and Worker, and calls across protocols
with dcp's Client and Worker; what they receive checked against RFC 7 and RFC 18 (finding 12
of issue 25: a body frame in every REQUEST, REPLY and FINAL; no answer to a refusal; a
default work timeout for a worker that drops a request)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import zmq
from majortomo import Client as MtClient
from majortomo import Worker as MtWorker
from majortomo import WorkerRequestsIterator
from majortomo.error import Timeout as MtTimeout

import dcp
from dcp._io.context import get_context
from dcp.wire import mdp
from tests.helpers import Peers, RawPeer, wait_for

pytestmark = pytest.mark.anyio

ECHO = b"echo"
V01C = mdp.peer(mdp.Form.V01, envelope=True, worker=False)
V01W = mdp.peer(mdp.Form.V01, envelope=True, worker=True)
V02C = mdp.peer(mdp.Form.V02, envelope=False, worker=False)
V02W = mdp.peer(mdp.Form.V02, envelope=False, worker=True)


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[tuple[dcp.Broker, str]]:
    broker = dcp.Broker("tcp://127.0.0.1:0", **options)
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(broker.serve)
        yield broker, endpoint
        tg.cancel_scope.cancel()


async def until(broker: dcp.Broker, check: Any) -> dcp.BrokerStatistics:
    def probe() -> dcp.BrokerStatistics | None:
        stats = broker.statistics()
        return stats if check(stats) else None

    found = await wait_for(probe)
    assert found is not None
    return found


async def recv_skipping_heartbeats(peer: RawPeer, within: float = 5.0) -> list[bytes]:
    """The next message to a raw MDP worker that is not the broker's HEARTBEAT."""
    with anyio.fail_after(within):
        while True:
            frames = await peer.recv_frames()
            if frames not in (V01W.worker_heartbeat(), V02W.worker_heartbeat()):
                return frames


async def test_raw_mdp01_and_mdp02_peers() -> None:
    async with serving() as (broker, endpoint):
        with Peers(endpoint) as peers:
            w1 = peers(b"W1")
            w1.send_frames(V01W.worker_ready(ECHO))
            w2 = peers(b"W2")
            w2.send_frames(V02W.worker_ready(b"stream"))
            await until(broker, lambda s: s.workers == 2)
            c1 = peers(b"C1")
            c1.send_frames(V01C.client_request(ECHO, [b"hi"]))
            assert await recv_skipping_heartbeats(w1) == V01W.worker_request(b"C1", [b"hi"])
            w1.send_frames(V01W.worker_answer(b"C1", [b"HI"], final=True))
            assert await c1.recv_frames() == V01C.client_answer(ECHO, [b"HI"], final=True)
            # MDP/0.2: partials in order, then FINAL.
            c2 = peers(b"C2")
            c2.send_frames(V02C.client_request(b"stream", [b"go"]))
            assert await recv_skipping_heartbeats(w2) == V02W.worker_request(b"C2", [b"go"])
            for i in range(5):
                w2.send_frames(V02W.worker_answer(b"C2", [b"%d" % i], final=False))
            w2.send_frames(V02W.worker_answer(b"C2", [b"end"], final=True))
            got = [await c2.recv_frames() for _ in range(6)]
            assert got == [
                *(V02C.client_answer(b"stream", [b"%d" % i], final=False) for i in range(5)),
                V02C.client_answer(b"stream", [b"end"], final=True),
            ]
            # The broker heartbeats idle MDP workers.
            assert await w1.recv_frames(within=3) == V01W.worker_heartbeat()
            # mmi.service for an MDP client.
            c1.send_frames(V01C.client_request(b"mmi.service", [b"stream"]))
            answer = V01C.client_answer(b"mmi.service", [b"200"], final=True)
            assert await c1.recv_frames() == answer


async def test_an_mdp01_client_on_a_req_socket() -> None:
    async with serving() as (_, endpoint), dcp.Worker(endpoint, ECHO, shout) as _worker:
        sock: zmq.Socket[bytes] = get_context().socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        try:
            # A REQ socket adds the empty envelope frame itself.
            sock.send_multipart([b"MDPC01", ECHO, b"from", b"req"])
            await wait_for(lambda: sock.poll(0, zmq.POLLIN))
            assert sock.recv_multipart() == [b"MDPC01", ECHO, b"FROM REQ"]
        finally:
            sock.close(0)


async def shout(request: dcp.HandlerRequest) -> bytes:
    return b" ".join(request.data).upper()


@asynccontextmanager
async def majortomo_worker(endpoint: str, service: str) -> AsyncIterator[list[int]]:
    """majortomo's own Worker in a thread: answers each request with two partials and a
    final, until a request whose body is ``stop`` (its API blocks in ``wait_for_request``);
    yields the count of requests it handled."""
    handled = [0]

    def run() -> None:
        worker = MtWorker(endpoint, service, heartbeat_interval=0.5, zmq_linger=0)
        worker.connect()
        try:
            while True:
                client, body = worker.wait_for_request()
                if body == [b"stop"]:
                    worker.send_reply_final(client, [b"stopped"])
                    return
                handled[0] += 1
                worker.send_reply_partial(client, [b"partial"])
                worker.send_reply_partial(client, [b"more"])
                worker.send_reply_final(client, [b"final:" + b"|".join(body)])
        finally:
            worker.close()  # type: ignore[no-untyped-call]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield handled
    finally:
        if thread.is_alive():  # (never block the event loop: the broker runs in it)
            await anyio.to_thread.run_sync(majortomo_call, endpoint, service.encode(), b"stop")
        await anyio.to_thread.run_sync(thread.join, 5)


def majortomo_call(endpoint: str, service: bytes, *body: bytes) -> list[list[bytes]]:
    """majortomo's own Client: every part of the reply."""
    with MtClient(endpoint) as client:
        client.send(service, *body)
        return list(client.recv_all(timeout=5))


async def test_majortomo_client_and_worker_through_dcp() -> None:
    async with (
        serving(heartbeat_interval=0.5) as (broker, endpoint),
        majortomo_worker(endpoint, "mt") as handled,
    ):
        await until(broker, lambda s: s.services.get(b"mt") and s.services[b"mt"].workers)
        parts = await anyio.to_thread.run_sync(majortomo_call, endpoint, b"mt", b"a", b"b")
        assert parts == [[b"partial"], [b"more"], [b"final:a|b"]]
        # A dcp client calling majortomo's worker gets the final reply, its request id
        # intact (the partials are dropped: DCP v1 has no partial replies).
        async with dcp.Client(endpoint, timeout=5) as client:
            reply = await client.request(b"mt", b"x")
            assert reply.data == (b"final:x",)
            replies = [r async for r in client.map(b"mt", [(b"%d" % i,) for i in range(20)])]
            assert [r.data for r in replies] == [(b"final:%d" % i,) for i in range(20)]
        assert handled[0] == 22
        # majortomo's client calling a dcp worker: its FINAL.
        async with dcp.Worker(endpoint, b"dcp-shout", shout):
            parts = await anyio.to_thread.run_sync(
                majortomo_call, endpoint, b"dcp-shout", b"hi", b"there"
            )
            assert parts == [[b"HI THERE"]]
        stats = broker.statistics()
        assert stats.rejections.get("partial_dropped") == 42
        assert stats.partials == 2


@asynccontextmanager
async def raw_worker_with_a_call(
    broker: dcp.Broker, endpoint: str, form: mdp.MdpPeer, data: bytes
) -> AsyncIterator[tuple[RawPeer, list[bytes], list[dcp.Response]]]:
    """A raw MDP worker that registered and got a dcp client's request (its frames), the
    call running in the background (no retries: only the broker can rescue it); the
    client's responses once the block is left."""
    with Peers(endpoint) as peers:
        worker = peers(b"W1")
        worker.send_frames(form.worker_ready(ECHO))
        await until(broker, lambda s: s.workers == 1)
        replies: list[dcp.Response] = []
        async with (
            dcp.Client(endpoint, timeout=10, retries=0) as client,
            anyio.create_task_group() as tg,
        ):

            async def call() -> None:
                replies.append(await client.request(ECHO, data))

            tg.start_soon(call)
            request = await recv_skipping_heartbeats(worker)
            yield worker, request, replies


async def test_a_busy_silent_mdp_worker_keeps_its_request() -> None:
    """A raw MDP/0.1 worker that sends nothing for 4 s while it works (4x the idle
    timeout): its request is not taken away, and its reply arrives once."""
    options = {"heartbeat_interval": 0.25, "liveness": 2, "mdp_timeout": 1.0}
    async with serving(**options) as (broker, endpoint):
        async with raw_worker_with_a_call(broker, endpoint, V01W, b"slow") as (
            worker,
            request,
            replies,
        ):
            assert request[4:] == [b"", b"slow"]
            await anyio.sleep(4.0)  # busy, silent
            worker.send_frames(V01W.worker_answer(request[3], [b"done"], final=True))
        assert [r.data for r in replies] == [(b"done",)]
        stats = broker.statistics()
        assert (stats.replies, stats.redeliveries, stats.expired_workers) == (1, 0, 0)


async def test_a_killed_busy_mdp_worker_request_is_redelivered() -> None:
    async with serving(heartbeat_interval=0.25, liveness=2) as (broker, endpoint):
        async with raw_worker_with_a_call(broker, endpoint, V02W, b"job") as (doomed, _, got):
            doomed.close()  # dies holding the request, without a word
            started = anyio.current_time()
            async with dcp.Worker(endpoint, ECHO, shout):
                await until(broker, lambda s: s.replies == 1)
            elapsed = anyio.current_time() - started
        assert [r.data for r in got] == [(b"JOB",)]
        assert elapsed < 3.0
        assert broker.statistics().redeliveries == 1


# ------------------------------------------- finding 12: what Majordomo peers receive


async def nothing(request: dcp.HandlerRequest) -> Sequence[bytes]:
    return []


async def two_parts(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
    yield b"p0"
    yield b"p1"


async def test_mdp_clients_get_a_body_frame_where_a_dcp_handler_has_no_data() -> None:
    """Finding 12 (a): a handler returning ``[]``, and the end of a stream, reach MDP clients
    with one empty body frame: RFC 7's REPLY and RFC 18's FINAL have "4 or more frames"
    (the zguide's mdcliapi2.c asserts it)."""
    async with (
        serving() as (_, endpoint),
        dcp.Worker(endpoint, "nothing", nothing),
        dcp.Worker(endpoint, "parts", two_parts),
    ):
        with Peers(endpoint) as peers:
            c1 = peers(b"C1")
            c1.send_frames([b"", b"MDPC01", b"nothing", b"x"])
            assert await c1.recv_frames() == [b"", b"MDPC01", b"nothing", b""]
            c2 = peers(b"C2")
            c2.send_frames([b"MDPC02", b"\x01", b"parts", b"x"])
            assert [await c2.recv_frames() for _ in range(3)] == [
                [b"MDPC02", b"\x02", b"parts", b"p0"],
                [b"MDPC02", b"\x02", b"parts", b"p1"],
                [b"MDPC02", b"\x03", b"parts", b""],
            ]
        # On a REQ socket (the zguide's mdcliapi.c): "MDPC01", service, and a body.
        sock: zmq.Socket[bytes] = get_context().socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        try:
            sock.send_multipart([b"MDPC01", b"nothing"])
            await wait_for(lambda: sock.poll(0, zmq.POLLIN))
            assert sock.recv_multipart() == [b"MDPC01", b"nothing", b""]
        finally:
            sock.close(0)
        # majortomo's own client: each part, and the FINAL, has its one frame.
        parts = await anyio.to_thread.run_sync(majortomo_call, endpoint, b"parts", b"x")
        assert parts == [[b"p0"], [b"p1"], [b""]]


@asynccontextmanager
async def majortomo_echo(endpoint: str, service: str) -> AsyncIterator[None]:
    """majortomo's own echo worker loop (``WorkerRequestsIterator``, as ``majortomo.echo``
    runs it: a REQUEST it cannot parse is dropped with a warning) in a thread, until a
    request whose body is ``stop``."""

    def run() -> None:
        worker = MtWorker(endpoint, service, heartbeat_interval=0.5, zmq_linger=0)
        requests = WorkerRequestsIterator(worker)
        for body in requests:
            requests.send_reply_final(body)  # type: ignore[no-untyped-call]
            if body == [b"stop"]:
                requests.stop()  # type: ignore[no-untyped-call]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        if thread.is_alive():
            await anyio.to_thread.run_sync(majortomo_call, endpoint, service.encode(), b"stop")
        await anyio.to_thread.run_sync(thread.join, 5)


async def test_a_request_with_no_data_reaches_a_majortomo_worker() -> None:
    """Finding 12 (b): ``dcp call mtecho`` (no data) reaches majortomo's worker as a REQUEST
    with one empty body frame (RFC 7: "6 or more frames"), which it answers; a bodiless one
    it dropped, and the call timed out."""
    async with (
        serving(heartbeat_interval=0.5) as (broker, endpoint),
        majortomo_echo(endpoint, "mtecho"),
    ):
        await until(broker, lambda s: s.services.get(b"mtecho") and s.services[b"mtecho"].idle)
        async with dcp.Client(endpoint, timeout=5, retries=0) as client:
            reply = await client.request("mtecho")
            assert reply.data == (b"",)
            reply = await client.request("mtecho", b"a", b"b")
            assert reply.data == (b"a", b"b")


def majortomo_refused(endpoint: str, service: bytes) -> bool:
    """majortomo's own Client calls ``service``: whether it got no answer (a timeout)."""
    with MtClient(endpoint) as client:
        client.send(service, b"x")
        try:
            client.recv_all_as_list(timeout=0.5)
        except MtTimeout:
            return True
        return False


async def test_refusals_reach_mdp_clients_as_no_answer() -> None:
    """Finding 12 (c), majordomo Rule M1: an MDP/0.1 client (the zguide's mdclient2 sends
    many requests, then counts replies) whose requests the broker refuses (``queue_full``:
    nobody serves the service and ``max_queue`` is 0) gets no answer to them, only its real
    replies: a refusal would have been sent before the reply that follows it. It was a reply
    whose body was ``\xffDCP-ERROR queue_full ...``, which mdclient2 counted as one.
    majortomo's client gets no answer (its timeout) rather than an error body as data."""
    async with serving(max_queue=0) as (broker, endpoint), dcp.Worker(endpoint, ECHO, shout):
        await until(broker, lambda s: s.services.get(ECHO) and s.services[ECHO].idle)
        with Peers(endpoint) as peers:
            client = peers(b"C1")
            got = []
            for n in range(2):
                for i in range(3):
                    client.send_frames(V01C.client_request(b"nobody", [b"%d" % i]))
                client.send_frames(V01C.client_request(ECHO, [b"real", b"%d" % n]))
                got.append(await client.recv_frames())
            assert got == [
                V01C.client_answer(ECHO, [b"REAL 0"], final=True),
                V01C.client_answer(ECHO, [b"REAL 1"], final=True),
            ]
            stats = await until(broker, lambda s: s.rejections.get("queue_full") == 6)
            assert stats.replies == 2
        assert await anyio.to_thread.run_sync(majortomo_refused, endpoint, b"nobody")
        await until(broker, lambda s: s.rejections.get("queue_full") == 7)


async def drop_and_beat(worker: RawPeer, form: mdp.MdpPeer, every: float) -> list[list[bytes]]:
    """A raw MDP worker that heartbeats every ``every`` s and answers nothing (as majortomo's
    did after dropping a bodiless REQUEST), until DISCONNECT; what it was sent but the
    broker's heartbeats."""
    received: list[list[bytes]] = []
    while True:
        worker.send_frames(form.worker_heartbeat())
        with anyio.move_on_after(every):
            while True:
                frames = await worker.recv_frames(within=60)
                if frames == form.worker_disconnect():
                    return [*received, frames]
                if frames != form.worker_heartbeat():
                    received.append(frames)


async def test_an_mdp_worker_that_drops_a_request_loses_it_to_the_mdp_work_timeout() -> None:
    """Finding 12 (b), majordomo Rule M5: a raw MDP/0.2 worker that takes a majortomo
    client's request and keeps heartbeating without answering is sent DISCONNECT after
    ``mdp_work_timeout``, and the request goes to majortomo's echo worker, which answers it.
    The broker used to let the first worker hold it for ever."""
    options = {"heartbeat_interval": 0.25, "mdp_work_timeout": 1.0}
    async with serving(**options) as (broker, endpoint):
        with Peers(endpoint) as peers:
            dropper = peers(b"W1")
            dropper.send_frames(V02W.worker_ready(b"mtecho"))
            await until(broker, lambda s: s.workers == 1)
            answers: list[list[list[bytes]]] = []
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    answers.append(
                        await anyio.to_thread.run_sync(majortomo_call, endpoint, b"mtecho", b"job")
                    )

                tg.start_soon(call)
                await until(broker, lambda s: s.services[b"mtecho"].idle == 0)
                async with majortomo_echo(endpoint, "mtecho"):
                    dropped = await drop_and_beat(dropper, V02W, 0.25)
                    await until(broker, lambda s: s.replies == 1)
        assert dropped == [
            V02W.worker_request(dropped[0][2], [b"job"]),
            V02W.worker_disconnect(),
        ]
        assert answers == [[[b"job"]]]
        stats = broker.statistics()
        assert (stats.work_timeouts, stats.redeliveries) == (1, 1)
