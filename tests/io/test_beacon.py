"""The broker beacon over loopback UDP (127.0.0.0/8 only, bounded waits), on both anyio
backends: the codec, the broker's beacon, :func:`dcp.find_broker`, ``beacon://`` endpoints,
and ``dcp find`` / ``dcp broker --beacon``."""

from __future__ import annotations

import functools
import socket

import anyio
import pytest
import zmq

import dcp
from dcp._broker.broker import Broker
from dcp._cli import main
from dcp._client.client import Client
from dcp._io.beacon import (
    BEACON_WAIT,
    BeaconHeard,
    beacon_wait,
    decode,
    encode,
    listen,
    resolve,
    resolve_blocking,
    send_beacons,
)
from dcp._worker.worker import Worker

pytestmark = pytest.mark.anyio


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def upper(request: dcp.HandlerRequest) -> bytes:
    return request.data[0].upper()


def test_codec() -> None:
    key = zmq.curve_keypair()[0]
    assert decode(encode(5555), "127.0.0.1") == BeaconHeard("tcp://127.0.0.1:5555", None)
    assert decode(encode(5555, key), "::1") == BeaconHeard("tcp://[::1]:5555", key)
    for bad in (b"", b"DCPB\x01\x00", b"DCPB\x02\x15\xb3", b"XXXX\x01\x15\xb3", b"DCPB\x01\0\0"):
        assert decode(bad, "127.0.0.1") is None
    with pytest.raises(ValueError, match="port"):
        encode(0)
    with pytest.raises(ValueError, match="40 bytes"):
        encode(1, b"short")


async def test_find_broker_and_beacon_endpoints() -> None:
    port = free_udp_port()
    async with Broker(
        "tcp://127.0.0.1:0", beacon=port, beacon_address="127.0.0.1", heartbeat_interval=0.2
    ) as broker:
        endpoint = broker.endpoints[0]
        with anyio.fail_after(10):
            assert await dcp.find_broker(port, host="127.0.0.1", timeout=5) == endpoint
            beacon = f"beacon://127.0.0.1:{port}"
            async with (
                Worker(beacon, "up", upper) as worker,
                Client(beacon, timeout=5) as client,
            ):
                assert worker.endpoint == endpoint
                assert client.endpoint == endpoint
                # Queued if the worker is re-registering (its 1 s heartbeats are slow for
                # this broker's 0.2 s liveness), instead of NoWorkers at once.
                reply = await client.request("up", b"a", wait_for_worker=True)
                assert reply.bytes == b"A"


async def test_beacon_carries_the_curve_key_and_a_key_filters() -> None:
    port = free_udp_port()
    public = zmq.curve_keypair()[0]
    other = zmq.curve_keypair()[0]
    async with anyio.create_task_group() as tg:
        await tg.start(
            functools.partial(
                send_beacons, port, 4242, address="127.0.0.1", key=public, interval=0.05
            )
        )
        with anyio.fail_after(10):
            heard = await listen(port, host="127.0.0.1")
            assert heard == BeaconHeard("tcp://127.0.0.1:4242", public)
            found = await dcp.find_broker(port, host="127.0.0.1", key=public.decode())
            assert found == "tcp://127.0.0.1:4242"
        with pytest.raises(TimeoutError, match="no broker beacon"):
            await listen(port, host="127.0.0.1", timeout=0.3, key=other)
        tg.cancel_scope.cancel()


async def test_listen_ignores_other_datagrams_and_times_out() -> None:
    port = free_udp_port()
    async with anyio.create_task_group() as tg:

        async def noise() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                while True:
                    sock.sendto(b"not a beacon", ("127.0.0.1", port))
                    await anyio.sleep(0.02)

        tg.start_soon(noise)
        with pytest.raises(TimeoutError):
            await listen(port, host="127.0.0.1", timeout=0.3)
        tg.cancel_scope.cancel()
    with pytest.raises(ValueError, match="timeout"):
        await listen(port, timeout=0)


async def test_a_sync_client_takes_a_beacon() -> None:
    port = free_udp_port()
    async with (
        Broker("tcp://127.0.0.1:0", beacon=port, beacon_address="127.0.0.1") as broker,
        Worker(broker.endpoints[0], "up", upper),
    ):

        def call() -> tuple[str, bytes]:
            with dcp.SyncClient(f"beacon://127.0.0.1:{port}", timeout=5) as client:
                return client.endpoint, client.request("up", b"b").bytes

        with anyio.fail_after(15):
            endpoint, reply = await anyio.to_thread.run_sync(call)
        assert (endpoint, reply) == (broker.endpoints[0], b"B")
    quiet = free_udp_port()
    with pytest.raises(TimeoutError, match="no broker beacon"):
        resolve_blocking(f"beacon://127.0.0.1:{quiet}", timeout=0.2)
    assert resolve_blocking("tcp://127.0.0.1:1") == "tcp://127.0.0.1:1"
    with pytest.raises(ValueError, match="bad beacon address"):
        resolve_blocking("beacon://127.0.0.1")


async def test_resolve_and_bad_addresses() -> None:
    assert await resolve("tcp://127.0.0.1:1") == "tcp://127.0.0.1:1"
    for bad in ("beacon://", "beacon://127.0.0.1", "beacon://127.0.0.1:x", "beacon://:0"):
        with pytest.raises(ValueError, match="bad beacon address"):
            await resolve(bad)
    with pytest.raises(ValueError, match="tcp://"):
        Broker("inproc://nope", beacon=1)


async def test_a_failing_send_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with anyio.move_on_after(0.3):
        # Port 0 cannot be sent to: each beat fails, logged once.
        await send_beacons(0, 5555, address="127.0.0.1", interval=0.05)
    assert caplog.text.count("beacon to 127.0.0.1:0 failed") == 1


async def test_find_brokers_hears_every_broker_once() -> None:
    """Two brokers beaconing on one port (and noise): each endpoint once; a key filters."""
    port = free_udp_port()
    key = zmq.curve_keypair()[0]
    async with anyio.create_task_group() as tg:
        for broker_port, with_key in ((4242, None), (4343, key)):
            await tg.start(
                functools.partial(
                    send_beacons, port, broker_port, address="127.0.0.1", key=with_key,
                    interval=0.05,
                )
            )  # fmt: skip

        async def noise() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                while True:
                    sock.sendto(b"not a beacon", ("127.0.0.1", port))
                    await anyio.sleep(0.02)

        tg.start_soon(noise)
        with anyio.fail_after(10):
            found = await dcp.find_brokers(port, host="127.0.0.1", timeout=0.5)
            assert sorted(found) == ["tcp://127.0.0.1:4242", "tcp://127.0.0.1:4343"]
            keyed = await dcp.find_brokers(port, host="127.0.0.1", timeout=0.3, key=key.decode())
            assert keyed == ["tcp://127.0.0.1:4343"]
            with pytest.raises(TimeoutError, match="no broker beacon"):
                other = zmq.curve_keypair()[0]
                await dcp.find_brokers(port, host="127.0.0.1", timeout=0.2, key=other)
        tg.cancel_scope.cancel()
    with pytest.raises(TimeoutError, match="no broker beacon"):
        await dcp.find_brokers(free_udp_port(), host="127.0.0.1", timeout=0.2)
    with pytest.raises(ValueError, match="timeout"):
        await dcp.find_brokers(port, timeout=0)


async def test_every_broker_beaconing_is_found_and_served() -> None:
    """Two brokers beaconing on one port: find_brokers gives both, a blocking client given
    the list uses both; a ``beacon://`` entry in a list is the first broker heard."""
    port = free_udp_port()
    async with (
        Broker("tcp://127.0.0.1:0", beacon=port, beacon_address="127.0.0.1") as one,
        Broker("tcp://127.0.0.1:0", beacon=port, beacon_address="127.0.0.1") as two,
        Worker(one.endpoints[0], "up", upper),
        Worker(two.endpoints[0], "up", upper),
    ):
        with anyio.fail_after(15):
            found = await dcp.find_brokers(port, host="127.0.0.1", timeout=2.5)
        assert sorted(found) == sorted([one.endpoints[0], two.endpoints[0]])

        def call(endpoints: list[str]) -> tuple[tuple[str, ...], bytes]:
            with dcp.SyncClient(endpoints, timeout=5) as client:
                return client.endpoints, client.request("up", b"c").bytes

        with anyio.fail_after(15):
            assert await anyio.to_thread.run_sync(call, found) == (tuple(found), b"C")
            beacon = f"beacon://127.0.0.1:{port}"
            endpoints, reply = await anyio.to_thread.run_sync(call, [beacon, two.endpoints[0]])
        assert reply == b"C"
        assert endpoints[0] in found and endpoints[-1] == two.endpoints[0]
        assert len(endpoints) in (1, 2)  # the beacon may have named the other broker


def test_beacon_wait_is_the_smaller_of_the_two() -> None:
    assert beacon_wait(None) == BEACON_WAIT == 5.0
    assert beacon_wait(30) == BEACON_WAIT
    assert beacon_wait(0.5) == 0.5
    assert beacon_wait(float("inf")) == BEACON_WAIT


async def test_a_client_listens_at_a_beacon_no_longer_than_its_timeout() -> None:
    """A ``beacon://`` endpoint that hears nothing: the client gives up after its own
    timeout when that is shorter than the 5 s it would listen (the message says how long)."""
    port = free_udp_port()
    for endpoint in (f"beacon://127.0.0.1:{port}", [f"beacon://127.0.0.1:{port}", "tcp://h:1"]):
        with anyio.fail_after(30):
            with pytest.raises(TimeoutError) as info:
                async with Client(endpoint, timeout=0.3):
                    pass  # pragma: no cover
        assert str(info.value) == f"no broker beacon on UDP port {port} within 0.3 s"


def test_a_sync_client_listens_at_a_beacon_no_longer_than_its_timeout() -> None:
    port = free_udp_port()
    for endpoint in (f"beacon://127.0.0.1:{port}", [f"beacon://127.0.0.1:{port}", "tcp://h:1"]):
        with pytest.raises(TimeoutError) as info:
            dcp.SyncClient(endpoint, timeout=0.3)
        assert str(info.value) == f"no broker beacon on UDP port {port} within 0.3 s"


def test_dcp_call_listens_at_a_beacon_no_longer_than_its_timeout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_udp_port()
    argv = ["call", "--connect", f"beacon://127.0.0.1:{port}", "--timeout", "0.5", "x"]
    assert main(argv) == 1
    assert capsys.readouterr() == (
        "",
        f"dcp call: no broker beacon on UDP port {port} within 0.5 s\n",
    )
