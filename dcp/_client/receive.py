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
   One broker only: a client of several never lends its sockets.
Rule RX6 - Several brokers (:mod:`dcp._core.client.brokers` decides, Rules BK1-BK6): one socket
   per broker (same routing id, zmq heartbeats, messages queued only on a connected pipe),
   each read by its own task as Rule RX2 says; the first socket's task also runs the
   deadlines (the tracker's and the moves'). A first attempt goes through the broker the
   brokers choose (none live: it is parked, and sent through the first that comes back);
   a resend, a probe and a move likewise. A HELD notice is handed to the brokers, never to
   the tracker. A stream stays on its broker: a lost broker ends it with
   :exc:`~dcp.StreamBroken`; its credit and cancel go to that broker. A question put to one
   broker (``services()`` asks each) stays there too: a lost broker ends it with a
   :exc:`~dcp.RemoteError` ``broker_lost``.
Rule RX7 - Unreachable brokers (a client with ``wait_for_broker=False``): the client sets
   :attr:`Receiver.refusing` (true while every broker is unreachable, handshakes Rule H6);
   the handshake watches call :meth:`Receiver.unreachable` after each read of events that
   leaves theirs so, which ends every pending request with the tracker's Rule RT9 (the
   request reading the socket, Rule RX5, is woken), and :meth:`Receiver.start` raises the
   same error while it holds. ``None`` (the default): the client waits for its broker.
   A request so ended is not delivered later: if requests were started since the last time,
   each socket drops what zmq queued for its endpoint
   (:meth:`~dcp._io.sockets.AsyncSocket.drop_queued`), so a broker that starts listening
   there afterwards never gets them (only when requests were started: the new connection's
   first attempt is refused at once, and each drop would bring the next).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import anyio
import anyio.lowlevel
import zmq

from dcp._client.subscriptions import SubscriptionState, deliver
from dcp._client.waiters import Event, Sink, StreamWaiter, Waiter, deliver_part, loop_event
from dcp._core.client.brokers import Brokers, held_request
from dcp._core.client.calls import Timing
from dcp._core.client.tracker import RequestTracker
from dcp._errors import AuthenticationFailed, RemoteError
from dcp._io.clock import loop_clock
from dcp._io.errors import socket_errors
from dcp._io.handshake import HandshakeWatch
from dcp._io.lifecycle import ki_protected
from dcp._io.sockets import AsyncSocket
from dcp._models import Outcome, Response
from dcp.wire.messages import HELD_MARKER
from dcp.wire.options import REQUEST_ID_PREFIX
from dcp.wire.streams import is_stream

__all__ = ["SETTLE", "Receiver", "Start"]

logger = logging.getLogger("dcp.client")

# Waiting out a full send queue (zmq high-water mark): first pause and largest pause.
_SEND_PAUSE = 0.001
_SEND_PAUSE_MAX = 0.05
#: Rule RX5: the longest the socket stays free (unread) after a reading request left it.
_LEND = 0.05
#: Rule RX6: seconds after the sockets were connected during which
#: :meth:`Receiver.wait_connected` waits for each broker's first handshake.
SETTLE = 1.0
#: Who reads the socket (Rule RX5): the receive task, a request (``Receiver._caller``), nobody.
_RECEIVER, _CALLER, _FREE = 0, 1, 2
#: Where a request's id is in its frames (``"" DGBX T service "" id``: tracker Rule RT1).
_ID_AT = 5
#: The monitor events that lose a broker (Rule BK2 of dcp._core.client.brokers).
_LOST_EVENTS = frozenset(
    (
        zmq.EVENT_DISCONNECTED,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    )
)

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
        #: The deadline of the reader's last wait on the (first) socket: a request due no
        #: earlier need not move it (``inf``: none).
        self._due = math.inf
        #: The receive task's wait while the socket is lent (``None``: not parked).
        self._park: anyio.CancelScope | None = None
        #: What a waiter waits on (the event loop's own event class; set on attach).
        self.new_event: Callable[[], Event] = anyio.Event
        #: Rule RX6: the brokers' choices (``None``: one broker), their sockets and watches.
        self.brokers: Brokers | None = None
        self.sockets: list[AsyncSocket] = []
        self._watches: list[HandshakeWatch] = []
        #: Rule RX6: the broker of each stream forgotten before its cancel was sent.
        self._stream_ends: dict[bytes, int] = {}
        #: When the sockets were connected (the event loop's clock; several brokers).
        self.attached_at = 0.0
        #: Set when no broker is still making its first connection (:meth:`wait_connected`).
        self._connected: Event | None = None
        #: Rule RX7: whether no broker can be reached (``None``: the client waits for one).
        self.refusing: Callable[[], bool] | None = None
        #: Rule RX7: the tracker's count of requests when zmq's queues were last emptied.
        self._dropped_at = -1

    def attach(self, socket: AsyncSocket, watch: HandshakeWatch, endpoint: str) -> None:
        """Take the client's socket, connected to ``endpoint`` (on entry, in the event loop)."""
        self.socket = socket
        self._watch = watch
        self._endpoint = endpoint
        self._now = loop_clock()
        self.new_event = loop_event()
        self._lend()  # nothing pending yet (Rule RX5)

    def attach_brokers(
        self, sockets: list[AsyncSocket], watches: list[HandshakeWatch], brokers: Brokers
    ) -> None:
        """Take the sockets of a client of several brokers (Rule RX6), one per endpoint of
        ``brokers``, in order; the receive task (:meth:`run`) reads the first, one
        :meth:`run_broker` task each of the others."""
        self.sockets = sockets
        self._watches = watches
        self.brokers = brokers
        self.attached_at = anyio.current_time()
        self.socket = sockets[0]
        self._endpoint = ", ".join(brokers.endpoints)
        self._now = loop_clock()
        self.new_event = loop_event()

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
        :raises BrokerUnreachable: no broker can be reached (Rule RX7)
        """
        if self.closed:
            raise self.closed_error()
        if self.socket is None:
            raise RuntimeError("use 'async with Client(...)' before sending requests")
        tracker = self.tracker
        refusing = self.refusing
        if refusing is not None and refusing():  # Rule RX7
            raise tracker.unreachable_error()
        rid = tracker.request(service, data, self._now(), metadata=metadata, timing=timing)
        (frames,), _ = tracker.drain()  # the request's first attempt; sent by send()
        self.waiters[rid] = waiter
        due = tracker.deadline_of(rid)
        if due < self._due:  # the reader's wait must end sooner (the common due is later)
            self._due = due
            self.socket.move_deadline(due)
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
                due = self._due = math.inf if deadline is None else deadline
                await asock.wait_readable(due)
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
            failure = self._failure(asock, exc, "dcp client request failed reading its reply")
        if failure is not None:
            self.shutdown(failure)

    def _failure(self, asock: AsyncSocket, exc: Exception, what: str) -> BaseException | None:
        """What ``exc``, raised while a task read ``asock``, means (Rule RX3): a zmq error is
        the socket's failure (``None`` if it was closed under us: dcp._io.errors Rule Z4);
        anything else a bug, logged as ``what``."""
        failure: BaseException | None = None

        def broken(error: BaseException) -> None:
            nonlocal failure
            if not asock.closed:
                failure = error

        try:
            with socket_errors(broken):
                _raise(exc)
        except Exception:
            logger.exception(what)
            return exc
        return failure

    @contextlib.contextmanager
    def _reading(self, asock: AsyncSocket) -> Iterator[None]:
        """Rule RX3 around a receive task's loop over ``asock``: however it ends, the client
        is shut down, with the socket's failure or a bug (logged) as the cause; a closed
        socket (or one closed under us) is no failure."""
        failure: BaseException | None = None
        try:
            yield
        except anyio.ClosedResourceError:
            pass
        except anyio.BrokenResourceError as exc:
            if not asock.closed:
                failure = exc.__cause__ or exc
        except Exception as exc:
            failure = self._failure(asock, exc, "dcp client receive task failed")
        finally:
            self.shutdown(failure)

    def end(self, rid: bytes, waiter: Waiter) -> None:
        """A ``request()`` started with :meth:`start_call` ends, answered or not (cancelled):
        forget it if it is pending (Rule RT6 of the tracker), and pass the socket on if it
        read it (Rule RX5)."""
        cancelled = self.waiters.pop(rid, None) is not None
        if cancelled:
            self.tracker.cancel(rid)
            waiter.forget()
            if self.brokers is not None:
                self.brokers.done(rid)
        if self._caller == rid:
            self._caller = None
            if cancelled or self.waiters or self.subscriptions:
                self._take_back()
            else:
                self._lend()

    async def send(self, rid: bytes, frames: list[bytes]) -> None:
        """Send a request's first attempt, pausing while zmq's queue is full (Rule RX1: until
        the tracker's next deadline for it; then the attempt counts as lost)."""
        if self.brokers is not None:
            await self._send_several(self.brokers, rid, frames)
            return
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

    async def _send_several(self, brokers: Brokers, rid: bytes, frames: list[bytes]) -> None:
        """:meth:`send` with several brokers (Rule RX6): through the broker chosen; parked
        if none is live (a stream waits as for a full queue instead)."""
        tracker = self.tracker
        movable = not isinstance(self.waiters.get(rid), StreamWaiter)
        deadline = math.inf
        pause = _SEND_PAUSE
        counted = False
        while True:
            if self.closed:
                raise self.closed_error()
            i = brokers.choose()
            if i is None and movable:
                brokers.park(rid)  # sent through the first broker back (Rule BK3)
                return
            if i is not None:
                try:
                    if self.sockets[i].try_send(frames) is None:
                        brokers.sent(rid, i, movable=movable)
                        return
                except anyio.BrokenResourceError as exc:  # dcp._io.errors Rule Z2
                    self.shutdown(exc.__cause__ or exc)
                    raise self.closed_error() from exc.__cause__
            if not counted:
                counted = True
                tracker.send_waits += 1
                deadline = tracker.deadline_of(rid)
            if anyio.current_time() >= deadline or not tracker.is_pending(rid):
                return  # the attempt counts as lost; the retry rule takes over
            await anyio.sleep(pause)
            pause = min(2 * pause, _SEND_PAUSE_MAX)

    def send_via(self, broker: int, rid: bytes, frames: list[bytes]) -> bool:
        """Send a request through broker ``broker`` only, where it stays (a question to each
        broker: Rule RX6); ``False`` if that broker is not live or its queue is full (not
        sent).

        :raises anyio.ClosedResourceError: the client is closed (or the error that broke it)
        """
        brokers = self.brokers
        assert brokers is not None
        if self.closed:
            raise self.closed_error()
        if not brokers.is_live(broker):
            return False
        try:
            sent = self.sockets[broker].try_send(frames) is None
        except anyio.BrokenResourceError as exc:  # dcp._io.errors Rule Z2
            self.shutdown(exc.__cause__ or exc)
            raise self.closed_error() from exc.__cause__
        if sent:
            brokers.sent(rid, broker, movable=False)
        return sent

    async def ask_at(
        self,
        broker: int,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> Response:
        """A request sent once through broker ``broker`` only, where it stays (Rule RX6: a
        question to each broker); its response.

        :raises RemoteError: its error reply, or ``broker_lost`` (that broker is not live,
            its queue is full, or it was lost before answering)
        :raises RequestTimeout: no answer in time
        """
        waiter = Waiter()
        rid, frames = self.start(service, data, metadata, timing, waiter)
        try:
            if not self.send_via(broker, rid, frames):
                assert self.brokers is not None
                endpoint = self.brokers.endpoints[broker]
                raise RemoteError("broker_lost", f"the broker at {endpoint} is not connected")
            await waiter.wait(self.new_event)
        finally:
            self.end(rid, waiter)
        return self.result(waiter.outcome)

    def live_socket(self) -> AsyncSocket | None:
        """The socket a message that is not a request goes through (a publish): the only
        one, or a live broker's (Rule RX6; ``None``: none is live)."""
        brokers = self.brokers
        if brokers is None:
            return self.socket
        i = brokers.choose()
        return None if i is None else self.sockets[i]

    def send_nowait(self, frames: list[bytes]) -> None:
        """Send a message that is not a request (a stream's credit or cancel) at once
        (several brokers: to the stream's broker, Rule RX6; dropped if it is gone).

        :raises zmq.Again: the send queue is full (the message is not sent)
        """
        if self.brokers is not None:
            rid = next((f for f in frames if f.startswith(REQUEST_ID_PREFIX)), b"")
            i = self._stream_ends.pop(rid, None)
            if i is None:
                i = self.brokers.where(rid)
            if i is None or not self.brokers.is_live(i):
                return  # the stream's broker is gone, and the stream with it
            self.sockets[i].send_nowait(frames)
            return
        assert self.socket is not None
        self.socket.send_nowait(frames)

    def forget(self, rids: Iterable[bytes]) -> None:
        """Stop waiting for these requests (Rule RT6 of the tracker: a late reply is dropped)."""
        waiters = self.waiters
        tracker = self.tracker
        brokers = self.brokers
        for rid in rids:
            waiter = waiters.pop(rid, None)
            if waiter is not None:
                tracker.cancel(rid)
                if brokers is not None:
                    i = brokers.where(rid)
                    if isinstance(waiter, StreamWaiter) and i is not None:
                        self._stream_ends[rid] = i  # for its cancel (Rule RX6)
                    brokers.done(rid)

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
        next_deadline = self.tracker.next_deadline
        read = self._read
        lend = True
        if self.brokers is not None:  # Rule RX6: this task reads the first socket
            next_deadline = self._next_deadline
            read = self._read_first
            lend = False

        with self._reading(asock):
            while True:
                if self._reader != _RECEIVER:
                    await self._parked()
                    if self.closed:
                        break
                    continue
                deadline = next_deadline()
                due = self._due = math.inf if deadline is None else deadline
                await asock.wait_readable(due)
                if asock.closed:
                    break
                read(asock, self._batch)
                if lend and not self.waiters and not self.subscriptions:
                    self._lend()  # Rule RX5: nothing pending
                # Let other tasks run between batches, however busy the socket is. (With
                # no input left, wait_readable parks, which lets them run: no extra pass.)
                elif asock.has_input():
                    await anyio.lowlevel.checkpoint()

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

    # ------------------------------------------------------------------ several brokers

    @ki_protected  # dcp._io.lifecycle Rule E6
    async def run_broker(self, i: int) -> None:
        """The receive task of broker ``i``'s socket (``i`` > 0; Rule RX6), as :meth:`run`
        (Rules RX2 and RX3); the deadlines are the first socket's task's."""
        asock = self.sockets[i]
        with self._reading(asock):
            while True:
                await asock.wait_readable()
                if asock.closed:
                    break
                self._read_several(i, self._batch)
                if asock.has_input():
                    await anyio.lowlevel.checkpoint()

    def broker_event(self, i: int, event: int) -> None:
        """A monitor event of broker ``i``'s socket (Rule RX6): its handshake succeeded (it is
        live: send what was parked) or it is lost (end its streams; its requests move after
        the grace)."""
        brokers = self.brokers
        if brokers is None or self.closed:
            return
        now = self._now()
        endpoint = brokers.endpoints[i]
        try:
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if brokers.info()[i].lost:
                    logger.info("dcp client: the broker at %s is back", endpoint)
                for rid in brokers.up(i):
                    self._move(brokers, rid, now)
                for state in self.subscriptions.values():  # pubsub Rule CP5
                    state.broker_up(i)
            elif event in _LOST_EVENTS:
                if brokers.is_live(i):
                    logger.warning(
                        "dcp client: lost the broker at %s; its requests move to another in %.3gs",
                        endpoint,
                        brokers.grace,
                    )
                for state in self.subscriptions.values():  # pubsub Rule CP5
                    state.broker_lost(i)
                for rid in brokers.lost(i, now):  # streams and pinned questions end here
                    self.tracker.cancel(rid)
                    waiter = self.waiters.pop(rid, None)
                    if isinstance(waiter, StreamWaiter):
                        message = f"the broker at {endpoint} was lost mid-stream"
                        waiter.deliver(rid, RemoteError("stream_broken", message))
                    elif waiter is not None:
                        message = f"the broker at {endpoint} was lost"
                        waiter.deliver(rid, RemoteError("broker_lost", message))
                due = brokers.next_deadline()
                if due is not None and self.socket is not None:
                    self.socket.move_deadline(due)
        except anyio.BrokenResourceError as exc:  # dcp._io.errors Rule Z2
            self.shutdown(exc.__cause__ or exc)
        connected = self._connected
        if connected is not None and not brokers.connecting:
            self._connected = None
            connected.set()

    def unreachable(self) -> None:
        """Rule RX7: if no broker can be reached, end every pending request (tracker Rule
        RT9) and wake the request reading the socket (Rule RX5) and those waiting for the
        brokers' first connections."""
        refusing = self.refusing
        if self.closed or refusing is None or not refusing():
            return
        tracker = self.tracker
        tracker.unreachable()
        _, events = tracker.drain()
        brokers = self.brokers
        waiters = self.waiters
        for event in events:
            rid = event.request_id
            waiter = waiters.pop(rid, None)
            if brokers is not None:
                brokers.done(rid)
            if waiter is not None:
                waiter.deliver(rid, event.error)
        started = tracker.statistics().requests
        if started != self._dropped_at:  # something may wait in zmq's queues: drop it
            self._dropped_at = started
            if brokers is None:
                if self.socket is not None:
                    self.socket.drop_queued(self._endpoint)
            else:
                for asock, watch in zip(self.sockets, self._watches, strict=True):
                    asock.drop_queued(watch.endpoint)
        if self._caller is not None and self.socket is not None:
            self.socket.move_deadline(self._now())
        connected = self._connected
        if connected is not None:
            self._connected = None
            connected.set()

    async def wait_connected(self) -> None:
        """Wait until no broker is still making its first connection: each one's first
        handshake succeeded or failed (Rule BK2), for at most :data:`SETTLE` seconds after
        the sockets were connected (a broker down from the start never fails a handshake:
        zmq only retries its connection); at once with one broker."""
        brokers = self.brokers
        if brokers is None:
            return
        refusing = self.refusing
        with anyio.move_on_after(self.attached_at + SETTLE - anyio.current_time()):
            while brokers.connecting and not self.closed:
                if refusing is not None and refusing():  # Rule RX7
                    return
                event = self._connected  # shared by every task waiting: anyio's
                if event is None:
                    event = self._connected = anyio.Event()
                await event.wait()

    def _next_deadline(self) -> float | None:
        """When the tracker or the brokers next need time (Rule RX6)."""
        due = self.tracker.next_deadline()
        brokers = self.brokers
        moves = None if brokers is None else brokers.next_deadline()
        if moves is None:
            return due
        return moves if due is None else min(due, moves)

    def _read_first(self, asock: AsyncSocket, batch: int) -> None:
        """:meth:`_read` of the first broker's socket (Rule RX6)."""
        self._read_several(0, batch)

    def _read_several(self, i: int, batch: int) -> None:
        """:meth:`_read` for broker ``i``'s socket (Rule RX6): HELD notices go to the
        brokers, the outcomes end the requests there too."""
        brokers = self.brokers
        assert brokers is not None
        asock = self.sockets[i]
        tracker = self.tracker
        waiters = self.waiters
        received = asock.drain(batch)
        if received:
            watch = self._watches[i]
            watch.heard = watch.handshakes  # handshakes Rule H5
            if logger.isEnabledFor(logging.DEBUG):  # once per batch
                for msg in received:
                    logger.debug(
                        "from broker %s: %d frame(s), %d bytes",
                        brokers.endpoints[i],
                        len(msg.frames),
                        sum(len(f) for f in msg.frames),
                    )
            subscriptions = self.subscriptions
            for msg in received:
                frames = msg.frames
                if is_stream(frames):
                    deliver_part(frames, waiters)  # dcp streams (streams.py)
                    continue
                if subscriptions and deliver(subscriptions, frames):
                    continue
                if frames[-1] == HELD_MARKER:
                    held = held_request(frames)
                    if held is not None:  # brokers Rule BK5
                        brokers.hold(held)
                        continue
                resolved = tracker.receive(frames)
                if resolved is not None:
                    rid, outcome = resolved
                    brokers.done(rid)
                    waiter = waiters.pop(rid, None)
                    if waiter is not None:
                        waiter.deliver(rid, outcome)
        due = self._next_deadline()
        if due is not None:
            now = self._now()
            if due <= now:
                self._expire_several(brokers, now)

    def _expire_several(self, brokers: Brokers, now: float) -> None:
        """:meth:`_expire` with several brokers (Rule RX6): resends and probes through the
        brokers' choice; then the moves whose grace ended (Rule BK4)."""
        tracker = self.tracker
        tracker.expire(now)
        out, events = tracker.drain()
        for frames in out:
            rid = frames[_ID_AT]
            pending = tracker.is_pending(rid)  # a probe has an id of its own
            i = brokers.route(rid)
            if i is None:
                if pending:
                    brokers.park(rid)
                else:
                    tracker.resends_dropped += 1
                continue
            asock = self.sockets[i]
            watch = self._watches[i]
            if watch.unheard():  # handshakes Rule H5, as in _expire
                endpoint = brokers.endpoints[i]
                logger.warning(
                    "dcp client: the broker at %s has not answered on this connection since "
                    "it reconnected; connecting again",
                    endpoint,
                )
                watch.heard = watch.handshakes
                asock.sock.disconnect(endpoint)
                asock.sock.connect(endpoint)
            if asock.try_send(frames) is not None:  # full (dcp._io.errors Rule Z1)
                tracker.resends_dropped += 1
            elif pending:
                brokers.sent(rid, i)
        waiters = self.waiters
        for event in events:
            rid = event.request_id
            waiter = waiters.pop(rid, None)
            if isinstance(waiter, StreamWaiter):  # its CANCEL goes there (streams Rule CS4)
                i = brokers.where(rid)
                if i is not None:
                    self._stream_ends[rid] = i
            brokers.done(rid)
            if waiter is not None:
                waiter.deliver(rid, event.error)
        due = brokers.next_deadline()
        if due is not None and due <= now:
            for rid in brokers.expire(now):
                self._move(brokers, rid, now)

    def _move(self, brokers: Brokers, rid: bytes, now: float) -> None:
        """Send ``rid`` through the broker chosen now (a move or a parked request: Rules BK3
        and BK4; tracker Rule RT8), or park it if none is live."""
        frames = self.tracker.moved(rid, now)
        if frames is None:
            brokers.done(rid)
            return
        i = brokers.choose()
        if i is None:
            brokers.park(rid)
        elif self.sockets[i].try_send(frames) is None:
            brokers.sent(rid, i)
        else:  # full: the attempt timer resends it (Rule BK6)
            self.tracker.resends_dropped += 1

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
        for socket in self.sockets or ([] if self.socket is None else [self.socket]):
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
        connected = self._connected
        if connected is not None:
            self._connected = None
            connected.set()
        self.tracker.cancel_all()
        for state in self.subscriptions.values():
            state.close()
        waiters = list(self.waiters.items())
        self.waiters.clear()
        for rid, waiter in waiters:
            waiter.deliver(rid, None)
