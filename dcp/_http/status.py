"""``/status``: the broker as one JSON document, its long lists sortable and paged (NATS
``/connz`` style). The schema is in ``docs/operations.md`` (and checked by
``tests/http/test_endpoint.py``).

Rule HS1 - Lists (``services``, ``workers``, ``clients``) are pages: ``{"total", "offset",
  "limit", "sort", "items"}``. ``?sort=FIELD`` sorts by one of the items' fields, ascending;
  ``?sort=-FIELD`` descending (ties by ``name`` or ``id``); ``?limit=N`` (default
  :data:`DEFAULT_LIMIT`, at most :data:`MAX_LIMIT`) and ``?offset=N`` cut the page. On
  ``/status`` the parameters apply to every list that has the field; a field no list has is
  a ``400``. ``/status/<list>`` is that one list's page. ``/status?peers=0`` lists no
  workers or clients (their pages keep their totals, ``limit`` 0): the status page asks for
  that every second, so a broker with many clients does not list them all each time.
Rule HS2 - Default order: services and workers by name / id, clients by most requests in
  flight first.
Rule HS3 - No routing id is shown whole (a peer that learns another's id may connect under it
  once that one's connection drops, and get its replies; ``docs/security.md``). A worker's or
  client's ``id`` is a tag (:class:`PeerTags`): 8 hex digits of a BLAKE2b of the id keyed
  with a random key the endpoint draws when it starts, enough to tell peers apart, of no use
  to connect with, and not comparable across brokers or restarts.
Rule HS4 - The byte budget (``dcp._core.broker.budget``): every account's figures, as
  ``memory`` (``{"max_memory", "accounts": [{"name", "used", "peak", "limit",
  "peer_limit", "peers", "refused"}]}``; limits ``null`` without a budget).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

import attrs

from dcp._stats import DURATION_BUCKETS, BrokerSnapshot

__all__ = [
    "DEFAULT_LIMIT",
    "LISTS",
    "MAX_LIMIT",
    "Paging",
    "PeerTags",
    "document",
    "list_page",
    "memory",
]

DEFAULT_LIMIT = 1024
MAX_LIMIT = 100_000
#: The lists and their default sort (Rule HS2).
LISTS = {"services": "name", "workers": "id", "clients": "-inflight"}


@attrs.frozen
class Paging:
    """``?sort=&limit=&offset=&peers=`` (Rule HS1; ``sort`` ``None``: each list's default)."""

    sort: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    #: ``?peers=0``: ``/status`` lists no workers or clients (only their totals).
    peers: bool = True

    @classmethod
    def from_query(cls, query: dict[str, list[str]]) -> Paging:
        """:raises ValueError: a limit or offset that is not a whole number in range"""
        sort = query["sort"][-1] if "sort" in query else None
        limit = _whole(query, "limit", DEFAULT_LIMIT)
        if not 0 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be 0..{MAX_LIMIT}")
        peers = _whole(query, "peers", 1)
        if peers > 1:
            raise ValueError("peers must be 0 or 1")
        return cls(sort or None, limit, _whole(query, "offset", 0), bool(peers))


class PeerTags:
    """Rule HS3: routing ids as the endpoint shows them.

    :param key: the BLAKE2b key (default: 16 random bytes, drawn once)
    """

    #: Hex digits of a tag.
    DIGITS = 8

    def __init__(self, key: bytes | None = None) -> None:
        self._key = secrets.token_bytes(16) if key is None else key

    def tag(self, ident_hex: str) -> str:
        """The tag of the routing id ``ident_hex`` (hex, as snapshots carry it)."""
        digest = hashlib.blake2b(
            bytes.fromhex(ident_hex), key=self._key, digest_size=self.DIGITS // 2
        )
        return digest.hexdigest()


def _whole(query: dict[str, list[str]], name: str, default: int) -> int:
    if name not in query:
        return default
    text = query[name][-1]
    if not text.isdigit():
        raise ValueError(f"{name} must be a whole number, not {text!r}")
    return int(text)


def _items(snap: BrokerSnapshot, kind: str, tags: PeerTags) -> list[dict[str, Any]]:
    if kind == "services":
        items = []
        for s in snap.services:
            item = attrs.asdict(s)
            item["average_processing_time"] = s.processing_time / s.replies if s.replies else 0.0
            item["durations"] = {
                "buckets": list(DURATION_BUCKETS),
                "counts": list(s.durations),
            }
            items.append(item)
        return items
    rows = snap.workers if kind == "workers" else snap.clients
    items = [attrs.asdict(r, value_serializer=_lists) for r in rows]
    for item in items:
        item["id"] = tags.tag(item["id"])  # Rule HS3
    return items


def _lists(_: object, __: object, value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _page(items: list[dict[str, Any]], kind: str, paging: Paging, strict: bool) -> dict[str, Any]:
    sort = paging.sort
    if sort is None or (not strict and not _has(kind, sort)):
        sort = LISTS[kind]
    field = sort.lstrip("-")
    if not _has(kind, sort):
        raise ValueError(f"{kind} have no field {field!r} to sort by")
    tie = "name" if kind == "services" else "id"
    items.sort(key=lambda item: item[tie])
    if field != tie or sort.startswith("-"):
        items.sort(key=lambda item: _key(item[field]), reverse=sort.startswith("-"))
    start = min(paging.offset, len(items))
    return {
        "total": len(items),
        "offset": paging.offset,
        "limit": paging.limit,
        "sort": sort,
        "items": items[start : start + paging.limit],
    }


def _has(kind: str, sort: str) -> bool:
    return sort.lstrip("-") in _FIELDS[kind]


def _key(value: Any) -> Any:
    return ",".join(value) if isinstance(value, list) else value


_FIELDS = {
    "services": {
        "name",
        "workers",
        "idle",
        "busy",
        "queued",
        "oldest_queued_age",
        "requests",
        "replies",
        "errors",
        "redeliveries",
        "processing_time",
        "average_processing_time",
        "version",
        "description",
    },
    "workers": {"id", "dialect", "services", "held", "credit", "silent"},
    "clients": {"id", "dialect", "inflight", "queued"},
}


def list_page(snap: BrokerSnapshot, kind: str, paging: Paging, tags: PeerTags) -> dict[str, Any]:
    """``/status/<kind>``: one list's page (Rules HS1, HS3).

    :raises ValueError: the list has no such field to sort by
    """
    return _page(_items(snap, kind, tags), kind, paging, strict=True)


def memory(snap: BrokerSnapshot) -> dict[str, Any]:
    """Rule HS4: the byte budget's figures."""
    stats = snap.statistics
    return {
        "max_memory": stats.max_memory,
        "accounts": [attrs.asdict(a) for a in stats.memory],
    }


def document(
    snap: BrokerSnapshot,
    paging: Paging,
    *,
    version: str,
    started: float,
    endpoints: list[str],
    tags: PeerTags,
    http: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``/status``: the whole document (schema in ``docs/operations.md``).

    :param tags: how routing ids are shown (Rule HS3)
    :param http: requests the endpoint refused, by reason

    :raises ValueError: no list has the field to sort by
    """
    if paging.sort is not None and not any(_has(k, paging.sort) for k in LISTS):
        raise ValueError(f"no list has a field {paging.sort.lstrip('-')!r} to sort by")
    stats = snap.statistics
    now = time.time()
    counters = {
        name: getattr(stats, name)
        for name in (
            "requests",
            "replies",
            "partials",
            "forwards",
            "dispatched",
            "redeliveries",
            "dropped_replies",
            "undeliverable",
            "reconnects_sent",
            "unmatched",
            "expired_workers",
            "work_timeouts",
            "expired_in_queue",
            "replaced",
        )
    }
    return {
        "version": version,
        "now": now,
        "started": started,
        "uptime": max(0.0, now - started),
        "endpoints": list(endpoints),
        "counters": counters,
        "rejections": dict(sorted(stats.rejections.items())),
        "http_refused": dict(sorted((http or {}).items())),
        "memory": memory(snap),
        "peers": [
            {"kind": kind, "dialect": dialect, "count": count}
            for (kind, dialect), count in sorted(snap.peers.items())
        ],
        "services": _page(_items(snap, "services", tags), "services", paging, strict=False),
        **{
            kind: _page(_items(snap, kind, tags), kind, paging, strict=False)
            if paging.peers
            else {"total": total, "offset": 0, "limit": 0, "sort": LISTS[kind], "items": []}
            for kind, total in (("workers", stats.workers), ("clients", stats.clients))
        },
    }
