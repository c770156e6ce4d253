"""mc0 peers (:mod:`dcp.wire.mc0`) on the broker's pub/sub. Sans-IO: one of the broker
core's dialect handlers (:class:`~.core.Handler`).

Rule MC1 - Topics are subjects. An mc0 topic is an exact subject (no wildcards): ``SUB``
  subscribes to each topic named, ``UNSUB`` ends those subscriptions, ``PUT`` publishes its
  body to its ``TOPIC`` (reaching dcp subscribers whose patterns match), and dcp publishes
  reach mc0 subscribers of that subject as ``MESSAGE``. A topic that is not a valid plain
  subject (subjects Rule SJ1: a ``*`` or ``>`` token, an empty token, whitespace) is refused.
Rule MC2 - Answers. A command with an ``ID`` header is answered ``OK`` with it, or ``ERROR``
  with it and a ``MESSAGE``; a failed command without ``ID`` gets ``ERROR`` with ``MESSAGE``
  alone. Every failure is also counted by reason (``bad_mc0_message``, ``bad_subject``,
  ``forbidden_subject``, ``too_many_subscriptions``, ``bad_ttl``, ``header_too_long``,
  ``memory_budget``, ``pubsub_busy``).
Rule MC3 - Liveness. ``CONNECT`` may set ``TTL`` (ms, 100 to 86,400,000): when the broker has
  not heard from the peer for that long it sends ``NOOP`` (again every TTL of silence); a
  peer that set no TTL is treated as if it had set ``mc0_idle`` (60 s by default). A peer
  the broker cannot send its NOOP to (gone, or hopelessly behind), one that sends
  ``DISCONNECT``, or the least recently heard one when more than ``max_mc0_peers`` are
  known, is forgotten: its subscriptions and what it was charged.
Rule MC4 - Flow. mc0 has no credit and no gap notice: deliveries go out at once (pubsub Rule
  P2, no credit accounting), a delivery zmq's send queue has no room for is lost and counted
  (``lost`` in the pub/sub statistics), so a slow mc0 peer costs nobody else anything.

Rule MC5 - Peer state. What the broker keeps per mc0 peer is bounded: a ``VERSION`` longer
  than :data:`MAX_VERSION` bytes is refused (``header_too_long``) before it is kept, and
  a peer's state (its id, version and bookkeeping, budget Rule MB4) is charged to the
  ``peers`` account of the byte budget; a new peer the account has no room for is refused
  (``memory_budget``), and what a peer was charged is released when it is forgotten.

Not implemented (the draft leaves them open): ``VERSION`` is recorded but changes nothing;
``X-`` headers are ignored; a PUT is not acknowledged without ``ID``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from dcp._core.broker.budget import ENTRY_OVERHEAD
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.pubsub import Writer
from dcp._core.broker.pubsub_peers import PubSubPeers
from dcp._core.broker.records import Session
from dcp._errors import RemoteProtocolError
from dcp._util import DeadlineHeap
from dcp.wire import mc0

__all__ = ["MAX_VERSION", "Mc0Peers"]

#: The longest ``VERSION`` kept for an mc0 peer, in bytes (Rule MC5).
MAX_VERSION = 4096

_MIN_TTL_MS = 100
_MAX_TTL_MS = 86_400_000
_SID_PREFIX = b"mc0:"
_FROM_BROKER = frozenset({b"MESSAGE", b"NOOP", b"OK", b"ERROR"})


class _Peer:
    __slots__ = ("charged", "ident", "token", "ttl", "version")

    def __init__(self, ident: bytes, charged: int) -> None:
        self.ident = ident
        self.ttl: float | None = None
        self.version = b""
        self.token = 0
        #: Bytes charged to the ``peers`` account (Rule MC5).
        self.charged = charged


class _Writer(Writer):
    def message(
        self, peer: bytes, sid: bytes, subject: bytes, data: Sequence[bytes]
    ) -> list[bytes]:
        return [peer, *mc0.message(subject, data)]

    def gap(self, peer: bytes, sid: bytes, lost: int, reason: str) -> list[bytes] | None:
        return None


_WRITER = _Writer()


def _live(peer: _Peer, token: int) -> bool:
    return peer.token == token


class Mc0Peers:
    """The mc0 dialect handler (the module's rules).

    :param outputs: where answers, deliveries, counts and refusals go
    :param pubsub: the broker's pub/sub part (its subscriptions, settings and checks)
    """

    def __init__(self, outputs: Outputs, pubsub: PubSubPeers) -> None:
        self._out = outputs
        self._outbox = outputs.outbox
        self._peers_part = pubsub
        self._pubsub = pubsub.pubsub
        self._max_peers = pubsub.options.max_mc0_peers
        self._idle = pubsub.options.mc0_idle
        self._account = pubsub.memory.account("peers")
        self._peers: OrderedDict[bytes, _Peer] = OrderedDict()
        self._ttl: DeadlineHeap[_Peer] = DeadlineHeap(_live)

    def receive(
        self,
        peer: bytes,
        body: Sequence[bytes],
        worker: Session | None,
        now: float,
        principal: str | None,
    ) -> None:
        """One mc0 command from ``peer`` (Rules MC1-MC3)."""
        try:
            cmd = mc0.parse(body)
        except RemoteProtocolError as exc:
            self._fail(peer, None, exc.reason, str(exc))
            return
        state = self._heard(peer, now)
        ident = cmd.id
        if state is None:
            self._fail(peer, ident, "memory_budget", "no room for another mc0 peer")
            return
        verb = cmd.verb
        key = principal.encode() if principal is not None else None
        part = self._peers_part
        if verb == b"PUT":
            topic = cmd.headers.get(b"TOPIC")
            if topic is None:
                self._fail(peer, ident, "bad_mc0_message", "PUT without TOPIC")
                return
            checked = part.check_publish(topic, key)
            if isinstance(checked, tuple):
                self._fail(peer, ident, *checked)
                return
            routed = self._pubsub.publish(checked, topic, cmd.positional, peer=peer, now=now)
            part.flush()
            if routed.__class__ is str:
                assert isinstance(routed, str)
                self._fail(peer, ident, routed, "publish refused")
                return
        elif verb == b"SUB":
            for topic in cmd.positional:
                topic = bytes(topic)
                tokens = part.check_subscribe(topic, key)
                if isinstance(tokens, tuple) or b"*" in tokens or b">" in tokens:
                    code, why = (
                        tokens
                        if isinstance(tokens, tuple)
                        else ("bad_subject", "mc0 topics are exact")
                    )
                    self._fail(peer, ident, code, f"{why} ({topic[:64]!r})")
                    return
                refused = self._pubsub.subscribe(peer, _SID_PREFIX + topic, tokens, _WRITER, now)
                if refused is not None:
                    self._fail(peer, ident, refused, "subscription refused")
                    return
        elif verb == b"UNSUB":
            for topic in cmd.positional:
                self._pubsub.unsubscribe(peer, _SID_PREFIX + bytes(topic))
        elif verb == b"CONNECT":
            ttl = cmd.headers.get(b"TTL")
            version = cmd.headers.get(b"VERSION", b"")
            if len(version) > MAX_VERSION:  # Rule MC5
                self._fail(peer, ident, "header_too_long", f"VERSION over {MAX_VERSION} bytes")
                return
            if len(version) > len(state.version):
                more = len(version) - len(state.version)
                if not self._account.charge(peer, more):
                    self._fail(peer, ident, "memory_budget", "no room for the VERSION")
                    return
                state.charged += more
            if ttl is not None:
                if not ttl.isdigit() or not _MIN_TTL_MS <= int(ttl[:12]) <= _MAX_TTL_MS:
                    self._fail(peer, ident, "bad_ttl", f"TTL {ttl[:16]!r}")
                    return
                state.ttl = int(ttl) / 1000
                self._schedule(state, now)
            state.version = version
        elif verb == b"DISCONNECT":
            self._forget(peer)
        # NOOP: being heard is all it does.
        if ident is not None:
            self._outbox.append([peer, *mc0.ok(ident)])

    def _fail(self, peer: bytes, ident: bytes | None, code: str, detail: str) -> None:
        self._out.reject(peer, code, detail)
        self._outbox.append([peer, *mc0.error(ident, f"{code}: {detail}")])

    def _heard(self, peer: bytes, now: float) -> _Peer | None:
        """The peer's state, noted as heard at ``now`` (``None``: a new peer the ``peers``
        account has no room for, Rule MC5)."""
        peers = self._peers
        state = peers.get(peer)
        if state is None:
            charged = ENTRY_OVERHEAD + len(peer)
            if not self._account.charge(peer, charged):
                return None
            state = peers[peer] = _Peer(peer, charged)
            if len(peers) > self._max_peers:
                oldest = next(iter(peers))
                self._out.counters.count("mc0_peer_evicted")
                self._forget(oldest)
        else:
            peers.move_to_end(peer)
        self._schedule(state, now)
        return state

    def _schedule(self, state: _Peer, now: float) -> None:
        """Rule MC3: the next NOOP is due after a TTL (or ``mc0_idle``) of silence."""
        state.token += 1
        if state.token == 1:
            self._ttl.live += 1
        self._ttl.push(now + (self._idle if state.ttl is None else state.ttl), state.token, state)

    def _forget(self, peer: bytes) -> None:
        state = self._peers.pop(peer, None)
        if state is not None:
            if state.token > 0:
                self._ttl.live -= 1
            state.token = -1
            self._account.release(peer, state.charged)
        self._pubsub.drop_peer(peer)

    def expire(self, now: float) -> None:
        """Rule MC3: a NOOP to every peer silent for its TTL (or ``mc0_idle``)."""
        heap = self._ttl
        while (state := heap.pop(now)) is not None:
            self._outbox.append([state.ident, *mc0.noop()])
            self._schedule(state, now)

    def next_deadline(self) -> float | None:
        """When the next NOOP is due (``None``: no mc0 peer is known)."""
        ttl = self._ttl
        return ttl.next_due() if ttl.live else None

    def undeliverable(self, frames: list[bytes]) -> bool:
        """An mc0 message the driver could not send (Rules MC3, MC4); whether ``frames`` was
        one."""
        if len(frames) < 2 or frames[0] not in self._peers:
            return False
        verb = frames[1]
        if verb.__class__ is not bytes or verb not in _FROM_BROKER:
            return False
        pubsub = self._pubsub
        if verb == b"MESSAGE":
            pubsub.lost += 1
            pubsub.delivered -= 1
        elif verb == b"NOOP":
            self._forget(frames[0])  # gone, or hopelessly behind
        return True
