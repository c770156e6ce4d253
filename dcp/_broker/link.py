"""The broker core and its socket, linked for one :meth:`dcp.Broker.serve`: what is read
goes into the core (:meth:`CoreLink.handle`), what the core puts out goes to the socket, the
log and the approver (:meth:`CoreLink.flush`), the approver's answers go back in
(:meth:`CoreLink.decide`); and, without the I/O thread (``io_thread=False``), the two
event-loop tasks that do all this (with it: :mod:`dcp._broker.thread`).

Whoever owns the core calls these: the I/O thread while it runs, the event loop otherwise
(:mod:`dcp._broker.thread` Rules IT1 and IT3). The core's rules are in
:mod:`dcp._core.broker.core`; what is logged, in :mod:`dcp._broker.oplog`; what a refused
send means, in :mod:`dcp._io.errors`.
"""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel

from dcp._broker.approver import ApproverRunner
from dcp._broker.oplog import Frames, write_log
from dcp._core.broker.core import BrokerCore
from dcp._io.blocking import Waker
from dcp._io.clock import loop_clock
from dcp._io.sockets import AsyncSocket, Received
from dcp._util import PeerId

__all__ = ["CoreLink"]

logger = logging.getLogger("dcp.broker")


class CoreLink:
    """The core and the socket of one serve.

    :param core: the broker's core
    :param asock: the broker's bound ROUTER socket
    :param max_message_size: the largest message accepted, all frames together, in bytes
        (-1: no limit)
    :param approver: runs the broker's registration approver, if it has one
    """

    def __init__(
        self,
        core: BrokerCore,
        asock: AsyncSocket,
        *,
        max_message_size: int,
        approver: ApproverRunner | None = None,
    ) -> None:
        self.core = core
        self.asock = asock
        #: The message size limit (routing id not counted), ``1 << 62`` for none.
        self.max_bytes = max_message_size if max_message_size >= 0 else 1 << 62
        self.approver = approver
        #: Wakes the I/O thread while it runs (set by :class:`dcp._broker.thread.IOThread`):
        #: the core is the thread's then, and the approver is asked from that thread.
        self.waker: Waker | None = None
        #: The timers' task's sleep, without the I/O thread (:meth:`expire_loop`).
        self._timers: anyio.CancelScope | None = None

    def handle(self, received: list[Received], now: float) -> None:
        """Feed drained messages to the core (cut ones as such)."""
        core = self.core
        receive = core.receive
        max_bytes = self.max_bytes
        debug = logger.isEnabledFor(logging.DEBUG)  # once per batch (dcp._broker.oplog Rule O2)
        for msg in received:
            if debug:
                logger.debug("from %s: %s", PeerId(msg.frames[0]), Frames(msg.frames))
            frames = msg.frames
            if msg.nbytes - len(frames[0]) > max_bytes:
                core.reject_too_large(
                    frames, msg.nbytes - len(frames[0]), max_bytes, now, msg.user_id
                )
            elif msg.dropped_frames:
                core.reject_too_many_frames(frames, msg.dropped_frames, now, msg.user_id)
            elif len(frames) < 2:  # pragma: no cover - a ROUTER always adds the id
                continue
            else:
                receive(frames, now, msg.user_id)

    def flush(self) -> None:
        """Drain the core: send its messages, write its log lines, ask the approver its
        questions; again while what was done gave it more to say."""
        core = self.core
        try_send = self.asock.try_send
        gone: set[bytes] = set()
        debug = logger.isEnabledFor(logging.DEBUG)  # once per flush (dcp._broker.oplog Rule O2)
        out, events = core.drain()
        while out or events:
            if events:  # the core's log lines and approval questions (dcp._broker.oplog Rule O1)
                asked = write_log(events)
                if asked and self.approver is not None:
                    self.approver.ask(asked, threaded=self.waker is not None)
            for frames in out:
                peer = frames[0]
                if debug:
                    logger.debug("to %s: %s", PeerId(peer), Frames(frames))
                if gone and peer in gone:
                    # Its worker was removed earlier in this flush and what it held was
                    # redelivered: do not hand it anything more.
                    core.undeliverable(frames, "gone")
                    continue
                refused = try_send(frames)  # "full" or "gone" (dcp._io.errors Z1, Z2)
                if refused is not None:
                    gone.add(peer)
                    core.undeliverable(frames, refused)
            out, events = core.drain()

    def decide(self, now: float) -> None:
        """Give the core the approver's answers, then flush."""
        approver = self.approver
        if approver is not None:
            answers = approver.answers
            while answers:
                token, answer = answers.popleft()
                self.core.decide(token, answer, now)
            self.flush()

    def answered(self) -> None:
        """The approver answered: feed the core (from its own thread)."""
        waker = self.waker
        if waker is not None:
            waker.wake()
        elif not self.asock.closed:
            self.decide(anyio.current_time())

    async def receive_loop(self, batch: int) -> None:
        """Without the I/O thread: read, feed and flush, ``batch`` messages at a time,
        until cancelled; bring the timers' task forward when what came made the core's
        next deadline sooner than its sleep (a message held for a full peer, a fan-out in
        slices), as the I/O thread does after every batch."""
        asock = self.asock
        clock = loop_clock()
        next_deadline = self.core.next_deadline
        while True:
            await asock.wait_readable()
            now = clock()
            self.handle(asock.drain(batch), now)
            self.flush()
            scope = self._timers
            if scope is not None:
                due = next_deadline()
                if due is not None:
                    # At most every 1 ms, and only ever sooner: moved later, a socket busier
                    # than once a millisecond would keep the timers from running at all.
                    due = max(due, now + 1e-3)
                    if due < scope.deadline:
                        scope.deadline = due
            # Let other tasks run between batches, however busy the socket is. (With no
            # input left, wait_readable parks, which lets them run: no extra pass then.)
            if asock.has_input():
                await anyio.lowlevel.checkpoint()

    async def expire_loop(self, period: float) -> None:
        """Without the I/O thread: the core's timers every ``period`` seconds, until
        cancelled."""
        core = self.core
        clock = loop_clock()
        while True:
            # Sooner than the tick when the core says so (a fan-out being delivered in slices,
            # pubsub Rule P8; held messages), as the I/O thread does, at most every 1 ms;
            # the receive loop brings the deadline forward for what comes meanwhile.
            due = core.next_deadline()
            now = clock()
            delay = period if due is None else min(period, max(due - now, 1e-3))
            with anyio.CancelScope(deadline=now + delay) as scope:
                self._timers = scope
                try:
                    await anyio.sleep_forever()
                finally:
                    self._timers = None
            core.expire(clock())
            if (core.outbox or core.events) and not self.asock.closed:
                self.flush()
