"""Publish/subscribe in the broker: subscriptions, bounded buffers, gap counts. Sans-IO.

Subscriptions are keyed by (peer, subscription id) and filed in a :class:`SubjectTrie`
under their pattern. The wire (DCP extension, mc0) is the callers' business: each
subscription carries a :class:`Writer` that turns deliveries and gap notices into frames.
Input methods take ``now`` and append frames (routing id first) to :attr:`PubSub.outbox`.

Rule P1 - Fan-out. :meth:`PubSub.publish` offers a message to every subscription whose
  pattern matches (trie Rule SJ2: no scan over subscriptions) and returns how many it was
  routed to. Subscriptions sharing a queue group name take it in turns: the group's next
  member that can take it at once (credit, nothing pending), else the next member in turn.
Rule P2 - Credit. A subscription may be given messages only while it has *credit*, which its
  subscriber grants (DCP: the window at subscribe time, then what it consumed); a subscription
  without credit accounting (mc0) is sent everything at once and zmq's send queue bounds it.
  So what sits in zmq's queue for one subscriber is bounded by its window, and a slow
  subscriber never blocks the broker, the others or the request/reply path.
Rule P3 - Bounded buffers. Messages a subscription cannot take yet wait in its buffer, at most
  ``max_pending``. A message that finds it full is handled by the subscription's overflow
  policy: ``drop-newest`` (the message is lost), ``drop-oldest`` (the oldest waiting one is
  lost), ``disconnect`` (everything waiting is lost and the subscription ends).
Rule P4 - Gap notices. Lost messages are counted where they were lost, and the subscriber is
  told the count (its writer's gap notice) in order: before the first message after the loss,
  or as soon as it has credit when nothing follows. A notice costs no credit. An ended
  (``disconnect``) subscription gets a final notice naming the reason.
Rule P5 - Liveness. A subscription with a timeout (DCP) ends if its subscriber does not
  refresh it (a credit grant, even of 0) within it; a subscriber that learns its subscription
  is unknown (after a broker restart, or such an end) subscribes again. Ending a peer (mc0
  DISCONNECT, an undeliverable message) ends all its subscriptions.
Rule P6 - Last values. With ``last_values`` > 0 the broker keeps the last message of that
  many subjects (least recently published out); a subscription that asks for them gets, first,
  the last message of every kept subject its pattern matches (a scan of the cache at
  subscribe time only).

What this module does NOT do: persistence, redelivery, exactly-once (pub/sub is at most
once, and every loss is counted), permissions (the caller checks them before calling).
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Sequence

import attrs

from dcp._core.broker.subjects import SubjectTrie, matches

__all__ = ["Overflow", "PubSub", "PubSubStatistics", "Subscription", "Writer"]


class Overflow(enum.Enum):
    """What a full subscription buffer does with one more message (Rule P3)."""

    #: The new message is lost.
    DROP_NEWEST = "drop-newest"
    #: The oldest waiting message is lost.
    DROP_OLDEST = "drop-oldest"
    #: The subscription ends; everything waiting is lost (the subscriber is told).
    DISCONNECT = "disconnect"


@attrs.frozen
class PubSubStatistics:
    """Pub/sub counters and gauges of a broker (:meth:`dcp.Broker.pubsub_statistics`)."""

    #: Messages published (each counted once, however many it went to).
    published: int
    #: Messages routed to subscriptions (one per recipient).
    routed: int
    #: Messages sent to subscribers.
    delivered: int
    #: Messages lost to full buffers (Rule P3), each counted once per subscription.
    lost: int
    #: Subscriptions ended by the ``disconnect`` policy.
    disconnected: int
    #: Subscriptions ended because their subscriber stopped refreshing them.
    expired: int
    #: Subscriptions now.
    subscriptions: int
    #: Messages now waiting in subscription buffers.
    pending: int


class Writer:
    """How to tell one kind of subscriber about messages (one instance per wire form)."""

    def message(
        self, peer: bytes, sid: bytes, subject: bytes, data: Sequence[bytes]
    ) -> list[bytes]:
        """A delivery of ``data`` published to ``subject`` for subscription ``sid``."""
        raise NotImplementedError

    def gap(self, peer: bytes, sid: bytes, lost: int, reason: str) -> list[bytes] | None:
        """A gap notice: ``lost`` messages were lost (``reason``: the policy); ``None``
        if this wire cannot say it (the loss is still counted)."""
        raise NotImplementedError


class Subscription:
    """One subscription's state (Rules P2-P5)."""

    __slots__ = (
        "credit",
        "expires",
        "max_pending",
        "overflow",
        "peer",
        "pending",
        "queue",
        "sid",
        "tail_lost",
        "timeout",
        "tokens",
        "writer",
    )

    def __init__(
        self,
        peer: bytes,
        sid: bytes,
        tokens: list[bytes],
        queue: bytes,
        writer: Writer,
        *,
        max_pending: int,
        overflow: Overflow,
        credit: int | None,
        timeout: float | None,
        now: float,
    ) -> None:
        self.peer = peer
        self.sid = sid
        self.tokens = tokens
        self.queue = queue
        self.writer = writer
        self.max_pending = max_pending
        self.overflow = overflow
        #: Messages it may still be sent (``None``: no credit accounting).
        self.credit = credit
        #: Waiting messages: ``[lost just before it, subject, data]``.
        self.pending: deque[list[object]] = deque()
        #: Lost after the last waiting message (drop-newest), not yet told.
        self.tail_lost = 0
        self.timeout = timeout
        self.expires = now + timeout if timeout is not None else None


class _Group:
    """Subscriptions of one pattern sharing a queue group name (Rule P1)."""

    __slots__ = ("members", "name", "turn")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.members: list[Subscription] = []
        self.turn = 0


class PubSub:
    """The broker's pub/sub state (the module's rules).

    :param max_subscriptions: subscriptions at once (more are refused)
    :param max_subscriptions_per_peer: subscriptions of one peer at once
    :param max_pending: the largest buffer a subscription may ask for
    :param last_values: subjects whose last message is kept (0: none; Rule P6)
    """

    def __init__(
        self,
        *,
        max_subscriptions: int = 100_000,
        max_subscriptions_per_peer: int = 10_000,
        max_pending: int = 100_000,
        last_values: int = 0,
    ) -> None:
        self.max_subscriptions = max_subscriptions
        self.max_subscriptions_per_peer = max_subscriptions_per_peer
        self.max_pending = max_pending
        self.last_values = last_values
        self.outbox: list[list[bytes]] = []
        self._trie: SubjectTrie[Subscription | _Group] = SubjectTrie()
        self._groups: dict[tuple[bytes, bytes], _Group] = {}
        self._peers: dict[bytes, dict[bytes, Subscription]] = {}
        self._count = 0
        self._turn = 0
        # Subscriptions with a timeout, least recently refreshed first (Rule P5).
        self._timed: OrderedDict[Subscription, None] = OrderedDict()
        self._last: OrderedDict[bytes, tuple[list[bytes], Sequence[bytes]]] = OrderedDict()
        self.published = 0
        self.routed = 0
        self.delivered = 0
        self.lost = 0
        self.disconnected = 0
        self.expired = 0

    # ------------------------------------------------------------ subscriptions

    def subscribe(
        self,
        peer: bytes,
        sid: bytes,
        tokens: list[bytes],
        writer: Writer,
        now: float,
        *,
        queue: bytes = b"",
        max_pending: int = 1000,
        overflow: Overflow = Overflow.DROP_OLDEST,
        credit: int | None = None,
        timeout: float | None = None,
        last_value: bool = False,
    ) -> str | None:
        """Add (or, for a known ``sid``, replace) a subscription; an error code if refused."""
        if not 1 <= max_pending <= self.max_pending:
            return "bad_subscription"
        known = self._peers.get(peer)
        old = known.get(sid) if known is not None else None
        if old is not None:
            self._remove(old)
        elif self._count >= self.max_subscriptions or (
            known is not None and len(known) >= self.max_subscriptions_per_peer
        ):
            return "too_many_subscriptions"
        sub = Subscription(
            peer,
            sid,
            tokens,
            queue,
            writer,
            max_pending=max_pending,
            overflow=overflow,
            credit=credit,
            timeout=timeout,
            now=now,
        )
        self._peers.setdefault(peer, {})[sid] = sub
        self._count += 1
        if timeout is not None:
            self._timed[sub] = None
        if queue:
            key = (b".".join(tokens), queue)
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group(queue)
                self._trie.add(tokens, group)
            group.members.append(sub)
        else:
            self._trie.add(tokens, sub)
        if last_value and self._last:
            pattern = b".".join(tokens)
            for subject, (_, data) in list(self._last.items()):
                if matches(pattern, subject):
                    self._offer(sub, subject, data)
        return None

    def unsubscribe(self, peer: bytes, sid: bytes) -> bool:
        """End a subscription; whether it existed."""
        known = self._peers.get(peer)
        sub = known.get(sid) if known is not None else None
        if sub is None:
            return False
        self._remove(sub)
        return True

    def drop_peer(self, peer: bytes) -> int:
        """End every subscription of ``peer`` (Rule P5); how many there were."""
        known = self._peers.get(peer)
        if not known:
            return 0
        subs = list(known.values())
        for sub in subs:
            self._remove(sub)
        return len(subs)

    def refresh(self, peer: bytes, sid: bytes, grant: int, now: float) -> bool:
        """The subscriber grants ``grant`` more messages and is alive (Rules P2, P5);
        ``False`` if the subscription is unknown."""
        known = self._peers.get(peer)
        sub = known.get(sid) if known is not None else None
        if sub is None:
            return False
        if sub.timeout is not None:
            sub.expires = now + sub.timeout
            self._timed.move_to_end(sub)
        if sub.credit is not None:
            sub.credit += grant
            self._flush(sub)
        return True

    def undelivered(self, peer: bytes, sid: bytes, lost: int, *, counted: bool) -> None:
        """The driver could not send a delivery (``counted=False``: count it) or a gap
        notice of ``lost`` messages: tell them in the next notice, give the credit back."""
        known = self._peers.get(peer)
        sub = known.get(sid) if known is not None else None
        if not counted:
            self.lost += lost
            self.delivered -= lost
        if sub is None:
            return
        sub.tail_lost += lost
        if not counted and sub.credit is not None:
            sub.credit += lost

    def subscriptions_of(self, peer: bytes) -> int:
        known = self._peers.get(peer)
        return len(known) if known is not None else 0

    def __len__(self) -> int:
        return self._count

    # ------------------------------------------------------------ publishing

    def publish(self, tokens: list[bytes], subject: bytes, data: Sequence[bytes]) -> int:
        """Offer a message to every matching subscription (Rule P1); how many got it."""
        self.published += 1
        if self.last_values:
            last = self._last
            last[subject] = (tokens, data)
            last.move_to_end(subject)
            if len(last) > self.last_values:
                last.popitem(last=False)
        routed = 0
        groups: dict[bytes, list[_Group]] | None = None
        for entry in list(self._trie.match(tokens)):  # a disconnect may remove one
            if entry.__class__ is Subscription:
                assert isinstance(entry, Subscription)
                routed += 1
                self._offer(entry, subject, data)
            else:
                assert isinstance(entry, _Group)
                if groups is None:
                    groups = {}
                groups.setdefault(entry.name, []).append(entry)
        if groups is not None:
            for same in groups.values():
                self._offer(self._pick(same), subject, data)
                routed += 1
        self.routed += routed
        return routed

    def _pick(self, groups: list[_Group]) -> Subscription:
        """Rule P1: the next member (across ``groups``) that can take a message at once."""
        first: Subscription | None = None
        if len(groups) > 1:  # the groups of one name take turns too
            self._turn += 1
            k = self._turn % len(groups)
            groups = groups[k:] + groups[:k]
        for group in groups:
            members = group.members
            n = len(members)
            for _ in range(n):
                sub = members[group.turn % n]
                group.turn = (group.turn + 1) % n
                if first is None:
                    first = sub
                if not sub.pending and (sub.credit is None or sub.credit > 0):
                    return sub
        assert first is not None
        return first

    def _offer(self, sub: Subscription, subject: bytes, data: Sequence[bytes]) -> None:
        credit = sub.credit
        if not sub.pending and (credit is None or credit > 0):
            self._send(sub, sub.tail_lost, subject, data)
            sub.tail_lost = 0
            return
        pending = sub.pending
        if len(pending) < sub.max_pending:
            pending.append([sub.tail_lost, subject, data])
            sub.tail_lost = 0
            return
        self.lost += 1
        policy = sub.overflow
        if policy is Overflow.DROP_NEWEST:
            sub.tail_lost += 1
        elif policy is Overflow.DROP_OLDEST:
            oldest = pending.popleft()
            lost = oldest[0]
            assert isinstance(lost, int)
            if pending:
                pending[0][0] += lost + 1  # type: ignore[operator]
                pending.append([sub.tail_lost, subject, data])
            else:  # max_pending == 1
                pending.append([sub.tail_lost + lost + 1, subject, data])
            sub.tail_lost = 0
        else:
            lost = 1 + len(pending) + sub.tail_lost
            for entry in pending:
                lost += entry[0]  # type: ignore[operator]
            self.lost += len(pending)
            notice = sub.writer.gap(sub.peer, sub.sid, lost, policy.value)
            if notice is not None:
                self.outbox.append(notice)
            self.disconnected += 1
            self._remove(sub)

    def _send(self, sub: Subscription, lost: int, subject: bytes, data: Sequence[bytes]) -> None:
        writer = sub.writer
        if lost:
            notice = writer.gap(sub.peer, sub.sid, lost, sub.overflow.value)
            if notice is not None:
                self.outbox.append(notice)
        self.outbox.append(writer.message(sub.peer, sub.sid, subject, data))
        self.delivered += 1
        if sub.credit is not None:
            sub.credit -= 1

    def _flush(self, sub: Subscription) -> None:
        """Send what is waiting while credit lasts (Rules P2, P4)."""
        pending = sub.pending
        while pending and sub.credit:
            lost, subject, data = pending.popleft()
            self._send(sub, lost, subject, data)  # type: ignore[arg-type]
        if not pending and sub.tail_lost and sub.credit:
            notice = sub.writer.gap(sub.peer, sub.sid, sub.tail_lost, sub.overflow.value)
            sub.tail_lost = 0
            if notice is not None:
                self.outbox.append(notice)

    def _remove(self, sub: Subscription) -> None:
        known = self._peers[sub.peer]
        del known[sub.sid]
        if not known:
            del self._peers[sub.peer]
        self._count -= 1
        self._timed.pop(sub, None)
        if sub.queue:
            key = (b".".join(sub.tokens), sub.queue)
            group = self._groups[key]
            group.members.remove(sub)
            if not group.members:
                del self._groups[key]
                self._trie.remove(sub.tokens, group)
        else:
            self._trie.remove(sub.tokens, sub)
        sub.pending.clear()

    # ------------------------------------------------------------ time

    def expire(self, now: float) -> int:
        """End subscriptions not refreshed in time (Rule P5); how many."""
        timed = self._timed
        ended = 0
        while timed:
            sub = next(iter(timed))
            assert sub.expires is not None
            if sub.expires > now:
                break
            self._remove(sub)
            ended += 1
        self.expired += ended
        return ended

    def next_expiry(self) -> float | None:
        if not self._timed:
            return None
        return next(iter(self._timed)).expires

    def statistics(self) -> PubSubStatistics:
        pending = sum(len(s.pending) for known in self._peers.values() for s in known.values())
        return PubSubStatistics(
            published=self.published,
            routed=self.routed,
            delivered=self.delivered,
            lost=self.lost,
            disconnected=self.disconnected,
            expired=self.expired,
            subscriptions=self._count,
            pending=pending,
        )
