"""Pub/sub for DCP peers (a dcp wire extension): the broker's pub/sub part. Sans-IO.

The extension (``docs/protocol.md``, "Pub/sub"): requests (0x04) to reserved service names
that start with ``\\xffDCP:`` (no UTF-8 service name starts with byte 0xFF), answered with
ordinary replies; deliveries are replies (0x05) whose one metadata part names the
subscription. A plain DCP v1 peer never sends these names, so it never sees any of it.

Rule PS1 - Requests. ``\\xffDCP:sub`` (data: sid, pattern, queue group, options ``k=v``...)
  subscribes; ``\\xffDCP:unsub`` (sid) ends it; ``\\xffDCP:credit`` (sid, count) grants
  credit and refreshes it (pubsub Rules P2, P5); ``\\xffDCP:pub`` (subject, data...)
  publishes. Each is answered with a reply carrying the request's metadata (``ok``, or for
  a publish the number of recipients as ASCII digits), except a publish without metadata,
  which is not answered (fire and forget). Errors are dcp error replies: ``bad_subject``,
  ``bad_subscription``, ``too_many_subscriptions``, ``unknown_subscription``,
  ``forbidden_subject``, ``unknown_pubsub_command``, and for a publish the backlog or the
  byte budget has no room for (pubsub Rule P8), ``pubsub_busy`` or ``memory_budget``.
Rule PS2 - Deliveries. A message: ``"" DGBX\\x01 0x05 client "" \\xffDCP:msg=<sid> ""
  subject data...``; a gap notice: ``... "" \\xffDCP:gap=<sid> "" <lost> <reason>``. In the
  subscriber's type-frame width.
Rule PS3 - Permissions (CURVE only: a message with a principal). A publish needs a
  publisher pattern matching its subject, a subscription a subscriber pattern covering its
  own (:func:`covers`), each listing the sender's key or ``*``; with no list, anyone may.
Rule PS4 - A request naming a client address other than its sender is refused
  (``forbidden_address``): pub/sub answers go to the sender.
Rule PS5 - Subscriber liveness. A subscription's ``timeout`` option (ms) is capped at
  ``max_subscription_timeout``: a subscriber that vanishes without unsubscribing holds its
  subscriptions (and their buffers) no longer than that (pubsub Rule P5); a subscriber that
  asked for longer and refreshes less often subscribes again when told its subscription is
  unknown.

What this module does NOT do: route, buffer or expire (:mod:`.pubsub` does), or speak mc0
(:mod:`.mc0`, which shares this part's subscriptions and checks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from dcp._core.broker.budget import Memory
from dcp._core.broker.directory import text
from dcp._core.broker.pubsub import Overflow, PubSub, Writer
from dcp._core.broker.subjects import SubjectError, check_pattern, check_subject, matches
from dcp.wire.options import OPTION_PREFIX

if TYPE_CHECKING:  # annotations only: the clients import this module's names
    from dcp._core.broker.dialects import DcpDialect
    from dcp._core.broker.outputs import Outputs
    from dcp.wire.messages import Request

__all__ = ["PUBSUB_PREFIX", "PubSubOptions", "PubSubPeers", "covers"]

#: Service names of the extension start with this.
PUBSUB_PREFIX = OPTION_PREFIX
SUB = OPTION_PREFIX + b"sub"
UNSUB = OPTION_PREFIX + b"unsub"
CREDIT = OPTION_PREFIX + b"credit"
PUB = OPTION_PREFIX + b"pub"
MSG_PREFIX = OPTION_PREFIX + b"msg="
GAP_PREFIX = OPTION_PREFIX + b"gap="
_OK = (b"ok",)
_ANY = b"*"
_MAX_WINDOW = 1_000_000
_MAX_TIMEOUT_MS = 3_600_000


def covers(allowed: bytes, pattern: bytes) -> bool:
    """Whether every subject ``pattern`` matches is matched by ``allowed`` (both valid)."""
    a = allowed.split(b".")
    p = pattern.split(b".")
    for i, token in enumerate(a):
        if token == b">":
            return len(p) > i
        if i >= len(p) or p[i] == b">" or (token != b"*" and token != p[i]):
            return False
    return len(a) == len(p)


def _acl(
    value: Mapping[str | bytes, Iterable[str | bytes]] | None,
) -> dict[bytes, frozenset[bytes]] | None:
    if value is None:
        return None
    out: dict[bytes, frozenset[bytes]] = {}
    for pattern, keys in value.items():
        p = pattern.encode() if isinstance(pattern, str) else bytes(pattern)
        check_pattern(p)
        out[p] = frozenset(k.encode() if isinstance(k, str) else bytes(k) for k in keys)
    return out


@attrs.frozen
class PubSubOptions:
    """Pub/sub settings of a broker (``Broker(pubsub=...)``).

    :ivar max_subscriptions: subscriptions at once (more are refused)
    :ivar max_subscriptions_per_peer: subscriptions of one peer at once
    :ivar max_pending: the largest buffer a subscription may ask for (messages)
    :ivar last_values: subjects whose last message is kept for new subscribers (0: off)
    :ivar max_mc0_peers: mc0 peers remembered at once (their TTL and subscriptions)
    :ivar max_subscription_timeout: seconds a DCP subscription lasts without a refresh, at
        most (Rule PS5; what a subscriber asks for is capped at this)
    :ivar mc0_idle: seconds of silence after which an mc0 peer that set no TTL is sent a
        ``NOOP``; one that is gone is then forgotten with its subscriptions (mc0 Rule MC3)
    :ivar fanout_slice: deliveries of one publish made at once; the rest follow between
        other messages (pubsub Rule P8)
    :ivar max_backlog: deliveries waiting to be made at most; a publish past it is refused
        ``pubsub_busy`` (pubsub Rule P8)
    :ivar publishers: with CURVE, subject pattern -> z85 keys (``"*"``: any key) that may
        publish to subjects it matches; ``None``: any key may publish anything
    :ivar subscribers: with CURVE, subject pattern -> keys that may subscribe to patterns
        it covers; ``None``: any key may subscribe to anything
    """

    max_subscriptions: int = 100_000
    max_subscriptions_per_peer: int = 10_000
    max_pending: int = 100_000
    last_values: int = 0
    max_mc0_peers: int = 65_536
    max_subscription_timeout: float = attrs.field(default=120.0, validator=attrs.validators.gt(0))
    mc0_idle: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    fanout_slice: int = attrs.field(default=256, validator=attrs.validators.ge(1))
    max_backlog: int = attrs.field(default=1_000_000, validator=attrs.validators.ge(1))
    publishers: Mapping[bytes, frozenset[bytes]] | None = attrs.field(
        default=None, converter=_acl, eq=False
    )
    subscribers: Mapping[bytes, frozenset[bytes]] | None = attrs.field(
        default=None, converter=_acl, eq=False
    )

    def may_publish(self, key: bytes, subject: bytes) -> bool:
        return _allowed(self.publishers, key, subject, matches)

    def may_subscribe(self, key: bytes, pattern: bytes) -> bool:
        return _allowed(self.subscribers, key, pattern, covers)


def _allowed(
    acl: Mapping[bytes, frozenset[bytes]] | None, key: bytes, what: bytes, test: object
) -> bool:
    if acl is None:
        return True
    assert callable(test)
    return any((key in keys or _ANY in keys) and test(p, what) for p, keys in acl.items())


class DcpWriter(Writer):
    """Deliveries and gap notices to a DCP subscriber (Rule PS2)."""

    __slots__ = ("_dialect",)

    def __init__(self, dialect: DcpDialect) -> None:
        self._dialect = dialect

    def message(
        self, peer: bytes, sid: bytes, subject: bytes, data: Sequence[bytes]
    ) -> list[bytes]:
        return self._dialect.reply(peer, b"", (MSG_PREFIX + sid,), (subject, *data))

    def gap(self, peer: bytes, sid: bytes, lost: int, reason: str) -> list[bytes] | None:
        return self._dialect.reply(peer, b"", (GAP_PREFIX + sid,), (b"%d" % lost, reason.encode()))


_WRITERS: dict[DcpDialect, DcpWriter] = {}


def _options(parts: Sequence[bytes]) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for part in parts:
        key, _, value = bytes(part).partition(b"=")
        out.setdefault(key, value)
    return out


def _count(value: bytes | None, default: int, low: int, high: int) -> int | None:
    if value is None:
        return default
    if not value.isdigit() or len(value) > 12:
        return None
    n = int(value)
    return n if low <= n <= high else None


class PubSubPeers:
    """Pub/sub for DCP peers (the module's rules): it owns the broker's :class:`PubSub`
    state, which :mod:`dcp._core.broker.mc0` shares for mc0 peers.

    :param outputs: where answers, deliveries, counts and refusals go
    :param options: the pub/sub settings (``None``: the defaults)
    :param memory: the broker's byte budget (``None``: none)
    """

    def __init__(
        self, outputs: Outputs, options: PubSubOptions | None, memory: Memory | None = None
    ) -> None:
        self._out = outputs
        self._outbox = outputs.outbox
        self.options = options = options or PubSubOptions()
        #: The byte budget pub/sub and mc0 peers charge (budget Rules MB1-MB4).
        self.memory = memory = memory if memory is not None else Memory(None)
        self._max_timeout_ms = max(
            1, min(_MAX_TIMEOUT_MS, int(options.max_subscription_timeout * 1000))
        )
        #: The subscriptions, buffers and counters.
        self.pubsub = PubSub(
            max_subscriptions=options.max_subscriptions,
            max_subscriptions_per_peer=options.max_subscriptions_per_peer,
            max_pending=options.max_pending,
            last_values=options.last_values,
            memory=memory,
            fanout_slice=options.fanout_slice,
            max_backlog=options.max_backlog,
        )

    def flush(self) -> None:
        """Move what the pub/sub state has to send to the outbox."""
        ps = self.pubsub
        if ps.outbox:
            self._outbox.extend(ps.outbox)
            ps.outbox.clear()

    def expire(self, now: float) -> None:
        """Subscriptions not refreshed in time end (pubsub Rule P5), and one slice of the
        fan-out backlog is delivered (pubsub Rule P8)."""
        self.pubsub.expire(now)
        self.flush()

    def receive(
        self, peer: bytes, msg: Request, dialect: DcpDialect, now: float, principal: str | None
    ) -> None:
        """A DCP request to a reserved pub/sub name (Rules PS1, PS3, PS4)."""
        name = msg.service
        metadata = msg.metadata
        if msg.client is not None and msg.client != peer:
            self._out.refuse(
                peer,
                dialect,
                name,
                metadata,
                "forbidden_address",
                "pub/sub answers go to the sender",
            )
            return
        data = msg.data
        key = principal.encode() if principal is not None else None
        if name == PUB:
            self._publish_dcp(peer, dialect, metadata, data, key, now)
        elif name == CREDIT:
            grant = _count(bytes(data[1]) if len(data) == 2 else None, -1, 0, _MAX_WINDOW)
            if grant is None or grant < 0:
                self._out.refuse(
                    peer, dialect, name, metadata, "bad_subscription", "credit needs sid, count"
                )
                return
            if self.pubsub.refresh(peer, bytes(data[0]), grant, now):
                self._outbox.append(dialect.reply(peer, name, metadata, _OK))
                self.flush()
            else:
                self._outbox.append(
                    dialect.error(peer, name, metadata, "unknown_subscription", "subscribe again")
                )
        elif name == SUB:
            self._subscribe_dcp(peer, dialect, metadata, data, key, now)
        elif name == UNSUB:
            if len(data) != 1:
                self._out.refuse(
                    peer, dialect, name, metadata, "bad_subscription", "unsub needs a sid"
                )
                return
            self.pubsub.unsubscribe(peer, bytes(data[0]))
            self._outbox.append(dialect.reply(peer, name, metadata, _OK))
        else:
            self._out.refuse(
                peer, dialect, name, metadata, "unknown_pubsub_command", repr(name[:32])
            )

    def _publish_dcp(
        self,
        peer: bytes,
        dialect: DcpDialect,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        key: bytes | None,
        now: float,
    ) -> None:
        error = self.check_publish(data[0] if data else b"", key)
        if not isinstance(error, tuple):
            routed = self.pubsub.publish(error, bytes(data[0]), data[1:], peer=peer, now=now)
            if type(routed) is int:
                if metadata:
                    self._outbox.append(dialect.reply(peer, PUB, metadata, (b"%d" % routed,)))
                self.flush()
                return
            assert isinstance(routed, str)  # pubsub Rule P8
            error = routed, "publish refused: pub/sub is busy or over its memory budget"
        if metadata:
            self._out.refuse(peer, dialect, PUB, metadata, *error)
        else:
            self._out.reject(peer, *error)
        self.flush()

    def check_publish(self, subject: bytes, key: bytes | None) -> list[bytes] | tuple[str, str]:
        """The subject's tokens, or ``(code, message)`` why it may not be published."""
        subject = bytes(subject)
        try:
            tokens = check_subject(subject)
        except SubjectError as exc:
            return "bad_subject", str(exc)
        if key is not None and not self.options.may_publish(key, subject):
            return "forbidden_subject", f"may not publish to {text(subject)!r}"
        return tokens

    def check_subscribe(self, pattern: bytes, key: bytes | None) -> list[bytes] | tuple[str, str]:
        """The pattern's tokens, or ``(code, message)`` why it may not be subscribed to."""
        try:
            tokens = check_pattern(pattern)
        except SubjectError as exc:
            return "bad_subject", str(exc)
        if key is not None and not self.options.may_subscribe(key, pattern):
            return "forbidden_subject", f"may not subscribe to {text(pattern)!r}"
        return tokens

    def _subscribe_dcp(
        self,
        peer: bytes,
        dialect: DcpDialect,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        key: bytes | None,
        now: float,
    ) -> None:
        if len(data) < 3 or not data[0]:
            self._out.refuse(
                peer, dialect, SUB, metadata, "bad_subscription", "sub needs sid, pattern, queue"
            )
            return
        sid, pattern, queue = bytes(data[0]), bytes(data[1]), bytes(data[2])
        checked = self.check_subscribe(pattern, key)
        if isinstance(checked, tuple):
            self._out.refuse(peer, dialect, SUB, metadata, *checked)
            return
        opts = _options(data[3:])
        max_pending = _count(opts.get(b"max-pending"), 1000, 1, self.pubsub.max_pending)
        window = _count(opts.get(b"window"), 1000, 1, _MAX_WINDOW)
        timeout = _count(opts.get(b"timeout"), 30_000, 1, _MAX_TIMEOUT_MS)
        if timeout is not None:  # Rule PS5
            timeout = min(timeout, self._max_timeout_ms)
        try:
            overflow = Overflow(opts.get(b"overflow", b"drop-oldest").decode("ascii", "replace"))
        except ValueError:
            overflow = None
        if max_pending is None or window is None or timeout is None or overflow is None:
            self._out.refuse(
                peer, dialect, SUB, metadata, "bad_subscription", f"bad options {sorted(opts)}"
            )
            return
        writer = _WRITERS.get(dialect)
        if writer is None:
            writer = _WRITERS[dialect] = DcpWriter(dialect)
        refused = self.pubsub.subscribe(
            peer,
            sid,
            checked,
            writer,
            now,
            queue=queue,
            max_pending=max_pending,
            overflow=overflow,
            credit=window,
            timeout=timeout / 1000,
            last_value=b"last-value" in opts,
        )
        if refused is not None:
            self._out.refuse(peer, dialect, SUB, metadata, refused, "subscription refused")
            return
        self._outbox.append(dialect.reply(peer, SUB, metadata, _OK))
        self.flush()

    def undeliverable(self, frames: list[bytes]) -> bool:
        """A pub/sub message the driver could not send (zmq's queue to the subscriber is
        full, or it is gone): a lost message, told in the subscription's next gap notice, its
        credit given back (pubsub Rule P4). Whether ``frames`` was one."""
        # Rule PS2 with the routing id first: id "" DGBX type client "" head "" ...
        head = frames[6] if len(frames) > 8 else b""
        if head.__class__ is not bytes:
            return False
        kind = head[:9]
        if kind == MSG_PREFIX:
            self.pubsub.undelivered(frames[0], head[9:], 1, counted=False)
        elif kind == GAP_PREFIX:
            lost = frames[8]
            if lost.__class__ is bytes and lost.isdigit():
                self.pubsub.undelivered(frames[0], head[9:], int(lost), counted=True)
        else:
            return False
        return True
