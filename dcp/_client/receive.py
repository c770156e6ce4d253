"""The async client's socket I/O: sending a request's first attempt while zmq's send queue
is full, and the receive task (replies, stream parts, pub/sub messages, and the resends and
timeouts the tracker's deadlines call for).

Rules:

1. A first attempt that finds the queue full waits 1 ms, doubling up to 50 ms, until its
   attempt's deadline; then the attempt counts as lost and the retry rule takes over
   (counted once in ``send_waits``). A resend that finds it full is not made
   (``resends_dropped``).
2. One receive task owns the socket's input: it handles at most ``batch`` messages per
   wake-up and lets other tasks run between batches, however busy the socket is.
3. Anything but a closed socket that ends the receive task fails every caller (the client
   is shut down with it as the cause) rather than leaving them waiting. Shutting down is
   idempotent; the first cause sticks.
4. Handshakes Rule H5: resends due on a connection the broker has not answered since it
   reconnected make a new connection first (a secure broker ignores the old one).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import zmq

from dcp._client.pubsub import deliver
from dcp._client.streams import deliver_part
from dcp._io.sockets import AsyncSocket
from dcp.wire.streams import is_stream

if TYPE_CHECKING:
    from dcp._client.client import Client

__all__ = ["expire", "receive_loop", "send_request", "shutdown"]

logger = logging.getLogger("dcp.client")

# Waiting out a full send queue (zmq high-water mark): first pause and largest pause.
_SEND_PAUSE = 0.001
_SEND_PAUSE_MAX = 0.05


async def send_request(client: Client, rid: bytes, frames: list[bytes]) -> None:
    """Send a request's first attempt, pausing while zmq's queue is full (until the
    tracker's next deadline for it: then the attempt counts as lost)."""
    deadline = client._tracker.deadline_of(rid)
    pause = _SEND_PAUSE
    counted = False
    while True:
        if client._closed:
            raise client._closed_error()
        assert client._socket is not None
        try:
            client._socket.send_nowait(frames)
            return
        except zmq.Again:
            pass
        except zmq.ZMQError as exc:
            shutdown(client, exc)
            raise client._closed_error() from exc
        if not counted:
            counted = True
            client._tracker.send_waits += 1
        if anyio.current_time() >= deadline or not client._tracker.is_pending(rid):
            return  # the attempt counts as lost; the retry rule takes over
        await anyio.sleep(pause)
        pause = min(2 * pause, _SEND_PAUSE_MAX)


async def receive_loop(client: Client) -> None:
    asock = client._socket
    assert asock is not None
    tracker = client._tracker
    waiters = client._waiters
    batch = client._batch
    watch = client._watch
    assert watch is not None
    failure: BaseException | None = None
    try:
        while True:
            deadline = tracker.next_deadline()
            await asock.wait_readable(math.inf if deadline is None else deadline)
            if asock.closed:
                break
            received = asock.drain(batch)
            if received:
                watch.heard = watch.handshakes  # handshakes Rule H5
                if logger.isEnabledFor(logging.DEBUG):  # once per batch
                    for msg in received:
                        logger.debug(
                            "from broker %s: %d frame(s), %d bytes",
                            client.endpoint,
                            len(msg.frames),
                            sum(len(f) for f in msg.frames),
                        )
            subscriptions = client._subscriptions
            for msg in received:
                if is_stream(msg.frames):
                    deliver_part(msg.frames, waiters)  # dcp streams (_streams.py)
                    continue
                if subscriptions and deliver(subscriptions, msg.frames):
                    continue
                resolved = tracker.receive(msg.frames)
                if resolved is not None:
                    rid, outcome = resolved
                    waiter = waiters.pop(rid, None)
                    if waiter is not None:
                        waiter.deliver(rid, outcome)
            now = client._now()
            deadline = tracker.next_deadline()
            if deadline is not None and deadline <= now:
                expire(client, asock, now)
            # Let other tasks run between batches, however busy the socket is. (With
            # no input left, wait_readable parks, which lets them run: no extra pass.)
            if asock.has_input():
                await anyio.lowlevel.checkpoint()
    except anyio.ClosedResourceError:
        pass
    except zmq.ZMQError as exc:
        if not asock.closed:
            failure = exc
    except Exception as exc:  # a bug: fail the callers rather than hang them
        logger.exception("dcp client receive task failed")
        failure = exc
    finally:
        shutdown(client, failure)


def expire(client: Client, asock: AsyncSocket, now: float) -> None:
    tracker = client._tracker
    tracker.expire(now)
    out, events = tracker.drain()
    watch = client._watch
    if out and watch is not None and watch.unheard():
        # Handshakes Rule H5: a secure broker ignores this connection; make a new one.
        logger.warning(
            "dcp client: the broker at %s has not answered on this connection since it "
            "reconnected; connecting again",
            client.endpoint,
        )
        watch.heard = watch.handshakes  # once per connection
        asock.sock.disconnect(client.endpoint)
        asock.sock.connect(client.endpoint)
    for frames in out:
        try:
            asock.send_nowait(frames)
        except zmq.Again:
            tracker.resends_dropped += 1
    waiters = client._waiters
    for event in events:
        rid = event.request_id
        waiter = waiters.pop(rid, None)
        if waiter is not None:
            waiter.deliver(rid, event.error)


def shutdown(client: Client, failure: BaseException | None) -> None:
    """Close the socket and fail every waiter. Idempotent; the first cause sticks."""
    if not client._closed:
        client._closed = True
        client._broken = failure
    if client._socket is not None:
        if not client._socket.closed:
            # Stop the monitor before closing: libzmq's I/O thread sends the socket's
            # last events (DISCONNECTED) to the monitor's PAIR with a blocking send; if
            # our end of that PAIR is closed first, the send blocks that thread for good
            # and every socket of the context falls silent.
            with contextlib.suppress(zmq.ZMQError):
                client._socket.sock.disable_monitor()
        client._socket.close(0)
    client._tracker.cancel_all()
    for state in client._subscriptions.values():
        state.close()
    waiters = list(client._waiters.items())
    client._waiters.clear()
    for rid, waiter in waiters:
        waiter.deliver(rid, None)
