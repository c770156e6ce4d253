"""The worker: a thin anyio driver around :class:`~dcp._core.worker.core.WorkerCore`."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import attrs
import zmq

from dcp._core.worker.core import BrokerLost, Output, Refused, Run, State, WorkerCore
from dcp._errors import AuthenticationFailed, RegistrationRefused, RemoteProtocolError
from dcp._io.beacon import BEACON_SCHEME, resolve
from dcp._io.clock import loop_clock
from dcp._io.handshake import HandshakeWatch
from dcp._io.lifecycle import BaseExceptionGroup, single_error
from dcp._io.security import CurveClient
from dcp._io.sockets import AsyncSocket
from dcp._models import Handler
from dcp._stats import WorkerStatistics
from dcp._worker.connection import (
    close_connection,
    open_connection,
    poll_monitor,
    send_message,
    send_part,
)
from dcp._worker.handlers import call_handler, drop, finish, handle, host_handlers, watch_loop
from dcp._worker.results import handler_name, is_async_handler
from dcp._worker.services import several_services
from dcp._worker.slots import HandlerSlots
from dcp._worker.streams import WorkerStreams, is_stream_handler

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from dcp._worker.services import ServiceTable
    from dcp._worker.tracing import WorkerTracing

__all__ = ["Worker"]

logger = logging.getLogger("dcp.worker")

_POLLIN = int(zmq.POLLIN)
#: Messages read per wake-up before other tasks get a turn.
_BATCH = 64
#: Linger (ms) of the socket closed after a graceful leave, so the last replies and the
#: RECONNECT reach the broker; zmq closes in the background, this never blocks us.
_LEAVE_LINGER_MS = 500


class Worker:
    """A DCP v1 worker serving ``service`` with a ``handler``, on trio or asyncio.

    ::

        async def handler(request: dcp.HandlerRequest) -> bytes:
            return request.data[0].upper()

        async with dcp.Worker("tcp://127.0.0.1:5555", "upper", handler, concurrency=8):
            ...

    or ``await tg.start(worker.serve)``, which returns once the broker has echoed the
    registration.

    The handler is an ``async def`` (it runs on the event loop: it must not block it) or a
    plain ``def`` (each call runs in a worker thread, at most ``concurrency`` at once, so CPU
    work or blocking calls never stop the heartbeats). Either kind is recognised also behind
    :func:`functools.partial`, as a bound method or as an object with ``__call__``. A thread
    cannot be interrupted: a plain ``def`` that outlives its request's work timeout, or a
    stop's grace, keeps its slot until it returns, and its result is then dropped (it may
    call :func:`anyio.from_thread.check_cancelled` to stop early). If the event loop is
    blocked for longer than ``heartbeat_interval`` all the same, the worker logs a warning
    naming the handler, once.

    It receives a :class:`~dcp.HandlerRequest`: ``request.metadata`` is the caller's own
    metadata; dcp's request id and options are in ``request.dcp_metadata``. It returns
    ``bytes`` (one data part), a sequence of ``bytes``, or a :class:`~dcp.Forward` to pass the
    request on to another service with the original client address and metadata (the
    reply, too, carries the metadata exactly as it came). A handler that raises is answered
    with a dcp error reply (code ``handler_error``, message ``"ExcType: text"``); one that
    returns anything else, with ``bad_handler_result``. Both are logged on the
    ``dcp.worker`` logger.

    Concurrency: at most ``concurrency`` handlers run at once; the worker asks for more work
    (PING) as soon as a request arrives and a slot is still free. See
    :mod:`dcp._core.worker.core` for the credit, heartbeat, liveness and backlog rules.

    Broker failures: after ``liveness * heartbeat_interval`` seconds without any message
    from the broker, the socket is closed and a fresh DEALER (new routing id, LINGER 0)
    reconnects after an exponential backoff with jitter (``reconnect_min`` to
    ``reconnect_max`` seconds) and registers again. A Reconnect (0x06) from the broker
    re-registers at once on the same socket. Handlers running when the broker vanished keep
    running; their results are sent on whatever socket is current when they finish (or right
    after the next registration if none is). Requests in the local backlog are dropped: the
    broker requeues what it dispatched, and clients retry. A request that waited in that
    backlog past its caller's deadline (the expires-in option) is not run: it is answered
    with an ``expired`` error reply (``statistics().expired``).

    Stopping (:meth:`stop`, :meth:`aclose`, leaving ``async with``): ask for no more work,
    let running handlers finish within ``grace`` seconds and cancel the rest (their requests
    get no reply), then send a Reconnect (0x06) to the broker (dcp extension: "I am leaving;
    requeue what I hold") and close the socket. Cancelling the task that runs :meth:`serve`
    cancels the handlers and closes the socket at once, without telling the broker.

    :param endpoint: the broker's zmq endpoint
    :param service: the service name (``str`` is UTF-8 encoded)
    :param handler: the function (``async def`` or plain ``def``) that serves one request
    :param services: instead of ``service`` and ``handler``, several services on one socket
        (``docs/services.md``): names to handlers or :class:`dcp.Service` objects (handler,
        concurrency, version, description, metadata, schemas); ``concurrency`` is then
        the sum of theirs
    :param concurrency: most requests handled at once
    :param heartbeat_interval: seconds between heartbeats (agreed with the broker)
    :param liveness: heartbeats the broker may miss before the worker reconnects
    :param reconnect_min: first reconnect delay, in seconds
    :param reconnect_max: longest reconnect delay, in seconds
    :param context: zmq context (default: one shared per process)
    :param security: CURVE keys (see ``docs/security.md``; default: no security)
    :param type_width: width of the type frame the worker writes: 1 (the spec, default) or 4
        (a little-endian ``int``, for the DagBox C++ reference broker, which aborts on 1-byte
        types). With 1 the worker answers in whatever width the broker last wrote; with 4
        every message (registration, heartbeats, replies, forwards, the leaving Reconnect)
        is 4 bytes from the first one on, whatever the broker writes: the explicit setting
        wins. Messages from the broker are read in either width.
    :param tracing: run each handler in an OpenTelemetry span continuing the request's trace
        (``docs/tracing.md``): ``True`` (the global tracer provider) or a ``TracerProvider``;
        needs ``pip install 'dagbox-dcp[otel]'`` (``ImportError`` naming it otherwise)

    A broker that refuses the registration (a secure broker whose allow-list does not let
    this worker's key serve ``service``) makes :meth:`serve` raise
    :exc:`dcp.RegistrationRefused`, and ``async with`` raise it on entry. A bad option (e.g.
    ``type_width`` not 1 or 4) raises :exc:`ValueError` at construction, before any socket
    exists.
    """

    #: Default seconds that running handlers get to finish when the worker stops.
    DEFAULT_GRACE = 10.0

    def __init__(
        self,
        endpoint: str,
        service: str | bytes | None = None,
        handler: Handler | None = None,
        *,
        services: ServiceTable | None = None,
        concurrency: int = 1,
        heartbeat_interval: float = 1.0,
        liveness: int = 3,
        reconnect_min: float = 0.1,
        reconnect_max: float = 5.0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        security: CurveClient | None = None,
        type_width: int = 1,
        tracing: bool | TracerProvider = False,
    ) -> None:
        self.endpoint = endpoint
        #: Spans of the handlers (docs/tracing.md); ``None``: tracing off (costs one test).
        self._tracing: WorkerTracing | None = None
        if tracing:
            from dcp._worker.tracing import WorkerTracing  # imports OpenTelemetry: only when asked

            self._tracing = WorkerTracing(tracing)
        self._security = security
        #: Why serving ended for good: a refused registration or a failed handshake.
        self._refused: RegistrationRefused | AuthenticationFailed | None = None
        several = several_services(service, handler, services)
        if several is not None:
            # docs/services.md: one dispatching handler; concurrency is the services' sum.
            service, handler, concurrency = several.first, several.handler, several.concurrency
        assert service is not None and handler is not None
        self.service = service.encode() if isinstance(service, str) else bytes(service)
        self._handler = handler
        self._is_async = is_async_handler(handler)
        #: An async generator function streams its answer (docs/streams.md).
        self._streaming = is_stream_handler(handler)
        self._streams = WorkerStreams()
        self._handler_name = handler_name(handler)
        #: Bounds the threads of a plain ``def`` handler (made in :meth:`serve`).
        self._threads: anyio.CapacityLimiter | None = None
        self._context = context
        self._core = WorkerCore(
            self.service,
            concurrency=concurrency,
            heartbeat_interval=heartbeat_interval,
            liveness=liveness,
            reconnect_min=reconnect_min,
            reconnect_max=reconnect_max,
            type_width=type_width,
            more_services=() if several is None else several.more,
            infos=None if several is None else several.infos,
        )
        self._asock: AsyncSocket | None = None
        self._watch_scope: anyio.CancelScope | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._amonitor: AsyncSocket | None = None
        self._watch = HandshakeWatch(endpoint, secure=security is not None, role="worker")
        #: Handshakes that succeeded on the current socket (the first is the first connection).
        self._handshakes = 0
        self._tg: anyio.abc.TaskGroup | None = None
        #: The handlers' slots (_worker_slots.py): cancelling them cancels them all.
        self._handlers: HandlerSlots[Run] | None = None
        self._wake_scope: anyio.CancelScope | None = None
        self._stop_deadline: float | None = None
        self._task_status: anyio.abc.TaskStatus[None] | None = None
        self._serving = False
        self._done: anyio.Event | None = None
        self._cm_tg: anyio.abc.TaskGroup | None = None
        self._send_failures = 0
        #: The event loop's clock (anyio.current_time without its lookup; set in serve).
        self._now: Callable[[], float] = anyio.current_time

    # -- public API -----------------------------------------------------------------------

    def statistics(self) -> WorkerStatistics:
        """Counters: requests received, replies, forwards, errors, in progress, backlog,
        reconnects and more (see :class:`WorkerStatistics`)."""
        return attrs.evolve(self._core.statistics(), send_failures=self._send_failures)

    @property
    def registered(self) -> bool:
        """True while the broker has confirmed our registration on the current socket."""
        return self._core.state is State.READY

    def stop(self, *, grace: float | None = None) -> None:
        """Begin a graceful stop and return at once; :meth:`serve` returns when done.

        Call it from the worker's event loop. A second call can only shorten the grace.

        :param grace: seconds running handlers get to finish (default :attr:`DEFAULT_GRACE`)
        """
        deadline = anyio.current_time() + (self.DEFAULT_GRACE if grace is None else grace)
        if self._stop_deadline is None or deadline < self._stop_deadline:
            self._stop_deadline = deadline
        self._core.stop()
        self._wake()

    async def aclose(self, *, grace: float | None = None) -> None:
        """Stop gracefully (see :meth:`stop`) and wait until :meth:`serve` has returned.

        Idempotent. If cancelled while waiting, the stop goes on in the serving task.
        """
        self.stop(grace=grace)
        if self._done is not None:
            await self._done.wait()

    async def __aenter__(self) -> Worker:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await tg.start(self.serve)
        except BaseException as exc:
            tg.cancel_scope.cancel()
            try:
                await tg.__aexit__(type(exc), exc, exc.__traceback__)
            except BaseExceptionGroup as group:
                raise single_error(group) from None
            raise
        self._cm_tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._cm_tg = self._cm_tg, None
        if tg is None:
            return None
        self.stop()
        try:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                return await tg.__aexit__(exc_type, exc, tb)
            # Anything else from the body propagates unwrapped once the stop has completed.
            await tg.__aexit__(None, None, None)
        except BaseExceptionGroup as group:
            raise single_error(group) from None
        return None

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, register, report readiness through ``task_status`` once the broker has
        echoed the registration, and serve until stopped.

        Cancellation cancels the running handlers and closes the socket (linger 0) at once.

        :raises RuntimeError: this worker is serving or has served already
        :raises RegistrationRefused: the broker refused the registration
        :raises AuthenticationFailed: the broker will not talk to this worker (its key is
            refused, one side uses CURVE and the other not, or the broker key is wrong)
        """
        if self._serving:
            raise RuntimeError("a Worker can serve only once")
        self._serving = True
        if self.endpoint.startswith(BEACON_SCHEME):  # docs/services.md: a beacon to listen to
            key = None if self._security is None else self._security.server_key
            self.endpoint = await resolve(self.endpoint, key=key)
        self._done = anyio.Event()
        self._task_status = task_status
        self._now = loop_clock()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._threads = anyio.CapacityLimiter(self._core.concurrency)
                watchdog = anyio.CancelScope()
                tg.start_soon(self._watch_loop, watchdog)
                self._handlers = await tg.start(self._host_handlers)
                try:
                    await self._run()
                finally:
                    watchdog.cancel()
                    self._close(0)
                    self._cancel_handlers()
        finally:
            self._tg = None
            self._done.set()
        if self._refused is not None:
            raise self._refused

    # -- the serving task -------------------------------------------------------------------

    async def _run(self) -> None:
        core = self._core
        while self._stop_deadline is None:
            self._open()
            core.connect(anyio.current_time())
            outs, core.outbox = core.outbox, []
            for out in outs:
                self._do(out)
            lost = await self._session()
            self._streams.cancel_all()  # the broker forgot our streams
            if lost is None:
                return
            self._close(0)
            logger.warning("broker %s silent; reconnecting in %.2fs", self.endpoint, lost.delay)
            await self._wait(anyio.current_time() + lost.delay)
        # Stopping without a connection: let the handlers finish, then leave.
        deadline = self._stop_deadline
        while core.in_progress and anyio.current_time() < deadline:
            await self._wait(deadline)
        self._cancel_handlers()
        core.leave()
        core.outbox = []  # disconnected: nothing to send

    async def _session(self) -> BrokerLost | None:
        """Serve one connection; ``None`` once we left gracefully, else why it ended."""
        core = self._core
        asock = self._asock
        assert asock is not None
        while True:
            self._poll_monitor()
            if self._refused is not None:  # the handshake failed (see _poll_monitor)
                return None
            now = self._now()
            if self._stop_deadline is not None and (
                core.in_progress == 0 or now >= self._stop_deadline
            ):
                self._cancel_handlers()
                core.leave()
                outs, core.outbox = core.outbox, []
                for out in outs:
                    self._do(out)
                self._close(_LEAVE_LINGER_MS)
                return None
            core.tick(now)
            outs, core.outbox = core.outbox, []
            for out in outs:
                if isinstance(out, BrokerLost):
                    return out
                self._do(out)
            deadline = core.deadline()
            if self._stop_deadline is not None:
                deadline = min(deadline, self._stop_deadline)
            await asock.wait_readable(deadline)
            batch = asock.drain(_BATCH)
            now = self._now()
            if batch and logger.isEnabledFor(logging.DEBUG):  # once per batch
                for received in batch:
                    logger.debug(
                        "from broker %s: %d frame(s), %d bytes",
                        self.endpoint,
                        len(received.frames),
                        sum(len(f) for f in received.frames),
                    )
            for received in batch:
                if self._streams.receive(received.frames):
                    continue  # a stream's credit or cancel (_worker_streams.py)
                try:
                    core.receive(received.frames, now)
                except RemoteProtocolError as exc:
                    logger.warning("malformed message from broker (%s): %s", exc.reason, exc)
                    continue
                outs, core.outbox = core.outbox, []
                for out in outs:
                    if isinstance(out, Refused):
                        logger.error(
                            "broker %s refused the registration for %r: %s",
                            self.endpoint,
                            self.service,
                            out.message,
                        )
                        self._refused = RegistrationRefused(
                            out.service or self.service, out.message
                        )
                        return None
                    self._do(out)
                if core.state is State.READY and self._task_status is not None:
                    logger.info(
                        "worker for service %r registered at %s", self.service, self.endpoint
                    )
                    self._task_status.started()
                    self._task_status = None
            # Let the handlers run between batches, however busy the socket is, and before
            # parking again: the requests just read are answered first (the run loop's pass
            # is the same one; the wait's setup comes after their replies have left).
            if batch:
                await anyio.lowlevel.checkpoint()

    async def _wait(self, deadline: float) -> None:
        """Sleep until ``deadline`` or until :meth:`_wake`."""
        if deadline == math.inf:  # pragma: no cover - callers always pass a finite one
            raise AssertionError("unbounded wait")
        with anyio.CancelScope(deadline=deadline) as scope:
            self._wake_scope = scope
            try:
                await anyio.sleep_forever()
            finally:
                self._wake_scope = None

    def _wake(self) -> None:
        if self._wake_scope is not None:
            self._wake_scope.cancel()
        if self._asock is not None:
            self._asock.wake()

    # -- the connection (dcp/_worker/connection.py; methods, so that the hot path makes the
    # -- same calls as when they were written here) ------------------------------------------

    _open = open_connection
    _poll_monitor = poll_monitor
    _close = close_connection
    _send = send_message
    _send_part = send_part

    def _do(self, out: Output) -> None:
        if isinstance(out, Run):
            assert self._handlers is not None
            self._handlers.submit(out)
        elif isinstance(out, (BrokerLost, Refused)):  # pragma: no cover - handled by _session
            raise AssertionError(out)
        else:
            self._send(out)

    # -- handlers (dcp/_worker/handlers.py; methods, for the same reason) -------------------

    _host_handlers = host_handlers
    _watch_loop = watch_loop
    _handle = handle
    _drop = drop
    _finish = finish
    _call = call_handler

    def _cancel_handlers(self) -> None:
        if self._handlers is not None:
            self._handlers.cancel()
