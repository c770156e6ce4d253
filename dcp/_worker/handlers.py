"""Running a worker's handlers (:class:`Handlers`): the task group of their slots
(:mod:`dcp._worker.slots`), one request's run (its service's handler, its work timeout, its
span, the handler's result or exception as the answer), the answer given to the core, and the
blocked-loop warning.

Rules:

Rule WH1 - A handler that raises gives a ``handler_error`` reply (logged with its traceback); one
   that returns something else than bytes, str, a sequence of them or a
   :class:`~dcp.Forward`, a ``bad_handler_result`` reply that says what it returned. Neither
   ends serving. Both are logged under the request's own service (a worker may serve
   several).
Rule WH2 - A request with a work timeout is cancelled when it passes (the broker has given it to
   another worker by then): its slot is freed and a warning logged.
Rule WH3 - Every run ends in the core (:meth:`~dcp._core.worker.core.WorkerCore.finish`), answered
   or not (cancelled, or dropped before it ran), after a look at the connection's events
   (the core's Rule W12); what the core then asks for is done at once (its messages sent,
   a request from its backlog started), and a stopping worker is woken to see whether it
   is done.
Rule WH4 - A request runs its service's handler (:mod:`dcp._worker.services`), as its kind says:
   an ``async def`` on the event loop, a stream handler through the worker's streams, a
   plain ``def`` in a thread of its service's limiter (``concurrency`` threads); one that
   returns an awaitable is awaited. With several services, each service's limiter also
   bounds its ``async def`` and stream handlers. A request for a service the worker does not
   serve (a confused broker) gets a ``handler_error`` reply.
Rule WH5 - An event loop blocked longer than the heartbeat interval is logged once, with a hint for
   the kind of handler.
Rule WH6 - Inline runs. With one service whose handler is an ``async def``, the worker's
   serving task runs each request itself (:meth:`Handlers.run_inline`: the same run as a
   slot's, Rules WH1-WH4, in a context of its own, the slots' Rule SL4), in the task group
   of the slots, so :meth:`Handlers.cancel` cancels it as theirs; at its first suspension
   the socket is handed to another serving task (:mod:`dcp._worker.worker`). A request
   that an inline run's finish starts from the core's backlog (a prefetching worker, core
   Rule W4) is appended to :attr:`Handlers.chain` and run next by the same task, inline
   too, with no task switch; once the run has suspended (:attr:`Handlers.inline_run` is
   cleared) it goes to the slots. Other requests from the backlog, plain ``def`` and
   stream handlers, and several services run in slots.
Rule WH7 - Where a run ends. By default a run ends in this worker's one core (Rule WH3); a
   worker serving several brokers sets :attr:`Handlers.finish` (its answer goes to every
   broker that brought the request, :mod:`dcp._worker.brokers`) and :attr:`Handlers.route`
   (a stream's parts go through the broker that brought it, with that broker's streams).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, cast

import anyio
import anyio.abc
import anyio.to_thread

from dcp._core.worker.core import Replays, Run, WorkerCore
from dcp._io.clock import loop_clock
from dcp._models import HandlerRequest, handler_view, service_name
from dcp._worker.connection import Connection
from dcp._worker.results import (
    blocked_loop_hint,
    error_reply,
    result_message,
    wait_blocked,
)
from dcp._worker.services import Kind, Served
from dcp._worker.slots import HandlerSlots, Inline
from dcp._worker.streams import WorkerStreams
from dcp.wire.messages import Reply, Request
from dcp.wire.options import request_work_timeout

if TYPE_CHECKING:
    from dcp._models import AsyncHandler, StreamHandler
    from dcp._worker.tracing import WorkerTracing

__all__ = ["Handlers", "Route", "capacity", "names"]

#: Where a stream's parts go (Rule WH7): its streams, the part sender, the type width.
Route = tuple[WorkerStreams, Callable[[list[bytes]], Awaitable[None]], Callable[[], int]]

logger = logging.getLogger("dcp.worker")


def names(services: Sequence[Served]) -> str:
    """The services' names for a log line: ``'a', 'b'``."""
    return ", ".join(repr(served.name) for served in services)


def capacity(concurrency: int, prefetch: int) -> str:
    """A worker's capacity for its serving log line: ``concurrency 1, prefetch 4``."""
    if prefetch:
        return f"concurrency {concurrency}, prefetch {prefetch}"
    return f"concurrency {concurrency}"


class Handlers:
    """The handlers of one worker (the module's rules).

    :param core: the worker's core: each run ends in its
        :meth:`~dcp._core.worker.core.WorkerCore.finish`
    :param connection: sends what the core asks for; polled before each finish (Rule WH3)
    :param streams: runs the requests of a stream handler
    :param services: the services served, each with its handler (the first is the one a
        request for an unknown service gets when it is the only one)
    :param tracing: the handlers' spans (``None``: tracing off, which costs one test)
    :param wake: wakes the serving task (Rule WH3: a stopping worker looks whether it is done)
    """

    def __init__(
        self,
        core: WorkerCore,
        connection: Connection,
        streams: WorkerStreams,
        services: Sequence[Served],
        *,
        tracing: WorkerTracing | None,
        wake: Callable[[], None],
    ) -> None:
        self._core = core
        self._connection = connection
        self._streams = streams
        self._services = tuple(services)
        self._by_wire = {served.wire: served for served in services}
        #: What a request for an unknown service gets: the one service, if there is one.
        self._default = services[0] if len(services) == 1 else None
        self._several = len(services) > 1
        #: Whether the serving task may run requests itself (Rule WH6).
        self.inline = not self._several and services[0].kind is Kind.ASYNC
        self._tracing = tracing
        self._wake = wake
        #: Bounds each service's handlers (Rule WH4; made in :meth:`host`).
        self._limiters: dict[bytes, anyio.CapacityLimiter] = {}
        #: The type-frame width of stream parts: the core's, when each part is sent.
        self._width: Callable[[], int] = functools.partial(getattr, core, "width")
        #: The slots the requests run in (made in :meth:`host`).
        self.slots: HandlerSlots[Run] | None = None
        #: The event loop's clock (anyio.current_time without its lookup; set in host).
        self._now: Callable[[], float] = anyio.current_time
        #: Where each run ends, its answer (``None``: none) and its run (Rule WH7).
        self.finish: Callable[[Reply | Request | None, Run], None] = self._finish
        #: A stream request's streams, part sender and type width (Rule WH7).
        self.route: Callable[[Request], Route] = self._route
        #: The run the serving task is running inline and has not suspended (Rule WH6).
        self.inline_run: Run | None = None
        #: Where its finish puts the requests it starts from the backlog (Rule WH6).
        self.chain: list[Run] = []

    async def host(self, *, task_status: anyio.abc.TaskStatus[HandlerSlots[Run]]) -> None:
        """Hold the handlers' task group until :meth:`cancel` (or serving ends); start
        with the slots that run requests (:meth:`HandlerSlots.submit` a :class:`Run`)."""
        self._limiters = {s.wire: anyio.CapacityLimiter(s.concurrency) for s in self._services}
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
            handlers = ", ".join(served.label for served in self._services)
            logger.warning(
                "worker for %s (handler %s): the event loop was blocked for %.2f s, "
                "longer than the heartbeat interval (%.2f s), so heartbeats stopped and the "
                "broker may give its requests to another worker; %s (logged once)",
                names(self._services),
                handlers,
                blocked,
                interval,
                blocked_loop_hint(any(s.kind is not Kind.THREAD for s in self._services)),
            )

    async def _run(self, run: Run) -> None:
        # Runs in a handler slot, cancelled as a whole by cancel().
        request = run.request
        message: Reply | Request | None = None
        work_timeout = request_work_timeout(request.metadata)
        if work_timeout is None:
            try:
                if self._tracing is None:
                    message = await self._call(request)
                else:
                    message = await self._tracing.call(self._call, request)
            finally:
                self.finish(message, run)
            return
        with anyio.CancelScope() as scope:
            # Rule WH2: the broker has given the request to another worker by then (and
            # dropped us): free the slot rather than finish work nobody will use.
            scope.deadline = anyio.current_time() + work_timeout
            try:
                message = await self._call(request)
            finally:
                self.finish(message, run)
        if scope.cancelled_caught and anyio.current_time() >= scope.deadline:
            logger.warning(
                "handler for service %r cancelled: past the request's work timeout (%.3f s)",
                service_name(request.service),
                work_timeout,
            )

    def run_inline(
        self, run: Run, ctx: contextvars.Context, on_suspend: Callable[[], None]
    ) -> Inline:
        """Run ``run`` in the awaiting task, stepped in ``ctx`` (Rule WH6); ``on_suspend``
        is called if it suspends. Awaiting it never raises but for cancellation."""
        return Inline(self._run(run), ctx, on_suspend)

    def _drop(self, run: Run) -> None:
        """A request queued for a slot when the handlers were cancelled: never run."""
        self.finish(None, run)

    def _finish(self, message: Reply | Request | None, run: Run) -> None:
        """Rule WH3."""
        core = self._core
        connection = self._connection
        connection.poll()  # has the connection changed under us?
        core.finish(message, self._now(), generation=run.generation)
        outbox, events = core.drain()
        for frames in outbox:
            connection.send(frames)
        for event in events:  # requests from the backlog (core Rule W4), replays (W13)
            if type(event) is Run:
                if run is self.inline_run:  # Rule WH6: the serving task runs it next
                    self.chain.append(event)
                elif self.slots is not None:
                    self.slots.submit(event)
            elif type(event) is Replays:  # the poll found a new connection
                connection.send_replays(event.messages)
        if core.stopping:
            self._wake()

    async def _call(self, request: Request) -> Reply | Request:
        """Rules WH1 and WH4: the answer of the request's service's handler."""
        served = self._default  # one service: no lookup on the hot path
        if served is None:
            served = self._by_wire.get(request.service)
        if served is None:
            view = handler_view(request)
            logger.error("request for service %r, which this worker does not serve", view.service)
            return error_reply(
                request, "handler_error", f"this worker does not serve {view.service!r}"
            )
        view = handler_view(request, served.name)
        handler = served.handler
        try:
            if served.kind is Kind.ASYNC and not self._several:  # the common case, inline
                result: object = await cast("AsyncHandler", handler)(view)
            elif self._several and served.kind is not Kind.THREAD:
                async with self._limiters[served.wire]:
                    result = await self._await(served, handler, request, view)
            else:
                result = await self._await(served, handler, request, view)
        except Exception as exc:
            logger.exception("handler for service %r raised", served.name)
            return error_reply(request, "handler_error", f"{type(exc).__name__}: {exc}")
        if served.kind is Kind.STREAM:
            return result  # type: ignore[return-value]
        try:
            return result_message(request, result)
        except TypeError as exc:
            message = f"the handler of service {served.name!r} {exc}"
            logger.error("%s", message)
            return error_reply(request, "bad_handler_result", message)

    def _route(self, request: Request) -> Route:
        """Rule WH7: the one connection's."""
        return self._streams, self._connection.send_part, self._width

    async def _await(
        self, served: Served, handler: object, request: Request, view: HandlerRequest
    ) -> object:
        """Call ``handler`` as its kind says (Rule WH4); what it returned."""
        kind = served.kind
        if kind is Kind.ASYNC:
            return await cast("AsyncHandler", handler)(view)
        if kind is Kind.STREAM:
            streams, send_part, width = self.route(request)
            return await streams.run(
                cast("StreamHandler", handler), request, view, send_part, width
            )
        result = await anyio.to_thread.run_sync(
            cast("Callable[[HandlerRequest], object]", handler),
            view,
            limiter=self._limiters[served.wire],
        )
        if inspect.isawaitable(result):  # a plain callable that returns a coroutine
            result = await result
        return result
