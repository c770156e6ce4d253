"""The broker I/O thread's helpers (dcp._broker_io): the wake-up pipe, reading while
``ZMQ_EVENTS`` says a message waits, and the thread woken while its socket is never idle."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import anyio
import pytest
import zmq
from _raw import Peers, wait_for

from dcp import Register, Reply, Request
from dcp._broker import Broker
from dcp._broker_io import EVENTS, POLLIN, Waker, drain_ready, events_of
from dcp._zmqio import AsyncSocket


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """A ROUTER (the broker's side) and a DEALER connected to it over inproc."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"D")
    router.bind("inproc://broker-io")
    dealer.connect("inproc://broker-io")
    yield router, dealer
    ctx.destroy(linger=0)


def _wait_input(sock: zmq.Socket[bytes]) -> None:
    deadline = time.monotonic() + 5
    while not events_of(sock)(EVENTS) & POLLIN:
        assert time.monotonic() < deadline, "no message arrived"
        time.sleep(0.001)


def test_waker_wakes_a_poll_and_clears() -> None:
    waker = Waker()
    try:
        poller = select.poll()
        poller.register(waker.fd, select.POLLIN)
        assert poller.poll(0) == []
        waker.wake()
        waker.wake()  # any number of times
        assert waker.pending
        assert [fd for fd, _ in poller.poll(1000)] == [waker.fd]
        waker.clear()
        assert poller.poll(0) == []
        waker.stop()
        assert waker.stopped and poller.poll(0) != []
    finally:
        waker.close()
    waker.close()  # idempotent
    waker.wake()  # after close: nothing happens, no error


def test_waker_full_pipe_does_not_block() -> None:
    waker = Waker()
    try:
        for _ in range(100_000):  # far more than a pipe holds
            waker.wake()
        waker.clear()
        poller = select.poll()
        poller.register(waker.fd, select.POLLIN)
        assert poller.poll(0) == []
    finally:
        waker.close()


def test_drain_ready_reads_what_waits_in_batches(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, dealer = pair
    for i in range(5):
        dealer.send_multipart([b"", b"part", b"%d" % i])
    _wait_input(router)
    asock = AsyncSocket(router)
    first = drain_ready(asock, 2)
    assert [r.frames for r in first] == [[b"D", b"", b"part", b"0"], [b"D", b"", b"part", b"1"]]
    assert first[0].nbytes == 1 + 4 + 1 and first[0].dropped_frames == 0
    rest = drain_ready(asock, 256)
    assert [r.frames[-1] for r in rest] == [b"2", b"3", b"4"]
    # It stopped because ZMQ_EVENTS said nothing more waits.
    assert not events_of(router)(EVENTS) & POLLIN


def test_drain_ready_limits_and_zero_copy(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, dealer = pair
    big = b"x" * 100
    dealer.send_multipart([b"", b"a", b"b", b"c", b"d"])  # cut at 3 frames
    dealer.send_multipart([b"", big, big])  # cut at 150 bytes
    dealer.send_multipart([b"", big])  # kept as a zmq.Frame (zero copy)
    _wait_input(router)
    asock = AsyncSocket(router, max_frames=3, max_bytes=150, zero_copy_threshold=64)
    cut, large, whole = drain_ready(asock, 256)
    assert cut.frames == [b"D", b"", b"a"] and cut.dropped_frames == 3
    assert len(large.frames) == 3 and large.dropped_frames == 1 and large.nbytes == 201
    kept: object = whole.frames[2]
    assert isinstance(kept, zmq.Frame) and kept.bytes == big


def test_drain_ready_user_ids_without_handshake_metadata(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, dealer = pair
    dealer.send_multipart([b"", b"hello"])
    _wait_input(router)
    [msg] = drain_ready(AsyncSocket(router, user_ids=True), 256)
    assert msg.frames[-1] == b"hello" and msg.user_id is None  # inproc: no ZAP user id


@pytest.mark.anyio
async def test_io_thread_takes_calls_while_its_socket_is_busy() -> None:
    """The I/O thread looks at its waker on every pass, so work for it (here a statistics
    call through the core, as reload_security makes) is done while a client keeps the
    socket busy, and the broker still stops promptly."""
    broker = Broker("tcp://127.0.0.1:0")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            [endpoint] = await tg.start(broker.serve)
            with Peers(endpoint) as peers:
                worker, client = peers(b"W"), peers(b"C")
                worker.send(Register(b"echo"))
                await worker.expect(Register(b"echo"))
                # Many requests queued at once (no worker answers): a busy socket.
                for i in range(900):  # under the send high-water mark
                    client.send(Request(b"echo", None, (b"m%d" % i,), (b"d",)))
                calls = 0
                for _ in range(5):
                    assert await broker._in_core(lambda now: 7) == 7
                    calls += 1
                assert calls == 5
                await worker.expect(Request(b"echo", b"C", (b"m0",), (b"d",)))
                worker.send(Reply(b"C", (b"m0",), (b"ok",)))
                await client.expect(Reply(b"C", (b"m0",), (b"ok",)))
                await wait_for(lambda: broker.statistics().requests == 900)
            tg.cancel_scope.cancel()
    assert broker.endpoints == []
