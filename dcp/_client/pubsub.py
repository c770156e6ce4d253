"""Pub/sub for clients: :meth:`dcp.Client.publish` / :meth:`dcp.Client.subscribe` and the
:class:`dcp.SyncClient` equivalents (the wire is in :mod:`dcp._core.broker.pubsub_peers`; what
a subscription receives, and Rule CP2, in :mod:`dcp._client.subscriptions`).

Rules (client side):

Rule CP1 - Credit. A subscription starts with ``window`` credit at the broker; each message
  the caller has taken is owed back, and once half a window is owed (or every ``refresh``
  seconds, even with nothing owed) the client grants it. So at most ``window`` messages sit
  in the client, and the rest wait in the broker's bounded buffer (its overflow policy).
  A grant is sent once, never resent (``retries=0``): the broker adds every copy it
  receives, so a resent grant whose answer was merely late would let more than ``window``
  messages out.
Rule CP3 - Re-subscribing. A grant the broker answers ``unknown_subscription`` (it restarted,
  or it ended the subscription for silence) makes the client subscribe again with the same
  id, options and pattern (counted in :attr:`Subscription.resubscribed`); messages published
  meanwhile were not routed to it (at most once).
Rule CP4 - Leaving. Leaving the ``with`` block unsubscribes (best effort, bounded by one
  second); a subscription the broker does not hear of again expires there anyway.
Rule CP5 - Several brokers (the async client). A subscription subscribes at every live broker
  (the same id at each), so a message published through any broker is delivered once per
  subscription, and a queue group's member at each broker takes its share; a broker that
  becomes live (again) is subscribed at by the refresher's next turn, at once; a live one
  whose SUB failed (unanswered, refused) is asked again a refresh later. Each broker
  gets the credit granted (so up to ``window`` messages per broker may sit in the client).
  What a lost broker held for the subscription, and what was published through it and not
  yet delivered, is lost with it, uncounted but said (a ``broker_lost`` gap notice, Rule CP6
  of :mod:`dcp._client.subscriptions`). A publish goes through one live broker; without
  ``ack``, with none live once each made its first connection (or failed to), it is
  dropped (at most once; the blocking client likewise).

A subscription asks its client for requests through :class:`Requests` /
:class:`SyncRequests` (what it needs of :class:`~dcp.Client` / :class:`~dcp.SyncClient`), and
reads and sends through the client's receiver.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Protocol

import anyio

from dcp._client.receive import Receiver
from dcp._client.subscriptions import PubSubMessage as PubSubMessage
from dcp._client.subscriptions import SlowConsumer as SlowConsumer
from dcp._client.subscriptions import SubscriptionState
from dcp._client.sync_receive import SyncReceiver
from dcp._core.broker.pubsub import Overflow
from dcp._core.broker.pubsub_peers import CREDIT, PUB, SUB, UNSUB
from dcp._core.broker.subjects import SubjectError, check_pattern, check_subject
from dcp._core.client.calls import Part, data_parts
from dcp._errors import DCPError, RemoteError, RequestTimeout
from dcp._models import Response
from dcp.wire.dcp1 import PROTOCOL, TYPE_FRAMES, MessageType

__all__ = [
    "PubSubMessage",
    "Requests",
    "SlowConsumer",
    "Subscription",
    "SyncRequests",
    "SyncSubscription",
    "new_state",
    "publish",
    "publish_sync",
    "subscribe",
    "subscribe_sync",
]

logger = logging.getLogger("dcp.client")

_SEND_PAUSE = 0.001
_SEND_PAUSE_MAX = 0.05


class Requests(Protocol):
    """What a subscription needs of its :class:`~dcp.Client`."""

    @property
    def closed(self) -> bool: ...

    async def request(
        self,
        service: str | bytes,
        *data: Part,
        timeout: float | None = None,  # noqa: ASYNC109 (the request's own)
        retries: int | None = None,
    ) -> Response: ...


class SyncRequests(Protocol):
    """What a subscription needs of its :class:`~dcp.SyncClient`."""

    @property
    def closed(self) -> bool: ...

    def request(
        self, service: str | bytes, *data: Part, timeout: float | None = None
    ) -> Response: ...


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


def new_state(
    subscriptions: dict[bytes, SubscriptionState],
    pattern: str | bytes,
    queue: str | bytes | None,
    max_pending: int,
    overflow: str | Overflow,
    window: int,
    refresh: float,
    last_value: bool,
) -> tuple[SubscriptionState, str]:
    """A new subscription (a fresh id, its subscribe request's data), put in its receiver's
    ``subscriptions`` at once (before its SUB goes out, so nothing that arrives for it is
    lost); and its pattern as text.

    :raises ValueError: a bad pattern or option
    """
    raw = subject_bytes(pattern, pattern=True)
    sid = os.urandom(8)
    data = sub_data(sid, raw, queue, max_pending, overflow, window, refresh, last_value)
    state = SubscriptionState(sid, data, window)
    subscriptions[sid] = state
    return state, raw.decode("utf-8", "replace")


def _publish_frames(width: int, subject: bytes, data: Sequence[bytes]) -> list[bytes]:
    return [b"", PROTOCOL, TYPE_FRAMES[width][MessageType.REQUEST], PUB, b"", b"", subject, *data]


# --------------------------------------------------------------------------- async


class Subscription:
    """An active subscription (:meth:`dcp.Client.subscribe`): ``async for msg in sub``."""

    def __init__(self, client: Requests, state: SubscriptionState, pattern: str) -> None:
        self._client = client
        self._state = state
        #: The pattern subscribed to.
        self.pattern = pattern

    @property
    def lost(self) -> int:
        """Messages the broker lost for this subscription so far (gap notices)."""
        return self._state.lost

    @property
    def brokers_lost(self) -> int:
        """Brokers lost while this subscription was subscribed at them (several brokers,
        Rule CP6): each may have lost messages, how many is unknown (not in :attr:`lost`)."""
        return self._state.brokers_lost

    @property
    def resubscribed(self) -> int:
        """How often the client subscribed again (broker restart, Rule CP3)."""
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


async def _grant_credit(
    client: Requests, state: SubscriptionState, pattern: str, refresh: float
) -> None:
    """Grant a subscription's credit while it lasts (Rules CP1 and CP3): the task of its
    ``subscribe`` block."""
    while True:
        with anyio.move_on_after(refresh):
            while state.owed * 2 < state.window:
                state.owing = anyio.Event()
                await state.owing.wait()
        grant, state.owed = state.owed, 0
        try:
            await client.request(
                CREDIT, state.sid, b"%d" % grant, timeout=max(refresh, 1), retries=0
            )
        except RemoteError as exc:
            if exc.code != "unknown_subscription":
                logger.warning("credit refused for %s: %s", pattern, exc)
                continue
            with contextlib.suppress(RequestTimeout, RemoteError):
                await client.request(SUB, *state.sub, timeout=max(refresh, 1))
                state.resubscribed += 1
        except RequestTimeout:
            pass  # the broker is away; the next refresh tells whether it forgot us
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            state.close()
            return


async def _ask(
    receiver: Receiver,
    broker: int,
    service: bytes,
    data: Sequence[bytes],
    timeout: float,  # noqa: ASYNC109 (the request's own)
) -> Response:
    """A pub/sub request through one broker (Rule CP5), sent once."""
    timing = receiver.tracker.timing(timeout, None, 0)
    return await receiver.ask_at(broker, service, data, (), timing)


async def _subscribe_at(receiver: Receiver, state: SubscriptionState, broker: int) -> None:
    """Subscribe at ``broker`` (Rule CP5)."""
    state.renew.discard(broker)
    try:
        await _ask(receiver, broker, SUB, state.sub, receiver.tracker.timeout)
    except DCPError as exc:
        if not (isinstance(exc, RemoteError) and exc.code == "broker_lost"):
            state.retry.add(broker)  # still live: asked again at the next refresh
        raise
    state.retry.discard(broker)
    brokers = receiver.brokers
    if brokers is not None and brokers.is_live(broker):  # lost meanwhile: renewed when back
        state.at.add(broker)


async def _subscribe_each(receiver: Receiver, state: SubscriptionState) -> None:
    """Subscribe at every live broker (Rule CP5; the others when they become live): raises
    the first refusal if every live broker refused."""
    brokers = receiver.brokers
    assert brokers is not None
    await receiver.wait_connected()  # each broker's first handshake (or failure)
    state.renew = set(range(len(brokers.endpoints)))
    failures: list[Exception] = []

    async def one(i: int) -> None:
        try:
            await _subscribe_at(receiver, state, i)
        except (DCPError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(len(brokers.endpoints)):
            if brokers.is_live(i):
                tg.start_soon(one, i)
    if failures and not state.at:
        raise failures[0]


async def _grant_each(
    receiver: Receiver, state: SubscriptionState, pattern: str, refresh: float
) -> None:
    """:func:`_grant_credit` with several brokers (Rule CP5): each broker subscribed at gets
    the grant; a broker that became live is subscribed at."""
    brokers = receiver.brokers
    assert brokers is not None
    timeout = max(refresh, 1)
    while True:
        with anyio.move_on_after(refresh):
            while state.owed * 2 < state.window and not state.renew:
                state.owing = anyio.Event()
                await state.owing.wait()
        grant, state.owed = state.owed, 0
        if state.retry:  # a SUB that failed at a live broker: once per refresh
            state.renew |= state.retry
            state.retry.clear()
        try:
            for i in sorted(state.renew):
                if brokers.is_live(i):
                    with contextlib.suppress(DCPError):
                        await _subscribe_at(receiver, state, i)
            for i in sorted(state.at):
                try:
                    await _ask(receiver, i, CREDIT, [state.sid, b"%d" % grant], timeout)
                except RemoteError as exc:
                    if exc.code == "unknown_subscription":  # Rule CP3, at that broker
                        with contextlib.suppress(DCPError):
                            await _subscribe_at(receiver, state, i)
                            state.resubscribed += 1
                    elif exc.code != "broker_lost":
                        logger.warning("credit refused for %s: %s", pattern, exc)
                except RequestTimeout:
                    pass  # the broker is away; the next refresh tells whether it forgot us
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            state.close()
            return


async def publish(
    client: Requests,
    receiver: Receiver,
    subject: str | bytes,
    data: Sequence[Part],
    ack: bool,
) -> int | None:
    """:meth:`dcp.Client.publish` through ``client`` (with ``ack``) or its ``receiver``."""
    raw = subject_bytes(subject, pattern=False)
    parts = data_parts(data)
    if ack:
        response = await client.request(PUB, raw, *parts)
        return int(response.data[0])
    frames = _publish_frames(receiver.tracker.type_width, raw, parts)
    if receiver.brokers is not None:
        await receiver.wait_connected()  # just entered: the brokers' first handshakes
    pause = _SEND_PAUSE
    while True:
        if client.closed:
            raise anyio.ClosedResourceError("the client is closed")
        socket = receiver.live_socket()  # several brokers: a live one (receive Rule RX6)
        if socket is None:
            return None  # no broker is live: dropped (at most once), as SyncClient does
        if socket.try_send(frames) is None:
            return None
        await anyio.sleep(pause)  # the queue is full (dcp._io.errors Rule Z1)
        pause = min(2 * pause, _SEND_PAUSE_MAX)


@contextlib.asynccontextmanager
async def subscribe(
    client: Requests,
    receiver: Receiver,
    pattern: str | bytes,
    queue: str | bytes | None,
    max_pending: int,
    overflow: str | Overflow,
    window: int,
    refresh: float,
    last_value: bool,
) -> AsyncIterator[Subscription]:
    """:meth:`dcp.Client.subscribe`: subscribe through ``client``, the messages routed by its
    ``receiver``."""
    options = (queue, max_pending, overflow, window, refresh, last_value)
    state, text = new_state(receiver.subscriptions, pattern, *options)
    sid, data = state.sid, state.sub
    sub = Subscription(client, state, text)
    failure: BaseException | None = None
    try:
        if receiver.brokers is None:
            await client.request(SUB, *data)
        else:
            await _subscribe_each(receiver, state)
        async with anyio.create_task_group() as tg:
            if receiver.brokers is None:
                tg.start_soon(_grant_credit, client, state, sub.pattern, refresh)
            else:
                tg.start_soon(_grant_each, receiver, state, sub.pattern, refresh)
            try:
                yield sub
            except BaseException as exc:  # re-raised below, not wrapped in a group
                failure = exc
            tg.cancel_scope.cancel()
    finally:
        receiver.subscriptions.pop(sid, None)
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            if not client.closed:
                with contextlib.suppress(DCPError, anyio.ClosedResourceError):
                    if receiver.brokers is None:
                        await client.request(UNSUB, sid, timeout=1)
                    else:
                        for i in sorted(state.at):
                            with contextlib.suppress(DCPError):
                                await _ask(receiver, i, UNSUB, [sid], 1)
    if failure is not None:
        raise failure


# --------------------------------------------------------------------------- blocking


class StartPlain(Protocol):
    """Starts a request without waiting for it (its outcome lands in the receiver's
    ``done``): service, data -> the request id."""

    def __call__(
        self,
        service: bytes,
        data: Sequence[bytes],
        *,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> bytes: ...


class SyncSubscription:
    """An active subscription of a :class:`dcp.SyncClient`: ``for msg in sub`` (blocks)."""

    def __init__(
        self,
        receiver: SyncReceiver,
        start: StartPlain,
        state: SubscriptionState,
        pattern: str,
        refresh: float,
    ) -> None:
        self._receiver = receiver
        self._start = start
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
    def brokers_lost(self) -> int:
        """Brokers lost while this subscription was subscribed at them (several brokers,
        Rule CP6): each may have lost messages, how many is unknown (not in :attr:`lost`)."""
        return self._state.brokers_lost

    @property
    def resubscribed(self) -> int:
        """How often the client subscribed again (broker restart, Rule CP3)."""
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
        receiver = self._receiver
        while True:
            msg = state.take()
            self._maintain()
            if msg is not None:
                return msg
            now = time.monotonic()
            if now >= deadline:
                return None
            wait = min(deadline, self._next_refresh) - now
            tracker_due = receiver.tracker.next_deadline()
            if tracker_due is not None:
                wait = min(wait, tracker_due - now)
            ready = receiver.poller.poll(max(0, math.ceil(wait * 1000)))
            if ready or (tracker_due is not None and tracker_due <= time.monotonic()):
                receiver.pump()

    def _maintain(self) -> None:
        """Grant credit and refresh (Rule CP1); re-subscribe if the broker forgot us (C3)."""
        state = self._state
        receiver = self._receiver
        if self._grant is not None:
            outcome = receiver.done.pop(self._grant, None)
            if outcome is None and receiver.tracker.is_pending(self._grant):
                return
            self._grant = None
            if isinstance(outcome, RemoteError) and outcome.code == "unknown_subscription":
                state.resubscribed += 1
                receiver.forget(self._start(SUB, state.sub))
        now = time.monotonic()
        if state.owed * 2 >= state.window or now >= self._next_refresh:
            grant, state.owed = state.owed, 0
            self._next_refresh = now + self._refresh
            # Sent once (Rule CP1), bounded as the async client's grants are.
            data = [state.sid, b"%d" % grant]
            self._grant = self._start(CREDIT, data, timeout=max(self._refresh, 1), retries=0)


def publish_sync(
    client: SyncRequests,
    receiver: SyncReceiver,
    subject: str | bytes,
    data: Sequence[Part],
    ack: bool,
) -> int | None:
    """:meth:`dcp.SyncClient.publish` through ``client`` (with ``ack``) or its ``receiver``."""
    raw = subject_bytes(subject, pattern=False)
    parts = data_parts(data)
    if ack:
        response = client.request(PUB, raw, *parts)
        return int(response.data[0])
    receiver.send(_publish_frames(receiver.tracker.type_width, raw, parts), math.inf)
    return None


@contextlib.contextmanager
def subscribe_sync(
    client: SyncRequests,
    receiver: SyncReceiver,
    start: StartPlain,
    pattern: str | bytes,
    queue: str | bytes | None,
    max_pending: int,
    overflow: str | Overflow,
    window: int,
    refresh: float,
    last_value: bool,
) -> Iterator[SyncSubscription]:
    """:meth:`dcp.SyncClient.subscribe`: subscribe through ``client``; the subscription
    grants credit with ``start`` and reads through ``receiver``."""
    options = (queue, max_pending, overflow, window, refresh, last_value)
    state, text = new_state(receiver.subscriptions, pattern, *options)
    sid = state.sid
    try:
        client.request(SUB, *state.sub)
        yield SyncSubscription(receiver, start, state, text, refresh)
    finally:
        receiver.subscriptions.pop(sid, None)
        if not client.closed:
            with contextlib.suppress(DCPError):
                client.request(UNSUB, sid, timeout=1)
