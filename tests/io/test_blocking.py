"""A socket served by a thread of its own (dcp._io.blocking): its waker, and reading one
message with a blocking receive."""

from __future__ import annotations

import pathlib
import socket
from collections.abc import Iterator

import pytest
import zmq

from dcp._io.blocking import Waker, drop_queued, read_one
from dcp._io.sockets import AsyncSocket


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


def test_waker_wakes_a_blocked_receive(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, _ = pair
    waker = Waker(router.context, router)
    try:
        assert waker.ident[:1] != b"\0"
        router.setsockopt(zmq.RCVTIMEO, 10)
        assert read_one(AsyncSocket(router)) is None  # nothing came within RCVTIMEO
        waker.wake()
        waker.stop()
        assert waker.stopped
        router.setsockopt(zmq.RCVTIMEO, 5000)
        for _ in range(2):
            msg = read_one(AsyncSocket(router))
            assert msg is not None and msg.frames == [waker.ident, b""]
    finally:
        waker.close()
    waker.close()  # idempotent
    waker.wake()  # after close: nothing happens, no error


def test_waker_full_queue_does_not_block(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, _ = pair
    waker = Waker(router.context, router)
    try:
        for _ in range(5000):  # far past the send high-water mark (1000)
            waker.wake()
    finally:
        waker.close()


def test_read_one_reads_whole_messages_in_order(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, dealer = pair
    router.setsockopt(zmq.RCVTIMEO, 5000)
    for i in range(3):
        dealer.send_multipart([b"", b"part", b"%d" % i])
    asock = AsyncSocket(router)
    for i in range(3):
        msg = read_one(asock)
        assert msg is not None and msg.frames == [b"D", b"", b"part", b"%d" % i]
        assert msg.nbytes == 1 + 4 + 1 and msg.dropped_frames == 0 and msg.user_id is None


def test_read_one_limits_and_zero_copy(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, dealer = pair
    router.setsockopt(zmq.RCVTIMEO, 5000)
    big = b"x" * 100
    dealer.send_multipart([b"", b"a", b"b", b"c", b"d"])  # cut at 3 frames
    dealer.send_multipart([b"", big, big])  # cut at 150 bytes
    dealer.send_multipart([b"", big])  # kept as a zmq.Frame (zero copy)
    asock = AsyncSocket(router, max_frames=3, max_bytes=150, zero_copy_threshold=64)
    cut, large, whole = (read_one(asock) for _ in range(3))
    assert cut is not None and cut.frames == [b"D", b"", b"a"] and cut.dropped_frames == 3
    assert large is not None and len(large.frames) == 3 and large.dropped_frames == 1
    assert large.nbytes == 201
    assert whole is not None
    kept: object = whole.frames[2]
    assert isinstance(kept, zmq.Frame) and kept.bytes == big


def test_read_one_user_ids_without_handshake_metadata(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, dealer = pair
    router.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.send(b"hello")
    msg = read_one(AsyncSocket(router, user_ids=True))
    assert msg is not None and msg.frames == [b"D", b"hello"]
    assert msg.user_id is None  # inproc: no ZAP user id


# -- drop_queued: what zmq queued for a connection that never completed ------------------


def _free_tcp() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _received_until(router: zmq.Socket[bytes], last: bytes) -> list[bytes]:
    """The data frames the ROUTER receives until ``last`` (a hang guard of 5 s)."""
    router.setsockopt(zmq.RCVTIMEO, 5000)
    got = [router.recv_multipart()[-1]]
    while got[-1] != last:
        got.append(router.recv_multipart()[-1])
    return got


@pytest.mark.parametrize("how", ["function", "method"])
@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_drop_queued_discards_what_waits_for_a_listener_that_comes_later(
    how: str, scheme: str, tmp_path: pathlib.Path
) -> None:
    endpoint = _free_tcp() if scheme == "tcp" else f"ipc://{tmp_path / 'later.sock'}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)  # as every client socket
        dealer.connect(endpoint)
        dealer.send(b"old")  # queued: nothing listens there
        if how == "function":
            assert drop_queued(dealer, endpoint)
        else:
            assert AsyncSocket(dealer).drop_queued(endpoint)
        router = ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        dealer.send(b"new")  # the new connection works
        # One pipe, in order: "old" would have come first.
        assert _received_until(router, b"new") == [b"new"]
        # Not connected there: nothing is done.
        assert not drop_queued(dealer, "tcp://127.0.0.1:1")
    finally:
        ctx.destroy(linger=0)


def test_without_drop_queued_a_listener_that_comes_later_gets_it() -> None:
    """The libzmq behaviour drop_queued exists for."""
    endpoint = _free_tcp()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint)
        dealer.send(b"old")
        router = ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        dealer.send(b"new")
        assert _received_until(router, b"new") == [b"old", b"new"]
    finally:
        ctx.destroy(linger=0)
