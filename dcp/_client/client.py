"""The async client: a thin anyio driver around :class:`~dcp._core.client.tracker.RequestTracker`.

One DEALER socket, owned by one receive task that also drives the tracker's timers: both are
the client's :class:`~dcp._client.receive.Receiver`. Callers send from their own tasks (a
synchronous ``send_nowait``) and wait on a per-request waiter that the receive task resolves;
many requests share the socket. A request alone in flight reads the socket itself instead
(Rule RX5 of :mod:`dcp._client.receive`). The maps, streams and pub/sub are parts given the
receiver (:mod:`dcp._client.maps`, :mod:`dcp._client.streams`, :mod:`dcp._client.pubsub`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
)
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel
import zmq

from dcp._client.maps import map_async
from dcp._client.options import ClientOptions
from dcp._client.pubsub import Subscription
from dcp._client.pubsub import publish as _publish
from dcp._client.pubsub import subscribe as _subscribe
from dcp._client.receive import Receiver, Start
from dcp._client.services import (
    ServiceChange,
    ServiceInfo,
    ServiceStats,
    ServiceSummary,
    ServiceWatch,
    merge_info,
    merge_stats,
    merge_summaries,
    mmi_answer,
    mmi_args,
    mmi_page,
    service_info,
    service_stats,
    summaries,
)
from dcp._client.streams import DEFAULT_WINDOW, Stream
from dcp._client.waiters import Sink, Waiter
from dcp._core.client.brokers import Brokers
from dcp._core.client.calls import Part, Payload, Timing, data_parts, service_bytes
from dcp._io.beacon import BEACON_SCHEME, beacon_wait, resolve
from dcp._io.handshake import (
    HandshakeWatch,
    all_unreachable,
    connect_dealer,
    watch_handshakes,
)
from dcp._io.lifecycle import Lifecycle, ki_protected
from dcp._io.security import CurveClient
from dcp._io.sockets import AsyncSocket
from dcp._json import encode_json
from dcp._models import Outcome, Response

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from dcp._client.tracing import ClientTracing

__all__ = ["Client"]

logger = logging.getLogger("dcp.client")

T = TypeVar("T")

#: Seconds between zmq heartbeats on each socket of a client of several brokers (a broker
#: silent for three is lost: receive Rule RX6).
_HEARTBEAT = 1.0


class Client(ClientOptions):
    """A DCP client for trio and asyncio programs.

    ::

        async with dcp.Client("tcp://127.0.0.1:5555") as client:
            response = await client.request("echo", b"hello")
            async for response in client.map("echo", payloads, window=64):
                ...

    A call to a service that no worker serves fails at once with :exc:`~dcp.NoWorkers`,
    unless ``wait_for_worker=True`` (for the client or the call) queues it until a worker
    comes. Requests are matched to replies by an id dcp puts first in the metadata. ``timeout``
    bounds each whole call; within it, an attempt left unanswered for ``attempt_timeout`` is
    resent with the same id, at most ``retries`` times (see
    :class:`~dcp._core.client.tracker.RequestTracker` for the exact rule). Each attempt tells
    the broker and the worker how long the caller still waits (they drop it after that). Shortly
    before a call would time out, the client asks the broker (``mmi.service``) whether any
    worker serves the service; if none does, the call raises :exc:`~dcp.NoWorkers` (a
    :exc:`~dcp.RequestTimeout`) instead of a plain :exc:`~dcp.RequestTimeout`. Many tasks
    may call :meth:`request` at once.

    Sends never block the event loop: when zmq's send queue is full (high-water mark) the
    caller pauses 1 ms, doubling up to 50 ms, and tries again until its attempt's deadline,
    after which the attempt counts as lost and the retry rule takes over. A *resend* that
    finds the queue full is not made (counted in ``resends_dropped``); that attempt simply
    times out again.

    :param endpoint: the broker's zmq endpoint, or a sequence of several brokers' endpoints
        (``docs/scaling.md``): then each request goes to one live broker, the one with the
        fewest requests outstanding (round-robin among ties); a broker's loss moves its
        requests to another after ``failover_grace``; ``services()`` and the other
        ``mmi`` questions ask every live broker and merge the answers. A ``str`` is always
        one endpoint (a comma in it is not split). An empty sequence, the same endpoint
        twice or a malformed one: :exc:`ValueError`, before any socket exists
    :param timeout: default seconds for a whole call, every attempt and backoff included
        (``math.inf``: no overall limit). A call to an endpoint where no broker listens
        fails after this long, unless ``wait_for_broker=False``.
    :param attempt_timeout: default seconds per attempt before a resend (``None``: each
        call's ``timeout / (retries + 1)``, 10 s with the defaults)
    :param retries: default resends after a timed-out attempt
    :param wait_for_worker: default of :meth:`request`'s ``wait_for_worker``. ``False``
        (the default): a call to a service no worker serves fails at once with
        :exc:`~dcp.NoWorkers` (a dcp broker answers so; another broker queues it as usual).
        ``True``: the broker queues the call until a worker comes or its time is up.
    :param no_wait: the old spelling of ``wait_for_worker``, inverted (``no_wait=True`` is
        ``wait_for_worker=False``); still accepted
    :param wait_for_broker: ``True`` (the default): a client started before its broker, or
        whose broker restarts, waits for it (each call within its ``timeout``). ``False``:
        while the client has never connected to any of its brokers and their connection
        attempts are refused (nothing listens at the endpoint: three attempts in a row,
        0.2-0.4 s after entering), pending and later calls raise :exc:`~dcp.BrokerUnreachable`
        (a :exc:`~dcp.RequestTimeout`) at once; once a connection succeeded, never (a broker
        restart is waited for as with ``True``). ``inproc://``, and a host that drops the
        packets, give no refusal: calls wait as with ``True``
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
    :param failover_grace: with several brokers, seconds a request outstanding on a broker
        that was lost (its connection closed, or silent for three zmq heartbeats of 1 s)
        waits for a worker's HELD notice or replayed answer before it is resent, same id,
        through a live broker (not a retry: ``retries`` and the call's deadline are
        untouched). Default 0.2; unused with one broker
    :param tracing: one OpenTelemetry span per request, its context sent with the request
        (``docs/tracing.md``): ``True`` (the global tracer provider) or a
        ``TracerProvider``; needs ``pip install 'dagbox-dcp[otel]'`` (``ImportError``
        naming it otherwise)
    :raises ValueError: a bad option (e.g. ``type_width`` not 1 or 4, or a malformed
        ``endpoint``, named: ``bad endpoint 'tcp://*:5555': ...``), before any socket
        exists
    """

    #: Spans of the requests (docs/tracing.md); ``None``: tracing off (costs one test).
    _tracing: ClientTracing | None = None

    def _trace(self, tracing: bool | TracerProvider, endpoint: str) -> None:
        from dcp._client.tracing import ClientTracing  # imports OpenTelemetry: only when asked

        self._tracing = ClientTracing(tracing, endpoint)

    def _setup(
        self, context: zmq.Context[zmq.Socket[bytes]] | None, security: CurveClient | None
    ) -> None:
        self._context = context
        self._security = security
        #: The socket and everything waiting on it (its receive task runs while entered).
        self._receiver = Receiver(self._tracker, batch=self._batch)
        #: ``async with client``: the receive task in a task group of its own.
        self._lifecycle = Lifecycle("a Client can be entered only once")

    @property
    def closed(self) -> bool:
        """True once the client was closed or its socket broke."""
        return self._receiver.closed

    # ------------------------------------------------------------------ lifecycle

    @ki_protected  # dcp._io.lifecycle Rule E6
    async def __aenter__(self) -> Client:
        receiver = self._receiver
        if receiver.socket is not None or receiver.closed:
            raise RuntimeError("a Client can be entered only once")
        await self._lifecycle.enter(self._serve, stop=self._close)
        return self

    @ki_protected
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._lifecycle.exit(exc)

    async def _serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect (to the broker a beacon names, if the endpoint is one), then run the
        receive task and the handshake watch until cancelled; ready once connecting began
        (zmq connects in the background). The socket is closed when it returns."""
        if self._brokers is not None:
            await self._serve_brokers(self._brokers, task_status=task_status)
            return
        receiver = self._receiver
        mon = None
        try:
            if self.endpoint.startswith(BEACON_SCHEME):  # docs/services.md: a beacon
                key = None if self._security is None else self._security.server_key
                wait = beacon_wait(self._tracker.timeout)  # the client's timeout, if shorter
                self.endpoint = self._tracker.endpoint = await resolve(
                    self.endpoint, key=key, timeout=wait
                )
                self._tracker.endpoints = (self.endpoint,)
            sock, mon = connect_dealer(
                self._context,
                self.routing_id,
                self._security,
                self.endpoint,
                refusals=not self.wait_for_broker,  # receive Rule RX7
            )
            watch = HandshakeWatch(self.endpoint, secure=self._security is not None, role="client")
            receiver.attach(AsyncSocket(sock), watch, self.endpoint)
            on_unreachable = None
            if not self.wait_for_broker:  # receive Rule RX7
                receiver.refusing = watch.unreachable
                on_unreachable = receiver.unreachable
            async with anyio.create_task_group() as tg:
                tg.start_soon(receiver.run)
                if mon is not None:
                    tg.start_soon(
                        watch_handshakes, sock, mon, watch, receiver.shutdown, None, on_unreachable
                    )
                task_status.started()
                await anyio.sleep_forever()
        finally:
            receiver.shutdown(None)
            if mon is not None:
                # Closed by watch_handshakes, unless a Ctrl-C kept that task from starting
                # (dcp._io.lifecycle Rule E6); closing twice is harmless.
                mon.close(0)

    async def _serve_brokers(
        self,
        brokers: Brokers,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """:meth:`_serve` with several brokers (receive Rule RX6): a socket per broker (each
        beacon resolved first), each with its receive task and its handshake watch, which
        tells the receiver when the broker is live or lost."""
        receiver = self._receiver
        key = None if self._security is None else self._security.server_key
        secure = self._security is not None
        mons: list[zmq.Socket[bytes]] = []
        socks: list[zmq.Socket[bytes]] = []
        try:
            wait = beacon_wait(self._tracker.timeout)  # the client's timeout, if shorter
            endpoints = [
                await resolve(e, key=key, timeout=wait) if e.startswith(BEACON_SCHEME) else e
                for e in self._endpoints
            ]
            brokers.endpoints = self._endpoints = tuple(endpoints)
            self.endpoint = endpoints[0]
            self._tracker.endpoint = ", ".join(endpoints)  # tracker Rule RT7
            self._tracker.endpoints = tuple(endpoints)
            for endpoint in endpoints:
                sock, mon = connect_dealer(
                    self._context,
                    self.routing_id,
                    self._security,
                    endpoint,
                    heartbeat=_HEARTBEAT,
                    refusals=not self.wait_for_broker,  # receive Rule RX7
                )
                socks.append(sock)
                mons.append(mon)
            watches = [HandshakeWatch(e, secure=secure, role="client") for e in endpoints]
            receiver.attach_brokers([AsyncSocket(sock) for sock in socks], watches, brokers)
            on_unreachable = None
            if not self.wait_for_broker:  # receive Rule RX7: every broker unreachable
                receiver.refusing = functools.partial(all_unreachable, watches)
                on_unreachable = receiver.unreachable
            async with anyio.create_task_group() as tg:
                tg.start_soon(receiver.run)
                for i in range(1, len(socks)):
                    tg.start_soon(receiver.run_broker, i)
                for i, (sock, mon, watch) in enumerate(zip(socks, mons, watches, strict=True)):
                    on_event = functools.partial(receiver.broker_event, i)
                    tg.start_soon(
                        watch_handshakes,
                        sock,
                        mon,
                        watch,
                        receiver.shutdown,
                        on_event,
                        on_unreachable,
                    )
                task_status.started()
                await anyio.sleep_forever()
        finally:
            receiver.shutdown(None)
            for sock in socks:
                if not sock.closed:  # not attached (a later connect failed)
                    sock.close(0)
            for mon in mons:
                mon.close(0)  # closed by watch_handshakes, unless it never started

    def _close(self) -> None:
        self._receiver.shutdown(None)

    async def aclose(self) -> None:
        """Close the socket (linger 0). Pending and later requests raise
        :exc:`anyio.ClosedResourceError`. Idempotent; a checkpoint.
        """
        self._receiver.shutdown(None)
        await anyio.lowlevel.checkpoint()

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
        wait_for_worker: bool | None = None,
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
        :param wait_for_worker: ``True``: queue the request until a worker serves the
            service; ``False``: fail at once with :exc:`NoWorkers` if none does (default: the
            client's, ``False``; needs a dcp broker)
        :param no_wait: the old spelling of ``wait_for_worker``, inverted
        :raises TypeError: a part that is not ``bytes`` or ``str`` (nothing is sent)
        :raises ValueError: an empty metadata part, a bad option (``wait_for_worker`` and
            ``no_wait`` disagreeing too; nothing is sent)
        :raises NoWorkers: no worker serves the service (the broker said so)
        :raises RequestTimeout: no reply within ``timeout``, or after the last attempt
        :raises BrokerUnreachable: (a :exc:`RequestTimeout`) with ``wait_for_broker=False``,
            no broker listens at the endpoint (refused connections, never connected)
        :raises RemoteError: a dcp error reply (from a worker or the broker)
        :raises anyio.ClosedResourceError: the client is (or was, while waiting) closed
        :raises anyio.BrokenResourceError: the socket failed
        """
        service = service_bytes(service)
        parts = data_parts(data)
        metadata = self._metadata(metadata, work_timeout, wait_for_worker, no_wait)
        timing = self._tracker.timing(timeout, attempt_timeout, retries)
        receiver = self._receiver
        if self._tracing is None:
            waiter = Waiter()
            rid, frames = receiver.start_call(service, parts, metadata, timing, waiter)
        else:
            waiter, rid, frames = self._tracing.request(
                receiver.start_call, service, parts, metadata, timing
            )
        try:
            await receiver.send(rid, frames)
            await receiver.wait(rid, waiter)  # receive Rule RX5: maybe reading the socket
        finally:
            receiver.end(rid, waiter)
        outcome = waiter.outcome
        if outcome is None:
            # The client closed; if that was the caller's own scope being cancelled (it
            # ends the client's task too, which may wake this call first), the call ends
            # with the cancellation, not ClosedResourceError.
            await anyio.lowlevel.checkpoint_if_cancelled()
        return receiver.result(outcome)

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
        wait_for_worker: bool | None = None,
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
            wait_for_worker=wait_for_worker,
            no_wait=no_wait,
        )
        return response.json()

    async def services(
        self,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
    ) -> list[ServiceSummary]:
        """Every service the broker knows, with workers, queue and version (``mmi.services``,
        ``docs/services.md``): asked a page at a time (``docs/services.md``, "Pages"), so
        a listing taken while services come and go lists every service known throughout.

        :param timeout: seconds for each page's request (default: the client's)
        :raises RuntimeError: the broker does not answer it (not a dcp broker)
        """
        if self._brokers is not None:  # each live broker's, merged (services.py)
            return merge_summaries(await self._each_broker(self._services_at, timeout))
        return await self._services_at(None, timeout)

    async def _services_at(
        self,
        broker: int | None,
        timeout: float | None,  # noqa: ASYNC109 (the request's own timeout)
    ) -> list[ServiceSummary]:
        """:meth:`services` of one broker (``None``: the one a request goes to)."""
        listing: list[dict[str, Any]] = []
        after: bytes | None = None
        while True:  # directory Rule D6: one page per request, until the last
            response = await self._ask(broker, "mmi.services", mmi_args(after), timeout)
            page, after = mmi_page("mmi.services", response, after)
            listing += page
            if after is None:
                return summaries(listing)

    async def service_info(
        self,
        name: str | bytes,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
    ) -> ServiceInfo | None:
        """One service's version, description, metadata and schemas (``mmi.info``);
        ``None`` if the broker knows no such service (several brokers: each live one is
        asked, the answers merged)."""
        if self._brokers is not None:

            async def info(
                broker: int | None,
                timeout: float | None,  # noqa: ASYNC109 (the request's own timeout)
            ) -> ServiceInfo | None:
                return service_info(await self._mmi("mmi.info", name, timeout, broker))

            return merge_info(await self._each_broker(info, timeout))
        return service_info(await self._mmi("mmi.info", name, timeout))

    async def service_stats(
        self,
        name: str | bytes,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the request's own timeout)
    ) -> ServiceStats | None:
        """One service's live figures from the broker (``mmi.stats``); ``None`` if unknown
        (several brokers: each live one is asked, the figures summed)."""
        if self._brokers is not None:

            async def stats(
                broker: int | None,
                timeout: float | None,  # noqa: ASYNC109 (the request's own timeout)
            ) -> ServiceStats | None:
                return service_stats(await self._mmi("mmi.stats", name, timeout, broker))

            return merge_stats(await self._each_broker(stats, timeout))
        return service_stats(await self._mmi("mmi.stats", name, timeout))

    async def watch_services(
        self,
        *,
        interval: float = 1.0,
        timeout: float | None = None,  # noqa: ASYNC109 (each request's own timeout)
    ) -> AsyncIterator[ServiceChange]:
        """Services coming up and going down, polled every ``interval`` seconds: first one
        ``up`` change per service served now, then each service that comes up (a worker
        serves it) or goes down (none does). Runs until the caller stops iterating.

        :raises ValueError: ``interval`` is not a positive finite number (on iteration)
        """
        watch = ServiceWatch(interval)
        while True:
            for change in watch.changes(await self.services(timeout=timeout)):
                yield change
            await anyio.sleep(interval)

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
        wait_for_worker: bool | None = None,
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
        checked, meta, timing = self._map_options(
            window,
            service,
            metadata,
            timeout,
            attempt_timeout,
            retries,
            work_timeout,
            wait_for_worker,
            no_wait,
        )
        return self._map(
            checked,
            payloads,
            window,
            meta,
            timing,
            ordered=True,
            indexed=False,
            take=self._receiver.result,
        )

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
        wait_for_worker: bool | None = None,
        no_wait: bool | None = None,
    ) -> AsyncGenerator[tuple[int, Response], None]:
        """Like :meth:`map`, but yield ``(index, response)`` as replies arrive (``index``
        is the payload's position in ``payloads``)."""
        checked, meta, timing = self._map_options(
            window,
            service,
            metadata,
            timeout,
            attempt_timeout,
            retries,
            work_timeout,
            wait_for_worker,
            no_wait,
        )
        return self._map(
            checked,
            payloads,
            window,
            meta,
            timing,
            ordered=False,
            indexed=True,
            take=self._receiver.result,
        )

    def map_outcomes(
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
        wait_for_worker: bool | None = None,
        no_wait: bool | None = None,
    ) -> AsyncGenerator[Outcome, None]:
        """Like :meth:`map`, but yield every request's outcome instead of raising failures:
        a :class:`~dcp.Response`, or the :exc:`~dcp.RemoteError` or
        :exc:`~dcp.RequestTimeout` that :meth:`map` would raise. One failure does not stop
        the others (e.g. to keep per-row errors). The client closing still raises.
        Every input gets one: an input not sent because no broker can be reached has its
        :exc:`~dcp.BrokerUnreachable` (``wait_for_broker=False``).
        """
        checked, meta, timing = self._map_options(
            window,
            service,
            metadata,
            timeout,
            attempt_timeout,
            retries,
            work_timeout,
            wait_for_worker,
            no_wait,
        )
        return self._map(
            checked,
            payloads,
            window,
            meta,
            timing,
            ordered=True,
            indexed=False,
            take=self._receiver.outcome,
            outcomes=True,
        )

    def stream(
        self,
        service: str | bytes,
        *data: Part,
        metadata: Sequence[Part] = (),
        window: int = DEFAULT_WINDOW,
        timeout: float | None = None,
        stall_timeout: float | None = None,
        work_timeout: float | None = None,
        wait_for_worker: bool | None = None,
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
        :param wait_for_worker: as :meth:`request`'s (no worker: :exc:`~dcp.NoWorkers`
            while reading, at once, unless ``True``)
        :raises ValueError: a bad option (at once, nothing is sent)
        :raises StreamBroken: (while reading) the worker went away mid-stream
        :raises RemoteError: (while reading) the stream ended with an error reply
        :raises RequestTimeout: (while reading) ``timeout`` or ``stall_timeout`` passed
        """
        checked, parts, meta, timing = self._stream_options(
            service, data, metadata, timeout, stall_timeout, work_timeout, wait_for_worker
        )
        on_close = None
        if self._tracing is not None:
            meta, on_close = self._tracing.stream(checked, meta)
        stream = Stream(self._receiver, checked, parts, meta, timing, window, stall_timeout)
        stream.on_close = on_close
        return stream

    # ------------------------------------------------------------------ pub/sub

    async def publish(self, subject: str | bytes, *data: Part, ack: bool = False) -> int | None:
        """Publish ``data`` to ``subject`` (see ``docs/pubsub.md``). Without ``ack`` it returns
        ``None`` once sent (at most once); with ``ack`` it waits for the broker and returns how
        many subscriptions the message was routed to (a queue group counts once).

        :raises ValueError: a bad subject (nothing is sent)
        :raises RemoteError: with ``ack``, a refusal (``forbidden_subject``, ...)
        """
        return await _publish(self, self._receiver, subject, data, ack)

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
        return _subscribe(
            self,
            self._receiver,
            pattern,
            queue,
            max_pending,
            overflow,
            window,
            refresh,
            last_value,
        )

    # ------------------------------------------------------------------ internals

    def _map(
        self,
        service: bytes,
        payloads: Iterable[Payload],
        window: int,
        metadata: tuple[bytes, ...],
        timing: Timing,
        *,
        ordered: bool,
        indexed: bool,
        take: Callable[[Outcome | None], object],
        outcomes: bool = False,
    ) -> AsyncGenerator[Any, None]:
        """One of the maps, its options checked: its requests are made on iteration
        (``outcomes``: ``map_outcomes``, maps Rule MP5)."""
        receiver = self._receiver
        start: Start
        if self._tracing is None:
            sink, start = Sink(), receiver.start
        else:
            sink, start = self._tracing.sink(receiver.start)
        return map_async(
            receiver,
            start,
            sink,
            service,
            payloads,
            window,
            metadata,
            timing,
            ordered=ordered,
            indexed=indexed,
            take=take,
            outcomes=outcomes,
        )

    async def _mmi(
        self,
        question: str,
        name: str | bytes | None,
        timeout: float | None,  # noqa: ASYNC109 (the request's own timeout)
        broker: int | None = None,
    ) -> Any:
        """Ask the broker ``question`` (an ``mmi.*`` service) about ``name``: its answer."""
        return mmi_answer(question, await self._ask(broker, question, mmi_args(name), timeout))

    async def _ask(
        self,
        broker: int | None,
        question: str,
        data: tuple[bytes, ...],
        timeout: float | None,  # noqa: ASYNC109 (the request's own timeout)
    ) -> Response:
        """One ``mmi.*`` question, sent once, queued until answered: through broker
        ``broker`` only (receive Rule RX6), or (``None``) as any request goes."""
        if broker is None:
            return await self.request(
                question, *data, timeout=timeout, retries=0, wait_for_worker=True
            )
        metadata = self._metadata((), None, True)
        timing = self._tracker.timing(timeout, None, 0)
        return await self._receiver.ask_at(broker, service_bytes(question), data, metadata, timing)

    async def _each_broker(
        self,
        ask: Callable[[int | None, float | None], Awaitable[T]],
        timeout: float | None,  # noqa: ASYNC109 (each request's own timeout)
    ) -> list[T]:
        """``ask`` each live broker at once (several brokers): their answers, in the order
        the brokers were given; one that fails is left out while another answers (the
        first failure is raised if none does). With none live, one ``ask`` goes as any
        request (to the first broker back). Within ``receive.SETTLE`` of entering, it first
        waits for each broker's first handshake."""
        brokers = self._brokers
        assert brokers is not None
        # Just entered: give every broker its first handshake (or failure) first.
        await self._receiver.wait_connected()  # at most receive.SETTLE after entering
        live = [i for i in range(len(brokers.endpoints)) if brokers.is_live(i)]
        if not live:
            return [await ask(None, timeout)]
        answers: dict[int, T] = {}
        failures: list[Exception] = []

        async def one(i: int) -> None:
            try:
                answers[i] = await ask(i, timeout)
            except Exception as exc:  # another broker may answer
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            for i in live:
                tg.start_soon(one, i)
        if not answers:
            raise failures[0]
        return [answers[i] for i in sorted(answers)]
