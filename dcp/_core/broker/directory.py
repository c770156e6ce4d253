"""Services the broker answers itself (ZeroMQ RFC 8, MMI, and dcp's discovery), for every
dialect (:class:`Mmi`), and what workers say about the services they provide
(:class:`Directory`). Pure: no clocks (``now`` is the time of the call), no sockets.

Rule D1 - A request for a name starting with ``mmi.`` is answered by the broker, never
  queued. ``mmi.service``: ``200`` if a worker serves the service named by the request's last
  data part, ``404`` if none does (the zguide broker replaces the request body with it).
  ``mmi.services``: a JSON list, an entry per known service (:func:`service_entry`), in
  pages (Rule D6). ``mmi.info`` / ``mmi.stats``: one JSON object about the service named by
  the last data part (``404`` if no worker serves it and nothing is queued for it); without
  a name (no data, or one empty part), a JSON list with one object per known service, in
  pages (Rule D6). ``mmi.describe`` (Rule D3). ``mmi.broker``: one JSON object of
  broker-wide figures (:func:`broker_entry`: uptime, peers, counters, refusals by reason;
  what ``dcp top`` shows). Any other ``mmi.*`` name: ``501``.
Rule D2 - Workers may not register ``mmi.*`` names (refused: ``reserved_service``; with the
  other reserved names, admission Rule AD4).
Rule D3 - Descriptions. A peer describes a service with a request to ``mmi.describe`` whose
  data is ``[service, info]`` (*info*: one JSON object, :func:`parse_info`). It is answered
  ``200`` if the info is valid and the budget takes it (Rule D7), else ``400`` and the
  description is ignored (counted as ``bad_service_info``, or ``memory_budget``). A
  description of a service the peer is registered for replaces its info at once; otherwise
  it waits for the peer's registration of that service (so an approver sees it,
  :mod:`.approval`), at most :data:`MAX_WAITING` of them (the oldest is dropped) and at most
  ``waiting_ttl`` seconds (:data:`WAITING_TTL`).
Rule D4 - What a service shows. A service's info is that of its most recently registered
  (or described) worker that gave one; ``versions`` lists every version its workers gave.
  A worker that leaves takes its info, and its waiting descriptions, with it.
Rule D5 - Stats come from what routing keeps anyway: queue depth, the age of the oldest
  queued request (since it was queued, or requeued), idle and busy workers, and per-service
  counters updated in O(1) per request: requests, error replies, and the sum of processing
  times (dispatch to answer) of answered requests (the HTTP endpoint also reads their
  redeliveries and processing-time buckets, :data:`dcp._stats.DURATION_BUCKETS`). Counters
  start when the service becomes known to the broker and are forgotten with it.
Rule D6 - Pages. A listing (``mmi.services``; ``mmi.info`` / ``mmi.stats`` without a name)
  lists services in the byte order of their names, at most :data:`PAGE_ENTRIES` entries and
  :data:`PAGE_BYTES` bytes of JSON per answer (one entry always fits, however large). A page
  that is not the last is answered with a second data part, the *cursor*: the last name it
  lists. The next page is asked for with the cursor as the data (``mmi.services``:
  ``[cursor]``; ``mmi.info`` / ``mmi.stats``: ``["", cursor]``) and lists the names after
  it. A request without a cursor gets the first page. Building a page costs one pass over
  the names (picking the page's, :func:`heapq.nsmallest`) and the page's entries, never the
  whole list. DBP's listing cannot page: it gets the first page, ended by a marker entry
  (:func:`capped`).
Rule D7 - Bytes. What the directory keeps is charged to the ``directory`` account of the
  broker's byte budget (:mod:`.budget`, Rules MB1-MB4) under the peer that gave it: each
  description at the size of its parsed form (:func:`footprint`; an info whose parsed form
  is over :data:`MAX_INFO_FOOTPRINT` is refused as ``bad_service_info``), released when it is
  replaced, expires, or its peer leaves. A listing answer larger than
  :data:`CHARGED_ANSWER` is charged to its asker for :data:`LISTING_HOLD` seconds (zmq
  cannot say when a peer read it): a peer asking for more listings than its share of the
  account takes in that time is refused ``memory_budget`` (a dcp error reply; an MDP client
  is told nothing).

What this module does NOT do: validate JSON Schemas (they are carried, not checked), or
persist anything.
"""

from __future__ import annotations

import heapq
import re
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from dcp._core.broker.budget import ENTRY_OVERHEAD, Account, cost
from dcp._core.broker.dialects import Dialect
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.records import Service
from dcp._json import decode_json_limited, encode_json

if TYPE_CHECKING:
    from dcp._stats import BrokerStatistics

__all__ = [
    "BROKER",
    "CHARGED_ANSWER",
    "DESCRIBE",
    "LISTING_HOLD",
    "MAX_INFO",
    "MAX_INFO_FOOTPRINT",
    "MAX_INFO_DEPTH",
    "MAX_INFO_ITEMS",
    "MAX_WAITING",
    "PAGE_BYTES",
    "PAGE_ENTRIES",
    "PREFIX",
    "WAITING_TTL",
    "Directory",
    "Mmi",
    "answer",
    "broker_entry",
    "capped",
    "footprint",
    "page",
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
#: Largest parsed info, in bytes (Rule D7, :func:`footprint`): 16 times :data:`MAX_INFO`.
#: A 64 KiB JSON Schema of objects and text takes about 0.3 MB parsed; 64 KiB of empty
#: lists takes 1.4 MB, and is refused.
MAX_INFO_FOOTPRINT = 16 * MAX_INFO
#: The deepest nesting of arrays and objects in an info document.
MAX_INFO_DEPTH = 32
#: The most elements (values and containers, all levels together) in an info document.
MAX_INFO_ITEMS = 10_000
#: Descriptions waiting for their registration (Rule D3).
MAX_WAITING = 1024
#: Seconds a description waits for its registration (Rule D3): longer than an approver
#: should take, short enough that a peer that never registers does not keep it.
WAITING_TTL = 60.0
#: Most entries in one listing answer (Rule D6).
PAGE_ENTRIES = 500
#: Most bytes of JSON in one listing answer (Rule D6), unless its one entry is larger.
PAGE_BYTES = 64 * 1024
#: Listing answers larger than this are charged to their asker (Rule D7).
CHARGED_ANSWER = 4096
#: Seconds a listing answer stays charged to its asker (Rule D7): with the default budget,
#: one peer may be sent about 6 MB of listings a second (``dcp top`` of 10,000 services
#: takes about 3 MB), every peer together about 25 MB.
LISTING_HOLD = 2.0

#: SemVer 2.0.0 (semver.org's suggested pattern).
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_NS = 1_000_000_000


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
    size = footprint(info)
    if size > MAX_INFO_FOOTPRINT:
        raise ValueError(f"info takes {size} bytes parsed; the limit is {MAX_INFO_FOOTPRINT}")
    return info


def footprint(doc: Any) -> int:
    """Rule D7: about what parsed JSON ``doc`` takes in memory (:func:`sys.getsizeof` of
    each object in it, shared ones counted each time they appear); no recursion, so any
    depth is measured."""
    total = 0
    stack = [doc]
    size = sys.getsizeof
    while stack:
        obj = stack.pop()
        total += size(obj)
        if isinstance(obj, dict):
            stack += obj.keys()
            stack += obj.values()
        elif isinstance(obj, list):
            stack += obj
    return total


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
        "answered_elsewhere": stats.answered_elsewhere,
        "max_memory": stats.max_memory,
        "memory": {
            a.name: {"used": a.used, "peak": a.peak, "limit": a.limit, "refused": a.refused}
            for a in stats.memory
        },
    }


class Described:
    """One description the directory keeps (Rule D7): its info, what it was charged, and
    when it was given."""

    __slots__ = ("charged", "info", "since")

    def __init__(self, info: dict[str, Any], charged: int, since: float) -> None:
        self.info = info
        self.charged = charged
        self.since = since


class Directory:
    """What workers said about their services (Rules D3, D4, D7); read by :func:`answer`.

    :param max_waiting: descriptions waiting for their registration, at most (Rule D3)
    :param account: where what it keeps is charged (Rule D7; ``None``: nowhere)
    :param outputs: the time of the input being handled, and where refusals are counted
        (``None``: time stands at 0, refusals are not counted)
    :param waiting_ttl: seconds a description waits for its registration (Rule D3)
    """

    def __init__(
        self,
        max_waiting: int = MAX_WAITING,
        *,
        account: Account | None = None,
        outputs: Outputs | None = None,
        waiting_ttl: float = WAITING_TTL,
    ) -> None:
        self.max_waiting = max_waiting
        self.waiting_ttl = waiting_ttl
        self._account = account
        self._out = outputs
        #: Descriptions waiting for their registration, by (peer, service), oldest first.
        self.waiting: OrderedDict[tuple[bytes, bytes], Described] = OrderedDict()
        #: Info of registered workers: service -> peer -> description (newest last).
        self.infos: dict[bytes, dict[bytes, Described]] = {}

    def _now(self) -> float:
        return 0.0 if self._out is None else self._out.now

    def _release(self, peer: bytes, described: Described | None) -> None:
        if described is not None and self._account is not None:
            self._account.release(peer, described.charged)

    def _charge(self, peer: bytes, name: bytes, info: dict[str, Any]) -> Described | None:
        """Rule D7: charge a description to ``peer``; ``None`` (counted) if refused."""
        charged = footprint(info) + len(name) + ENTRY_OVERHEAD
        account = self._account
        if account is not None and not account.charge(peer, charged):
            if self._out is not None:
                self._out.reject(
                    peer,
                    "memory_budget",
                    "description of %s (%d bytes) over the directory budget",
                    Name(name),
                    charged,
                )
            return None
        return Described(info, charged, self._now())

    def describe(self, peer: bytes, name: bytes, info: dict[str, Any], registered: bool) -> bool:
        """Rule D3: ``peer`` describes ``name`` (``registered``: it provides it already).
        ``False`` if the budget refused it (Rule D7: counted as ``memory_budget``; a
        description it replaces is dropped too)."""
        self.expire(self._now())
        if registered:
            infos = self.infos.setdefault(name, {})
            self._release(peer, infos.pop(peer, None))
            described = self._charge(peer, name, info)
            if described is None:
                if not infos:
                    del self.infos[name]
                return False
            infos[peer] = described
            return True
        key = (peer, name)
        self._release(peer, self.waiting.pop(key, None))
        described = self._charge(peer, name, info)
        if described is None:
            return False
        self.waiting[key] = described
        while len(self.waiting) > self.max_waiting:
            (old, _), dropped = self.waiting.popitem(last=False)
            self._release(old, dropped)
        return True

    def waiting_info(self, peer: bytes, name: bytes) -> dict[str, Any] | None:
        """The description ``peer`` gave of ``name`` before registering it, if any."""
        described = self.waiting.get((peer, name))
        return None if described is None else described.info

    def registered(self, peer: bytes, name: bytes) -> None:
        """``peer`` now provides ``name``: its waiting description, if any, becomes its info
        (charged as it was)."""
        described = self.waiting.pop((peer, name), None)
        if described is not None:
            infos = self.infos.setdefault(name, {})
            self._release(peer, infos.pop(peer, None))
            infos[peer] = described

    def forget(self, peer: bytes, names: Sequence[bytes]) -> None:
        """Rule D4: ``peer`` left; its info, and its waiting descriptions, go with it."""
        for name in names:
            infos = self.infos.get(name)
            if infos is not None:
                self._release(peer, infos.pop(peer, None))
                if not infos:
                    del self.infos[name]
        if self.waiting:
            for key in [k for k in self.waiting if k[0] == peer]:
                self._release(peer, self.waiting.pop(key))

    def expire(self, now: float) -> None:
        """Rule D3: drop the descriptions that waited ``waiting_ttl`` for a registration."""
        waiting = self.waiting
        limit = now - self.waiting_ttl
        while waiting:
            key, described = next(iter(waiting.items()))
            if described.since > limit:
                break
            del waiting[key]
            self._release(key[0], described)

    def next_expiry(self) -> float | None:
        """When the oldest waiting description expires (``None``: none waits)."""
        for described in self.waiting.values():
            return described.since + self.waiting_ttl
        return None

    def info(self, name: bytes) -> dict[str, Any] | None:
        """Rule D4: the info ``name`` shows (its newest worker's), or ``None``."""
        infos = self.infos.get(name)
        if not infos:
            return None
        return next(reversed(infos.values())).info

    def versions(self, name: bytes) -> list[str]:
        """Every version ``name``'s workers gave, sorted."""
        infos = self.infos.get(name) or {}
        return sorted({d.info["version"] for d in infos.values() if "version" in d.info})

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


def page(
    services: dict[bytes, Service],
    entry: Callable[[Service], bytes],
    after: bytes | None = None,
    *,
    entries: int = PAGE_ENTRIES,
    size: int = PAGE_BYTES,
) -> tuple[bytes, ...]:
    """Rule D6: one page of a listing, ``(json,)`` if it is the last, else ``(json,
    cursor)``.

    :param entry: one service's JSON entry
    :param after: the cursor of the page before (``None``: the first page)
    :param entries: most entries in the page
    :param size: most bytes of JSON in the page (its first entry always fits)
    """
    parts, cursor = _page(services, entry, after, entries, size)
    body = b"[" + b",".join(parts) + b"]"
    return (body,) if cursor is None else (body, cursor)


def _page(
    services: dict[bytes, Service],
    entry: Callable[[Service], bytes],
    after: bytes | None,
    entries: int,
    size: int,
) -> tuple[list[bytes], bytes | None]:
    """Rule D6: a page's entries, and its cursor (``None``: the last page)."""
    names: Iterable[bytes] = services if after is None else (n for n in services if n > after)
    chosen = heapq.nsmallest(entries + 1, names)
    parts: list[bytes] = []
    total = 2
    for name in chosen[:entries]:
        part = entry(services[name])
        if parts and total + len(part) + 1 > size:
            break
        parts.append(part)
        total += len(part) + 1
    return parts, (chosen[len(parts) - 1] if len(parts) < len(chosen) else None)


def capped(
    services: dict[bytes, Service],
    entry: Callable[[Service], bytes],
    *,
    entries: int = PAGE_ENTRIES,
    size: int = PAGE_BYTES,
) -> bytes:
    """Rule D6, for a dialect that cannot page (DBP): the first page; if more services are
    known, it ends with a marker entry ``{"truncated": true, "listed": n, "services":
    total}``."""
    parts, cursor = _page(services, entry, None, entries, size)
    if cursor is not None:
        marker = {"truncated": True, "listed": len(parts), "services": len(services)}
        parts.append(encode_json(marker))
    return b"[" + b",".join(parts) + b"]"


def answer(
    name: bytes,
    data: Sequence[bytes],
    served: Callable[[bytes], bool],
    services: dict[bytes, Service] | None = None,
    directory: Directory | None = None,
    now: float = 0.0,
) -> tuple[bytes, ...]:
    """Rules D1, D6: the reply data answering a request for ``name`` (an ``mmi.*`` name,
    other than ``mmi.describe``, which needs the sender: :meth:`Directory.describe`).

    :param served: whether some worker serves a service
    :param services: the routing part's services, by name (discovery needs them)
    """
    if name == b"mmi.service":
        return (b"200",) if data and served(bytes(data[-1])) else (b"404",)
    if services is None or directory is None:
        return (b"501",)
    if name == b"mmi.services":
        after = bytes(data[0]) if len(data) == 1 and data[0] else None
        info = directory.info
        return page(services, lambda s: encode_json(service_entry(s, info(s.name))), after)
    if name == b"mmi.info" or name == b"mmi.stats":
        one = directory.info_entry if name == b"mmi.info" else stats_entry
        if len(data) == 2 and not data[0]:  # Rule D6: ["", cursor]
            after = bytes(data[1]) or None
            return page(services, lambda s: encode_json(one(s, now)), after)
        wanted = bytes(data[-1]) if data else b""
        if not wanted:
            return page(services, lambda s: encode_json(one(s, now)))
        service = services.get(wanted)
        if service is None:
            return (b"404",)
        return (encode_json(one(service, now)),)
    return (b"501",)


class Mmi:
    """The ``mmi.*`` services, answered by the broker itself (Rules D1, D3, D6, D7).

    :param outputs: where answers and refusals go
    :param directory: what workers said about their services
    :param sessions: the registered workers (a description of a service its sender
        provides already applies at once)
    :param services: the routing part's services, by name (read, never changed)
    :param overview: the broker-wide figures ``mmi.broker`` answers (:func:`broker_entry`)
    :param account: where listing answers are charged (Rule D7; ``None``: nowhere)
    :param hold: seconds a listing answer stays charged (Rule D7)
    """

    def __init__(
        self,
        outputs: Outputs,
        directory: Directory,
        sessions: Sessions,
        services: dict[bytes, Service],
        overview: Callable[[], dict[str, Any]],
        *,
        account: Account | None = None,
        hold: float = LISTING_HOLD,
    ) -> None:
        self._out = outputs
        self._directory = directory
        self._sessions = sessions
        self._services = services
        self._overview = overview
        self._account = account
        self._hold = hold
        #: Listing answers charged (Rule D7): (when released, peer, bytes), oldest first.
        self._charged: deque[tuple[float, bytes, int]] = deque()

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
        ``origin``, its dialect (Rule D7: a listing over the client's share is refused
        ``memory_budget``)."""
        if name == DESCRIBE:
            answered: tuple[bytes, ...] = (self.describe(client, data),)
        elif name == BROKER:
            answered = (encode_json(self._overview()),)
        else:
            answered = self.listing(name, data, now)
            if not self.charge(client, answered, now):
                refusal = origin.error(
                    client, name, metadata, "memory_budget", "too many listings; ask later"
                )
                if refusal is not None:
                    self._out.outbox.append(refusal)
                return
        self._out.outbox.append(origin.reply(client, name, metadata, answered))

    def listing(self, name: bytes, data: Sequence[bytes], now: float) -> tuple[bytes, ...]:
        """Rules D1, D6: the reply data for ``name`` (any ``mmi.*`` name but
        ``mmi.describe`` and ``mmi.broker``), from the services known now."""
        return answer(name, data, self.serves, self._services, self._directory, now)

    def capped(self) -> bytes:
        """Rule D6: the ``mmi.services`` listing for a dialect that cannot page (DBP)."""
        info = self._directory.info
        return capped(self._services, lambda s: encode_json(service_entry(s, info(s.name))))

    def charge(self, peer: bytes, answered: Sequence[bytes], now: float) -> bool:
        """Rule D7: charge an answer of more than :data:`CHARGED_ANSWER` bytes to ``peer``
        for the hold; ``False`` (counted as ``memory_budget``) if its share is spent."""
        size = sum(len(part) for part in answered)
        account = self._account
        if size <= CHARGED_ANSWER or account is None:
            return True
        charged = cost(answered)
        if not account.charge(peer, charged):
            self._out.reject(
                peer, "memory_budget", "a listing answer (%d bytes) over its share", size
            )
            return False
        self._charged.append((now + self._hold, peer, charged))
        return True

    def expire(self, now: float) -> None:
        """Rules D3, D7: release the listing answers held long enough, and expire waiting
        descriptions."""
        charged = self._charged
        if charged:
            account = self._account
            assert account is not None
            while charged and charged[0][0] <= now:
                _, peer, n = charged.popleft()
                account.release(peer, n)
        self._directory.expire(now)

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do (``None``: nothing)."""
        due = self._directory.next_expiry()
        if self._charged:
            first = self._charged[0][0]
            if due is None or first < due:
                due = first
        return due

    def serves(self, name: bytes) -> bool:
        """Whether some registered worker provides ``name``."""
        service = self._services.get(name)
        return service is not None and service.workers > 0

    def describe(self, peer: bytes, data: Sequence[bytes]) -> bytes:
        """Rules D3, D7: ``peer`` describes a service (data ``[service, info]``): ``200``, or
        ``400`` (invalid, or over the budget)."""
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
        return b"200" if self._directory.describe(peer, name, info, registered) else b"400"
