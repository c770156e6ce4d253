"""Which broker a :class:`~dcp.SyncClient` given several sends each request to, and when a
request moves to another (``docs/scaling.md``): pure decisions, no sockets and no clock
(``now`` is passed in). The driver is :class:`~dcp._client.sync_brokers.BrokersReceiver`.

Rules:

Rule SB1 - States. Each broker is *connecting* until its first successful handshake, then
  *live*; *lost* when its connection closes (the monitor's ``DISCONNECTED``, which zmq's own
  heartbeat also causes when the broker falls silent), a handshake fails, or (still
  connecting) a connection attempt fails; *live* again at its next successful handshake (zmq
  reconnects by itself: a restarted broker is used again without restarting anything).
Rule SB2 - Spread. A new request (and an attempt-timeout resend, and a failover move) goes to
  the live broker with the fewest outstanding requests, round-robin among ties; with no live
  broker, to a connecting one the same way (zmq queues it until the connection is made);
  with none either, nowhere yet (Rule SB4).
Rule SB3 - Failover. When a broker is lost, each plain request outstanding there that is not
  *held* (Rule SB5) moves ``grace`` seconds later (so a HELD notice or an answer replayed
  through another broker can arrive first) to another broker (Rule SB2; pub/sub: Rule SB6),
  with the same id: not a retry (the tracker's retries and deadline are untouched). A
  stream does not move: its broker being lost breaks it (``stream_broken``); nor does a
  request asked of that broker in particular (Rule SB6): it fails (``broker_lost``).
Rule SB4 - No broker. A request due to move, or new, while no broker is live or connecting
  waits; it goes out at once to the first broker that becomes live (its attempt timer and
  deadline run on meanwhile, as the tracker says).
Rule SB5 - Held. A HELD notice (a reply whose data is exactly ``[HELD_MARKER]``) for an
  outstanding request marks it *held*: a worker runs it, so it does not move when its broker
  is lost; its answer may come through any broker. A notice for anything else is counted
  (``held_unknown``) and dropped.
Rule SB6 - Pinned. Pub/sub (services starting ``\\xffDCP:``) goes to one broker, the *home*:
  the first in the given order that is live (else connecting), so a publisher and a
  subscriber given the same list meet at the same broker; it moves to the next home as a
  plain request moves. A request asked of one broker in particular (the ``mmi.*`` questions
  the client asks of every broker) goes there only.
"""

from __future__ import annotations

import enum
import math

__all__ = ["BrokerState", "Kind", "Placed", "Spread"]


class BrokerState(enum.Enum):
    """A broker's state as the client sees it (Rule SB1)."""

    #: Not yet connected (no successful handshake yet).
    CONNECTING = "connecting"
    #: Connected: new requests may go there.
    LIVE = "live"
    #: Its connection closed or failed: nothing new goes there until it is live again.
    LOST = "lost"


class Kind(enum.Enum):
    """What a request is, for Rules SB3 and SB6."""

    #: Spread, and moved when its broker is lost.
    PLAIN = "plain"
    #: A stream: broken when its broker is lost.
    STREAM = "stream"
    #: Pub/sub: to the home broker, moved to the next home.
    HOME = "home"
    #: Asked of one broker: fails when that broker is lost.
    FIXED = "fixed"


class Placed:
    """Where an outstanding request is, and what the driver needs to move it."""

    __slots__ = ("broker", "frames", "held", "kind", "sent_at")

    def __init__(self, broker: int | None, frames: list[bytes], now: float, kind: Kind) -> None:
        #: The broker it was last sent to (``None``: waiting for one, Rule SB4).
        self.broker = broker
        #: The frames last sent for it, and when.
        self.frames = frames
        self.sent_at = now
        #: Rule SB5: a worker said it runs it.
        self.held = False
        #: Rules SB3 and SB6.
        self.kind = kind


class Spread:
    """The decisions of Rules SB1-SB6 for ``n`` brokers (indexes ``0 .. n - 1``).

    :param n: how many brokers
    :param grace: Rule SB3's wait, in seconds
    """

    def __init__(self, n: int, grace: float) -> None:
        self.grace = grace
        #: Each broker's state (Rule SB1).
        self.states: list[BrokerState] = [BrokerState.CONNECTING] * n
        #: Outstanding requests per broker.
        self.outstanding: list[int] = [0] * n
        #: Outstanding requests by id.
        self.placed: dict[bytes, Placed] = {}
        #: Rule SB3: the requests that will move, and when.
        self.moving: dict[bytes, float] = {}
        self._cursor = 0
        #: Counters: requests moved (Rule SB3), HELD notices taken (SB5) and dropped.
        self.moved = 0
        self.held = 0
        self.held_unknown = 0

    # ------------------------------------------------------------------ choosing

    def choose(self) -> int | None:
        """Rule SB2: the broker a request goes to now (``None``: none to go to)."""
        best = self._least(BrokerState.LIVE)
        return best if best is not None else self._least(BrokerState.CONNECTING)

    def home(self) -> int | None:
        """Rule SB6: the broker pub/sub goes to."""
        states = self.states
        for wanted in (BrokerState.LIVE, BrokerState.CONNECTING):
            for i, state in enumerate(states):
                if state is wanted:
                    return i
        return None

    def _least(self, wanted: BrokerState) -> int | None:
        states = self.states
        outstanding = self.outstanding
        n = len(states)
        best: int | None = None
        start = self._cursor
        for k in range(n):  # from the cursor, so ties go round
            i = (start + k) % n
            if states[i] is wanted and (best is None or outstanding[i] < outstanding[best]):
                best = i
        if best is not None:
            self._cursor = (best + 1) % n
        return best

    # ------------------------------------------------------------------ requests

    def place(
        self,
        rid: bytes,
        broker: int | None,
        frames: list[bytes],
        now: float,
        kind: Kind = Kind.PLAIN,
    ) -> Placed:
        """A request was sent to ``broker`` (``None``: it waits for one, Rule SB4)."""
        p = self.placed.get(rid)
        if p is None:
            p = self.placed[rid] = Placed(broker, frames, now, kind)
        else:
            self._leave(p)
            p.broker = broker
            p.frames = frames
            p.sent_at = now
            self.moving.pop(rid, None)
        if broker is not None:
            self.outstanding[broker] += 1
            if self.states[broker] is BrokerState.LOST:
                self._lost_one(rid, p, now)  # Rule SB3
        return p

    def done(self, rid: bytes) -> None:
        """The request is no longer outstanding (answered, timed out or forgotten)."""
        p = self.placed.pop(rid, None)
        if p is not None:
            self._leave(p)
            self.moving.pop(rid, None)

    def notice(self, rid: bytes) -> bool:
        """Rule SB5: a HELD notice for ``rid``; ``False`` if it is not outstanding."""
        p = self.placed.get(rid)
        if p is None:
            self.held_unknown += 1
            return False
        self.held += 1
        p.held = True
        self.moving.pop(rid, None)
        return True

    def _leave(self, p: Placed) -> None:
        if p.broker is not None:
            self.outstanding[p.broker] -= 1
            p.broker = None

    # ------------------------------------------------------------------ brokers

    def live(self, broker: int) -> list[bytes]:
        """Rule SB1: a successful handshake. Returns the requests waiting for a broker
        (Rule SB4), to send now."""
        was = self.states[broker]
        self.states[broker] = BrokerState.LIVE
        if was is BrokerState.LIVE:
            return []
        return [rid for rid, p in self.placed.items() if p.broker is None]

    def lost(self, broker: int, now: float) -> list[bytes]:
        """Rule SB1: ``broker``'s connection closed or failed. Plans the moves of Rule SB3;
        returns the streams and fixed requests that were there (they fail)."""
        if self.states[broker] is BrokerState.LOST:
            return []
        self.states[broker] = BrokerState.LOST
        broken: list[bytes] = []
        for rid, p in self.placed.items():
            if p.broker == broker:
                if p.kind is Kind.STREAM or p.kind is Kind.FIXED:
                    broken.append(rid)
                else:
                    self._lost_one(rid, p, now)
        return broken

    def _lost_one(self, rid: bytes, p: Placed, now: float) -> None:
        if not p.held and p.kind is not Kind.FIXED and rid not in self.moving:
            self.moving[rid] = now + self.grace

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float:
        """When :meth:`due` next has something to do (``inf``: never)."""
        moving = self.moving
        return min(moving.values()) if moving else math.inf

    def target(self, p: Placed) -> int | None:
        """Where ``p`` goes when it is sent again: Rule SB2, or SB6 for pub/sub and for a
        request asked of one broker."""
        if p.kind is Kind.HOME:
            return self.home()
        if p.kind is Kind.FIXED:
            return p.broker
        return self.choose()

    def due(self, now: float) -> list[bytes]:
        """Rule SB3: the requests whose grace is over, to move now (the driver moves each
        to :meth:`target` with :meth:`place`)."""
        moving = self.moving
        due = [rid for rid, at in moving.items() if at <= now]
        for rid in due:
            del moving[rid]
        self.moved += len(due)
        return due
