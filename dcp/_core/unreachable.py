"""Replies whose client is not connected (yet): kept briefly and sent again.

Rule U1 - A reply the broker's socket refuses because its client has no connection (zmq's
  ``EHOSTUNREACH`` with ``ROUTER_MANDATORY``) is kept, not dropped: after a broker restart
  a worker may answer before the client has reconnected (both reconnect on their own,
  0.1 s apart or so), and a client may be between two connections. A reply refused because
  the client's queue is full is still dropped (a slow reader; see reliability.md).
U2 - Kept replies are sent again on every timer tick (``heartbeat_interval / 4``) until
  ``grace`` seconds after the first refusal; then dropped and counted (``dropped_replies``).
U3 - Bounded: at most ``limit`` replies are kept; one more is dropped and counted.
"""

from __future__ import annotations

__all__ = ["Unreachable"]


class Unreachable:
    """Rules U1-U3 (module docstring). Pure: the broker core calls it with ``now``.

    :param grace: seconds a reply is kept after its first refusal
    :param limit: the most replies kept at once
    """

    __slots__ = ("_resent", "grace", "kept", "limit")

    def __init__(self, grace: float, limit: int = 10_000) -> None:
        self.grace = grace
        self.limit = limit
        #: id(frames) -> (deadline, frames): waiting for the next tick.
        self.kept: dict[int, tuple[float, list[bytes]]] = {}
        #: id(frames) -> deadline of the replies sent again at the last tick (a refusal
        #: during that flush keeps the first deadline).
        self._resent: dict[int, float] = {}

    def refused(self, frames: list[bytes], now: float) -> bool:
        """Rule U1/U3: keep ``frames``; ``False`` if it must be dropped instead (its grace
        is over, or the store is full)."""
        key = id(frames)
        deadline = self._resent.pop(key, None)
        if deadline is None:
            deadline = now + self.grace
        if deadline <= now or len(self.kept) >= self.limit:
            return False
        self.kept[key] = (deadline, frames)
        return True

    def due(self, now: float) -> tuple[list[list[bytes]], int]:
        """Rule U2: the replies to send again now, and how many were dropped (grace over)."""
        self._resent = {}
        if not self.kept:
            return [], 0
        again: list[list[bytes]] = []
        expired = 0
        for key, (deadline, frames) in self.kept.items():
            if deadline <= now:
                expired += 1
            else:
                again.append(frames)
                self._resent[key] = deadline
        self.kept = {}
        return again, expired
