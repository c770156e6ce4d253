"""The async client: a thin anyio driver around :class:`~dcp._tracker.RequestTracker`.

One DEALER socket, owned by one receive task that also drives the tracker's timers. Callers
send from their own tasks (a synchronous ``send_nowait``) and wait on a per-request waiter
that the receive task resolves; many requests share the socket.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import zmq

from . import _services
from ._beacon import BEACON_SCHEME, resolve
from ._calls import (
    Part,
    Payload,
    Timing,
    check_window,
    checked_routing_id,
    data_parts,
    payload_parts,
    request_metadata,
    service_bytes,
)
from ._clock import loop_clock
from ._context import get_context
from ._errors import AuthenticationFailed
from ._handshake import HandshakeWatch, monitor, watch_handshakes
from ._json import encode_json
from ._messages import work_timeout_option
from ._pubsub import Subscription, deliver
from ._pubsub import publish as _publish
from ._pubsub import subscribe as _subscribe
from ._response import Outcome, Response
from ._security import CurveClient, configure_client_socket
from ._services import ServiceChange, ServiceInfo, ServiceStats, ServiceSummary
from ._stats import ClientStatistics
from ._streams import DEFAULT_WINDOW, Stream, deliver_part, stream_timing
from ._tracker import RequestTracker
from ._waiters import Sink, Waiter
from ._zmqio import AsyncSocket
from .wire.streams import is_stream

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from ._tracing import ClientTracing, Start

__all__ = ["Client"]

logger = logging.getLogger("dcp.client")

# Waiting out a full send queue (zmq high-water mark): first pause and largest pause.
_SEND_PAUSE = 0.001
_SEND_PAUSE_MAX = 0.05


class Client:
    """A DCP client for trio and asyncio programs.

    ::

        async with dcp.Client("tcp://127.0.0.1:5555") as client:
            response = await client.request("echo", b"hello")
            async for response in client.map("echo", payloads, window=64):
                ...

    Requests are matched to replies by an id dcp puts first in the metadata. ``timeout``
    bounds each whole call; within it, an attempt left unanswered for ``attempt_timeout`` is
    resent with the same id, at most ``retries`` times (see
    :class:`~dcp._tracker.RequestTracker` for the exact rule). Each attempt tells the broker
    and the worker how long the caller still waits (they drop it after that). Shortly
    before a call would time out, the client asks the broker (``mmi.service``) whether any
    worker serves the service; if none does, the call raises :exc:`~dcp.NoWorkers` (a
    :exc:`~dcp.RequestTimeout`) instead of a plain :exc:`~dcp.RequestTimeout`. Many tasks
    may call :meth:`request` at once.

    Sends never block the event loop: when zmq's send queue is full (high-water mark) the
    caller pauses 1 ms, doubling up to 50 ms, and tries again until its attempt's deadline,
    after which the attempt counts as lost and the retry rule takes over. A *resend* that
    finds the queue full is not made (counted in ``resends_dropped``); that attempt simply
    times out again.

    :param endpoint: the broker's zmq endpoint
    :param timeout: default seconds for a whole call, every attempt and backoff included
        (``math.inf``: no overall limit). A call to an endpoint where no broker listens
        fails after this long.
    :param attempt_timeout: default seconds per attempt before a resend (``None``: each
        call's ``timeout / (retries + 1)``, 10 s with the defaults)
    :param retries: default resends after a timed-out attempt
    :param no_wait: default of :meth:`request`'s ``no_wait``: ask the broker to answer at
        once, with :exc:`~dcp.NoWorkers`, when no worker serves the service, instead of
        queueing the request (a dcp broker does; another broker queues it as usual)
    :param backoff: delay cap before the first resend (seconds)
    :param backoff_factor: growth of the delay cap per resend
    :param backoff_max: largest delay cap (seconds)
    :param jitter: randomised fraction of each delay, in ``[0, 1]``
    :param routing_id: the socket's zmq routing id (default: 16 random bytes); it must not
        start with a 0x00 byte. The broker keeps the address across reconnects.
    :param context: zmq context (default: one shared per process)
    :param batch: messages handled per wake-up before letting other tasks run
    :param rng: source of the retry jitter (default: a fresh :class:`random.Random`)
    :param remember: finished request ids remembered to tell duplicate replies from unknown
    :param work_timeout: default seconds a worker may hold a request before the broker
        treats it as lost and gives the request to another worker (``None``: the broker's
        default); see :doc:`/reliability`
    :param security: CURVE keys (see ``docs/security.md``; default: no security). If the
        broker refuses the key, or is not the one whose key is given, or one side uses
        CURVE and the other not, the handshake fails: pending and later calls raise
        :exc:`~dcp.AuthenticationFailed` (within about a second), and the client is closed.
    :param type_width: width of the type frame of every request: 1 (the spec, default) or 4
        (a little-endian ``int``, as the DagBox C++ reference writes it; its broker aborts on
        1-byte types). Replies are read in either width. With 4, no ``mmi.service`` question
        is asked before a timeout (that broker has no such service).
    :param tracing: one OpenTelemetry span per request, its context sent with the request
        (``docs/tracing.md``): ``True`` (the global tracer provider) or a
        ``TracerProvider``; needs ``pip install 'dagbox-dcp[otel]'`` (``ImportError``
        naming it otherwise)
    :raises ValueError: a bad option (e.g. ``type_width`` not 1 or 4), before any socket
        exists
    """

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = 30.0,
        attempt_timeout: float | None = None,
        retries: int = 2,
        no_wait: bool = False,
        backoff: float = 0.1,
        backoff_factor: float = 2.0,
        backoff_max: float = 5.0,
        jitter: float = 0.5,
        routing_id: bytes | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        batch: int = 256,
        rng: random.Random | None = None,
        remember: int = 8192,
        work_timeout: float | None = None,
        security: CurveClient | None = None,
        type_width: int = 1,
        tracing: bool | TracerProvider = False,
    ) -> None:
        routing_id = checked_routing_id(routing_id)
        #: Spans of the requests (docs/tracing.md); ``None``: tracing off (costs one test).
        self._tracing: ClientTracing | None = None
        if tracing:
            from ._tracing import ClientTracing  # imports OpenTelemetry: only when asked

            self._tracing = ClientTracing(tracing, endpoint)
        if work_timeout is not None:
            work_timeout_option(work_timeout)  # check it now
        #: Default work timeout of requests (seconds; ``None``: the broker's).
        self.work_timeout = work_timeout
        #: Default of :meth:`request`'s ``no_wait``.
        self.no_wait = no_wait
        self.endpoint = endpoint
        self._security = security
        #: The socket's zmq routing id: the broker's address for this client.
        self.routing_id = routing_id
        self._tracker = RequestTracker(
            timeout=timeout,
            attempt_timeout=attempt_timeout,
            retries=retries,
            backoff=backoff,
            backoff_factor=backoff_factor,
            backoff_max=backoff_max,
            jitter=jitter,
            rng=rng,
            remember=remember,
            type_width=type_width,
            probe=type_width == 1,  # the DagBox broker (4-byte types) has no mmi.service
        )
        self._context = context
        self._batch = batch
        self._socket: AsyncSocket | None = None
        self._waiters: dict[bytes, Waiter | Sink] = {}
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._closed = False
        self._broken: BaseException | None = None
        self._watch: HandshakeWatch | None = None
        self._subscriptions: dict[bytes, Any] = {}
        #: The event loop's clock (anyio.current_time without its lookup; set on entry).
        self._now: Callable[[], float] = anyio.current_time
        #: (work_timeout, no_wait) and the request metadata they give with no other option.
        self._plain_metadata: tuple[tuple[float | None, bool], tuple[bytes, ...]] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Client:
        if self._socket is not None or self._closed:
            raise RuntimeError("a Client can be entered only once")
        if self.endpoint.startswith(BEACON_SCHEME):  # docs/services.md: a beacon to listen to
            key = None if self._security is None else self._security.server_key
            self.endpoint = await resolve(self.endpoint, key=key)
        ctx = self._context if self._context is not None else get_context()
        sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        mon: zmq.Socket[bytes] | None = None
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
            configure_client_socket(sock, self._security)
            # Handshake failures raise AuthenticationFailed (dcp/_handshake.py).
            mon = monitor(sock)
            sock.connect(self.endpoint)
        except BaseException:
            sock.close(0)
            if mon is not None:
                mon.close(0)
            raise
        self._socket = AsyncSocket(sock)
        self._now = loop_clock()
        self._watch = watch = HandshakeWatch(
            self.endpoint, secure=self._security is not None, role="client"
        )
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self._shutdown, None)
            tg = await stack.enter_async_context(anyio.create_task_group())
            tg.start_soon(self._receive_loop)
            if mon is not None:
                tg.start_soon(watch_handshakes, sock, mon, watch, self._shutdown)
            stack.callback(tg.cancel_scope.cancel)
            self._exit_stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The body's exception is not passed to the task group: it would come back wrapped
        # in an ExceptionGroup. The receive task never raises, so nothing else can.
        stack, self._exit_stack = self._exit_stack, None
        self._shutdown(None)
        if stack is not None:
            await stack.aclose()

    async def aclose(self) -> None:
        """Close the socket (linger 0). Pending and later requests raise
        :exc:`anyio.ClosedResourceError`. Idempotent; a checkpoint.
        """
        self._shutdown(None)
        await anyio.lowlevel.checkpoint()

    @property
    def closed(self) -> bool:
        """True once the client was closed or its socket broke."""
        return self._closed

    def statistics(self) -> ClientStatistics:
        """Counters: requests, replies, retries, timeouts, duplicates, pending, ..."""
        return self._tracker.statistics()

    # ------------------------------------------------------------------ requests

    async def request(
        self,
        service: str | bytes,
        *data: Part,
        metadata: Sequence[Part] = (),
        timeout: float | None = None,  # noqa: ASYNC109 (a deadline that travels with it)
        attempt_timeout: float | None = None,
        retries: int | None = None,
        work_timeout: float | None = None,
        no_wait: bool | None = None,
    ) -> Response:
        """Send a request and wait for its reply.

        Every part is checked before anything is sent. Cancelling the caller forgets the
        request at once (a reply arriving later is counted as late and dropped); nothing is
        left behind.

        :param service: the service name (``str``: sent as UTF-8)
        :param data: the data parts (``str``: sent as UTF-8)
        :param metadata: non-empty parts the worker returns unchanged in the reply
        :param timeout: seconds for the whole call, retries included (default: the client's)
        :param attempt_timeout: seconds before an unanswered attempt is resent (default: the
            client's, else ``timeout / (retries + 1)``)
        :param retries: resends after timed-out attempts (default: the client's)
        :param work_timeout: seconds a worker may hold it (default: the client's)
        :param no_wait: fail at once with :exc:`NoWorkers` if no worker serves the service
            (default: the client's; needs a dcp broker)
        :raises TypeError: a part that is not ``bytes`` or ``str`` (nothing is sent)
        :raises ValueError: an empty metadata part, a bad option (nothing is sent)
        :raises NoWorkers: no worker serves the service (the broker said so)
        :raises RequestTimeout: no reply within ``timeout``, or after the last attempt
        :raises RemoteError: a dcp error reply (from a worker or the broker)
        :raises anyio.ClosedResourceError: the client is (or was, while waiting) closed
        :raises anyio.BrokenResourceError: the socket failed
        """
        service = service_bytes(service)
        parts = data_parts(data)
        metadata = self._metadata(metadata, work_timeout, no_wait)
        timing = self._tracker.timing(timeout, attempt_timeout, retries)
        if self._tracing is None:
            waiter = Waiter()
            rid, frames = self._start(service, parts, metadata, timing, waiter)
        else:
            waiter, rid, frames = self._tracing.request(
                self._start, service, parts, metadata, timing
            )
        try:
            await self._send(rid, frames)
            await waiter.event.wait()
        finally:
            if self._waiters.pop(rid, None) is not None:
                self._tracker.cancel(rid)
                waiter.forget()
        return self._result(waiter.outcome)

    async def request_json(
        self,
        service: str | bytes,
        obj: Any,
        *,
        metadata: Sequence[Part] = (),
        timeout: float | None = None,  # noqa: ASYNC109 (see request())
        attempt_timeout: float | None = None,
        retries: int | None = None,
        work_timeout: float | None = None,
        no_wait: bool | None = None,
    ) -> Any:
        """Send ``obj`` as one JSON data part (UTF-8) and return the reply's one data part
        decoded from JSON: ``await client.request_json("add", {"a": 1, "b": 2})``.

        The options and errors are :meth:`request`'s, and:

        :raises TypeError: ``obj`` is not JSON-serialisable (before anything is sent)
        :raises ValueError: ``obj`` holds ``NaN`` or an infinity (before anything is sent);
            the reply is not exactly one UTF-8 JSON part
        """
        response = await self.request(
            service,
            encode_json(obj, name="obj"),
            metadata=metadata,
            timeout=timeout,
            attempt_timeout=attempt_timeout,
            retries=retries,
            work_timeout=work_timeout,
            no_wait=no_wait,
        )
        return response.json()

    async def services(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
    ) -> list[ServiceSummary]:
        """Every service the broker knows, with workers, queue and version (``mmi.services``,
        ``docs/services.md``).

        :raises RuntimeError: the broker does not answer it (not a dcp broker)
        """
        return await _services.services(self, timeout=timeout)

    async def service_info(
        self,
        name: str | bytes,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
    ) -> ServiceInfo | None:
        """One service's version, description, metadata and schemas (``mmi.info``);
        ``None`` if the broker knows no such service."""
        return await _services.service_info(self, name, timeout=timeout)

    async def service_stats(
        self,
        name: str | bytes,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
    ) -> ServiceStats | None:
        """One service's live figures from the broker (``mmi.stats``); ``None`` if unknown."""
        return await _services.service_stats(self, name, timeout=timeout)

    def watch_services(
        self, *, interval: float = 1.0, timeout: float | None = None
    ) -> AsyncIterator[ServiceChange]:
        """Services coming up and going down, polled every ``interval`` seconds."""
        return _services.watch_services(self, interval=interval, timeout=timeout)

    def map(
        self,
        service: str | bytes,
        payloads: Iterable[Payload],
        *,
        window: int = 64,
        metadata: Sequence[Part] = (),
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        retries: int | None = None,
        work_timeout: float | None = None,
        no_wait: bool | None = None,
    ) -> AsyncGenerator[Response, None]:
        """Request ``service`` once per payload; yield the replies in input order.

        ::

            async for response in client.map("echo", [b"a", "b", (b"two", b"parts")]):
                ...

        At most ``window`` requests are outstanding (sent, reply not yet yielded), so at
        most ``window`` replies are buffered. The first failure is raised and the
        outstanding requests are forgotten. Leaving the loop early forgets them when the
        generator is closed: ``async with contextlib.aclosing(client.map(...)) as replies:``
        makes that immediate (otherwise it happens when the generator is collected).
        The options are :meth:`request`'s, for each request (``timeout`` too: each request
        has its own).

        :param payloads: each is ``bytes`` or ``str`` (one data part) or a sequence of
            data parts; each is checked before it is sent (``TypeError`` naming
            ``payloads[i]``, raised on iteration)
        :raises ValueError: ``window`` < 1 or another bad option (at once, not on iteration)
        """
        check_window(window)
        service = service_bytes(service)
        metadata = self._metadata(metadata, work_timeout, no_wait)
        timing = self._tracker.timing(timeout, attempt_timeout, retries)
        return self._map(service, payloads, window, metadata, timing)

    def map_unordered(
        self,
        service: str | bytes,
        payloads: Iterable[Payload],
        *,
        window: int = 64,
        metadata: Sequence[Part] = (),
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        retries: int | None = None,
        work_timeout: float | None = None,
        no_wait: bool | None = None,
    ) -> AsyncGenerator[tuple[int, Response], None]:
        """Like :meth:`map`, but yield ``(index, response)`` as replies arrive (``index``
        is the payload's position in ``payloads``)."""
        check_window(window)
        service = service_bytes(service)
        metadata = self._metadata(metadata, work_timeout, no_wait)
        timing = self._tracker.timing(timeout, attempt_timeout, retries)
        return self._map_unordered(service, payloads, window, metadata, timing)

    async def _map(
        self,
        service: bytes,
        payloads: Iterable[Payload],
        window: int,
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> AsyncGenerator[Response, None]:
        start: Start = self._start
        if self._tracing is None:
            sink = Sink()
        else:
            sink, start = self._tracing.sink(start)
        order: deque[bytes] = deque()
        done = sink.done
        try:
            for index, payload in enumerate(payloads):
                if len(order) >= window:
                    while order[0] not in done:
                        await sink.wait()
                    yield self._result(done.pop(order.popleft()))
                parts = payload_parts(payload, index)
                rid, frames = start(service, parts, metadata, timing, sink)
                order.append(rid)
                await self._send(rid, frames)
            while order:
                while order[0] not in done:
                    await sink.wait()
                yield self._result(done.pop(order.popleft()))
        finally:
            self._forget(order)
            sink.forget()

    async def _map_unordered(
        self,
        service: bytes,
        payloads: Iterable[Payload],
        window: int,
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> AsyncGenerator[tuple[int, Response], None]:
        start: Start = self._start
        if self._tracing is None:
            sink = Sink()
        else:
            sink, start = self._tracing.sink(start)
        inflight: dict[bytes, int] = {}
        done = sink.done
        try:
            for index, payload in enumerate(payloads):
                if len(inflight) >= window:
                    while not done:
                        await sink.wait()
                    rid = next(iter(done))
                    yield inflight.pop(rid), self._result(done.pop(rid))
                parts = payload_parts(payload, index)
                rid, frames = start(service, parts, metadata, timing, sink)
                inflight[rid] = index
                await self._send(rid, frames)
            while inflight:
                while not done:
                    await sink.wait()
                rid = next(iter(done))
                yield inflight.pop(rid), self._result(done.pop(rid))
        finally:
            self._forget(inflight)
            sink.forget()

    def stream(
        self,
        service: str | bytes,
        *data: Part,
        metadata: Sequence[Part] = (),
        window: int = DEFAULT_WINDOW,
        timeout: float | None = None,
        stall_timeout: float | None = None,
        work_timeout: float | None = None,
    ) -> Stream:
        """Request ``service`` and read its answer part by part (``docs/streams.md``)::

            async with client.stream("rows", b"query") as parts:
                async for part in parts:  # each part: a tuple of bytes
                    ...

        At most ``window`` parts are sent ahead of what was read (the worker waits for
        credit). Leaving the block early cancels the stream at the worker. The request is
        sent once, never resent.

        :param timeout: seconds for the whole stream (default: the client's)
        :param stall_timeout: seconds to wait for each next part (default: no limit)
        :raises ValueError: a bad option (at once, nothing is sent)
        :raises StreamBroken: (while reading) the worker went away mid-stream
        :raises RemoteError: (while reading) the stream ended with an error reply
        :raises RequestTimeout: (while reading) ``timeout`` or ``stall_timeout`` passed
        """
        if stall_timeout is not None and not stall_timeout > 0:
            raise ValueError("stall_timeout must be positive")
        service = service_bytes(service)
        parts = tuple(data_parts(data))
        meta = self._metadata(metadata, work_timeout, False)
        timing = stream_timing(self._tracker.timing(timeout, None, 0))
        stream = Stream(self, service, parts, meta, timing, window, stall_timeout)
        if self._tracing is not None:
            self._tracing.trace_stream(stream)
        return stream

    # ------------------------------------------------------------------ pub/sub

    async def publish(self, subject: str | bytes, *data: Part, ack: bool = False) -> int | None:
        """Publish ``data`` to ``subject`` (see ``docs/pubsub.md``). Without ``ack`` it returns
        ``None`` once sent (at most once); with ``ack`` it waits for the broker and returns how
        many subscriptions the message was routed to (a queue group counts once).

        :raises ValueError: a bad subject (nothing is sent)
        :raises RemoteError: with ``ack``, a refusal (``forbidden_subject``, ...)
        """
        return await _publish(self, subject, data, ack)

    def subscribe(
        self,
        pattern: str | bytes,
        queue: str | bytes | None = None,
        *,
        max_pending: int = 1000,
        overflow: str = "drop-oldest",
        window: int = 256,
        refresh: float = 1.0,
        last_value: bool = False,
    ) -> contextlib.AbstractAsyncContextManager[Subscription]:
        """Subscribe to ``pattern`` (``*``: one token, ``>``: the rest) for the ``async with``
        block: ``async for msg in sub`` yields :class:`~dcp.PubSubMessage` objects (see
        ``docs/pubsub.md`` for the options: queue groups, the broker's buffer of
        ``max_pending`` messages and its ``overflow`` policy, gap notices, re-subscribing).

        :raises ValueError: a bad pattern or option (nothing is sent)
        """
        return _subscribe(self, pattern, queue, max_pending, overflow, window, refresh, last_value)

    # ------------------------------------------------------------------ internals

    def _metadata(
        self, metadata: Sequence[Part], work_timeout: float | None, no_wait: bool | None
    ) -> tuple[bytes, ...]:
        if metadata == () and work_timeout is None and no_wait is None:
            # The common call: the client's own options only, built once per setting.
            key = (self.work_timeout, self.no_wait)
            plain = self._plain_metadata
            if plain is None or plain[0] != key:
                plain = self._plain_metadata = (key, self._metadata((), key[0], key[1]))
            return plain[1]
        return request_metadata(
            metadata,
            work_timeout,
            self.work_timeout,
            no_wait=self.no_wait if no_wait is None else no_wait,
        )

    def _start(
        self,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
        waiter: Waiter | Sink,
    ) -> tuple[bytes, list[bytes]]:
        if self._closed:
            raise self._closed_error()
        if self._socket is None:
            raise RuntimeError("use 'async with Client(...)' before sending requests")
        tracker = self._tracker
        rid = tracker.request(service, data, self._now(), metadata=metadata, timing=timing)
        out, tracker.outbox = tracker.outbox, []
        (frames,) = out  # the request's first attempt; sent (or waited for) by _send
        self._waiters[rid] = waiter
        self._socket.move_deadline(tracker.deadline_of(rid))
        return rid, frames

    async def _send(self, rid: bytes, frames: list[bytes]) -> None:
        """Send a request's first attempt, pausing while zmq's queue is full (until the
        tracker's next deadline for it: then the attempt counts as lost)."""
        deadline = self._tracker.deadline_of(rid)
        pause = _SEND_PAUSE
        counted = False
        while True:
            if self._closed:
                raise self._closed_error()
            assert self._socket is not None
            try:
                self._socket.send_nowait(frames)
                return
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                self._shutdown(exc)
                raise self._closed_error() from exc
            if not counted:
                counted = True
                self._tracker.send_waits += 1
            if anyio.current_time() >= deadline or not self._tracker.is_pending(rid):
                return  # the attempt counts as lost; the retry rule takes over
            await anyio.sleep(pause)
            pause = min(2 * pause, _SEND_PAUSE_MAX)

    def _forget(self, rids: Iterable[bytes]) -> None:
        waiters = self._waiters
        tracker = self._tracker
        for rid in rids:
            if waiters.pop(rid, None) is not None:
                tracker.cancel(rid)

    def _result(self, outcome: Outcome | None) -> Response:
        if isinstance(outcome, Response):
            return outcome
        if outcome is None:
            raise self._closed_error()
        raise outcome

    def _closed_error(self) -> Exception:
        if isinstance(self._broken, AuthenticationFailed):
            return AuthenticationFailed(self._broken.endpoint, self._broken.reason)
        if self._broken is not None:
            exc = anyio.BrokenResourceError(f"the client's socket failed: {self._broken!r}")
            exc.__cause__ = self._broken
            return exc
        return anyio.ClosedResourceError("the client is closed")

    def _shutdown(self, failure: BaseException | None) -> None:
        """Close the socket and fail every waiter. Idempotent; the first cause sticks."""
        if not self._closed:
            self._closed = True
            self._broken = failure
        if self._socket is not None:
            if not self._socket.closed:
                # Stop the monitor before closing: libzmq's I/O thread sends the socket's
                # last events (DISCONNECTED) to the monitor's PAIR with a blocking send; if
                # our end of that PAIR is closed first, the send blocks that thread for good
                # and every socket of the context falls silent.
                with contextlib.suppress(zmq.ZMQError):
                    self._socket.sock.disable_monitor()
            self._socket.close(0)
        self._tracker.cancel_all()
        for state in self._subscriptions.values():
            state.close()
        waiters = list(self._waiters.items())
        self._waiters.clear()
        for rid, waiter in waiters:
            waiter.deliver(rid, None)

    async def _receive_loop(self) -> None:
        asock = self._socket
        assert asock is not None
        tracker = self._tracker
        waiters = self._waiters
        batch = self._batch
        watch = self._watch
        assert watch is not None
        failure: BaseException | None = None
        try:
            while True:
                deadline = tracker.next_deadline()
                await asock.wait_readable(math.inf if deadline is None else deadline)
                if asock.closed:
                    break
                received = asock.drain(batch)
                if received:
                    watch.heard = watch.handshakes  # handshakes Rule H5
                    if logger.isEnabledFor(logging.DEBUG):  # once per batch
                        for msg in received:
                            logger.debug(
                                "from broker %s: %d frame(s), %d bytes",
                                self.endpoint,
                                len(msg.frames),
                                sum(len(f) for f in msg.frames),
                            )
                subscriptions = self._subscriptions
                for msg in received:
                    if is_stream(msg.frames):
                        deliver_part(msg.frames, waiters)  # dcp streams (_streams.py)
                        continue
                    if subscriptions and deliver(subscriptions, msg.frames):
                        continue
                    resolved = tracker.receive(msg.frames)
                    if resolved is not None:
                        rid, outcome = resolved
                        waiter = waiters.pop(rid, None)
                        if waiter is not None:
                            waiter.deliver(rid, outcome)
                now = self._now()
                deadline = tracker.next_deadline()
                if deadline is not None and deadline <= now:
                    self._expire(asock, now)
                # Let other tasks run between batches, however busy the socket is. (With
                # no input left, wait_readable parks, which lets them run: no extra pass.)
                if asock.has_input():
                    await anyio.lowlevel.checkpoint()
        except anyio.ClosedResourceError:
            pass
        except zmq.ZMQError as exc:
            if not asock.closed:
                failure = exc
        except Exception as exc:  # a bug: fail the callers rather than hang them
            logger.exception("dcp client receive task failed")
            failure = exc
        finally:
            self._shutdown(failure)

    def _expire(self, asock: AsyncSocket, now: float) -> None:
        tracker = self._tracker
        failed = tracker.expire(now)
        out, tracker.outbox = tracker.outbox, []
        watch = self._watch
        if out and watch is not None and watch.unheard():
            # Handshakes Rule H5: a secure broker ignores this connection; make a new one.
            logger.warning(
                "dcp client: the broker at %s has not answered on this connection since it "
                "reconnected; connecting again",
                self.endpoint,
            )
            watch.heard = watch.handshakes  # once per connection
            asock.sock.disconnect(self.endpoint)
            asock.sock.connect(self.endpoint)
        for frames in out:
            try:
                asock.send_nowait(frames)
            except zmq.Again:
                tracker.resends_dropped += 1
        waiters = self._waiters
        for rid, exc in failed:
            waiter = waiters.pop(rid, None)
            if waiter is not None:
                waiter.deliver(rid, exc)
