"""CURVE security on real sockets (tcp on 127.0.0.1, port 0), on both anyio backends.

What the allow-lists let in and keep out, what an observer of the wire sees (a recording
TCP relay, with a plaintext control), and what an authorised but malicious peer can and
cannot do with another peer's routing id. Rules without sockets: ``test_security_units.py``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import anyio
import anyio.abc
import pytest
import zmq
from zmq.utils import z85

from dcp import (
    AuthenticationFailed,
    Broker,
    Client,
    CurveClient,
    CurveServer,
    Forward,
    RegistrationRefused,
    SyncClient,
    Worker,
)
from dcp._broker.zap import ZAP_ENDPOINT
from dcp._io.context import get_context
from dcp._io.security import configure_client_socket
from dcp._models import HandlerRequest
from dcp.wire import Register, Reply, Request, parse, serialize
from tests.helpers import Peers, wait_for

pytestmark = pytest.mark.anyio

BROKER = zmq.curve_keypair()
ALICE = zmq.curve_keypair()  # a client
MALLORY = zmq.curve_keypair()  # another client, with bad intentions
WORKER = zmq.curve_keypair()  # may serve "echo" and "front"
STRANGER = zmq.curve_keypair()  # on no list

# For the wire recording: none of these may appear in it with CURVE on.
SERVICE = b"svc-7f3a9c-payroll"
PAYLOAD = b"salary of employee 4711: 123456 EUR"
ROUTING_ID = b"\x01alice-routing-id"


def server() -> CurveServer:
    return CurveServer(
        BROKER[0],
        BROKER[1],
        clients=[ALICE[0], MALLORY[0]],
        workers={"echo": [WORKER[0]], "front": [WORKER[0]], SERVICE: [WORKER[0]]},
    )


def keys(pair: tuple[bytes, bytes], server_key: bytes = BROKER[0]) -> CurveClient:
    return CurveClient(server_key, pair[0], pair[1])


async def upper(request: HandlerRequest) -> bytes:
    return request.data[0].upper()


async def front(request: HandlerRequest) -> Forward:
    return Forward("echo", *request.data)


@asynccontextmanager
async def secure_broker() -> AsyncIterator[tuple[Broker, str]]:
    async with Broker("tcp://127.0.0.1:0", security=server()) as broker:
        yield broker, broker.endpoints[0]


async def test_known_keys_get_through_unknown_keys_do_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="dcp"):
        async with secure_broker() as (broker, endpoint):
            async with (
                Worker(endpoint, "echo", upper, security=keys(WORKER)),
                Worker(endpoint, "front", front, security=keys(WORKER)),
                Client(endpoint, security=keys(ALICE), timeout=5) as client,
            ):
                assert (await client.request("echo", b"hi")).data == (b"HI",)
                # A forward (the sealed client address goes on to the next worker).
                assert (await client.request("front", b"dag")).data == (b"DAG",)
                for security, reason in [
                    (keys(STRANGER), "refused this client's CURVE key"),  # on no list
                    (keys(ALICE, server_key=STRANGER[0]), "server key"),  # wrong broker key
                ]:
                    # Told at once (the handshake's events), not after the 30 s timeout.
                    async with Client(endpoint, security=security, timeout=30) as other:
                        with anyio.fail_after(10), pytest.raises(AuthenticationFailed) as info:
                            await other.request("echo", b"let me in")
                        assert reason in info.value.reason
                        assert info.value.endpoint == endpoint
                        # The client is closed; later calls say why too.
                        with pytest.raises(AuthenticationFailed):
                            await other.request("echo", b"again")
                # A plaintext client is told too: a mechanism mismatch (handshakes Rule H2)
                # or, when the broker hangs up before the client reads its greeting (a loaded
                # machine), three failed handshakes (Rule H3); both name CURVE and the keys.
                async with Client(endpoint, timeout=30) as plain:
                    with anyio.fail_after(10), pytest.raises(AuthenticationFailed) as info:
                        await plain.request("echo", b"let me in")
                    reason = info.value.reason
                    assert "requires CURVE" in reason or "require CURVE" in reason, reason
                    assert "--server-key" in reason
            stats = broker.statistics()
    assert stats.requests == 3  # 2 requests + 1 forward: nothing from the others
    assert stats.rejections["zap_denied"] >= 1
    denials = [r.getMessage() for r in caplog.records if "ZAP: denied" in r.getMessage()]
    assert len(denials) == 1  # once per key, however often it retries
    assert STRANGER[0].decode() in denials[0]


async def test_a_worker_without_permission_is_refused_and_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with secure_broker() as (broker, endpoint):
        with caplog.at_level(logging.WARNING, logger="dcp"):
            # The worker key may serve echo, not "secrets"; a client key may serve nothing.
            for service, pair in [("secrets", WORKER), ("echo", ALICE)]:
                with pytest.raises(RegistrationRefused) as info:
                    async with Worker(endpoint, service, upper, security=keys(pair)):
                        pytest.fail("registered without permission")  # pragma: no cover
                assert info.value.service == service
                assert pair[0].decode() in info.value.message
            # serve() raises too, before it reports readiness.
            worker = Worker(endpoint, "secrets", upper, security=keys(WORKER))
            async with anyio.create_task_group() as tg:
                with pytest.raises(RegistrationRefused):
                    await tg.start(worker.serve)
        stats = broker.statistics()
        assert stats.rejections["registration_refused"] == 3
        assert stats.workers == 0
        assert "registration_refused" in caplog.text
        assert any(r.name == "dcp.worker" and r.levelno == logging.ERROR for r in caplog.records)
        # The permitted worker serves.
        async with (
            Worker(endpoint, "echo", upper, security=keys(WORKER)),
            Client(endpoint, security=keys(ALICE), timeout=5) as client,
        ):
            assert (await client.request("echo", b"ok")).data == (b"OK",)


async def test_sync_client_with_curve() -> None:
    async with (
        secure_broker() as (_, endpoint),
        Worker(endpoint, "echo", upper, security=keys(WORKER)),
    ):

        def call() -> tuple[bytes, ...]:
            with SyncClient(endpoint, security=keys(ALICE), timeout=5) as client:
                return client.request("echo", b"sync").data

        assert await anyio.to_thread.run_sync(call) == (b"SYNC",)


# -- what the wire shows ------------------------------------------------------------------


async def relay(
    target: int,
    record: bytearray,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Forward TCP connections on 127.0.0.1 to port ``target``, recording every byte."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def pump(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
        try:
            async for chunk in src:
                record.extend(chunk)
                await dst.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        await dst.aclose()

    async def handle(downstream: anyio.abc.SocketStream) -> None:
        upstream = await anyio.connect_tcp("127.0.0.1", target)
        async with downstream, upstream, anyio.create_task_group() as tg:
            tg.start_soon(pump, downstream, upstream)
            tg.start_soon(pump, upstream, downstream)

    async with listener:
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        await listener.serve(handle)


@pytest.mark.parametrize("secure", [True, False], ids=["curve", "plaintext-control"])
async def test_traffic_is_not_readable_on_the_wire(secure: bool) -> None:
    record = bytearray()
    security = server() if secure else None
    async with (
        Broker("tcp://127.0.0.1:0", security=security) as broker,
        anyio.create_task_group() as tg,
    ):
        port = int(broker.endpoints[0].rsplit(":", 1)[1])
        relayed = f"tcp://127.0.0.1:{await tg.start(relay, port, record)}"
        async with (
            Worker(relayed, SERVICE, upper, security=keys(WORKER) if secure else None),
            Client(
                relayed,
                routing_id=ROUTING_ID,
                security=keys(ALICE) if secure else None,
                timeout=5,
            ) as client,
        ):
            assert (await client.request(SERVICE, PAYLOAD)).data == (PAYLOAD.upper(),)
        tg.cancel_scope.cancel()
    wire = bytes(record)
    assert len(wire) > 2 * len(PAYLOAD)  # the relay saw the traffic
    secrets = [SERVICE, PAYLOAD, PAYLOAD.upper(), ROUTING_ID, b"DGBX\x01"]
    if secure:
        for secret in [*secrets, z85.decode(ALICE[0]), z85.decode(WORKER[0])]:
            assert secret not in wire
        assert b"CURVE" in wire  # the greeting names the mechanism, nothing more
    else:
        for secret in secrets:
            assert secret in wire


# -- steering replies ---------------------------------------------------------------------


async def test_another_key_cannot_take_over_a_connected_clients_routing_id() -> None:
    """No ROUTER_HANDOVER in secure mode: Mallory, with a valid key and Alice's routing id,
    is refused while Alice is connected, and Alice gets her reply."""
    started, release = anyio.Event(), anyio.Event()

    async def slow(request: HandlerRequest) -> bytes:
        started.set()
        await release.wait()
        return b"for alice only"

    alice_id = b"\x01alice"
    replies: list[tuple[bytes, ...]] = []
    async with (
        secure_broker() as (broker, endpoint),
        Worker(endpoint, "echo", slow, security=keys(WORKER)),
        Client(endpoint, routing_id=alice_id, security=keys(ALICE), timeout=5) as alice,
        anyio.create_task_group() as tg,
    ):

        async def ask() -> None:
            replies.append((await alice.request("echo", b"q")).data)

        tg.start_soon(ask)
        await started.wait()
        zap = broker._security.zap
        assert zap is not None
        allowed = zap.allowed
        with Peers(endpoint) as peers:
            mallory = peers(alice_id, security=keys(MALLORY))
            mallory.send(Request(b"echo", None, (b"m",), (b"steal",)))
            # Her handshake completes (ZAP allows her key); zmq then refuses the duplicate id.
            await wait_for(lambda: zap.allowed > allowed)
            await anyio.sleep(0.1)
            release.set()
            await wait_for(lambda: replies)
            await mallory.expect_silence(0.2)
    assert replies == [(b"for alice only",)]
    assert broker.statistics().requests == 1


async def test_a_routing_id_stays_bound_to_its_key_after_its_owner_left() -> None:
    alice_id = b"\x01alice"
    async with (
        secure_broker() as (broker, endpoint),
        Worker(endpoint, "echo", upper, security=keys(WORKER)),
    ):
        async with Client(endpoint, routing_id=alice_id, security=keys(ALICE)) as alice:
            await alice.request("echo", b"x")
        with Peers(endpoint) as peers:

            def refused() -> int:
                return broker.statistics().rejections.get("routing_id_taken", 0)

            # zmq checks a routing id when a connection attaches: one that attaches while
            # Alice's old connection is still there is ignored for good (no handover). So
            # Mallory connects anew, as an attacker would, until the broker sees it.
            with anyio.fail_after(10):
                while True:
                    mallory = peers(alice_id, security=keys(MALLORY))
                    with suppress(zmq.Again):
                        mallory.send(Request(b"echo", None, (b"m",), (b"as alice",)))
                    with anyio.move_on_after(0.2):
                        await wait_for(refused)
                    if refused():
                        break
                    mallory.close()
            await mallory.expect_silence(0.1)
    assert broker.statistics().requests == 1


async def test_workers_see_sealed_addresses_that_steer_nothing() -> None:
    """A malicious worker learns no routing id from the requests it is given, cannot
    address a client with a raw id, and a peer connecting with the sealed address as its
    routing id receives nothing."""
    alice_id = b"\x01alice"
    replies: list[tuple[bytes, ...]] = []
    async with secure_broker() as (broker, endpoint):
        with Peers(endpoint) as peers:
            evil = peers(b"\x01evil-worker", security=keys(WORKER))
            evil.send(Register(b"echo"))
            await evil.expect(Register(b"echo"))
            async with (
                Client(endpoint, routing_id=alice_id, security=keys(ALICE), timeout=5) as alice,
                anyio.create_task_group() as tg,
            ):

                async def ask() -> None:
                    replies.append((await alice.request("echo", b"q")).data)

                tg.start_soon(ask)
                request, _ = await evil.recv()
                assert isinstance(request, Request) and request.client is not None
                sealed = request.client
                assert alice_id not in sealed and len(sealed) == 16 + len(alice_id)
                thief_id = sealed if sealed[0] else b"\x01" + sealed[1:]
                thief = peers(thief_id, security=keys(MALLORY))
                thief.send(Request(b"nobody", None, (b"m",), (b"hello",)))
                await wait_for(lambda: broker.statistics().services.get(b"nobody"))
                # A reply to Alice's raw routing id (had the worker guessed it) goes nowhere.
                evil.send(Reply(alice_id, request.metadata, (b"forged",)))
                await wait_for(lambda: broker.statistics().rejections.get("bad_client_address"))
                evil.send(Reply(sealed, request.metadata, (b"genuine",)))
                await wait_for(lambda: replies)
                await thief.expect_silence(0.1)
    assert replies == [(b"genuine",)]


# -- the ZAP handler's robustness and lifetime ---------------------------------------------


async def test_the_zap_handler_survives_garbage() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        async with (
            Broker("tcp://127.0.0.1:0", security=server(), context=ctx) as broker,
            Worker(broker.endpoints[0], "echo", upper, security=keys(WORKER)),
        ):
            junk: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
            junk.setsockopt(zmq.LINGER, 0)
            junk.connect(ZAP_ENDPOINT)
            try:
                for frames in [
                    [b"no envelope"],
                    [b"", b"2.0", b"1"],
                    [b"", b"1.0", b"2", b"dcp", b"addr", b"", b"PLAIN", b"u", b"p"],
                    [b"", b"1.0", b"3", b"dcp", b"addr", b"", b"CURVE", b"short"],
                    [b"", b"1.0", b"4", *[b"x"] * 100],
                    [b"", b"1.0", b"5", b"y" * 100_000],
                ]:
                    junk.send_multipart(frames)
                answers: list[list[bytes]] = []

                def probe() -> bool:
                    with suppress(zmq.Again):
                        answers.append(junk.recv_multipart(zmq.NOBLOCK))
                    return len(answers) == 5

                await wait_for(probe)
                assert [a[2:4] for a in answers] == [
                    [b"1", b"500"],
                    [b"2", b"400"],
                    [b"3", b"400"],
                    [b"4", b"500"],
                    [b"5", b"500"],
                ]
            finally:
                junk.close(0)
            async with Client(broker.endpoints[0], security=keys(ALICE), timeout=5) as client:
                assert (await client.request("echo", b"still")).data == (b"STILL",)
            assert broker.statistics().rejections["zap_malformed"] == 4
    finally:
        ctx.term()


async def test_a_context_has_one_zap_handler() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    squatter: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
    squatter.setsockopt(zmq.LINGER, 0)
    squatter.bind(ZAP_ENDPOINT)
    try:
        with pytest.raises(zmq.ZMQError) as info:
            async with Broker("tcp://127.0.0.1:0", security=server(), context=ctx):
                pass  # pragma: no cover
        assert info.value.errno == zmq.EADDRINUSE
    finally:
        squatter.close(0)
        ctx.term()


def test_inproc_cannot_be_secured() -> None:
    with pytest.raises(ValueError, match="inproc"):
        Broker("tcp://127.0.0.1:0", "inproc://x", security=server())


async def test_two_secure_brokers_in_one_process() -> None:
    """Each secure broker has its own zmq context, hence its own ZAP handler."""
    async with secure_broker() as (_, first), secure_broker() as (_, second):
        for endpoint in (first, second):
            async with (
                Worker(endpoint, "echo", upper, security=keys(WORKER)),
                Client(endpoint, security=keys(ALICE), timeout=5) as client,
            ):
                assert (await client.request("echo", b"x")).data == (b"X",)


async def test_peers_without_a_routing_id_are_served_in_secure_mode() -> None:
    """MDP and DagBox C++ peers set no routing id: the broker's zmq generates one (first
    byte 0x00). With CURVE it is bound to the peer's key like any other (guard Rule S2):
    here an MDP/0.1 client on a REQ socket and a raw DCP worker on a DEALER, neither with an
    id, through a secure broker."""
    async with secure_broker() as (broker, endpoint):
        ctx = get_context()
        worker, client = ctx.socket(zmq.DEALER), ctx.socket(zmq.REQ)
        try:
            for sock, pair in ((worker, WORKER), (client, ALICE)):
                sock.setsockopt(zmq.LINGER, 0)
                configure_client_socket(sock, keys(pair))
                sock.connect(endpoint)
            worker.send_multipart(serialize(Register(b"echo")))
            await wait_for(lambda: worker.poll(0, zmq.POLLIN))
            assert worker.recv_multipart() == serialize(Register(b"echo"))
            client.send_multipart([b"MDPC01", b"echo", b"hello"])
            await wait_for(lambda: worker.poll(0, zmq.POLLIN))
            request, _ = parse(worker.recv_multipart())
            assert isinstance(request, Request) and request.client is not None
            assert request.data == (b"hello",)
            worker.send_multipart(serialize(Reply(request.client, (), (b"HELLO",))))
            await wait_for(lambda: client.poll(0, zmq.POLLIN))
            assert client.recv_multipart() == [b"MDPC01", b"echo", b"HELLO"]
        finally:
            worker.close(0)
            client.close(0)
        assert "anonymous_routing_id" not in broker.statistics().rejections
