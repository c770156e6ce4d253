"""Running a worker's handlers (:class:`Handlers`): the task group of their slots
(:mod:`dcp._worker.slots`), one request's run (its work timeout, its span, the handler's
result or exception as the answer), the answer given to the core, and the blocked-loop
warning.

Rules:

Rule WH1 - A handler that raises gives a ``handler_error`` reply (logged with its traceback); one
   that returns something else than bytes, a sequence of bytes or a
   :class:`~dcp.Forward`, a ``bad_handler_result`` reply. Neither ends serving.
Rule WH2 - A request with a work timeout is cancelled when it passes (the broker has given it to
   another worker by then): its slot is freed and a warning logged.
Rule WH3 - Every run ends in the core (:meth:`~dcp._core.worker.core.WorkerCore.finish`), answered
   or not (cancelled, or dropped before it ran), after a look at the connection's events
   (the core's Rule W12); what the core then asks for is done at once (its messages sent,
   a request from its backlog started), and a stopping worker is woken to see whether it
   is done.
Rule WH4 - A plain ``def`` handler runs in a thread of the worker's limiter (``concurrency``
   threads); one that returns an awaitable is awaited.
Rule WH5 - An event loop blocked longer than the heartbeat interval is logged once, with a hint for
   the kind of handler.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import anyio
import anyio.abc
import anyio.to_thread

from dcp._core.worker.core import Run, WorkerCore
from dcp._io.clock import loop_clock
from dcp._models import Handler, handler_view
from dcp._worker.connection import Connection
from dcp._worker.results import (
    blocked_loop_hint,
    error_reply,
    handler_name,
    is_async_handler,
    result_message,
    wait_blocked,
)
from dcp._worker.slots import HandlerSlots
from dcp._worker.streams import WorkerStreams, is_stream_handler
from dcp.wire.messages import Reply, Request
from dcp.wire.options import request_work_timeout

if TYPE_CHECKING:
    from dcp._models import AsyncHandler, StreamHandler
    from dcp._worker.tracing import WorkerTracing

__all__ = ["Handlers"]

logger = logging.getLogger("dcp.worker")


class Handlers:
    """The handlers of one worker (the module's rules).

    :param core: the worker's core: each run ends in its
        :meth:`~dcp._core.worker.core.WorkerCore.finish`
    :param connection: sends what the core asks for; polled before each finish (Rule WH3)
    :param streams: runs the requests of a stream handler
    :param handler: the user's handler (``async def``, plain ``def`` or async generator)
    :param service: the worker's service, for log messages
    :param tracing: the handlers' spans (``None``: tracing off, which costs one test)
    :param wake: wakes the serving task (Rule WH3: a stopping worker looks whether it is done)
    """

    def __init__(
        self,
        core: WorkerCore,
        connection: Connection,
        streams: WorkerStreams,
        handler: Handler,
        *,
        service: bytes,
        tracing: WorkerTracing | None,
        wake: Callable[[], None],
    ) -> None:
        self._core = core
        self._connection = connection
        self._streams = streams
        self._handler = handler
        self._service = service
        self._tracing = tracing
        self._wake = wake
        self._is_async = is_async_handler(handler)
        #: An async generator function streams its answer (docs/streams.md).
        self._streaming = is_stream_handler(handler)
        self._handler_name = handler_name(handler)
        #: The type-frame width of stream parts: the core's, when each part is sent.
        self._width: Callable[[], int] = functools.partial(getattr, core, "width")
        #: Bounds the threads of a plain ``def`` handler (made in :meth:`host`).
        self._threads: anyio.CapacityLimiter | None = None
        #: The slots the requests run in (made in :meth:`host`).
        self.slots: HandlerSlots[Run] | None = None
        #: The event loop's clock (anyio.current_time without its lookup; set in host).
        self._now: Callable[[], float] = anyio.current_time

    async def host(self, *, task_status: anyio.abc.TaskStatus[HandlerSlots[Run]]) -> None:
        """Hold the handlers' task group until :meth:`cancel` (or serving ends); start
        with the slots that run requests (:meth:`HandlerSlots.submit` a :class:`Run`)."""
        self._threads = anyio.CapacityLimiter(self._core.concurrency)
        self._now = loop_clock()
        async with anyio.create_task_group() as tg:
            self.slots = slots = HandlerSlots(tg, self._core.concurrency, self._run, self._drop)
            task_status.started(slots)
            await anyio.sleep_forever()

    def cancel(self) -> None:
        """Cancel every handler; requests still queued for a slot end as cancelled."""
        if self.slots is not None:
            self.slots.cancel()

    async def watch_loop(self, scope: anyio.CancelScope) -> None:
        """Warn, once, when the event loop was blocked longer than the heartbeat interval
        (Rule WH5)."""
        interval = self._core.heartbeat_interval
        with scope:
            blocked = await wait_blocked(interval)
            logger.warning(
                "worker for service %r (handler %s): the event loop was blocked for %.2f s, "
                "longer than the heartbeat interval (%.2f s), so heartbeats stopped and the "
                "broker may give its requests to another worker; %s (logged once)",
                self._service,
                self._handler_name,
                blocked,
                interval,
                blocked_loop_hint(self._is_async),
            )

    async def _run(self, run: Run) -> None:
        # Runs in a handler slot, cancelled as a whole by cancel().
        request, generation = run.request, run.generation
        message: Reply | Request | None = None
        work_timeout = request_work_timeout(request.metadata)
        if work_timeout is None:
            try:
                if self._tracing is None:
                    message = await self._call(request)
                else:
                    message = await self._tracing.call(self._call, request)
            finally:
                self._finish(message, generation)
            return
        with anyio.CancelScope() as scope:
            # Rule WH2: the broker has given the request to another worker by then (and
            # dropped us): free the slot rather than finish work nobody will use.
            scope.deadline = anyio.current_time() + work_timeout
            try:
                message = await self._call(request)
            finally:
                self._finish(message, generation)
        if scope.cancelled_caught and anyio.current_time() >= scope.deadline:
            logger.warning(
                "handler for service %r cancelled: past the request's work timeout (%.3f s)",
                self._service,
                work_timeout,
            )

    def _drop(self, run: Run) -> None:
        """A request queued for a slot when the handlers were cancelled: never run."""
        self._finish(None, run.generation)

    def _finish(self, message: Reply | Request | None, generation: int) -> None:
        """Rule WH3."""
        core = self._core
        connection = self._connection
        connection.poll()  # has the connection changed under us?
        core.finish(message, self._now(), generation=generation)
        outbox, events = core.drain()
        for frames in outbox:
            connection.send(frames)
        for event in events:  # only requests from the backlog (Rule WH4 of the core)
            if type(event) is Run and self.slots is not None:
                self.slots.submit(event)
        if core.stopping:
            self._wake()

    async def _call(self, request: Request) -> Reply | Request:
        """Rules WH1 and WH4: the handler's answer to ``request``."""
        view = handler_view(request)
        try:
            if self._streaming:
                return await self._streams.run(
                    cast("StreamHandler", self._handler),
                    request,
                    view,
                    self._connection.send_part,
                    self._width,
                )
            if self._is_async:
                result: object = await cast("AsyncHandler", self._handler)(view)
            else:
                result = await anyio.to_thread.run_sync(self._handler, view, limiter=self._threads)
                if inspect.isawaitable(result):  # a plain callable that returns a coroutine
                    result = await result
        except Exception as exc:
            logger.exception("handler for service %r raised", self._service)
            return error_reply(request, "handler_error", f"{type(exc).__name__}: {exc}")
        try:
            return result_message(request, result)
        except TypeError as exc:
            logger.error("handler for service %r: %s", self._service, exc)
            return error_reply(request, "bad_handler_result", str(exc))
