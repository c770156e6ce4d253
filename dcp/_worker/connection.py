"""The worker's connection to the broker (:class:`Connection`): its DEALER socket and the
handshake monitor watching it (:mod:`dcp._io.handshake`), the connection events given to the
core, and sending.

Rules:

Rule WC1 - One connection at a time, with a fresh random routing id (a secure broker refuses
   zmq-generated, guessable ones); each new connection has a new monitor, read by a task
   of its own (:meth:`Connection.open`) that wakes the worker when events came.
Rule WC2 - The monitor is also read, without blocking, before anything is sent
   (:meth:`Connection.poll`): an answer finished after the connection dropped is not queued
   for a broker that does not know us (the core's Rule W12: register again first).
Rule WC3 - A failed handshake ends serving (:exc:`~dcp.AuthenticationFailed`, logged once); a lost
   connection cancels the streams (whoever answers next has not heard of them); a new
   connection after the first is logged and re-registers.
Rule WC4 - Closing stops the monitor before closing its socket (libzmq's I/O thread would block on
   the monitor's last events otherwise, dcp/_client/receive.py), then the socket with the given
   linger (after a graceful leave: long enough for the last replies and the RECONNECT).
Rule WC5 - A send that fails is counted and logged, never raised; a stream part waits while zmq's
   queue is full (1 ms, doubling up to 50 ms) and is dropped without a connection.
Rule WC6 - What the core sends (answers, forwards, HELD notices, registrations, heartbeats) is
   never dropped for a full queue while the connection lives: it waits, in order, and so
   does everything sent after it, retried by a task of the connection's (1 ms, doubling up
   to 50 ms). A send that succeeds costs what it did (one test more). The bound: the
   connection is lost (the monitor says so, Rule WC2; or the core's liveness closes it,
   core Rule W6), or nothing of what waits could go for the broker's liveness (``L x I``
   seconds: a broker that reads nothing of ours for that long is treated as gone for those
   messages). Then what waits is dropped, counted (``send_failures``) and logged once;
   the answers among them are kept by the core for a replay (core Rule W13), the whole
   window of it: a connection found full lately is reported lost as ``congested``.
Rule WC7 - Replayed answers (the core's :class:`~dcp._core.worker.outputs.Replays`) are best
   effort and never delay a fresh answer: none is sent while something waits (Rule WC6),
   at most half the socket's send high-water mark of them at once (the rest of the queue
   stays for fresh answers: zmq sees the peer's progress only every millisecond or so, so a
   burst beyond the mark is refused however fast the broker reads), and none once the
   queue refuses one; the rest are dropped and counted (``replays_dropped``; logged once a
   burst at INFO).
Rule WC8 - A refused connection is said at once: a connection attempt that fails (nothing
   listens at a tcp port or ipc path: the monitor's ``CLOSED`` then ``CONNECT_RETRIED``,
   :data:`~dcp._io.handshake.ATTEMPT_EVENTS`) logs one WARNING naming the endpoint and
   saying that the worker keeps trying (a worker started before its broker is normal);
   later failures say nothing until a handshake has succeeded (on any socket of this
   connection's), then the next is said again. While it stands (:attr:`Connection.refused`)
   the worker's own reconnections after its liveness are logged at DEBUG, not as a silent
   broker.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence

import anyio
import anyio.abc
import zmq

from dcp._core.client.calls import make_routing_id
from dcp._core.worker.core import WorkerCore
from dcp._errors import AuthenticationFailed
from dcp._io.errors import FULL, socket_errors
from dcp._io.handshake import ATTEMPT_EVENTS, HandshakeWatch, connect_dealer, read_events
from dcp._io.security import CurveClient
from dcp._io.sockets import AsyncSocket
from dcp._worker.streams import WorkerStreams
from dcp.wire.messages import MessageType

__all__ = ["Connection"]

logger = logging.getLogger("dcp.worker")

_POLLIN = int(zmq.POLLIN)


class Connection:
    """A worker's connection to its broker (the module's rules).

    :param core: the worker's core, told of lost and new connections
    :param streams: the worker's streams, cancelled when the connection is lost
    :param endpoint: the broker's endpoint (:meth:`open` may be given the resolved one)
    :param services: the worker's services, for log messages (``'a', 'b'``)
    :param context: zmq context (default: one shared per process)
    :param security: CURVE keys (default: no security)
    :param wake: called when the monitor's task has applied events (the serving task
        looks again)
    """

    def __init__(
        self,
        core: WorkerCore,
        streams: WorkerStreams,
        *,
        endpoint: str,
        services: str,
        context: zmq.Context[zmq.Socket[bytes]] | None,
        security: CurveClient | None,
        wake: Callable[[], None],
    ) -> None:
        self._core = core
        self._streams = streams
        self.endpoint = endpoint
        self._services = services
        self._context = context
        self._security = security
        self._wake = wake
        #: The current connection's socket (``None`` between connections).
        self.socket: AsyncSocket | None = None
        #: Why serving must end: a failed handshake (Rule WC3), else ``None``.
        self.failure: AuthenticationFailed | None = None
        #: Messages the socket refused to send (Rule WC5), or dropped after waiting (WC6).
        self.send_failures = 0
        #: Replayed answers not sent: no room in the queue (Rule WC7).
        self.replays_dropped = 0
        #: Messages waiting for room in zmq's queue, oldest first (Rule WC6), since when.
        self._waiting: deque[list[bytes]] = deque()
        self._waiting_since = 0.0
        #: When a send last found the queue full (Rule WC6: ``congested``).
        self._full_at = -math.inf
        #: Replays sent at most at once (Rule WC7; set per socket).
        self._replay_budget = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._amonitor: AsyncSocket | None = None
        self._watch_scope: anyio.CancelScope | None = None
        self._watch = HandshakeWatch(endpoint, secure=security is not None, role="worker")
        #: Handshakes that succeeded on the current socket (the first is the first connection).
        self._handshakes = 0
        #: Rule WC8: a refused attempt was logged and no handshake has succeeded since.
        self.refused = False
        #: Rule WC8: the last event was a connection attempt's descriptor closed (``CLOSED``).
        self._attempt_closed = False

    def open(self, tg: anyio.abc.TaskGroup) -> AsyncSocket:
        """Connect a new socket (Rule WC1), its monitor read by a task started in ``tg``."""
        # An explicit random id: a secure broker refuses zmq-generated (guessable) ones.
        sock, mon = connect_dealer(
            self._context,
            make_routing_id(),
            self._security,
            self.endpoint,
            events=ATTEMPT_EVENTS,
        )
        self.socket = asock = AsyncSocket(sock)
        self._monitor = mon
        self._tg = tg
        hwm = int(sock.getsockopt(zmq.SNDHWM))
        self._replay_budget = hwm // 2 if hwm > 0 else 1 << 30
        self._handshakes = 0
        self._attempt_closed = False
        self._watch = HandshakeWatch(
            self.endpoint, secure=self._security is not None, role="worker"
        )
        self._watch_scope = scope = anyio.CancelScope()
        self._amonitor = AsyncSocket(mon)
        tg.start_soon(self._watch_monitor, scope, self._amonitor)
        return asock

    async def _watch_monitor(self, scope: anyio.CancelScope, amon: AsyncSocket) -> None:
        """Apply the socket's connection events as they come (see :meth:`poll`)."""
        # close() ends it: the scope is cancelled, the monitor closed under it.
        with scope, socket_errors(), contextlib.suppress(anyio.ClosedResourceError):
            while True:
                await amon.wait_readable()
                if self.poll():
                    self._wake()

    def poll(self) -> bool:
        """Apply the connection events waiting on the monitor, without blocking; whether
        there were any. A failed handshake ends serving (:attr:`failure`); a lost and a new
        connection go to the core (its Rule W12: register again before anything else is
        sent). Called before anything is sent, so that an answer finished after the
        connection dropped is not queued for a broker that does not know us (Rule WC2). A
        refused attempt is logged (Rule WC8), and not counted as an event."""
        mon = self._monitor
        if mon is None or not int(mon.getsockopt(zmq.EVENTS)) & _POLLIN:
            return False  # nothing waiting (cheaper than the zmq.Again of a failed read)
        events = read_events(mon)
        core = self._core
        applied = False
        for event, value in events:
            if event == zmq.EVENT_CLOSED or event == zmq.EVENT_CONNECT_RETRIED:
                self._attempt(event)
                continue
            self._attempt_closed = False
            applied = True
            failure = self._watch.event(event, value)
            if failure is not None:
                if self.failure is None:
                    logger.error("worker for %s: %s", self._services, failure)
                    self.failure = failure
            elif event == zmq.EVENT_DISCONNECTED:
                now = anyio.current_time()
                congested = bool(self._waiting) or now - self._full_at < self._liveness()
                self._drop_waiting("the connection was lost")
                core.connection_lost(now, congested=congested)
                self._streams.cancel_all()  # whoever answers next has not heard of them
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.refused = False  # Rule WC8: the next refusal is said again
                self._handshakes += 1
                if self._handshakes > 1:
                    logger.info(
                        "worker for %s: new connection to %s; registering",
                        self._services,
                        self.endpoint,
                    )
                    core.reconnected(anyio.current_time())
        return applied

    def _attempt(self, event: int) -> None:
        """Rule WC8: ``CLOSED`` then ``CONNECT_RETRIED`` is a failed connection attempt
        (a ``CONNECT_RETRIED`` after a ``DISCONNECTED`` is not)."""
        if event == zmq.EVENT_CLOSED:
            self._attempt_closed = True
            return
        if not self._attempt_closed:
            return
        self._attempt_closed = False
        if not self.refused:
            self.refused = True
            logger.warning(
                "worker for %s: the connection to %s was refused (is a dcp broker running "
                "there?); still trying",
                self._services,
                self.endpoint,
            )

    def close(self, linger: int) -> None:
        """Close the monitor, then the socket with ``linger`` ms (Rule WC4). Idempotent."""
        scope, self._watch_scope = self._watch_scope, None
        if scope is not None:
            scope.cancel()
        mon, self._monitor = self._monitor, None
        amon, self._amonitor = self._amonitor, None
        asock, self.socket = self.socket, None
        self._drop_waiting("the connection was closed")
        if mon is not None and asock is not None and not asock.sock.closed:
            with socket_errors():
                asock.sock.disable_monitor()
        if amon is not None:
            amon.close(0)  # tells the event loop first (its fd may be waited on)
        elif mon is not None:  # pragma: no cover - both are set together
            mon.close(0)
        if asock is not None:
            asock.close(linger)

    def send(self, frames: list[bytes]) -> None:
        """Send one message the core made, now, or after those waiting for room (Rule WC6;
        Rule WC5: a failure is counted and logged)."""
        asock = self.socket
        if asock is None:  # pragma: no cover - the core only sends while connected
            return
        if self._waiting:  # Rule WC6: in order, after what waits
            self._waiting.append(frames)
            return
        try:
            refused = asock.try_send(frames)
        except anyio.BrokenResourceError as exc:  # the socket's own (dcp._io.errors Rule Z2)
            refused = str(exc.__cause__ or exc)
        if refused is None:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("to broker %s: %s", self.endpoint, _type_name(frames))
            return
        if refused == FULL and self._tg is not None:  # Rule WC6: wait for room
            self._waiting.append(frames)
            self._full_at = self._waiting_since = anyio.current_time()
            self._tg.start_soon(self._send_waiting, asock)
            return
        self.send_failures += 1
        logger.warning("could not send %s to broker: %s", _type_name(frames), refused)

    def send_replays(self, messages: Sequence[list[bytes]]) -> None:
        """Send replayed answers while the queue has room, the rest dropped and counted
        (Rule WC7)."""
        asock = self.socket
        sent = 0
        if asock is not None and not self._waiting:
            budget = self._replay_budget
            for frames in messages:
                if sent >= budget:
                    break
                try:
                    refused = asock.try_send(frames)
                except anyio.BrokenResourceError:  # the socket's own (dcp._io.errors Rule Z2)
                    break
                if refused is not None:
                    break
                sent += 1
        dropped = len(messages) - sent
        if dropped:
            self.replays_dropped += dropped
            logger.info(
                "replayed %d of %d answers to broker %s; %d dropped (no room to send them)",
                sent,
                len(messages),
                self.endpoint,
                dropped,
            )

    def _liveness(self) -> float:
        core = self._core
        return core.liveness * core.heartbeat_interval

    def _drop_waiting(self, why: str) -> None:
        """Rule WC6: what waits for room can no longer go (counted, logged once)."""
        waiting = self._waiting
        if waiting:
            self.send_failures += len(waiting)
            logger.warning(
                "could not send %d message(s) to broker %s: %s while they waited for room",
                len(waiting),
                self.endpoint,
                why,
            )
            waiting.clear()

    async def _send_waiting(self, asock: AsyncSocket) -> None:
        """Rule WC6: send what waits as the queue makes room, while the connection lives."""
        waiting = self._waiting
        pause = 0.001
        while waiting and self.socket is asock:
            await anyio.sleep(pause)  # the queue is full (dcp._io.errors Rule Z1)
            pause = min(2 * pause, 0.05)
            self.poll()  # Rule WC2: a lost connection drops what waits
            if self.socket is not asock:
                return
            while waiting:
                try:
                    refused = asock.try_send(waiting[0])
                except anyio.BrokenResourceError as exc:  # dcp._io.errors Rule Z2
                    self._drop_waiting(str(exc.__cause__ or exc))
                    return
                if refused is None:
                    waiting.popleft()
                    pause = 0.001
                    self._waiting_since = anyio.current_time()
                elif refused == FULL:
                    now = anyio.current_time()
                    self._full_at = now
                    if now - self._waiting_since >= self._liveness():
                        self._drop_waiting("the broker read nothing for its liveness")
                    break
                else:
                    self.send_failures += 1
                    logger.warning(
                        "could not send %s to broker: %s", _type_name(waiting[0]), refused
                    )
                    waiting.popleft()

    async def send_part(self, frames: list[bytes]) -> None:
        """Send a stream's part, waiting while zmq's queue is full (dropped if there is no
        connection: the broker has ended the stream then)."""
        pause = 0.001
        while (asock := self.socket) is not None:
            try:
                refused = asock.try_send(frames)
            except anyio.BrokenResourceError as exc:  # dcp._io.errors Rule Z2
                self.send_failures += 1
                logger.warning("could not send a stream part to broker: %s", exc.__cause__)
                return
            if refused is None:
                return
            await anyio.sleep(pause)  # the queue is full (dcp._io.errors Rule Z1)
            pause = min(2 * pause, 0.05)


def _type_name(frames: list[bytes]) -> str:
    """The name of the message type of ``frames`` (as the core built them), for logs."""
    return MessageType(int.from_bytes(frames[2], "little")).name.title()
