"""DBP peers (seed 003's frames) on the broker's port: the codec, then live raw DEALER peers
against a real broker on both anyio backends (info requests, registration approved and
denied, requests served as a worker would, heartbeats and disconnect)."""

from __future__ import annotations

import json
import os

import anyio
import pytest

import dcp
from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.guard import Guard
from dcp._errors import RemoteProtocolError
from dcp.wire import dbp
from dcp.wire.sniff import Family, sniff
from tests.helpers import Peers, RawPeer

pytestmark = pytest.mark.anyio

T = b"1700000000.0"


def reg(name: str, **info: object) -> list[bytes]:
    return [b"", dbp.REGISTER, T, json.dumps({"name": name, **info}).encode()]


async def upper(request: dcp.HandlerRequest) -> bytes:
    return request.data[0].upper()


def test_codec() -> None:
    assert sniff([b"", b"u_U", T, b"x"]) is Family.DBP
    assert dbp.parse([b"", b"u_U", T]) == dbp.InfoRequest(b"")
    assert dbp.parse([b"", b"u_U", T, b"s"]) == dbp.InfoRequest(b"s")
    assert dbp.parse(reg("s", version="1.0.0")) == dbp.Registration(
        b"s", {"name": "s", "version": "1.0.0"}
    )
    assert dbp.parse([b"", b"UoU", T, b"{}"]) == dbp.Update({})
    assert dbp.parse([b"", b"<3", T, b"s"]) == dbp.Heartbeat()
    assert dbp.parse([b"", b"</3", T]) == dbp.Disconnect()
    assert dbp.parse([b"", b"u.u", T]) == dbp.Ack()
    assert dbp.parse([b"", b"REP", T, b"c", b"", b"a", b"b"]) == dbp.ServiceReply(
        b"c", (b"a", b"b")
    )
    assert dbp.is_denied(b"(O_O)") and dbp.is_denied(b"OmO") and not dbp.is_denied(b"OwO")
    assert dbp.denied("no", 1.5) == [b"", b"(O_O)", b"1.500", b"no"]
    bad = [
        [b"", b"u_U"],
        [b"x", b"u_U", T],
        [b"", b"UwU", T],
        [b"", b"UwU", T, b"\xff"],
        [b"", b"UwU", T, b"[]"],
        [b"", b"UwU", T, b"{}"],
        [b"", b"REP", T, b"c"],
        [b"", b"REP", T, b"", b""],
        [b"", b"???", T],
    ]
    for frames in bad:
        with pytest.raises(RemoteProtocolError):
            dbp.parse(frames)


def test_bad_dbp_input_is_counted_not_raised() -> None:
    core = BrokerCore()
    core.receive([b"P", b"", b"UwU", T, b"not json"], 0.0)
    core.receive([b"P", b"", b"UwU", T, json.dumps({"name": "s", "version": "x"}).encode()], 0)
    assert core.outbox[-1][2] == dbp.DENIED
    core.receive([b"P", b"", b"<3", T], 0.0)  # not registered: DISCONNECT
    assert core.outbox[-1][2] == dbp.DISCONNECT
    assert core.counters.rejections["bad_service_info"] == 1
    assert sum(core.counters.rejections.values()) == 2


async def expect(peer: RawPeer, command: bytes) -> list[bytes]:
    frames = await peer.recv_frames()
    assert frames[:2] == [b"", command], frames
    return frames


async def test_dbp_service_and_info() -> None:
    async with Broker("tcp://127.0.0.1:0", heartbeat_interval=0.2) as broker:
        endpoint = broker.endpoints[0]
        with Peers(endpoint) as peers:
            service = peers(b"dbp-service")
            service.send_frames(
                reg("shout", version="2.0.0", description="DBP upper", ip="127.0.0.1", port=1)
            )
            await expect(service, dbp.APPROVED)
            async with (
                Client(endpoint, timeout=5) as client,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(client.request, "shout", b"hi")
                while True:  # the broker also beats DBP services
                    frames = await service.recv_frames()
                    if frames[1] == dbp.REQUEST:
                        break
                    assert frames[1] == dbp.HEARTBEAT
                client_address = frames[3]
                assert frames[4:] == [b"", b"hi"]
                service.send_frames([b"", dbp.REPLY, T, client_address, b"", b"HI"])
                info = await client.service_info("shout")
                assert info is not None and info.version == "2.0.0"
                # DBP info request: one service, every service, an unknown one.
                asker = peers(b"dbp-asker")
                asker.send_frames([b"", dbp.INFO_REQUEST, T, b"shout"])
                doc = json.loads((await expect(asker, dbp.INFO_REPLY))[3])
                assert doc["name"] == "shout" and doc["status"] == "active"
                assert doc["version"] == "2.0.0" and doc["workers"] == 1
                assert doc["num_requests"] == 1
                asker.send_frames([b"", dbp.INFO_REQUEST, T, b""])
                listing = json.loads((await expect(asker, dbp.INFO_REPLY))[3])
                assert [e["name"] for e in listing] == ["shout"]
                asker.send_frames([b"", dbp.INFO_REQUEST, T, b"nope"])
                doc = json.loads((await expect(asker, dbp.INFO_REPLY))[3])
                assert doc == {"name": "nope", "status": "inactive"}
                # UPDATE replaces the info.
                service.send_frames([b"", dbp.UPDATE, T, b'{"version": "2.1.0"}'])
                while (await service.recv_frames())[1] != dbp.ACK:
                    pass
                info = await client.service_info("shout")
                assert info is not None and info.version == "2.1.0"
                service.send_frames([b"", dbp.HEARTBEAT, T, b"shout"])
                service.send_frames([b"", dbp.DISCONNECT, T])
                with anyio.fail_after(5):
                    while broker.statistics().workers:  # noqa: ASYNC110 - polling a gauge
                        await anyio.sleep(0.01)
            # A command from a peer that is not registered: DISCONNECT.
            stranger = peers(b"dbp-stranger")
            stranger.send_frames([b"", dbp.HEARTBEAT, T])
            await expect(stranger, dbp.DISCONNECT)


async def test_dbp_denied_by_the_approver() -> None:
    def approve(request: dcp.ApprovalRequest) -> tuple[bool, str]:
        return request.service != b"bad", "bad is not welcome"

    async with Broker("tcp://127.0.0.1:0", approve=approve) as broker:
        with Peers(broker.endpoints[0]) as peers:
            service = peers(b"dbp-bad")
            service.send_frames(reg("bad"))
            frames = await expect(service, dbp.DENIED)
            assert frames[3] == b"bad is not welcome"
            service.send_frames(reg("mmi.x"))
            await expect(service, dbp.DENIED)


def test_dbp_core_edges() -> None:
    """Sans-IO: what the live test does not reach."""
    core = BrokerCore()
    P = b"P"

    def send(*frames: bytes) -> list[list[bytes]]:
        core.receive([P, b"", *frames], 0.0)
        out, _ = core.drain()
        return out

    assert send(dbp.ACK, T) == []  # ignored, registered or not
    [approved] = send(*reg("s")[1:])
    assert approved[2] == dbp.APPROVED
    assert send(dbp.ACK, T) == []
    # An answer that matches nothing is passed on, and asks for nothing.
    [passed] = send(dbp.REPLY, T, b"C", b"", b"late")
    assert passed[0] == b"C"
    # A bad update is counted and dropped; a heartbeat while busy marks it as beating.
    assert send(dbp.UPDATE, T, b'{"version": "nope"}') == []
    assert core.counters.rejections["bad_service_info"] == 1
    core.receive([b"C", *dcp.wire.serialize(dcp.wire.Request(b"s", None, (b"m",), (b"x",)))], 0.0)
    core.drain()
    assert send(dbp.HEARTBEAT, T) == []
    assert core.sessions.workers[P].beats_busy
    # A DCP worker that speaks DBP: a dialect mismatch, for a registration too.
    core.receive([b"D", *dcp.wire.serialize(dcp.wire.Register(b"d"))], 0.0)
    core.drain()
    for frames in ([b"D", b"", dbp.HEARTBEAT, T], [b"D", *reg("d")]):
        core.receive(frames, 0.0)
        assert core.outbox == []
    assert core.counters.rejections["dialect_mismatch"] == 2


def test_dbp_reply_with_a_forged_address_in_secure_mode() -> None:
    core = BrokerCore(guard=Guard(lambda key, name: True, os.urandom(32)))
    core.receive([b"P", *reg("s")], 0.0, "KEY")
    core.drain()
    core.receive([b"P", b"", dbp.REPLY, T, b"forged", b"", b"x"], 0.0, "KEY")
    assert core.outbox == []
    assert core.counters.rejections["bad_client_address"] == 1
