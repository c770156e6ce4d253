"""One OpenTelemetry trace across a client and two workers: ``checkout`` forwards to
``charge`` (``docs/tracing.md``).

Run: ``python examples/tracing.py`` (needs ``pip install 'dagbox-dcp[otel]'`` and
``opentelemetry-sdk``). Each span is printed, one line, by a console exporter as it ends
(children before their parents). A real application sets up its provider and exporter (OTLP,
Jaeger, ...) once, as the global provider, and passes ``tracing=True``; here the provider is
passed explicitly.
"""

from __future__ import annotations

import anyio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import dcp

traces: set[int] = set()


def one_line(span: ReadableSpan) -> str:
    """A span in one line: its name, kind, id and its parent's id (last 4 hex digits)."""
    assert span.context is not None
    traces.add(span.context.trace_id)
    parent = f"{span.parent.span_id:016x}"[-4:] if span.parent else "-"
    own = f"{span.context.span_id:016x}"[-4:]
    return f"{span.name:<16} {span.kind.name:<8} {own} <- {parent}\n"


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=one_line)))
tracer = provider.get_tracer("example")


async def checkout(request: dcp.HandlerRequest) -> dcp.Forward:
    with tracer.start_as_current_span("price the cart"):  # nests under "checkout handle"
        total = b"%d" % (len(request.data[0]) * 100)
    return dcp.Forward("charge", total)


async def charge(request: dcp.HandlerRequest) -> bytes:
    return b"charged " + request.data[0]


async def main() -> None:
    async with anyio.create_task_group() as tg:
        broker = dcp.Broker("tcp://127.0.0.1:0")
        [endpoint] = await tg.start(broker.serve)
        await tg.start(dcp.Worker(endpoint, "checkout", checkout, tracing=provider).serve)
        await tg.start(dcp.Worker(endpoint, "charge", charge, tracing=provider).serve)
        async with dcp.Client(endpoint, tracing=provider) as client:
            with tracer.start_as_current_span("user clicks buy"):
                reply = await client.request("checkout", b"abc")
        print(reply.data[0].decode())
        print(f"traces: {len(traces)}")
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
