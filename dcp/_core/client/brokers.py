"""A client's brokers: which one each request goes to, and what moves when one is lost
(sans-IO; ``docs/scaling.md``).

A client given several brokers (``dcp.Client([ep1, ep2])``, ``dcp.SyncClient``) has one
socket per broker, one request tracker (one id space: tracker Rule RT1) and one
:class:`Brokers`, which its driver tells what it sees (a broker's handshake succeeded, its
connection was lost, a request was sent through a broker, a request ended, a HELD notice
arrived) and asks what to do (the broker for a new request or a resend, the requests to move
now). It knows nothing of sockets or clocks: ``now`` is passed in, and the driver wakes it at
:meth:`Brokers.next_deadline`. One broker never needs it: a client given one endpoint makes
none.

Rules:

Rule BK1 - Endpoints. A client's endpoint is a ``str`` (one broker, exactly as before; a comma
  in it is not split) or a sequence of ``str`` (several). An empty sequence, an entry that is
  not a ``str``, or the same endpoint twice is a :exc:`ValueError` naming it, before any
  socket exists (:func:`endpoint_list`; each entry is then checked as one endpoint).
Rule BK2 - Live and lost. A broker is *connecting* until its first successful handshake, then
  *live*; *lost* when its connection closes or a handshake fails (the driver's monitor, and
  zmq heartbeats on the client's sockets), *live* again on its next successful handshake.
  Only a live broker is given requests.
Rule BK3 - Spread. A request is sent through the live broker with the fewest outstanding
  requests (sent through it, not yet ended), the tie broken round-robin (the broker after the
  last one chosen). With none live, it waits (*parked*) and is sent through the first broker
  that becomes live; its attempt timer runs as usual meanwhile.
Rule BK4 - Failover. When a broker is lost, each request outstanding on it that may move and
  is not *held* is moved ``grace`` seconds later (time for a HELD notice or a replayed answer
  to arrive), unless it ended or was sent again meanwhile: the driver resends it at once,
  same id, through a live broker (Rule BK3; parked if none). A move is not a retry: it uses
  no resend of the call's ``retries`` and keeps its deadline. A request that may not move (a
  stream: it stays on the broker it started at) is reported at once, for the driver to end
  it (``StreamBroken``).
Rule BK5 - HELD notices. A HELD notice (a reply whose data is exactly
  :data:`~dcp.wire.messages.HELD_MARKER`, through any broker) for an outstanding request marks
  it *held*: it is not moved (Rule BK4); its answer may come through any broker. One for a
  request that is not outstanding is counted (``held_dropped``) and dropped. A request sent
  again (an attempt-timeout resend) is no longer held. A held request that was waiting for a
  live broker (parked after a move) no longer waits: it is not sent when a broker comes back,
  since a worker holds it (sent again, it would be joined to it only at a broker that worker
  is registered at, and could run twice elsewhere); only an attempt-timeout resend sends it
  again (Rule BK6). A parked request never sent (not outstanding) is not held by anyone: a
  notice for it is dropped.
Rule BK6 - Resends. An attempt-timeout resend goes through the broker the request is on if that
  one is live, else through a live broker by Rule BK3 (parked if none).

What it does NOT do: send, read sockets or clocks, time requests out (the tracker does), or
know a request's frames (the driver asks the tracker for them when one moves).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Final

import attrs

from dcp._errors import RemoteProtocolError
from dcp._util import DeadlineHeap
from dcp.wire.dcp1 import PROTOCOL, TYPE_FRAMES, MessageType, split_body
from dcp.wire.messages import HELD_MARKER

__all__ = [
    "BrokerInfo",
    "BrokerState",
    "Brokers",
    "check_grace",
    "endpoint_list",
    "held_request",
]

#: The type frame of a reply, in either width (a HELD notice is a reply).
_REPLY_TYPES: Final = (TYPE_FRAMES[1][MessageType.REPLY], TYPE_FRAMES[4][MessageType.REPLY])


class BrokerState(enum.Enum):
    """Where a client stands with one broker (Rule BK2)."""

    #: Not yet connected: no successful handshake so far.
    CONNECTING = "connecting"
    #: Connected (its last handshake succeeded, the connection has not closed since).
    LIVE = "live"
    #: Its connection closed or a handshake failed; zmq keeps reconnecting.
    LOST = "lost"


@attrs.frozen
class BrokerInfo:
    """One broker as a client sees it (:meth:`Brokers.info`).

    :ivar endpoint: its endpoint, as given
    :ivar state: live, lost or connecting
    :ivar outstanding: requests sent through it and not yet ended
    :ivar sent: requests (first attempts, resends and moves) sent through it
    :ivar lost: times it was lost
    """

    endpoint: str
    state: BrokerState
    outstanding: int
    sent: int
    lost: int


def endpoint_list(endpoint: str | Sequence[str]) -> tuple[str, ...]:
    """The endpoints a client is given (Rule BK1): ``(endpoint,)`` for a ``str``.

    :raises ValueError: an empty sequence, the same endpoint twice, or an entry that is not
        a ``str`` (named)
    """
    if isinstance(endpoint, str):
        return (endpoint,)
    if isinstance(endpoint, (bytes, bytearray, memoryview)) or not isinstance(endpoint, Sequence):
        raise ValueError(
            f"endpoint must be a str or a sequence of str, not {type(endpoint).__name__}"
        )
    endpoints = tuple(endpoint)
    if not endpoints:
        raise ValueError("endpoint: an empty list of brokers (give at least one endpoint)")
    seen: set[str] = set()
    for i, item in enumerate(endpoints):
        if not isinstance(item, str):
            raise ValueError(f"endpoint[{i}] must be a str, not {type(item).__name__}")
        if item in seen:
            raise ValueError(f"endpoint {item!r} is given twice")
        seen.add(item)
    return endpoints


def check_grace(grace: float) -> None:
    """Check a client's ``failover_grace`` (Rule BK4).

    :raises ValueError: not a finite number of seconds >= 0
    """
    if not 0 <= grace < math.inf:
        raise ValueError(f"failover_grace must be >= 0 seconds and finite, not {grace!r}")


def held_request(frames: Sequence[bytes]) -> bytes | None:
    """The request id a HELD notice names (Rule BK5), ``None`` if ``frames`` is not one:
    ``"" DGBX 0x05 [client ""] <id> ... "" HELD_MARKER`` (a reply to the client, whose data
    is exactly the marker)."""
    if not (
        len(frames) >= 6
        and frames[-1] == HELD_MARKER
        and not frames[-2]
        and not frames[0]
        and frames[1] == PROTOCOL
        and frames[2] in _REPLY_TYPES
    ):
        return None
    try:
        _, metadata, data = split_body(frames, 3)
    except RemoteProtocolError:
        return None
    return metadata[0] if metadata and len(data) == 1 else None


class _Broker:
    """One broker's state (Rule BK2) and counters."""

    __slots__ = ("endpoint", "lost", "outstanding", "sent", "state")

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.state = BrokerState.CONNECTING
        self.outstanding = 0
        self.sent = 0
        self.lost = 0


class Brokers:
    """The brokers of one client and where its requests are (see the module rules).

    :param endpoints: the brokers' endpoints, in the order given (indices name them)
    :param grace: seconds a request outstanding on a lost broker waits before it moves
        (Rule BK4)
    :param spread: ``"least"`` (Rule BK3: fewest outstanding, round-robin among ties) or
        ``"round-robin"`` (each live broker in turn, whatever it holds)
    """

    def __init__(
        self, endpoints: Sequence[str], *, grace: float = 0.2, spread: str = "least"
    ) -> None:
        check_grace(grace)
        if spread not in ("least", "round-robin"):
            raise ValueError(f"spread must be 'least' or 'round-robin', not {spread!r}")
        #: The endpoints, in the order given.
        self.endpoints = tuple(endpoints)
        #: Seconds before a request on a lost broker moves (Rule BK4).
        self.grace = grace
        self._least = spread == "least"
        self._brokers = [_Broker(endpoint) for endpoint in self.endpoints]
        #: The live brokers' indices, in index order.
        self._live: list[int] = []
        #: Where the next choice starts (Rule BK3's round-robin).
        self._next = 0
        #: Outstanding requests: id -> the broker it was last sent through.
        self._where: dict[bytes, int] = {}
        #: Requests that stay on their broker (streams, Rule BK4).
        self._fixed: set[bytes] = set()
        #: Requests marked by a HELD notice (Rule BK5).
        self._held: set[bytes] = set()
        #: Requests waiting for a live broker (Rule BK3), in order.
        self._parked: dict[bytes, None] = {}
        #: Requests to move when their grace ends: id -> its heap entry's generation.
        self._moving: dict[bytes, int] = {}
        self._heap: DeadlineHeap[bytes] = DeadlineHeap(self._move_live)
        self._gen = 0
        #: Requests moved to another broker (Rule BK4).
        self.moved = 0
        #: HELD notices for outstanding requests, and for anything else (Rule BK5).
        self.held = 0
        self.held_dropped = 0

    # ------------------------------------------------------------------ brokers

    def up(self, broker: int) -> list[bytes]:
        """Broker ``broker``'s handshake succeeded: it is live (Rule BK2). Returns the parked
        requests, for the driver to send now (each through :meth:`choose`'s broker)."""
        b = self._brokers[broker]
        if b.state is not BrokerState.LIVE:
            b.state = BrokerState.LIVE
            self._live = [i for i, x in enumerate(self._brokers) if x.state is BrokerState.LIVE]
        parked = list(self._parked)
        self._parked.clear()
        return parked

    def lost(self, broker: int, now: float) -> list[bytes]:
        """Broker ``broker``'s connection closed or its handshake failed (Rule BK2): its
        movable, unheld requests move at ``now + grace`` (Rule BK4). Returns the requests on
        it that may not move (streams), for the driver to end now."""
        b = self._brokers[broker]
        if b.state is BrokerState.LOST:
            return []
        if b.state is BrokerState.LIVE:
            self._live = [i for i in self._live if i != broker]
        b.state = BrokerState.LOST
        b.lost += 1
        broken: list[bytes] = []
        due = now + self.grace
        for rid, where in self._where.items():
            if where != broker:
                continue
            if rid in self._fixed:
                broken.append(rid)
            elif rid not in self._held:
                self._gen += 1
                self._moving[rid] = self._gen
                self._heap.push(due, self._gen, rid)
        self._heap.live = len(self._moving)
        for rid in broken:
            self.done(rid)
        return broken

    def is_live(self, broker: int) -> bool:
        """Whether broker ``broker`` is live (Rule BK2)."""
        return self._brokers[broker].state is BrokerState.LIVE

    @property
    def connecting(self) -> bool:
        """Whether a broker has not connected yet, nor failed to (Rule BK2)."""
        return any(b.state is BrokerState.CONNECTING for b in self._brokers)

    @property
    def any_live(self) -> bool:
        """Whether any broker is live."""
        return bool(self._live)

    # ------------------------------------------------------------------ requests

    def choose(self) -> int | None:
        """The broker for a new request (Rule BK3); ``None``: none is live (park it)."""
        live = self._live
        n = len(live)
        if n <= 1:
            return live[0] if n else None
        start = self._next
        # The first live broker at or after the round-robin position, then the least loaded.
        order = [i for i in live if i >= start] + [i for i in live if i < start]
        if self._least:
            brokers = self._brokers
            best = order[0]
            least = brokers[best].outstanding
            for i in order[1:]:
                if brokers[i].outstanding < least:
                    best, least = i, brokers[i].outstanding
        else:
            best = order[0]
        self._next = best + 1
        return best

    def sent(self, request_id: bytes, broker: int, *, movable: bool = True) -> None:
        """``request_id`` (its first attempt, a resend or a move) went through ``broker``; a
        request that may not move (a stream) stays there (Rule BK4)."""
        brokers = self._brokers
        old = self._where.get(request_id)
        if old is not None:
            brokers[old].outstanding -= 1
        b = brokers[broker]
        b.outstanding += 1
        b.sent += 1
        self._where[request_id] = broker
        if not movable:
            self._fixed.add(request_id)
        self._held.discard(request_id)  # Rule BK5: sent again, no longer held
        self._moving.pop(request_id, None)
        self._parked.pop(request_id, None)

    def park(self, request_id: bytes) -> None:
        """``request_id`` could not be sent: no broker is live (Rule BK3). It stays
        outstanding where it was (if anywhere) until :meth:`up` hands it back."""
        self._moving.pop(request_id, None)
        self._parked[request_id] = None

    def done(self, request_id: bytes) -> None:
        """``request_id`` ended (answered, timed out, cancelled, forgotten)."""
        broker = self._where.pop(request_id, None)
        if broker is not None:
            self._brokers[broker].outstanding -= 1
        if self._fixed:
            self._fixed.discard(request_id)
        if self._held:
            self._held.discard(request_id)
        if self._moving:
            self._moving.pop(request_id, None)
        if self._parked:
            self._parked.pop(request_id, None)

    def where(self, request_id: bytes) -> int | None:
        """The broker ``request_id`` was last sent through (``None``: not outstanding)."""
        return self._where.get(request_id)

    def route(self, request_id: bytes) -> int | None:
        """The broker for a resend of ``request_id`` (Rule BK6): its own if live, else
        :meth:`choose`'s; ``None``: none is live (park it)."""
        broker = self._where.get(request_id)
        if broker is not None and self._brokers[broker].state is BrokerState.LIVE:
            return broker
        return self.choose()

    def hold(self, request_id: bytes) -> bool:
        """A HELD notice for ``request_id`` arrived (Rule BK5): ``True`` if it is outstanding
        (now held, not moved), ``False`` if not (counted and dropped)."""
        if request_id not in self._where:
            self.held_dropped += 1
            return False
        self.held += 1
        self._held.add(request_id)
        self._moving.pop(request_id, None)
        self._parked.pop(request_id, None)  # a worker holds it: not sent again when one is up
        return True

    def is_held(self, request_id: bytes) -> bool:
        """Whether a HELD notice marks ``request_id`` (Rule BK5)."""
        return request_id in self._held

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do (``None``: nothing is moving)."""
        return self._heap.next_due() if self._moving else None

    def expire(self, now: float) -> list[bytes]:
        """The requests whose grace ended (Rule BK4), for the driver to resend now, each
        through :meth:`choose`'s broker (and :meth:`sent`), or :meth:`park` it if none is
        live, or :meth:`done` if it is no longer pending."""
        due: list[bytes] = []
        heap = self._heap
        moving = self._moving
        while (rid := heap.pop(now)) is not None:
            del moving[rid]
            due.append(rid)
        self._heap.live = len(moving)
        if not moving:
            heap.clear()
        self.moved += len(due)
        return due

    # ------------------------------------------------------------------ counters

    def info(self) -> list[BrokerInfo]:
        """Each broker's state and counters, in the order given."""
        return [
            BrokerInfo(b.endpoint, b.state, b.outstanding, b.sent, b.lost) for b in self._brokers
        ]

    @property
    def lost_count(self) -> int:
        """Times any broker was lost (Rule BK2), summed over the brokers."""
        return sum(b.lost for b in self._brokers)

    def __len__(self) -> int:
        """Outstanding requests."""
        return len(self._where)

    # ------------------------------------------------------------------ internals

    def _move_live(self, rid: bytes, gen: int) -> bool:
        return self._moving.get(rid) == gen
