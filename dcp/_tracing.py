"""OpenTelemetry tracing of requests across clients, brokers and workers (``docs/tracing.md``).

Needs the ``otel`` extra (``pip install 'dagbox-dcp[otel]'``: ``opentelemetry-api``). This
module imports OpenTelemetry; nothing else in dcp does, and it is itself imported only by a
client or worker made with ``tracing=`` on.

Rules:

Rule T1 - Off costs nothing. With tracing off (the default) a client or worker holds
  ``None`` instead of a tracing object: the request path pays one ``is None`` test, sends no
  extra part, and OpenTelemetry is never imported. The broker does nothing for tracing at
  all: trace options are dcp options it passes through like any other.
Rule T2 - The wire. The trace context travels in the request's metadata as dcp request
  options: each field the global propagator writes (OpenTelemetry's default: W3C
  ``traceparent``, ``tracestate`` when there is one, ``baggage`` when there is some) is one
  part ``\\xffDCP:<field>=<value>``, right after the request id. A field named like one of
  dcp's own options (:data:`RESERVED`) is not written. Reading goes through the same
  propagator (never hand-parsed); the first part of each field counts.
Rule T3 - Client spans. Each request (``request``, each request of ``map``, a whole
  stream) is one span of kind CLIENT named ``"<service> request"``, a child of the caller's
  current span; its context is what the request carries. Resends carry the same context
  (they are the same request). It ends with the outcome: a reply leaves the status unset,
  an error reply (:exc:`~dcp.RemoteError`, code in ``dcp.error.code``), a timeout or a
  closed client sets status ERROR and records the exception; a cancelled call ends it with
  ``dcp.cancelled = true`` and the status unset.
Rule T4 - Worker spans. The handler runs in a span of kind SERVER named ``"<service>
  handle"`` whose parent is the context the request carried (none: a new trace). It is the
  current span while the handler runs, so the handler's own spans nest (also in a plain
  ``def`` handler: anyio runs the thread in a copy of the context). An error reply
  (``handler_error``, ``bad_handler_result``) sets status ERROR. A stream is one span.
Rule T5 - Forwards. A :class:`~dcp.Forward` is one more span, kind PRODUCER, named
  ``"<target> forward"``, a child of the handler's span, ended once the forward is handed
  over. The forward carries *its* context: the request's trace options are replaced in
  place. If the request carried none, they are added after the request id when the first
  metadata part is a dcp request id (dcp clients match replies by the id alone); otherwise
  the forward keeps the metadata as it came (a plain DCP client may compare the whole
  metadata of its reply), and the next worker's span starts a new trace. The broker still
  matches the forward with the request it finishes (routing Rule 2: an answer or forward
  may differ from the request in dcp options other than the id).

What this module does NOT do: configure OpenTelemetry (providers, exporters, sampling and
propagators are the application's), trace the broker, or trace pub/sub.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import Getter, Setter
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as _exc:  # pragma: no cover - the dev extra installs it
    raise ImportError(
        f"dcp tracing needs OpenTelemetry ({_exc}); install it with: "
        "pip install 'dagbox-dcp[otel]'"
    ) from _exc

from ._calls import Timing
from ._errors import RemoteError
from ._messages import OPTION_PREFIX, REQUEST_ID_PREFIX, Reply, Request, parse_error_reply
from ._response import Outcome, Response
from ._streams import Stream
from ._waiters import Sink, Waiter

if TYPE_CHECKING:
    from ._sync_client import SyncClient

__all__ = [
    "CANCELLED",
    "RESERVED",
    "SYSTEM",
    "ClientTracing",
    "Start",
    "SyncTracing",
    "TracedSink",
    "TracedWaiter",
    "WorkerTracing",
    "end_span",
    "inject",
    "trace_options",
]

#: ``rpc.system`` of every dcp span.
SYSTEM: Final = "dcp"
#: Names of dcp's own options (and pub/sub tags): never written as trace fields.
RESERVED: Final = frozenset(
    {"id", "work-timeout", "expires-in", "no-wait", "stream", "describe", "msg", "gap"}
)
_SCOPE = "dcp"


class _Cancelled:
    """The outcome of a call that was cancelled (or left) before its answer."""

    def __repr__(self) -> str:
        return "CANCELLED"


#: Pass to :func:`end_span` for a call cancelled before its answer.
CANCELLED: Final = _Cancelled()


class _OptionSetter(Setter[list[bytes]]):
    """Writes each trace field as one ``\\xffDCP:<field>=<value>`` part (Rule T2)."""

    def set(self, carrier: list[bytes], key: str, value: str) -> None:
        name = key.lower()
        if name and name not in RESERVED:
            part = OPTION_PREFIX + name.encode(errors="replace") + b"="
            carrier.append(part + value.encode(errors="replace"))


class _OptionGetter(Getter[Sequence[bytes]]):
    """Reads the trace fields back from a request's metadata (Rule T2)."""

    def get(self, carrier: Sequence[bytes], key: str) -> list[str] | None:
        prefix = OPTION_PREFIX + key.lower().encode() + b"="
        n = len(prefix)
        values = [bytes(p[n:]).decode("utf-8", "replace") for p in carrier if p.startswith(prefix)]
        return values or None

    def keys(self, carrier: Sequence[bytes]) -> list[str]:
        n = len(OPTION_PREFIX)
        return [
            bytes(p[n:]).split(b"=", 1)[0].decode("utf-8", "replace")
            for p in carrier
            if p.startswith(OPTION_PREFIX) and b"=" in p
        ]


#: The client's ``_start``: service, data, metadata, timing, waiter -> id and frames.
Start = Callable[
    [bytes, Sequence[bytes], Sequence[bytes], Timing, Waiter | Sink], tuple[bytes, list[bytes]]
]

_SETTER: Final = _OptionSetter()
_GETTER: Final = _OptionGetter()


def _tracer(tracing: object) -> trace.Tracer:
    """The tracer for ``tracing=``: ``True`` is the global provider's (looked up on each
    span, so a provider set later is used), a :class:`TracerProvider` is used as given."""
    from . import __version__

    if tracing is True:
        return trace.get_tracer(_SCOPE, __version__)
    if isinstance(tracing, trace.TracerProvider):
        return tracing.get_tracer(_SCOPE, __version__)
    raise TypeError(
        "tracing must be True, False or an opentelemetry.trace.TracerProvider, "
        f"not {type(tracing).__name__}"
    )


def _name(service: bytes) -> str:
    return service.decode("utf-8", "replace")


def inject(span: Span) -> list[bytes]:
    """The trace option parts that carry ``span``'s context (Rule T2)."""
    carrier: list[bytes] = []
    propagate.inject(carrier, context=trace.set_span_in_context(span), setter=_SETTER)
    return carrier


def trace_options(metadata: Sequence[bytes]) -> list[int]:
    """Positions of the trace options in ``metadata`` (the global propagator's fields)."""
    prefixes = tuple(
        OPTION_PREFIX + field.lower().encode() + b"="
        for field in propagate.get_global_textmap().fields
    )
    return [i for i, part in enumerate(metadata) if part.startswith(prefixes)]


def end_span(span: Span, outcome: Outcome | _Cancelled | BaseException | None) -> None:
    """End a client span with its call's outcome (Rule T3); ``None``: the client closed."""
    if isinstance(outcome, _Cancelled):
        span.set_attribute("dcp.cancelled", True)
    elif outcome is None:
        span.set_status(Status(StatusCode.ERROR, "the client is closed"))
        span.set_attribute("error.type", "closed")
    elif isinstance(outcome, Exception):
        if isinstance(outcome, RemoteError):
            span.set_attribute("dcp.error.code", outcome.code)
            span.set_attribute("error.type", outcome.code)
        else:
            span.set_attribute("error.type", type(outcome).__qualname__)
        span.record_exception(outcome)
        span.set_status(Status(StatusCode.ERROR, f"{type(outcome).__name__}: {outcome}"))
    elif not isinstance(outcome, Response):  # another BaseException: cancellation
        span.set_attribute("dcp.cancelled", True)
    span.end()


class TracedWaiter(Waiter):
    """A :class:`~dcp._waiters.Waiter` that ends its request's span with the outcome."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        super().__init__()
        self.span = span

    def deliver(self, rid: bytes, outcome: Outcome | None) -> None:
        super().deliver(rid, outcome)
        end_span(self.span, outcome)

    def forget(self) -> None:
        """The call was cancelled before its answer."""
        end_span(self.span, CANCELLED)


class TracedSink(Sink):
    """A :class:`~dcp._waiters.Sink` (one ``map``) that ends each request's span with its
    outcome; :meth:`bind` names the span of the request just started."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        super().__init__()
        self.spans: dict[bytes, Span] = {}

    def bind(self, rid: bytes, span: Span) -> None:
        self.spans[rid] = span

    def deliver(self, rid: bytes, outcome: Outcome | None) -> None:
        super().deliver(rid, outcome)
        span = self.spans.pop(rid, None)
        if span is not None:
            end_span(span, outcome)

    def forget(self) -> None:
        """The ``map`` ended: requests still unanswered were cancelled."""
        spans, self.spans = self.spans, {}
        for span in spans.values():
            end_span(span, CANCELLED)


class ClientTracing:
    """Client spans (Rule T3) for one client.

    :param tracing: ``True`` (the global tracer provider) or a ``TracerProvider``
    :param endpoint: the broker's endpoint (attribute ``dcp.endpoint``)
    """

    def __init__(self, tracing: object, endpoint: str) -> None:
        self._tracer = _tracer(tracing)
        self._endpoint = endpoint

    def start(self, service: bytes, metadata: Sequence[bytes]) -> tuple[Span, tuple[bytes, ...]]:
        """Start a request's span; the metadata with its trace options first."""
        name = _name(service)
        span = self._tracer.start_span(
            f"{name} request",
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": SYSTEM, "rpc.service": name, "dcp.endpoint": self._endpoint},
        )
        return span, (*inject(span), *metadata)

    def sink(self, start: Start) -> tuple[TracedSink, Start]:
        """A sink for one traced ``map``, and the client's ``_start`` wrapped to give each
        request its span and context."""
        sink = TracedSink()

        def traced_start(
            service: bytes,
            data: Sequence[bytes],
            metadata: Sequence[bytes],
            timing: Timing,
            waiter: Waiter | Sink,
        ) -> tuple[bytes, list[bytes]]:
            span, traced = self.start(service, metadata)
            try:
                rid, frames = start(service, data, traced, timing, waiter)
            except BaseException as exc:
                end_span(span, exc)
                raise
            sink.bind(rid, span)
            return rid, frames

        return sink, traced_start

    def trace_stream(self, stream: Stream) -> None:
        """Give a stream (not entered yet) its span: one for the whole stream (Rule T3)."""
        service, data, metadata, timing = stream._request
        span, metadata = self.start(service, metadata)
        stream._request = (service, data, metadata, timing)

        def on_close(outcome: Outcome | None) -> None:
            end_span(span, CANCELLED if outcome is None else outcome)

        stream.on_close = on_close

    def request(
        self,
        start: Start,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> tuple[TracedWaiter, bytes, list[bytes]]:
        """Start one traced request with the client's ``_start``: its waiter, id and frames."""
        span, traced = self.start(service, metadata)
        waiter = TracedWaiter(span)
        try:
            rid, frames = start(service, data, traced, timing, waiter)
        except BaseException as exc:
            end_span(span, exc)
            raise
        return waiter, rid, frames


class _TracedDone(dict[bytes, Outcome]):
    """A :class:`~dcp.SyncClient`'s outcomes by request id that ends each request's span
    when its outcome is put in (every outcome is), or when it is forgotten unanswered."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: dict[bytes, Span] = {}

    def __setitem__(self, rid: bytes, outcome: Outcome) -> None:
        super().__setitem__(rid, outcome)
        span = self.spans.pop(rid, None)
        if span is not None:
            end_span(span, outcome)

    def pop(self, rid: bytes, *default: Any) -> Any:
        span = self.spans.pop(rid, None)
        if span is not None:  # forgotten before its outcome came
            end_span(span, CANCELLED)
        return super().pop(rid, *default)


class SyncTracing(ClientTracing):
    """Client spans (Rule T3) for a :class:`~dcp.SyncClient` (:meth:`attach` it)."""

    def attach(self, client: SyncClient) -> None:
        """Trace every request ``client`` starts (its ``_start``) until its outcome is
        delivered (its ``_done``)."""
        done = _TracedDone()
        client._done = done
        start = client._start

        def traced_start(
            service: bytes, data: Sequence[bytes], metadata: Sequence[bytes], timing: Timing
        ) -> bytes:
            span, traced = self.start(service, metadata)
            try:
                rid = start(service, data, traced, timing)
            except BaseException as exc:
                end_span(span, exc)
                raise
            done.spans[rid] = span
            return rid

        client._start = traced_start  # type: ignore[method-assign]


class WorkerTracing:
    """Worker spans (Rules T4, T5) for one worker.

    :param tracing: ``True`` (the global tracer provider) or a ``TracerProvider``
    """

    def __init__(self, tracing: object) -> None:
        self._tracer = _tracer(tracing)

    async def call(
        self, handle: Callable[[Request], Awaitable[Reply | Request]], request: Request
    ) -> Reply | Request:
        """``await handle(request)`` in the request's span, made current (Rule T4); the
        answer to send (a forward carries the forward span's context, Rule T5)."""
        parent = propagate.extract(request.metadata, getter=_GETTER)
        name = _name(request.service)
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
        target = _name(message.service)
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
    """``metadata`` with its trace options replaced by ``hop``'s context (Rule T5)."""
    old = trace_options(metadata)
    new = inject(hop)
    if old:
        at = old[0]
        kept = [part for i, part in enumerate(metadata) if i not in old]
        return (*kept[:at], *new, *kept[at:])
    if metadata and metadata[0].startswith(REQUEST_ID_PREFIX):
        return (metadata[0], *new, *metadata[1:])
    return metadata
