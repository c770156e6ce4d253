"""Several services per worker, service info, approval and discovery, live: a real broker,
workers and clients on real zmq sockets, on both anyio backends."""

from __future__ import annotations

import json
import logging
import uuid

import anyio
import anyio.lowlevel
import pytest
import zmq

import dcp
from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._core.broker.directory import PAGE_ENTRIES
from dcp._errors import RegistrationRefused
from dcp._worker.worker import Worker
from dcp.wire import Request, serialize
from tests.helpers import Peers

pytestmark = pytest.mark.anyio


class _Endpoints(dict[str, str]):
    """A fresh inproc endpoint per name and test (both backends share one zmq context)."""

    def __missing__(self, key: str) -> str:
        value = self[key] = f"inproc://{key}-{uuid.uuid4().hex}"
        return value


EP = _Endpoints()


@pytest.fixture(autouse=True)
def _fresh_endpoints() -> None:
    EP.clear()


async def upper(request: dcp.HandlerRequest) -> bytes:
    return request.data[0].upper()


def lower(request: dcp.HandlerRequest) -> bytes:
    return request.data[0].lower()


async def fail(request: dcp.HandlerRequest) -> bytes:
    raise RuntimeError("no")


UPPER = dcp.Service(
    upper,
    concurrency=2,
    version="1.2.0",
    description="Upper-cases text",
    metadata={"team": "text"},
    request_schema={"type": "string"},
    response_schema={"type": "string"},
)


async def test_one_worker_several_services(io_thread: bool) -> None:
    async with (
        Broker(EP["svc-multi"], io_thread=io_thread) as broker,
        Worker(
            EP["svc-multi"],
            services={"upper": UPPER, b"lower": lower, "fail": fail},
        ) as worker,
        Client(EP["svc-multi"], timeout=5) as client,
    ):
        assert worker.registered
        assert (await client.request("upper", b"Ab")).bytes == b"AB"
        assert (await client.request("lower", b"Ab")).bytes == b"ab"
        with pytest.raises(dcp.RemoteError):
            await client.request("fail", b"x")
        # One socket, one worker: the broker sees one worker serving three services.
        assert broker.statistics().workers == 1
        names = {s.name: s for s in await client.services()}
        assert set(names) == {"upper", "lower", "fail"}
        assert names["upper"].version == "1.2.0"
        assert names["upper"].description == "Upper-cases text"
        assert names["lower"].version == ""
        assert names["upper"].workers == 1
        info = await client.service_info("upper")
        assert info is not None
        assert info.version == "1.2.0"
        assert info.versions == ("1.2.0",)
        assert info.metadata == {"team": "text"}
        assert info.request_schema == {"type": "string"}
        assert info.response_schema == {"type": "string"}
        assert await client.service_info("nope") is None
        stats = await client.service_stats("upper")
        assert stats is not None
        assert stats.num_requests == 1
        assert stats.num_errors == 0
        assert stats.queued == 0
        assert stats.average_processing_time >= 0
        failed = await client.service_stats(b"fail")
        assert failed is not None and failed.num_errors == 1
        assert await client.service_stats("nope") is None
        # Without a name: every service's info, as a JSON list.
        every = json.loads((await client.request("mmi.info")).bytes)
        assert {e["name"] for e in every} == {"upper", "lower", "fail"}
        every = json.loads((await client.request("mmi.stats", b"")).bytes)
        assert {e["name"] for e in every} == {"upper", "lower", "fail"}


@pytest.fixture(params=[True, False], ids=["io_thread", "event_loop"])
def io_thread(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


async def test_per_service_concurrency() -> None:
    running = 0
    most = 0
    gate = anyio.Event()

    async def slow(request: dcp.HandlerRequest) -> bytes:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await gate.wait()
        running -= 1
        return b"ok"

    async with (
        Broker(EP["svc-conc"]),
        Worker(
            EP["svc-conc"],
            services={"slow": dcp.Service(slow, concurrency=2), "fast": upper},
        ) as worker,
        Client(EP["svc-conc"], timeout=5) as client,
        anyio.create_task_group() as tg,
    ):
        for _ in range(2):
            tg.start_soon(client.request, "slow", b"x")
        with anyio.fail_after(5):
            while running < 2:  # noqa: ASYNC110 - polling a local
                await anyio.sleep(0.01)
        # "slow" is at its own limit; "fast" still has its slot.
        assert (await client.request("fast", b"a")).bytes == b"A"
        # One more "slow" takes the free slot but waits for one of its service's own.
        tg.start_soon(client.request, "slow", b"x")
        with anyio.fail_after(5):
            while worker.statistics().in_progress < 3:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert running == 2
        gate.set()
    assert most == 2


async def test_watch_services() -> None:
    async with (
        Broker(EP["svc-watch"]),
        Client(EP["svc-watch"], timeout=5) as client,
    ):
        changes = client.watch_services(interval=0.05)
        async with Worker(EP["svc-watch"], "w1", upper):
            with anyio.fail_after(5):
                change = await anext(changes)
            assert change == dcp.ServiceChange("w1", True, 1)
        with anyio.fail_after(5):
            change = await anext(changes)
        assert change == dcp.ServiceChange("w1", False, 0)
        await changes.aclose()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="interval"):
        await anext(client.watch_services(interval=0))


async def test_approval_async_and_sync(io_thread: bool) -> None:
    seen: list[dcp.ApprovalRequest] = []

    async def approve(request: dcp.ApprovalRequest) -> dcp.Approval | bool | tuple[bool, str]:
        seen.append(request)
        await anyio.lowlevel.checkpoint()
        if request.service == b"denied":
            return dcp.Approval.deny("not on my broker")
        if request.info is not None and request.info.get("version") == "0.1.0":
            return False, "too old"
        return True

    async with Broker(EP["svc-approve"], approve=approve, io_thread=io_thread) as broker:
        async with Worker(EP["svc-approve"], services={"ok": UPPER}):
            assert seen[-1].service == b"ok"
            assert seen[-1].info is not None and seen[-1].info["version"] == "1.2.0"
            assert seen[-1].key is None
            assert len(seen[-1].routing_id) == 16
        with pytest.raises(RegistrationRefused, match="not on my broker") as refused:
            async with Worker(EP["svc-approve"], "denied", upper):
                pass  # pragma: no cover
        assert refused.value.service == "denied"
        old = dcp.Service(upper, version="0.1.0")
        with pytest.raises(RegistrationRefused, match="too old"):
            async with Worker(EP["svc-approve"], services={"old": old}):
                pass  # pragma: no cover
        assert broker.statistics().rejections["registration_refused"] == 2


async def test_approval_failures(caplog: pytest.LogCaptureFixture) -> None:
    def approve(request: dcp.ApprovalRequest) -> object:
        if request.service == b"raises":
            raise KeyError("boom")
        if request.service == b"weird":
            return "yes"
        return True

    async with Broker(EP["svc-approve2"], approve=approve):
        with caplog.at_level(logging.ERROR, "dcp.broker"):
            with pytest.raises(RegistrationRefused, match="approver failed"):
                async with Worker(EP["svc-approve2"], "raises", upper):
                    pass  # pragma: no cover
            with pytest.raises(RegistrationRefused, match="approver failed"):
                async with Worker(EP["svc-approve2"], "weird", upper):
                    pass  # pragma: no cover
        assert "KeyError" in caplog.text
        async with Worker(EP["svc-approve2"], "fine", upper):
            pass


async def test_approval_with_curve() -> None:
    server_public, server_secret = zmq.curve_keypair()
    public, secret = zmq.curve_keypair()
    keys: list[str | None] = []

    def approve(request: dcp.ApprovalRequest) -> bool:
        keys.append(request.key)
        return request.key == public.decode()

    other_public, other_secret = zmq.curve_keypair()
    # The allow-list lets both keys register; the approver then tells them apart.
    security = dcp.CurveServer(
        server_public,
        server_secret,
        clients=None,
        workers={b"curve": frozenset({public, other_public})},
    )
    async with Broker("tcp://127.0.0.1:0", security=security, approve=approve) as broker:
        endpoint = broker.endpoints[0]
        client_keys = dcp.CurveClient(server_public, public, secret)
        async with (
            Worker(endpoint, "curve", upper, security=client_keys),
            Client(endpoint, security=client_keys, timeout=5) as client,
        ):
            assert (await client.request("curve", b"a")).bytes == b"A"
        other = dcp.CurveClient(server_public, other_public, other_secret)
        with pytest.raises(RegistrationRefused):
            async with Worker(endpoint, "curve", upper, security=other):
                pass  # pragma: no cover
        assert keys == [public.decode(), other_public.decode()]


async def test_worker_arguments() -> None:
    with pytest.raises(TypeError, match="service and a handler"):
        Worker("inproc://x")
    with pytest.raises(TypeError, match="either"):
        Worker("inproc://x", "a", upper, services={"b": upper})
    with pytest.raises(ValueError, match="names no service"):
        Worker("inproc://x", services={})
    with pytest.raises(ValueError, match="twice"):
        Worker("inproc://x", services={"a": upper, b"a": upper})
    with pytest.raises(ValueError, match="SemVer"):
        dcp.Service(upper, version="1.0")
    with pytest.raises(ValueError, match="concurrency"):
        dcp.Service(upper, concurrency=0)
    assert dcp.Service(upper).info() is None


async def test_discovery_from_a_plain_broker_fails_clearly() -> None:
    """A broker that answers 501 (no discovery): a clear error, not a JSON one."""
    async with (
        Broker(EP["svc-501"]),
        Client(EP["svc-501"], timeout=5) as client,
    ):
        assert (await client.request("mmi.nothing")).data == (b"501",)
        # mmi.describe with bad info: 400, counted.
        assert (await client.request("mmi.describe", b"s", b"[]")).data == (b"400",)
        assert (await client.request("mmi.describe", b"s")).data == (b"400",)


async def test_services_lists_every_service_page_by_page() -> None:
    """More services than one page holds (directory Rule D6): ``Client.services()`` asks
    page after page and returns each service once."""
    names = [f"made-up-{n:04d}" for n in range(PAGE_ENTRIES + 20)]
    async with (
        Broker(EP["svc-pages"]) as broker,
        Client(EP["svc-pages"], timeout=5) as client,
    ):
        with Peers(EP["svc-pages"]) as peers:
            queuer = peers(b"queuer")
            for n, name in enumerate(names):  # one queued request makes each known
                queuer.send_frames(serialize(Request(name.encode(), None, (b"%d" % n,), ())))
            with anyio.fail_after(10):
                while len(broker.statistics().services) < len(names):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            first = await client.request("mmi.services")
            assert len(first.data) == 2  # a page and its cursor: there is more
            listed = await client.services()
        assert [s.name for s in listed] == names
        assert all(s.queued == 1 and s.workers == 0 for s in listed)
