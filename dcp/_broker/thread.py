"""The broker's I/O thread (``io_thread=True``): running it, its loop, and work for the
core handed to it from other threads (a security reload, the HTTP endpoint's snapshots).

Rules (how the thread waits and reads: :mod:`dcp._broker.io`, Rules I1 to I3):

1. The thread owns the socket while it runs. Cancelling the broker's task wakes it and
   waits for it to stop, so the socket is closed only after; a cancellation that comes
   before the thread ran at all keeps it from starting later.
2. The core's timers run every ``heartbeat_interval / 4`` in the thread (its ``recv``
   waits no longer, Rule I1), and sooner when the core's ``next_deadline`` says so (while
   messages are held for full sockets: every 2 ms, streams Rule T3).
3. Work for the core from another thread (:func:`in_core`) runs in the I/O thread, woken
   for it (Rule I2), which then sends what the work put in the outbox; the caller waits
   for it in a worker thread of anyio's. Without the I/O thread it runs at once, in the
   event loop. Work the thread did not take before it stopped runs after it stopped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio
import anyio.to_thread
import zmq

from dcp._broker.io import EVENTS, POLLIN, Waker, events_of, read_one
from dcp._broker.oplog import Frames
from dcp._io.sockets import AsyncSocket
from dcp._util import PeerId

if TYPE_CHECKING:
    from dcp._broker.broker import Broker

__all__ = ["Call", "in_core", "run_calls", "thread_loop"]

_T = TypeVar("_T")

logger = logging.getLogger("dcp.broker")

_NOBLOCK = int(zmq.NOBLOCK)


class Call(Generic[_T]):
    """Work for the core in the I/O thread: its function, result, and a done signal."""

    __slots__ = ("done", "func", "result")

    #: What ``func`` returned (set once it ran).
    result: _T

    def __init__(self, func: Callable[[float], _T]) -> None:
        self.func = func
        self.done = threading.Event()


async def in_core(broker: Broker, func: Callable[[float], _T]) -> _T:
    """Run ``func(now)`` where the core runs (the I/O thread, while there is one) and
    send what it put in the outbox."""
    waker = broker._waker
    if waker is None or not broker._io_thread:
        result = func(time.monotonic() if broker._io_thread else anyio.current_time())
        if broker._socket is not None:
            broker._flush(broker._socket)
        return result
    call = Call(func)
    broker._calls.append(call)
    waker.wake()
    await anyio.to_thread.run_sync(call.done.wait)
    return call.result


def run_calls(broker: Broker, asock: AsyncSocket | None) -> None:
    calls = broker._calls
    while calls:
        call = calls.popleft()
        try:
            call.result = call.func(time.monotonic())
            if asock is not None:
                broker._flush(asock)
        finally:
            call.done.set()


async def thread_loop(
    broker: Broker, asock: AsyncSocket, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Run the broker's I/O loop in a thread of its own (``io_thread=True``): a blocking
    ``recv`` on the socket, woken by messages (:mod:`dcp._broker.io`), the core fed
    from that thread.

    One wake-up costs a ``poll(2)`` in libzmq there, against an event loop's wait,
    cancel scope and task switch here (measured: ``python -m benchmarks.ab``). The
    thread owns the socket while it runs; cancelling this task wakes it and waits for it
    to stop, so the socket is closed only after."""
    waker = Waker(ctx, asock.sock)
    broker._waker = waker
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
            io_loop(broker, asock, waker)
        finally:
            stopped.set()

    try:
        await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
    finally:
        with lock:
            state["over"] = True
            started = state["started"]
        broker._waker = None
        if started:
            waker.stop()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(stopped.wait)
        run_calls(broker, None)  # any the thread did not take (its socket is done)
        waker.close()


def io_loop(broker: Broker, asock: AsyncSocket, waker: Waker) -> None:
    """The thread's loop (rules in :mod:`dcp._broker.io`): wait in ``recv`` until the
    next timer, read on while messages wait, feed them to the core, flush; the core's
    timers every ``heartbeat_interval / 4``; return when woken after
    :meth:`Waker.stop`."""
    core = broker._core
    sock = asock.sock
    events = events_of(sock)
    batch = broker._batch
    receive = core.receive
    flush = broker._flush
    max_bytes = broker._max_message_size if broker._max_message_size >= 0 else 1 << 62
    wake_id = waker.ident
    clock = time.monotonic
    period = broker.heartbeat_interval / 4
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
            flush(asock)
            if now >= next_tick:
                next_tick = now + period
        # Rule 2: sooner than the next tick if the core says so (held messages).
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
        # Rule I3: all that has come, before anything is sent.
        while len(received) < batch and events(EVENTS) & POLLIN:
            more = read_one(asock, _NOBLOCK)
            if more is None:  # pragma: no cover - ZMQ_EVENTS said one was there
                break
            received.append(more)
        now = clock()
        woken = False
        debug = logger.isEnabledFor(logging.DEBUG)  # once per batch (dcp._broker.oplog Rule 1)
        for msg in received:
            frames = msg.frames
            if frames[0] == wake_id:  # Rule I2
                woken = True
            elif msg.dropped_frames or msg.nbytes - len(frames[0]) > max_bytes:
                broker._handle([msg], now)  # (which logs it)
            elif len(frames) > 1:  # (a ROUTER always adds the routing id)
                if debug:
                    logger.debug("from %s: %s", PeerId(frames[0]), Frames(frames))
                receive(frames, now, msg.user_id)
        flush(asock)
        if woken:
            if waker.stopped:
                return
            run_calls(broker, asock)  # a security reload (Broker.reload_security)
            broker._decide(asock, now)  # approvals (dcp._broker.approver)
