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
  ``max_pending`` of them, and their bytes are charged to the ``subscriptions`` account of the
  broker's byte budget for the subscriber (budget Rules MB1, MB2, MB4). A message that finds
  the buffer full, by count or by bytes, is handled by the subscription's overflow policy:
  ``drop-newest`` (the message is lost), ``drop-oldest`` (the oldest waiting ones are lost,
  as many as it takes to make room), ``disconnect`` (everything waiting is lost and the
  subscription ends). Messages sent and not yet granted back (Rule P2: in zmq's queue or the
  subscriber's) are charged to the same account, ahead in chunks, and a message goes out only
  if they have room: a subscriber that stops reading holds no more than its share, waiting
  and in flight together. What a buffer held is released when it is sent, lost or ended, and
  what was in flight when credit for it comes back or the subscription ends (budget Rule
  MB3), so an ended or expired subscription holds nothing.
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
  subscribe time only). Kept messages are charged to the ``last_values`` account for their
  publisher: to make room for a new one, the publisher's own least recently published are
  evicted while its share (budget Rule MB2) is full, then everyone's while the account is
  (counted, ``last_values_evicted``); one larger than the whole account, or than the room
  that leaves, is not kept, and the subject's older value is dropped with it (counted,
  ``last_values_refused``).
Rule P7 - Shares of the subscription limit. No peer holds more than
  ``max_subscriptions_per_peer``; and the last tenth of ``max_subscriptions`` is kept for
  peers holding fewer than :data:`SMALL_PEER` subscriptions, so a few peers at their own
  limit cannot lock every new subscriber out (``too_many_subscriptions``).
Rule P8 - Fan-out in slices. A publish is delivered to at most ``fanout_slice`` recipients
  at once; the rest wait in its publisher's backlog and are delivered a slice per later
  publish, and four per :meth:`PubSub.expire` (which :meth:`PubSub.next_expiry` asks for at
  once), the publishers' backlogs taking turns. A publish that finds its publisher's backlog
  not empty queues behind it, so each subscription gets one publisher's messages in the
  order they were published (as NATS: no order between publishers). So a request that
  arrives during a large fan-out is answered between two slices, and another publisher's
  message does not wait for the whole burst. Recipients are chosen when the message is
  published (a subscription that ends meanwhile is skipped; a queue group's member is picked
  when its turn comes). The backlogs hold at most ``max_backlog`` deliveries, one publisher's
  at most a quarter of that (but always one publish if there is room), and the waiting
  messages are charged to the ``subscriptions`` account for their publisher: a publish past
  any of these is refused (``pubsub_busy``, ``memory_budget``) and delivered to nobody.

What this module does NOT do: persistence, redelivery, exactly-once (pub/sub is at most
once, and every loss is counted), permissions (the caller checks them before calling).
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Sequence

import attrs

from dcp._core.broker.budget import ENTRY_OVERHEAD, FRAME_OVERHEAD, Memory
from dcp._core.broker.subjects import SubjectTrie, matches

__all__ = ["SMALL_PEER", "Overflow", "PubSub", "PubSubStatistics", "Subscription", "Writer"]

#: Bytes in flight are charged this much at a time (Rule P3): one account call per chunk.
_CHUNK = 64 * 1024

#: Peers holding fewer subscriptions than this may use the reserved tenth of
#: ``max_subscriptions`` (Rule P7).
SMALL_PEER = 16


#: :func:`_cost` of a message of one data part, but for its bytes.
_ONE_PART = ENTRY_OVERHEAD + 2 * FRAME_OVERHEAD


def _cost(subject: bytes, data: Sequence[bytes]) -> int:
    """What keeping one message costs (budget Rule MB4)."""
    return ENTRY_OVERHEAD + FRAME_OVERHEAD * (1 + len(data)) + len(subject) + sum(map(len, data))


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
    #: Bytes charged for the messages waiting in subscription buffers and the backlog
    #: (Rules P3, P8).
    pending_bytes: int = 0
    #: Deliveries waiting in the fan-out backlog (Rule P8).
    backlog: int = 0
    #: Publishes refused because the backlog or its budget was full (Rule P8).
    refused: int = 0
    #: Last values evicted to make room in the ``last_values`` account (Rule P6).
    last_values_evicted: int = 0
    #: Last values not kept: larger than the room there is (Rule P6).
    last_values_refused: int = 0


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


class _Purse:
    """Bytes charged ahead for one peer's messages in flight and not used yet (Rule P3),
    shared by its subscriptions."""

    __slots__ = ("spare",)

    def __init__(self) -> None:
        self.spare = 0


class Subscription:
    """One subscription's state (Rules P2-P5)."""

    __slots__ = (
        "alive",
        "credit",
        "expires",
        "inflight",
        "max_pending",
        "overflow",
        "peer",
        "pending",
        "purse",
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
        #: Waiting messages: ``[lost just before it, subject, data, bytes charged]``.
        self.pending: deque[list[object]] = deque()
        #: Whether it still stands (a fan-out backlog skips ended ones, Rule P8).
        self.alive = True
        #: What each message sent and not yet granted back cost, oldest first (Rule P3;
        #: ``None`` until the first message sent with credit: an empty deque costs 760 bytes,
        #: a third of a subscription).
        self.inflight: deque[int] | None = None
        #: Its peer's bytes charged ahead (set by :meth:`PubSub.subscribe`).
        self.purse = _Purse()
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


class _Fanout:
    """One publish waiting in the fan-out backlog (Rule P8)."""

    __slots__ = ("cost", "data", "next", "peer", "recipients", "subject")

    def __init__(
        self,
        recipients: list[Subscription | list[_Group]],
        subject: bytes,
        data: Sequence[bytes],
        peer: bytes,
        cost: int,
    ) -> None:
        self.recipients = recipients
        self.next = 0
        self.subject = subject
        self.data = data
        self.peer = peer
        self.cost = cost


class _Backlog:
    """One publisher's publishes waiting to be fanned out (Rule P8)."""

    __slots__ = ("fanouts", "waiting")

    def __init__(self) -> None:
        self.fanouts: deque[_Fanout] = deque()
        self.waiting = 0  # deliveries


class PubSub:
    """The broker's pub/sub state (the module's rules).

    :param max_subscriptions: subscriptions at once (more are refused; Rule P7)
    :param max_subscriptions_per_peer: subscriptions of one peer at once
    :param max_pending: the largest buffer a subscription may ask for
    :param last_values: subjects whose last message is kept (0: none; Rule P6)
    :param memory: the byte budget whose ``subscriptions`` and ``last_values`` accounts are
        charged (Rules P3, P6, P8; ``None``: counted, never refused)
    :param fanout_slice: deliveries of one publish made at once (Rule P8)
    :param max_backlog: deliveries waiting in the fan-out backlog at most (Rule P8)
    """

    # Slots: past 30 attributes an instance dict loses CPython's fast attribute access,
    # which cost the per-delivery path 15% (measured).
    __slots__ = (
        "_backlog",
        "_buffers",
        "_count",
        "_groups",
        "_kept",
        "_last",
        "_now",
        "_owned",
        "_peers",
        "_purses",
        "_shared_limit",
        "_sized",
        "_sized_data",
        "_sized_subject",
        "_timed",
        "_trie",
        "_turn",
        "_waiting",
        "delivered",
        "disconnected",
        "evicted",
        "expired",
        "fanout_slice",
        "last_values",
        "lost",
        "max_backlog",
        "max_pending",
        "max_subscriptions",
        "max_subscriptions_per_peer",
        "not_kept",
        "outbox",
        "published",
        "refused",
        "routed",
    )

    def __init__(
        self,
        *,
        max_subscriptions: int = 100_000,
        max_subscriptions_per_peer: int = 10_000,
        max_pending: int = 100_000,
        last_values: int = 0,
        memory: Memory | None = None,
        fanout_slice: int = 256,
        max_backlog: int = 1_000_000,
    ) -> None:
        if fanout_slice < 1 or max_backlog < 1:
            raise ValueError("fanout_slice and max_backlog must be >= 1")
        self.max_subscriptions = max_subscriptions
        self.max_subscriptions_per_peer = max_subscriptions_per_peer
        # Rule P7: what peers holding SMALL_PEER or more may fill.
        self._shared_limit = max_subscriptions - max_subscriptions // 10
        self.max_pending = max_pending
        self.last_values = last_values
        self.fanout_slice = fanout_slice
        self.max_backlog = max_backlog
        memory = memory if memory is not None else Memory(None)
        self._buffers = memory.account("subscriptions")
        self._kept = memory.account("last_values")
        self.outbox: list[list[bytes]] = []
        self._trie: SubjectTrie[Subscription | _Group] = SubjectTrie()
        self._groups: dict[tuple[bytes, bytes], _Group] = {}
        self._peers: dict[bytes, dict[bytes, Subscription]] = {}
        self._count = 0
        self._turn = 0
        # Subscriptions with a timeout, least recently refreshed first (Rule P5).
        self._timed: OrderedDict[Subscription, None] = OrderedDict()
        # subject -> (tokens, data, publisher, bytes charged) (Rule P6)
        self._last: OrderedDict[bytes, tuple[list[bytes], Sequence[bytes], bytes, int]] = (
            OrderedDict()
        )
        # publisher -> its subjects in _last, least recently published first (Rule P6)
        self._owned: dict[bytes, OrderedDict[bytes, None]] = {}
        # Publishes not yet delivered to all their recipients, oldest first (Rule P8).
        # publisher -> its backlog, in turn order (Rule P8)
        self._backlog: OrderedDict[bytes, _Backlog] = OrderedDict()
        self._waiting = 0  # deliveries in every backlog
        self._now = 0.0
        # peer -> bytes charged ahead for its messages in flight, not used yet (Rule P3)
        self._purses: dict[bytes, _Purse] = {}
        # The last message sized, and its cost (one fan-out sizes its message once).
        self._sized_subject = b""
        self._sized_data: Sequence[bytes] = ()
        self._sized = _cost(b"", ())
        self.published = 0
        self.routed = 0
        self.delivered = 0
        self.lost = 0
        self.disconnected = 0
        self.expired = 0
        self.refused = 0
        self.evicted = 0
        self.not_kept = 0

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
        """Add (or, for a known ``sid``, replace) a subscription; an error code if refused
        (Rule P7)."""
        if not 1 <= max_pending <= self.max_pending:
            return "bad_subscription"
        known = self._peers.get(peer)
        old = known.get(sid) if known is not None else None
        if old is not None:
            self._remove(old)
        elif (
            known is not None
            and (
                len(known) >= self.max_subscriptions_per_peer
                or (len(known) >= SMALL_PEER and self._count >= self._shared_limit)
            )
        ) or self._count >= self.max_subscriptions:
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
        purse = self._purses.get(peer)
        if purse is None:
            purse = self._purses[peer] = _Purse()
        sub.purse = purse
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
            for subject, (_, data, _, _) in list(self._last.items()):
                if matches(pattern, subject) and sub.alive:
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
            inflight = sub.inflight
            if inflight:  # Rule P3: taken, so released
                freed = 0
                for _ in range(min(grant, len(inflight))):
                    freed += inflight.popleft()
                self._unreserve(sub, freed)
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
            inflight = sub.inflight
            if inflight:
                freed = 0
                for _ in range(min(lost, len(inflight))):  # never queued: not in flight
                    freed += inflight.pop()
                self._unreserve(sub, freed)

    def subscriptions_of(self, peer: bytes) -> int:
        known = self._peers.get(peer)
        return len(known) if known is not None else 0

    def __len__(self) -> int:
        return self._count

    # ------------------------------------------------------------ publishing

    def publish(
        self,
        tokens: list[bytes],
        subject: bytes,
        data: Sequence[bytes],
        *,
        peer: bytes = b"",
        now: float | None = None,
    ) -> int | str:
        """Offer a message to every matching subscription (Rules P1, P8): how many it is
        routed to, or why it was refused (``pubsub_busy``, ``memory_budget``; Rule P8).

        :param peer: the publisher (charged for its last value and its backlog, Rules P6, P8)
        :param now: the time (``None``: the last one given), for :meth:`next_expiry`
        """
        entries = list(self._trie.match(tokens))  # a disconnect may remove one
        backlog = self._backlog.get(peer) if self._backlog else None
        if backlog is None and len(entries) <= self.fanout_slice:
            # The common case, all at once (the hot path: no extra list, no extra call).
            routed = 0
            groups: dict[bytes, list[_Group]] | None = None
            for entry in entries:
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
                    sub = self._pick(same)
                    if sub is not None:
                        self._offer(sub, subject, data)
                    routed += 1
        else:
            if now is not None:
                self._now = now
            recipients = self._recipients(entries)
            routed = len(recipients)
            if self._waiting + routed > self.max_backlog or (
                backlog is not None and backlog.waiting + routed > self.max_backlog // 4
            ):
                self.refused += 1
                return "pubsub_busy"
            n = _cost(subject, data)
            if not self._buffers.charge(peer, n):
                self.refused += 1
                return "memory_budget"
            if backlog is None:
                backlog = self._backlog[peer] = _Backlog()
            backlog.fanouts.append(_Fanout(recipients, subject, data, peer, n))
            backlog.waiting += routed
            self._waiting += routed
            self._fan_out(self.fanout_slice)
        self.published += 1
        self.routed += routed
        if self.last_values:
            self._keep(tokens, subject, data, peer)
        return routed

    @staticmethod
    def _recipients(entries: list[Subscription | _Group]) -> list[Subscription | list[_Group]]:
        """Rule P1: each subscription, and the groups of each queue group name together."""
        recipients: list[Subscription | list[_Group]] = []
        groups: dict[bytes, list[_Group]] = {}
        for entry in entries:
            if entry.__class__ is Subscription:
                assert isinstance(entry, Subscription)
                recipients.append(entry)
            else:
                assert isinstance(entry, _Group)
                same = groups.get(entry.name)
                if same is None:
                    same = groups[entry.name] = []
                    recipients.append(same)
                same.append(entry)
        return recipients

    def _keep(
        self, tokens: list[bytes], subject: bytes, data: Sequence[bytes], peer: bytes
    ) -> None:
        """Rule P6: keep the subject's last value, charged to its publisher."""
        last = self._last
        kept = self._kept
        if subject in last:
            self._forget_last(subject)
        n = _cost(subject, data)
        if kept.limit is not None:
            if n > kept.limit:  # it could never fit: evict nothing for it
                self.not_kept += 1
                return
            assert kept.peer_limit is not None
            owned = self._owned.get(peer)
            while owned and kept.held(peer) + n > kept.peer_limit:  # its own oldest out
                self._forget_last(next(iter(owned)))
                self.evicted += 1
            while last and kept.used + n > kept.limit:  # everyone's oldest out
                self._forget_last(next(iter(last)))
                self.evicted += 1
        if not kept.charge(peer, n):  # larger than the account or the publisher's share
            self.not_kept += 1
            return
        last[subject] = (tokens, data, peer, n)
        owned = self._owned.get(peer)
        if owned is None:
            owned = self._owned[peer] = OrderedDict()
        owned[subject] = None
        if len(last) > self.last_values:
            self._forget_last(next(iter(last)))

    def _forget_last(self, subject: bytes) -> None:
        _, _, owner, n = self._last.pop(subject)
        self._kept.release(owner, n)
        owned = self._owned[owner]
        del owned[subject]
        if not owned:
            del self._owned[owner]

    def _deliver(
        self, recipient: Subscription | list[_Group], subject: bytes, data: Sequence[bytes]
    ) -> None:
        if recipient.__class__ is Subscription:
            assert isinstance(recipient, Subscription)
            if recipient.alive:
                self._offer(recipient, subject, data)
        else:
            assert isinstance(recipient, list)
            sub = self._pick(recipient)
            if sub is not None:
                self._offer(sub, subject, data)

    def _fan_out(self, budget: int) -> None:
        """Rule P8: ``budget`` deliveries from the backlogs, a slice at a time, in turns."""
        backlogs = self._backlog
        slice_ = self.fanout_slice
        while backlogs and budget > 0:
            publisher, backlog = next(iter(backlogs.items()))
            head = backlog.fanouts[0]
            recipients = head.recipients
            start = head.next
            stop = min(len(recipients), start + min(budget, slice_))
            subject = head.subject
            data = head.data
            for i in range(start, stop):
                self._deliver(recipients[i], subject, data)
            done = stop - start
            budget -= done
            self._waiting -= done
            backlog.waiting -= done
            head.next = stop
            if stop == len(recipients):
                backlog.fanouts.popleft()
                self._buffers.release(head.peer, head.cost)
            if backlog.fanouts:
                backlogs.move_to_end(publisher)  # the next publisher's turn
            else:
                del backlogs[publisher]

    def _pick(self, groups: list[_Group]) -> Subscription | None:
        """Rule P1: the next member (across ``groups``) that can take a message at once
        (``None``: every group has ended since the message was published)."""
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
        return first

    def _size(self, subject: bytes, data: Sequence[bytes]) -> int:
        """:func:`_cost`, computed once per message however many it goes to."""
        if data is self._sized_data and subject is self._sized_subject:
            return self._sized
        return self._resize(subject, data)

    def _resize(self, subject: bytes, data: Sequence[bytes]) -> int:
        """:func:`_cost` of a message not sized last (inlined for the common one data part)."""
        n = _ONE_PART + len(subject) + len(data[0]) if len(data) == 1 else _cost(subject, data)
        self._sized = n
        self._sized_subject = subject
        self._sized_data = data
        return n

    def _reserve(self, sub: Subscription, n: int) -> bool:
        """Rule P3: take ``n`` bytes in flight for ``sub``'s peer, charged ahead a chunk at a
        time (one account call per chunk, not per message)."""
        purse = sub.purse
        spare = purse.spare
        if spare >= n:
            purse.spare = spare - n
            return True
        buffers = self._buffers
        peer = sub.peer
        k = min(_CHUNK, buffers.room(peer))
        if buffers.peer_limit is not None:  # ahead, but never past its share (Rule MB2)
            k = min(k, buffers.peer_limit - buffers.held(peer))
        k = max(n - spare, k)
        if buffers.charge(peer, k):
            purse.spare = spare + k - n
            return True
        return False

    def _unreserve(self, sub: Subscription, n: int) -> None:
        """Rule P3: ``n`` bytes are no longer in flight; past two chunks spare, give back."""
        purse = sub.purse
        spare = purse.spare + n
        if spare > 2 * _CHUNK:
            self._buffers.release(sub.peer, spare - _CHUNK)
            spare = _CHUNK
        purse.spare = spare

    def _offer(self, sub: Subscription, subject: bytes, data: Sequence[bytes]) -> None:
        if not sub.pending:
            credit = sub.credit
            if credit is None:
                self._send(sub, sub.tail_lost, subject, data)
                sub.tail_lost = 0
                return
            if credit > 0:
                # The hot path of a delivery with credit (_send inlined; Rule P3's bytes in
                # flight taken from the peer's purse, a chunk charged ahead at a time).
                if data is self._sized_data and subject is self._sized_subject:
                    n = self._sized  # the same message as the last one (a fan-out)
                else:
                    n = self._resize(subject, data)
                purse = sub.purse
                spare = purse.spare
                if spare >= n:
                    purse.spare = spare - n
                elif not self._reserve(sub, n):
                    n = -1
                if n >= 0:
                    inflight = sub.inflight
                    if inflight is None:
                        inflight = sub.inflight = deque()
                    inflight.append(n)
                    tail = sub.tail_lost
                    if tail:
                        notice = sub.writer.gap(sub.peer, sub.sid, tail, sub.overflow.value)
                        if notice is not None:
                            self.outbox.append(notice)
                        sub.tail_lost = 0
                    self.outbox.append(sub.writer.message(sub.peer, sub.sid, subject, data))
                    self.delivered += 1
                    sub.credit = credit - 1
                    return
        pending = sub.pending
        buffers = self._buffers
        n = self._size(subject, data)
        if len(pending) < sub.max_pending and buffers.charge(sub.peer, n):
            pending.append([sub.tail_lost, subject, data, n])
            sub.tail_lost = 0
            return
        policy = sub.overflow
        if policy is Overflow.DROP_NEWEST:
            self.lost += 1
            sub.tail_lost += 1
        elif policy is Overflow.DROP_OLDEST:
            # Lose the oldest waiting ones until the new one fits (by count and by bytes).
            before = sub.tail_lost  # lost just before the new one
            sub.tail_lost = 0
            while pending:
                lost, _, _, m = pending.popleft()
                buffers.release(sub.peer, m)  # type: ignore[arg-type]
                self.lost += 1
                k = lost + 1  # type: ignore[operator]
                if pending:
                    pending[0][0] += k  # type: ignore[operator]
                else:
                    before += k
                if len(pending) < sub.max_pending and buffers.charge(sub.peer, n):
                    pending.append([before, subject, data, n])
                    return
            self.lost += 1  # no room even with nothing waiting: the new one is lost too
            sub.tail_lost = before + 1
        else:
            self.lost += 1
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
        """Send what is waiting while credit lasts (Rules P2, P3, P4)."""
        pending = sub.pending
        if pending and sub.credit:
            inflight = sub.inflight
            if inflight is None:
                inflight = sub.inflight = deque()
            while pending and sub.credit:
                lost, subject, data, n = pending.popleft()
                # Rule P3: its charge moves from the buffer to the bytes in flight.
                inflight.append(n)  # type: ignore[arg-type]
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
        sub.alive = False
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
        # Rule P3: a subscription that ended holds nothing, waiting or in flight.
        peer = sub.peer
        if sub.pending:
            held = 0
            for entry in sub.pending:
                held += entry[3]  # type: ignore[operator]
            self._buffers.release(peer, held)
            sub.pending.clear()
        inflight = sub.inflight
        if inflight:
            self._unreserve(sub, sum(inflight))
            inflight.clear()
        if peer not in self._peers:  # its last subscription: nothing spare either
            purse = self._purses.pop(peer, None)
            if purse is not None and purse.spare:
                self._buffers.release(peer, purse.spare)
                purse.spare = 0

    # ------------------------------------------------------------ time

    def expire(self, now: float) -> int:
        """End subscriptions not refreshed in time (Rule P5), and deliver four slices of the
        fan-out backlogs (Rule P8); how many subscriptions ended."""
        self._now = now
        if self._backlog:
            self._fan_out(4 * self.fanout_slice)
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
        """When :meth:`expire` has something to do: at once (the last time given) while the
        fan-out backlog is not empty (Rule P8), else the next subscription's timeout."""
        if self._backlog:
            return self._now
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
            pending_bytes=self._buffers.used,
            backlog=self._waiting,
            refused=self.refused,
            last_values_evicted=self.evicted,
            last_values_refused=self.not_kept,
        )
