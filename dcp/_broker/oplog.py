"""What the broker's driver logs for operators beyond the core's own lines: the periodic
one-line summary (``Broker(log_summary=...)``, ``dcp broker --log-summary``) and the
per-message DEBUG descriptions (``docs/operations.md``).

Rules:

Rule O1 - The broker core does no I/O, logging included: it leaves its lines among its events
   and the driver writes them (:func:`write_log`) whenever it drains the core.
Rule O2 - Nothing here is formatted unless a record is emitted: the per-message path checks
   ``logger.isEnabledFor(logging.DEBUG)`` once per batch, and :class:`Frames` formats
   itself only when a handler asks for the message.
Rule O3 - The summary reads the core's broker-wide figures (the ``mmi.broker`` document, so
   ``dcp top`` and the log agree) every ``interval`` seconds and logs one INFO line: rates
   over the interval, totals, queue depth, workers idle and busy, clients waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import anyio

from dcp._core.broker.approval import ApprovalRequest
from dcp._core.broker.outputs import Event, LogLine

__all__ = ["Frames", "log_summaries", "read_racy", "summary_line", "write_log"]

logger = logging.getLogger("dcp.broker")

T = TypeVar("T")


def read_racy(read: Callable[[], T]) -> T:
    """``read()`` of state another thread (the broker's I/O thread) may change meanwhile: a
    read that raced a change (a dict resized while copied) is simply taken again."""
    for _ in range(100):
        try:
            return read()
        except RuntimeError:  # pragma: no cover - a rare race
            time.sleep(0)
    return read()  # pragma: no cover


def write_log(events: Iterable[Event]) -> list[ApprovalRequest]:
    """Log the lines among the broker core's ``events`` (the core does no I/O); the other
    events (approval questions), in order."""
    others = []
    for event in events:
        if isinstance(event, LogLine):
            logger.log(event.level, event.msg, *event.args)
        else:
            others.append(event)
    return others


class Frames:
    """One message as a DEBUG line shows it: frame count, bytes, and the first frames (cut to
    16 bytes each), formatted only if the record is emitted."""

    __slots__ = ("frames",)

    def __init__(self, frames: list[Any]) -> None:
        self.frames = frames

    def __str__(self) -> str:
        sizes = [len(f) for f in self.frames]
        head = " ".join(bytes(f[:16]).hex() or "-" for f in self.frames[1:5])
        return f"{len(sizes)} frame(s), {sum(sizes)} bytes: {head}"


def _delta(now: Mapping[str, Any], before: Mapping[str, Any], key: str) -> int:
    value = int(now.get(key, 0))
    old = int(before.get(key, 0))
    return value - old if value >= old else value


def summary_line(before: Mapping[str, Any], now: Mapping[str, Any], elapsed: float) -> str:
    """The summary of ``now`` against ``before`` (two ``mmi.broker`` documents,
    ``elapsed`` seconds apart; Rule O3)."""
    seconds = elapsed if elapsed > 0 else 1.0
    refused = sum(now.get("rejections", {}).values()) - sum(before.get("rejections", {}).values())
    workers = int(now.get("workers", 0))
    busy = int(now.get("busy", 0))
    return (
        f"summary: {_delta(now, before, 'requests') / seconds:.1f} req/s, "
        f"{_delta(now, before, 'replies') / seconds:.1f} replies/s, "
        f"errors {now.get('errors', 0)} (+{_delta(now, before, 'errors')}), "
        f"queued {now.get('queued', 0)}, "
        f"workers {workers} ({workers - busy} idle, {busy} busy), "
        f"clients {now.get('clients', 0)}, "
        f"redelivered +{_delta(now, before, 'redeliveries')}, "
        f"refused +{max(0, refused)}"
    )


async def log_summaries(read: Callable[[], Mapping[str, Any]], interval: float) -> None:
    """Rule O3: log :func:`summary_line` every ``interval`` seconds until cancelled."""
    before = read_racy(read)
    then = anyio.current_time()
    while True:
        await anyio.sleep(interval)
        now = read_racy(read)
        at = anyio.current_time()
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s", summary_line(before, now, at - then))
        before, then = now, at
