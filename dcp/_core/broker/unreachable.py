"""Replies that cannot be handled yet: kept briefly instead of being dropped.

Two cases come with a broker restart: a worker answers before its client has reconnected
(U1-U3), and a worker's answer reaches the new broker ahead of its registration (U4-U5).

Rule U1 - A DCP reply the broker's socket refuses because its client has no connection (zmq's
  ``EHOSTUNREACH`` with ``ROUTER_MANDATORY``) is kept, not dropped: after a broker restart
  a worker may answer before the client has reconnected (both reconnect on their own,
  0.1 s apart or so), and a client may be between two connections. A reply refused because
  the client's queue is full is still dropped (a slow reader; see reliability.md).
Rule U2 - Kept replies are sent again on every timer tick (``heartbeat_interval / 4``: the broker
  core's ``expire`` sends them again at most that often, and its ``next_deadline`` says
  when) until ``grace`` seconds after the first refusal; then dropped and counted
  (``dropped_replies``).
Rule U3 - Bounded: at most ``limit`` replies are kept; one more is dropped and counted.
Rule U4 - A DCP reply from a peer that is not a registered worker is kept (not refused at
  once) for ``grace`` seconds, at most ``limit`` of them: a worker writes the answers it
  finished while its connection was down ahead of the REGISTER it sends on the new one
  (zmq queues them on the socket until it reconnects). If the peer registers within the
  grace, its kept replies are handled right after the registration, in order, as a
  worker's. A peer that does not: its replies are refused then (``reply_from_non_worker``,
  as before).
Rule U5 - Bounded: beyond ``limit`` kept, a reply from a non-worker is refused at once.
Rule U6 - Bytes. A reply kept under Rule U1 is charged to its client, one kept under Rule U4
  to its sender, in the byte budget's ``replies`` account (:mod:`.budget`, Rules MB1-MB4);
  one the budget refuses is not kept (Rule U1: dropped and counted in ``dropped_replies``;
  Rule U4: refused at once, ``reply_from_non_worker``), and the account counts the refusal.
  A charge is released when its reply leaves: sent again (Rule U2; a new refusal charges it
  anew), dropped at its grace, or handled after its sender registered.
"""

from __future__ import annotations

from collections import deque

from dcp._core.broker.budget import Account, cost
from dcp.wire.messages import Reply

__all__ = ["EarlyReplies", "Unreachable"]


class Unreachable:
    """Rules U1-U3 (module docstring). Pure: the broker core calls it with ``now``.

    :param grace: seconds a reply is kept after its first refusal
    :param limit: the most replies kept at once
    :param memory: the ``replies`` account (Rule U6; ``None``: one without a limit)
    """

    __slots__ = ("_memory", "_resent", "grace", "kept", "limit")

    def __init__(self, grace: float, limit: int = 10_000, memory: Account | None = None) -> None:
        self.grace = grace
        self.limit = limit
        self._memory = Account("replies", None, None) if memory is None else memory
        #: id(frames) -> (deadline, frames, bytes charged): waiting for the next tick.
        self.kept: dict[int, tuple[float, list[bytes], int]] = {}
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
        n = cost(frames)
        if not self._memory.charge(frames[0], n):  # Rule U6
            return False
        self.kept[key] = (deadline, frames, n)
        return True

    def due(self, now: float) -> tuple[list[list[bytes]], int]:
        """Rule U2: the replies to send again now, and how many were dropped (grace over)."""
        self._resent = {}
        if not self.kept:
            return [], 0
        again: list[list[bytes]] = []
        expired = 0
        release = self._memory.release
        for key, (deadline, frames, n) in self.kept.items():
            release(frames[0], n)  # Rule U6: it leaves (a new refusal charges it anew)
            if deadline <= now:
                expired += 1
            else:
                again.append(frames)
                self._resent[key] = deadline
        self.kept = {}
        return again, expired


class EarlyReplies:
    """Rules U4-U5 (module docstring): replies from peers not registered (yet).

    :param grace: seconds a reply is kept for its sender to register
    :param limit: the most replies kept at once
    :param memory: the ``replies`` account (Rule U6; ``None``: one without a limit)
    """

    __slots__ = ("_by_peer", "_memory", "_order", "grace", "limit")

    def __init__(self, grace: float, limit: int = 10_000, memory: Account | None = None) -> None:
        self.grace = grace
        self.limit = limit
        self._memory = Account("replies", None, None) if memory is None else memory
        #: peer -> its kept replies, oldest first.
        self._by_peer: dict[bytes, list[Reply]] = {}
        #: (deadline, peer, reply, bytes charged), oldest first, for expiry.
        self._order: deque[tuple[float, bytes, Reply, int]] = deque()

    def __len__(self) -> int:
        return len(self._order)

    def keep(self, peer: bytes, reply: Reply, now: float) -> bool:
        """Rule U4/U5/U6: keep ``reply`` from ``peer``; ``False`` if full, over the budget or
        the grace is 0 (refuse it now)."""
        if self.grace <= 0 or len(self._order) >= self.limit:
            return False
        n = cost((reply.client or b"", *reply.metadata, *reply.data))
        if not self._memory.charge(peer, n):
            return False
        self._by_peer.setdefault(peer, []).append(reply)
        self._order.append((now + self.grace, peer, reply, n))
        return True

    def registered(self, peer: bytes) -> list[Reply]:
        """``peer`` registered: its kept replies, oldest first, to handle now."""
        replies = self._by_peer.pop(peer, None)
        if replies is None:
            return []
        kept = set(map(id, replies))
        order: deque[tuple[float, bytes, Reply, int]] = deque()
        release = self._memory.release
        for entry in self._order:
            if id(entry[2]) in kept:
                release(peer, entry[3])  # Rule U6
            else:
                order.append(entry)
        self._order = order
        return replies

    def next_due(self) -> float | None:
        """When the oldest kept reply's grace is over (``None``: none kept)."""
        order = self._order
        return order[0][0] if order else None

    def expire(self, now: float) -> list[bytes]:
        """The senders of the replies whose grace is over (one per reply), forgotten."""
        order = self._order
        out: list[bytes] = []
        while order and order[0][0] <= now:
            _, peer, reply, n = order.popleft()
            self._memory.release(peer, n)  # Rule U6
            replies = self._by_peer.get(peer)
            if replies is not None:
                replies.remove(reply)
                if not replies:
                    del self._by_peer[peer]
            out.append(peer)
        return out
