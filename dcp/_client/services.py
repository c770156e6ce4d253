"""The broker's answers about services as typed objects (:class:`ServiceSummary`,
:class:`ServiceInfo`, :class:`ServiceStats`), read with ``mmi.services``, ``mmi.info`` and
``mmi.stats``, and :meth:`dcp.Client.watch_services` (``docs/services.md``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from dcp._json import decode_json

if TYPE_CHECKING:
    from dcp._client.client import Client

__all__ = [
    "ServiceChange",
    "ServiceInfo",
    "ServiceStats",
    "ServiceSummary",
    "service_info",
    "service_stats",
    "services",
    "watch_services",
]


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
