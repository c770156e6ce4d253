"""What the clients' subscriptions receive: the messages and gap notices that the receive path
of either client routes to each subscription (:func:`deliver`), kept until the caller takes
them. The subscriptions themselves, their credit and their requests:
:mod:`dcp._client.pubsub`.

Rules (client side; the others are in :mod:`dcp._client.pubsub`):

Rule CP2 - Gaps. A gap notice adds its count to :attr:`dcp.Subscription.lost` when it arrives,
  and to the :attr:`PubSubMessage.gap` of the next message taken. A ``disconnect`` notice ends the
  subscription: iteration raises :exc:`SlowConsumer` after the messages already received.
Rule CP6 - Broker lost. Several brokers (Rule CP5): when a broker the subscription is subscribed
  at is lost, the client puts a gap notice of its own in the subscription's order, reason
  ``broker_lost``, count unknown: it adds 1 to :attr:`dcp.Subscription.brokers_lost` at once,
  nothing to ``lost``, and the next message taken has ``broker_lost`` set (its ``gap`` counts
  only the broker's own notices). A broker lost again before it was subscribed at again adds
  none.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import anyio
import attrs

from dcp._core.broker.pubsub_peers import GAP_PREFIX, MSG_PREFIX
from dcp._errors import DCPError

__all__ = ["BROKER_LOST", "PubSubMessage", "SlowConsumer", "SubscriptionState", "deliver"]

#: The reason of the gap notice a client makes when a broker is lost (Rule CP6).
BROKER_LOST = b"broker_lost"


class SlowConsumer(DCPError):
    """The broker ended a subscription under the ``disconnect`` overflow policy.

    :ivar lost: messages lost at the end
    """

    def __init__(self, lost: int) -> None:
        super().__init__(f"the broker ended the subscription: {lost} message(s) lost")
        self.lost = lost


@attrs.frozen
class PubSubMessage:
    """One message received on a subscription."""

    #: The subject it was published to.
    subject: str
    #: Its data parts.
    data: tuple[bytes, ...]
    #: Messages lost just before this one (gap notices since the previous message).
    gap: int = 0
    #: Whether a broker the subscription was subscribed at was lost since the previous
    #: message (Rule CP6): what it held for the subscription, and what was published through
    #: it and not yet delivered, is lost too, uncounted (not in ``gap``).
    broker_lost: bool = False


class SubscriptionState:
    """What a subscription has received, shared by the async and blocking flavours."""

    def __init__(self, sid: bytes, sub: list[bytes], window: int) -> None:
        self.sid = sid
        self.sub = sub
        self.window = window
        self.items: deque[PubSubMessage | tuple[int, bytes]] = deque()
        self.owed = 0
        self.lost = 0
        self.resubscribed = 0
        self.gap = 0
        #: Brokers lost while subscribed at (Rule CP6), and whether one was since the last
        #: message taken.
        self.brokers_lost = 0
        self.gap_unknown = False
        self.ended: int | None = None
        self.wake: anyio.Event | None = None  # the reader waits for messages
        self.owing: anyio.Event | None = None  # the refresher waits for a grant to make
        #: Several brokers (Rule CP5): those it is subscribed at, and those to subscribe at
        #: (again) at the refresher's next turn.
        self.at: set[int] = set()
        self.renew: set[int] = set()
        #: Live brokers whose SUB failed (unanswered, refused): asked again at the
        #: refresher's next turn (Rule CP5), not at once.
        self.retry: set[int] = set()

    def broker_up(self, broker: int) -> None:
        """Several brokers: ``broker`` is live (again): subscribe there (Rule CP5)."""
        self.at.discard(broker)
        self.renew.add(broker)
        if self.owing is not None:
            self.owing.set()

    def broker_lost(self, broker: int) -> None:
        """Several brokers: ``broker`` is lost; what it held for this subscription is lost
        with it (Rule CP5)."""
        if broker in self.at:  # Rule CP6: said in order, count unknown
            self.brokers_lost += 1
            self.items.append((0, BROKER_LOST))
            if self.wake is not None:
                self.wake.set()
        self.at.discard(broker)

    def take(self) -> PubSubMessage | None:
        """The next message (gaps folded in, Rule CP2), ``None`` if none; raises
        :exc:`SlowConsumer` once the broker ended the subscription and all is taken."""
        items = self.items
        while items:
            item = items.popleft()
            if isinstance(item, PubSubMessage):
                self.owed += 1
                gap, self.gap = self.gap, 0
                if self.gap_unknown:
                    self.gap_unknown = False
                    return attrs.evolve(item, gap=gap, broker_lost=True)
                return attrs.evolve(item, gap=gap) if gap else item
            lost, reason = item
            self.gap += lost
            if reason == BROKER_LOST:
                self.gap_unknown = True
            if reason == b"disconnect":
                self.ended = lost
        if self.ended is not None:
            raise SlowConsumer(self.ended)
        return None

    def close(self) -> None:
        """The client closed: wake a waiting reader."""
        if self.wake is not None:
            self.wake.set()
        if self.owing is not None:
            self.owing.set()


def deliver(subs: dict[bytes, SubscriptionState], frames: Sequence[bytes]) -> bool:
    """Route a delivery or gap notice to its subscription; whether ``frames`` was one."""
    if len(frames) < 8:
        return False
    head = frames[5]
    if head.__class__ is not bytes:
        return False
    kind = head[:9]
    if kind != MSG_PREFIX and kind != GAP_PREFIX:
        return False
    state = subs.get(head[9:])
    if state is None:
        return True  # a subscription we left: dropped
    data = frames[7:]
    if kind == MSG_PREFIX:
        state.items.append(
            PubSubMessage(
                bytes(data[0]).decode("utf-8", "replace"), tuple(bytes(d) for d in data[1:])
            )
        )
    elif len(data) == 2 and data[0].isdigit():
        lost = int(data[0])
        state.lost += lost
        state.items.append((lost, bytes(data[1])))
    if state.wake is not None:
        state.wake.set()
    return True
