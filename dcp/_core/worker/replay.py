"""The replies a worker sent lately, to send again after a lost connection (worker core
Rule W13, :mod:`dcp._core.worker.core`). Pure: the worker core calls it with ``now``.

A broker killed between receiving a reply and passing it on loses it, and DCP has no
acknowledgement. :class:`SentReplies` keeps the replies sent in the last ``window`` seconds,
only those a client can recognise as duplicates (the request's first metadata part is a dcp
request id; not stream replies), at most ``limit`` of them and ``max_bytes`` bytes of data
together, the newest kept. :meth:`SentReplies.take` hands them back, oldest first, when the
connection is lost.

:class:`Answered` keeps the same window's answers by request id, for a worker serving several
brokers: a request that comes again through another broker within the window is answered from
it without running (:mod:`dcp._worker.brokers`, Rule WB3).
"""

from __future__ import annotations

from collections import deque

from dcp.wire.messages import Reply
from dcp.wire.options import REQUEST_ID_PREFIX
from dcp.wire.streams import STREAM_OPTION

__all__ = ["Answered", "SentReplies"]


class SentReplies:
    """Recent replies (see the module docstring).

    :param window: seconds a sent reply is kept (the worker's ``liveness x
        heartbeat_interval``)
    :param limit: the most replies kept (0: none)
    :param max_bytes: the most data bytes kept together
    """

    __slots__ = ("_bytes", "_sent", "limit", "max_bytes", "replayed", "window")

    def __init__(self, window: float, limit: int, max_bytes: int) -> None:
        self.window = window
        self.limit = limit
        self.max_bytes = max_bytes
        #: Replies handed back by :meth:`take` so far.
        self.replayed = 0
        #: (time sent, reply, data bytes), oldest first.
        self._sent: deque[tuple[float, Reply, int]] = deque()
        self._bytes = 0

    def remember(self, reply: Reply, now: float) -> None:
        """``reply`` was sent ``now``: keep it if its client can recognise a duplicate."""
        metadata = reply.metadata
        if not metadata or not metadata[0].startswith(REQUEST_ID_PREFIX) or not self.limit:
            return
        for part in metadata[1:]:
            if part.startswith(STREAM_OPTION):
                return
        size = 0
        for part in reply.data:
            size += len(part)
        sent = self._sent
        sent.append((now, reply, size))
        self._bytes += size
        horizon = now - self.window
        while sent[0][0] < horizon or len(sent) > self.limit or self._bytes > self.max_bytes:
            self._bytes -= sent.popleft()[2]
            if not sent:
                break

    def take(self, now: float, window: float | None = None) -> list[Reply]:
        """The replies sent in the last ``window`` seconds (default: :attr:`window`; never
        more), oldest first, all forgotten here (the core remembers them again as it sends
        them)."""
        horizon = now - (self.window if window is None else min(window, self.window))
        replies = [reply for t, reply, _ in self._sent if t >= horizon]
        self._sent.clear()
        self._bytes = 0
        self.replayed += len(replies)
        return replies


class Answered:
    """The data of the answers sent in the last ``window`` seconds, by request id (see the
    module docstring): at most ``limit`` of them and ``max_bytes`` data bytes, newest kept.

    :param window: seconds an answer is kept
    :param limit: the most answers kept (0: none)
    :param max_bytes: the most data bytes kept together
    """

    __slots__ = ("_by_id", "_bytes", "_order", "limit", "max_bytes", "window")

    def __init__(self, window: float, limit: int, max_bytes: int) -> None:
        self.window = window
        self.limit = limit
        self.max_bytes = max_bytes
        self._by_id: dict[bytes, tuple[bytes, ...]] = {}
        #: (time answered, request id, data bytes), oldest first.
        self._order: deque[tuple[float, bytes, int]] = deque()
        self._bytes = 0

    def remember(self, request_id: bytes, data: tuple[bytes, ...], now: float) -> None:
        """The request ``request_id`` was answered ``now`` with ``data``."""
        if not self.limit or request_id in self._by_id:
            return
        size = 0
        for part in data:
            size += len(part)
        self._by_id[request_id] = data
        self._order.append((now, request_id, size))
        self._bytes += size
        self._trim(now)

    def get(self, request_id: bytes, now: float) -> tuple[bytes, ...] | None:
        """The data ``request_id`` was answered with in the last ``window`` seconds, if kept."""
        self._trim(now)
        return self._by_id.get(request_id)

    def _trim(self, now: float) -> None:
        order = self._order
        horizon = now - self.window
        while order and (
            order[0][0] < horizon or len(order) > self.limit or self._bytes > self.max_bytes
        ):
            _, request_id, size = order.popleft()
            self._bytes -= size
            del self._by_id[request_id]
