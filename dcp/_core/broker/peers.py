"""Per-peer sessions: what the broker knows of each peer apart from shared routing state.

A registered worker has a :class:`~.records.Session`: its dialect, services, credit, the
requests it holds, and its liveness. Other peers (clients) have no session; the broker only
remembers, for a bounded number of them, a dialect other than plain 1-byte DCP, to answer in
kind.

Liveness rules (the broker core acts on what :meth:`Sessions.due` returns):

Rule L1 - Every message from a worker is a sign of life: its *expiry* moves to ``now +
  timeout``. The timeout is the broker's ``liveness x heartbeat_interval`` for DCP workers,
  ``mdp_timeout`` for Majordomo workers (whose libraries beat every 2.5 s by default).
Rule L2 - An idle worker (holding nothing) past its expiry is gone.
Rule L3 - A busy worker (holding requests) that has been heard beating while busy keeps to
  Rule L2: it promised to beat, and silence means it hung. One that never beat while busy
  (MDP and DagBox C++ workers work without beating) is not expired for silence alone: at
  each expiry it is *probed* (sent a heartbeat; a dead connection makes the send fail,
  which removes it), until it has been silent for ``busy_timeout`` (or longer, up to the
  largest work timeout of what it holds).
Rule L4 - Quarantine: a peer removed for a work timeout gets no work until a given time,
  even if it registers again at once.
"""

from __future__ import annotations

from collections import OrderedDict

from dcp._core.broker.dialects import DCP1, Dialect
from dcp._core.broker.records import Session

__all__ = ["Sessions"]


class Sessions:
    """The sessions of registered workers, ordered for liveness; other peers' dialects.

    :param timeout: Rule L1 timeout of DCP workers
    :param mdp_timeout: Rule L1 timeout of Majordomo workers
    :param max_remembered: non-worker peers whose dialect is remembered (LRU)
    """

    def __init__(self, *, timeout: float, mdp_timeout: float, max_remembered: int) -> None:
        self.timeout = timeout
        self.mdp_timeout = mdp_timeout
        self.max_remembered = max_remembered
        #: Registered workers by routing id.
        self.workers: dict[bytes, Session] = {}
        # One order per timeout, least recently heard first: its head expires first.
        self._orders: dict[float, OrderedDict[bytes, None]] = {}
        #: Non-worker peers that speak something other than 1-byte DCP, and their dialect,
        #: least recently heard first (read it; :meth:`remember` writes it).
        self.dialects: OrderedDict[bytes, Dialect] = OrderedDict()
        #: Workers the broker heartbeats itself (MDP, DBP), by routing id, and when the first
        #: of them registered (majordomo Rule M4 counts the first heartbeat from it).
        self.beating: dict[bytes, Session] = {}
        self.beating_since = 0.0
        #: Rule L4: peers that get no work until the given time.
        self.quarantine: dict[bytes, float] = {}

    def add(self, ident: bytes, dialect: Dialect, now: float) -> Session:
        """A new worker session (its peer is forgotten as a client)."""
        timeout = self.mdp_timeout if dialect.beats else self.timeout
        session = Session(ident, dialect, timeout)
        self.workers[ident] = session
        order = self._orders.get(timeout)
        if order is None:
            order = self._orders[timeout] = OrderedDict()
        order[ident] = None
        session.order = order
        if dialect.beats:
            if not self.beating:
                self.beating_since = now
            self.beating[ident] = session
        session.heard = now
        session.expiry = now + timeout
        self.dialects.pop(ident, None)
        return session

    def remove(self, session: Session) -> None:
        ident = session.ident
        del self.workers[ident]
        del session.order[ident]
        self.beating.pop(ident, None)

    def heard(self, session: Session, now: float) -> None:
        """Rule L1: ``session`` was heard from."""
        session.heard = now
        session.expiry = now + session.timeout
        session.order.move_to_end(session.ident)

    def probed(self, session: Session, now: float) -> None:
        """Rule L3: ``session`` was probed; look at it again after another timeout."""
        session.expiry = now + session.timeout
        session.order.move_to_end(session.ident)

    def due(self, now: float) -> list[Session]:
        """Sessions past their expiry, least recently heard first (not removed)."""
        due = []
        workers = self.workers
        for order in self._orders.values():
            for ident in order:
                session = workers[ident]
                if session.expiry > now:
                    break
                due.append(session)
        return due

    def next_expiry(self) -> float | None:
        """The earliest expiry (``None``: no workers)."""
        when = None
        workers = self.workers
        for order in self._orders.values():
            if order:
                expiry = workers[next(iter(order))].expiry
                if when is None or expiry < when:
                    when = expiry
        return when

    # ------------------------------------------------------------ other peers' dialects

    def remember(self, peer: bytes, dialect: Dialect) -> None:
        """Remember the dialect a non-worker peer last spoke (1-byte DCP is the default and
        is not stored)."""
        dialects = self.dialects
        if dialect is DCP1:
            if peer in dialects:
                del dialects[peer]
            return
        dialects[peer] = dialect
        dialects.move_to_end(peer)
        if len(dialects) > self.max_remembered:
            dialects.popitem(last=False)

    def dialect_of(self, peer: bytes) -> Dialect:
        """How to write to ``peer``: its session's dialect, the one it last spoke, or 1-byte
        DCP."""
        session = self.workers.get(peer)
        if session is not None:
            return session.dialect
        return self.dialects.get(peer, DCP1)
