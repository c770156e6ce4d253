"""Small primitives shared across layers (the sans-IO cores and the drivers), written once."""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = [
    "BYTES_LIKE",
    "DeadlineHeap",
    "Joined",
    "LogEvery",
    "LogOnce",
    "PeerId",
    "fixup_module_metadata",
    "to_bytes",
]

T = TypeVar("T")

#: What dcp accepts as a frame's bytes.
BYTES_LIKE = (bytes, bytearray, memoryview)


def to_bytes(value: object, what: str) -> bytes:
    """``value`` as :class:`bytes`; :exc:`TypeError` naming ``what`` if it is not bytes-like."""
    if isinstance(value, BYTES_LIKE):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, not {type(value).__name__}")


class DeadlineHeap(Generic[T]):
    """Deadlines of items with lazy deletion: cancelling one is O(1) (its owner stops counting
    it as live), popping skips dead entries, and the heap is rebuilt from its live entries
    when dead ones outnumber them (amortised O(1) per push).

    An entry is ``(when, token, item)``; ``is_live(item, token)`` says whether it still
    stands (the owner bumps an item's token to make its older entries stale).

    :param is_live: whether an entry still stands
    """

    __slots__ = ("_heap", "_is_live", "_seq", "live")

    def __init__(self, is_live: Callable[[T, int], bool]) -> None:
        self._heap: list[tuple[float, int, int, T]] = []
        self._is_live = is_live
        self._seq = 0
        #: Entries the owner counts as live; it adds one per push and removes one when it
        #: makes an entry stale. Only used to decide when to compact.
        self.live = 0

    def push(self, when: float, token: int, item: T) -> None:
        """Add a deadline (the caller adds 1 to :attr:`live`)."""
        self._seq += 1
        heap = self._heap
        heapq.heappush(heap, (when, self._seq, token, item))
        if len(heap) > 2 * self.live + 1024:
            is_live = self._is_live
            self._heap = heap = [e for e in heap if is_live(e[3], e[2])]
            heapq.heapify(heap)

    def pop(self, now: float) -> T | None:
        """Remove and return the live item with the earliest deadline if that is ``<= now``
        (``None``: nothing due). One at a time: acting on one item may make others stale."""
        heap = self._heap
        is_live = self._is_live
        while heap and heap[0][0] <= now:
            _, _, token, item = heapq.heappop(heap)
            if is_live(item, token):
                return item
        return None

    def next_due(self) -> float | None:
        """The earliest live deadline (``None``: none), dropping stale entries on the way."""
        heap = self._heap
        is_live = self._is_live
        while heap:
            when, _, token, item = heap[0]
            if is_live(item, token):
                return when
            heapq.heappop(heap)
        return None

    def clear(self) -> None:
        """Forget every entry."""
        self._heap.clear()
        self.live = 0

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._heap)


class LogOnce:
    """Logs a warning once per key among the ``size`` most recent keys (so a peer that
    repeats a mistake a million times is logged once, and memory stays bounded)."""

    __slots__ = ("_logger", "_seen", "size")

    def __init__(self, logger: logging.Logger, size: int = 4096) -> None:
        self._logger = logger
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self.size = size

    def __call__(self, key: Hashable, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at WARNING unless ``key`` was logged recently; whether it
        logged."""
        seen = self._seen
        if key in seen:
            return False
        seen[key] = None
        if len(seen) > self.size:
            seen.popitem(last=False)
        self._logger.warning(msg, *args)
        return True


class LogEvery:
    """Decides which of many like events to log: at most one per key per ``interval``
    seconds of the caller's clock (``now``), so a flood of the same refusal is one line a
    minute, not one per message; the next line for a key says how many were not logged
    since. At most ``size`` keys are remembered (the oldest is forgotten). Pure: it returns
    the line, the caller logs it (or hands it to whoever does)."""

    __slots__ = ("_seen", "interval", "size")

    def __init__(self, interval: float = 60.0, size: int = 4096) -> None:
        # key -> [when last logged, occurrences not logged since]
        self._seen: OrderedDict[Hashable, list[float]] = OrderedDict()
        self.interval = interval
        self.size = size

    def __call__(
        self, key: Hashable, now: float, msg: str, *args: object
    ) -> tuple[str, tuple[object, ...]] | None:
        """``(msg, args)`` to log, or ``None`` if ``key`` was logged less than ``interval``
        ago (counted for the next line)."""
        seen = self._seen
        entry = seen.get(key)
        if entry is not None and now - entry[0] < self.interval:
            entry[1] += 1
            return None
        if entry is not None and entry[1]:
            msg += " (and %d more like it in the last %.0f s)"
            args = (*args, int(entry[1]), now - entry[0])
        seen[key] = [now, 0]
        seen.move_to_end(key)
        if len(seen) > self.size:
            seen.popitem(last=False)
        return msg, args


class PeerId:
    """A routing id as logs show it, formatted only if a record is emitted: its hex, cut to
    its first 8 bytes (zmq's own ids are 5)."""

    __slots__ = ("ident",)

    def __init__(self, ident: bytes) -> None:
        self.ident = ident

    def __str__(self) -> str:
        ident = self.ident
        return ident.hex() if len(ident) <= 8 else ident[:8].hex() + "..."


class Joined:
    """``", ".join(str(x) for x in items)`` (or ``empty``), formatted only if a log record
    is emitted."""

    __slots__ = ("empty", "items")

    def __init__(self, items: list[object], empty: str = "nothing") -> None:
        self.items = items
        self.empty = empty

    def __str__(self) -> str:
        return ", ".join(str(x) for x in self.items) or self.empty


def fixup_module_metadata(module_name: str, namespace: dict[str, object]) -> None:
    """Show the classes and functions a public module re-exports as its own: ``dcp.Client``,
    not ``dcp._client.client.Client``, in reprs, tracebacks and pickles (trio's
    ``fixup_module_metadata``). Only the re-exported objects change, not their methods.

    :param module_name: the public module (``"dcp"``, ``"dcp.wire"``)
    :param namespace: its globals; the names in its ``__all__`` are fixed up
    """
    for name in namespace.get("__all__", ()):  # type: ignore[attr-defined]
        obj = namespace[name]
        module = getattr(obj, "__module__", None)
        if (
            isinstance(module, str)
            and module.startswith("dcp.")
            and module != module_name
            and (isinstance(obj, type) or callable(obj))
        ):
            obj.__module__ = module_name
