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
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from dcp._stats import DURATION_BUCKETS, BrokerSnapshot

__all__ = ["DEFAULT_LIMIT", "LISTS", "MAX_LIMIT", "Paging", "document", "list_page"]

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


def _whole(query: dict[str, list[str]], name: str, default: int) -> int:
    if name not in query:
        return default
    text = query[name][-1]
    if not text.isdigit():
        raise ValueError(f"{name} must be a whole number, not {text!r}")
    return int(text)


def _items(snap: BrokerSnapshot, kind: str) -> list[dict[str, Any]]:
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
    return [attrs.asdict(r, value_serializer=_lists) for r in rows]


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


def list_page(snap: BrokerSnapshot, kind: str, paging: Paging) -> dict[str, Any]:
    """``/status/<kind>``: one list's page (Rule HS1).

    :raises ValueError: the list has no such field to sort by
    """
    return _page(_items(snap, kind), kind, paging, strict=True)


def document(
    snap: BrokerSnapshot,
    paging: Paging,
    *,
    version: str,
    started: float,
    endpoints: list[str],
) -> dict[str, Any]:
    """``/status``: the whole document (schema in ``docs/operations.md``).

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
        "peers": [
            {"kind": kind, "dialect": dialect, "count": count}
            for (kind, dialect), count in sorted(snap.peers.items())
        ],
        "services": _page(_items(snap, "services"), "services", paging, strict=False),
        **{
            kind: _page(_items(snap, kind), kind, paging, strict=False)
            if paging.peers
            else {"total": total, "offset": 0, "limit": 0, "sort": LISTS[kind], "items": []}
            for kind, total in (("workers", stats.workers), ("clients", stats.clients))
        },
    }
