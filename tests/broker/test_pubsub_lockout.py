"""Pub/sub bounds on a live broker (issue 26, finding 5; both anyio backends): the lockout:
ten peers, dcp and mc0, at their own subscription limit then gone, and a new
``Client.subscribe`` and an mc0 ``SUB`` still get in (pubsub Rule P7); and a fan-out in
slices delivered promptly by either driver (pubsub Rule P8)."""

from __future__ import annotations

import anyio
import pytest

import dcp
from tests.helpers import Peers

pytestmark = pytest.mark.anyio

P = b"DGBX\x01"


async def test_a_new_subscriber_gets_in_after_ten_peers_filled_their_limits() -> None:
    options = dcp.PubSubOptions(max_subscriptions=200, max_subscriptions_per_peer=20)
    broker = dcp.Broker("tcp://127.0.0.1:0", pubsub=options)
    async with anyio.create_task_group() as tg:
        [ep] = await tg.start(broker.serve)
        with Peers(ep) as peers:
            dcps = [peers(b"attacker-dcp-%d" % i) for i in range(5)]
            mc0s = [peers(b"attacker-mc0-%d" % i) for i in range(5)]
            for i, d in enumerate(dcps):  # dcp subscribers asking for the longest timeout
                for k in range(20):
                    sub = [b"%d" % k, b"x.%d.%d" % (i, k), b"", b"timeout=3600000"]
                    d.send_frames([b"", P, b"\x04", b"\xffDCP:sub", b"", b"", *sub])
            for i, m in enumerate(mc0s):  # mc0 peers without a TTL
                m.send_frames(
                    [b"SUB", b"ID", b"s", b"", *(b"y.%d.%d" % (i, k) for k in range(20))]
                )
            for d in dcps:  # every subscribe answered (ok or refused)
                for _ in range(20):
                    await d.recv_frames()
            for m in mc0s:
                assert (await m.recv_frames())[1:3] == [b"ID", b"s"]
        # The attackers are gone; their subscriptions are still there.
        assert broker.pubsub_statistics().subscriptions >= 180
        async with dcp.Client(ep, timeout=5) as client, client.subscribe("news") as news:
            assert await client.publish("news", b"hello", ack=True) == 1
            with anyio.fail_after(5):
                msg = await news.__anext__()
            assert msg.data == (b"hello",)
            with Peers(ep) as peers:
                m = peers(b"new-mc0")
                m.send_frames([b"SUB", b"ID", b"1", b"", b"news"])
                assert await m.recv_frames() == [b"OK", b"ID", b"1"]
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("io_thread", [True, False])
async def test_a_fan_out_in_slices_is_delivered_promptly(io_thread: bool) -> None:
    # pubsub Rule P8 with either driver: the slices after the first follow at once (the
    # core's next deadline), not one per timer tick (a quarter of a heartbeat interval).
    options = dcp.PubSubOptions(fanout_slice=4)
    broker = dcp.Broker("tcp://127.0.0.1:0", pubsub=options, io_thread=io_thread)
    async with anyio.create_task_group() as tg:
        [ep] = await tg.start(broker.serve)
        with Peers(ep) as peers:
            s = peers(b"subscriber")
            for k in range(200):
                s.send_frames([b"", P, b"\x04", b"\xffDCP:sub", b"", b"", b"%d" % k, b">", b""])
            for _ in range(200):
                await s.recv_frames()
            s.send_frames([b"", P, b"\x04", b"\xffDCP:pub", b"", b"", b"a", b"x"])
            with anyio.fail_after(3):  # 50 slices: 12.5 s at one per tick
                for _ in range(200):
                    frames = await s.recv_frames()
                    assert frames[5:] == [b"\xffDCP:msg=" + frames[5][9:], b"", b"a", b"x"]
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("io_thread", [True, False])
async def test_a_fan_out_is_not_left_to_a_long_timer_tick(io_thread: bool) -> None:
    # The timers tick every 10 s here (a quarter of the heartbeat interval), and the timers'
    # task went to sleep before the publish came: the slices after the first still follow
    # at once (without the I/O thread, the receive loop brings the timers' sleep forward).
    options = dcp.PubSubOptions(fanout_slice=4)
    broker = dcp.Broker(
        "tcp://127.0.0.1:0", pubsub=options, io_thread=io_thread, heartbeat_interval=40
    )
    async with anyio.create_task_group() as tg:
        [ep] = await tg.start(broker.serve)
        with Peers(ep) as peers:
            s = peers(b"subscriber")
            for k in range(12):
                s.send_frames([b"", P, b"\x04", b"\xffDCP:sub", b"", b"", b"%d" % k, b">", b""])
            for _ in range(12):
                await s.recv_frames()
            s.send_frames([b"", P, b"\x04", b"\xffDCP:pub", b"", b"", b"a", b"x"])
            with anyio.fail_after(5):  # 3 slices: the second after 10 s at one per tick
                for _ in range(12):
                    frames = await s.recv_frames()
                    assert frames[5:] == [b"\xffDCP:msg=" + frames[5][9:], b"", b"a", b"x"]
        tg.cancel_scope.cancel()
