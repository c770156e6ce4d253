"""The real broker on tcp://127.0.0.1, driven by raw DEALER peers, every frame checked exactly.

The peers are plain pyzmq sockets with chosen routing ids (:mod:`tests.helpers`); they never block
the event loop. Every test runs on asyncio and trio.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from dcp._broker.broker import Broker
from dcp._stats import BrokerStatistics
from dcp.wire import PROTOCOL, Ping, Pong, Reconnect, Register, Reply, Request
from dcp.wire.messages import error_reply_data
from tests.helpers import Peers, RawPeer, wait_for

pytestmark = pytest.mark.anyio

ECHO = b"echo"


@contextlib.asynccontextmanager
async def serving(
    endpoint: str = "tcp://127.0.0.1:0", **options: Any
) -> AsyncIterator[tuple[Broker, Peers]]:
    """A broker (by default on a free 127.0.0.1 port), and a maker of raw peers for it."""
    broker = Broker(endpoint, **options)
    async with anyio.create_task_group() as tg:
        [bound] = await tg.start(broker.serve)
        with Peers(bound) as peers:
            yield broker, peers
        tg.cancel_scope.cancel()


async def until(broker: Broker, check: Callable[[BrokerStatistics], bool]) -> BrokerStatistics:
    """Wait (at most 5 s) until ``check(broker.statistics())`` holds; return those figures."""

    def probe() -> BrokerStatistics | None:
        stats = broker.statistics()
        return stats if check(stats) else None

    found = await wait_for(probe)
    assert found is not None
    return found


async def worker(peers: Peers, ident: bytes, service: bytes = ECHO, width: int = 1) -> RawPeer:
    """A raw peer registered for ``service`` (its echo received)."""
    peer = peers(ident, width=width)
    peer.send(Register(service))
    await peer.expect(Register(service))
    return peer


async def test_registration_is_echoed_in_each_peers_width() -> None:
    async with serving() as (broker, peers):
        one = await worker(peers, b"W1")
        four = await worker(peers, b"W4", width=4)
        assert one.width == 1 and four.width == 4
        stats = broker.statistics()
        assert stats.workers == 2
        assert stats.services[ECHO].workers == 2


async def test_ping_and_pong_from_a_worker_get_pong() -> None:
    async with serving() as (_, peers):
        for width in (1, 4):
            w = await worker(peers, b"W%d" % width, width=width)
            w.send(Ping())
            await w.expect(Pong())
            w.send(Pong())
            await w.expect(Pong())


async def test_heartbeat_from_unknown_peer_gets_reconnect() -> None:
    async with serving() as (broker, peers):
        for width in (1, 4):
            stranger = peers(b"X%d" % width, width=width)
            stranger.send(Ping())
            await stranger.expect(Reconnect())
            stranger.send(Pong())
            await stranger.expect(Reconnect())
            # Registering afterwards works: it is the answer to reconnect.
            stranger.send(Register(ECHO))
            await stranger.expect(Register(ECHO))
            stranger.send(Ping())
            await stranger.expect(Pong())
        assert broker.statistics().reconnects_sent == 4
        assert broker.statistics().rejections == {}


async def test_request_and_reply_frames_pass_intact() -> None:
    async with serving() as (broker, peers):
        w = await worker(peers, b"W1")
        client = peers(b"C1")
        cases = [
            ((b"id-1", b"more meta"), (b"", b"x", b"", b"y", b"")),
            ((), ()),
            ((b"id-3",), (b"",)),
            ((b"\x00\xff",), (bytes(range(256)), b"")),
        ]
        for meta, data in cases:
            # The client's address is inserted by the broker...
            client.send(Request(ECHO, None, meta, data))
            await w.expect(Request(ECHO, b"C1", meta, data))
            # ... and the reply is routed to it, metadata and data untouched.
            w.send(Reply(b"C1", meta, data[::-1]))
            await client.expect(Reply(b"C1", meta, data[::-1]))
        stats = broker.statistics()
        assert (stats.requests, stats.replies, stats.rejections) == (4, 4, {})


async def test_explicit_own_address_is_kept() -> None:
    async with serving() as (_, peers):
        w = await worker(peers, b"W1")
        client = peers(b"C1")
        client.send(Request(ECHO, b"C1", (b"m",), (b"d",)))
        await w.expect(Request(ECHO, b"C1", (b"m",), (b"d",)))


async def test_pipelined_requests_are_served_one_at_a_time() -> None:
    count = 50
    async with serving() as (broker, peers):
        w = await worker(peers, b"W1")
        client = peers(b"C1")
        for n in range(count):
            client.send(Request(ECHO, None, (b"%d" % n,), (b"payload %d" % n,)))
        for n in range(count):
            await w.expect(Request(ECHO, b"C1", (b"%d" % n,), (b"payload %d" % n,)))
            # The worker holds exactly one request: the next comes only after the reply.
            stats = broker.statistics()
            assert (stats.dispatched, stats.replies) == (n + 1, n)
            if n < 3:
                await w.expect_silence(0.02)
            w.send(Reply(b"C1", (b"%d" % n,), (b"done %d" % n,)))
        for n in range(count):
            await client.expect(Reply(b"C1", (b"%d" % n,), (b"done %d" % n,)))
        await w.expect_silence(0.02)
        stats = await until(broker, lambda s: s.replies == count)
        assert stats.services[ECHO].idle == 1


async def test_ping_while_busy_gives_the_worker_a_second_request() -> None:
    async with serving() as (broker, peers):
        w = await worker(peers, b"W1")
        client = peers(b"C1")
        client.send(Request(ECHO, None, (b"1",), ()))
        client.send(Request(ECHO, None, (b"2",), ()))
        await w.expect(Request(ECHO, b"C1", (b"1",), ()))
        await until(broker, lambda s: s.services[ECHO].queued == 1)
        # A pong is a keep-alive only: no work.
        w.send(Pong())
        await w.expect(Pong())
        await w.expect_silence(0.02)
        w.send(Ping())
        await w.expect(Pong())
        await w.expect(Request(ECHO, b"C1", (b"2",), ()))
        for n in (b"2", b"1"):
            w.send(Reply(b"C1", (n,), (b"ok",)))
            await client.expect(Reply(b"C1", (n,), (b"ok",)))


async def test_forwarding_keeps_the_client_and_frees_the_forwarder() -> None:
    async with serving() as (broker, peers):
        wa = await worker(peers, b"WA", b"a")
        wb = await worker(peers, b"WB", b"b")
        client = peers(b"C1")
        client.send(Request(b"a", None, (b"1",), (b"raw",)))
        client.send(Request(b"a", None, (b"2",), (b"raw",)))
        await wa.expect(Request(b"a", b"C1", (b"1",), (b"raw",)))
        await until(broker, lambda s: s.services[b"a"].queued == 1)
        wa.send(Request(b"b", b"C1", (b"1",), (b"half-done",)))
        await wb.expect(Request(b"b", b"C1", (b"1",), (b"half-done",)))
        # Forwarding freed WA: it gets the next request without a ping.
        await wa.expect(Request(b"a", b"C1", (b"2",), (b"raw",)))
        wb.send(Reply(b"C1", (b"1",), (b"done",)))
        await client.expect(Reply(b"C1", (b"1",), (b"done",)))
        stats = broker.statistics()
        assert (stats.forwards, stats.requests, stats.replies) == (1, 3, 1)


async def test_a_workers_own_request_and_its_reply_come_back_to_it() -> None:
    async with serving() as (broker, peers):
        wa = await worker(peers, b"WA", b"a")
        wb = await worker(peers, b"WB", b"b")
        wa.send(Request(b"b", None, (b"sub",), (b"q",)))
        await wb.expect(Request(b"b", b"WA", (b"sub",), (b"q",)))
        wb.send(Reply(b"WA", (b"sub",), (b"a",)))
        await wa.expect(Reply(b"WA", (b"sub",), (b"a",)))
        assert broker.statistics().forwards == 0


async def test_four_byte_and_one_byte_peers_in_the_same_run() -> None:
    async with serving() as (_, peers):
        w4 = await worker(peers, b"W4", b"four", width=4)
        w1 = await worker(peers, b"W1", b"one", width=1)
        c4 = peers(b"C4", width=4)
        c1 = peers(b"C1", width=1)
        c4.send(Request(b"one", None, (b"m4",), (b"from c4",)))
        c1.send(Request(b"four", None, (b"m1",), (b"from c1",)))
        await w1.expect(Request(b"one", b"C4", (b"m4",), (b"from c4",)))
        await w4.expect(Request(b"four", b"C1", (b"m1",), (b"from c1",)))
        w1.send(Reply(b"C4", (b"m4",), (b"to c4",)))
        w4.send(Reply(b"C1", (b"m1",), (b"to c1",)))
        await c4.expect(Reply(b"C4", (b"m4",), (b"to c4",)))
        await c1.expect(Reply(b"C1", (b"m1",), (b"to c1",)))
        w4.send(Ping())
        w1.send(Ping())
        await w4.expect(Pong())
        await w1.expect(Pong())


P = PROTOCOL
#: (reason, DEALER-side frames) of messages the broker must count and drop.
BAD: list[tuple[str, list[bytes]]] = [
    ("unknown_protocol", [b""]),
    ("too_few_frames", [b"", P]),
    ("unknown_protocol", [b"x", P, b"\x02"]),
    ("bad_protocol_frame", [b"", b"DGBX", b"\x02"]),
    # A Majordomo worker command a broker never receives (REQUEST goes broker -> worker).
    ("unknown_message_type", [b"", b"MDPW01", b"\x02"]),
    ("unsupported_version", [b"", b"DGBX\x02", b"\x02"]),
    ("bad_type_frame", [b"", P, b"\x02\x00"]),
    ("unknown_message_type", [b"", P, b"\x09"]),
    ("unknown_message_type", [b"", P, b"\x00\x00\x00\x00"]),
    ("unexpected_frames", [b"", P, b"\x02", b"body"]),
    ("unexpected_frames", [b"", P, b"\x01", ECHO, b"extra"]),
    ("missing_service_name", [b"", P, b"\x01"]),
    ("missing_service_name", [b"", P, b"\x04"]),
    ("missing_client_delimiter", [b"", P, b"\x04", ECHO, b"C1", b"m", b""]),
    ("missing_client_delimiter", [b"", P, b"\x05"]),
    ("missing_metadata_delimiter", [b"", P, b"\x04", ECHO, b"", b"m"]),
    ("missing_metadata_delimiter", [b"", P, b"\x05\x00\x00\x00", b"C1", b""]),
    ("reply_from_non_worker", [b"", P, b"\x05", b"C1", b"", b""]),
    ("unexpected_reconnect", [b"", P, b"\x06"]),
    ("too_many_frames", [b"", P, b"\x04", ECHO, b"", b""] + [b"d"] * 30),
    # Each frame is under max_message_size (1024), all together they are not.
    ("message_too_large", [b"", P, b"\x04", ECHO, b"", b""] + [b"x" * 400] * 3),
]


async def test_bad_input_is_counted_and_the_broker_keeps_serving() -> None:
    async with serving(max_frames=16, max_message_size=1024) as (broker, peers):
        bad = peers(b"BAD")
        for _, frames in BAD:
            bad.send_frames(frames)
        # Answered rather than dropped: a foreign address, and a heartbeat from a stranger.
        bad.send(Request(ECHO, b"C1", (b"m",), (b"d",)))
        bad.send(Ping())
        expected: dict[str, int] = {"forbidden_address": 1}
        for reason, _ in BAD:
            expected[reason] = expected.get(reason, 0) + 1
        stats = await until(broker, lambda s: sum(s.rejections.values()) >= len(BAD) + 1)
        assert stats.rejections == expected
        # Requests cut at a limit are answered too: their metadata survived the cut.
        for reason in ("too_many_frames", "message_too_large"):
            refusal = await bad.recv_frames()
            marker, code_part, _ = error_reply_data(reason, "")
            assert refusal[:-1] == [b"", P, b"\x05", b"BAD", b"", b"", marker, code_part]
        refusal = await bad.recv_frames()
        marker, code, _ = error_reply_data("forbidden_address", "")
        assert refusal[:-1] == [b"", P, b"\x05", b"BAD", b"", b"m", b"", marker, code]
        await bad.expect(Reconnect())
        # A frame over max_message_size: zmq drops the connection; nothing is counted.
        big = peers(b"BIG")
        monitor = big.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            big.send_frames([b"", P, b"\x04", ECHO, b"", b"", b"x" * 2000])
            await wait_for(lambda: monitor.poll(0))
            assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        finally:
            big.sock.disable_monitor()
            monitor.close(0)
        # The broker still serves, valid messages within the limits.
        w = await worker(peers, b"W1")
        client = peers(b"C1")
        data = [b"d"] * 9  # 6 header frames + 9 = 15 DEALER frames + routing id = max_frames
        client.send(Request(ECHO, None, (), data))
        await w.expect(Request(ECHO, b"C1", (), data))
        w.send(Reply(b"C1", (), (b"y" * 1000,)))
        await client.expect(Reply(b"C1", (), (b"y" * 1000,)))
        stats = broker.statistics()
        assert stats.rejections == expected
        assert (stats.requests, stats.replies, stats.workers) == (1, 1, 1)
        await big.expect_silence(0.05)


async def test_dead_workers_request_is_redelivered_to_another_worker() -> None:
    async with serving(heartbeat_interval=0.1, liveness=2) as (broker, peers):
        first = await worker(peers, b"W1")
        second = await worker(peers, b"W2")
        client = peers(b"C1")
        client.send(Request(ECHO, None, (b"m",), (b"work",)))
        await first.expect(Request(ECHO, b"C1", (b"m",), (b"work",)))
        first.close()
        # W2 stays alive with keep-alive pongs (which ask for no work) until the request
        # comes back from the dead W1.
        with anyio.fail_after(5):
            while True:
                second.send(Pong())
                msg, width = await second.recv()
                assert width == 1
                if isinstance(msg, Request):
                    break
                assert msg == Pong()
                await anyio.sleep(0.03)
        assert msg == Request(ECHO, b"C1", (b"m",), (b"work",))
        second.send(Reply(b"C1", (b"m",), (b"done",)))
        await client.expect(Reply(b"C1", (b"m",), (b"done",)))
        stats = broker.statistics()
        # W1 never beat while busy, so it is probed rather than expired (Rule L3); the probe
        # to its closed connection fails. Either way it is gone and its request redelivered.
        gone = stats.expired_workers + stats.rejections.get("worker_unreachable_gone", 0)
        assert (gone, stats.redeliveries, stats.dispatched) == (1, 1, 2)
        assert stats.workers == 1


async def test_reply_for_a_gone_client_is_kept_a_while_then_counted_as_dropped() -> None:
    # Kept for reply_grace (liveness x heartbeat_interval by default):
    # dcp._core.broker.unreachable.
    async with serving(reply_grace=0.3) as (broker, peers):
        w = await worker(peers, b"W1")
        client = peers(b"C1")
        client.send(Request(ECHO, None, (b"m",), ()))
        await w.expect(Request(ECHO, b"C1", (b"m",), ()))
        client.close()
        # Give zmq's I/O thread time to see the disconnection before the reply goes out.
        await anyio.sleep(0.1)
        w.send(Reply(b"C1", (b"m",), (b"late",)))
        # A reply to an address that never connected is dropped the same way.
        w.send(Reply(b"GHOST", (b"m",), (b"lost",)))
        stats = await until(broker, lambda s: s.dropped_replies == 2)
        assert stats.rejections == {}
        assert stats.replies == 2
        # The worker is unaffected.
        w.send(Ping())
        await w.expect(Pong())


async def test_a_reply_waits_for_its_client_to_connect() -> None:
    # After a broker restart a worker may answer before its client has reconnected.
    async with serving() as (broker, peers):
        w = await worker(peers, b"W1")
        w.send(Reply(b"LATE", (b"m",), (b"for you",)))
        await anyio.sleep(0.2)
        client = peers(b"LATE")
        await client.expect(Reply(b"LATE", (b"m",), (b"for you",)))
        stats = broker.statistics()
        assert (stats.replies, stats.dropped_replies) == (1, 0)


async def test_a_peer_reconnecting_with_the_same_routing_id_takes_over_its_address() -> None:
    """ROUTER_HANDOVER: the newest connection with a routing id gets what is sent to it."""
    async with serving() as (broker, peers):
        w = await worker(peers, b"W1")
        old = peers(b"C1")
        old.send(Request(ECHO, None, (b"m",), (b"q",)))
        await w.expect(Request(ECHO, b"C1", (b"m",), (b"q",)))
        new = peers(b"C1")
        # Once the broker has heard from the new connection, it routes C1 there.
        new.send(Ping())
        await new.expect(Reconnect())
        w.send(Reply(b"C1", (b"m",), (b"a",)))
        await new.expect(Reply(b"C1", (b"m",), (b"a",)))
        await old.expect_silence(0.05)
        assert broker.statistics().dropped_replies == 0


async def test_a_worker_that_does_not_read_is_dropped_when_its_queue_fills() -> None:
    # inproc: no kernel buffers, so the pipe is full after both high-water marks (~1000+10).
    # A fresh name: zmq frees an inproc name after the socket closes, in its own time.
    async with serving(f"inproc://dcp-test-full-queue-{uuid.uuid4().hex}") as (broker, peers):
        deaf = peers(b"W1", width=4, rcvhwm=10)
        deaf.send(Register(ECHO))
        await deaf.expect(Register(ECHO))
        w2 = await worker(peers, b"W2")
        client = peers(b"C1")
        client.send(Request(ECHO, None, (b"m",), (b"q",)))
        await deaf.expect(Request(ECHO, b"C1", (b"m",), (b"q",)))
        # Ping without reading the pongs until the broker cannot send to W1 any more.
        with anyio.fail_after(5):
            while "worker_unreachable_full" not in broker.statistics().rejections:
                with contextlib.suppress(zmq.Again):  # W1's own send queue may fill too
                    for _ in range(100):
                        deaf.send(Ping())
                await anyio.sleep(0.001)
        # W1 is gone: the request it held goes to W2.
        await w2.expect(Request(ECHO, b"C1", (b"m",), (b"q",)))
        stats = broker.statistics()
        assert stats.rejections["worker_unreachable_full"] == 1
        assert (stats.workers, stats.redeliveries) == (1, 1)


async def test_large_frames_pass_through_without_a_copy_and_intact() -> None:
    """Data parts of 64 KiB and more are forwarded as zmq's own buffers: the bytes arrive
    intact both ways, and large frames in other places are still handled."""
    big = bytes(range(256)) * 1024  # 256 KiB
    async with serving() as (broker, peers):
        w = await worker(peers, b"W1")
        client = peers(b"C1")
        client.send(Request(ECHO, None, (b"m",), (big, b"", b"tail")))
        await w.expect(Request(ECHO, b"C1", (b"m",), (big, b"", b"tail")))
        w.send(Reply(b"C1", (b"m",), (b"head", big[::-1])))
        await client.expect(Reply(b"C1", (b"m",), (b"head", big[::-1])))
        # Large metadata is compared as bytes: the reply still releases the request.
        large_meta = (b"M" * 70_000,)
        client.send(Request(ECHO, None, large_meta, (b"x",)))
        await w.expect(Request(ECHO, b"C1", large_meta, (b"x",)))
        w.send(Reply(b"C1", large_meta, (b"y",)))
        await client.expect(Reply(b"C1", large_meta, (b"y",)))
        # A large frame where a small one belongs is refused with its reason, not a crash.
        client.send_frames([b"", b"D" * 70_000, b"\x04", ECHO, b"", b""])
        client.send(Request(b"S" * 70_000, None, (b"m",), ()))
        stats = await until(broker, lambda s: sum(s.rejections.values()) >= 2)
        assert stats.rejections == {"unknown_protocol": 1, "service_name_too_long": 1}
        assert (stats.replies, stats.unmatched) == (2, 0)
