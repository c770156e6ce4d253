"""Byte budgets for what the broker keeps on its peers' behalf. Pure.

Every part of the broker core that keeps bytes a peer sent (queued requests, replies held for
an unreachable client, subscription buffers, last values, stream parts in flight,
descriptions, peer state) charges them to one :class:`Account` of the broker's
:class:`Memory`, and releases them when it lets them go.

Rule MB1 - Accounts. ``max_memory`` (bytes) is split into accounts by fixed shares
  (:data:`SHARES`); an account's limit is its share of ``max_memory``. A charge that would take
  an account past its limit is refused: the part refuses the peer's message with the reason
  ``memory_budget`` (counted, logged, and answered where the peer can be told), and the
  account counts the refusal.
Rule MB2 - Per-peer shares. No peer holds more than ``peer_share`` of an account's limit, so
  a broker-wide limit cannot be filled by one peer (nor by a few: each is also bounded by the
  parts' own count limits, and what a departed peer held expires). A peer that holds nothing
  in an account may always put one message in it if the account has room: a message larger
  than a peer's share (the broker's ``max_message_size`` allows one) is never refused only
  for being large.
Rule MB3 - Exact release. A part releases exactly what it charged, when it drops, sends or
  expires the thing charged; :meth:`Account.forget` drops a peer's whole balance when the
  part drops everything it kept for the peer. What an account holds never goes below zero.
Rule MB4 - Cost. What a message costs is its bytes plus a fixed overhead per frame and per
  entry (:func:`cost`): a flood of empty frames is not free.

``max_memory=None`` turns the budget off (every charge is taken; the figures still count).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dcp._stats import AccountFigures

__all__ = [
    "DEFAULT_MAX_MEMORY",
    "ENTRY_OVERHEAD",
    "FRAME_OVERHEAD",
    "SHARES",
    "Account",
    "AccountFigures",
    "Memory",
    "cost",
]

#: The default ``max_memory``: 512 MiB held on peers' behalf, at most (Rule MB1).
DEFAULT_MAX_MEMORY = 512 * 1024 * 1024

#: Each account's share of ``max_memory`` (Rule MB1); they add up to 1.
SHARES: Mapping[str, float] = {
    "queued": 0.35,  # requests waiting in service queues, and held by workers
    "replies": 0.10,  # replies kept for clients that cannot be reached yet
    "streams": 0.15,  # stream parts in flight
    "subscriptions": 0.20,  # messages buffered for subscribers
    "last_values": 0.05,  # last-value caches of pub/sub subjects
    "directory": 0.10,  # descriptions, registration info, listings being answered
    "peers": 0.05,  # per-peer state (mc0 versions, dialects, names)
}

_NO_LIMIT = 1 << 62

#: Bytes counted per frame on top of its length (Rule MB4).
FRAME_OVERHEAD = 64
#: Bytes counted per kept entry on top of its frames (Rule MB4).
ENTRY_OVERHEAD = 256


def cost(frames: Iterable[bytes]) -> int:
    """What keeping ``frames`` costs (Rule MB4)."""
    n = ENTRY_OVERHEAD
    for frame in frames:
        n += len(frame) + FRAME_OVERHEAD
    return n


class Account:
    """One named share of the broker's memory (Rules MB1-MB3)."""

    __slots__ = (
        "balances",
        "ceiling",
        "limit",
        "name",
        "peak",
        "peer_ceiling",
        "peer_limit",
        "refused",
        "used",
    )

    def __init__(self, name: str, limit: int | None, peer_limit: int | None) -> None:
        self.name = name
        self.limit = limit
        self.peer_limit = peer_limit
        #: ``limit`` and ``peer_limit`` as numbers (no limit: one no charge reaches), for a
        #: caller on a hot path that inlines :meth:`charge` and :meth:`release` (routing
        #: Rule R10) and must keep to exactly what they do.
        self.ceiling = _NO_LIMIT if limit is None else limit
        self.peer_ceiling = _NO_LIMIT if peer_limit is None else peer_limit
        self.used = 0
        self.peak = 0
        self.refused = 0
        #: Bytes held, by peer (only peers holding something).
        self.balances: dict[bytes, int] = {}

    def charge(self, peer: bytes, n: int) -> bool:
        """Take ``n`` bytes for ``peer`` if the budget allows (Rules MB1, MB2): ``True`` if
        taken, ``False`` (and the refusal counted) if not."""
        held = self.balances.get(peer, 0)
        used = self.used + n
        if used > self.ceiling or (held and held + n > self.peer_ceiling):
            self.refused += 1
            return False
        self.balances[peer] = held + n
        self.used = used
        if used > self.peak:
            self.peak = used
        return True

    def release(self, peer: bytes, n: int) -> None:
        """Give back ``n`` bytes ``peer`` was charged (Rule MB3)."""
        held = self.balances.get(peer)
        if held is None:
            return
        if n >= held:
            del self.balances[peer]
            self.used -= held
        else:
            self.balances[peer] = held - n
            self.used -= n

    def forget(self, peer: bytes) -> int:
        """Drop everything ``peer`` holds (Rule MB3); returns the bytes released."""
        held = self.balances.pop(peer, 0)
        self.used -= held
        return held

    def held(self, peer: bytes) -> int:
        """Bytes ``peer`` holds in this account."""
        return self.balances.get(peer, 0)

    def room(self, peer: bytes) -> int:
        """Bytes ``peer`` could still be charged (large when there is no budget)."""
        if self.limit is None:
            return 1 << 62
        room = self.limit - self.used
        held = self.balances.get(peer, 0)
        if held and self.peer_limit is not None:
            room = min(room, self.peer_limit - held)
        return max(room, 0)

    def figures(self) -> AccountFigures:
        """This account's figures."""
        return AccountFigures(
            name=self.name,
            used=self.used,
            peak=self.peak,
            limit=self.limit,
            peer_limit=self.peer_limit,
            peers=len(self.balances),
            refused=self.refused,
        )


class Memory:
    """The broker's byte budget, as accounts (Rules MB1-MB4).

    :param max_memory: bytes the broker may hold on peers' behalf (``None``: no budget)
    :param peer_share: the fraction of an account one peer may hold (Rule MB2)
    :param shares: each account's share of ``max_memory`` (default :data:`SHARES`)
    """

    def __init__(
        self,
        max_memory: int | None = DEFAULT_MAX_MEMORY,
        *,
        peer_share: float = 0.25,
        shares: Mapping[str, float] = SHARES,
    ) -> None:
        if max_memory is not None and max_memory <= 0:
            raise ValueError("max_memory must be a positive number of bytes, or None")
        if not 0 < peer_share <= 1:
            raise ValueError("peer_share must be in (0, 1]")
        self.max_memory = max_memory
        self.peer_share = peer_share
        self._accounts: dict[str, Account] = {}
        for name, share in shares.items():
            limit = None if max_memory is None else int(max_memory * share)
            peer_limit = None if limit is None else int(limit * peer_share)
            self._accounts[name] = Account(name, limit, peer_limit)

    def account(self, name: str) -> Account:
        """The account ``name`` (a key of the shares)."""
        return self._accounts[name]

    @property
    def used(self) -> int:
        """Bytes held in every account together."""
        return sum(a.used for a in self._accounts.values())

    def figures(self) -> list[AccountFigures]:
        """Every account's figures, in the order of the shares."""
        return [a.figures() for a in self._accounts.values()]
