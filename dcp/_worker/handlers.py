"""Running a worker's handlers: the task group of their slots (:mod:`dcp._worker.slots`),
one request's run (its work timeout, its span, the handler's result or exception as the
answer), the answer given to the core, and the blocked-loop warning.

Rules:

1. A handler that raises gives a ``handler_error`` reply (logged with its traceback); one
   that returns something else than bytes, a sequence of bytes or a
   :class:`~dcp.Forward`, a ``bad_handler_result`` reply. Neither ends serving.
2. A request with a work timeout is cancelled when it passes (the broker has given it to
   another worker by then): its slot is freed and a warning logged.
3. Every run ends in the core (:meth:`~dcp._core.worker.core.WorkerCore.finish`), answered or
   not (cancelled, or dropped before it ran), after a look at the connection's events
   (the core's Rule 12); a stopping worker is woken to see whether it is done.
4. A plain ``def`` handler runs in a thread of the worker's limiter (``concurrency``
   threads); one that returns an awaitable is awaited.
5. An event loop blocked longer than the heartbeat interval is logged once, with a hint for
   the kind of handler.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, cast

import anyio
import anyio.abc
import anyio.to_thread

from dcp._core.worker.core import Run
from dcp._models import handler_view
from dcp._worker.results import blocked_loop_hint, error_reply, result_message, wait_blocked
from dcp._worker.slots import HandlerSlots
from dcp.wire.messages import Reply, Request
from dcp.wire.options import request_work_timeout

if TYPE_CHECKING:
    from dcp._models import AsyncHandler, StreamHandler
    from dcp._worker.worker import Worker

__all__ = ["call_handler", "drop", "finish", "handle", "host_handlers", "watch_loop"]

logger = logging.getLogger("dcp.worker")


async def host_handlers(
    worker: Worker, *, task_status: anyio.abc.TaskStatus[HandlerSlots[Run]]
) -> None:
    """Hold the handlers' task group until the worker cancels them (or serving ends)."""
    async with anyio.create_task_group() as handlers:
        task_status.started(
            HandlerSlots(handlers, worker._core.concurrency, worker._handle, worker._drop)
        )
        await anyio.sleep_forever()


async def watch_loop(worker: Worker, scope: anyio.CancelScope) -> None:
    """Warn, once, when the event loop was blocked longer than the heartbeat interval."""
    interval = worker._core.heartbeat_interval
    with scope:
        blocked = await wait_blocked(interval)
        logger.warning(
            "worker for service %r (handler %s): the event loop was blocked for %.2f s, "
            "longer than the heartbeat interval (%.2f s), so heartbeats stopped and the "
            "broker may give its requests to another worker; %s (logged once)",
            worker.service,
            worker._handler_name,
            blocked,
            interval,
            blocked_loop_hint(worker._is_async),
        )


async def handle(worker: Worker, run: Run) -> None:
    # Runs in a handler slot, cancelled as a whole by _cancel_handlers.
    request, generation = run.request, run.generation
    message: Reply | Request | None = None
    work_timeout = request_work_timeout(request.metadata)
    if work_timeout is None:
        try:
            if worker._tracing is None:
                message = await call_handler(worker, request)
            else:
                message = await worker._tracing.call(worker._call, request)
        finally:
            finish(worker, message, generation)
        return
    with anyio.CancelScope() as scope:
        # The broker has given the request to another worker by then (and dropped us):
        # free the slot rather than finish work nobody will use.
        scope.deadline = anyio.current_time() + work_timeout
        try:
            message = await call_handler(worker, request)
        finally:
            finish(worker, message, generation)
    if scope.cancelled_caught and anyio.current_time() >= scope.deadline:
        logger.warning(
            "handler for service %r cancelled: past the request's work timeout (%.3f s)",
            worker.service,
            work_timeout,
        )


def drop(worker: Worker, run: Run) -> None:
    """A request queued for a slot when the handlers were cancelled: never run."""
    finish(worker, None, run.generation)


def finish(worker: Worker, message: Reply | Request | None, generation: int) -> None:
    core = worker._core
    worker._poll_monitor()  # Rule 12: has the connection changed under us?
    core.finish(message, worker._now(), generation=generation)
    outs, core.outbox = core.outbox, []
    for out in outs:
        worker._do(out)
    if worker._stop_deadline is not None:
        worker._wake()


async def call_handler(worker: Worker, request: Request) -> Reply | Request:
    view = handler_view(request)
    try:
        if worker._streaming:
            return await worker._streams.run(
                cast("StreamHandler", worker._handler),
                request,
                view,
                worker._send_part,
                lambda: worker._core.width,
            )
        if worker._is_async:
            result: object = await cast("AsyncHandler", worker._handler)(view)
        else:
            result = await anyio.to_thread.run_sync(worker._handler, view, limiter=worker._threads)
            if inspect.isawaitable(result):  # a plain callable that returns a coroutine
                result = await result
    except Exception as exc:
        logger.exception("handler for service %r raised", worker.service)
        return error_reply(request, "handler_error", f"{type(exc).__name__}: {exc}")
    try:
        return result_message(request, result)
    except TypeError as exc:
        logger.error("handler for service %r: %s", worker.service, exc)
        return error_reply(request, "bad_handler_result", str(exc))
