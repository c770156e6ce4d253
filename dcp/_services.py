"""Services as users see them: a worker's declarative :class:`Service` (handler, concurrency,
and the info it registers with), and the broker's answers about services as typed objects
(:class:`ServiceSummary`, :class:`ServiceInfo`, :class:`ServiceStats`), read with
``mmi.services``, ``mmi.info`` and ``mmi.stats`` (``docs/services.md``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from ._core.directory import parse_info
from ._json import decode_json, encode_json
from ._results import HandlerRequest, is_async_handler

if TYPE_CHECKING:
    from typing import TypeAlias

    from ._client import Client
    from ._worker import Handler, HandlerResult

    #: ``Worker(services=...)``: service names (``str`` or ``bytes``) to handlers or
    #: :class:`Service` objects.
    ServiceTable: TypeAlias = Mapping[Any, "Service | Handler"]

__all__ = [
    "Service",
    "ServiceChange",
    "ServiceInfo",
    "ServiceStats",
    "ServiceSummary",
    "dispatcher",
    "several_services",
    "service_info",
    "service_stats",
    "services",
    "watch_services",
]


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


# ------------------------------------------------------------------- discovery (client)


@attrs.frozen
class ServiceSummary:
    """One service in the broker's list (``mmi.services``)."""

    name: str
    #: Registered workers, those ready for work, and the others.
    workers: int
    idle: int
    busy: int
    #: Requests waiting in its queue.
    queued: int
    #: Its newest worker's version and description (``""``: none given).
    version: str
    description: str


@attrs.frozen
class ServiceInfo:
    """What the broker knows about one service (``mmi.info``)."""

    name: str
    version: str
    #: Every version its workers gave.
    versions: tuple[str, ...]
    description: str
    metadata: Mapping[str, str]
    request_schema: Any
    response_schema: Any
    workers: int


@attrs.frozen
class ServiceStats:
    """The broker's live figures for one service (``mmi.stats``)."""

    name: str
    num_requests: int
    num_errors: int
    #: Total and mean processing time (dispatch to answer) of answered requests, seconds.
    processing_time: float
    average_processing_time: float
    queued: int
    #: Seconds the oldest queued request has waited (0: none queued).
    oldest_queued_age: float
    workers: int
    idle: int
    busy: int


@attrs.frozen
class ServiceChange:
    """A change seen by :meth:`dcp.Client.watch_services`: a service came up (a worker serves
    it now) or went down (none does)."""

    name: str
    up: bool
    workers: int


async def _ask(
    client: Client,
    name: str,
    arg: bytes | None,
    timeout: float | None,  # noqa: ASYNC109 (the request's own timeout)
) -> Any:
    args = () if arg is None else (arg,)
    response = await client.request(name, *args, timeout=timeout, retries=0)
    if response.data == (b"404",):
        return None
    if response.data == (b"501",):
        raise RuntimeError(f"the broker does not answer {name} (not a dcp broker?)")
    return decode_json(response.bytes, name=f"{name} answer")


def _known(cls: type[Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` in ``doc`` (a newer broker may say more)."""
    return {f.name: doc[f.name] for f in attrs.fields(cls) if f.name in doc}


def _name(name: str | bytes) -> bytes:
    return name.encode() if isinstance(name, str) else bytes(name)


async def services(
    client: Client,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
) -> list[ServiceSummary]:
    """Every service the broker knows (see :meth:`dcp.Client.services`)."""
    listing = await _ask(client, "mmi.services", None, timeout)
    return [ServiceSummary(**_known(ServiceSummary, entry)) for entry in listing]


async def service_info(
    client: Client,
    name: str | bytes,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
) -> ServiceInfo | None:
    """One service's info, ``None`` if the broker knows no such service."""
    doc = await _ask(client, "mmi.info", _name(name), timeout)
    if doc is None:
        return None
    doc["versions"] = tuple(doc["versions"])
    return ServiceInfo(**_known(ServiceInfo, doc))


async def service_stats(
    client: Client,
    name: str | bytes,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
) -> ServiceStats | None:
    """One service's stats, ``None`` if the broker knows no such service."""
    doc = await _ask(client, "mmi.stats", _name(name), timeout)
    if doc is None:
        return None
    for key in ("processing_time", "average_processing_time"):
        doc[key] = doc[key] / 1e9
    return ServiceStats(**_known(ServiceStats, doc))


async def watch_services(
    client: Client,
    *,
    interval: float = 1.0,
    timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
) -> AsyncIterator[ServiceChange]:
    """Changes to the services workers serve, by asking ``mmi.services`` every
    ``interval`` seconds: first one ``up`` change per service served now, then each
    service that comes up or goes down. Runs until the caller stops iterating."""
    if not interval > 0 or math.isinf(interval):
        raise ValueError("interval must be a positive finite number")
    known: dict[str, int] = {}
    while True:
        now = {s.name: s.workers for s in await services(client, timeout=timeout) if s.workers}
        for name, workers in now.items():
            if name not in known:
                yield ServiceChange(name, True, workers)
        for name in known:
            if name not in now:
                yield ServiceChange(name, False, 0)
        known = now
        await anyio.sleep(interval)
