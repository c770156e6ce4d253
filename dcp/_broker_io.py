"""What the broker's I/O thread blocks on and how it reads: few system calls per message.

Rules (measured with ``strace -c -f`` on the broker under the common load, and
``python -m benchmarks.ab``; ``docs/performance-broker.md``):

Rule I1 - One wait per wake-up. The thread blocks in one ``poll(2)`` on the ROUTER's ``FD``
  and on a pipe (:class:`Waker`), not in ``zmq_poll``: ``zmq_poll`` costs two ``poll(2)``
  calls per pass plus a ``ZMQ_EVENTS`` check (one more ``poll(2)`` on the socket's mailbox)
  per zmq socket, before and after blocking; a zmq socket used only to wake the thread
  doubled that.
Rule I2 - Edge-triggered, checked before blocking. The ``FD`` of a zmq socket tells that its
  state changed, not that a message waits; any zmq call on the socket may consume that
  signal. So the thread blocks only after ``ZMQ_EVENTS`` said no message is waiting, with no
  zmq call on the socket in between.
Rule I3 - No ``EAGAIN`` per batch. :func:`drain_ready` reads while ``ZMQ_EVENTS`` says a
  message waits (at most ``batch``): a failed non-blocking ``recv`` costs the same mailbox
  check plus a Python exception (several times a ``ZMQ_EVENTS`` check). Right after a
  wake-up the thread reads one message only (usually all there is at low load): the check
  it makes before blocking again, needed anyway after its sends (Rule I2), tells whether
  more came; while messages keep coming it reads them in batches.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import cast

import zmq

from ._zmqio import AsyncSocket, Received

__all__ = ["EVENTS", "POLLIN", "Waker", "drain_ready", "events_of"]

POLLIN = int(zmq.POLLIN)
#: The enum member: pyzmq looks it up faster than a plain int.
EVENTS: int = zmq.EVENTS
_NOBLOCK = int(zmq.NOBLOCK)
_UNLIMITED = 1 << 62


def events_of(sock: zmq.Socket[bytes]) -> Callable[[int], int]:
    """``sock.getsockopt``, typed for ``ZMQ_EVENTS`` (call it with :data:`EVENTS`)."""
    return cast("Callable[[int], int]", sock.getsockopt)


class Waker:
    """A pipe another thread writes to, to wake the I/O thread's ``poll(2)`` (Rule I1).

    :meth:`wake` may be called from any thread, any number of times; it never blocks (a full
    pipe is already readable). The I/O thread polls :attr:`fd` and calls :meth:`clear`.
    """

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)
        self._closed = False
        #: Set before each write: the I/O thread looks at it on every pass, so a socket
        #: that is never idle cannot keep it from being woken.
        self.pending = False
        #: Set by :meth:`stop`: the I/O thread returns when it sees it.
        self.stopped = False

    def wake(self) -> None:
        if self._closed:
            return
        self.pending = True
        # BlockingIOError: the pipe is full, so already readable. OSError: closed meanwhile.
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")

    def stop(self) -> None:
        """Tell the I/O thread to return."""
        self.stopped = True
        self.wake()

    def clear(self) -> None:
        """Read everything written so far."""
        with contextlib.suppress(OSError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._write_fd)
            os.close(self.fd)


def drain_ready(asock: AsyncSocket, batch: int) -> list[Received]:
    """Read whole messages while one is waiting, at most ``batch`` (Rule I3), as
    :meth:`AsyncSocket.drain` does (same limits, zero-copy threshold and user ids). The
    caller knows a message is waiting (``ZMQ_EVENTS`` said so) and calls this from the
    socket's owning thread; the last ``ZMQ_EVENTS`` check said no more was waiting, unless
    ``batch`` messages were read."""
    sock = asock.sock
    recv = sock.recv
    events = events_of(sock)
    out: list[Received] = []
    max_frames = asock.max_frames or _UNLIMITED
    max_bytes = asock.max_bytes or _UNLIMITED
    zero_copy = asock.zero_copy_threshold
    user_ids = asock.user_ids
    user_id = None
    while True:
        frame = recv(_NOBLOCK, copy=False)
        if user_ids:
            try:
                user_id = cast(str, frame.get("User-Id"))
            except zmq.ZMQError:  # no handshake metadata (e.g. inproc)
                user_id = None
        nbytes = len(frame)
        frames = [frame.bytes if nbytes < zero_copy else cast(bytes, frame)]
        dropped = 0
        while frame.more:
            frame = recv(_NOBLOCK, copy=False)
            size = len(frame)
            nbytes += size
            if len(frames) >= max_frames or nbytes > max_bytes:
                dropped += 1
            else:
                frames.append(frame.bytes if size < zero_copy else cast(bytes, frame))
        out.append(Received(frames, dropped, nbytes, user_id))
        if len(out) >= batch or not events(EVENTS) & POLLIN:
            break
    return out
