"""The worker: :class:`Worker`, the thin public anyio driver, composed of parts that each own
their state.

None of the parts reads another's privates:

- the sans-IO core, :class:`~dcp._core.worker.core.WorkerCore` (registration, credit,
  heartbeats, liveness; the messages to send and the events to act on);
- the connection, :class:`~dcp._worker.connection.Connection` (the DEALER socket, its
  handshake monitor, sending);
- the handlers, :class:`~dcp._worker.handlers.Handlers` (their slots, one request's run, its
  answer given to the core);
- the streams, :class:`~dcp._worker.streams.WorkerStreams`.

Given several endpoints, the worker serves each broker through a :class:`~dcp._worker.brokers.
Link` (its own core and connection) and one handler pool (:class:`~dcp._worker.brokers.Brokers`,
Rules WB1-WB5); the serving tasks below are the one-broker worker's.

The serving task runs one connection at a time: it gives the core the broker's messages and
the time, sends what the core drains, starts its runs, and sleeps until the next message or
the core's next deadline. :meth:`Worker.serve` only starts it and waits for it to end.

Rules:

Rule WL1 - Leader and followers. At any time one serving task leads: it alone waits on the
  socket, reads it, keeps the core's time and does what the core asks. Once the core has
  seen every message of a batch it read (so that it asks for more work as requests pile
  up, core Rule W2), it runs the batch's requests itself, in order, when the handlers allow
  it (Rule WH6 of :mod:`dcp._worker.handlers`): to the end if the handler never suspends,
  its reply sent with no task switch, and then, the same way, the requests its finish
  starts from the core's backlog (a prefetching worker's, core Rule W4). The first time
  such a handler suspends, and before the event loop runs anything else, the batch's later
  requests (and those it starts from the backlog) go to the slots and the
  serving duties pass to a parked serving task (or a new one); the task that ran the
  handler parks once it has answered. So heartbeats, the broker's messages and the stop
  rules are served while a handler runs, however long it takes; at most ``concurrency +
  1`` serving tasks exist. They live in the handlers' task group: cancelling the handlers
  cancels the requests they run.
Rule WL2 - Each inline run is stepped in a copy of the context of the task that called
  :meth:`Worker.serve` (as a slot's run, Rule SL2 of :mod:`dcp._worker.slots`), never in
  that of the serving task or of an earlier request.
Rule WL3 - Yielding. After a batch, the leading task yields to the event loop before it
  waits again if it gave requests to the slots (their replies leave first), if the batch
  was full, or after every few batches all inline: other tasks get their turn however busy
  the socket is.
Rule WL4 - Between waits, the leading task reads the connection's monitor and gives the core
  the time only when something may be due: the core's deadline has passed, the core has
  output (the monitor's task found a new connection), or a stop is under way. Otherwise
  the monitor's own task applies its events (Rule WC1 of :mod:`dcp._worker.connection`)
  and wakes the leading task; a finishing request reads it before its answer is sent.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import attrs
import zmq

from dcp._core.worker.core import (
    BrokerLost,
    Event,
    Malformed,
    Refused,
    Replays,
    Run,
    State,
    WorkerCore,
)
from dcp._errors import RegistrationRefused
from dcp._io.beacon import BEACON_SCHEME, resolve
from dcp._io.clock import loop_clock
from dcp._io.endpoints import check_peer_endpoint
from dcp._io.lifecycle import BaseExceptionGroup, Lifecycle, ki_protected, single_error
from dcp._io.security import CurveClient
from dcp._io.sockets import AsyncSocket, Received
from dcp._models import Handler, service_name
from dcp._stats import WorkerStatistics
from dcp._worker.brokers import Brokers, Link
from dcp._worker.connection import Connection
from dcp._worker.handlers import Handlers, capacity, names
from dcp._worker.services import served_services
from dcp._worker.slots import park
from dcp._worker.streams import WorkerStreams

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from dcp._worker.services import ServiceTable
    from dcp._worker.tracing import WorkerTracing

__all__ = ["Worker"]

logger = logging.getLogger("dcp.worker")

#: Messages read per wake-up before other tasks get a turn.
_BATCH = 64
#: Batches served inline at most before the serving task yields all the same (Rule WL3).
_UNYIELDED = 8


def check_endpoints(endpoint: str | Sequence[str]) -> tuple[str, ...]:
    """The brokers' endpoints: one ``str`` (not split at commas), or a sequence of them.

    :raises ValueError: an empty sequence, an endpoint given twice, or a malformed one
        (named)
    """
    if isinstance(endpoint, str):
        return (check_peer_endpoint(endpoint),)
    endpoints = tuple(endpoint)
    if not endpoints:
        raise ValueError("no broker endpoint given (an empty list)")
    seen: set[str] = set()
    for one in endpoints:
        if not isinstance(one, str):
            raise ValueError(f"a broker endpoint must be a str, not {type(one).__name__}")
        check_peer_endpoint(one)
        if one in seen:
            raise ValueError(f"broker endpoint {one!r} given twice")
        seen.add(one)
    return endpoints


class _HandedOff:
    """What a serving task's session returns once another task leads (Rule WL1)."""


_HANDED_OFF = _HandedOff()
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
    registration (or once a :meth:`stop` before it has ended serving).

    The handler is an ``async def`` (it runs on the event loop: it must not block it) or a
    plain ``def`` (each call runs in a worker thread, at most ``concurrency`` at once, so CPU
    work or blocking calls never stop the heartbeats). Either kind is recognised also behind
    :func:`functools.partial`, as a bound method or as an object with ``__call__``. A thread
    cannot be interrupted: a plain ``def`` that outlives its request's work timeout, or a
    stop's grace, keeps its slot until it returns, and its result is then dropped (it may
    call :func:`anyio.from_thread.check_cancelled` to stop early). If the event loop is
    blocked for longer than ``heartbeat_interval`` all the same, the worker logs a warning
    naming the handler, once.

    It receives a :class:`~dcp.HandlerRequest`: ``request.service`` is its service's name (a
    ``str``), ``request.metadata`` the caller's own metadata; dcp's request id and options
    are in ``request.dcp_metadata``. It returns ``bytes`` (one data part), a ``str`` (sent as
    UTF-8), a sequence of them, :func:`dcp.json_reply` of an object (for a caller of
    :meth:`~dcp.Client.request_json`), or a :class:`~dcp.Forward` to pass the request on to
    another service with the original client address and metadata (the reply, too, carries
    the metadata exactly as it came). A handler that raises is answered with a dcp error
    reply (code ``handler_error``, message ``"ExcType: text"``); one that returns anything
    else, with ``bad_handler_result``. Both are logged on the ``dcp.worker`` logger, under the
    request's service. At INFO it logs when it serves (once the broker has echoed the
    registration) and when a stop begins (how many requests it is finishing).

    Handlers are checked here, not by the first request: a handler must be callable with one
    positional argument, and be an ``async def``, a plain ``def`` or an async generator
    function (a stream, ``docs/streams.md``), not a plain ``def`` generator.

    Concurrency: at most ``concurrency`` handlers run at once; the worker asks for more work
    (PING) as soon as a request arrives and a slot is still free. See
    :mod:`dcp._core.worker.core` for the credit, heartbeat, liveness and backlog rules.

    Prefetch (opt-in, ``docs/reliability.md``): with ``prefetch=P`` the worker asks for up to
    ``P`` requests beyond its free slots while they are busy; those wait in the worker (its
    backlog: ``statistics().backlog``) and start in arrival order as slots free, with no
    round trip to the broker (a request that ends without suspending starts the next in the
    same task). The trade: a prefetched request may wait behind a slow one while another
    worker is idle. A prefetched request is held by the broker: redelivered if the worker
    dies, given back by a graceful stop; one whose caller's deadline passed while it waited
    is answered ``expired``; a work timeout counts from its handler's start.

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

    Several brokers (``docs/scaling.md``): given a list of endpoints, the worker registers with
    every broker (a connection each: its own heartbeats, liveness, reconnects and re-registrations)
    and serves them from one pool: at most ``concurrency`` handlers run at once across all of them.
    Each broker may grant up to ``concurrency`` requests (plus the prefetch), so the worker may
    hold up to ``len(endpoints) x (concurrency + prefetch)``, those beyond the free slots waiting
    in the worker, first come first run (one that waited past its caller's deadline, counted from
    its arrival at the worker, is answered ``expired``). An answer goes back through the broker
    that brought the request (through any other registered broker if that one is down). A request
    whose dcp request id the worker holds (running or waiting) is not run again whichever broker
    brings it: its answer goes through both; one it answered in the last ``liveness x
    heartbeat_interval`` seconds is answered again from the kept answer without running; after that
    it runs again (``statistics().duplicates`` counts both). When a broker is lost, the requests it
    brought that the worker still holds (running or waiting, its prefetch from that broker
    included) are announced to their clients through the other brokers (a HELD notice), with the
    answers the worker would replay to it. :meth:`serve` reports readiness once the first broker
    has echoed the registration; a refusal or a failed handshake at any broker ends serving.
    :meth:`brokers` gives each broker's counters and state; :meth:`statistics` their sum.

    Stopping (:meth:`stop`, :meth:`aclose`, leaving ``async with``): ask for no more work,
    let running handlers finish within ``grace`` seconds and cancel the rest (their requests
    get no reply), then send a Reconnect (0x06) to the broker (dcp extension: "I am leaving;
    requeue what I hold") and close the socket. With several brokers, what a lost broker
    brought and the worker announced held is run within the grace too (no broker would
    requeue it). Cancelling the task that runs :meth:`serve` cancels the handlers and
    closes the socket at once, without telling the broker.

    :param endpoint: the broker's zmq endpoint, or a sequence of them to serve several
        brokers (a ``str`` is one endpoint: commas are not split); ``beacon://`` entries are
        resolved when serving starts. An empty sequence, an endpoint given twice or a
        malformed one: :exc:`ValueError` naming it, here
    :param service: the service name (UTF-8 on the wire; ``bytes`` are accepted)
    :param handler: the function (``async def``, plain ``def`` or async generator) that
        serves one request
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
    :param prefetch: requests asked for beyond ``concurrency`` while every slot is busy
        (default 0: none); with several brokers, per broker. Not an ``int`` of 0 or more:
        :exc:`ValueError`

    A broker that refuses the registration (a secure broker whose allow-list does not let
    this worker's key serve ``service``) makes :meth:`serve` raise
    :exc:`dcp.RegistrationRefused`, and ``async with`` raise it on entry. A bad option (e.g.
    ``type_width`` not 1 or 4) raises :exc:`ValueError` at construction, before any socket
    exists.

    :raises TypeError: a handler that is not one, or a service mapping that is not (the
        message names the service and what is wrong)
    :raises ValueError: an empty or repeated service name, or a bad option
    """

    #: Default seconds that running handlers get to finish when the worker stops.
    DEFAULT_GRACE = 10.0

    def __init__(
        self,
        endpoint: str | Sequence[str],
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
        prefetch: int = 0,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int, 0 or more, not {prefetch!r}")
        endpoints = check_endpoints(endpoint)  # a ValueError now, not zmq's EINVAL
        #: Every broker's endpoint, in the order given (beacons resolved once serving).
        self.endpoints: tuple[str, ...] = endpoints
        #: The first of :attr:`endpoints`.
        self.endpoint: str = endpoints[0]
        # Spans of the handlers (docs/tracing.md); None: tracing off (costs one test).
        traced: WorkerTracing | None = None
        if tracing:
            from dcp._worker.tracing import WorkerTracing  # imports OpenTelemetry: only when asked

            traced = WorkerTracing(tracing)
        self._security = security
        #: Why serving ended for good: a refused registration (a failed handshake is the
        #: connection's :attr:`~dcp._worker.connection.Connection.failure`).
        self._refused: RegistrationRefused | None = None
        served = served_services(service, handler, services, concurrency)
        #: The services served (Rule WV2 of dcp._worker.services: names are str).
        self.services: tuple[str, ...] = tuple(s.name for s in served)
        #: The first of :attr:`services` (the one, in the one-service form).
        self.service: str = served[0].name
        self._names = names(served)
        # The parts (each owns its state; none reads another's privates):

        def make_core() -> WorkerCore:
            return WorkerCore(
                served[0].wire,
                # docs/services.md: the broker's credit is the services' sum.
                concurrency=sum(s.concurrency for s in served),
                heartbeat_interval=heartbeat_interval,
                liveness=liveness,
                reconnect_min=reconnect_min,
                reconnect_max=reconnect_max,
                type_width=type_width,
                more_services=tuple(s.wire for s in served[1:]),
                infos={s.wire: s.info for s in served if s.info is not None},
                prefetch=prefetch,
            )

        def connect(
            core: WorkerCore, streams: WorkerStreams, wake: Callable[[], None], *, endpoint: str
        ) -> Connection:
            return Connection(
                core,
                streams,
                endpoint=endpoint,
                services=self._names,
                context=context,
                security=security,
                wake=wake,
            )

        self._core = make_core()
        links: list[Link] = []
        if len(endpoints) == 1:
            self._streams = WorkerStreams()
            self._connection = connect(
                self._core, self._streams, self._wake, endpoint=endpoints[0]
            )
        else:  # several brokers: a link each (dcp._worker.brokers)
            for i, one in enumerate(endpoints):
                links.append(
                    Link(
                        self._core if i == 0 else make_core(),
                        functools.partial(connect, endpoint=one),
                    )
                )
            self._streams = links[0].streams
            self._connection = links[0].connection
        self._handlers = Handlers(
            self._core,
            self._connection,
            self._streams,
            served,
            tracing=traced,
            wake=self._wake,
        )
        #: Several brokers: their links and the pool (``None``: one broker).
        self._brokers = (
            Brokers(links, self._handlers, names=self._names, ready=self._announce)
            if links
            else None
        )
        self._wake_scope: anyio.CancelScope | None = None
        #: Listening for a ``beacon://`` endpoint's beacon: the scope :meth:`stop` cancels.
        self._resolving: anyio.CancelScope | None = None
        self._stop_deadline: float | None = None
        self._serving = False
        self._done: anyio.Event | None = None
        # The serving tasks (Rule WL1). Set in serve: the task group of the connection's
        # monitor; the events ``_ready`` (the registration was echoed: ``_announced``, or
        # serving ended) and ``_ended`` (serving ended; ``_error``, what ended it if raised).
        self._tg: anyio.abc.TaskGroup
        self._ready: anyio.Event
        self._ended: anyio.Event
        self._announced = False
        self._error: Exception | None = None
        #: The context of the task that called serve: inline runs get a copy each (Rule WL2).
        self._context = contextvars.copy_context()
        #: Serving tasks parked until they lead again, the most recently parked last.
        self._parked: list[anyio.Event] = []
        #: The socket the next leading task takes up (``None``: a fresh connection).
        self._resume: AsyncSocket | None = None
        #: The requests of the batch being run inline, and the index of the next one.
        self._rest: tuple[list[Run], int] = ([], 0)
        #: ``async with worker``: :meth:`serve` in a task group of its own, stopped gracefully.
        self._lifecycle = Lifecycle("a Worker can serve only once")
        #: The event loop's clock (anyio.current_time without its lookup; set in serve).
        self._now: Callable[[], float] = anyio.current_time

    # -- public API -----------------------------------------------------------------------

    def statistics(self) -> WorkerStatistics:
        """Counters: requests received, replies, forwards, errors, in progress, backlog,
        reconnects and more (see :class:`WorkerStatistics`)."""
        if self._brokers is not None:
            return self._brokers.statistics()
        return attrs.evolve(
            self._core.statistics(),
            send_failures=self._connection.send_failures,
            replays_dropped=self._connection.replays_dropped,
            registered=self._core.state is State.READY,
        )

    def brokers(self) -> dict[str, WorkerStatistics]:
        """Each broker's counters and state, by endpoint, in the order given: requests it
        brought (``received``), answers sent through it (``replies``...), ``reconnects``,
        ``duplicates`` (requests it brought that another broker brought first), and
        ``registered`` (whether it has confirmed the registration now). With one broker,
        ``{endpoint: statistics()}``."""
        if self._brokers is None:
            return {self.endpoint: self.statistics()}
        return {link.endpoint: link.statistics() for link in self._brokers.links}

    @property
    def registered(self) -> bool:
        """True while a broker has confirmed our registration on its current socket (with
        several brokers: any of them; :meth:`brokers` tells which)."""
        if self._brokers is not None:
            return any(link.core.state is State.READY for link in self._brokers.links)
        return self._core.state is State.READY

    # The parts the worker is made of, for tests and debugging: internals, whose names and
    # methods change without notice (docs/internals).

    def stop(self, *, grace: float | None = None) -> None:
        """Begin a graceful stop and return at once; :meth:`serve` returns when done.

        Call it from the worker's event loop. A second call can only shorten the grace.

        :param grace: seconds running handlers get to finish (default :attr:`DEFAULT_GRACE`)
        """
        grace = self.DEFAULT_GRACE if grace is None else grace
        deadline = anyio.current_time() + grace
        brokers = self._brokers
        if self._stop_deadline is None and self._serving:
            logger.info(
                "worker for %s stopping: finishing %d request(s) in progress, for at most %g s",
                self._names,
                self._core.in_progress if brokers is None else brokers.in_progress(),
                grace,
            )
        if self._stop_deadline is None or deadline < self._stop_deadline:
            self._stop_deadline = deadline
        if self._resolving is not None:  # no broker yet: stop listening for its beacon
            self._resolving.cancel()
        if brokers is not None:
            brokers.stop(deadline)
            return
        self._core.stop()
        self._wake()

    async def aclose(self, *, grace: float | None = None) -> None:
        """Stop gracefully (see :meth:`stop`) and wait until :meth:`serve` has returned.

        Idempotent. If cancelled while waiting, the stop goes on in the serving task.
        """
        self.stop(grace=grace)
        if self._done is not None:
            await self._done.wait()

    @ki_protected  # dcp._io.lifecycle Rule E6
    async def __aenter__(self) -> Worker:
        await self._lifecycle.enter(self.serve, stop=self.stop, cancel=False)
        return self

    @ki_protected
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._lifecycle.exit(exc)

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, register, report readiness through ``task_status`` once the broker has
        echoed the registration, and serve until stopped.

        A :meth:`stop` before the broker has echoed the registration (a broker not started
        yet, a wrong endpoint, a ``beacon://`` endpoint not heard yet) ends serving at once,
        nothing being in progress, and reports readiness as it returns, once the socket is
        closed: ``await tg.start(worker.serve)`` then returns (:attr:`registered` is
        ``False``) rather than raise anyio's ``RuntimeError`` for a task that never started.

        Cancellation cancels the running handlers and closes the socket (linger 0) at once.

        :raises RuntimeError: this worker is serving or has served already
        :raises RegistrationRefused: the broker refused the registration
        :raises AuthenticationFailed: the broker will not talk to this worker (its key is
            refused, one side uses CURVE and the other not, or the broker key is wrong)
        """
        if self._serving:
            raise RuntimeError("a Worker can serve only once")
        self._serving = True
        self._done = anyio.Event()
        if self._brokers is not None:
            await self._serve_several(self._brokers, task_status)
            return
        if self.endpoint.startswith(BEACON_SCHEME):  # docs/services.md: a beacon to listen to
            endpoint = await self._resolve(self.endpoint)
            if endpoint is None:  # stopped before a beacon was heard: done
                self._done.set()
                task_status.started()
                return
            self.endpoint = self._connection.endpoint = endpoint
        self._ready = anyio.Event()
        self._ended = anyio.Event()
        self._now = loop_clock()
        # The context each inline run gets a copy of (Rule WL2): this task's, as a slot's.
        self._context = contextvars.copy_context()
        handlers = self._handlers
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                watchdog = anyio.CancelScope()
                tg.start_soon(handlers.watch_loop, watchdog)
                await tg.start(handlers.host)
                try:
                    self._lead(None)  # Rule WL1: the first serving task
                    await self._ready.wait()
                    if self._announced:
                        task_status.started()
                    await self._ended.wait()
                finally:
                    watchdog.cancel()
                    self._connection.close(0)
                    handlers.cancel()
        finally:
            self._done.set()
        error = self._error or self._refused or self._connection.failure
        if error is not None:
            raise error
        if not self._announced:  # stopped before the registration was echoed: done
            task_status.started()

    async def _serve_several(
        self, brokers: Brokers, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        """:meth:`serve` with several brokers (:mod:`dcp._worker.brokers`)."""
        done = self._done
        assert done is not None  # set by serve
        for link in brokers.links:
            if link.endpoint.startswith(BEACON_SCHEME):  # docs/services.md: a beacon
                endpoint = await self._resolve(link.endpoint)
                if endpoint is None:  # stopped before a beacon was heard: done
                    done.set()
                    task_status.started()
                    return
                link.connection.endpoint = endpoint
        self.endpoints = tuple(link.endpoint for link in brokers.links)
        self.endpoint = self.endpoints[0]
        self._ready = anyio.Event()
        self._ended = anyio.Event()
        handlers = self._handlers
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                watchdog = anyio.CancelScope()
                tg.start_soon(handlers.watch_loop, watchdog)
                await tg.start(handlers.host)
                try:
                    tg.start_soon(self._several, brokers)
                    await self._ready.wait()
                    if self._announced:
                        task_status.started()  # registered at one broker at least
                    await self._ended.wait()
                finally:
                    watchdog.cancel()
                    brokers.close()
                    handlers.cancel()
        finally:
            done.set()
        error = self._error or brokers.refused
        for link in brokers.links:
            error = error or link.connection.failure
        if error is not None:
            raise error
        if not self._announced:  # stopped before any broker echoed the registration: done
            task_status.started()

    async def _resolve(self, endpoint: str) -> str | None:
        """The broker endpoint a ``beacon://`` endpoint's beacon gives; ``None`` if a
        :meth:`stop` came before or while listening (it ends serving, as before the echo)."""
        if self._stop_deadline is not None:
            return None
        key = None if self._security is None else self._security.server_key
        with anyio.CancelScope() as scope:
            self._resolving = scope
            try:
                return await resolve(endpoint, key=key)
            except BaseException:  # no beacon, cancelled: serve() ends, aclose() need not wait
                if self._done is not None:
                    self._done.set()
                raise
            finally:
                self._resolving = None
        return None

    async def _several(self, brokers: Brokers) -> None:
        try:
            await brokers.serve()
        except Exception as exc:  # ends serving: serve() raises it
            one = single_error(exc) if isinstance(exc, BaseExceptionGroup) else exc
            self._error = one if isinstance(one, Exception) else exc  # dcp._io.lifecycle E4
        finally:
            self._ended.set()
            self._ready.set()

    def _announce(self) -> None:
        """The first broker echoed the registration (several brokers)."""
        self._announced = True
        self._ready.set()

    # -- the serving tasks ------------------------------------------------------------------

    def _lead(self, resume: AsyncSocket | None) -> None:
        """Give the serving duties to a parked serving task, or a new one (Rule WL1), to
        take up the session on ``resume`` (``None``: from a fresh connection)."""
        self._resume = resume
        if self._parked:
            self._parked.pop().set()
            return
        slots = self._handlers.slots
        assert slots is not None
        # Started in this worker's context, not in that of the handler that suspended.
        self._context.run(slots.start_soon, self._serving_task)

    def _hand_off(self) -> None:
        """An inline run suspended (Rule WL1): the rest of its batch goes to the slots, and
        another task takes the socket over."""
        runs, index = self._rest
        self._handlers.inline_run = None  # its finish now starts a backlog request in a slot
        slots = self._handlers.slots
        assert slots is not None
        for run in runs[index:]:
            slots.submit(run)
        asock = self._connection.socket
        assert asock is not None  # the session that ran it is still on
        self._lead(asock)

    async def _serving_task(self) -> None:
        """Serve while leading; park after an inline run that handed the socket on."""
        parked = self._parked
        while True:
            resume, self._resume = self._resume, None
            try:
                result = await self._run(resume)
            except Exception as exc:  # ends serving: serve() raises it
                self._error = exc
                result = None
            if result is not _HANDED_OFF:
                self._ended.set()
                self._ready.set()
                return
            await park(parked)

    async def _run(self, resume: AsyncSocket | None) -> _HandedOff | None:
        core = self._core
        connection = self._connection
        while resume is not None or self._stop_deadline is None:
            if resume is None:
                asock = connection.open(self._tg)
                core.connect(anyio.current_time())
                self._flush()
                lost = await self._session(asock)
            else:
                lost = await self._session(resume)
                resume = None
            if lost is _HANDED_OFF:
                return _HANDED_OFF
            self._streams.cancel_all()  # the broker forgot our streams
            if lost is None:
                return None
            assert type(lost) is BrokerLost
            refused = connection.refused  # said already (dcp._worker.connection Rule WC8)
            connection.close(0)
            logger.log(
                logging.DEBUG if refused else logging.WARNING,
                "broker %s silent; reconnecting in %.2fs",
                self.endpoint,
                lost.delay,
            )
            await self._wait(anyio.current_time() + lost.delay)
        # Stopping without a connection: let the handlers finish, then leave.
        deadline = self._stop_deadline
        assert deadline is not None
        while core.in_progress and anyio.current_time() < deadline:
            await self._wait(deadline)
        self._handlers.cancel()
        core.leave()
        core.drain()  # disconnected: nothing to send
        return None

    async def _session(self, asock: AsyncSocket) -> BrokerLost | _HandedOff | None:
        """Serve one connection; ``None`` once we left gracefully (or must stop: refused),
        :data:`_HANDED_OFF` once this task ran a request that suspended (another took
        over, Rule WL1), else why the connection ended."""
        core = self._core
        connection = self._connection
        send = connection.send
        streams_receive = self._streams.receive
        handlers = self._handlers
        slots = handlers.slots
        assert slots is not None
        submit = slots.submit
        inline = handlers.inline
        run_inline = handlers.run_inline
        context = self._context
        hand_off = self._hand_off
        unyielded = 0
        batch: list[Received] = []
        now = self._now()
        while True:
            submitted = False
            runs: list[Run] = []
            for received in batch:
                frames = received.frames
                if streams_receive(frames):
                    continue  # a stream's credit or cancel (dcp/_worker/streams.py)
                core.receive(frames, now)
                # What _flush does, inline: the hot path (a request in, its Run out).
                outbox, events = core.drain()
                for out in outbox:
                    send(out)
                for event in events:
                    if type(event) is Run:
                        if inline:
                            runs.append(event)
                        else:
                            submit(event)
                            submitted = True
                    elif self._act(event):
                        for run in runs:  # refused: the slots account for them (Rule SL3)
                            submit(run)
                        return None
                if not self._announced and core.state is State.READY:
                    logger.info(
                        "worker serving %s at %s (%s)",
                        self._names,
                        self.endpoint,
                        capacity(core.concurrency, core.prefetch),
                    )
                    self._announced = True
                    self._ready.set()
            # Rule WL1: the batch's requests, run here once the core has seen them all;
            # should one suspend, the rest go to the slots and another task leads.
            # A request that a finished run starts from the core's backlog (a prefetch, core
            # Rule W4) is appended to ``runs`` by the finish (Rule WH6): run next, here too.
            if runs:
                handlers.chain = runs
                for i, run in enumerate(runs):
                    self._rest = (runs, i + 1)
                    handlers.inline_run = run
                    running = run_inline(run, context.copy(), hand_off)
                    await running
                    if running.suspended:
                        return _HANDED_OFF
                handlers.inline_run = None
            # Rule WL3: let the slots run what was just given to them before parking again
            # (their replies leave first), and let every other task run now and then
            # however busy the socket is.
            if batch:
                unyielded += 1
                if submitted or unyielded >= _UNYIELDED or len(batch) >= _BATCH:
                    unyielded = 0
                    await anyio.lowlevel.checkpoint()
            if self._connection.failure is not None:  # the handshake failed (Rule WC3)
                return None
            now = self._now()
            deadline = core.next_deadline()
            if (
                self._stop_deadline is not None
                or core.outbox
                or core.events
                or (deadline is not None and now >= deadline)
            ):
                # Rule WL4: something is due; the connection's events first (Rule WC2).
                connection.poll()
                if connection.failure is not None:
                    return None
                if self._stop_deadline is not None and (
                    core.in_progress == 0 or now >= self._stop_deadline
                ):
                    self._handlers.cancel()
                    core.leave()
                    self._flush()
                    connection.close(_LEAVE_LINGER_MS)
                    return None
                core.expire(now)
                if core.outbox or core.events:
                    stop = self._flush()
                    if stop is not None:
                        return stop if type(stop) is BrokerLost else None
                deadline = core.next_deadline()
            if deadline is None:
                deadline = math.inf
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

    def _flush(self) -> BrokerLost | Refused | None:
        """Do what the core asked for: send its messages, start its runs, log; the event
        that ends the session (:class:`BrokerLost`, :class:`Refused`), if any."""
        core = self._core
        outbox, events = core.drain()
        send = self._connection.send
        for frames in outbox:
            send(frames)
        for event in events:
            if type(event) is Run:
                slots = self._handlers.slots
                assert slots is not None
                slots.submit(event)
            elif type(event) is BrokerLost:
                return event
            elif self._act(event):
                assert type(event) is Refused
                return event
        return None

    def _act(self, event: Event) -> bool:
        """Act on an event that is not a :class:`Run`; whether it ends serving (a refusal)."""
        if type(event) is Replays:  # core Rule W13, best effort (dcp._worker.connection WC7)
            self._connection.send_replays(event.messages)
            return False
        if type(event) is Malformed:
            logger.warning("malformed message from broker (%s): %s", event.reason, event.message)
            return False
        if type(event) is Refused:
            refused = service_name(event.service) if event.service else self.service
            logger.error(
                "broker %s refused the registration for %r: %s",
                self.endpoint,
                refused,
                event.message,
            )
            self._refused = RegistrationRefused(refused, event.message)
            return True
        raise AssertionError(event)  # pragma: no cover - a BrokerLost only comes from expire

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
        asock = self._connection.socket
        if asock is not None:
            asock.wake()
