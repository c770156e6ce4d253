"""Worker spans of OpenTelemetry tracing (Rules TR4 and TR5 of :mod:`dcp._io.tracing`,
``docs/tracing.md``). Imported only by a worker made with ``tracing=`` on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from dcp._io.tracing import (
    GETTER,
    SYSTEM,
    Span,
    SpanKind,
    Status,
    StatusCode,
    inject,
    otel_context,
    propagate,
    span_name,
    trace,
    trace_options,
    tracer,
)
from dcp.wire.messages import Reply, Request, parse_error_reply
from dcp.wire.options import REQUEST_ID_PREFIX

__all__ = ["WorkerTracing"]


class WorkerTracing:
    """Worker spans (Rules TR4, TR5) for one worker.

    :param tracing: ``True`` (the global tracer provider) or a ``TracerProvider``
    """

    def __init__(self, tracing: object) -> None:
        self._tracer = tracer(tracing)

    async def call(
        self, handle: Callable[[Request], Awaitable[Reply | Request]], request: Request
    ) -> Reply | Request:
        """``await handle(request)`` in the request's span, made current (Rule TR4); the
        answer to send (a forward carries the forward span's context, Rule TR5)."""
        parent = propagate.extract(request.metadata, getter=GETTER)
        name = span_name(request.service)
        span = self._tracer.start_span(
            f"{name} handle",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"rpc.system": SYSTEM, "rpc.service": name},
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            message = await handle(request)
        except BaseException:
            span.set_attribute("dcp.cancelled", True)  # _call answers every Exception
            raise
        else:
            if isinstance(message, Request):
                message = self._forward(span, message)
            else:
                error = parse_error_reply(message.data)
                if error is not None:
                    span.set_attribute("dcp.error.code", error[0])
                    span.set_attribute("error.type", error[0])
                    span.set_status(Status(StatusCode.ERROR, f"{error[0]}: {error[1]}"))
            return message
        finally:
            otel_context.detach(token)
            span.end()

    def _forward(self, span: Span, message: Request) -> Request:
        target = span_name(message.service)
        span.set_attribute("dcp.forward.service", target)
        hop = self._tracer.start_span(
            f"{target} forward",
            context=trace.set_span_in_context(span),
            kind=SpanKind.PRODUCER,
            attributes={"rpc.system": SYSTEM, "rpc.service": target},
        )
        try:
            return Request(
                message.service, message.client, _retraced(message.metadata, hop), message.data
            )
        finally:
            hop.end()


def _retraced(metadata: tuple[bytes, ...], hop: Span) -> tuple[bytes, ...]:
    """``metadata`` with its trace options replaced by ``hop``'s context (Rule TR5)."""
    old = trace_options(metadata)
    new = inject(hop)
    if old:
        at = old[0]
        kept = [part for i, part in enumerate(metadata) if i not in old]
        return (*kept[:at], *new, *kept[at:])
    if metadata and metadata[0].startswith(REQUEST_ID_PREFIX):
        return (metadata[0], *new, *metadata[1:])
    return metadata
