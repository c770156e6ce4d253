"""A new user's first calls (issue 25, findings 2 and 7), against a real broker.

Finding 2: a call to a service no worker serves fails at once with ``NoWorkers``, on both
clients and from every call that sends requests; ``wait_for_worker=True`` queues it until a
worker comes (dcp._client.options Rule CO4).

Finding 7: errors as good as ``dcp call``'s: no broker is named as such, a slow worker is told
from it, the attempts and time are the real ones (dcp._core.client.tracker Rule RT7); a
malformed endpoint is a ``ValueError`` when the client or worker is made; a ``SyncClient`` in
a running event loop is refused at once (dcp._client.sync_receive Rule SX4).
"""

from __future__ import annotations

import re
import socket
import threading

import anyio
import pytest

import dcp
from dcp import Client, HandlerRequest, NoWorkers, SyncClient
from tests.fakes import broker_in_thread
from tests.helpers import wait_for

#: A hang guard: "at once" is milliseconds; the calls below have a 60 s timeout.
AT_ONCE = 10.0


async def upper(request: HandlerRequest) -> bytes:
    return request.data[0].upper()


@pytest.mark.anyio
async def test_every_call_to_a_service_nobody_serves_fails_at_once() -> None:
    async with (
        dcp.Broker("tcp://127.0.0.1:0") as broker,
        Client(broker.endpoints[0], timeout=60) as client,
    ):
        with anyio.fail_after(AT_ONCE):
            with pytest.raises(NoWorkers, match="no worker serves 'nobody'"):
                await client.request("nobody", b"x")
            with pytest.raises(NoWorkers):
                await client.request_json("nobody", [1])
            with pytest.raises(NoWorkers):
                async for _ in client.map("nobody", [b"a"]):
                    pass  # pragma: no cover
            with pytest.raises(NoWorkers):
                async for _ in client.map_unordered("nobody", [b"a"]):
                    pass  # pragma: no cover
            [outcome] = [o async for o in client.map_outcomes("nobody", [b"a"])]
            assert type(outcome) is NoWorkers
            with pytest.raises(NoWorkers):
                async with client.stream("nobody", b"x") as parts:
                    async for _ in parts:
                        pass  # pragma: no cover
            # Discovery is not a call to a service: it is answered as before.
            assert await client.services() == []
        assert client.statistics().retries == 0
    assert broker.statistics().rejections.get("no_workers") == 6


def _queued(broker: dcp.Broker, service: bytes) -> int:
    queue = broker.statistics().services.get(service)
    return 0 if queue is None else queue.queued


@pytest.mark.anyio
async def test_wait_for_worker_queues_the_call_until_a_worker_comes() -> None:
    async with dcp.Broker("tcp://127.0.0.1:0") as broker:
        endpoint = broker.endpoints[0]
        replies: list[bytes] = []
        async with (
            Client(endpoint, timeout=60) as client,
            Client(endpoint, timeout=60, wait_for_worker=True) as waiting,
        ):

            async def call(client: Client, data: bytes, **options: bool) -> None:
                response = await client.request("late", data, **options)  # type: ignore[arg-type]
                replies.append(response.data[0])

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lambda: call(client, b"a", wait_for_worker=True))
                    tg.start_soon(lambda: call(waiting, b"b"))  # the client's default
                    tg.start_soon(lambda: call(client, b"c", no_wait=False))  # the old spelling
                    # All three are queued at the broker before a worker registers.
                    await wait_for(lambda: _queued(broker, b"late") == 3, within=20)
                    async with dcp.Worker(endpoint, "late", upper):
                        await wait_for(lambda: len(replies) == 3, within=20)
                # Per call, the other way round: the waiting client's default is overridden.
                with pytest.raises(NoWorkers):
                    await waiting.request("late", b"d", wait_for_worker=False)
                with pytest.raises(NoWorkers):
                    await waiting.request("late", b"e", no_wait=True)
    assert sorted(replies) == [b"A", b"B", b"C"]


def test_the_sync_client_fails_at_once_too_and_waits_when_asked() -> None:
    with broker_in_thread() as endpoint, SyncClient(endpoint, timeout=60) as client:
        with pytest.raises(NoWorkers, match="no worker serves 'nobody'"):
            client.request("nobody", b"x")
        with pytest.raises(NoWorkers):
            client.request_json("nobody", [1])
        with pytest.raises(NoWorkers):
            list(client.map("nobody", [b"a"]))
        with pytest.raises(NoWorkers):
            list(client.map_unordered("nobody", [b"a"]))
        [outcome] = client.map_outcomes("nobody", [b"a"])
        assert type(outcome) is NoWorkers
        with pytest.raises(NoWorkers), client.stream("nobody", b"x") as parts:
            list(parts)
        assert client.services() == []
        # wait_for_worker=True: queued until a worker comes (one registers meanwhile).
        got: list[bytes] = []
        waiter = threading.Thread(target=lambda: got.append(_served_once(endpoint)), daemon=True)
        waiter.start()
        response = client.request("late", b"q", wait_for_worker=True, timeout=30)
        waiter.join(30)
        assert response.data == (b"Q",) and got == [b"served"]


def _served_once(endpoint: str) -> bytes:
    """Serve ``late`` in this thread until one request was answered."""

    async def serve() -> None:
        done = anyio.Event()

        async def handler(request: HandlerRequest) -> bytes:
            done.set()
            return request.data[0].upper()

        async with dcp.Worker(endpoint, "late", handler):
            await done.wait()
            await anyio.sleep(0.2)  # let the reply leave before the worker does

    anyio.run(serve)
    return b"served"


def test_wait_for_worker_and_its_old_spelling() -> None:
    from dcp._client.options import wait_for_option

    assert wait_for_option(None, None) is None
    assert wait_for_option(True, None) is True
    assert wait_for_option(None, True) is False
    assert wait_for_option(False, True) is False
    with pytest.raises(ValueError, match="disagree"):
        wait_for_option(True, True)
    with pytest.raises(ValueError, match="disagree"):
        Client("tcp://127.0.0.1:5555", wait_for_worker=True, no_wait=True)
    client = Client("tcp://127.0.0.1:5555", no_wait=False)
    assert client.wait_for_worker is True and client.no_wait is False
    client.no_wait = True
    assert client.wait_for_worker is False


# -- Finding 7: the Python API's errors as good as the CLI's ---------------------------------


def _nowhere() -> str:
    """An endpoint where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return f"tcp://127.0.0.1:{port}"


@pytest.mark.anyio
async def test_no_broker_is_named_in_the_error_with_honest_attempts_and_time() -> None:
    endpoint = _nowhere()
    async with Client(endpoint) as client:
        for timeout in (0.05, 0.6):
            before = client.statistics().retries
            with anyio.fail_after(10), pytest.raises(dcp.RequestTimeout) as info:
                await client.request("echo", b"x", timeout=timeout)
            sent = 1 + client.statistics().retries - before
            attempts = "1 attempt sent" if sent == 1 else f"{sent} attempts sent"
            message = str(info.value)
            assert type(info.value) is dcp.RequestTimeout
            # What really happened: the time waited (at least the timeout), the attempts sent.
            match = re.fullmatch(r"no reply after ([0-9.]+)s \((.*?)\); (.*)", message)
            assert match is not None, message
            assert timeout <= float(match[1]) < timeout + 5
            assert match[2] == attempts
            assert match[3] == f"nothing heard from {endpoint}: is a dcp broker running there?"


def test_no_broker_is_named_in_the_sync_clients_error_too() -> None:
    endpoint = _nowhere()
    with (
        SyncClient(endpoint, timeout=0.3) as client,
        pytest.raises(dcp.RequestTimeout, match="is a dcp broker running there"),
    ):
        client.request("echo", b"x")


@pytest.mark.anyio
async def test_a_slow_worker_is_told_from_a_missing_broker() -> None:
    release = anyio.Event()

    async def slow(request: HandlerRequest) -> bytes:
        await release.wait()
        return b"late"

    async with (
        dcp.Broker("tcp://127.0.0.1:0") as broker,
        dcp.Worker(broker.endpoints[0], "slow", slow),
        Client(broker.endpoints[0]) as client,
    ):
        with anyio.fail_after(10), pytest.raises(dcp.RequestTimeout) as info:
            await client.request("slow", b"x", timeout=0.5, retries=0)
        release.set()
    assert type(info.value) is dcp.RequestTimeout
    assert str(info.value).endswith(
        "(1 attempt sent); the broker answers, and a worker serves 'slow': "
        "it did not reply in time"
    )


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("tcp://*:5555", "host '*' (every interface) is for binding only"),
        ("tcp://localhost", "no port"),
        ("127.0.0.1:5555", "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1:0", "port 0 (any free port) is for binding only"),
    ],
)
def test_a_malformed_endpoint_is_a_value_error_when_the_part_is_made(
    endpoint: str, says: str
) -> None:
    expected = re.escape(f"bad endpoint {endpoint!r}: ") + f".*{re.escape(says)}"
    with pytest.raises(ValueError, match=expected):
        Client(endpoint)
    with pytest.raises(ValueError, match=expected):
        SyncClient(endpoint)
    with pytest.raises(ValueError, match=expected):
        dcp.Worker(endpoint, "echo", upper)


@pytest.mark.anyio
async def test_a_sync_client_in_a_running_event_loop_is_refused_at_once() -> None:
    endpoint = _nowhere()
    with pytest.raises(RuntimeError, match=r"this thread runs .*: use dcp\.Client"):
        SyncClient(endpoint, timeout=1)
    # Made elsewhere, used here: refused as the request starts (not after its timeout).
    client = await anyio.to_thread.run_sync(lambda: SyncClient(endpoint, timeout=1))
    try:
        with pytest.raises(RuntimeError, match=r"use dcp\.Client"):
            client.request("echo", b"x")
        assert client.statistics().requests == 0
    finally:
        client.close()
