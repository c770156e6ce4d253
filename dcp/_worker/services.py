"""A worker's services as users declare them: :class:`Service` (handler, concurrency, and the
info it registers with), how a :class:`dcp.Worker`'s service arguments are checked and turned
into the table it serves (:func:`served_services`, ``docs/services.md``), and what kind of
handler each one has.

Rules:

Rule WV1 - Checked at construction. A handler is checked when a :class:`dcp.Worker` or a
  :class:`Service` is made, never first by a request: it is callable, not a class, not a
  plain ``def`` generator (a stream handler is an ``async def`` with ``yield``), and
  callable with one positional argument, the request. Anything else is a ``TypeError``
  naming the service and what is wrong (:func:`handler_problem`). A callable whose signature
  Python cannot read (some builtins) is taken as it is.
Rule WV2 - Names. A service name is a ``str`` (or ``bytes``, UTF-8, kept for older code), not
  empty, given once; on the wire it is UTF-8. Handlers, log lines and errors see the ``str``
  (``bytes`` that are not UTF-8 are decoded with ``surrogateescape``, so
  ``name.encode("utf-8", "surrogateescape")`` gives them back).
Rule WV3 - Kinds. Each handler's kind is read once, at construction (:class:`Kind`): an
  ``async def`` runs on the event loop, an async generator function streams, anything else
  runs in a worker thread; each is recognised also behind :func:`functools.partial`, as a
  bound method, or as an object whose ``__call__`` is one.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Mapping
from typing import Any, TypeAlias

import attrs

from dcp._core.broker.directory import parse_info
from dcp._json import encode_json
from dcp._models import Handler, service_name
from dcp._worker.results import handler_name, is_async_handler
from dcp._worker.streams import is_stream_handler

__all__ = [
    "Kind",
    "Served",
    "Service",
    "ServiceTable",
    "handler_kind",
    "handler_problem",
    "served_services",
]


def _unwrapped(handler: object) -> object:
    while isinstance(handler, functools.partial):
        handler = handler.func
    return handler


def handler_problem(handler: object) -> str | None:
    """What is wrong with ``handler`` as a worker's handler (Rule WV1), or ``None``."""
    if isinstance(handler, Service):
        return "a dcp.Service is not a handler: give it as services={name: dcp.Service(...)}"
    if inspect.iscoroutine(handler):
        handler.close()  # never awaited: no "was never awaited" warning for the user's call
        return "got a coroutine, not a function: give the handler itself (handler, not handler())"
    if not callable(handler):
        hint = ""
        if isinstance(handler, Mapping):
            hint = "; to give a service options, use dcp.Service(handler, concurrency=...)"
        return f"the handler must be a function, not {type(handler).__name__}{hint}"
    if isinstance(handler, type):
        return (
            f"the handler {handler_name(handler)} is a class: give a function, or an "
            "instance whose __call__ takes the request"
        )
    inner = _unwrapped(handler)
    if inspect.isgeneratorfunction(inner) or inspect.isgeneratorfunction(type(inner).__call__):
        return (
            f"the handler {handler_name(handler)} is a generator function (a def with yield): "
            "a stream handler is an async def with yield"
        )
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # no signature to read (some builtins): take it
        return None
    try:
        signature.bind(None)
    except TypeError as exc:
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        return (
            f"the handler {handler_name(handler)}{bare} cannot be called with one "
            f"argument, the request ({exc})"
        )
    return None


class Kind(enum.Enum):
    """How a handler is called (Rule WV3)."""

    #: ``async def``: awaited on the event loop.
    ASYNC = "async"
    #: An async generator function: its values are a stream's parts (``docs/streams.md``).
    STREAM = "stream"
    #: Anything else (a plain ``def``): run in a worker thread.
    THREAD = "thread"


def handler_kind(handler: object) -> Kind:
    """``handler``'s :class:`Kind` (Rule WV3)."""
    if is_stream_handler(handler):
        return Kind.STREAM
    return Kind.ASYNC if is_async_handler(handler) else Kind.THREAD


@attrs.frozen
class Service:
    """One service of a :class:`dcp.Worker` that serves several
    (``Worker(endpoint, services={"name": dcp.Service(handler, ...)})``).

    The info (version, description, metadata, schemas) is sent to the broker before the
    registration (``mmi.describe``, see ``docs/protocol.md``); clients read it with
    :meth:`dcp.Client.service_info`, and a broker's approver sees it.

    :param handler: serves one request of this service (as :class:`dcp.Worker`'s)
    :param concurrency: most requests of this service handled at once
    :param version: the service's version (SemVer, e.g. ``"1.2.0"``)
    :param description: what it does, for people
    :param metadata: text keys and values
    :param request_schema: JSON Schema of a request's data (carried, not checked)
    :param response_schema: JSON Schema of a reply's data (carried, not checked)
    :raises TypeError: ``handler`` is not a handler (not callable, a plain ``def``
        generator, or not callable with one argument: what is wrong is said)
    :raises ValueError: ``concurrency`` below 1, or a version that is not SemVer
    """

    handler: Handler
    concurrency: int = 1
    version: str | None = None
    description: str | None = None
    metadata: Mapping[str, str] | None = None
    request_schema: Mapping[str, Any] | bool | None = None
    response_schema: Mapping[str, Any] | bool | None = None

    def __attrs_post_init__(self) -> None:
        problem = handler_problem(self.handler)
        if problem is not None:
            raise TypeError(f"dcp.Service: {problem}")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        info = self.info()
        if info is not None:
            parse_info(info)  # raises ValueError, naming what is wrong

    def info(self) -> bytes | None:
        """The info document sent to the broker (``None``: nothing to say)."""
        doc: dict[str, Any] = {}
        for key in ("version", "description", "request_schema", "response_schema"):
            value = getattr(self, key)
            if value is not None:
                doc[key] = value if not isinstance(value, Mapping) else dict(value)
        if self.metadata is not None:
            doc["metadata"] = dict(self.metadata)
        return encode_json(doc, name="service info") if doc else None


#: ``Worker(services=...)``: service names (``str`` or ``bytes``) to handlers or
#: :class:`Service` objects.
ServiceTable: TypeAlias = Mapping[Any, "Service | Handler"]


@attrs.frozen
class Served:
    """One service a worker serves, as its handlers run it."""

    #: The service's name (Rule WV2).
    name: str
    #: The name on the wire (UTF-8).
    wire: bytes
    handler: Handler
    #: How the handler is called (Rule WV3).
    kind: Kind
    #: Most of its requests handled at once.
    concurrency: int
    #: The info document it registers with (``None``: none).
    info: bytes | None
    #: The handler's name, for log lines (``module.qualname``).
    label: str


def _name(name: object) -> tuple[str, bytes]:
    """A service name as ``(str, wire bytes)`` (Rule WV2)."""
    if isinstance(name, str):
        wire = name.encode("utf-8", "surrogateescape")
    elif isinstance(name, bytes | bytearray | memoryview):
        wire = bytes(name)
    else:
        raise TypeError(f"a service name must be str, not {type(name).__name__} ({name!r})")
    if not wire:
        raise ValueError("a service name must not be empty")
    return service_name(wire), wire


def _served(name: object, value: Service | Handler, concurrency: int, *, one: bool) -> Served:
    text, wire = _name(name)
    problem = None if isinstance(value, Service) and not one else handler_problem(value)
    if problem is not None:
        raise TypeError(f"service {text!r}: {problem}")
    spec = value if isinstance(value, Service) else Service(value, concurrency)
    return Served(
        text,
        wire,
        spec.handler,
        handler_kind(spec.handler),
        spec.concurrency,
        spec.info(),
        handler_name(spec.handler),
    )


def served_services(
    service: str | bytes | None,
    handler: Handler | None,
    services: ServiceTable | None,
    concurrency: int,
) -> tuple[Served, ...]:
    """Check a :class:`dcp.Worker`'s service arguments (Rules WV1 and WV2): the services it
    serves, in the order given.

    :param concurrency: the one service's (``services=`` gives each its own)
    :raises TypeError: neither form, or both; a name that is not ``str``; a handler that is
        not one (naming the service)
    :raises ValueError: an empty ``services`` or name, or a name given twice
    """
    if services is None:
        if service is None or handler is None:
            raise TypeError("a Worker needs a service and a handler, or services={...}")
        return (_served(service, handler, concurrency, one=True),)
    if service is not None or handler is not None:
        raise TypeError("give a Worker either a service and a handler, or services={...}")
    if not isinstance(services, Mapping):
        raise TypeError(
            f"services= must map service names to handlers, not {type(services).__name__}"
        )
    table: dict[bytes, Served] = {}
    for name, value in services.items():
        served = _served(name, value, 1, one=False)
        if served.wire in table:
            raise ValueError(f"service {served.name!r} given twice")
        table[served.wire] = served
    if not table:
        raise ValueError("services={} names no service")
    return tuple(table.values())
