"""The async client's socket: :class:`Receiver` starts requests and sends their first attempts
(waiting while zmq's send queue is full), and its receive task reads everything that arrives
(replies, stream parts, pub/sub messages) and makes the resends and timeouts the tracker's
deadlines call for.

Rules:

Rule RX1 - A first attempt that finds the queue full waits 1 ms, doubling up to 50 ms, until its
   attempt's deadline; then the attempt counts as lost and the retry rule takes over
   (counted once in ``send_waits``). A resend that finds it full is not made
   (``resends_dropped``).
Rule RX2 - One task at a time reads the socket (its *reader*, Rule RX5): it handles at most
   ``batch`` messages per wake-up, everything that arrived (replies for any caller, stream
   parts, pub/sub messages), runs the tracker's deadlines, and lets other tasks run between
   batches, however busy the socket is.
Rule RX3 - Anything but a closed socket that ends the receive task, or a request's reading
   (Rule RX5), fails every caller (the client is shut down with it as the cause) rather than
   leaving them waiting. Shutting down is idempotent; the first cause sticks.
Rule RX4 - Handshakes Rule H5: resends due on a connection the broker has not answered since it
   reconnected make a new connection first (a secure broker ignores the old one).
Rule RX5 - The reader. The receive task reads, unless the socket is lent: a ``request()``
   that starts while nothing else is pending and no subscription is open, and the socket is
   *free*, reads it itself until its own outcome arrives (one wake-up per request, no hand-off
   to the receive task), then leaves it free again. The receive task lends the socket (makes
   it free) when a batch leaves nothing pending and no subscription; it takes it back when
   any other call starts (a map, a stream, a request while another is pending), when a
   reading request ends with others pending or subscriptions open, or is cancelled, or could
   not send at once, and at the latest ``_LEND`` (50 ms) after the socket was last left
   free, so a late or duplicate reply is read and counted soon even when no call follows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence

import anyio
import anyio.lowlevel

from dcp._client.subscriptions import SubscriptionState, deliver
from dcp._client.waiters import Event, Sink, Waiter, deliver_part, loop_event
from dcp._core.client.calls import Timing
from dcp._core.client.tracker import RequestTracker
from dcp._errors import AuthenticationFailed
from dcp._io.clock import loop_clock
from dcp._io.errors import socket_errors
from dcp._io.handshake import HandshakeWatch
from dcp._io.lifecycle import ki_protected
from dcp._io.sockets import AsyncSocket
from dcp._models import Outcome, Response
from dcp.wire.streams import is_stream

__all__ = ["Receiver", "Start"]

logger = logging.getLogger("dcp.client")

# Waiting out a full send queue (zmq high-water mark): first pause and largest pause.
_SEND_PAUSE = 0.001
_SEND_PAUSE_MAX = 0.05
#: Rule RX5: the longest the socket stays free (unread) after a reading request left it.
_LEND = 0.05
#: Who reads the socket (Rule RX5): the receive task, a request (``Receiver._caller``), nobody.
_RECEIVER, _CALLER, _FREE = 0, 1, 2

#: :meth:`Receiver.start` (or a traced wrapper of it): service, data, metadata, timing,
#: waiter -> the request id and its first attempt's frames.
Start = Callable[
    [bytes, Sequence[bytes], Sequence[bytes], Timing, Waiter | Sink], tuple[bytes, list[bytes]]
]


def _raise(exc: BaseException) -> None:
    """Raise ``exc`` (in a block whose context manager decides what it means)."""
    raise exc


class Receiver:
    """The socket of one :class:`~dcp.Client` and everything waiting on it: the callers'
    waiters by request id, the subscriptions, and the tracker's deadlines (see the module
    rules). The client makes it with its tracker, gives it the socket on entry
    (:meth:`attach`) and runs :meth:`run` as its receive task.

    :param tracker: the client's request tracker
    :param batch: messages handled per wake-up (Rule RX2)
    """

    def __init__(self, tracker: RequestTracker, *, batch: int) -> None:
        #: The client's request tracker.
        self.tracker = tracker
        self._batch = batch
        #: The socket, from :meth:`attach` on (``None`` before the client is entered).
        self.socket: AsyncSocket | None = None
        #: Where each pending request's outcome goes, by request id.
        self.waiters: dict[bytes, Waiter | Sink] = {}
        #: The subscriptions messages are routed to, by subscription id.
        self.subscriptions: dict[bytes, SubscriptionState] = {}
        #: True once shut down (closed, or the socket broke).
        self.closed = False
        #: What broke the socket (``None``: closed on purpose, or not closed).
        self.broken: BaseException | None = None
        self._watch: HandshakeWatch | None = None
        self._endpoint = ""
        #: The event loop's clock (anyio.current_time without its lookup; set on attach).
        self._now: Callable[[], float] = anyio.current_time
        #: Who reads the socket (Rule RX5): ``_RECEIVER``, ``_CALLER`` or ``_FREE``.
        self._reader = _RECEIVER
        #: The id of the request reading the socket (``_CALLER``).
        self._caller: bytes | None = None
        #: When the socket was last left free (Rule RX5).
        self._freed_at = 0.0
        #: The receive task's wait while the socket is lent (``None``: not parked).
        self._park: anyio.CancelScope | None = None
        #: What a waiter waits on (the event loop's own event class; set on attach).
        self.new_event: Callable[[], Event] = anyio.Event

    def attach(self, socket: AsyncSocket, watch: HandshakeWatch, endpoint: str) -> None:
        """Take the client's socket, connected to ``endpoint`` (on entry, in the event loop)."""
        self.socket = socket
        self._watch = watch
        self._endpoint = endpoint
        self._now = loop_clock()
        self.new_event = loop_event()
        self._lend()  # nothing pending yet (Rule RX5)

    # ------------------------------------------------------------------ requests

    def start(
        self,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
        waiter: Waiter | Sink,
    ) -> tuple[bytes, list[bytes]]:
        """Start a request whose outcome goes to ``waiter``: its id and first attempt's
        frames, to :meth:`send`.

        :raises RuntimeError: the client was not entered
        :raises anyio.ClosedResourceError: the client is closed (or the error that broke it)
        """
        if self.closed:
            raise self.closed_error()
        if self.socket is None:
            raise RuntimeError("use 'async with Client(...)' before sending requests")
        tracker = self.tracker
        rid = tracker.request(service, data, self._now(), metadata=metadata, timing=timing)
        (frames,), _ = tracker.drain()  # the request's first attempt; sent by send()
        self.waiters[rid] = waiter
        self.socket.move_deadline(tracker.deadline_of(rid))
        if self._reader == _FREE:
            self._take_back()
        return rid, frames

    def start_call(
        self,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
        waiter: Waiter | Sink,
    ) -> tuple[bytes, list[bytes]]:
        """:meth:`start` for one ``request()``, which then waits with :meth:`wait` and ends
        with :meth:`end`: it reads the socket itself if it is free and nothing else is
        pending (Rule RX5)."""
        if self._reader != _FREE or self.waiters or self.subscriptions:
            return self.start(service, data, metadata, timing, waiter)
        self._reader = _CALLER
        try:
            rid, frames = self.start(service, data, metadata, timing, waiter)
        except BaseException:
            self._reader = _FREE
            raise
        self._caller = rid
        return rid, frames

    async def wait(self, rid: bytes, waiter: Waiter) -> None:
        """Wait for the outcome of the request ``rid`` started with :meth:`start_call`: read
        the socket until it comes if the request is the reader (Rule RX5), else wait for
        the reader to deliver it."""
        if self._caller != rid:
            await waiter.wait(self.new_event)
            return
        asock = self.socket
        assert asock is not None
        tracker = self.tracker
        failure: BaseException | None = None
        try:  # zmq's errors: see _failure (no socket_errors block per request)
            while not waiter.done:
                deadline = tracker.next_deadline()
                await asock.wait_readable(math.inf if deadline is None else deadline)
                # One message at a time: its reply is most often the one waiting, and a
                # drain that stops at its batch raises no zmq.Again (wait_readable reads
                # zmq.EVENTS before it parks again, as the edge-triggered FD needs).
                self._read(asock, 1)
                if not waiter.done and asock.has_input():
                    await anyio.lowlevel.checkpoint()  # Rule RX2
        except anyio.ClosedResourceError:
            return  # shut down: the waiter has its outcome (None)
        except anyio.BrokenResourceError as exc:
            failure = exc.__cause__ or exc
        except Exception as exc:
            failure = self._failure(asock, exc)
        if failure is not None:
            self.shutdown(failure)

    def _failure(self, asock: AsyncSocket, exc: Exception) -> BaseException | None:
        """What ``exc``, raised while a request read the socket, means, as the receive task's
        handlers would say: a zmq error is the socket's failure (``None`` if it was closed
        under us: dcp._io.errors Rule Z4); anything else a bug, logged."""
        failure: BaseException | None = None

        def broken(error: BaseException) -> None:
            nonlocal failure
            if not asock.closed:
                failure = error

        try:
            with socket_errors(broken):
                _raise(exc)
        except Exception:
            logger.exception("dcp client request failed reading its reply")
            return exc
        return failure

    def end(self, rid: bytes, waiter: Waiter) -> None:
        """A ``request()`` started with :meth:`start_call` ends, answered or not (cancelled):
        forget it if it is pending (Rule RT6 of the tracker), and pass the socket on if it
        read it (Rule RX5)."""
        cancelled = self.waiters.pop(rid, None) is not None
        if cancelled:
            self.tracker.cancel(rid)
            waiter.forget()
        if self._caller == rid:
            self._caller = None
            if cancelled or self.waiters or self.subscriptions:
                self._take_back()
            else:
                self._lend()

    async def send(self, rid: bytes, frames: list[bytes]) -> None:
        """Send a request's first attempt, pausing while zmq's queue is full (Rule RX1: until
        the tracker's next deadline for it; then the attempt counts as lost)."""
        tracker = self.tracker
        deadline = math.inf  # looked up only if the queue is full
        pause = _SEND_PAUSE
        counted = False
        while True:
            if self.closed:
                raise self.closed_error()
            assert self.socket is not None
            try:
                if self.socket.try_send(frames) is None:
                    return
            except anyio.BrokenResourceError as exc:  # dcp._io.errors Rule Z2
                self.shutdown(exc.__cause__ or exc)
                raise self.closed_error() from exc.__cause__
            if not counted:
                counted = True
                tracker.send_waits += 1
                deadline = tracker.deadline_of(rid)
                if self._caller == rid:  # Rule RX5: not the reader while it pauses
                    self._caller = None
                    self._take_back()
            if anyio.current_time() >= deadline or not tracker.is_pending(rid):
                return  # the attempt counts as lost; the retry rule takes over
            await anyio.sleep(pause)
            pause = min(2 * pause, _SEND_PAUSE_MAX)

    def send_nowait(self, frames: list[bytes]) -> None:
        """Send a message that is not a request (a stream's credit or cancel) at once.

        :raises zmq.Again: the send queue is full (the message is not sent)
        """
        assert self.socket is not None
        self.socket.send_nowait(frames)

    def forget(self, rids: Iterable[bytes]) -> None:
        """Stop waiting for these requests (Rule RT6 of the tracker: a late reply is dropped)."""
        waiters = self.waiters
        tracker = self.tracker
        for rid in rids:
            if waiters.pop(rid, None) is not None:
                tracker.cancel(rid)

    def result(self, outcome: Outcome | None) -> Response:
        """The response, or the failure raised (``None``: the client closed)."""
        if isinstance(outcome, Response):
            return outcome
        if outcome is None:
            raise self.closed_error()
        raise outcome

    def outcome(self, outcome: Outcome | None) -> Outcome:
        """The outcome itself, failures included; raises only if the client closed."""
        if outcome is None:
            raise self.closed_error()
        return outcome

    def closed_error(self) -> Exception:
        """What a call on the shut-down client raises."""
        if isinstance(self.broken, AuthenticationFailed):
            return AuthenticationFailed(self.broken.endpoint, self.broken.reason)
        if self.broken is not None:
            exc = anyio.BrokenResourceError(f"the client's socket failed: {self.broken!r}")
            exc.__cause__ = self.broken
            return exc
        return anyio.ClosedResourceError("the client is closed")

    # ------------------------------------------------------------------ the receive task

    @ki_protected  # dcp._io.lifecycle Rule E6
    async def run(self) -> None:
        """The receive task (Rules RX2, RX3 and RX5); ends when the socket is closed."""
        asock = self.socket
        assert asock is not None
        tracker = self.tracker
        failure: BaseException | None = None

        def broken(exc: BaseException) -> None:  # the socket failed (dcp._io.errors Z2, Z4)
            nonlocal failure
            if not asock.closed:
                failure = exc

        try:
            with socket_errors(broken):
                while True:
                    if self._reader != _RECEIVER:
                        await self._parked()
                        if self.closed:
                            break
                        continue
                    deadline = tracker.next_deadline()
                    await asock.wait_readable(math.inf if deadline is None else deadline)
                    if asock.closed:
                        break
                    self._read(asock, self._batch)
                    if not self.waiters and not self.subscriptions:
                        self._lend()  # Rule RX5: nothing pending
                    # Let other tasks run between batches, however busy the socket is. (With
                    # no input left, wait_readable parks, which lets them run: no extra pass.)
                    elif asock.has_input():
                        await anyio.lowlevel.checkpoint()
        except anyio.ClosedResourceError:
            pass
        except anyio.BrokenResourceError as exc:
            broken(exc.__cause__ or exc)
        except Exception as exc:  # a bug: fail the callers rather than hang them
            logger.exception("dcp client receive task failed")
            failure = exc
        finally:
            self.shutdown(failure)

    async def _parked(self) -> None:
        """Wait while the socket is lent (Rule RX5): until it is taken back, or until
        ``_LEND`` seconds after it was last left free, when the receive task takes it back."""
        while not self.closed:
            reader = self._reader
            if reader == _RECEIVER:
                return
            if reader == _FREE:
                due = self._freed_at + _LEND
                if self._now() >= due:
                    self._reader = _RECEIVER
                    return
            else:
                due = math.inf  # a request reads: it passes the socket on when it ends
            with anyio.CancelScope(deadline=due) as park:
                self._park = park
                try:
                    await anyio.sleep_forever()
                finally:
                    self._park = None

    def _read(self, asock: AsyncSocket, batch: int) -> None:
        """Handle at most ``batch`` messages of what arrived, then the deadlines due (Rule
        RX2)."""
        tracker = self.tracker
        waiters = self.waiters
        received = asock.drain(batch)
        if received:
            watch = self._watch
            if watch is not None:
                watch.heard = watch.handshakes  # handshakes Rule H5
            if logger.isEnabledFor(logging.DEBUG):  # once per batch
                for msg in received:
                    logger.debug(
                        "from broker %s: %d frame(s), %d bytes",
                        self._endpoint,
                        len(msg.frames),
                        sum(len(f) for f in msg.frames),
                    )
            subscriptions = self.subscriptions
            for msg in received:
                if is_stream(msg.frames):
                    deliver_part(msg.frames, waiters)  # dcp streams (streams.py)
                    continue
                if subscriptions and deliver(subscriptions, msg.frames):
                    continue
                resolved = tracker.receive(msg.frames)
                if resolved is not None:
                    rid, outcome = resolved
                    waiter = waiters.pop(rid, None)
                    if waiter is not None:
                        waiter.deliver(rid, outcome)
        deadline = tracker.next_deadline()
        if deadline is not None:
            now = self._now()
            if deadline <= now:
                self._expire(asock, now)

    def _lend(self) -> None:
        """Leave the socket free (Rule RX5); the receive task takes it back in ``_LEND``
        seconds unless a request reads it first."""
        self._reader = _FREE
        self._freed_at = self._now()
        park = self._park
        if park is not None and park.deadline == math.inf:
            park.deadline = self._freed_at + _LEND

    def _take_back(self) -> None:
        """The receive task reads the socket again (Rule RX5)."""
        self._reader = _RECEIVER
        park = self._park
        if park is not None:
            park.cancel()

    def _expire(self, asock: AsyncSocket, now: float) -> None:
        tracker = self.tracker
        tracker.expire(now)
        out, events = tracker.drain()
        watch = self._watch
        if out and watch is not None and watch.unheard():
            # Handshakes Rule H5: a secure broker ignores this connection; make a new one.
            logger.warning(
                "dcp client: the broker at %s has not answered on this connection since it "
                "reconnected; connecting again",
                self._endpoint,
            )
            watch.heard = watch.handshakes  # once per connection
            asock.sock.disconnect(self._endpoint)
            asock.sock.connect(self._endpoint)
        for frames in out:
            if asock.try_send(frames) is not None:  # full (dcp._io.errors Rule Z1)
                tracker.resends_dropped += 1
        waiters = self.waiters
        for event in events:
            rid = event.request_id
            waiter = waiters.pop(rid, None)
            if waiter is not None:
                waiter.deliver(rid, event.error)

    def shutdown(self, failure: BaseException | None) -> None:
        """Close the socket and fail every waiter (Rule RX3). Idempotent; the first cause
        sticks."""
        if not self.closed:
            self.closed = True
            self.broken = failure
        socket = self.socket
        if socket is not None:
            if not socket.closed:
                # Stop the monitor before closing: libzmq's I/O thread sends the socket's
                # last events (DISCONNECTED) to the monitor's PAIR with a blocking send; if
                # our end of that PAIR is closed first, the send blocks that thread for good
                # and every socket of the context falls silent.
                with socket_errors():
                    socket.sock.disable_monitor()
            socket.close(0)
        park = self._park
        if park is not None:
            park.cancel()
        self.tracker.cancel_all()
        for state in self.subscriptions.values():
            state.close()
        waiters = list(self.waiters.items())
        self.waiters.clear()
        for rid, waiter in waiters:
            waiter.deliver(rid, None)
