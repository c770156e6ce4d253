"""Replacing a running broker's allow-lists (``Broker.reload_security``; ``dcp broker`` on
SIGHUP): new keys get in, revoked keys are no longer heard, workers whose key may no
longer serve are removed and told, and their requests go to another worker. Real CURVE
handshakes over tcp on 127.0.0.1, both backends, both broker I/O modes."""

from __future__ import annotations

import anyio
import pytest
import zmq

from dcp import (
    AuthenticationFailed,
    Broker,
    Client,
    CurveClient,
    CurveServer,
    RegistrationRefused,
    Request,
    RequestTimeout,
    Worker,
)

pytestmark = pytest.mark.anyio

BROKER = zmq.curve_keypair()
ALICE = zmq.curve_keypair()
BOB = zmq.curve_keypair()
W1 = zmq.curve_keypair()
W2 = zmq.curve_keypair()


def lists(clients: list[bytes], workers: list[bytes]) -> CurveServer:
    return CurveServer(BROKER[0], BROKER[1], clients=clients, workers={"echo": workers})


def keys(pair: tuple[bytes, bytes]) -> CurveClient:
    return CurveClient(BROKER[0], *pair)


async def echo(request: Request) -> bytes:
    return request.data[0]


@pytest.mark.parametrize("io_thread", [True, False], ids=["io-thread", "event-loop"])
async def test_keys_come_and_go(io_thread: bool) -> None:
    security = lists([ALICE[0]], [W1[0], W2[0]])
    async with Broker("tcp://127.0.0.1:0", security=security, io_thread=io_thread) as broker:
        endpoint = broker.endpoints[0]
        async with (
            Worker(endpoint, "echo", echo, security=keys(W1)),
            Client(endpoint, security=keys(ALICE), timeout=5) as alice,
        ):
            assert (await alice.request("echo", b"1")).data == (b"1",)
            async with Client(endpoint, security=keys(BOB), timeout=5) as bob:
                with pytest.raises(AuthenticationFailed):
                    await bob.request("echo", b"x")
            # Bob is added, Alice revoked.
            assert await broker.reload_security(lists([BOB[0]], [W1[0], W2[0]])) == 0
            async with Client(endpoint, security=keys(BOB), timeout=5) as bob:
                assert (await bob.request("echo", b"2")).data == (b"2",)
            with pytest.raises(RequestTimeout):  # connected, but no longer heard
                await alice.request("echo", b"3", timeout=0.5, retries=0)
            assert broker.statistics().rejections["revoked"] >= 1
            # Her new connections fail the handshake.
            async with Client(endpoint, security=keys(ALICE), timeout=5) as again:
                with pytest.raises(AuthenticationFailed):
                    await again.request("echo", b"x")


async def test_a_revoked_worker_is_removed_told_and_its_request_served_elsewhere() -> None:
    security = lists([ALICE[0]], [W1[0], W2[0]])
    async with Broker("tcp://127.0.0.1:0", security=security) as broker:
        endpoint = broker.endpoints[0]
        started = anyio.Event()
        release = anyio.Event()
        finished: list[bytes] = []

        async def stuck(request: Request) -> bytes:
            started.set()
            await release.wait()
            finished.append(request.data[0])  # pragma: no cover - its worker is stopped
            return b"from w1"  # pragma: no cover

        async def fine(request: Request) -> bytes:
            return b"from w2"

        async with (
            anyio.create_task_group() as tg,
            Client(endpoint, security=keys(ALICE), timeout=10) as alice,
        ):
            w1 = Worker(endpoint, "echo", stuck, security=keys(W1))
            outcome: list[BaseException] = []
            told = anyio.Event()

            async def serve_w1() -> None:
                try:
                    await w1.serve()
                except RegistrationRefused as exc:
                    outcome.append(exc)
                    told.set()

            tg.start_soon(serve_w1)
            replies: list[bytes] = []
            answered = anyio.Event()

            async def call() -> None:
                replies.extend((await alice.request("echo", b"job")).data)
                answered.set()

            tg.start_soon(call)
            with anyio.fail_after(5):
                await started.wait()
            async with Worker(endpoint, "echo", fine, security=keys(W2)):
                assert await broker.reload_security(lists([ALICE[0]], [W2[0]])) == 1
                with anyio.fail_after(5):
                    await answered.wait()
                    await told.wait()
            release.set()
        assert replies == [b"from w2"]
        assert "may no longer register b'echo'" in str(outcome[0])
        assert finished == []
        stats = broker.statistics()
        assert stats.rejections["revoked"] == 1
        assert stats.redeliveries == 1


async def test_reload_checks_its_argument() -> None:
    plain = Broker("tcp://127.0.0.1:0")
    with pytest.raises(ValueError, match="without security"):
        await plain.reload_security(lists([], []))
    other = zmq.curve_keypair()
    secure = Broker("tcp://127.0.0.1:0", security=lists([], []))
    with pytest.raises(ValueError, match="not the broker's key pair"):
        await secure.reload_security(CurveServer(other[0], other[1]))
    # Before it serves, a reload just takes effect.
    assert await secure.reload_security(lists([ALICE[0]], [])) == 0
