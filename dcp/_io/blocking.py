"""A zmq socket served by a thread of its own (the broker's I/O thread,
:mod:`dcp._broker.thread`): how it waits and reads, with as few system calls per message as
libzmq allows, and how other threads wake it.

Rules (measured with ``strace -f`` on the broker under the common load,
``python -m benchmarks.trace_broker``, and ``python -m benchmarks.ab``;
``docs/performance-broker.md``):

Rule I1 - Block in libzmq. The thread waits in a blocking ``recv`` (``RCVTIMEO``: until its
  next timer), which sleeps in one ``poll(2)`` on the socket's own mailbox and returns with
  the message: one ``poll`` and one ``read`` per wake-up, plus one ``poll`` that finds the
  mailbox empty. ``zmq_poll`` (before: on the socket and a wake-up socket) costs two
  ``poll(2)`` per pass plus a ``ZMQ_EVENTS`` check per socket before and after blocking;
  waiting on the socket's ``FD`` needs such checks too (it is edge-triggered). When a
  message is waiting, the ``recv`` makes no system call at all.
Rule I2 - Woken by a message. Work for the thread from other threads (a stop, calls into
  the core, approvers' answers) wakes it with an empty message from a DEALER of its own
  (:class:`Waker`), connected over ``inproc`` with a random routing id: the thread reads it
  like any other message and never hands it to the core. It is fair-queued with the peers'
  messages, so a busy socket cannot keep it waiting long.
Rule I3 - What has come is handled before anything is sent. After the blocking ``recv``
  the thread reads on (without blocking) while ``ZMQ_EVENTS`` says a message waits, and
  past the first few messages of a batch until a read finds none, at most ``batch``; it
  feeds them all to the core, then sends. A peer's messages that arrived together are seen
  together: a worker's last answers and its leave come just before its connection closes,
  and a send to it in between would fail and remove it before its answers are read.
  ``ZMQ_EVENTS`` (one ``poll(2)`` on the mailbox) ends a batch more cheaply than a failed
  ``recv`` (the same, plus a Python exception: about 1 us against 3 here), but it costs
  that ``poll(2)`` for every message it finds too, where a ``recv`` that finds one makes
  no system call: in a long batch one failed ``recv`` is the cheaper end.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import cast

import zmq

from dcp._io.sockets import AsyncSocket, Received, drop_queued

__all__ = ["EVENTS", "POLLIN", "Waker", "drop_queued", "events_of", "read_one"]

_NOBLOCK = int(zmq.NOBLOCK)
POLLIN = int(zmq.POLLIN)
#: The enum member: pyzmq looks it up faster than a plain int.
EVENTS: int = zmq.EVENTS
_UNLIMITED = 1 << 62


class Waker:
    """Wakes the I/O thread blocked in ``recv`` on ``sock`` (Rule I2).

    :meth:`wake` may be called from any thread, any number of times; it never blocks (a
    full queue means the thread has wake-ups to read already). Make it before the thread
    starts, close it after the thread stopped.

    :ivar ident: the routing id its messages arrive with (random; never a peer's)
    :ivar stopped: set by :meth:`stop`: the thread returns when it reads a wake-up
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], sock: zmq.Socket[bytes]) -> None:
        # libzmq reserves routing ids starting with a zero byte for its own.
        self.ident = b"\x01dcp-wake-" + os.urandom(16)
        self.stopped = False
        address = f"inproc://dcp-broker-wake-{self.ident[10:].hex()}"
        sock.bind(address)
        out: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        out.setsockopt(zmq.LINGER, 0)
        out.setsockopt(zmq.ROUTING_ID, self.ident)
        out.connect(address)
        self._out: zmq.Socket[bytes] | None = out
        # A zmq socket is not thread-safe: the event loop and an approver's thread both wake.
        self._lock = threading.Lock()

    def wake(self) -> None:
        with self._lock:
            if self._out is not None:
                with contextlib.suppress(zmq.Again):  # full: the thread has wake-ups queued
                    self._out.send(b"", _NOBLOCK)

    def stop(self) -> None:
        """Tell the I/O thread to return."""
        self.stopped = True
        self.wake()

    def close(self) -> None:
        """Close its socket (idempotent); later wake-ups do nothing."""
        with self._lock:
            out, self._out = self._out, None
        if out is not None:
            out.close(0)


def events_of(sock: zmq.Socket[bytes]) -> Callable[[int], int]:
    """``sock.getsockopt``, typed for ``ZMQ_EVENTS`` (call it with :data:`EVENTS`)."""
    return cast("Callable[[int], int]", sock.getsockopt)


def read_one(asock: AsyncSocket, flags: int = 0) -> Received | None:
    """Read one whole message as :meth:`AsyncSocket.drain` does (same limits, zero-copy
    threshold and user ids): with ``flags`` 0, wait for it at most the socket's
    ``RCVTIMEO``; with ``zmq.NOBLOCK``, not at all. ``None`` if none came. Only the
    socket's owning thread calls it (Rules I1, I3)."""
    recv = asock.sock.recv
    try:
        frame = recv(flags, copy=False)
    except zmq.Again:
        return None
    user_id = None
    if asock.user_ids:
        try:
            user_id = cast(str, frame.get("User-Id"))
        except zmq.ZMQError:  # no handshake metadata (e.g. inproc)
            user_id = None
    zero_copy = asock.zero_copy_threshold
    nbytes = len(frame)
    frames = [frame.bytes if nbytes < zero_copy else cast(bytes, frame)]
    more: bool = frame.more
    if not more:
        return Received(frames, 0, nbytes, user_id)
    max_frames = asock.max_frames or _UNLIMITED
    max_bytes = asock.max_bytes or _UNLIMITED
    dropped = 0
    # The parts of a multipart message arrive together: these never block.
    while more:
        frame = recv(_NOBLOCK, copy=False)
        more = frame.more
        size = len(frame)
        nbytes += size
        if len(frames) >= max_frames or nbytes > max_bytes:
            dropped += 1
        else:
            frames.append(frame.bytes if size < zero_copy else cast(bytes, frame))
    return Received(frames, dropped, nbytes, user_id)
