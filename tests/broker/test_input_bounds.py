"""Check before you build (issue 26), on real sockets and both backends: zmq's per-frame
limit is the whole-message limit (64 MiB by default), and a DBP registration over its JSON
limits is refused with ``(O_O) json_too_large`` while the broker keeps serving."""

from __future__ import annotations

import json

import anyio
import pytest
import zmq

from dcp._broker.broker import DEFAULT_MAX_MESSAGE_SIZE, Broker
from dcp.wire import dbp
from tests.helpers import Peers, wait_for

pytestmark = pytest.mark.anyio

T = b"1700000000.0"


async def test_a_default_broker_limits_each_frame_and_each_message_to_64_mib() -> None:
    assert DEFAULT_MAX_MESSAGE_SIZE == 64 << 20
    with anyio.fail_after(10):
        async with Broker("tcp://127.0.0.1:0") as broker:
            link = broker._calls.link
            assert link is not None
            # zmq's MAXMSGSIZE limits each frame: set to the whole-message limit.
            assert link.asock.sock.getsockopt(zmq.MAXMSGSIZE) == DEFAULT_MAX_MESSAGE_SIZE
            assert link.max_bytes == DEFAULT_MAX_MESSAGE_SIZE


async def test_dbp_registrations_over_the_json_limits_are_refused_on_the_wire() -> None:
    with anyio.fail_after(10):
        async with Broker("tcp://127.0.0.1:0", heartbeat_interval=0.2) as broker:
            with Peers(broker.endpoints[0]) as peers:
                peer = peers(b"dbp")
                too_large = b'{"name": "s", "x": [' + b"[]," * 100_000 + b"[]]}"
                too_deep = b'{"name": "s", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
                for doc, why in ((too_large, b"bytes"), (too_deep, b"deep")):
                    peer.send_frames([b"", dbp.REGISTER, T, doc])
                    frames = await peer.recv_frames()
                    assert frames[1] == dbp.DENIED
                    assert frames[3].startswith(b"json_too_large: ") and why in frames[3]
                await wait_for(lambda: broker.statistics().rejections == {"json_too_large": 2})
                # The broker still serves; the same peer registers within the limits.
                peer.send_frames([b"", dbp.REGISTER, T, json.dumps({"name": "s"}).encode()])
                assert (await peer.recv_frames())[1] == dbp.APPROVED
                assert broker.statistics().workers == 1
