"""The HTTP endpoint against a hostile reader (``docs/security.md``): no full routing id on
any path (status Rule HS3), the ``Host`` header checked (address Rule HB4, app Rule HA3), the
byte budget's figures shown (metrics Rule HM3, status Rule HS4). Real zmq sockets and a real
HTTP server on 127.0.0.1 (port 0), both backends."""

from __future__ import annotations

import http.client
import json
import re
from typing import Any

import anyio
import pytest

import dcp
from dcp._http.address import HostCheck, http_options
from dcp._http.status import PeerTags
from tests.http.test_endpoint import get, samples

pytestmark = pytest.mark.anyio


def fetch_as(address: str, path: str, host: str, *, token: str | None = None) -> tuple[int, bytes]:
    """One GET with this ``Host`` header (blocking)."""
    name, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(name, int(port), timeout=10)
    headers = {"Host": host}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def get_as(address: str, path: str, host: str, **kwargs: Any) -> tuple[int, bytes]:
    return await anyio.to_thread.run_sync(lambda: fetch_as(address, path, host, **kwargs))


async def hold(request: dcp.HandlerRequest) -> list[bytes]:
    await anyio.sleep_forever()
    raise AssertionError  # pragma: no cover


async def test_no_page_shows_a_whole_routing_id() -> None:
    """A worker and a client with a request in flight: their routing ids appear nowhere, not
    even in part (8 bytes of one); each has a tag of 8 hex digits."""
    async with dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0", io_thread=False) as broker:
        address = broker.http_address
        assert address is not None
        endpoint = broker.endpoints[0]
        async with anyio.create_task_group() as tg:
            tg.start_soon(dcp.Worker(endpoint, "slow", hold).serve)
            with anyio.fail_after(10):
                while not broker.statistics().workers:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            async with dcp.Client(endpoint) as client:
                tg.start_soon(client.request, "slow", b"x")
                with anyio.fail_after(10):
                    while not broker.statistics().clients:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                snap = broker._core.snapshot(0.0, peers=True)
                ids = [w.id for w in snap.workers] + [c.id for c in snap.clients]
                assert len(ids) == 2 and all(len(i) >= 10 for i in ids)  # hex of >= 5 bytes
                bodies: dict[str, str] = {}
                for path in (
                    "/status",
                    "/status/workers",
                    "/status/clients",
                    "/status/workers?sort=-id",
                    "/metrics",
                    "/",
                ):
                    code, _, raw = await get(address, path)
                    assert code == 200, path
                    bodies[path] = raw.decode()
                tg.cancel_scope.cancel()
    for path, body in bodies.items():
        for ident in ids:
            assert ident[:16] not in body, path  # not even the 8 bytes logs show
    doc = json.loads(bodies["/status"])
    tags = [w["id"] for w in doc["workers"]["items"]] + [c["id"] for c in doc["clients"]["items"]]
    assert len(tags) == 2 and all(re.fullmatch("[0-9a-f]{8}", t) for t in tags), tags
    listed = json.loads(bodies["/status/workers"])["items"][0]["id"]
    assert listed == doc["workers"]["items"][0]["id"]  # the same tag on every path


def test_tags_are_keyed_stable_and_short() -> None:
    ident = bytes(range(16)).hex()
    one, other = PeerTags(b"k" * 16), PeerTags(b"j" * 16)
    assert one.tag(ident) == one.tag(ident) != other.tag(ident)
    assert len(one.tag(ident)) == 8 and one.tag(ident) not in ident
    assert PeerTags().tag(ident) != PeerTags().tag(ident)  # a random key each time


@pytest.mark.parametrize("token", [None, "t0k3n"])
async def test_a_foreign_host_header_gets_421_on_every_path(token: str | None) -> None:
    """DNS rebinding: a page whose own name resolves to 127.0.0.1 sends that name; it gets
    421 whatever the path, before the token is looked at, counted."""
    async with dcp.Broker(
        "tcp://127.0.0.1:0",
        http="127.0.0.1:0",
        http_token=token,
        http_hosts=["dcp.internal", "proxy.example:443"],
        io_thread=False,
    ) as broker:
        address = broker.http_address
        assert address is not None
        port = address.rsplit(":", 1)[1]
        paths = ("/", "/status", "/status/clients", "/metrics", "/nowhere")
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.2", f"localhost:{port}1"):
            for path in paths:
                code, body = await get_as(address, path, host, token=token)
                assert code == 421, (host, path, body)
        for host in (
            address,
            "127.0.0.1",
            f"localhost:{port}",
            "LOCALHOST",
            "dcp.internal",
            "dcp.internal:8080",
            "proxy.example:443",
        ):
            code, body = await get_as(address, "/status", host, token=token)
            assert code == 200, (host, body)
        code, _ = await get_as(address, "/status", "proxy.example:80", token=token)
        assert code == 421
        _, _, metrics = await get(address, "/metrics", token=token)
        got = samples(metrics.decode())
        assert got["dcp_http_refused_total", (("reason", "misdirected"),)] == 4 * len(paths) + 1
        _, _, body = await get(address, "/status", token=token)
        assert json.loads(body)["http_refused"]["misdirected"] == 4 * len(paths) + 1


def test_host_check_rules() -> None:
    def check(bound: str, address: str, **options: Any) -> HostCheck:
        return HostCheck(http_options(bound, **options), address)

    loopback = check("127.0.0.1:0", "127.0.0.1:8222")
    assert loopback.allows(None)  # HTTP/1.0 without Host: not a browser
    for ok in (b"127.0.0.1:8222", b"127.0.0.1", b"localhost", b"Localhost:8222"):
        assert loopback.allows(ok), ok
    for bad in (b"evil.example", b"127.0.0.1:8223", b"10.0.0.1", b"\xff", b"localhost:", b""):
        assert not loopback.allows(bad), bad
    v6 = check("[::1]:0", "[::1]:9000")
    assert v6.allows(b"[::1]:9000") and v6.allows(b"localhost:9000")
    assert not v6.allows(b"[::2]:9000")
    wildcard = check("0.0.0.0:8222", "0.0.0.0:8222", public=True)
    assert wildcard.allows(b"192.0.2.7:8222") and wildcard.allows(b"[2001:db8::1]:8222")
    assert not wildcard.allows(b"rebind.example:8222")
    named = check("localhost:0", "127.0.0.1:8000", hosts=("dcp.lan",))
    assert named.allows(b"localhost:8000") and named.allows(b"dcp.lan:1234")
    with pytest.raises(ValueError, match="not NAME or NAME:PORT"):
        http_options("127.0.0.1:0", hosts=("http://x/",))


async def test_budget_figures_on_metrics_and_status() -> None:
    """Every account's used/peak/limit/refused, from a core whose accounts are charged
    directly (the parts that charge them are not this test's)."""
    async with dcp.Broker(
        "tcp://127.0.0.1:0", http="127.0.0.1:0", io_thread=False, max_memory=1_000_000
    ) as broker:
        address = broker.http_address
        assert address is not None
        queued = broker._core.memory.account("queued")
        assert queued.charge(b"p1", 5_000) and queued.charge(b"p2", 7_000)
        queued.release(b"p2", 7_000)
        assert not queued.charge(b"p1", 400_000)  # past its share: refused, counted
        _, _, metrics = await get(address, "/metrics")
        _, _, status = await get(address, "/status")
        _, _, page = await get(address, "/")
    got = samples(metrics.decode())
    q = (("account", "queued"),)
    assert got["dcp_broker_max_memory_bytes", ()] == 1_000_000
    assert got["dcp_broker_memory_bytes", q] == 5_000
    assert got["dcp_broker_memory_peak_bytes", q] == 12_000
    assert got["dcp_broker_memory_limit_bytes", q] == 350_000
    assert got["dcp_broker_memory_peer_limit_bytes", q] == 87_500
    assert got["dcp_broker_memory_refused_total", q] == 1
    r = (("account", "replies"),)
    assert got["dcp_broker_memory_bytes", r] == 0
    assert got["dcp_broker_memory_refused_total", r] == 0
    memory = json.loads(status)["memory"]
    assert memory["max_memory"] == 1_000_000
    accounts = {a["name"]: a for a in memory["accounts"]}
    assert set(accounts) >= {"queued", "replies", "streams", "subscriptions", "directory"}
    assert accounts["queued"] == {
        "name": "queued",
        "used": 5_000,
        "peak": 12_000,
        "limit": 350_000,
        "peer_limit": 87_500,
        "peers": 1,
        "refused": 1,
    }
    assert b'id="memory"' in page


async def test_no_budget_has_no_limits() -> None:
    async with dcp.Broker(
        "tcp://127.0.0.1:0", http="127.0.0.1:0", io_thread=False, max_memory=None
    ) as broker:
        address = broker.http_address
        assert address is not None
        _, _, metrics = await get(address, "/metrics")
        _, _, status = await get(address, "/status")
    got = samples(metrics.decode())
    assert not any(name.startswith("dcp_broker_memory_limit") for name, _ in got)
    assert ("dcp_broker_max_memory_bytes", ()) not in got
    assert got["dcp_broker_memory_bytes", (("account", "queued"),)] == 0
    memory = json.loads(status)["memory"]
    assert memory["max_memory"] is None
    assert all(a["limit"] is None for a in memory["accounts"])
