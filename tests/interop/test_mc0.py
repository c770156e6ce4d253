"""mc0 peers on a live broker (raw DEALER frames, both anyio backends): CONNECT with a TTL,
SUB/UNSUB/PUT/NOOP/DISCONNECT, OK/ERROR for commands with an ID, mc0 <-> dcp in both
directions; and the CURVE allow-lists for subjects, for mc0 and dcp peers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import zmq

import dcp
from tests.helpers import Peers, RawPeer, wait_for

pytestmark = pytest.mark.anyio

BROKER = zmq.curve_keypair()
ALICE = zmq.curve_keypair()  # may publish news.>, subscribe to anything
BOB = zmq.curve_keypair()  # may only subscribe to news.sport


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[tuple[dcp.Broker, str]]:
    broker = dcp.Broker("tcp://127.0.0.1:0", **options)
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(broker.serve)
        yield broker, endpoint
        tg.cancel_scope.cancel()


async def expect(peer: RawPeer, *frames: bytes) -> None:
    got = await peer.recv_frames()
    assert got == list(frames)


async def test_mc0_peers_and_dcp_clients_share_subjects() -> None:
    async with serving(heartbeat_interval=0.2) as (broker, ep), dcp.Client(ep) as client:
        with Peers(ep) as peers:
            a = peers(b"mc0-a")
            b = peers(b"mc0-b")
            a.send_frames([b"CONNECT", b"VERSION", b"0.3", b"TTL", b"300", b"ID", b"c1"])
            await expect(a, b"OK", b"ID", b"c1")
            a.send_frames([b"SUB", b"ID", b"s1", b"", b"news", b"weather"])
            await expect(a, b"OK", b"ID", b"s1")
            # dcp -> mc0
            assert await client.publish("news", b"headline", b"two", ack=True) == 1
            await expect(a, b"MESSAGE", b"TOPIC", b"news", b"", b"headline", b"two")
            # mc0 -> mc0 and dcp
            async with client.subscribe("weather.>") as deep, client.subscribe(">") as every:
                b.send_frames([b"PUT", b"TOPIC", b"weather", b"", b"sunny"])
                await expect(a, b"MESSAGE", b"TOPIC", b"weather", b"", b"sunny")
                b.send_frames([b"PUT", b"TOPIC", b"weather.eu", b"ID", b"p1", b"", b"rain"])
                await expect(b, b"OK", b"ID", b"p1")
                [msg] = [m async for m in _first(deep)]
                assert (msg.subject, msg.data) == ("weather.eu", (b"rain",))
                seen = [m async for m in _first(every, 2)]
                assert [m.subject for m in seen] == ["weather", "weather.eu"]
            # Silence past the TTL: the broker sends NOOP.
            with anyio.fail_after(3):
                while (await a.recv_frames()) != [b"NOOP"]:
                    pass
            a.send_frames([b"NOOP"])
            # Errors: with an ID, and without.
            a.send_frames([b"SUB", b"ID", b"s2", b"", b"news.*"])
            got = await a.recv_frames()
            assert got[:3] == [b"ERROR", b"ID", b"s2"] and got[3] == b"MESSAGE"
            a.send_frames([b"PUT", b"TOPIC"])
            got = await a.recv_frames()
            assert got[:2] == [b"ERROR", b"MESSAGE"] and b"bad_mc0_message" in got[2]
            a.send_frames([b"UNSUB", b"", b"news"])
            a.send_frames([b"NOOP", b"ID", b"n1"])
            await expect(a, b"OK", b"ID", b"n1")
            assert await client.publish("news", b"x", ack=True) == 0
            assert await client.publish("weather", b"x", ack=True) == 1
            await expect(a, b"MESSAGE", b"TOPIC", b"weather", b"", b"x")
            a.send_frames([b"DISCONNECT", b"ID", b"d1"])
            await expect(a, b"OK", b"ID", b"d1")
            assert await client.publish("weather", b"x", ack=True) == 0
        stats = broker.statistics()
        assert stats.rejections["bad_subject"] == 1
        assert stats.rejections["bad_mc0_message"] == 1


async def _first(sub: dcp.Subscription, n: int = 1) -> AsyncIterator[dcp.PubSubMessage]:
    with anyio.fail_after(5):
        async for msg in sub:
            yield msg
            n -= 1
            if not n:
                return


def _server() -> dcp.CurveServer:
    return dcp.CurveServer(BROKER[0], BROKER[1], clients=[ALICE[0], BOB[0]])


async def test_curve_allow_lists_for_subjects() -> None:
    options = dcp.PubSubOptions(
        publishers={"news.>": [ALICE[0]]},
        subscribers={">": [ALICE[0]], "news.sport": [BOB[0]]},
    )
    async with (
        serving(security=_server(), pubsub=options) as (broker, ep),
        dcp.Client(ep, security=dcp.CurveClient(BROKER[0], *ALICE), timeout=5) as alice,
        dcp.Client(ep, security=dcp.CurveClient(BROKER[0], *BOB), timeout=5) as bob,
    ):
        async with bob.subscribe("news.sport") as sport:
            assert await alice.publish("news.sport", b"goal", ack=True) == 1
            [msg] = [m async for m in _first(sport)]
            assert msg.data == (b"goal",)
        with pytest.raises(dcp.RemoteError, match="forbidden_subject"):
            await alice.publish("weather", b"x", ack=True)
        with pytest.raises(dcp.RemoteError, match="forbidden_subject"):
            await bob.publish("news.sport", b"x", ack=True)
        with pytest.raises(dcp.RemoteError, match="forbidden_subject"):
            async with bob.subscribe("news.*"):
                pass  # pragma: no cover
        # An mc0 peer under Bob's key: the same rules.
        with Peers(ep) as peers:
            m = peers(b"mc0-bob", security=dcp.CurveClient(BROKER[0], *BOB))
            m.send_frames([b"SUB", b"ID", b"1", b"", b"news.weather"])
            got = await m.recv_frames()
            assert got[:3] == [b"ERROR", b"ID", b"1"] and b"forbidden_subject" in got[4]
            m.send_frames([b"PUT", b"TOPIC", b"news.x", b"ID", b"2", b"", b"x"])
            got = await m.recv_frames()
            assert got[:3] == [b"ERROR", b"ID", b"2"]
            m.send_frames([b"SUB", b"ID", b"3", b"", b"news.sport"])
            await expect(m, b"OK", b"ID", b"3")
        await wait_for(lambda: broker.statistics().rejections.get("forbidden_subject") or None)
