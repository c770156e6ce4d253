"""OpenTelemetry tracing (docs/tracing.md, dcp/_io/tracing.py) on real tcp sockets, on both
anyio backends: one trace across client -> worker A -> (forward) worker B, error and timeout
status, what travels on the wire with tracing on and off, plain DCP and Majordomo peers,
streams, ``map`` and cancellation.

Each test makes its own ``TracerProvider`` and passes it explicitly (``tracing=provider``):
the global provider can be set only once per process.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import dcp
from dcp._io.tracing import trace_options
from dcp._models import Handler
from dcp.wire import mdp
from dcp.wire.options import OPTION_PREFIX, REQUEST_ID_PREFIX, without_options
from tests.bench.run import run_module
from tests.fakes import RawWorker
from tests.helpers import Peers
from tests.integration.test_end_to_end import HB, eventually, fast_broker

pytestmark = pytest.mark.anyio

TRACEPARENT = OPTION_PREFIX + b"traceparent="


class Traced:
    """A provider with an in-memory exporter."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self) -> dict[str, ReadableSpan]:
        spans = self.exporter.get_finished_spans()
        named = {span.name: span for span in spans}
        assert len(named) == len(spans), [s.name for s in spans]
        return named

    def tracer(self) -> trace.Tracer:
        return self.provider.get_tracer("test")


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.provider.shutdown()


def worker(endpoint: str, service: str, handler: Handler, tracing: object = False) -> dcp.Worker:
    return dcp.Worker(
        endpoint,
        service,
        handler,
        heartbeat_interval=HB,
        liveness=3,
        reconnect_min=0.05,
        reconnect_max=0.2,
        tracing=tracing,  # type: ignore[arg-type]
    )


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def traceparent(ctx: trace.SpanContext) -> bytes:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}".encode()


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


async def test_one_trace_across_a_forward(traced: Traced) -> None:
    seen: list[dcp.HandlerRequest] = []

    async def first(request: dcp.HandlerRequest) -> dcp.Forward:
        seen.append(request)
        with traced.tracer().start_as_current_span("inside a"):
            return dcp.Forward("b", request.data[0] + b"!")

    def second(request: dcp.HandlerRequest) -> bytes:  # a plain def: runs in a thread
        seen.append(request)
        with traced.tracer().start_as_current_span("inside b"):
            return request.data[0].upper()

    p = traced.provider
    async with (
        fast_broker() as broker,
        worker(broker.endpoints[0], "a", first, p),
        worker(broker.endpoints[0], "b", second, p),
        dcp.Client(broker.endpoints[0], timeout=5, tracing=p) as client,
    ):
        with traced.tracer().start_as_current_span("caller"):
            response = await client.request("a", b"hi", metadata=[b"mine"])
        assert response.data == (b"HI!",)
        assert response.metadata == (b"mine",)
        # The broker matched the forward with the request it finished (routing Rule R2).
        assert broker.statistics().unmatched == 0
        endpoint = broker.endpoints[0]
    spans = traced.spans()
    assert {s: spans[s].kind for s in spans} == {
        "caller": SpanKind.INTERNAL,
        "a request": SpanKind.CLIENT,
        "a handle": SpanKind.SERVER,
        "inside a": SpanKind.INTERNAL,
        "b forward": SpanKind.PRODUCER,
        "b handle": SpanKind.SERVER,
        "inside b": SpanKind.INTERNAL,
    }
    assert len({trace_id(s) for s in spans.values()}) == 1
    chain = ["caller", "a request", "a handle", "b forward", "b handle", "inside b"]
    for parent, child in itertools.pairwise(chain):
        assert parent_of(spans[child]) == span_id(spans[parent]), child
    assert parent_of(spans["inside a"]) == span_id(spans["a handle"])
    assert spans["a request"].attributes == {
        "rpc.system": "dcp",
        "rpc.service": "a",
        "dcp.endpoint": endpoint,
    }
    assert spans["a handle"].attributes is not None
    assert spans["a handle"].attributes["dcp.forward.service"] == "b"
    assert all(s.status.status_code is StatusCode.UNSET for s in spans.values())
    # Handlers see their own metadata only; the trace options are dcp's.
    a_seen, b_seen = seen
    assert a_seen.metadata == b_seen.metadata == (b"mine",)
    a_trace = [p for p in a_seen.dcp_metadata if p.startswith(TRACEPARENT)]
    b_trace = [p for p in b_seen.dcp_metadata if p.startswith(TRACEPARENT)]
    assert len(a_trace) == len(b_trace) == 1
    # The broker passed the client's option through untouched; the forward carried its own.
    client_ctx = spans["a request"].context
    forward_ctx = spans["b forward"].context
    assert client_ctx is not None and forward_ctx is not None
    assert a_trace[0] == TRACEPARENT + traceparent(client_ctx)
    assert b_trace[0] == TRACEPARENT + traceparent(forward_ctx)
    # The id still comes first: the client matches the final reply by it.
    assert a_seen.dcp_metadata[0].startswith(REQUEST_ID_PREFIX)
    assert b_seen.dcp_metadata[0] == a_seen.dcp_metadata[0]


async def test_error_reply_and_timeout_mark_the_client_span(traced: Traced) -> None:
    async def fails(request: dcp.HandlerRequest) -> bytes:
        raise ValueError("no")

    p = traced.provider
    async with (
        fast_broker() as broker,
        worker(broker.endpoints[0], "fails", fails, p),
        dcp.Client(broker.endpoints[0], timeout=5, tracing=p) as client,
    ):
        with pytest.raises(dcp.RemoteError):
            await client.request("fails", b"x")
        with pytest.raises(dcp.RequestTimeout):
            await client.request("nobody", b"x", timeout=0.3, retries=0)
    spans = traced.spans()
    failed = spans["fails request"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes["dcp.error.code"] == "handler_error"
    assert [e.name for e in failed.events] == ["exception"]
    handled = spans["fails handle"]
    assert handled.status.status_code is StatusCode.ERROR
    assert handled.status.description == "handler_error: ValueError: no"
    timed_out = spans["nobody request"]
    assert timed_out.status.status_code is StatusCode.ERROR
    assert timed_out.attributes is not None
    assert timed_out.attributes["error.type"] in ("RequestTimeout", "NoWorkers")


async def test_tracing_off_puts_nothing_on_the_wire(traced: Traced) -> None:
    seen: list[dcp.HandlerRequest] = []

    async def record(request: dcp.HandlerRequest) -> dcp.Forward | bytes:
        seen.append(request)
        return dcp.Forward("b", b"x") if request.service == "a" else b"ok"

    async with (
        fast_broker() as broker,
        worker(broker.endpoints[0], "a", record),
        worker(broker.endpoints[0], "b", record),
        dcp.Client(broker.endpoints[0], timeout=5) as client,
    ):
        # Even inside a recording span of the caller's: an untraced client sends nothing.
        with traced.tracer().start_as_current_span("caller"):
            assert (await client.request("a", b"x")).data == (b"ok",)
            assert (await client.request("b", b"x")).data == (b"ok",)
    assert len(seen) == 3
    for request in seen:
        assert not any(p.startswith(TRACEPARENT) for p in request.dcp_metadata)
        assert trace_options(request.dcp_metadata) == []
    assert [s.name for s in traced.exporter.get_finished_spans()] == ["caller"]


async def test_an_untraced_worker_forwards_the_context_unchanged(traced: Traced) -> None:
    """A worker without tracing passes the metadata on as it came (the next traced worker
    continues the client's span directly)."""

    async def first(request: dcp.HandlerRequest) -> dcp.Forward:
        return dcp.Forward("b", b"x")

    async def second(request: dcp.HandlerRequest) -> bytes:
        return b"ok"

    p = traced.provider
    async with (
        fast_broker() as broker,
        worker(broker.endpoints[0], "a", first),
        worker(broker.endpoints[0], "b", second, p),
        dcp.Client(broker.endpoints[0], timeout=5, tracing=p) as client,
    ):
        assert (await client.request("a", b"x")).data == (b"ok",)
    spans = traced.spans()
    assert set(spans) == {"a request", "b handle"}
    assert parent_of(spans["b handle"]) == span_id(spans["a request"])


async def test_plain_dcp_worker_answers_a_traced_request(traced: Traced) -> None:
    async with fast_broker() as broker:
        with RawWorker(broker.endpoints[0], b"echo") as raw:
            await eventually(raw.registered.is_set)
            async with dcp.Client(
                broker.endpoints[0], timeout=5, tracing=traced.provider
            ) as client:
                response = await client.request("echo", b"hi", metadata=[b"m"])
    assert response.data == (b"hi",)
    assert response.metadata == (b"m",)
    assert traced.spans()["echo request"].status.status_code is StatusCode.UNSET


async def test_majordomo_peers_are_unaffected(traced: Traced) -> None:
    """A traced client's request to an MDP worker: the worker sees the body only. An MDP
    client's request to a traced worker: a new trace, answered as usual."""

    async def upper(request: dcp.HandlerRequest) -> bytes:
        return request.data[0].upper()

    p = traced.provider
    async with (
        fast_broker() as broker,
        worker(broker.endpoints[0], "upper", upper, p),
        dcp.Client(broker.endpoints[0], timeout=5, tracing=p) as client,
    ):
        with Peers(broker.endpoints[0]) as peers:
            mdp_worker = peers(b"W-mdp")
            mdp_worker.send_frames([b"", b"MDPW01", b"\x01", b"mdp"])
            await eventually(lambda: broker.statistics().workers >= 2)
            async with anyio.create_task_group() as tg:
                results: list[dcp.Response] = []

                async def call() -> None:
                    results.append(await client.request("mdp", b"body"))

                tg.start_soon(call)
                # The broker heartbeats the idle worker until the request comes.
                heartbeat = mdp.peer(mdp.Form.V01, envelope=True, worker=True).worker_heartbeat()
                frames = await mdp_worker.recv_frames(skip=[heartbeat])
                assert frames[:3] == [b"", b"MDPW01", b"\x02"]
                assert frames[4:] == [b"", b"body"]
                mdp_worker.send_frames([*frames[:2], b"\x03", frames[3], b"", b"done"])
            assert results[0].data == (b"done",)
            mdp_client = peers(b"C-mdp")
            mdp_client.send_frames([b"", b"MDPC01", b"upper", b"abc"])
            assert await mdp_client.recv_frames() == [b"", b"MDPC01", b"upper", b"ABC"]
    spans = traced.spans()
    assert spans["mdp request"].status.status_code is StatusCode.UNSET
    assert spans["upper handle"].parent is None


async def test_map_and_map_unordered_have_a_span_per_request(traced: Traced) -> None:
    async def echo(request: dcp.HandlerRequest) -> bytes:
        return request.data[0]

    p = traced.provider
    async with (
        fast_broker() as broker,
        worker(broker.endpoints[0], "echo", echo, p),
        dcp.Client(broker.endpoints[0], timeout=5, tracing=p) as client,
    ):
        with traced.tracer().start_as_current_span("caller"):
            got = [r.data[0] async for r in client.map("echo", [b"a", b"b", b"c"], window=2)]
            assert got == [b"a", b"b", b"c"]
            unordered = client.map_unordered("echo", [b"d", b"e"], window=2)
            assert sorted([r.data[0] async for _, r in unordered]) == [b"d", b"e"]
    spans = traced.exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "echo request"]
    handles = [s for s in spans if s.name == "echo handle"]
    assert len(requests) == len(handles) == 5
    (caller,) = [s for s in spans if s.name == "caller"]
    assert {parent_of(s) for s in requests} == {span_id(caller)}
    assert {parent_of(s) for s in handles} == {span_id(s) for s in requests}


async def test_cancelled_calls_end_their_spans(traced: Traced) -> None:
    started = anyio.Event()

    async def slow(request: dcp.HandlerRequest) -> bytes:
        started.set()
        await anyio.sleep(10)
        return b"late"  # pragma: no cover - cancelled

    p = traced.provider
    async with (
        fast_broker() as broker,
        worker(broker.endpoints[0], "slow", slow, p) as slow_worker,
        dcp.Client(broker.endpoints[0], timeout=30, tracing=p) as client,
    ):
        with anyio.move_on_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.request, "slow", b"x")
                await started.wait()
                tg.cancel_scope.cancel()
        replies = client.map("slow", [b"1", b"2"], window=2)
        with anyio.move_on_after(0.2):
            await replies.__anext__()
        await replies.aclose()
        await slow_worker.aclose(grace=0)
    # The worker stopped: its handler's span ended too (cancelled).
    spans = traced.exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "slow request"]
    assert len(requests) == 3
    for span in requests:
        assert span.attributes is not None
        assert span.attributes["dcp.cancelled"] is True
        assert span.status.status_code is StatusCode.UNSET
    handles = [s for s in spans if s.name == "slow handle"]
    assert handles and all(s.attributes and s.attributes["dcp.cancelled"] for s in handles)


async def test_a_stream_is_one_span(traced: Traced) -> None:
    async def rows(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        for i in range(5):
            yield str(i).encode()

    p = traced.provider
    async with (
        fast_broker() as broker,
        worker(broker.endpoints[0], "rows", rows, p),
        dcp.Client(broker.endpoints[0], timeout=5, tracing=p) as client,
    ):
        async with client.stream("rows", b"q", window=2) as parts:
            got = [part async for part in parts]
        assert got == [(b"0",), (b"1",), (b"2",), (b"3",), (b"4",)]
        async with client.stream("rows", b"q", window=1) as parts:
            async for _ in parts:
                break
    spans = traced.exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "rows request"]
    handles = [s for s in spans if s.name == "rows handle"]
    assert len(requests) == 2
    assert requests[0].attributes is not None and "dcp.cancelled" not in requests[0].attributes
    assert requests[1].attributes is not None and requests[1].attributes["dcp.cancelled"]
    await_ok = [parent_of(s) for s in handles]
    assert span_id(requests[0]) in await_ok


def test_sync_client_request_and_map(traced: Traced) -> None:
    async def echo(request: dcp.HandlerRequest) -> bytes:
        if request.data[0] == b"fail":
            raise ValueError("asked to")
        if request.data[0] == b"slow":
            await anyio.sleep(0.3)
        return request.data[0]

    async def serve(ready: list[str], stop: anyio.Event) -> None:
        async with (
            fast_broker() as broker,
            worker(broker.endpoints[0], "echo", echo, traced.provider),
        ):
            ready.append(broker.endpoints[0])
            await stop.wait()

    # The broker and worker run on an event loop in this thread's portal.
    with anyio.from_thread.start_blocking_portal() as portal:
        ready: list[str] = []
        stop = portal.call(anyio.Event)
        future = portal.start_task_soon(serve, ready, stop)
        portal.call(eventually, lambda: bool(ready))
        with dcp.SyncClient(ready[0], timeout=5, tracing=traced.provider) as client:
            assert client.request("echo", b"x").data == (b"x",)
            with pytest.raises(dcp.RemoteError):
                client.request("echo", b"fail")
            assert [r.data[0] for r in client.map("echo", [b"a", b"b"])] == [b"a", b"b"]
            pairs = sorted(client.map_unordered("echo", [b"c"]))
            assert [r.data for _, r in pairs] == [(b"c",)]
            replies = client.map_unordered("echo", [b"d", b"slow"], window=2)
            assert next(replies)[1].data == (b"d",)
            replies.close()  # "slow" is forgotten unanswered
            with client.stream("echo", b"s") as parts:  # a plain handler: one last part
                assert list(parts) == [(b"s",)]
        portal.call(stop.set)
        future.result(10)
    spans = traced.exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "echo request"]
    assert len(requests) == 8
    assert [s.status.status_code for s in requests].count(StatusCode.ERROR) == 1
    assert [s.attributes and s.attributes.get("dcp.cancelled") for s in requests].count(True) == 1
    handles = [s for s in spans if s.name == "echo handle"]
    assert {parent_of(s) for s in handles} <= {span_id(s) for s in requests}


def test_bad_tracing_value() -> None:
    with pytest.raises(TypeError, match="TracerProvider"):
        dcp.Client("tcp://127.0.0.1:1", tracing="yes")  # type: ignore[arg-type]


def test_without_opentelemetry_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("dcp._io.tracing", "dcp._client.tracing", "dcp._worker.tracing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"pip install 'dagbox-dcp\[otel\]'"):
        dcp.Client("tcp://127.0.0.1:1", tracing=True)
    with pytest.raises(ImportError, match=r"pip install 'dagbox-dcp\[otel\]'"):
        dcp.Worker("tcp://127.0.0.1:1", "svc", lambda r: b"", tracing=True)


def test_tracing_off_imports_no_opentelemetry() -> None:
    code = (
        "import sys, dcp\n"
        "dcp.Client('tcp://127.0.0.1:1'); dcp.SyncClient('tcp://127.0.0.1:1').close()\n"
        "dcp.Worker('tcp://127.0.0.1:1', 'svc', lambda r: b'')\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_without_options_keeps_the_id_and_the_callers_parts() -> None:
    rid = REQUEST_ID_PREFIX + b"12345678"
    metadata = (rid, TRACEPARENT + b"00-x", OPTION_PREFIX + b"no-wait", b"mine")
    assert without_options(metadata) == (rid, b"mine")
    assert without_options((b"\xffnot an option",)) == (b"\xffnot an option",)


def test_forward_metadata_rules(traced: Traced) -> None:
    """Rule TR5: trace options replaced in place; added after a dcp id; else left alone."""
    from dcp._worker.tracing import WorkerTracing, _retraced

    hop = traced.tracer().start_span("hop")
    rid = REQUEST_ID_PREFIX + b"12345678"
    traced_meta = (rid, TRACEPARENT + b"old", OPTION_PREFIX + b"tracestate=a=b", b"mine")
    new = _retraced(traced_meta, hop)
    assert new[0] == rid and new[-1] == b"mine"
    assert new[1].startswith(TRACEPARENT) and new[1] != TRACEPARENT + b"old"
    assert trace_options(new) == [1]  # the span has no trace state: no tracestate part
    with_id = _retraced((rid, b"mine"), hop)
    assert with_id[0] == rid and with_id[1].startswith(TRACEPARENT) and with_id[2] == b"mine"
    assert _retraced((b"plain",), hop) == (b"plain",)
    assert _retraced((), hop) == ()
    hop.end()
    assert isinstance(WorkerTracing(traced.provider), WorkerTracing)


def test_reserved_fields_are_not_written(traced: Traced) -> None:
    from dcp._io.tracing import SETTER

    carrier: list[bytes] = []
    SETTER.set(carrier, "id", "x")
    SETTER.set(carrier, "Stream", "9")
    SETTER.set(carrier, "baggage", "k=v")
    assert carrier == [OPTION_PREFIX + b"baggage=k=v"]


def test_end_span_outcomes(traced: Traced) -> None:
    from dcp._client.tracing import CANCELLED, end_span

    tracer = traced.tracer()
    outcomes: list[object] = [None, KeyboardInterrupt(), CANCELLED, dcp.RequestTimeout("t")]
    for i, outcome in enumerate(outcomes):
        end_span(tracer.start_span(f"s{i}"), outcome)  # type: ignore[arg-type]
    spans = traced.spans()
    assert spans["s0"].status.description == "the client is closed"
    for name in ("s1", "s2"):
        assert spans[name].attributes == {"dcp.cancelled": True}
        assert spans[name].status.status_code is StatusCode.UNSET
    assert spans["s3"].attributes == {"error.type": "RequestTimeout"}
    assert repr(CANCELLED) == "CANCELLED"


def test_global_provider_and_getter_keys() -> None:
    """``tracing=True`` uses the global provider (none set here: non-recording spans, whose
    invalid context the propagator does not write)."""
    from dcp._client.tracing import ClientTracing
    from dcp._io.tracing import GETTER

    span, metadata = ClientTracing(True, "tcp://x").start(b"svc", (b"mine",))
    assert not span.is_recording()
    assert metadata == (b"mine",)
    parts = (REQUEST_ID_PREFIX + b"1", TRACEPARENT + b"v", OPTION_PREFIX + b"no-wait", b"x=y")
    assert GETTER.keys(parts) == ["id", "traceparent"]
    assert GETTER.get(parts, "traceparent") == ["v"]
    assert GETTER.get(parts, "tracestate") is None


async def test_calls_on_a_closed_client_end_their_spans(traced: Traced) -> None:
    async with fast_broker() as broker:
        client = dcp.Client(broker.endpoints[0], tracing=traced.provider)
        async with client:
            pass
        with pytest.raises(anyio.ClosedResourceError):
            async for _ in client.map("svc", [b"x"]):
                pass  # pragma: no cover - closed
        with pytest.raises(anyio.ClosedResourceError):
            await client.request("svc", b"x")
        # Made in another thread: a SyncClient refuses a thread that runs an event loop.
        sync_client = await anyio.to_thread.run_sync(
            lambda: dcp.SyncClient(broker.endpoints[0], tracing=traced.provider)
        )
        sync_client.close()
        with pytest.raises(anyio.ClosedResourceError):
            sync_client.request("svc", b"x")
    spans = traced.exporter.get_finished_spans()
    assert [s.name for s in spans] == ["svc request"] * 3
    assert all(s.status.status_code is StatusCode.ERROR for s in spans)


def test_tracing_benchmark_runs() -> None:
    """``benchmarks.tracing`` against HEAD: one tiny round, a row per case, the ratios."""
    command = ["--base", "HEAD", "--rounds", "1"]
    command += ["--windows", "4", "--count", "200", "--duration", "0.5"]
    proc = run_module("benchmarks.tracing", *command, timeout=120)
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| 4 |")]
    assert [row[2].strip() for row in rows] == ["base", "off", "on"]
    assert all(float(row[3]) > 0 for row in rows)
    assert "window 4: client CPU off/base" in proc.stdout


@pytest.mark.parametrize("mine", [b"mine", b"changed"])
def test_broker_core_matches_a_forward_with_other_trace_options(mine: bytes) -> None:
    """Routing Rule R2 (sans-IO): a forward whose dcp options (not the id) differ from the
    held request's releases it; one whose caller's metadata differs releases nothing."""
    from dcp._core.broker.core import BrokerCore
    from tests.helpers import C1, W1, W2, feed, out, take, workers

    core = BrokerCore()
    workers(core, W1, service=b"a")
    workers(core, W2, service=b"b")
    rid = REQUEST_ID_PREFIX + b"12345678"
    feed(core, C1, dcp.wire.Request(b"a", None, (rid, TRACEPARENT + b"client", b"mine"), (b"x",)))
    assert take(core) == [
        out(W1, dcp.wire.Request(b"a", C1, (rid, TRACEPARENT + b"client", b"mine"), (b"x",)))
    ]
    forward = dcp.wire.Request(b"b", C1, (rid, TRACEPARENT + b"hop", mine), (b"y",))
    feed(core, W1, forward)
    assert take(core)[0] == out(W2, forward)
    stats = core.statistics()
    assert (stats.forwards, stats.unmatched) == ((1, 0) if mine == b"mine" else (1, 1))
    feed(core, W1, dcp.wire.Reconnect())  # W1 leaves: what it still holds is redelivered
    assert core.statistics().redeliveries == (0 if mine == b"mine" else 1)
