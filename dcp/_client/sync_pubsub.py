"""A :class:`~dcp.SyncClient`'s subscriptions when it is given several brokers: pubsub Rule
CP5 (the async client's), blocking. The subscription subscribes at every live broker with the
same id, so a message published through any broker is delivered once per subscription; each
broker it is subscribed at gets the credit it grants; a broker that becomes live (again) is
subscribed at on the next turn of :meth:`BrokersSubscription.next`. A publish goes through one
live broker (Rule SM3 of :mod:`dcp._client.sync_brokers`). One broker takes
:func:`dcp._client.pubsub.subscribe_sync` alone, unchanged.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from dcp._client.pubsub import (
    StartPlain,
    SyncRequests,
    SyncSubscription,
    new_state,
)
from dcp._client.subscriptions import SubscriptionState
from dcp._client.sync_brokers import BrokersReceiver
from dcp._core.broker.pubsub import Overflow
from dcp._core.broker.pubsub_peers import CREDIT, SUB, UNSUB
from dcp._errors import DCPError, RemoteError

__all__ = ["BrokersSubscription", "subscribe_brokers"]


class BrokersSubscription(SyncSubscription):
    """A :class:`~dcp.SyncSubscription` at every live broker (see the module docstring).

    :param receiver: the client's sockets
    :param start: starts a request without waiting for it (the client's)
    """

    def __init__(
        self,
        receiver: BrokersReceiver,
        start: StartPlain,
        state: SubscriptionState,
        pattern: str,
        refresh: float,
    ) -> None:
        super().__init__(receiver, start, state, pattern, refresh)
        self._brokers_rx = receiver
        #: The credit grants outstanding, by request id: the broker each went to.
        self._grants: dict[bytes, int] = {}

    def _maintain(self) -> None:
        """Rules CP1 and CP3 at each broker; subscribe at the brokers that became live
        (Rule CP5)."""
        state = self._state
        rx = self._brokers_rx
        for rid, broker in list(self._grants.items()):
            outcome = rx.done.pop(rid, None)
            if outcome is None and rx.tracker.is_pending(rid):
                continue
            del self._grants[rid]
            if isinstance(outcome, RemoteError) and outcome.code == "unknown_subscription":
                state.resubscribed += 1  # Rule CP3, at that broker
                state.broker_up(broker)
        for broker in sorted(state.renew):
            if rx.brokers.is_live(broker):
                state.renew.discard(broker)
                state.at.add(broker)
                rx.forget(self._at(broker, SUB, state.sub, self._refresh))
        now = time.monotonic()
        if not self._grants and (state.owed * 2 >= state.window or now >= self._next_refresh):
            grant, state.owed = state.owed, 0
            self._next_refresh = now + self._refresh
            data = [state.sid, b"%d" % grant]
            for broker in sorted(state.at):  # each gets the grant (Rule CP5)
                self._grants[self._at(broker, CREDIT, data, max(self._refresh, 1))] = broker

    def _at(self, broker: int, service: bytes, data: list[bytes], timeout: float) -> bytes:
        """Start a pub/sub request at ``broker`` only, sent once: its id."""
        with self._brokers_rx.pinned(broker):
            return self._start(service, data, timeout=timeout, retries=0)


@contextlib.contextmanager
def subscribe_brokers(
    client: SyncRequests,
    receiver: BrokersReceiver,
    start: StartPlain,
    pattern: str | bytes,
    queue: str | bytes | None,
    max_pending: int,
    overflow: str | Overflow,
    window: int,
    refresh: float,
    last_value: bool,
) -> Iterator[SyncSubscription]:
    """:meth:`dcp.SyncClient.subscribe` with several brokers: subscribe at each live one (the
    first refusal is raised if every one refused); unsubscribe at each on the way out."""
    options = (queue, max_pending, overflow, window, refresh, last_value)
    state, text = new_state(receiver.subscriptions, pattern, *options)
    sid = state.sid
    try:
        receiver.settle()  # each broker's first handshake
        failures: list[DCPError] = []
        for broker in range(len(receiver.links)):
            if not receiver.brokers.is_live(broker):
                state.renew.add(broker)  # subscribed at once it is live
                continue
            try:
                with receiver.pinned(broker):
                    client.request(SUB, *state.sub)
                state.at.add(broker)
            except DCPError as exc:
                failures.append(exc)
                if not (isinstance(exc, RemoteError) and exc.code == "broker_lost"):
                    state.renew.add(broker)  # still live: asked again (pubsub Rule CP5)
        if failures and not state.at:
            raise failures[0]
        state.renew -= state.at  # (the handshakes read meanwhile asked for them)
        yield BrokersSubscription(receiver, start, state, text, refresh)
    finally:
        receiver.subscriptions.pop(sid, None)
        if not client.closed:
            for broker in sorted(state.at):
                with receiver.pinned(broker), contextlib.suppress(DCPError):
                    client.request(UNSUB, sid, timeout=1)
