"""The blocking client's socket: :class:`SyncReceiver` starts requests, sends with a bounded
wait while zmq's send queue is full, and reads what arrives (replies, stream parts, pub/sub
messages) whenever a caller waits (:meth:`SyncReceiver.pump`), making the resends and timeouts
the tracker's deadlines call for. No event loop, no thread of its own.

Rules:

Rule SX1 - A send that finds the queue full waits for room until the attempt's deadline (reading
   the monitor meanwhile, so a failed handshake is known at once); then the attempt counts as
   lost and the retry rule takes over (counted once in ``send_waits``). A resend that finds
   it full is not made (``resends_dropped``). While a send waits, replies are not read.
Rule SX2 - The socket belongs to the process that made it (a forked child refuses to use it) and to
   the first thread that sends or waits on it (any other thread is refused at once).
Rule SX4 - Not in an event loop. A thread running an asyncio or trio event loop is refused at
   once (:exc:`RuntimeError` naming :class:`dcp.Client`), when the client is made and when a
   request starts: a blocking wait there would stall the loop, and the broker's replies
   with it, until the call timed out.
Rule SX3 - Handshakes Rule H5: resends due on a connection the broker has not answered since it
   reconnected make a new connection first (a secure broker ignores the old one).
Rule SX5 - Receive Rule RX7 (``wait_for_broker=False``): the client sets
   :attr:`SyncReceiver.refusing`; each read of the monitors that leaves every broker
   unreachable (handshakes Rule H6) ends every pending request (tracker Rule RT9), and a
   request started while that holds raises the same error. That request reads the monitors'
   waiting events first (the monitors are read only while the client waits for replies): a
   broker that came since the verdict is used, not refused.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import anyio
import zmq

from dcp._client.subscriptions import SubscriptionState, deliver
from dcp._client.waiters import Part
from dcp._core.client.calls import Timing
from dcp._core.client.tracker import RequestTracker
from dcp._errors import AuthenticationFailed
from dcp._io.handshake import HandshakeWatch, close_monitor, read_events
from dcp._io.sockets import try_recv, try_send
from dcp._models import Outcome
from dcp.wire.streams import is_stream, parse_part

__all__ = ["SyncReceiver"]

_POLLIN = zmq.POLLIN
_POLLOUT = zmq.POLLOUT
# Longest single wait for room in a full send queue, in seconds (then we re-check the time).
_SEND_POLL_MAX = 0.1


class SyncReceiver:
    """The socket of one :class:`~dcp.SyncClient` and what arrived on it (see the module
    rules): outcomes not yet taken (:attr:`done`), the parts of the streams being read, the
    subscriptions.

    :param tracker: the client's request tracker
    :param sock: the client's DEALER socket, connected
    :param monitor: its handshake monitor (``None``: none)
    :param watch: the handshake rules applied to the monitor's events
    :param endpoint: the broker's endpoint
    :param batch: messages handled per :meth:`pump`
    """

    def __init__(
        self,
        tracker: RequestTracker,
        sock: zmq.Socket[bytes],
        monitor: zmq.Socket[bytes] | None,
        watch: HandshakeWatch,
        *,
        endpoint: str,
        batch: int,
    ) -> None:
        #: The client's request tracker.
        self.tracker = tracker
        #: The DEALER socket and its handshake monitor.
        self.sock = sock
        self.monitor = monitor
        self._watch = watch
        self._endpoint = endpoint
        self._batch = batch
        #: The process the socket belongs to (Rule SX2).
        self.pid = os.getpid()
        #: Set when a handshake failure ended the client (see dcp._io.handshake).
        self.failure: AuthenticationFailed | None = None
        #: Waits for input on the socket (and the monitor).
        self.poller = zmq.Poller()
        self.poller.register(sock, _POLLIN)
        if monitor is not None:
            self.poller.register(monitor, _POLLIN)
        #: Outcomes received but not yet taken by the caller that waits for them.
        self.done: dict[bytes, Outcome] = {}
        #: Parts of the streams being read (dcp._client.streams), by request id.
        self.stream_parts: dict[bytes, deque[Part]] = {}
        #: The subscriptions messages are routed to, by subscription id.
        self.subscriptions: dict[bytes, SubscriptionState] = {}
        #: True once closed.
        self.closed = False
        # The thread the client belongs to: the first one to send a request (Rule SX2).
        self._owner: int | None = None
        self._owner_name = ""
        self._owner_lock = threading.Lock()
        #: Rule SX5: whether no broker can be reached (``None``: the client waits for one).
        self.refusing: Callable[[], bool] | None = None

    def close(self) -> None:
        """Close the socket (linger 0) and forget pending requests. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.pid == os.getpid():
            if self.monitor is not None:
                close_monitor(self.sock, self.monitor)
            self.sock.close(0)
        self.tracker.cancel_all()
        self.done.clear()

    def closed_error(self) -> Exception:
        """What a call on the closed client raises."""
        failure = self.failure
        if failure is not None:
            return AuthenticationFailed(failure.endpoint, failure.reason)
        return anyio.ClosedResourceError("the client is closed")

    # ------------------------------------------------------------------ requests

    def start(
        self,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> bytes:
        """Start a request and send its first attempt (Rule SX1); its outcome will be in
        :attr:`done`. Tracing replaces this method on the instance.

        :returns: the request id
        :raises anyio.ClosedResourceError: the client is closed
        :raises BrokerUnreachable: no broker can be reached (Rule SX5)
        :raises RuntimeError: a forked child, or another thread (Rule SX2), or a thread running
            an event loop (Rule SX4)
        """
        if self.closed:
            raise self.closed_error()
        if self.pid != os.getpid():
            raise RuntimeError("a SyncClient cannot be used in a forked child; create one there")
        if threading.get_ident() != self._owner:
            self._claim()
        refuse_in_event_loop()
        tracker = self.tracker
        refusing = self.refusing
        if refusing is not None and refusing():  # Rule SX5
            self.read_monitors()  # the verdict as of now: a broker may have come since
            if refusing():
                raise tracker.unreachable_error()
        rid = tracker.request(service, data, time.monotonic(), metadata=metadata, timing=timing)
        (frames,), _ = tracker.drain()  # the request's first attempt
        try:
            self.send(frames, tracker.deadline_of(rid))
        except BaseException:
            tracker.cancel(rid)
            raise
        return rid

    def unreachable(self) -> list[bytes]:
        """Rule SX5: if no broker can be reached, end every pending request (its error to
        :attr:`done`); the ids of those ended."""
        refusing = self.refusing
        if refusing is None or not refusing():
            return []
        tracker = self.tracker
        tracker.unreachable()
        _, events = tracker.drain()
        done = self.done
        for event in events:
            done[event.request_id] = event.error
        return [event.request_id for event in events]

    def send(self, frames: list[bytes], deadline: float) -> None:
        """Send ``frames``, waiting for room in a full queue until ``deadline`` (Rule SX1)."""
        sock = self.sock
        if try_send(sock, frames) is None:
            return
        self.tracker.send_waits += 1  # the queue is full (dcp._io.errors Rule Z1)
        # A handshake that failed before the first send leaves no connection to queue on
        # (libzmq does not reconnect after it): watch the monitor while waiting, or the
        # failure would only be read once the attempt is over.
        poller = zmq.Poller()
        poller.register(sock, _POLLOUT)
        if self.monitor is not None:
            poller.register(self.monitor, _POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return  # the attempt counts as lost; the retry rule takes over
            ready = dict(poller.poll(math.ceil(min(remaining, _SEND_POLL_MAX) * 1000)))
            if self.monitor is not None and self.monitor in ready:
                self._read_monitor()
            if try_send(sock, frames) is None:
                return

    def send_nowait(self, frames: list[bytes]) -> None:
        """Send a message that is not a request (a stream's cancel) at once.

        :raises zmq.ZMQError: not sent (``zmq.Again``: the queue is full)
        """
        self.sock.send_multipart(frames, flags=zmq.NOBLOCK)

    def forget(self, rid: bytes) -> Outcome | None:
        """Stop waiting for a request: its outcome if it arrived (taken), else ``None`` (the
        tracker forgets it: a late reply is dropped)."""
        outcome = self.done.pop(rid, None)
        if outcome is None:
            self.tracker.cancel(rid)
        return outcome

    def _claim(self) -> None:
        """Make this thread the owner if there is none yet, else refuse (one thread per
        client: its zmq socket and its state are not thread-safe)."""
        me = threading.current_thread()
        with self._owner_lock:
            if self._owner is None:
                self._owner = me.ident
                self._owner_name = me.name
                return
        raise RuntimeError(
            f"a SyncClient may be used by one thread only: this one belongs to thread "
            f"{self._owner_name!r}, the first to send on it, and {me.name!r} tried to use "
            "it; create one SyncClient per thread"
        )

    # ------------------------------------------------------------------ receiving

    def _stream_part(self, frames: list[bytes]) -> None:
        msg = parse_part(frames)
        if msg is not None:
            queue = self.stream_parts.get(msg.metadata[0])
            if queue is not None:
                queue.append(msg.data)

    def read_monitors(self) -> None:
        """Read the events waiting on the monitor (Rule SX5: a request started while no
        broker could be reached is checked against them first); never blocks.

        :raises AuthenticationFailed: the handshake with the broker failed (the client is
            closed)
        """
        if self.monitor is not None:
            self._read_monitor()

    def _read_monitor(self) -> None:
        """Apply the handshake rules to the monitor's waiting events.

        :raises AuthenticationFailed: the handshake with the broker failed (the client is
            closed)
        """
        assert self.monitor is not None
        for event, value in read_events(self.monitor):
            failure = self._watch.event(event, value)
            if failure is not None:
                self.failure = failure
                self.close()
                raise self.closed_error()
        self.unreachable()

    def pump(self, wait_max: float | None = None) -> None:
        """Wait for replies or the next deadline (whichever is first, or ``wait_max``
        seconds if given and sooner) and handle them.

        :raises AuthenticationFailed: the handshake with the broker failed (the client is
            closed)
        """
        if self.closed:
            raise self.closed_error()
        if threading.get_ident() != self._owner:
            self._claim()
        tracker = self.tracker
        deadline = tracker.next_deadline()
        if deadline is None:
            wait_ms = None
        else:
            wait_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
        if wait_max is not None:
            most = math.ceil(wait_max * 1000)
            wait_ms = most if wait_ms is None else min(wait_ms, most)
        ready = dict(self.poller.poll(wait_ms))
        if self.monitor is not None and self.monitor in ready:
            self._read_monitor()
        if ready:
            sock = self.sock
            done = self.done
            receive = tracker.receive
            watch = self._watch
            for _ in range(self._batch):
                frames = try_recv(sock)
                if frames is None:
                    break
                watch.heard = watch.handshakes  # handshakes Rule H5
                if self.stream_parts and is_stream(frames):
                    self._stream_part(frames)  # dcp streams (streams.py)
                    continue
                if self.subscriptions and deliver(self.subscriptions, frames):
                    continue
                resolved = receive(frames)
                if resolved is not None:
                    done[resolved[0]] = resolved[1]
        deadline = tracker.next_deadline()
        if deadline is not None:
            now = time.monotonic()
            if deadline <= now:
                self._expire(now)

    def _expire(self, now: float) -> None:
        tracker = self.tracker
        tracker.expire(now)
        out, events = tracker.drain()
        if out and self._watch.unheard():
            # Handshakes Rule H5 (Rule SX3): a secure broker ignores this connection.
            self._watch.heard = self._watch.handshakes
            self.sock.disconnect(self._endpoint)
            self.sock.connect(self._endpoint)
        for frames in out:
            if try_send(self.sock, frames) is not None:  # full (dcp._io.errors Rule Z1)
                tracker.resends_dropped += 1
        done = self.done
        for event in events:
            done[event.request_id] = event.error


def refuse_in_event_loop() -> None:
    """Rule SX4: raise :exc:`RuntimeError` if this thread runs an asyncio or trio event loop
    (neither is imported for it).

    :raises RuntimeError: it does
    """
    asyncio = sys.modules.get("asyncio")
    # asyncio's own exception-free check (get_running_loop raises): this is per request.
    if asyncio is not None and asyncio._get_running_loop() is not None:  # noqa: SLF001
        running = "an asyncio event loop"
    else:
        # trio.run names itself in sniffio's thread-local (trio depends on sniffio): cheaper
        # than trio.lowlevel.in_trio_run().
        sniffio = sys.modules.get("sniffio") if "trio" in sys.modules else None
        if sniffio is None or sniffio.thread_local.name != "trio":
            return
        running = "trio"
    raise RuntimeError(
        f"dcp.SyncClient blocks, and this thread runs {running}: use dcp.Client "
        "(async with dcp.Client(...) as client: await client.request(...)) here, or the "
        "SyncClient from another thread (e.g. anyio.to_thread.run_sync)"
    )
