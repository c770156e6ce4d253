"""Client spans of OpenTelemetry tracing (Rule TR3 of :mod:`dcp._io.tracing`, ``docs/tracing.md``)
for :class:`~dcp.Client` and :class:`~dcp.SyncClient`. Imported only by a client made with
``tracing=`` on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from dcp._client.receive import Start
from dcp._client.sync_receive import SyncReceiver
from dcp._client.waiters import Sink, Waiter
from dcp._core.client.calls import Timing
from dcp._errors import RemoteError
from dcp._io.tracing import (
    SYSTEM,
    Span,
    SpanKind,
    Status,
    StatusCode,
    inject,
    span_name,
    tracer,
)
from dcp._models import Outcome, Response

__all__ = [
    "CANCELLED",
    "ClientTracing",
    "SyncTracing",
    "TracedSink",
    "TracedWaiter",
    "end_span",
]


class _Cancelled:
    """The outcome of a call that was cancelled (or left) before its answer."""

    def __repr__(self) -> str:
        return "CANCELLED"


#: Pass to :func:`end_span` for a call cancelled before its answer.
CANCELLED: Final = _Cancelled()


def end_span(span: Span, outcome: Outcome | _Cancelled | BaseException | None) -> None:
    """End a client span with its call's outcome (Rule TR3); ``None``: the client closed."""
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
    """A :class:`~dcp._client.waiters.Waiter` that ends its request's span with the outcome."""

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
    """A :class:`~dcp._client.waiters.Sink` (one ``map``) that ends each request's span with its
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
    """Client spans (Rule TR3) for one client.

    :param tracing: ``True`` (the global tracer provider) or a ``TracerProvider``
    :param endpoint: the broker's endpoint (attribute ``dcp.endpoint``)
    """

    def __init__(self, tracing: object, endpoint: str) -> None:
        self._tracer = tracer(tracing)
        self._endpoint = endpoint

    def start(self, service: bytes, metadata: Sequence[bytes]) -> tuple[Span, tuple[bytes, ...]]:
        """Start a request's span; the metadata with its trace options first."""
        name = span_name(service)
        span = self._tracer.start_span(
            f"{name} request",
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": SYSTEM, "rpc.service": name, "dcp.endpoint": self._endpoint},
        )
        return span, (*inject(span), *metadata)

    def sink(self, start: Start) -> tuple[TracedSink, Start]:
        """A sink for one traced ``map``, and the receiver's ``start`` wrapped to give each
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

    def stream(
        self, service: bytes, metadata: tuple[bytes, ...]
    ) -> tuple[tuple[bytes, ...], Callable[[Outcome | None], None]]:
        """Start the span of a stream (one for the whole stream, Rule TR3): the stream's
        metadata with its trace options first, and the stream's ``on_close`` that ends it."""
        span, traced = self.start(service, metadata)

        def on_close(outcome: Outcome | None) -> None:
            end_span(span, CANCELLED if outcome is None else outcome)

        return traced, on_close

    def request(
        self,
        start: Start,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> tuple[TracedWaiter, bytes, list[bytes]]:
        """Start one traced request with the receiver's ``start``: its waiter, id and frames."""
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
    """Client spans (Rule TR3) for a :class:`~dcp.SyncClient` (:meth:`attach` it)."""

    def attach(self, receiver: SyncReceiver) -> None:
        """Trace every request the client's ``receiver`` starts (its ``start``) until its
        outcome is delivered (its ``done``)."""
        done = _TracedDone()
        receiver.done = done
        start = receiver.start

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

        receiver.start = traced_start  # type: ignore[method-assign]
