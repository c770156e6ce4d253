"""The blocking client's sockets when it is given several brokers: :class:`BrokersReceiver`,
one DEALER per broker (the same routing id on each, one tracker, so one id space), read
together. The decisions (which broker is live, where each request goes, what moves when one
is lost, HELD notices) are :class:`~dcp._core.client.brokers.Brokers`' (Rules BK1-BK6), the
async client's too. One endpoint takes :class:`~dcp._client.sync_receive.SyncReceiver`
alone, unchanged.

Rules (besides SyncReceiver's SX1-SX4, which hold here per socket):

Rule SM1 - Every socket and its monitor are polled at once; a wake-up reads each ready socket
  in bounded batches (``batch`` messages), so one busy broker cannot starve another.
Rule SM2 - Lost and live (Rule BK2) come from each socket's monitor: a successful handshake
  makes a broker live; ``DISCONNECTED`` or a handshake failing without detail makes it lost.
  zmq's heartbeat (1 s; a broker silent for three is lost: a broker's default liveness) is
  set on each socket, so a broker that falls silent without closing its connection (a
  machine or a network gone) is lost within about 3 s; and ``ZMQ_IMMEDIATE``, so nothing
  queues for a broker that is not connected. A handshake refused for good (handshakes
  Rules H1-H3) ends the client, as with one broker.
Rule SM3 - Pub/sub. A subscription subscribes at every live broker, and at each broker that
  becomes live (pubsub Rule CP5, :mod:`dcp._client.sync_pubsub`): its requests are asked of
  one broker each (Rule SM4). A publish (with or without ack; services starting
  ``\\xffDCP:``) goes through the *home* broker, the first live one in the order given;
  moved (Rule BK4) or resent, to the home of that moment. A message that is not a request
  (a stream's credit or cancel, a publish without ack) goes through the broker that carries
  the request it names, else the home.
Rule SM4 - Asked of each broker. The ``mmi.*`` questions of :meth:`dcp.SyncClient.services`
  and friends, and a subscription's own requests, go to one broker each
  (:attr:`BrokersReceiver.pin`); such a request does not move: its broker being lost ends it
  (``broker_lost``), as it ends a stream (``stream_broken``, Rule BK4).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence

import zmq

from dcp._client.subscriptions import deliver
from dcp._client.sync_receive import SyncReceiver, refuse_in_event_loop
from dcp._core.client.brokers import Brokers, held_request
from dcp._core.client.calls import Timing
from dcp._core.client.tracker import RequestTracker
from dcp._errors import RemoteError
from dcp._io.handshake import HandshakeWatch, close_monitor, read_events
from dcp._io.sockets import try_recv, try_send
from dcp._models import Outcome
from dcp.wire.messages import HELD_MARKER
from dcp.wire.options import OPTION_PREFIX
from dcp.wire.streams import STREAM_OPTION, is_stream

__all__ = ["HEARTBEAT", "SETTLE", "BrokerLink", "BrokersReceiver"]

_POLLIN = zmq.POLLIN
#: Rule SM2: seconds between zmq heartbeats (a broker silent for three is lost).
HEARTBEAT = 1.0
#: Seconds after the client is made during which asking every broker waits for their first
#: handshakes (:meth:`BrokersReceiver.settle`).
SETTLE = 1.0
#: Monitor events that make a broker lost (Rule SM2).
_LOST_EVENTS = (zmq.EVENT_DISCONNECTED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


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
    :param brokers: the client's broker choice (the same order)
    :param batch: messages read per socket and wake-up
    """

    def __init__(
        self,
        tracker: RequestTracker,
        links: Sequence[BrokerLink],
        brokers: Brokers,
        *,
        batch: int,
    ) -> None:
        first = links[0]
        super().__init__(
            tracker, first.sock, first.monitor, first.watch, endpoint=first.endpoint, batch=batch
        )
        #: Every broker's link, in the order given.
        self.links = tuple(links)
        #: Where requests go (Rules BK1-BK6).
        self.brokers = brokers
        #: When the sockets were made (:meth:`settle`).
        self.made_at = time.monotonic()
        self._by_socket: dict[zmq.Socket[bytes], BrokerLink] = {}
        self._by_monitor: dict[zmq.Socket[bytes], BrokerLink] = {}
        for link in self.links:
            self._by_socket[link.sock] = link
            self._by_monitor[link.monitor] = link
            if link is not first:
                self.poller.register(link.sock, _POLLIN)
                self.poller.register(link.monitor, _POLLIN)
        #: Rule SM4: the broker the next requests are asked of (``None``: spread them).
        self.pin: int | None = None
        # Rule SM3: the pub/sub requests outstanding; Rule SM4: those asked of one broker.
        self._home: set[bytes] = set()
        self._fixed: set[bytes] = set()
        #: Streams Rule CS4: the broker of each stream that ended (answered, timed out)
        #: before it was forgotten, and of the one forgotten last, for its CANCEL.
        self._stream_ends: dict[bytes, int] = {}
        self._cancel_at: tuple[bytes, int | None] = (b"", None)

    def close(self) -> None:
        """Close every socket (linger 0) and forget pending requests. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.pid == os.getpid():
            for link in self.links:
                close_monitor(link.sock, link.monitor)
                link.sock.close(0)
        for rid in self.tracker.cancel_all():
            self.brokers.done(rid)
        self.done.clear()

    def live_brokers(self) -> list[int]:
        """The brokers that are live now (Rule BK2), in the order given."""
        return [i for i in range(len(self.links)) if self.brokers.is_live(i)]

    def settle(self) -> None:
        """Read the monitors until every broker made its first handshake (or was lost), for
        at most :data:`SETTLE` seconds after the sockets were made, or until every broker is
        unreachable (Rule SX5 of dcp._client.sync_receive)."""
        deadline = self.made_at + SETTLE
        refusing = self.refusing
        while self.brokers.connecting:
            if refusing is not None and refusing():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.pump(left)

    def home(self) -> int | None:
        """Rule SM3: the broker pub/sub goes through (``None``: none is live)."""
        is_live = self.brokers.is_live
        return next((i for i in range(len(self.links)) if is_live(i)), None)

    @contextlib.contextmanager
    def pinned(self, broker: int) -> Iterator[None]:
        """Rule SM4: the requests started in the block are asked of ``broker`` only
        (:attr:`pin`)."""
        self.pin = broker
        try:
            yield
        finally:
            self.pin = None

    # ------------------------------------------------------------------ sending

    def start(
        self,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> bytes:
        """:meth:`SyncReceiver.start`, through the broker Rules BK3, SM3 and SM4 choose (or
        parked until one is live)."""
        self._check_caller()
        refuse_in_event_loop()
        tracker = self.tracker
        refusing = self.refusing
        if refusing is not None and refusing():  # Rule SX5 of dcp._client.sync_receive
            self.read_monitors()  # the verdict as of now: a broker may have come since
            if refusing():
                raise tracker.unreachable_error()
        rid = tracker.request(service, data, time.monotonic(), metadata=metadata, timing=timing)
        (frames,), _ = tracker.drain()  # the request's first attempt
        brokers = self.brokers
        movable = True
        broker: int | None
        if self.pin is not None:
            broker, movable = self.pin, False
            if not brokers.is_live(broker):  # Rule SM4: ends at once, as when it is lost
                tracker.cancel(rid)
                endpoint = self.links[broker].endpoint
                self.done[rid] = RemoteError(
                    "broker_lost", f"the broker at {endpoint} is not connected"
                )
                return rid
            self._fixed.add(rid)
        elif service.startswith(OPTION_PREFIX):
            broker = self.home()
            self._home.add(rid)
        else:
            movable = not any(part.startswith(STREAM_OPTION) for part in metadata)
            broker = brokers.choose()
        if broker is None:
            brokers.park(rid)  # Rule BK3: sent once a broker is live
            return rid
        brokers.sent(rid, broker, movable=movable)
        try:
            self._send_to(self.links[broker], frames, tracker.deadline_of(rid))
        except BaseException:
            tracker.cancel(rid)
            self._end(rid)
            raise
        return rid

    def send(self, frames: list[bytes], deadline: float) -> None:
        """Send ``frames`` through the broker Rule SM3 names, waiting for room until
        ``deadline`` (Rule SX1); dropped if no broker is live (after the first handshakes,
        :meth:`settle`)."""
        link = self._route(frames)
        if link is None and self.brokers.connecting:  # just made: its first handshakes
            self.settle()
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
        """:meth:`SyncReceiver.forget`, and the request leaves its broker (kept for a
        stream's CANCEL, which follows at once: Rule SM3)."""
        broker = self._stream_ends.pop(rid, None)
        self._cancel_at = (rid, self.brokers.where(rid) if broker is None else broker)
        self._end(rid)
        return super().forget(rid)

    def _end(self, rid: bytes) -> None:
        if rid in self.stream_parts:  # a stream still read: its CANCEL may follow
            broker = self.brokers.where(rid)
            if broker is not None:
                self._stream_ends[rid] = broker
        self.brokers.done(rid)
        if self._home:
            self._home.discard(rid)
        if self._fixed:
            self._fixed.discard(rid)

    def _route(self, frames: list[bytes]) -> BrokerLink | None:
        brokers = self.brokers
        for part in frames[3:6]:  # a stream's control names its request there
            rid, broker = self._cancel_at
            if part != rid:
                broker = brokers.where(part)
            if broker is not None:  # (dropped if that broker is not live)
                return self.links[broker] if brokers.is_live(broker) else None
        home = self.home()
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
                if not self.brokers.is_live(link.index):
                    return  # lost meanwhile: Rule BK4 moves what was sent there
            if try_send(sock, frames) is None:
                return

    def _resend(self, rid: bytes, now: float, broker: int | None) -> None:
        """Send a pending request again through ``broker`` (a move, or a parked request
        whose broker came), with its frames as of ``now`` (tracker Rule RT8)."""
        frames = self.tracker.moved(rid, now)
        if frames is None:  # no longer pending
            self._end(rid)
        elif broker is None:
            self.brokers.park(rid)
        else:
            self.brokers.sent(rid, broker, movable=rid not in self.stream_parts)
            self._try_send(self.links[broker], frames)

    def _check_caller(self) -> None:
        """Rule SX2 and a closed client, as :meth:`SyncReceiver.start` checks them."""
        if self.closed:
            raise self.closed_error()
        if self.pid != os.getpid():
            raise RuntimeError("a SyncClient cannot be used in a forked child; create one there")
        if threading.get_ident() != self._owner:
            self._claim()

    def _target(self, rid: bytes) -> int | None:
        """Where a pending request goes when it is sent again: the home for pub/sub (Rule
        SM3), else Rule BK3."""
        return self.home() if rid in self._home else self.brokers.choose()

    def _try_send(self, link: BrokerLink, frames: list[bytes]) -> None:
        if try_send(link.sock, frames) is not None:  # full (dcp._io.errors Rule Z1)
            self.tracker.resends_dropped += 1

    # ------------------------------------------------------------------ receiving

    def pump(self, wait_max: float | None = None) -> None:
        """:meth:`SyncReceiver.pump` over every broker's socket (Rule SM1), with the moves
        of Rule BK4 and the monitors' verdicts (Rule SM2)."""
        self._check_caller()
        tracker = self.tracker
        brokers = self.brokers
        due = tracker.next_deadline()
        moving = brokers.next_deadline()
        if moving is not None and (due is None or moving < due):
            due = moving
        wait_ms: int | None = None
        if due is not None:
            wait_ms = max(0, math.ceil((due - time.monotonic()) * 1000))
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
        moving = brokers.next_deadline()
        if moving is not None and moving <= now:
            for rid in brokers.expire(now):  # Rule BK4
                self._resend(rid, now, self._target(rid))

    def _read(self, link: BrokerLink) -> None:
        sock = link.sock
        done = self.done
        receive = self.tracker.receive
        watch = link.watch
        for _ in range(self._batch):
            frames = try_recv(sock)
            if frames is None:
                break
            watch.heard = watch.handshakes  # handshakes Rule H5
            if self.stream_parts and is_stream(frames):
                self._stream_part(frames)
                continue
            if self.subscriptions and deliver(self.subscriptions, frames):
                continue
            if frames[-1] == HELD_MARKER:
                held = held_request(frames)
                if held is not None:
                    self.brokers.hold(held)  # Rule BK5
                    continue
            resolved = receive(frames)
            if resolved is not None:
                done[resolved[0]] = resolved[1]
                self._end(resolved[0])

    def read_monitors(self) -> None:
        """Every broker's waiting monitor events (:meth:`SyncReceiver.read_monitors`)."""
        for link in self.links:
            self._read_link_monitor(link)

    def _read_link_monitor(self, link: BrokerLink) -> None:
        """Rule SM2 from ``link``'s monitor.

        :raises AuthenticationFailed: a handshake failed for good (the client is closed)
        """
        brokers = self.brokers
        i = link.index
        for event, value in read_events(link.monitor):
            failure = link.watch.event(event, value)
            if failure is not None:
                self.failure = failure
                self.close()
                raise self.closed_error()
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                now = time.monotonic()
                for rid in brokers.up(i):  # Rule BK3: the parked ones go now
                    self._resend(rid, now, self._target(rid))
                for state in self.subscriptions.values():
                    state.broker_up(i)  # pubsub Rule CP5: subscribed at again
            elif event in _LOST_EVENTS:
                for state in self.subscriptions.values():
                    state.broker_lost(i)
                for rid in brokers.lost(i, time.monotonic()):  # Rules BK4 and SM4
                    code = "stream_broken" if rid in self.stream_parts else "broker_lost"
                    self._end(rid)
                    if self.tracker.cancel(rid):
                        self.done[rid] = RemoteError(
                            code, f"the broker at {link.endpoint} was lost"
                        )
        for rid in self.unreachable():  # Rule SX5 of dcp._client.sync_receive
            self._end(rid)

    # ------------------------------------------------------------------ time

    def _expire(self, now: float) -> None:
        tracker = self.tracker
        brokers = self.brokers
        tracker.expire(now)
        out, events = tracker.drain()
        for frames in out:
            rid = frames[5] if len(frames) > 5 else b""
            broker: int | None
            if not tracker.is_pending(rid):  # a probe (tracker Rule RT5): any live broker
                broker = brokers.choose()
            elif rid in self._fixed:
                broker = brokers.where(rid)  # Rule SM4: its own broker only
            elif rid in self._home:
                broker = self.home()  # Rule SM3
            else:
                broker = brokers.route(rid)  # Rule BK6
            if broker is None:
                if tracker.is_pending(rid):
                    brokers.park(rid)  # Rule BK3
                continue
            if tracker.is_pending(rid):
                movable = rid not in self._fixed and rid not in self.stream_parts
                brokers.sent(rid, broker, movable=movable)
            link = self.links[broker]
            if link.watch.unheard():  # handshakes Rule H5 (Rule SX3)
                link.watch.heard = link.watch.handshakes
                link.sock.disconnect(link.endpoint)
                link.sock.connect(link.endpoint)
            self._try_send(link, frames)
        done = self.done
        for event in events:
            done[event.request_id] = event.error
            self._end(event.request_id)
