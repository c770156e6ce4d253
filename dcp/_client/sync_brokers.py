"""The blocking client's sockets when it is given several brokers: :class:`BrokersReceiver`,
one DEALER per broker (the same routing id on each, one tracker, so one id space), read
together; the decisions (where each request goes, when one moves) are
:class:`~dcp._client.sync_spread.Spread`'s (Rules SB1-SB6). One endpoint takes
:class:`~dcp._client.sync_receive.SyncReceiver` alone, unchanged.

Rules (besides SyncReceiver's SX1-SX4, which hold here per socket):

Rule SM1 - Every socket and its monitor are polled at once; a wake-up reads each ready socket
  in bounded batches (``batch`` messages), so one busy broker cannot starve another.
Rule SM2 - zmq's heartbeat (``ZMQ_HEARTBEAT_IVL`` 1 s, ``ZMQ_HEARTBEAT_TIMEOUT`` 3 s: a
  broker's default liveness) is set on each socket, so a broker that falls silent without
  closing its connection (a machine or a network gone) is lost within about 3 s.
Rule SM3 - A message that is not a request (a stream's credit or cancel) goes to the broker
  that carries the request it names; a publish to the pub/sub broker (Rule SB6).
Rule SM4 - A request moved (Rule SB3) is sent as it was last sent, its expires-in option
  lowered by the time since (its deadline is the call's, unchanged).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence

import zmq

from dcp._client.subscriptions import deliver
from dcp._client.sync_receive import SyncReceiver, refuse_in_event_loop
from dcp._client.sync_spread import BrokerState, Kind, Spread
from dcp._core.client.calls import Timing
from dcp._core.client.tracker import RequestTracker
from dcp._errors import RemoteError, RemoteProtocolError
from dcp._io.handshake import EVENTS, HandshakeWatch, close_monitor, read_events
from dcp._io.sockets import try_recv, try_send
from dcp._models import Outcome
from dcp.wire.dcp1 import TYPE_FRAMES, MessageType, split_body
from dcp.wire.messages import HELD_MARKER
from dcp.wire.options import OPTION_PREFIX, expires_in_option, request_expires_in
from dcp.wire.streams import STREAM_OPTION, is_stream

__all__ = ["HEARTBEAT", "MONITOR_EVENTS", "BrokerLink", "BrokersReceiver"]

_POLLIN = zmq.POLLIN
#: Rule SM2: zmq heartbeat interval and timeout, in milliseconds.
HEARTBEAT = (1000, 3000)
#: The monitor events: the handshake rules', and a failed connection attempt (Rule SB1).
MONITOR_EVENTS = EVENTS | zmq.EVENT_CONNECT_RETRIED
#: Where a request's expires-in option is (the tracker's frames: "" DGBX T service "" id).
_EXPIRES_AT = 6
_EXPIRES_IN = OPTION_PREFIX + b"expires-in="
#: The type frame of a reply, in either width.
_REPLY_TYPES = (TYPE_FRAMES[1][MessageType.REPLY], TYPE_FRAMES[4][MessageType.REPLY])


class BrokerLink:
    """One broker's socket, its monitor and its handshake rules.

    :param index: its place in the client's list of endpoints
    """

    __slots__ = ("endpoint", "index", "monitor", "sock", "watch")

    def __init__(
        self,
        index: int,
        endpoint: str,
        sock: zmq.Socket[bytes],
        monitor: zmq.Socket[bytes],
        watch: HandshakeWatch,
    ) -> None:
        self.index = index
        self.endpoint = endpoint
        self.sock = sock
        self.monitor = monitor
        self.watch = watch


class BrokersReceiver(SyncReceiver):
    """The sockets of a :class:`~dcp.SyncClient` given several brokers (see the module
    rules); what arrives is kept as :class:`SyncReceiver` keeps it.

    :param tracker: the client's request tracker
    :param links: one per broker, in the order given
    :param batch: messages read per socket and wake-up
    :param grace: Rule SB3's wait, in seconds (the client's ``failover_grace``)
    """

    def __init__(
        self,
        tracker: RequestTracker,
        links: Sequence[BrokerLink],
        *,
        batch: int,
        grace: float,
    ) -> None:
        first = links[0]
        super().__init__(
            tracker, first.sock, first.monitor, first.watch, endpoint=first.endpoint, batch=batch
        )
        #: Every broker's link, in the order given.
        self.links = tuple(links)
        #: Where requests go (Rules SB1-SB6).
        self.spread = Spread(len(links), grace)
        self._by_socket: dict[zmq.Socket[bytes], BrokerLink] = {}
        self._by_monitor: dict[zmq.Socket[bytes], BrokerLink] = {}
        for link in self.links:
            self._by_socket[link.sock] = link
            self._by_monitor[link.monitor] = link
            if link is not first:
                self.poller.register(link.sock, _POLLIN)
                self.poller.register(link.monitor, _POLLIN)
        #: A broker the next requests are pinned to (``mmi.*`` asked of each broker).
        self.pin: int | None = None

    def close(self) -> None:
        """Close every socket (linger 0) and forget pending requests. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.pid == os.getpid():
            for link in self.links:
                close_monitor(link.sock, link.monitor)
                link.sock.close(0)
        self.tracker.cancel_all()
        self.spread.placed.clear()
        self.spread.moving.clear()
        self.done.clear()

    def live_brokers(self) -> list[int]:
        """The brokers that are live now (Rule SB1), in the order given."""
        return [i for i, s in enumerate(self.spread.states) if s is BrokerState.LIVE]

    # ------------------------------------------------------------------ sending

    def start(
        self,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> bytes:
        """:meth:`SyncReceiver.start`, to the broker Rules SB2 and SB6 choose."""
        self._check_caller()
        refuse_in_event_loop()
        tracker = self.tracker
        now = time.monotonic()
        rid = tracker.request(service, data, now, metadata=metadata, timing=timing)
        (frames,), _ = tracker.drain()  # the request's first attempt
        spread = self.spread
        broker: int | None
        if self.pin is not None:
            kind, broker = Kind.FIXED, self.pin
        elif service.startswith(OPTION_PREFIX):
            kind, broker = Kind.HOME, spread.home()
        else:
            stream = any(part.startswith(STREAM_OPTION) for part in metadata)
            kind, broker = (Kind.STREAM if stream else Kind.PLAIN), spread.choose()
        spread.place(rid, broker, frames, now, kind)
        if broker is not None:
            try:
                self._send_to(self.links[broker], frames, tracker.deadline_of(rid))
            except BaseException:
                tracker.cancel(rid)
                spread.done(rid)
                raise
        return rid

    def send(self, frames: list[bytes], deadline: float) -> None:
        """Send ``frames`` to the broker Rule SM3 names, waiting for room until
        ``deadline`` (Rule SX1)."""
        link = self._route(frames)
        if link is not None:
            self._send_to(link, frames, deadline)

    def send_nowait(self, frames: list[bytes]) -> None:
        """Send a message that is not a request at once (Rule SM3).

        :raises zmq.ZMQError: not sent (``zmq.Again``: the queue is full)
        """
        link = self._route(frames)
        if link is not None:
            link.sock.send_multipart(frames, flags=zmq.NOBLOCK)

    def forget(self, rid: bytes) -> Outcome | None:
        """:meth:`SyncReceiver.forget`, and the request leaves its broker."""
        self.spread.done(rid)
        return super().forget(rid)

    def _route(self, frames: list[bytes]) -> BrokerLink | None:
        placed = self.spread.placed
        for part in frames[3:6]:  # a stream's control names its request there
            p = placed.get(part)
            if p is not None:
                return None if p.broker is None else self.links[p.broker]
        home = self.spread.home()
        return None if home is None else self.links[home]

    def _send_to(self, link: BrokerLink, frames: list[bytes], deadline: float) -> None:
        """Rule SX1 on ``link``'s socket."""
        sock = link.sock
        if try_send(sock, frames) is None:
            return
        self.tracker.send_waits += 1
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLOUT)
        poller.register(link.monitor, _POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return  # the attempt counts as lost; the retry rule takes over
            ready = dict(poller.poll(math.ceil(min(remaining, 0.1) * 1000)))
            if link.monitor in ready:
                self._read_link_monitor(link)
            if try_send(sock, frames) is None:
                return

    def _check_caller(self) -> None:
        """Rule SX2 and a closed client, as :meth:`SyncReceiver.start` checks them."""
        if self.closed:
            raise self.closed_error()
        if self.pid != os.getpid():
            raise RuntimeError("a SyncClient cannot be used in a forked child; create one there")
        if threading.get_ident() != self._owner:
            self._claim()

    # ------------------------------------------------------------------ receiving

    def pump(self, wait_max: float | None = None) -> None:
        """:meth:`SyncReceiver.pump` over every broker's socket (Rule SM1), with the moves
        of Rule SB3 and the monitors' verdicts (Rule SB1)."""
        if self.closed:
            raise self.closed_error()
        self._check_caller()
        tracker = self.tracker
        spread = self.spread
        due = tracker.next_deadline()
        deadline = min(math.inf if due is None else due, spread.next_deadline())
        wait_ms: int | None = None
        if deadline < math.inf:
            wait_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
        if wait_max is not None:
            most = math.ceil(wait_max * 1000)
            wait_ms = most if wait_ms is None else min(wait_ms, most)
        ready = self.poller.poll(wait_ms)
        for sock, _ in ready:
            link = self._by_monitor.get(sock)
            if link is not None:
                self._read_link_monitor(link)
        for sock, _ in ready:
            link = self._by_socket.get(sock)
            if link is not None:
                self._read(link)
        now = time.monotonic()
        due = tracker.next_deadline()
        if due is not None and due <= now:
            self._expire(now)
        if spread.next_deadline() <= now:
            self._move(spread.due(now), now)

    def _read(self, link: BrokerLink) -> None:
        sock = link.sock
        done = self.done
        receive = self.tracker.receive
        spread = self.spread
        watch = link.watch
        for _ in range(self._batch):
            frames = try_recv(sock)
            if frames is None:
                break
            watch.heard = watch.handshakes  # handshakes Rule H5
            if self.stream_parts and is_stream(frames):
                self._stream_part(frames)
                continue
            if self.subscriptions and self._deliver(frames):
                continue
            if frames[-1] == HELD_MARKER and frames[-2] == b"" and self._held(frames):
                continue
            resolved = receive(frames)
            if resolved is not None:
                done[resolved[0]] = resolved[1]
                spread.done(resolved[0])

    def _held(self, frames: list[bytes]) -> bool:
        """Rule SB5: ``frames`` (ending ``"" HELD_MARKER``) as a HELD notice; ``False`` if
        it is no reply (then the tracker counts it)."""
        if len(frames) < 6 or frames[2] not in _REPLY_TYPES:
            return False
        try:
            _, metadata, data = split_body(frames, 3)
        except RemoteProtocolError:
            return False
        if not metadata or len(data) != 1:
            return False
        self.spread.notice(metadata[0])
        return True

    def _deliver(self, frames: list[bytes]) -> bool:
        return deliver(self.subscriptions, frames)

    def _read_link_monitor(self, link: BrokerLink) -> None:
        """Rule SB1 from ``link``'s monitor; the handshake rules end the client as with one
        broker (a refused key is a mistake, not an outage).

        :raises AuthenticationFailed: a handshake failed for good (the client is closed)
        """
        spread = self.spread
        for event, value in read_events(link.monitor):
            failure = link.watch.event(event, value)
            if failure is not None:
                self.failure = failure
                self.close()
                raise self.closed_error()
            i = link.index
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                for rid in spread.live(i):  # Rule SB4: those waiting go here at once
                    p = spread.placed[rid]
                    frames = _refreshed(p.frames, p.sent_at, time.monotonic())
                    spread.place(rid, i, frames, time.monotonic())
                    self._try_send(link, frames)
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL) or (
                event == zmq.EVENT_CONNECT_RETRIED and spread.states[i] is BrokerState.CONNECTING
            ):
                for rid in spread.lost(i, time.monotonic()):  # Rule SB3
                    kind = spread.placed[rid].kind
                    spread.done(rid)
                    if self.tracker.cancel(rid):
                        code = "stream_broken" if kind is Kind.STREAM else "broker_lost"
                        self.done[rid] = RemoteError(
                            code, f"the broker at {link.endpoint} was lost"
                        )

    # ------------------------------------------------------------------ time

    def _expire(self, now: float) -> None:
        tracker = self.tracker
        spread = self.spread
        tracker.expire(now)
        out, events = tracker.drain()
        for frames in out:
            rid = frames[5] if len(frames) > 5 else b""
            p = spread.placed.get(rid)
            # An attempt's resend goes to a live broker (a probe, to any).
            broker = spread.choose() if p is None else spread.target(p)
            if p is not None:
                spread.place(rid, broker, frames, now)
            if broker is not None:
                link = self.links[broker]
                if link.watch.unheard():  # handshakes Rule H5 (Rule SX3)
                    link.watch.heard = link.watch.handshakes
                    link.sock.disconnect(link.endpoint)
                    link.sock.connect(link.endpoint)
                self._try_send(link, frames)
        done = self.done
        for event in events:
            done[event.request_id] = event.error
            spread.done(event.request_id)

    def _move(self, due: list[bytes], now: float) -> None:
        """Rule SB3: send each request whose grace is over to another broker (Rule SM4)."""
        spread = self.spread
        for rid in due:
            p = spread.placed.get(rid)
            if p is None:
                continue
            broker = spread.target(p)
            frames = _refreshed(p.frames, p.sent_at, now)
            spread.place(rid, broker, frames, now)
            if broker is not None:
                self._try_send(self.links[broker], frames)

    def _try_send(self, link: BrokerLink, frames: list[bytes]) -> None:
        if try_send(link.sock, frames) is not None:  # full (dcp._io.errors Rule Z1)
            self.tracker.resends_dropped += 1


def _refreshed(frames: list[bytes], sent_at: float, now: float) -> list[bytes]:
    """Rule SM4: ``frames`` with their expires-in option lowered by ``now - sent_at``."""
    if len(frames) <= _EXPIRES_AT or not frames[_EXPIRES_AT].startswith(_EXPIRES_IN):
        return frames
    left = request_expires_in((frames[_EXPIRES_AT],))
    if left is None:
        return frames
    option = expires_in_option(max(left - (now - sent_at), 0.001))
    return [*frames[:_EXPIRES_AT], option, *frames[_EXPIRES_AT + 1 :]]
