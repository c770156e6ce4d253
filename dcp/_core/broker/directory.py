"""Services the broker answers itself (ZeroMQ RFC 8, MMI, and dcp's discovery), for every
dialect (:class:`Mmi`), and what workers say about the services they provide
(:class:`Directory`). Pure: no clocks (``now`` is the time of the call), no sockets.

Rule D1 - A request for a name starting with ``mmi.`` is answered by the broker, never
  queued. ``mmi.service``: ``200`` if a worker serves the service named by the request's last
  data part, ``404`` if none does (the zguide broker replaces the request body with it).
  ``mmi.services``: one JSON list, an entry per known service (:func:`service_entry`).
  ``mmi.info`` / ``mmi.stats``: one JSON object about the service named by the last data
  part (``404`` if no worker serves it and nothing is queued for it); without a name (no
  data, or an empty last part), a JSON list with one object per known service.
  ``mmi.describe`` (Rule D3). ``mmi.broker``: one JSON object of broker-wide figures
  (:func:`broker_entry`: uptime, peers, counters, refusals by reason; what ``dcp top``
  shows). Any other ``mmi.*`` name: ``501``.
Rule D2 - Workers may not register ``mmi.*`` names (refused: ``reserved_service``).
Rule D3 - Descriptions. A peer describes a service with a request to ``mmi.describe`` whose
  data is ``[service, info]`` (*info*: one JSON object, :func:`parse_info`). It is answered
  ``200`` if the info is valid, else ``400`` and the description is ignored (counted as
  ``bad_service_info``). A description of a service the peer is registered for replaces its
  info at once; otherwise it waits for the peer's registration of that service (so an
  approver sees it, :mod:`.approval`), at most :data:`MAX_WAITING` of them (the oldest is
  dropped).
Rule D4 - What a service shows. A service's info is that of its most recently registered
  (or described) worker that gave one; ``versions`` lists every version its workers gave.
  A worker that leaves takes its info with it.
Rule D5 - Stats come from what routing keeps anyway: queue depth, the age of the oldest
  queued request (since it was queued, or requeued), idle and busy workers, and per-service
  counters updated in O(1) per request: requests, error replies, and the sum of processing
  times (dispatch to answer) of answered requests (the HTTP endpoint also reads their
  redeliveries and processing-time buckets, :data:`dcp._stats.DURATION_BUCKETS`). Counters
  start when the service becomes known to the broker and are forgotten with it.

What this module does NOT do: validate JSON Schemas (they are carried, not checked), or
persist anything.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dcp._core.broker.dialects import Dialect
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.records import Service
from dcp._json import decode_json_limited, encode_json

if TYPE_CHECKING:
    from dcp._stats import BrokerStatistics

__all__ = [
    "BROKER",
    "DESCRIBE",
    "MAX_INFO",
    "MAX_INFO_DEPTH",
    "MAX_INFO_ITEMS",
    "MAX_WAITING",
    "PREFIX",
    "Directory",
    "Mmi",
    "answer",
    "broker_entry",
    "is_reserved",
    "parse_info",
    "service_entry",
]

#: Names the broker answers itself.
PREFIX = b"mmi."
#: The service a peer describes its services to (Rule D3).
DESCRIBE = b"mmi.describe"
#: Broker-wide figures (Rule D1).
BROKER = b"mmi.broker"
#: Largest info document, in bytes.
MAX_INFO = 65_536
#: The deepest nesting of arrays and objects in an info document.
MAX_INFO_DEPTH = 32
#: The most elements (values and containers, all levels together) in an info document.
MAX_INFO_ITEMS = 10_000
#: Descriptions waiting for their registration (Rule D3).
MAX_WAITING = 1024

#: SemVer 2.0.0 (semver.org's suggested pattern).
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_NS = 1_000_000_000


def is_reserved(name: bytes) -> bool:
    """Rule D2: whether ``name`` is the broker's own."""
    return name[:4] == PREFIX


def text(name: bytes) -> str:
    """A service name as JSON text (bytes that are not UTF-8 are escaped)."""
    return name.decode("utf-8", "backslashreplace")


class Name:
    """A service name as logs show it (:func:`text`, quoted, cut to 64 bytes), formatted only
    if a record is emitted."""

    __slots__ = ("name",)

    def __init__(self, name: bytes) -> None:
        self.name = name

    def __str__(self) -> str:
        return repr(text(self.name[:64]))


def parse_info(raw: bytes) -> dict[str, Any]:
    """Rule D3: a service's info from its JSON document.

    Fields (all optional): ``version`` (SemVer), ``description`` (text), ``metadata``
    (an object of text values), ``request_schema`` and ``response_schema`` (JSON Schemas:
    objects or booleans). Other fields are dropped.

    :raises ValueError: it is not such a document (the message says why)
    """
    # Size, depth and element count before anything is parsed (dcp._json).
    doc = decode_json_limited(
        raw, max_bytes=MAX_INFO, max_depth=MAX_INFO_DEPTH, max_items=MAX_INFO_ITEMS, name="info"
    )
    if not isinstance(doc, dict):
        raise ValueError("info must be a JSON object")
    info: dict[str, Any] = {}
    version = doc.get("version")
    if version is not None:
        if not isinstance(version, str) or not _SEMVER.match(version):
            raise ValueError(f"version {version!r} is not SemVer")
        info["version"] = version
    description = doc.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise ValueError("description must be text")
        info["description"] = description
    metadata = doc.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()
        ):
            raise ValueError("metadata must be an object of text values")
        info["metadata"] = metadata
    for key in ("request_schema", "response_schema"):
        schema = doc.get(key)
        if schema is not None:
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"{key} must be a JSON Schema (an object or a boolean)")
            info[key] = schema
    return info


def service_entry(service: Service, info: dict[str, Any] | None) -> dict[str, Any]:
    """One service as ``mmi.services`` lists it (Rules D4, D5)."""
    idle = len(service.idle)
    entry: dict[str, Any] = {
        "name": text(service.name),
        "workers": service.workers,
        "idle": idle,
        "busy": service.workers - idle,
        "queued": service.queued(),
        "version": "",
        "description": "",
    }
    if info is not None:
        entry["version"] = info.get("version", "")
        entry["description"] = info.get("description", "")
    return entry


def stats_entry(service: Service, now: float) -> dict[str, Any]:
    """One service's stats (Rule D5; NATS ADR-32's names where they fit, times in ns)."""
    done = service.answered
    total = round(service.busy_time * _NS)
    queue = service.queue
    oldest = max(0.0, now - queue[0].since) if queue else 0.0
    idle = len(service.idle)
    return {
        "type": "io.dcp.v1.stats_response",
        "name": text(service.name),
        "num_requests": service.requests,
        "num_errors": service.errors,
        "num_answered": done,
        "processing_time": total,
        "average_processing_time": total // done if done else 0,
        "queued": service.queued(),
        "oldest_queued_age": oldest,
        "workers": service.workers,
        "idle": idle,
        "busy": service.workers - idle,
    }


def broker_entry(
    stats: BrokerStatistics, uptime: float, errors: int, busy: int, listed: int = 0
) -> dict[str, Any]:
    """Rule D1: the broker-wide figures ``mmi.broker`` answers (times in seconds). The
    counters count since the broker started, except ``errors``: the error replies of the
    services known now (as ``mmi.stats`` lists them). ``requests`` is the requests of the
    services known now (``listed``) plus ``forgotten_requests``: those of services the
    broker has since forgotten (Rule D5), so ``dcp top`` can reconcile the two.

    :param errors: error replies of every service known now, together
    :param busy: workers holding at least one request
    :param listed: requests of every service known now, together
    """
    return {
        "type": "io.dcp.v1.broker_stats",
        "uptime": uptime,
        "workers": stats.workers,
        "idle": stats.workers - busy,
        "busy": busy,
        "clients": stats.clients,
        "services": len(stats.services),
        "requests": stats.requests,
        "replies": stats.replies,
        "errors": errors,
        "forwards": stats.forwards,
        "redeliveries": stats.redeliveries,
        "dropped_replies": stats.dropped_replies,
        "expired_workers": stats.expired_workers,
        "work_timeouts": stats.work_timeouts,
        "queued": sum(s.queued for s in stats.services.values()),
        "rejections": dict(stats.rejections),
        "forgotten_requests": stats.requests - listed,
        "expired_in_queue": stats.expired_in_queue,
        "replaced": stats.replaced,
    }


class Directory:
    """What workers said about their services (Rules D3, D4); read by :func:`answer`."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self.max_waiting = max_waiting
        #: Descriptions waiting for their registration, by (peer, service).
        self.waiting: OrderedDict[tuple[bytes, bytes], dict[str, Any]] = OrderedDict()
        #: Info of registered workers: service -> peer -> info (newest last).
        self.infos: dict[bytes, dict[bytes, dict[str, Any]]] = {}

    def describe(self, peer: bytes, name: bytes, info: dict[str, Any], registered: bool) -> None:
        """Rule D3: ``peer`` describes ``name`` (``registered``: it provides it already)."""
        if registered:
            infos = self.infos.setdefault(name, {})
            infos.pop(peer, None)
            infos[peer] = info
            return
        key = (peer, name)
        self.waiting.pop(key, None)
        self.waiting[key] = info
        while len(self.waiting) > self.max_waiting:
            self.waiting.popitem(last=False)

    def waiting_info(self, peer: bytes, name: bytes) -> dict[str, Any] | None:
        """The description ``peer`` gave of ``name`` before registering it, if any."""
        return self.waiting.get((peer, name))

    def registered(self, peer: bytes, name: bytes) -> None:
        """``peer`` now provides ``name``: its waiting description, if any, becomes its info."""
        info = self.waiting.pop((peer, name), None)
        if info is not None:
            self.describe(peer, name, info, registered=True)

    def forget(self, peer: bytes, names: Sequence[bytes]) -> None:
        """Rule D4: ``peer`` left; its info goes with it."""
        for name in names:
            infos = self.infos.get(name)
            if infos is not None and infos.pop(peer, None) is not None and not infos:
                del self.infos[name]

    def info(self, name: bytes) -> dict[str, Any] | None:
        """Rule D4: the info ``name`` shows (its newest worker's), or ``None``."""
        infos = self.infos.get(name)
        if not infos:
            return None
        return next(reversed(infos.values()))

    def versions(self, name: bytes) -> list[str]:
        """Every version ``name``'s workers gave, sorted."""
        infos = self.infos.get(name) or {}
        return sorted({i["version"] for i in infos.values() if "version" in i})

    def info_entry(self, service: Service, now: float) -> dict[str, Any]:
        """One service's info (NATS ADR-32's INFO shape where it fits)."""
        info = self.info(service.name) or {}
        return {
            "type": "io.dcp.v1.info_response",
            "name": text(service.name),
            "version": info.get("version", ""),
            "versions": self.versions(service.name),
            "description": info.get("description", ""),
            "metadata": info.get("metadata", {}),
            "request_schema": info.get("request_schema"),
            "response_schema": info.get("response_schema"),
            "workers": service.workers,
        }


def answer(
    name: bytes,
    data: Sequence[bytes],
    served: Callable[[bytes], bool],
    services: dict[bytes, Service] | None = None,
    directory: Directory | None = None,
    now: float = 0.0,
) -> tuple[bytes, ...]:
    """Rule D1: the reply data answering a request for ``name`` (an ``mmi.*`` name, other
    than ``mmi.describe``, which needs the sender: :meth:`Directory.describe`).

    :param served: whether some worker serves a service
    :param services: the routing part's services, by name (discovery needs them)
    """
    if name == b"mmi.service":
        return (b"200",) if data and served(bytes(data[-1])) else (b"404",)
    if services is None or directory is None:
        return (b"501",)
    if name == b"mmi.services":
        listing = [service_entry(s, directory.info(n)) for n, s in services.items()]
        return (encode_json(listing),)
    if name == b"mmi.info" or name == b"mmi.stats":
        one = directory.info_entry if name == b"mmi.info" else _stats
        wanted = bytes(data[-1]) if data else b""
        if not wanted:
            return (encode_json([one(s, now) for s in services.values()]),)
        service = services.get(wanted)
        if service is None:
            return (b"404",)
        return (encode_json(one(service, now)),)
    return (b"501",)


class Mmi:
    """The ``mmi.*`` services, answered by the broker itself (Rules D1, D3).

    :param outputs: where answers and refusals go
    :param directory: what workers said about their services
    :param sessions: the registered workers (a description of a service its sender
        provides already applies at once)
    :param services: the routing part's services, by name (read, never changed)
    :param overview: the broker-wide figures ``mmi.broker`` answers (:func:`broker_entry`)
    """

    def __init__(
        self,
        outputs: Outputs,
        directory: Directory,
        sessions: Sessions,
        services: dict[bytes, Service],
        overview: Callable[[], dict[str, Any]],
    ) -> None:
        self._out = outputs
        self._directory = directory
        self._sessions = sessions
        self._services = services
        self._overview = overview

    def answer(
        self,
        client: bytes,
        origin: Dialect,
        name: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        now: float,
    ) -> None:
        """Rules D1, D3: answer ``client``'s request for ``name`` (an ``mmi.*`` name) in
        ``origin``, its dialect."""
        if name == DESCRIBE:
            answered: tuple[bytes, ...] = (self.describe(client, data),)
        elif name == BROKER:
            answered = (encode_json(self._overview()),)
        else:
            answered = self.listing(name, data, now)
        self._out.outbox.append(origin.reply(client, name, metadata, answered))

    def listing(self, name: bytes, data: Sequence[bytes], now: float) -> tuple[bytes, ...]:
        """Rule D1: the reply data for ``name`` (any ``mmi.*`` name but ``mmi.describe`` and
        ``mmi.broker``), from the services known now."""
        return answer(name, data, self.serves, self._services, self._directory, now)

    def serves(self, name: bytes) -> bool:
        """Whether some registered worker provides ``name``."""
        service = self._services.get(name)
        return service is not None and service.workers > 0

    def describe(self, peer: bytes, data: Sequence[bytes]) -> bytes:
        """Rule D3: ``peer`` describes a service (data ``[service, info]``): ``200`` or
        ``400``."""
        try:
            if len(data) != 2:
                raise ValueError(f"{len(data)} data parts; expected 2 (service, info)")
            name = bytes(data[0])
            info = parse_info(bytes(data[1]))
        except ValueError as exc:
            self._out.reject(peer, "bad_service_info", str(exc))
            return b"400"
        worker = self._sessions.workers.get(peer)
        registered = worker is not None and any(s.name == name for s in worker.services)
        self._directory.describe(peer, name, info, registered)
        return b"200"


def _stats(service: Service, now: float) -> dict[str, Any]:
    return stats_entry(service, now)
