"""OpenTelemetry tracing of requests across clients, brokers and workers (``docs/tracing.md``):
how a trace context travels in a request's metadata, and the tracer. The spans are made by
:mod:`dcp._client.tracing` (Rule TR3) and :mod:`dcp._worker.tracing` (Rules TR4, TR5).

Needs the ``otel`` extra (``pip install 'dagbox-dcp[otel]'``: ``opentelemetry-api``). This
module imports OpenTelemetry; nothing else in dcp does, and it is itself imported only by a
client or worker made with ``tracing=`` on.

Rules:

Rule TR1 - Off costs nothing. With tracing off (the default) a client or worker holds
  ``None`` instead of a tracing object: the request path pays one ``is None`` test, sends no
  extra part, and OpenTelemetry is never imported. The broker does nothing for tracing at
  all: trace options are dcp options it passes through like any other.
Rule TR2 - The wire. The trace context travels in the request's metadata as dcp request
  options: each field the global propagator writes (OpenTelemetry's default: W3C
  ``traceparent``, ``tracestate`` when there is one, ``baggage`` when there is some) is one
  part ``\\xffDCP:<field>=<value>``, right after the request id. A field named like one of
  dcp's own options (:data:`RESERVED`) is not written. Reading goes through the same
  propagator (never hand-parsed); the first part of each field counts.
Rule TR3 - Client spans. Each request (``request``, each request of ``map``, a whole
  stream) is one span of kind CLIENT named ``"<service> request"``, a child of the caller's
  current span; its context is what the request carries. Resends carry the same context
  (they are the same request). It ends with the outcome: a reply leaves the status unset,
  an error reply (:exc:`~dcp.RemoteError`, code in ``dcp.error.code``), a timeout or a
  closed client sets status ERROR and records the exception; a cancelled call ends it with
  ``dcp.cancelled = true`` and the status unset.
Rule TR4 - Worker spans. The handler runs in a span of kind SERVER named ``"<service>
  handle"`` whose parent is the context the request carried (none: a new trace). It is the
  current span while the handler runs, so the handler's own spans nest (also in a plain
  ``def`` handler: anyio runs the thread in a copy of the context). An error reply
  (``handler_error``, ``bad_handler_result``) sets status ERROR. A stream is one span.
Rule TR5 - Forwards. A :class:`~dcp.Forward` is one more span, kind PRODUCER, named
  ``"<target> forward"``, a child of the handler's span, ended once the forward is handed
  over. The forward carries *its* context: the request's trace options are replaced in
  place. If the request carried none, they are added after the request id when the first
  metadata part is a dcp request id (dcp clients match replies by the id alone); otherwise
  the forward keeps the metadata as it came (a plain DCP client may compare the whole
  metadata of its reply), and the next worker's span starts a new trace. The broker still
  matches the forward with the request it finishes (routing Rule R2: an answer or forward
  may differ from the request in dcp options other than the id).

What this module does NOT do: configure OpenTelemetry (providers, exporters, sampling and
propagators are the application's), trace the broker, or trace pub/sub.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

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

from dcp.wire.options import OPTION_PREFIX

__all__ = [
    "GETTER",
    "SETTER",
    "RESERVED",
    "SYSTEM",
    "Span",
    "SpanKind",
    "Status",
    "StatusCode",
    "inject",
    "otel_context",
    "propagate",
    "span_name",
    "trace",
    "trace_options",
    "tracer",
]

#: ``rpc.system`` of every dcp span.
SYSTEM: Final = "dcp"
#: Names of dcp's own options (and pub/sub tags): never written as trace fields.
RESERVED: Final = frozenset(
    {"id", "work-timeout", "expires-in", "no-wait", "stream", "describe", "msg", "gap"}
)
_SCOPE = "dcp"


class _OptionSetter(Setter[list[bytes]]):
    """Writes each trace field as one ``\\xffDCP:<field>=<value>`` part (Rule TR2)."""

    def set(self, carrier: list[bytes], key: str, value: str) -> None:
        name = key.lower()
        if name and name not in RESERVED:
            part = OPTION_PREFIX + name.encode(errors="replace") + b"="
            carrier.append(part + value.encode(errors="replace"))


class _OptionGetter(Getter[Sequence[bytes]]):
    """Reads the trace fields back from a request's metadata (Rule TR2)."""

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


SETTER: Final = _OptionSetter()
GETTER: Final = _OptionGetter()


def tracer(tracing: object) -> trace.Tracer:
    """The tracer for ``tracing=``: ``True`` is the global provider's (looked up on each
    span, so a provider set later is used), a :class:`TracerProvider` is used as given."""
    from dcp._version import __version__

    if tracing is True:
        return trace.get_tracer(_SCOPE, __version__)
    if isinstance(tracing, trace.TracerProvider):
        return tracing.get_tracer(_SCOPE, __version__)
    raise TypeError(
        "tracing must be True, False or an opentelemetry.trace.TracerProvider, "
        f"not {type(tracing).__name__}"
    )


def span_name(service: bytes) -> str:
    return service.decode("utf-8", "replace")


def inject(span: Span) -> list[bytes]:
    """The trace option parts that carry ``span``'s context (Rule TR2)."""
    carrier: list[bytes] = []
    propagate.inject(carrier, context=trace.set_span_in_context(span), setter=SETTER)
    return carrier


def trace_options(metadata: Sequence[bytes]) -> list[int]:
    """Positions of the trace options in ``metadata`` (the global propagator's fields)."""
    prefixes = tuple(
        OPTION_PREFIX + field.lower().encode() + b"="
        for field in propagate.get_global_textmap().fields
    )
    return [i for i, part in enumerate(metadata) if part.startswith(prefixes)]
