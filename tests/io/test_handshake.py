"""Handshake failures surface as :exc:`dcp.AuthenticationFailed` within about a second, for
clients, blocking clients and workers (real CURVE handshakes over tcp on 127.0.0.1, both
backends); and the rules of ``dcp._io.handshake`` without sockets."""

from __future__ import annotations

import pickle
import time

import anyio
import pytest
import zmq

from dcp import AuthenticationFailed, Broker, Client, CurveClient, CurveServer, SyncClient, Worker
from dcp._io.handshake import NO_DETAIL_LIMIT, REFUSED_LIMIT, HandshakeWatch, all_unreachable
from dcp._models import HandlerRequest

BROKER = zmq.curve_keypair()
ALICE = zmq.curve_keypair()
STRANGER = zmq.curve_keypair()


def server() -> CurveServer:
    return CurveServer(BROKER[0], BROKER[1], clients=[ALICE[0]], workers={"echo": [ALICE[0]]})


async def echo(request: HandlerRequest) -> bytes:
    return request.data[0]


# -- the rules --------------------------------------------------------------------------------


def test_a_refused_key_or_a_mismatch_fails_at_once() -> None:
    watch = HandshakeWatch("tcp://b:1", secure=True, role="client")
    failure = watch.event(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)
    assert failure is not None
    assert failure.endpoint == "tcp://b:1"
    assert "refused this client's CURVE key (ZAP status 400)" in str(failure)
    mismatch = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    failure = watch.event(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, mismatch)
    assert failure is not None and "uses CURVE and the broker does not" in failure.reason
    plain = HandshakeWatch("tcp://b:1", secure=False, role="worker")
    failure = plain.event(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, mismatch)
    assert failure is not None and "requires CURVE security and this worker" in failure.reason
    failure = plain.event(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 300)
    assert failure is not None and "refused this worker (ZAP status 300)" in failure.reason
    other = int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
    failure = plain.event(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, other)
    assert failure is not None and f"{other:#x}" in failure.reason


@pytest.mark.parametrize("secure", [True, False])
def test_hang_ups_fail_only_in_a_row(secure: bool) -> None:
    watch = HandshakeWatch("tcp://b:1", secure=secure, role="client")
    no_detail = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    for _ in range(NO_DETAIL_LIMIT - 1):
        assert watch.event(no_detail, 32) is None
    assert watch.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0) is None  # Rule H4
    for _ in range(NO_DETAIL_LIMIT - 1):
        assert watch.event(no_detail, 32) is None
    failure = watch.event(no_detail, 32)
    assert failure is not None
    assert ("server key" if secure else "does the broker require CURVE") in failure.reason
    assert watch.event(zmq.EVENT_CONNECTED, 5) is None  # not a handshake event


def test_a_reconnection_is_unheard_until_a_message_comes() -> None:
    # Rule H5, CURVE only.
    watch = HandshakeWatch("tcp://b:1", secure=True, role="client")
    ok = zmq.EVENT_HANDSHAKE_SUCCEEDED
    assert not watch.unheard()
    watch.event(ok, 0)
    assert not watch.unheard()  # the first connection
    watch.event(zmq.EVENT_DISCONNECTED, 0)
    watch.event(ok, 0)
    assert watch.unheard()
    watch.heard = watch.handshakes  # a message arrived
    assert not watch.unheard()
    plain = HandshakeWatch("tcp://b:1", secure=False, role="client")
    plain.event(ok, 0)
    plain.event(ok, 0)
    assert not plain.unheard()  # ROUTER_HANDOVER: a plaintext reconnection takes over


def test_the_error_pickles() -> None:
    failure = AuthenticationFailed("tcp://b:1", "no")
    copy = pickle.loads(pickle.dumps(failure))
    assert (copy.endpoint, copy.reason, str(copy)) == ("tcp://b:1", "no", "tcp://b:1: no")
    assert isinstance(copy, ConnectionError)


# -- live ----------------------------------------------------------------------------------------

CASES = [
    pytest.param(CurveClient(BROKER[0], *STRANGER), "CURVE key", id="refused-key"),
    pytest.param(CurveClient(STRANGER[0], *ALICE), "server key", id="wrong-broker-key"),
    pytest.param(None, "CURVE", id="plaintext"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("security", "reason"), CASES)
async def test_a_worker_is_told(security: CurveClient | None, reason: str) -> None:
    async with Broker("tcp://127.0.0.1:0", security=server()) as broker:
        endpoint = broker.endpoints[0]
        started = anyio.current_time()
        with anyio.fail_after(10), pytest.raises(AuthenticationFailed) as info:
            async with Worker(endpoint, "echo", echo, security=security):
                pytest.fail("served without a handshake")  # pragma: no cover
        assert reason in info.value.reason
        assert anyio.current_time() - started < 5
        # The allowed key still serves.
        async with (
            Worker(endpoint, "echo", echo, security=CurveClient(BROKER[0], *ALICE)),
            Client(endpoint, security=CurveClient(BROKER[0], *ALICE), timeout=5) as client,
        ):
            assert (await client.request("echo", b"ok")).data == (b"ok",)


@pytest.mark.anyio
async def test_a_curve_client_against_a_plaintext_broker_is_told() -> None:
    async with (
        Broker("tcp://127.0.0.1:0") as broker,
        Client(broker.endpoints[0], security=CurveClient(BROKER[0], *ALICE), timeout=30) as client,
    ):
        with anyio.fail_after(10), pytest.raises(AuthenticationFailed) as info:
            await client.request("echo", b"x")
        assert "uses CURVE and the broker does not" in info.value.reason
        assert client.closed


@pytest.mark.anyio
@pytest.mark.parametrize(("security", "reason"), CASES)
async def test_a_client_is_told(security: CurveClient | None, reason: str) -> None:
    async with (
        Broker("tcp://127.0.0.1:0", security=server()) as broker,
        Client(broker.endpoints[0], security=security, timeout=30) as client,
    ):
        started = anyio.current_time()
        with anyio.fail_after(10), pytest.raises(AuthenticationFailed) as info:
            await client.request("echo", b"x")
        assert reason in info.value.reason
        assert anyio.current_time() - started < 5
        assert client.closed


@pytest.mark.anyio
@pytest.mark.parametrize(("security", "reason"), CASES)
async def test_a_sync_client_is_told(security: CurveClient | None, reason: str) -> None:
    async with Broker("tcp://127.0.0.1:0", security=server()) as broker:
        endpoint = broker.endpoints[0]

        def call() -> tuple[str, float]:
            # 60 s: a missed failure would show at the first attempt's end (20 s).
            with SyncClient(endpoint, security=security, timeout=60) as client:
                started = time.monotonic()
                with pytest.raises(AuthenticationFailed) as info:
                    client.request("echo", b"x")
                elapsed = time.monotonic() - started
                assert client.closed
                with pytest.raises(AuthenticationFailed):
                    client.request("echo", b"again")
                return info.value.reason, elapsed

        with anyio.fail_after(90):
            said, elapsed = await anyio.to_thread.run_sync(call)
        assert reason in said
        assert elapsed < 10  # a hang guard: told within about a second, not at 20 s


@pytest.mark.anyio
async def test_a_sync_client_whose_handshake_failed_before_its_first_send_is_told() -> None:
    """libzmq drops the connection of a refused handshake without reconnecting, so the
    first send finds no connection to queue on (EAGAIN): the client must read the failure
    while it waits to send, not once the attempt is over."""
    async with Broker("tcp://127.0.0.1:0", security=server()) as broker:
        endpoint = broker.endpoints[0]

        def call() -> tuple[str, float, int]:
            client = SyncClient(endpoint, security=CurveClient(BROKER[0], *STRANGER), timeout=60)
            with client:
                # The moment libzmq dropped the connection shows on the client's sockets
                # only: no public API tells it.
                receiver = client._receiver
                assert receiver.monitor is not None
                assert receiver.monitor.poll(30_000)  # the failure is known (not yet read)
                # ... and libzmq has dropped the connection: a send would find none.
                deadline = time.monotonic() + 30
                while int(receiver.sock.getsockopt(zmq.EVENTS)) & zmq.POLLOUT:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                started = time.monotonic()
                with pytest.raises(AuthenticationFailed) as info:
                    client.request("echo", b"x", retries=0)
                elapsed = time.monotonic() - started
                assert client.closed
                return info.value.reason, elapsed, client.statistics().send_waits

        with anyio.fail_after(120):
            said, elapsed, send_waits = await anyio.to_thread.run_sync(call)
        assert "refused this client's CURVE key" in said
        assert send_waits == 1  # the first send found no connection
        assert elapsed < 30  # a hang guard: at once, not at the attempt's end (60 s)


def test_refused_connections_make_a_never_connected_broker_unreachable() -> None:
    """Rule H6: REFUSED_LIMIT refusals in a row, no handshake ever."""
    watch = HandshakeWatch("tcp://b:1", secure=False, role="client")
    for _ in range(REFUSED_LIMIT - 1):
        assert watch.event(zmq.EVENT_CONNECT_RETRIED, 100) is None
    assert not watch.unreachable()
    watch.event(zmq.EVENT_CONNECTED, 7)  # a connection made clears the count
    for _ in range(REFUSED_LIMIT - 1):
        watch.event(zmq.EVENT_CONNECT_RETRIED, 100)
    assert not watch.unreachable()
    watch.event(zmq.EVENT_CONNECT_RETRIED, 100)
    assert watch.unreachable()
    other = HandshakeWatch("tcp://c:1", secure=False, role="client")
    assert not all_unreachable([watch, other])
    for _ in range(REFUSED_LIMIT):
        other.event(zmq.EVENT_CONNECT_RETRIED, 100)
    assert all_unreachable([watch, other])


def test_a_broker_once_connected_is_never_unreachable() -> None:
    watch = HandshakeWatch("tcp://b:1", secure=False, role="client")
    watch.event(zmq.EVENT_CONNECTED, 7)
    watch.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)
    watch.event(zmq.EVENT_DISCONNECTED, 7)
    for _ in range(10 * REFUSED_LIMIT):
        watch.event(zmq.EVENT_CONNECT_RETRIED, 100)
    assert not watch.unreachable()
