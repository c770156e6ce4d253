"""The thin I/O layer between pyzmq sockets and anyio.

A zmq socket's ``FD`` is *edge-triggered*: it becomes readable when the socket's event state
changes, not while a message is waiting, and a ``send`` can consume the edge. So:

- one task (the socket's *owner*) waits on the FD, and only after ``zmq.EVENTS`` says that no
  message is ready (anyio also allows a single waiter per fd);
- after each wake-up the owner drains with ``NOBLOCK`` until ``EAGAIN``, but at most
  ``batch`` messages at a time, so one busy socket cannot starve the other tasks;
- other tasks may send (sends are synchronous ``NOBLOCK`` calls); if the owner is parked on
  the FD at that moment and a message is ready, the sender wakes it, since its send may have
  eaten the edge the owner was waiting for;
- before closing, the owner is woken and raises ``anyio.ClosedResourceError``;
- the owner parks the event loop's own way (trio's ``wait_readable`` with no cancel scope per
  wait: a timer task for deadlines, ``notify_closing`` for wake-ups; on asyncio a reader
  callback registered once and a future per wait), not through anyio's wrappers: about 20 us
  of CPU less per wake-up, measured with ``benchmarks.wake``.

We do not use the zmq-anyio package: measured here it cost 4-5x more broker CPU per request
than this adapter and it lost messages when a receive was cancelled.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

import anyio
import zmq

from dcp._io.clock import running_loop
from dcp._io.errors import refusal

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "AsyncSocket",
    "Received",
    "drop_queued",
    "recv_frames",
    "send_frames",
    "try_recv",
    "try_send",
]

# Plain ints: pyzmq's enum flags cost a conversion on every call.
_POLLIN = int(zmq.POLLIN)
_EVENTS = zmq.EVENTS  # the enum member: pyzmq looks it up faster than a plain int
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)
_UNLIMITED = 1 << 62
#: The compiled ``send`` under pyzmq's Python wrapper (which only adds routing-id and group
#: handling for draft sockets): half the CPU per frame (0.19 us against 0.37 us here).
_send = zmq.backend.Socket.send


def send_frames(sock: zmq.Socket[bytes], frames: Sequence[bytes]) -> None:
    """Send one multipart message without blocking.

    A loop of plain sends with int flags costs about 3 us per 8-frame message here, against
    12 us for ``send_multipart`` (per-part checks and enum flag conversions). A multipart
    message is atomic: if the first part is refused (EAGAIN, EHOSTUNREACH) nothing is
    queued; once it is accepted, the rest are too.

    :raises zmq.Again: the peer's queue is full (high-water mark)
    :raises zmq.ZMQError: e.g. ``EHOSTUNREACH`` from a ``ROUTER_MANDATORY`` socket
    """
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], _SNDMORE_NOBLOCK)
    _send(sock, frames[last], _NOBLOCK)


def try_send(sock: zmq.Socket[bytes], frames: Sequence[bytes]) -> str | None:
    """Send one multipart message without blocking, as :func:`send_frames`; ``None`` if it
    was queued, else why the peer refused it: ``"full"`` or ``"gone"`` (Rules Z1 and Z2 of
    :mod:`dcp._io.errors`). For sockets no event loop waits on (the blocking client).

    :raises anyio.BrokenResourceError: any other error (the socket's own: closed, context
        terminated; the zmq error is its cause)
    """
    try:
        send_frames(sock, frames)
    except zmq.ZMQError as exc:
        return refusal(exc)
    return None


def try_recv(sock: zmq.Socket[bytes]) -> list[bytes] | None:
    """Receive one whole multipart message without blocking, as :func:`recv_frames`;
    ``None`` if none is waiting."""
    try:
        return recv_frames(sock)
    except zmq.Again:
        return None


def recv_frames(sock: zmq.Socket[bytes]) -> list[bytes]:
    """Receive one whole multipart message without blocking (no limits).

    Frame objects and ``.more`` cost about 10 us per 8-frame message here, against 18 us
    for ``recv_multipart`` (a ``getsockopt(RCVMORE)`` and flag conversion per frame).

    :raises zmq.Again: no message is waiting
    """
    recv = sock.recv
    frame = recv(_NOBLOCK, copy=False)
    frames = [frame.bytes]
    while frame.more:
        frame = recv(_NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames


class Received:
    """One received multipart message.

    :ivar frames: its frames, cut at the frame and byte limits
    :ivar dropped_frames: how many frames were read and discarded past those limits
    :ivar nbytes: the size of the whole message as received, in bytes
    :ivar user_id: the connection's ZAP user id (with CURVE: the peer's public key), if
        the socket reads user ids and the connection has one
    """

    __slots__ = ("dropped_frames", "frames", "nbytes", "user_id")

    def __init__(
        self,
        frames: list[bytes],
        dropped_frames: int,
        nbytes: int = 0,
        user_id: str | None = None,
    ) -> None:
        self.frames = frames
        self.dropped_frames = dropped_frames
        self.nbytes = nbytes
        self.user_id = user_id


class AsyncSocket:
    """An owned zmq socket, readable from one task and writable from any task.

    Receiving is not cancellation-hazardous: a message is taken off the zmq socket only by
    the synchronous :meth:`drain`, which cannot be interrupted half-way; cancelling
    :meth:`wait_readable` loses nothing.

    Close it with :meth:`close`, not the zmq socket's own: on asyncio the loop watches the
    socket's FD from the first wait until then.
    """

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        *,
        max_frames: int = 0,
        max_bytes: int = 0,
        zero_copy_threshold: int = 0,
        user_ids: bool = False,
    ) -> None:
        self.sock = sock
        #: Frames of at least this many bytes are kept as :class:`zmq.Frame` objects (a
        #: buffer over zmq's own memory, sent on again without a copy) instead of being
        #: copied into ``bytes`` (0: always copy). Only for code that passes such frames
        #: through and never compares them: the broker's data parts.
        self.zero_copy_threshold = zero_copy_threshold or _UNLIMITED
        #: Frames beyond this many are read and discarded (0: no limit).
        self.max_frames = max_frames
        #: Frames that take a message beyond this many bytes are discarded (0: no limit).
        self.max_bytes = max_bytes
        #: Read each message's ZAP user id into :attr:`Received.user_id` (about 0.3 us).
        self.user_ids = user_ids
        self._fd: int = sock.FD
        #: How :meth:`wait_readable` parks, on the loop it last ran on (made at the first wait).
        self._park: _Park | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def has_input(self) -> bool:
        """True if a message can be read right now."""
        return bool(int(self.sock.getsockopt(_EVENTS)) & _POLLIN)

    async def wait_readable(self, deadline: float = math.inf) -> bool:
        """Wait until a message can be read, ``deadline`` passes (event-loop time), or
        :meth:`wake` is called; return at once if a message is waiting.

        The wait is the event loop's own (:class:`_TrioPark`, :class:`_AsyncioPark`), with
        the deadline and the wake-ups built in, so a caller with a timer needs no scope of
        its own.

        :returns: whether a message can be read now
        :raises anyio.ClosedResourceError: the socket is closed, or was closed while waiting
        :raises anyio.BusyResourceError: another task is waiting on this socket
        """
        if self._closed:
            raise anyio.ClosedResourceError
        sock = self.sock
        if int(sock.getsockopt(_EVENTS)) & _POLLIN:
            return True
        park = self._park
        if park is None or not park.current():
            park = self._park = _new_park(sock, self._fd)
        elif park.waiting:  # one owner at a time (the module's rules)
            raise anyio.BusyResourceError("waiting on")
        readable = await park.wait(deadline)
        if self._closed:
            raise anyio.ClosedResourceError
        return readable

    def wake(self) -> None:
        """Make a pending :meth:`wait_readable` return now (e.g. to recompute a timer)."""
        if self._park is not None:
            self._park.wake()

    def move_deadline(self, deadline: float) -> None:
        """Bring the deadline of a pending :meth:`wait_readable` forward to ``deadline``."""
        if self._park is not None:
            self._park.move_deadline(deadline)

    def drain(self, batch: int) -> list[Received]:
        """Read up to ``batch`` whole messages without blocking; may return an empty list.

        Frames past ``max_frames``, or past ``max_bytes`` in total, are read (zmq delivers a
        message whole) but not kept: :attr:`Received.dropped_frames` counts them.
        """
        # Hot path: the same technique as recv_frames, plus the limits.
        recv = self.sock.recv
        out: list[Received] = []
        max_frames = self.max_frames or _UNLIMITED
        max_bytes = self.max_bytes or _UNLIMITED
        user_ids = self.user_ids
        user_id = None
        for _ in range(batch):
            try:
                frame = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                break
            if user_ids:
                # Metadata of the connection the message came on (every frame has it).
                try:
                    user_id = cast(str, frame.get("User-Id"))
                except zmq.ZMQError:  # no handshake metadata (e.g. inproc)
                    user_id = None
            zero_copy = self.zero_copy_threshold
            nbytes = len(frame)
            # A zmq.Frame stands in for bytes where it is kept: it has len(), truthiness and
            # the buffer protocol, all that is done with a data part passed through.
            frames = [frame.bytes if nbytes < zero_copy else cast(bytes, frame)]
            dropped = 0
            # The parts of a multipart message arrive together: these never block.
            while frame.more:
                frame = recv(_NOBLOCK, copy=False)
                size = len(frame)
                nbytes += size
                if len(frames) >= max_frames or nbytes > max_bytes:
                    dropped += 1
                else:
                    frames.append(frame.bytes if size < zero_copy else cast(bytes, frame))
            out.append(Received(frames, dropped, nbytes, user_id))
        return out

    def send_nowait(self, frames: Sequence[bytes]) -> None:
        """Send one multipart message now.

        :raises zmq.Again: the peer's queue is full (high-water mark)
        :raises zmq.ZMQError: e.g. ``EHOSTUNREACH`` from a ``ROUTER_MANDATORY`` socket
        """
        try:
            send_frames(self.sock, frames)
        finally:
            # Our send, failed or not, may have consumed the edge the owner is parked on.
            park = self._park
            if park is not None and park.waiting and int(self.sock.getsockopt(_EVENTS)) & _POLLIN:
                park.wake()

    def try_send(self, frames: Sequence[bytes]) -> str | None:
        """Send one multipart message now, as :meth:`send_nowait`; ``None`` if it was
        queued, else why the peer refused it: ``"full"`` or ``"gone"``
        (:func:`dcp._io.errors.refusal`, Rules Z1 and Z2).

        The broker sends every message with it: the same calls as :meth:`send_nowait` while
        nothing is refused (the ``except`` clause costs nothing until taken).

        :raises anyio.BrokenResourceError: any other error (the socket's own: closed,
            context terminated; the zmq error is its cause)
        """
        try:
            send_frames(self.sock, frames)
        except zmq.ZMQError as exc:
            return refusal(exc)
        finally:
            # Our send, failed or not, may have consumed the edge the owner is parked on.
            park = self._park
            if park is not None and park.waiting and int(self.sock.getsockopt(_EVENTS)) & _POLLIN:
                park.wake()
        return None

    def drop_queued(self, endpoint: str) -> bool:
        """Drop what zmq queued for ``endpoint``, a connection that never completed: the
        socket (linger 0) disconnects from it, which discards its pipe's messages, and
        connects again. Not on the per-message path.

        :returns: ``False`` if the socket was not connected to ``endpoint`` (nothing done)
        """
        return drop_queued(self.sock, endpoint)

    def close(self, linger: int | None = 0) -> None:
        """Wake the owner with ``ClosedResourceError`` and close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        park = self._park
        if park is not None:
            park.close()  # wakes a waiter, which sees the socket closed
        else:
            with contextlib.suppress(Exception):
                anyio.notify_closing(self._fd)
        self.sock.close(linger)


# -- parking on the socket's FD, each event loop its own way ---------------------------------
#
# anyio's ``wait_readable`` and ``CancelScope`` find the backend and wrap its objects on every
# call; on asyncio its wait also registers the FD with the selector and removes it again
# (two epoll_ctl calls, a closure and a future per wait). Waiting the loop's own way costs
# about 20 us less CPU per wake-up on both loops (``python -m benchmarks.wake``), once or
# twice per request in a client and a worker.


class _Park(Protocol):
    """How a task parks until a socket's FD is readable, a deadline passes or it is woken."""

    @property
    def waiting(self) -> bool:
        """A task is parked (or about to be resumed) in :meth:`wait`."""

    def current(self) -> bool:
        """Whether this park belongs to the event loop running now."""

    async def wait(self, deadline: float) -> bool:
        """Return once a message can be read (``True``), ``deadline`` has passed,
        :meth:`wake` or :meth:`close` was called. The caller has just read ``zmq.EVENTS``
        (no message waited, and the FD's edge is taken): the first thing done is to park."""

    def wake(self) -> None:
        """Make a pending :meth:`wait` return now."""

    def move_deadline(self, deadline: float) -> None:
        """Bring a pending :meth:`wait`'s deadline forward to ``deadline``."""

    def close(self) -> None:
        """The socket is about to be closed: wake a waiter, let go of the FD."""


def _new_park(sock: zmq.Socket[bytes], fd: int) -> _Park:
    """The park for the event loop running now."""
    loop = running_loop()
    if loop == "trio":
        return _TrioPark(sock, fd)
    if loop == "asyncio" and sys.platform != "win32":  # the proactor loop has no add_reader
        import asyncio  # here: a program on trio never loads it

        return _AsyncioPark(sock, fd, asyncio.get_running_loop())
    return _AnyioPark(sock, fd)  # pragma: no cover - Windows


class _Scope(Protocol):
    """A cancel scope (trio's or anyio's): what a :class:`_ScopedPark` uses of it."""

    @property
    def deadline(self) -> float: ...

    @deadline.setter
    def deadline(self, value: float) -> None: ...

    def cancel(self) -> None: ...


class _ScopedPark:
    """A park that waits in a cancel scope: the scope's deadline is the wait's, cancelling
    it wakes the waiter."""

    __slots__ = ("_closed", "_fd", "_scope", "_sock")

    def __init__(self, sock: zmq.Socket[bytes], fd: int) -> None:
        self._sock = sock
        self._fd = fd
        self._scope: _Scope | None = None
        self._closed = False

    @property
    def waiting(self) -> bool:
        return self._scope is not None

    def wake(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def move_deadline(self, deadline: float) -> None:
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(Exception):
            self._notify_closing(self._fd)
        self.wake()

    def _notify_closing(self, fd: int) -> None:
        """Tell the event loop that ``fd`` is about to be closed."""
        raise NotImplementedError


class _TrioPark:
    """trio's own FD wait, with no cancel scope per wait: a wake-up is trio's
    ``notify_closing`` (the waiter gets ``ClosedResourceError``; the FD stays open and the next
    wait registers it again), the deadline a timer task that outlives the waits.

    A trio cancel scope per wait (its status, its registered deadline) cost about 7 us of CPU
    per wait here, once or twice per request (Round 5 of docs/performance-stack.md). The timer
    is a system task (:func:`trio.lowlevel.spawn_system_task`) asleep until the earliest
    deadline it was given: a wait whose deadline is no earlier keeps it, as
    :class:`_AsyncioPark`'s timer; when it fires it wakes a wait whose deadline has passed,
    sleeps on until the deadline of a wait still pending, or ends (the next wait with a finite
    deadline starts another). :meth:`close` ends it.
    """

    __slots__ = (
        "_closed",
        "_deadline",
        "_fd",
        "_notify",
        "_now",
        "_sock",
        "_timer_at",
        "_timer_scope",
        "_timing",
        "_trio",
        "_wait",
        "_woken",
        "waiting",
    )

    def __init__(self, sock: zmq.Socket[bytes], fd: int) -> None:
        import trio

        self._trio = trio
        self._wait = trio.lowlevel.wait_readable
        self._notify = trio.lowlevel.notify_closing
        self._now = trio.current_time
        self._sock = sock
        self._fd = fd
        #: The pending wait's deadline.
        self._deadline = math.inf
        #: When the timer task wakes (``inf``: it is not asleep for any deadline).
        self._timer_at = math.inf
        #: The timer task's scope while it sleeps (its deadline is ``_timer_at``).
        self._timer_scope: trio.CancelScope | None = None
        #: A timer task is running (or started and about to run).
        self._timing = False
        self._woken = False
        self._closed = False
        self.waiting = False

    def current(self) -> bool:
        return self._trio.lowlevel.in_trio_run()

    async def wait(self, deadline: float) -> bool:
        sock = self._sock
        if deadline <= self._now():  # due already: a checkpoint, as an expired scope's wait
            await self._trio.lowlevel.checkpoint()
            return not self._closed and bool(int(sock.getsockopt(_EVENTS)) & _POLLIN)
        self._woken = False
        self._deadline = deadline
        if deadline < self._timer_at:
            self._set_timer(deadline)
        readable = False
        self.waiting = True
        try:
            while not self._woken:
                try:
                    await self._wait(self._fd)
                except self._trio.ClosedResourceError:  # wake() or close(): see _woken
                    continue
                if self._closed:  # by a task that ran after the FD woke us: no getsockopt
                    break
                readable = bool(int(sock.getsockopt(_EVENTS)) & _POLLIN)
                if readable:
                    break
        finally:
            self.waiting = False
        if self._closed:
            return False
        if not readable:  # woken (a wake-up, the deadline): a message may have come since
            readable = bool(int(sock.getsockopt(_EVENTS)) & _POLLIN)
        return readable

    def wake(self) -> None:
        if self.waiting and not self._woken:
            self._woken = True
            self._notify(self._fd)

    def move_deadline(self, deadline: float) -> None:
        if self.waiting and deadline < self._deadline:
            self._deadline = deadline
            if deadline < self._timer_at:
                self._set_timer(deadline)

    def close(self) -> None:
        self._closed = True
        self._timer_at = math.inf  # a timer task not started yet ends at once
        scope = self._timer_scope
        if scope is not None:
            scope.cancel()
        if self.waiting:
            self._woken = True
        with contextlib.suppress(Exception):
            self._notify(self._fd)

    def _set_timer(self, when: float) -> None:
        """Make the timer fire at ``when`` (instead of when it would have)."""
        self._timer_at = when
        scope = self._timer_scope
        if scope is not None:
            scope.deadline = when
        elif not self._timing:
            self._timing = True
            try:
                self._trio.lowlevel.spawn_system_task(self._timer, name="dcp socket timer")
            except RuntimeError:  # pragma: no cover - trio's run is ending: all is cancelled
                self._timing = False
                self._timer_at = math.inf

    async def _timer(self) -> None:
        """Sleep until ``_timer_at``; then wake the wait whose deadline has passed, or sleep
        on until the deadline of the wait still pending, or end."""
        trio = self._trio
        try:
            while self._timer_at < math.inf:
                with trio.CancelScope(deadline=self._timer_at) as scope:
                    self._timer_scope = scope
                    try:
                        await trio.sleep_forever()
                    finally:
                        self._timer_scope = None
                if self._closed:
                    return
                self._timer_at = math.inf
                if self.waiting:
                    if self._now() >= self._deadline:
                        with contextlib.suppress(Exception):  # never crash trio's run
                            self.wake()
                    else:
                        self._timer_at = self._deadline  # a later wait's: sleep until it
        finally:
            self._timing = False
            self._timer_at = math.inf


#: The coarsest event-loop clock dcp runs on (uvloop's: milliseconds).
_TICK = 0.001


class _AsyncioPark:
    """A reader callback registered once with the loop's selector, a future per wait and a
    timer only for a finite deadline.

    The selector is level-triggered and the FD stays readable until someone reads
    ``zmq.EVENTS``: the callback reads it when no task waits (the owner reads it again
    before it parks, so nothing is missed).

    The timer outlives the wait that set it: a wait whose deadline is no earlier keeps it
    (when it fires too early it is set again for the deadline of the wait then pending, if
    any; one clock tick on if it was set for that deadline), so the common wait, whose
    deadline is the same or later than the last one's (a request's or a heartbeat's end),
    makes and cancels no timer.
    """

    __slots__ = (
        "_closed",
        "_deadline",
        "_fd",
        "_fut",
        "_loop",
        "_registered",
        "_running_loop",
        "_sock",
        "_timer",
        "_timer_at",
        "_woken",
        "waiting",
    )

    def __init__(self, sock: zmq.Socket[bytes], fd: int, loop: asyncio.AbstractEventLoop) -> None:
        import asyncio

        self._running_loop = asyncio.get_running_loop
        self._sock = sock
        self._fd = fd
        self._loop = loop
        self._fut: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: When the timer fires (``inf``: no timer).
        self._timer_at = math.inf
        self._deadline = math.inf
        self._registered = False
        self._woken = False
        self._closed = False
        self.waiting = False

    def current(self) -> bool:
        try:
            return self._running_loop() is self._loop
        except RuntimeError:  # trio now
            return False

    def _readable(self) -> None:
        fut = self._fut
        if fut is not None:
            if not fut.done():
                fut.set_result(None)
        elif not self._closed:
            # Nobody waits: take the edge, or the selector calls again at once.
            try:
                self._sock.getsockopt(_EVENTS)
            except zmq.ZMQError:  # closed under us (context terminated): let go of the FD
                self._unregister()

    def _unregister(self) -> None:
        if self._registered:
            self._registered = False
            with contextlib.suppress(Exception):  # the loop may be closed already
                self._loop.remove_reader(self._fd)

    async def wait(self, deadline: float) -> bool:
        loop = self._loop
        if not self._registered:
            # The selector may still know the number from a file closed without being
            # unregistered: add_reader would then only swap the callback, never telling
            # epoll about this FD. Forget it first (once per socket and loop).
            loop.remove_reader(self._fd)
            loop.add_reader(self._fd, self._readable)
            self._registered = True
        self._woken = False
        self.waiting = True
        self._deadline = deadline
        if deadline < self._timer_at:
            self._set_timer(deadline)
        sock = self._sock
        readable = False
        try:
            while True:
                self._fut = fut = loop.create_future()
                try:
                    await fut
                finally:
                    self._fut = None
                if self._closed:
                    break
                readable = bool(int(sock.getsockopt(_EVENTS)) & _POLLIN)
                if readable or self._woken:
                    break
        finally:
            self.waiting = False  # the timer stays (see the class docstring)
        return readable

    def _set_timer(self, when: float) -> None:
        """Make the timer fire at ``when`` (instead of when it would have)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._timeout)
        self._timer_at = when

    def wake(self) -> None:
        if self.waiting:
            self._woken = True
            fut = self._fut
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _timeout(self) -> None:
        fired_for = self._timer_at
        self._timer = None
        self._timer_at = math.inf
        deadline = self._deadline
        if not self.waiting or deadline == math.inf:
            return  # set by an earlier wait: nothing is due now
        # uvloop's timers fire up to a millisecond early (its clock counts milliseconds), and
        # a kept timer may be an earlier wait's: a wait must not end before its own deadline
        # by the loop's own clock.
        now = self._loop.time()
        if now >= deadline:
            self.wake()
        elif fired_for < deadline:
            self._set_timer(deadline)  # an earlier wait's timer
        else:
            # This wait's own timer, early: uvloop runs a timer for less than half a
            # millisecond at once, so one set for what is left would run at every turn of
            # the loop until its clock passes the deadline. A whole tick is past it.
            self._set_timer(now + _TICK)

    def move_deadline(self, deadline: float) -> None:
        if self.waiting and deadline < self._deadline:
            self._deadline = deadline
            if deadline < self._timer_at:
                self._set_timer(deadline)

    def close(self) -> None:
        self._closed = True
        self._unregister()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = math.inf
        self.wake()


class _AnyioPark(_ScopedPark):  # pragma: no cover - where neither loop's own way is available
    """anyio's cancel scope and ``wait_readable``: any backend."""

    __slots__ = ()

    def current(self) -> bool:
        return True

    async def wait(self, deadline: float) -> bool:
        sock = self._sock
        with anyio.CancelScope(deadline=deadline) as scope:
            self._scope = scope
            try:
                while not int(sock.getsockopt(_EVENTS)) & _POLLIN:
                    await anyio.wait_readable(self._fd)
                    if self._closed:
                        return False
            finally:
                self._scope = None
        return not self._closed and bool(int(sock.getsockopt(_EVENTS)) & _POLLIN)

    def _notify_closing(self, fd: int) -> None:
        anyio.notify_closing(fd)


def drop_queued(sock: zmq.Socket[bytes], endpoint: str) -> bool:
    """:meth:`AsyncSocket.drop_queued` for any socket (the sync client's too): disconnect
    ``sock`` (linger 0) from ``endpoint``, which discards what zmq queued for a connection that
    never completed, and connect it again.

    :returns: ``False`` if ``sock`` was not connected to ``endpoint`` (nothing done)
    """
    try:
        sock.disconnect(endpoint)
    except zmq.ZMQError:  # ENOENT: not connected there (or the socket is closed)
        return False
    sock.connect(endpoint)
    return True
