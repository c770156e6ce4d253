"""Pub/sub for clients: :meth:`dcp.Client.publish` / :meth:`dcp.Client.subscribe` and the
:class:`dcp.SyncClient` equivalents (the wire is in :mod:`dcp._core.broker.pubsub_peers`).

Rules (client side):

Rule C1 - Credit. A subscription starts with ``window`` credit at the broker; each message
  the caller has taken is owed back, and once half a window is owed (or every ``refresh``
  seconds, even with nothing owed) the client grants it. So at most ``window`` messages sit
  in the client, and the rest wait in the broker's bounded buffer (its overflow policy).
Rule C2 - Gaps. A gap notice adds its count to :attr:`Subscription.lost` when it arrives,
  and to the :attr:`PubSubMessage.gap` of the next message taken. A ``disconnect`` notice ends the
  subscription: iteration raises :exc:`SlowConsumer` after the messages already received.
Rule C3 - Re-subscribing. A grant the broker answers ``unknown_subscription`` (it restarted,
  or it ended the subscription for silence) makes the client subscribe again with the same
  id, options and pattern (counted in :attr:`Subscription.resubscribed`); messages published
  meanwhile were not routed to it (at most once).
Rule C4 - Leaving. Leaving the ``with`` block unsubscribes (best effort, bounded by one
  second); a subscription the broker does not hear of again expires there anyway.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING

import anyio
import attrs
import zmq

from dcp._core.broker.pubsub import Overflow
from dcp._core.broker.pubsub_peers import CREDIT, GAP_PREFIX, MSG_PREFIX, PUB, SUB, UNSUB
from dcp._core.broker.subjects import SubjectError, check_pattern, check_subject
from dcp._core.client.calls import Part, data_parts
from dcp._errors import DCPError, RemoteError, RequestTimeout
from dcp.wire.dcp1 import PROTOCOL, TYPE_FRAMES, MessageType

if TYPE_CHECKING:
    from dcp._client.client import Client
    from dcp._client.sync_client import SyncClient

__all__ = ["PubSubMessage", "SlowConsumer", "Subscription", "SyncSubscription"]

logger = logging.getLogger("dcp.client")

_SEND_PAUSE = 0.001
_SEND_PAUSE_MAX = 0.05


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


def subject_bytes(subject: str | bytes, *, pattern: bool) -> bytes:
    """A subject or pattern as sent, checked (``ValueError`` naming what is wrong)."""
    raw = subject.encode("utf-8") if isinstance(subject, str) else subject
    if not isinstance(raw, bytes):
        raise TypeError(f"a subject must be str or bytes, not {type(subject).__name__}")
    try:
        (check_pattern if pattern else check_subject)(raw)
    except SubjectError as exc:
        raise ValueError(str(exc)) from None
    return raw


def sub_data(
    sid: bytes,
    pattern: bytes,
    queue: str | bytes | None,
    max_pending: int,
    overflow: str | Overflow,
    window: int,
    refresh: float,
    last_value: bool,
) -> list[bytes]:
    """The data parts of a subscribe request (checked: ``ValueError``)."""
    policy = Overflow(overflow)
    if max_pending < 1 or window < 1 or not 0 < refresh < math.inf:
        raise ValueError("max_pending and window must be >= 1, refresh positive and finite")
    q = b"" if queue is None else queue.encode() if isinstance(queue, str) else queue
    timeout = max(int(refresh * 10_000), 1000)  # ten refreshes
    data = [sid, pattern, q, b"max-pending=%d" % max_pending, b"overflow=" + policy.value.encode()]
    data += [b"window=%d" % window, b"timeout=%d" % timeout]
    if last_value:
        data.append(b"last-value")
    return data


class _State:
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
        self.ended: int | None = None
        self.wake: anyio.Event | None = None  # the reader waits for messages
        self.owing: anyio.Event | None = None  # the refresher waits for a grant to make

    def take(self) -> PubSubMessage | None:
        """The next message (gaps folded in, Rule C2), ``None`` if none; raises
        :exc:`SlowConsumer` once the broker ended the subscription and all is taken."""
        items = self.items
        while items:
            item = items.popleft()
            if isinstance(item, PubSubMessage):
                self.owed += 1
                gap, self.gap = self.gap, 0
                return attrs.evolve(item, gap=gap) if gap else item
            lost, reason = item
            self.gap += lost
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


def deliver(subs: dict[bytes, _State], frames: Sequence[bytes]) -> bool:
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


def _publish_frames(width: int, subject: bytes, data: Sequence[bytes]) -> list[bytes]:
    return [b"", PROTOCOL, TYPE_FRAMES[width][MessageType.REQUEST], PUB, b"", b"", subject, *data]


# --------------------------------------------------------------------------- async


class Subscription:
    """An active subscription (:meth:`dcp.Client.subscribe`): ``async for msg in sub``."""

    def __init__(self, client: Client, state: _State, pattern: str) -> None:
        self._client = client
        self._state = state
        #: The pattern subscribed to.
        self.pattern = pattern

    @property
    def lost(self) -> int:
        """Messages the broker lost for this subscription so far (gap notices)."""
        return self._state.lost

    @property
    def resubscribed(self) -> int:
        """How often the client subscribed again (broker restart, Rule C3)."""
        return self._state.resubscribed

    def __aiter__(self) -> AsyncIterator[PubSubMessage]:
        return self

    async def __anext__(self) -> PubSubMessage:
        state = self._state
        while True:
            msg = state.take()
            if msg is not None:
                if state.owed * 2 >= state.window and state.owing is not None:
                    state.owing.set()  # the refresher grants it
                return msg
            if self._client.closed:
                raise StopAsyncIteration
            state.wake = anyio.Event()
            await state.wake.wait()

    async def _refresh(self, refresh: float) -> None:
        state = self._state
        client = self._client
        while True:
            with anyio.move_on_after(refresh):
                while state.owed * 2 < state.window:
                    state.owing = anyio.Event()
                    await state.owing.wait()
            grant, state.owed = state.owed, 0
            try:
                await client.request(CREDIT, state.sid, b"%d" % grant, timeout=max(refresh, 1))
            except RemoteError as exc:
                if exc.code != "unknown_subscription":
                    logger.warning("credit refused for %s: %s", self.pattern, exc)
                    continue
                with contextlib.suppress(RequestTimeout, RemoteError):
                    await client.request(SUB, *state.sub, timeout=max(refresh, 1))
                    state.resubscribed += 1
            except RequestTimeout:
                pass  # the broker is away; the next refresh tells whether it forgot us
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                state.close()
                return


async def publish(
    client: Client, subject: str | bytes, data: Sequence[Part], ack: bool
) -> int | None:
    raw = subject_bytes(subject, pattern=False)
    parts = data_parts(data)
    if ack:
        response = await client.request(PUB, raw, *parts)
        return int(response.data[0])
    frames = _publish_frames(client._tracker.type_width, raw, parts)
    pause = _SEND_PAUSE
    while True:
        if client.closed:
            raise anyio.ClosedResourceError("the client is closed")
        try:
            assert client._socket is not None
            client._socket.send_nowait(frames)
            return None
        except zmq.Again:
            await anyio.sleep(pause)
            pause = min(2 * pause, _SEND_PAUSE_MAX)


@contextlib.asynccontextmanager
async def subscribe(
    client: Client,
    pattern: str | bytes,
    queue: str | bytes | None,
    max_pending: int,
    overflow: str | Overflow,
    window: int,
    refresh: float,
    last_value: bool,
) -> AsyncIterator[Subscription]:
    raw = subject_bytes(pattern, pattern=True)
    sid = os.urandom(8)
    data = sub_data(sid, raw, queue, max_pending, overflow, window, refresh, last_value)
    state = _State(sid, data, window)
    client._subscriptions[sid] = state
    sub = Subscription(client, state, raw.decode("utf-8", "replace"))
    failure: BaseException | None = None
    try:
        await client.request(SUB, *data)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sub._refresh, refresh)
            try:
                yield sub
            except BaseException as exc:  # re-raised below, not wrapped in a group
                failure = exc
            tg.cancel_scope.cancel()
    finally:
        client._subscriptions.pop(sid, None)
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            if not client.closed:
                with contextlib.suppress(DCPError, anyio.ClosedResourceError):
                    await client.request(UNSUB, sid, timeout=1)
    if failure is not None:
        raise failure


# --------------------------------------------------------------------------- blocking


class SyncSubscription:
    """An active subscription of a :class:`dcp.SyncClient`: ``for msg in sub`` (blocks)."""

    def __init__(self, client: SyncClient, state: _State, pattern: str, refresh: float) -> None:
        self._client = client
        self._state = state
        self._refresh = refresh
        self._next_refresh = time.monotonic() + refresh
        self._grant: bytes | None = None
        #: The pattern subscribed to.
        self.pattern = pattern

    @property
    def lost(self) -> int:
        """Messages the broker lost for this subscription so far (gap notices)."""
        return self._state.lost

    @property
    def resubscribed(self) -> int:
        """How often the client subscribed again (broker restart, Rule C3)."""
        return self._state.resubscribed

    def __iter__(self) -> Iterator[PubSubMessage]:
        return self

    def __next__(self) -> PubSubMessage:
        msg = self.next()
        assert msg is not None
        return msg

    def next(self, timeout: float | None = None) -> PubSubMessage | None:
        """The next message, waiting at most ``timeout`` seconds (``None``: no limit;
        then ``None`` is returned if none came)."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        state = self._state
        client = self._client
        while True:
            msg = state.take()
            self._maintain()
            if msg is not None:
                return msg
            now = time.monotonic()
            if now >= deadline:
                return None
            wait = min(deadline, self._next_refresh) - now
            tracker_due = client._tracker.next_deadline()
            if tracker_due is not None:
                wait = min(wait, tracker_due - now)
            ready = client._poller.poll(max(0, math.ceil(wait * 1000)))
            if ready or (tracker_due is not None and tracker_due <= time.monotonic()):
                client._pump()

    def _maintain(self) -> None:
        """Grant credit and refresh (Rule C1); re-subscribe if the broker forgot us (C3)."""
        state = self._state
        client = self._client
        if self._grant is not None:
            outcome = client._done.pop(self._grant, None)
            if outcome is None and client._tracker.is_pending(self._grant):
                return
            self._grant = None
            if isinstance(outcome, RemoteError) and outcome.code == "unknown_subscription":
                state.resubscribed += 1
                client._forget(_start(client, SUB, state.sub))
        now = time.monotonic()
        if state.owed * 2 >= state.window or now >= self._next_refresh:
            grant, state.owed = state.owed, 0
            self._next_refresh = now + self._refresh
            self._grant = _start(client, CREDIT, [state.sid, b"%d" % grant])


def _start(client: SyncClient, service: bytes, data: list[bytes]) -> bytes:
    """Send a request without waiting for it (its outcome lands in ``client._done``)."""
    timing = client._tracker.timing(None, None, None)
    return client._start(service, data, client._metadata((), None, None), timing)


def publish_sync(
    client: SyncClient, subject: str | bytes, data: Sequence[Part], ack: bool
) -> int | None:
    raw = subject_bytes(subject, pattern=False)
    parts = data_parts(data)
    if ack:
        response = client.request(PUB, raw, *parts)
        return int(response.data[0])
    client._send(_publish_frames(client._tracker.type_width, raw, parts), math.inf)
    return None


@contextlib.contextmanager
def subscribe_sync(
    client: SyncClient,
    pattern: str | bytes,
    queue: str | bytes | None,
    max_pending: int,
    overflow: str | Overflow,
    window: int,
    refresh: float,
    last_value: bool,
) -> Iterator[SyncSubscription]:
    raw = subject_bytes(pattern, pattern=True)
    sid = os.urandom(8)
    data = sub_data(sid, raw, queue, max_pending, overflow, window, refresh, last_value)
    state = _State(sid, data, window)
    client._subscriptions[sid] = state
    try:
        client.request(SUB, *data)
        yield SyncSubscription(client, state, raw.decode("utf-8", "replace"), refresh)
    finally:
        client._subscriptions.pop(sid, None)
        if not client.closed:
            with contextlib.suppress(DCPError):
                client.request(UNSUB, sid, timeout=1)
