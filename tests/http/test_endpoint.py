"""The broker's HTTP endpoint (``dcp/_http``, ``docs/operations.md``): metrics equal to the
traffic sent, the ``/status`` schema, paging, the bearer token, the endpoint's lifetime, the
command line. Real zmq sockets and a real HTTP server on 127.0.0.1 (port 0), both backends."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

import dcp
from dcp._stats import DURATION_BUCKETS
from tests.cli.procs import Proc, run, start

pytestmark = pytest.mark.anyio


def fetch(
    address: str, path: str, *, token: str | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request (blocking): status, headers, body."""
    request = urllib.request.Request(f"http://{address}{path}", method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()


async def get(address: str, path: str, **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
    return await anyio.to_thread.run_sync(lambda: fetch(address, path, **kwargs))


async def get_json(address: str, path: str) -> Any:
    code, headers, body = await get(address, path)
    assert code == 200, body
    assert headers["content-type"] == "application/json"
    return json.loads(body)


async def handler(request: dcp.HandlerRequest) -> list[bytes]:
    if request.data and request.data[0] == b"fail":
        raise ValueError("asked to fail")
    return [b"ok"]


@asynccontextmanager
async def broker_and_worker(
    *services: str, **options: Any
) -> AsyncIterator[tuple[dcp.Broker, str]]:
    """A broker with HTTP on a free port, and one worker per service; yields the broker and
    its zmq endpoint once the workers are registered."""
    async with dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0", **options) as broker:
        endpoint = broker.endpoints[0]
        async with anyio.create_task_group() as tg:
            for service in services:
                tg.start_soon(dcp.Worker(endpoint, service, handler).serve)
            with anyio.fail_after(10):
                while broker.statistics().workers < len(services):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            yield broker, endpoint
            tg.cancel_scope.cancel()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_equal_the_traffic_sent() -> None:
    ok, failed, refused = 7, 3, 2
    async with broker_and_worker("echo", "other") as (broker, endpoint):
        assert broker.http_address is not None
        async with dcp.Client(endpoint) as client:
            for _ in range(ok):
                await client.request("echo", b"hello")
            for _ in range(failed):
                with pytest.raises(dcp.RemoteError):
                    await client.request("echo", b"fail")
            for _ in range(refused):
                with pytest.raises(dcp.NoWorkers):
                    await client.request("nobody", b"x", no_wait=True)
        code, headers, body = await get(broker.http_address, "/metrics")
    assert code == 200
    assert headers["content-type"].startswith("text/plain; version=")
    got = samples(body.decode())
    echo = (("service", "echo"),)
    other = (("service", "other"),)
    total = ok + failed
    assert got["dcp_service_requests_total", echo] == total
    assert got["dcp_service_replies_total", echo] == total
    assert got["dcp_service_errors_total", echo] == failed
    assert got["dcp_service_redeliveries_total", echo] == 0
    assert got["dcp_service_requests_total", other] == 0
    assert got["dcp_service_queue_depth", echo] == 0
    assert got["dcp_service_oldest_queued_age_seconds", echo] == 0
    assert got["dcp_service_workers", (("service", "echo"), ("state", "idle"))] == 1
    assert got["dcp_service_workers", (("service", "echo"), ("state", "busy"))] == 0
    assert got["dcp_service_request_duration_seconds_count", echo] == total
    assert got["dcp_service_request_duration_seconds_bucket", (("le", "+Inf"), *echo)] == total
    buckets = [
        got["dcp_service_request_duration_seconds_bucket", (("le", repr(b)), *echo)]
        for b in DURATION_BUCKETS
    ]
    assert buckets == sorted(buckets) and buckets[-1] <= total
    assert got["dcp_service_request_duration_seconds_sum", echo] > 0
    assert got["dcp_broker_requests_total", ()] == total
    assert got["dcp_broker_replies_total", ()] == total
    assert got["dcp_broker_dispatched_total", ()] == total
    assert got["dcp_broker_rejections_total", (("reason", "no_workers"),)] == refused
    assert got["dcp_broker_peers", (("dialect", "DCP/1"), ("kind", "worker"))] == 2
    assert got["dcp_broker_workers", ()] == 2
    assert got["dcp_build_info", (("version", dcp.__version__),)] == 1
    assert got["dcp_broker_uptime_seconds", ()] >= 0


def test_snapshot_counts_redeliveries_and_durations() -> None:
    """The core's per-service redeliveries and duration buckets, through ``snapshot`` (a
    worker that leaves holding a request; answers of known processing times)."""
    from dcp._core.broker.core import BrokerCore
    from dcp.wire.dcp1 import serialize
    from dcp.wire.messages import Reconnect, Register, Reply, Request

    core = BrokerCore()
    core.receive([b"w1", *serialize(Register(b"svc"))], 0.0)
    core.receive([b"c1", *serialize(Request(b"svc", data=(b"a",)))], 1.0)
    core.receive([b"w1", *serialize(Reconnect())], 2.0)  # leaves holding it: redelivered
    core.receive([b"w2", *serialize(Register(b"svc"))], 3.0)
    core.receive([b"w2", *serialize(Reply(client=b"c1", data=(b"ok",)))], 3.002)
    core.receive([b"c1", *serialize(Request(b"svc", data=(b"b",)))], 4.0)
    core.receive([b"w2", *serialize(Reply(client=b"c1", data=(b"ok",)))], 104.0)
    core.receive([b"c2", *serialize(Request(b"none", data=(b"c",)))], 104.5)  # queued
    snap = core.snapshot(105.0, peers=True)
    svc, none = sorted(snap.services, key=lambda s: s.name)[::-1]
    assert (none.name, none.queued, none.oldest_queued_age) == ("none", 1, 0.5)
    assert (svc.name, svc.requests, svc.replies, svc.redeliveries) == ("svc", 2, 2, 1)
    assert svc.durations[DURATION_BUCKETS.index(0.0025)] == 1  # 2 ms
    assert svc.durations[-1] == 1  # 100 s: past the last bound
    assert sum(svc.durations) == 2
    assert svc.processing_time == pytest.approx(100.002)
    assert [w.id for w in snap.workers] == [b"w2".hex()]
    assert snap.peers == {("worker", "DCP/1"): 1, ("client", "DCP/1"): 1}
    assert [(c.id, c.inflight, c.queued) for c in snap.clients] == [(b"c2".hex(), 1, 1)]


def check_page(page: Any, fields: dict[str, type]) -> None:
    assert set(page) == {"total", "offset", "limit", "sort", "items"}
    assert isinstance(page["total"], int) and isinstance(page["items"], list)
    for item in page["items"]:
        assert set(item) == set(fields), item
        for name, kind in fields.items():
            assert isinstance(item[name], kind), (name, item)


SERVICE_FIELDS: dict[str, type] = {
    "name": str,
    "workers": int,
    "idle": int,
    "busy": int,
    "queued": int,
    "oldest_queued_age": float,
    "requests": int,
    "replies": int,
    "errors": int,
    "redeliveries": int,
    "processing_time": float,
    "average_processing_time": float,
    "durations": dict,
    "version": str,
    "description": str,
}
WORKER_FIELDS: dict[str, type] = {
    "id": str,
    "dialect": str,
    "services": list,
    "held": int,
    "credit": int,
    "silent": float,
}
CLIENT_FIELDS: dict[str, type] = {"id": str, "dialect": str, "inflight": int, "queued": int}


async def test_status_schema_and_paging() -> None:
    async with broker_and_worker("a", "b", "c") as (broker, endpoint):
        assert broker.http_address is not None
        address = broker.http_address
        async with dcp.Client(endpoint) as client:
            for service, count in (("a", 1), ("b", 3), ("c", 2)):
                for _ in range(count):
                    await client.request(service, b"x")
        doc = await get_json(address, "/status")
        assert set(doc) == {
            "version",
            "now",
            "started",
            "uptime",
            "endpoints",
            "counters",
            "rejections",
            "http_refused",
            "memory",
            "peers",
            "services",
            "workers",
            "clients",
        }
        assert doc["version"] == dcp.__version__
        assert doc["endpoints"] == [endpoint]
        assert doc["uptime"] >= 0 and doc["now"] >= doc["started"]
        assert doc["counters"]["requests"] == 6 and doc["counters"]["replies"] == 6
        assert all(isinstance(v, int) for v in doc["counters"].values())
        assert doc["peers"] == [{"kind": "worker", "dialect": "DCP/1", "count": 3}]
        check_page(doc["services"], SERVICE_FIELDS)
        check_page(doc["workers"], WORKER_FIELDS)
        check_page(doc["clients"], CLIENT_FIELDS)
        assert [s["name"] for s in doc["services"]["items"]] == ["a", "b", "c"]
        assert doc["services"]["items"][1]["durations"] == {
            "buckets": list(DURATION_BUCKETS),
            "counts": doc["services"]["items"][1]["durations"]["counts"],
        }
        assert sum(doc["services"]["items"][1]["durations"]["counts"]) == 3
        assert doc["workers"]["total"] == 3 and doc["clients"]["total"] == 0

        busiest = await get_json(address, "/status/services?sort=-requests&limit=2")
        assert [s["name"] for s in busiest["items"]] == ["b", "c"]
        assert (busiest["total"], busiest["limit"], busiest["sort"]) == (3, 2, "-requests")
        rest = await get_json(address, "/status/services?sort=-requests&limit=2&offset=2")
        assert [s["name"] for s in rest["items"]] == ["a"]
        workers = await get_json(address, "/status/workers?sort=id&peers=0")
        check_page(workers, WORKER_FIELDS)
        assert sorted(w["services"] for w in workers["items"]) == [["a"], ["b"], ["c"]]
        # On /status, a sort field applies to the lists that have it.
        held = await get_json(address, "/status?sort=-held")
        assert held["workers"]["sort"] == "-held" and held["services"]["sort"] == "name"
        light = await get_json(address, "/status?peers=0")
        assert light["workers"] == {
            "total": 3,
            "offset": 0,
            "limit": 0,
            "sort": "id",
            "items": [],
        }
        assert light["clients"]["total"] == 0 and light["services"] == doc["services"]
        for bad in ("?limit=x", "?offset=-1", "?sort=nope", "?limit=100001", "?peers=2"):
            code, _, body = await get(address, f"/status{bad}")
            assert code == 400, (bad, body)
        code, _, _ = await get(address, "/status/services?sort=held")
        assert code == 400
        code, _, _ = await get(address, "/status/nothing")
        assert code == 404


async def test_paths_methods_and_the_page() -> None:
    async with dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0", io_thread=False) as broker:
        address = broker.http_address
        assert address is not None
        code, headers, body = await get(address, "/")
        assert code == 200 and headers["content-type"] == "text/html; charset=utf-8"
        assert b'fetch("/status' in body
        code, _, body = await get(address, "/", method="HEAD")
        assert code == 200 and body == b""
        code, _, _ = await get(address, "/nowhere")
        assert code == 404
        code, headers, _ = await get(address, "/metrics", method="POST")
        assert code == 405 and headers["allow"] == "GET, HEAD"
        doc = await get_json(address, "/status")
        assert doc["services"]["total"] == 0


async def test_a_trailing_slash_is_ignored_on_every_path() -> None:
    """One rule for every path: ``/metrics/`` is ``/metrics``, ``/status/`` is ``/status``."""
    async with dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0", io_thread=False) as broker:
        address = broker.http_address
        assert address is not None
        for path in ("/metrics", "/status", "/status/services", "/status/workers"):
            plain, slash = await get(address, path), await get(address, path + "/")
            assert plain[0] == slash[0] == 200, path
            assert plain[1]["content-type"] == slash[1]["content-type"], path
        _, _, metrics = await get(address, "/metrics/")
        assert b"dcp_broker_requests_total 0" in metrics
        assert (await get_json(address, "/status/services/"))["total"] == 0
        for path in ("/nowhere/", "/status/nothing/", "/metrics//"):
            assert (await get(address, path))[0] == 404, path


async def test_token_is_required_everywhere() -> None:
    token = "s3cret-token"
    async with dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0", http_token=token) as broker:
        address = broker.http_address
        assert address is not None
        for path in ("/metrics", "/status", "/status/workers", "/", "/nowhere"):
            code, headers, _ = await get(address, path)
            assert code == 401, path
            assert headers["www-authenticate"] == "Bearer"
            code, _, _ = await get(address, path, token="wrong")
            assert code == 401, path
        for path in ("/metrics", "/status", "/"):
            code, _, _ = await get(address, path, token=token)
            assert code == 200, path
        # The page (only) may be opened with ?token= (a browser cannot send the header).
        assert (await get(address, f"/?token={token}"))[0] == 200
        code, headers, body = await get(address, "/?token=wrong")
        assert code == 401 and headers["content-type"].startswith("text/html")
        assert b"sessionStorage" in body
        assert (await get(address, f"/status?token={token}"))[0] == 401


async def test_http_server_stops_with_the_broker() -> None:
    broker = dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0")
    async with anyio.create_task_group() as tg:
        await tg.start(broker.serve)
        address = broker.http_address
        assert address is not None
        assert (await get(address, "/metrics"))[0] == 200
        tg.cancel_scope.cancel()
    assert broker.http_address is None
    assert address is not None
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect((host, int(port)))


async def test_broker_stops_with_a_keep_alive_connection_open() -> None:
    """A browser keeps its connection open: cancelling the broker still stops the endpoint
    (promptly) and closes its port."""
    broker = dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(broker.serve)
            address = broker.http_address
            assert address is not None
            host, port = address.rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            try:

                def ask() -> int:
                    conn.request("GET", "/status")
                    response = conn.getresponse()
                    response.read()
                    return response.status

                assert await anyio.to_thread.run_sync(ask) == 200
                assert await anyio.to_thread.run_sync(ask) == 200  # the same connection
                tg.cancel_scope.cancel()
            finally:
                conn.close()
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect((host, int(port)))


def test_ab_benchmark_scrapes_the_http_side() -> None:
    """``benchmarks.ab`` with broker arguments for one side and a /metrics scraper."""
    command = [sys.executable, "-m", "benchmarks.ab", "--rounds", "1", "--windows", "4"]
    command += ["--count", "100000", "--duration", "1", "--scrape-interval", "0.2"]
    command += ["--head-args", "--http 127.0.0.1:0"]
    done = subprocess.run(
        command,
        cwd=Path(__file__).resolve().parents[2],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    head = [line for line in done.stderr.splitlines() if " head: " in line]
    base = [line for line in done.stderr.splitlines() if " base: " in line]
    assert head and base
    assert int(head[0].rsplit("scrapes ", 1)[1]) >= 1
    assert base[0].endswith("scrapes 0")
    assert "/metrics every 0.2 s" in done.stdout


async def test_http_bind_error_stops_the_broker_before_it_is_ready() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = dcp.Broker("tcp://127.0.0.1:0", http=f"127.0.0.1:{port}")
        with pytest.raises(OSError, match="in use"):
            async with broker:
                pass  # pragma: no cover - never reached
    assert broker.endpoints == [] and broker.http_address is None


@pytest.mark.parametrize(
    ("address", "options", "message"),
    [
        ("10.1.2.3:80", {}, "not a loopback address"),
        ("example.com:80", {}, "not a loopback address"),
        ("127.0.0.1", {}, "not HOST:PORT"),
        ("127.0.0.1:99999", {}, "port 99999 is out of range"),
        (":80", {}, "not HOST:PORT"),
        ("127.0.0.1:0", {"http_token": "  "}, "token is empty"),
    ],
)
def test_bad_http_options_are_refused(address: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dcp.Broker("tcp://127.0.0.1:0", http=address, **options)


def test_public_and_ipv6_addresses() -> None:
    from dcp._http import http_options

    assert http_options("0.0.0.0:8222", public=True).host == "0.0.0.0"
    assert http_options("[::1]:0").host == "::1"
    assert http_options("localhost:0", token=" t ").token == "t"


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hypercorn", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'dagbox-dcp\[http\]'"):
        dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0")


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_cli_http_on_a_free_port(procs: list[Proc], tmp_path: Path, backend: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t0k3n\n")
    broker = start(
        procs, "--backend", backend, "broker", "--bind", "tcp://127.0.0.1:0",
        "--http", "127.0.0.1:0", "--http-token-file", str(token_file), "-v",
    )  # fmt: skip
    _, url = broker.read_lines(2)
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/")
    address = url[len("http://") : -1]
    assert fetch(address, "/metrics")[0] == 401
    code, _, body = fetch(address, "/metrics", token="t0k3n")
    assert code == 200 and b"dcp_build_info" in body
    broker.popen.terminate()
    code, _, err = broker.finish(10)
    assert code == 0 and "Traceback" not in err
    assert f"HTTP endpoint on http://{address}/" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--http", "192.0.2.1:8222"], "not a loopback address"),
        (["--http", "8222"], "not HOST:PORT"),
        (["--http-token", "x"], "need --http"),
        (["--http", "127.0.0.1:0", "--http-token-file", "/no/such/file"], "cannot read"),
        (["--http", "127.0.0.1:0", "--http-token-file", "/dev/null"], "is empty"),
        (["--http", "no.such.host.invalid:80", "--http-public"], "cannot serve HTTP on"),
    ],
)
def test_cli_bad_http_options(args: list[str], message: str) -> None:
    code, out, err = run("broker", "--bind", "tcp://127.0.0.1:0", *args)
    assert out == ""
    assert code in (1, 2)
    assert message in err and "Traceback" not in err


def test_cli_without_the_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dcp._cli import main

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    assert main(["broker", "--bind", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "pip install 'dagbox-dcp[http]'" in err and "Traceback" not in err
