"""A worker's services as users declare them: :class:`Service` (handler, concurrency, and the
info it registers with), and how a worker given several is set up (``docs/services.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import anyio
import attrs

from dcp._core.broker.directory import parse_info
from dcp._json import encode_json
from dcp._models import Handler, HandlerRequest, HandlerResult
from dcp._worker.results import is_async_handler

__all__ = ["Service", "ServiceTable", "as_service", "dispatcher", "several_services"]


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


def as_service(value: Service | Handler) -> Service:
    """A ``services={...}`` value: a :class:`Service`, or a bare handler."""
    return value if isinstance(value, Service) else Service(value)


def dispatcher(
    table: Mapping[bytes, Service],
) -> Callable[[HandlerRequest], Any]:
    """One ``async`` handler that runs the handler of the request's service, at most its
    ``concurrency`` at once (a plain ``def`` in a worker thread)."""
    limiters: dict[bytes, anyio.CapacityLimiter] = {}
    kinds = {name: is_async_handler(spec.handler) for name, spec in table.items()}

    async def dispatch(request: HandlerRequest) -> HandlerResult:
        name = request.service
        spec = table[name]
        limiter = limiters.get(name)
        if limiter is None:
            limiter = limiters[name] = anyio.CapacityLimiter(spec.concurrency)
        if kinds[name]:
            async with limiter:
                result: Any = await spec.handler(request)  # type: ignore[misc]
                return result  # type: ignore[no-any-return]
        result = await anyio.to_thread.run_sync(spec.handler, request, limiter=limiter)
        if hasattr(result, "__await__"):
            result = await result
        return result  # type: ignore[no-any-return]

    return dispatch


@attrs.frozen
class Several:
    """How a :class:`dcp.Worker` given ``services=`` is set up."""

    first: bytes
    more: tuple[bytes, ...]
    handler: Callable[[HandlerRequest], Any]
    concurrency: int
    infos: dict[bytes, bytes]


def several_services(
    service: str | bytes | None,
    handler: Handler | None,
    services: ServiceTable | None,
) -> Several | None:
    """Check a :class:`dcp.Worker`'s service arguments; ``None`` for one ``service`` and
    ``handler``.

    :raises TypeError: neither form, or both
    :raises ValueError: an empty ``services``, or a name given twice
    """
    if services is None:
        if service is None or handler is None:
            raise TypeError("a Worker needs a service and a handler, or services={...}")
        return None
    if service is not None or handler is not None:
        raise TypeError("give a Worker either a service and a handler, or services={...}")
    table: dict[bytes, Service] = {}
    items: Any = services.items()
    for name, value in items:
        key = name.encode() if isinstance(name, str) else bytes(name)
        if key in table:
            raise ValueError(f"service {key!r} given twice")
        table[key] = as_service(value)
    if not table:
        raise ValueError("services={} names no service")
    names = list(table)
    infos = {name: info for name, spec in table.items() if (info := spec.info()) is not None}
    return Several(
        names[0],
        tuple(names[1:]),
        dispatcher(table),
        sum(spec.concurrency for spec in table.values()),
        infos,
    )
