"""Majordomo peers on a live dcp broker (real sockets, both anyio backends): raw frames in each
form (a REQ socket too), majortomo 0.2.0's own Client and Worker, and calls across protocols
with dcp's Client and Worker."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import zmq
from majortomo import Client as MtClient
from majortomo import Worker as MtWorker

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
