"""The worker's connection to the broker: its DEALER socket and the handshake monitor
watching it (:mod:`dcp._io.handshake`), the connection events applied to the core, and
sending.

Rules:

1. One connection at a time, with a fresh random routing id (a secure broker refuses
   zmq-generated, guessable ones); each new connection has a new monitor, read by a task
   of its own (:func:`watch_monitor`) that wakes the worker when events came.
2. The monitor is also read, without blocking, before anything is sent
   (:func:`poll_monitor`): an answer finished after the connection dropped is not queued
   for a broker that does not know us (the core's Rule 12: register again first).
3. A failed handshake ends serving (:exc:`~dcp.AuthenticationFailed`, logged once); a lost
   connection cancels the streams (whoever answers next has not heard of them); a new
   connection after the first is logged and re-registers.
4. Closing stops the monitor before closing its socket (libzmq's I/O thread would block on
   the monitor's last events otherwise, dcp/_client/receive.py), then the socket with the given
   linger (after a graceful leave: long enough for the last replies and the RECONNECT).
5. A send that fails is counted and logged, never raised; a stream part waits while zmq's
   queue is full (1 ms, doubling up to 50 ms) and is dropped without a connection.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import anyio
import zmq

from dcp._core.client.calls import make_routing_id
from dcp._io.handshake import HandshakeWatch, connect_dealer, read_events
from dcp._io.sockets import AsyncSocket
from dcp.wire.dcp1 import serialize
from dcp.wire.messages import Message

if TYPE_CHECKING:
    from dcp._worker.worker import Worker

__all__ = [
    "close_connection",
    "open_connection",
    "poll_monitor",
    "send_message",
    "send_part",
    "watch_monitor",
]

logger = logging.getLogger("dcp.worker")

_POLLIN = int(zmq.POLLIN)


def open_connection(worker: Worker) -> None:
    # An explicit random id: a secure broker refuses zmq-generated (guessable) ones.
    sock, mon = connect_dealer(
        worker._context, make_routing_id(), worker._security, worker.endpoint
    )
    worker._asock = AsyncSocket(sock)
    worker._monitor = mon
    worker._handshakes = 0
    worker._watch = HandshakeWatch(
        worker.endpoint, secure=worker._security is not None, role="worker"
    )
    assert worker._tg is not None
    worker._watch_scope = scope = anyio.CancelScope()
    worker._amonitor = AsyncSocket(mon)
    worker._tg.start_soon(watch_monitor, worker, scope, worker._amonitor)


async def watch_monitor(worker: Worker, scope: anyio.CancelScope, amon: AsyncSocket) -> None:
    """Apply the socket's connection events as they come (see :func:`poll_monitor`)."""
    with scope:
        try:
            while True:
                await amon.wait_readable()
                if poll_monitor(worker):
                    worker._wake()
        except (anyio.ClosedResourceError, zmq.ZMQError):  # pragma: no cover - _close
            pass


def poll_monitor(worker: Worker) -> bool:
    """Apply the connection events waiting on the monitor, without blocking; whether
    there were any. A failed handshake ends serving (:exc:`AuthenticationFailed`); a
    lost and a new connection go to the core (its Rule 12: register again before
    anything else is sent). Called before anything is sent, so that an answer finished
    after the connection dropped is not queued for a broker that does not know us."""
    mon = worker._monitor
    if mon is None or not int(mon.getsockopt(zmq.EVENTS)) & _POLLIN:
        return False  # nothing waiting (cheaper than the zmq.Again of a failed read)
    events = read_events(mon)
    core = worker._core
    for event, value in events:
        failure = worker._watch.event(event, value)
        if failure is not None:
            if worker._refused is None:
                logger.error("worker for service %r: %s", worker.service, failure)
                worker._refused = failure
        elif event == zmq.EVENT_DISCONNECTED:
            core.connection_lost(anyio.current_time())
            worker._streams.cancel_all()  # whoever answers next has not heard of them
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            worker._handshakes += 1
            if worker._handshakes > 1:
                logger.info(
                    "worker for service %r: new connection to %s; registering",
                    worker.service,
                    worker.endpoint,
                )
                core.reconnected(anyio.current_time())
    return bool(events)


def close_connection(worker: Worker, linger: int) -> None:
    scope, worker._watch_scope = worker._watch_scope, None
    if scope is not None:
        scope.cancel()
    mon, worker._monitor = worker._monitor, None
    amon, worker._amonitor = worker._amonitor, None
    asock, worker._asock = worker._asock, None
    if mon is not None and asock is not None and not asock.sock.closed:
        with contextlib.suppress(zmq.ZMQError):
            asock.sock.disable_monitor()
    if amon is not None:
        amon.close(0)  # tells the event loop first (its fd may be waited on)
    elif mon is not None:  # pragma: no cover - both are set together
        mon.close(0)
    if asock is not None:
        asock.close(linger)


def send_message(worker: Worker, message: Message) -> None:
    asock = worker._asock
    if asock is None:  # pragma: no cover - the core only sends while connected
        return
    try:
        asock.send_nowait(serialize(message, width=worker._core.width))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("to broker %s: %s", worker.endpoint, type(message).__name__)
    except zmq.ZMQError as exc:
        worker._send_failures += 1
        logger.warning("could not send %s to broker: %s", type(message).__name__, exc)


async def send_part(worker: Worker, frames: list[bytes]) -> None:
    """Send a stream's part, waiting while zmq's queue is full (dropped if there is no
    connection: the broker has ended the stream then)."""
    pause = 0.001
    while (asock := worker._asock) is not None:
        try:
            asock.send_nowait(frames)
            return
        except zmq.Again:
            await anyio.sleep(pause)
            pause = min(2 * pause, 0.05)
        except zmq.ZMQError as exc:
            worker._send_failures += 1
            logger.warning("could not send a stream part to broker: %s", exc)
            return
