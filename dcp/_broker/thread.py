"""The broker's I/O thread (``io_thread=True``, :class:`IOThread`), and the work for the
core handed to it from the event loop (:class:`CoreCalls`: a security reload, the HTTP
endpoint's snapshots).

Rules (how the thread waits and reads: :mod:`dcp._io.blocking`, Rules I1 to I3):

Rule IT1 - The thread owns the socket while it runs. Cancelling the broker's task wakes it and
   waits for it to stop, so the socket is closed only after; a cancellation that comes
   before the thread ran at all keeps it from starting later.
Rule IT2 - The core's timers run every ``heartbeat_interval / 4`` in the thread (its ``recv``
   waits no longer, Rule I1), and sooner when the core's ``next_deadline`` says so (while
   messages are held for full sockets: every 2 ms, streams Rule ST3).
Rule IT3 - Work for the core from another thread (:meth:`CoreCalls.run`) runs in the I/O thread,
   woken for it (Rule I2), which then sends what the work put in the outbox; the caller
   waits for it in a worker thread of anyio's. Without the I/O thread it runs at once, in
   the event loop. Work the thread did not take before it stopped runs after it stopped.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
import zmq

from dcp._broker.link import CoreLink
from dcp._broker.oplog import Frames
from dcp._io.blocking import EVENTS, POLLIN, Waker, events_of, read_one
from dcp._util import PeerId

__all__ = ["Call", "CoreCalls", "IOThread"]

_T = TypeVar("_T")

logger = logging.getLogger("dcp.broker")

_NOBLOCK = int(zmq.NOBLOCK)
#: Messages of a batch after which the thread stops asking ``ZMQ_EVENTS`` whether more waits
#: and reads until a read finds none (:mod:`dcp._io.blocking` Rule I3).
_CHECKED = 3


class Call(Generic[_T]):
    """Work for the core in the I/O thread: its function, result, and a done signal."""

    __slots__ = ("done", "func", "result")

    #: What ``func`` returned (set once it ran).
    result: _T

    def __init__(self, func: Callable[[float], _T]) -> None:
        self.func = func
        self.done = threading.Event()


class CoreCalls:
    """Work for the core from the event loop, run where the core runs (Rule IT3), for as long
    as the broker lives (across its serves).

    :param threaded: the broker runs an I/O thread (``io_thread=True``): the core's clock
        is then :func:`time.monotonic`, else the event loop's
    """

    def __init__(self, *, threaded: bool) -> None:
        self._threaded = threaded
        self._pending: collections.deque[Call[Any]] = collections.deque()
        #: The link of the broker's current serve (``None`` while it does not serve): what
        #: a call put in the outbox is sent through it.
        self.link: CoreLink | None = None

    async def run(self, func: Callable[[float], _T]) -> _T:
        """Run ``func(now)`` where the core runs (the I/O thread, while there is one) and
        send what it put in the outbox."""
        link = self.link
        waker = None if link is None else link.waker
        if waker is None or not self._threaded:
            result = func(time.monotonic() if self._threaded else anyio.current_time())
            if link is not None:
                link.flush()
            return result
        call = Call(func)
        self._pending.append(call)
        waker.wake()
        await anyio.to_thread.run_sync(call.done.wait)
        return call.result

    def run_pending(self, link: CoreLink | None) -> None:
        """Run the calls waiting (in the I/O thread, or after it stopped), each followed by a
        flush through ``link`` (``None``: the socket is done, nothing is sent)."""
        pending = self._pending
        while pending:
            call = pending.popleft()
            try:
                call.result = call.func(time.monotonic())
                if link is not None:
                    link.flush()
            finally:
                call.done.set()


class IOThread:
    """The broker's I/O loop in a thread of its own (``io_thread=True``): a blocking
    ``recv`` on the socket, woken by messages (:mod:`dcp._io.blocking`), the core fed
    from that thread.

    One wake-up costs a ``poll(2)`` in libzmq there, against an event loop's wait,
    cancel scope and task switch in the event loop (measured: ``python -m benchmarks.ab``).

    :param link: the core and the socket of this serve
    :param calls: the work for the core from the event loop (run between batches)
    :param context: the socket's zmq context (for the :class:`~dcp._io.blocking.Waker`)
    :param batch: messages read per pass at most (Rule I3)
    :param period: seconds between runs of the core's timers (Rule IT2)
    """

    def __init__(
        self,
        link: CoreLink,
        calls: CoreCalls,
        context: zmq.Context[zmq.Socket[bytes]],
        *,
        batch: int,
        period: float,
    ) -> None:
        self._link = link
        self._calls = calls
        self._context = context
        self._batch = batch
        self._period = period

    async def run(self) -> None:
        """Run the thread until cancelled (Rule IT1): the thread owns the socket while it
        runs; cancelling this task wakes it and waits for it to stop, so the socket is
        closed only after."""
        link = self._link
        waker = Waker(self._context, link.asock.sock)
        link.waker = waker
        stopped = threading.Event()
        lock = threading.Lock()
        # Whether the thread got going, and whether it may still (a cancellation can come
        # before the thread runs at all: then it must not start later).
        state = {"started": False, "over": False}

        def run() -> None:
            with lock:
                if state["over"]:
                    return
                state["started"] = True
            try:
                self._loop(waker)
            finally:
                stopped.set()

        try:
            await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        finally:
            with lock:
                state["over"] = True
                started = state["started"]
            link.waker = None
            if started:
                waker.stop()
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(stopped.wait)
            self._calls.run_pending(None)  # any the thread did not take (its socket is done)
            waker.close()

    def _loop(self, waker: Waker) -> None:
        """The thread's loop (rules in :mod:`dcp._io.blocking`): wait in ``recv`` until the
        next timer, read on while messages wait, feed them to the core, flush; the core's
        timers every ``period``; return when woken after :meth:`Waker.stop`."""
        link = self._link
        core = link.core
        asock = link.asock
        sock = asock.sock
        events = events_of(sock)
        batch = self._batch
        receive = core.receive
        flush = link.flush
        max_bytes = link.max_bytes
        wake_id = waker.ident
        clock = time.monotonic
        period = self._period
        # Rule I1: the receive waits at most until the next timer (a little later at worst).
        wait_ms = max(1, round(period * 1000))
        timeout = wait_ms
        sock.setsockopt(zmq.RCVTIMEO, timeout)
        next_tick = clock() + period
        due: float | None = None
        while True:
            now = clock()
            if now >= next_tick or (due is not None and now >= due):
                core.expire(now)
                flush()
                if now >= next_tick:
                    next_tick = now + period
            # Rule IT2: sooner than the next tick if the core says so (held messages).
            due = core.next_deadline()
            if due is not None and due < next_tick:
                wanted = max(1, math.ceil((due - now) * 1000))
            else:
                wanted = wait_ms
            if wanted != timeout:
                timeout = wanted
                sock.setsockopt(zmq.RCVTIMEO, timeout)
            msg = read_one(asock)
            if msg is None:
                continue
            received = [msg]
            # Rule I3: all that has come, before anything is sent: ZMQ_EVENTS says whether
            # more waits while the batch is small, then reads go on until one finds none.
            n = 1
            while n < batch and (n >= _CHECKED or events(EVENTS) & POLLIN):
                more = read_one(asock, _NOBLOCK)
                if more is None:
                    break
                received.append(more)
                n += 1
            now = clock()
            woken = False
            debug = logger.isEnabledFor(logging.DEBUG)  # once per batch (oplog Rule O2)
            for msg in received:
                frames = msg.frames
                if frames[0] == wake_id:  # Rule I2
                    woken = True
                elif msg.dropped_frames or msg.nbytes - len(frames[0]) > max_bytes:
                    link.handle([msg], now)  # (which logs it)
                elif len(frames) > 1:  # (a ROUTER always adds the routing id)
                    if debug:
                        logger.debug("from %s: %s", PeerId(frames[0]), Frames(frames))
                    receive(frames, now, msg.user_id)
            flush()
            if woken:
                if waker.stopped:
                    return
                self._calls.run_pending(link)  # a security reload (Broker.reload_security)
                link.decide(now)  # approvals (dcp._broker.approver)
