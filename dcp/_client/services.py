"""The broker's answers about services as typed objects (:class:`ServiceSummary`,
:class:`ServiceInfo`, :class:`ServiceStats`), read from the answers to ``mmi.services``,
``mmi.info`` and ``mmi.stats``, and the changes :meth:`dcp.Client.watch_services` reports
(``docs/services.md``). No I/O: both clients ask the questions and hand the answers here.

A client of several brokers asks each live broker and merges the answers (:func:`merge_summaries`,
:func:`merge_info`, :func:`merge_stats`): for one service, the counts (workers, idle, busy,
queued, requests, errors, processing time) are summed, the oldest queued age is the largest,
and the other fields come from the first broker (in the order given) that knows it. A worker
registered with two brokers is counted at each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from dcp._json import decode_json
from dcp._models import Response

__all__ = [
    "ServiceChange",
    "ServiceInfo",
    "ServiceStats",
    "ServiceSummary",
    "ServiceWatch",
    "mmi_answer",
    "mmi_args",
    "merge_info",
    "merge_stats",
    "merge_summaries",
    "mmi_page",
    "service_info",
    "service_stats",
    "summaries",
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


def mmi_args(name: str | bytes | None) -> tuple[bytes, ...]:
    """The data of an ``mmi.*`` question about service ``name`` (``None``: about all)."""
    if name is None:
        return ()
    return (name.encode() if isinstance(name, str) else bytes(name),)


def mmi_answer(question: str, response: Response) -> Any:
    """The broker's answer to ``question`` (an ``mmi.*`` service), decoded from JSON;
    ``None`` if it knows no such service.

    :raises RuntimeError: the broker does not answer it (not a dcp broker)
    """
    if response.data == (b"404",):
        return None
    if response.data == (b"501",):
        raise RuntimeError(f"the broker does not answer {question} (not a dcp broker?)")
    return decode_json(response.bytes, name=f"{question} answer")


def mmi_page(
    question: str, response: Response, after: bytes | None
) -> tuple[list[dict[str, Any]], bytes | None]:
    """One page of the broker's listing answering ``question`` (directory Rule D6): its
    entries, and the cursor to ask for the next page with (``None``: the last page).

    :param after: the cursor this page was asked with (``None``: the first page)
    :raises RuntimeError: the broker does not answer it (not a dcp broker)
    :raises ValueError: the answer is not a listing, or its cursor does not move on
    """
    data = response.data
    if data == (b"501",):
        raise RuntimeError(f"the broker does not answer {question} (not a dcp broker?)")
    if len(data) not in (1, 2):
        raise ValueError(f"{question} answer: {len(data)} data parts; expected 1 or 2")
    listing = decode_json(data[0], name=f"{question} answer")
    if not isinstance(listing, list):
        raise ValueError(f"{question} answer is not a JSON list")
    if len(data) == 1:
        return listing, None
    cursor = bytes(data[1])
    if after is not None and cursor <= after:
        raise ValueError(f"{question} answer: its cursor does not move on")
    return listing, cursor


def _known(cls: type[Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` in ``doc`` (a newer broker may say more)."""
    return {f.name: doc[f.name] for f in attrs.fields(cls) if f.name in doc}


def summaries(listing: list[dict[str, Any]]) -> list[ServiceSummary]:
    """Every service in the ``mmi.services`` answer."""
    return [ServiceSummary(**_known(ServiceSummary, entry)) for entry in listing]


def service_info(doc: dict[str, Any] | None) -> ServiceInfo | None:
    """One service's info from the ``mmi.info`` answer (``None``: no such service)."""
    if doc is None:
        return None
    doc["versions"] = tuple(doc["versions"])
    return ServiceInfo(**_known(ServiceInfo, doc))


def service_stats(doc: dict[str, Any] | None) -> ServiceStats | None:
    """One service's stats from the ``mmi.stats`` answer (``None``: no such service)."""
    if doc is None:
        return None
    for key in ("processing_time", "average_processing_time"):
        doc[key] = doc[key] / 1e9
    return ServiceStats(**_known(ServiceStats, doc))


class ServiceWatch:
    """What :meth:`dcp.Client.watch_services` (and the sync client's) has seen: each new
    ``mmi.services`` listing gives the changes since the one before, first one ``up`` change
    per service served at the start.

    :param interval: seconds between listings (checked here)
    :raises ValueError: ``interval`` is not a positive finite number
    """

    def __init__(self, interval: float) -> None:
        if not interval > 0 or math.isinf(interval):
            raise ValueError("interval must be a positive finite number")
        self._known: dict[str, int] = {}

    def changes(self, listing: list[ServiceSummary]) -> list[ServiceChange]:
        """The services that came up (now served by a worker), then those that went down."""
        now = {s.name: s.workers for s in listing if s.workers}
        known = self._known
        changes = [ServiceChange(name, True, n) for name, n in now.items() if name not in known]
        changes += [ServiceChange(name, False, 0) for name in known if name not in now]
        self._known = now
        return changes


def merge_summaries(listings: list[list[ServiceSummary]]) -> list[ServiceSummary]:
    """Several brokers' listings as one, by name (counts summed, the rest from the first)."""
    merged: dict[str, ServiceSummary] = {}
    for listing in listings:
        for s in listing:
            m = merged.get(s.name)
            merged[s.name] = (
                s
                if m is None
                else attrs.evolve(
                    m,
                    workers=m.workers + s.workers,
                    idle=m.idle + s.idle,
                    busy=m.busy + s.busy,
                    queued=m.queued + s.queued,
                )
            )
    return sorted(merged.values(), key=lambda s: s.name)


def merge_info(answers: list[ServiceInfo | None]) -> ServiceInfo | None:
    """Several brokers' ``mmi.info`` answers as one: the first that knows the service, with
    every broker's workers summed and versions joined; ``None`` if none knows it."""
    known = [a for a in answers if a is not None]
    if not known:
        return None
    versions = tuple(dict.fromkeys(v for a in known for v in a.versions))
    return attrs.evolve(known[0], versions=versions, workers=sum(a.workers for a in known))


def merge_stats(answers: list[ServiceStats | None]) -> ServiceStats | None:
    """Several brokers' ``mmi.stats`` answers as one (counts and times summed, the mean
    recomputed, the oldest queued age the largest); ``None`` if none knows the service."""
    known = [a for a in answers if a is not None]
    if not known:
        return None
    total = sum(a.processing_time for a in known)
    counted = [a for a in known if a.average_processing_time > 0]
    # The mean over the answered requests each broker timed (its total / its mean).
    timed = sum(a.processing_time / a.average_processing_time for a in counted)
    return attrs.evolve(
        known[0],
        num_requests=sum(a.num_requests for a in known),
        num_errors=sum(a.num_errors for a in known),
        processing_time=total,
        average_processing_time=total / timed if timed else 0.0,
        queued=sum(a.queued for a in known),
        oldest_queued_age=max(a.oldest_queued_age for a in known),
        workers=sum(a.workers for a in known),
        idle=sum(a.idle for a in known),
        busy=sum(a.busy for a in known),
    )
