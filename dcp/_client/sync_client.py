"""The blocking client: plain pyzmq around :class:`~dcp._core.client.tracker.RequestTracker`,
no event loop. Meant for threads and processes that are not async (e.g. Spark executors), so the
per-request path is kept short: one tracker entry, one frames list, one result slot. Its
socket and what arrives on it are the client's :class:`~dcp._client.sync_receive.SyncReceiver`,
which the maps, streams and pub/sub are given.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from dcp._client.maps import map_sync, outcome_of, response_of
from dcp._client.options import ClientOptions
from dcp._client.pubsub import SyncSubscription, publish_sync, subscribe_sync
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
from dcp._client.streams import DEFAULT_WINDOW, SyncStream
from dcp._client.sync_brokers import HEARTBEAT, BrokerLink, BrokersReceiver
from dcp._client.sync_pubsub import subscribe_brokers
from dcp._client.sync_receive import SyncReceiver, refuse_in_event_loop
from dcp._core.client.brokers import Brokers
from dcp._core.client.calls import Part, Payload, data_parts, service_bytes
from dcp._io.beacon import BEACON_SCHEME, beacon_wait, resolve_blocking
from dcp._io.handshake import (
    HandshakeWatch,
    all_unreachable,
    close_monitor,
    connect_dealer,
)
from dcp._io.security import CurveClient
from dcp._json import encode_json
from dcp._models import Outcome, Response

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from dcp._client.tracing import SyncTracing

__all__ = ["SyncClient"]

T = TypeVar("T")


class SyncClient(ClientOptions):
    """A blocking DCP client, for one thread.

    ::

        with dcp.SyncClient("tcp://127.0.0.1:5555") as client:
            response = client.request("echo", b"hello")
            for response in client.map("echo", payloads, window=64):
                ...

    Same ids, timeouts, retries and errors as :class:`dcp.Client` (the same tracker). The socket is
    created and connected by the constructor and closed (linger 0) by :meth:`close` or at
    the end of the ``with`` block. A client belongs to the process that created it: a
    forked child must create its own (it raises :exc:`RuntimeError` otherwise). It also
    belongs to the first thread that sends a request on it (zmq sockets are not
    thread-safe): a request, ``map`` or read from any other thread raises
    :exc:`RuntimeError` at once; create one client per thread. :meth:`close` may be called
    from any thread, once no other thread uses the client.

    When zmq's send queue is full (high-water mark) a send waits for room until the
    attempt's deadline; then the attempt counts as lost and the retry rule takes over.
    While a send waits, replies are not read (they queue in zmq).

    Parameters are those of :class:`dcp.Client` (``type_width=4`` for the DagBox C++
    reference broker); a bad one raises :exc:`ValueError` before the socket is created.

    **Several brokers** (``docs/scaling.md``): given a list of endpoints
    (``dcp.SyncClient(["tcp://a:5555", "tcp://b:5555"])``), it makes one socket per broker
    (the same routing id on each, one id space) and follows the same rules as
    :class:`dcp.Client` (:mod:`dcp._core.client.brokers`): each request goes to the live
    broker with the fewest outstanding requests; when a broker is lost (its connection
    closes, or zmq's heartbeat finds it silent for 3 s), each request waiting there moves
    ``failover_grace`` seconds later (default 0.2) to another, with the same id (not a
    retry: its ``retries`` and deadline are untouched), unless a worker said it runs it (a
    HELD notice); a broker that comes back is used again. A stream stays on its broker
    (lost: :exc:`~dcp.StreamBroken`). A subscription subscribes at every live broker; a
    publish goes through one (the first live in the list). :meth:`services` and friends
    ask every live broker and merge. The waiting, sending and reading all happen in the
    calling thread, as with one broker. ``endpoint`` is the first endpoint,
    :attr:`endpoints` all of them; a ``beacon://`` entry is the first broker heard there.
    """

    _traced: SyncTracing | None = None

    def _trace(self, tracing: bool | TracerProvider, endpoint: str) -> None:
        from dcp._client.tracing import SyncTracing  # imports OpenTelemetry: only when asked

        self._traced = SyncTracing(tracing, endpoint)

    def _setup(
        self, context: zmq.Context[zmq.Socket[bytes]] | None, security: CurveClient | None
    ) -> None:
        refuse_in_event_loop()  # Rule SX4, before a socket exists
        if self._brokers is not None:
            self._setup_brokers(context, security)
            return
        if self.endpoint.startswith(BEACON_SCHEME):  # docs/services.md: a beacon to listen to
            key = None if security is None else security.server_key
            wait = beacon_wait(self._tracker.timeout)  # the client's timeout, if shorter
            self.endpoint = self._tracker.endpoint = resolve_blocking(
                self.endpoint, key=key, timeout=wait
            )
            self._tracker.endpoints = (self.endpoint,)
            self._endpoints = (self.endpoint,)
        sock, mon = connect_dealer(
            context,
            self.routing_id,
            security,
            self.endpoint,
            refusals=not self.wait_for_broker,  # sync_receive Rule SX5
        )
        watch = HandshakeWatch(self.endpoint, secure=security is not None, role="client")
        #: The socket and what arrived on it (dcp._client.sync_receive).
        self._receiver = SyncReceiver(
            self._tracker, sock, mon, watch, endpoint=self.endpoint, batch=self._batch
        )
        if not self.wait_for_broker:  # sync_receive Rule SX5
            self._receiver.refusing = watch.unreachable
        if self._traced is not None:
            self._traced.attach(self._receiver)

    def _setup_brokers(
        self, context: zmq.Context[zmq.Socket[bytes]] | None, security: CurveClient | None
    ) -> None:
        """Several brokers (``docs/scaling.md``): a socket each, with the same routing id
        (dcp._client.sync_brokers). Each ``beacon://`` entry is the first broker heard
        there; an endpoint heard twice is used once."""
        key = None if security is None else security.server_key
        brokers = self._brokers
        assert brokers is not None
        wait = beacon_wait(self._tracker.timeout)  # the client's timeout, if shorter
        resolved = tuple(
            dict.fromkeys(resolve_blocking(e, key=key, timeout=wait) for e in self.endpoints)
        )
        if resolved != self.endpoints:  # beacons: the brokers heard
            brokers = self._brokers = Brokers(resolved, grace=brokers.grace)
        self._endpoints = resolved
        self.endpoint = resolved[0]
        self._tracker.endpoint = " or ".join(resolved)
        self._tracker.endpoints = tuple(resolved)
        links: list[BrokerLink] = []
        try:
            for i, endpoint in enumerate(self.endpoints):
                sock, mon = connect_dealer(
                    context,
                    self.routing_id,
                    security,
                    endpoint,
                    heartbeat=HEARTBEAT,  # Rule SM2
                    refusals=not self.wait_for_broker,  # sync_receive Rule SX5
                )
                watch = HandshakeWatch(endpoint, secure=security is not None, role="client")
                links.append(BrokerLink(i, endpoint, sock, mon, watch))
        except BaseException:
            for link in links:
                close_monitor(link.sock, link.monitor)
                link.sock.close(0)
            raise
        #: The sockets and what arrived on them (dcp._client.sync_brokers).
        self._receiver = BrokersReceiver(self._tracker, links, brokers, batch=self._batch)
        if not self.wait_for_broker:  # sync_receive Rule SX5: every broker unreachable
            watches = [link.watch for link in links]
            self._receiver.refusing = functools.partial(all_unreachable, watches)
        if self._traced is not None:
            self._traced.attach(self._receiver)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once the client was closed (or a handshake failure closed it)."""
        return self._receiver.closed

    def close(self) -> None:
        """Close the socket (linger 0) and forget pending requests. Idempotent."""
        self._receiver.close()

    # ------------------------------------------------------------------ requests

    def request(
        self,
        service: str | bytes,
        *data: Part,
        metadata: Sequence[Part] = (),
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        retries: int | None = None,
        work_timeout: float | None = None,
        wait_for_worker: bool | None = None,
        no_wait: bool | None = None,
    ) -> Response:
        """Send a request and block until its reply (see :meth:`dcp.Client.request`: the
        same options and errors).

        An exception while waiting (e.g. ``KeyboardInterrupt``) forgets the request.

        :raises TypeError: a part that is not ``bytes`` or ``str`` (nothing is sent)
        :raises NoWorkers: no worker serves the service (the broker said so)
        :raises RequestTimeout: no reply within ``timeout``, or after the last attempt
        :raises RemoteError: a dcp error reply
        :raises anyio.ClosedResourceError: the client is closed
        """
        service = service_bytes(service)
        parts = data_parts(data)
        metadata = self._metadata(metadata, work_timeout, wait_for_worker, no_wait)
        timing = self._tracker.timing(timeout, attempt_timeout, retries)
        receiver = self._receiver
        rid = receiver.start(service, parts, metadata, timing)
        done = receiver.done
        try:
            while rid not in done:
                receiver.pump()
        except BaseException:
            receiver.forget(rid)
            raise
        return response_of(done.pop(rid))

    def request_json(
        self,
        service: str | bytes,
        obj: Any,
        *,
        metadata: Sequence[Part] = (),
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        retries: int | None = None,
        work_timeout: float | None = None,
        wait_for_worker: bool | None = None,
        no_wait: bool | None = None,
    ) -> Any:
        """Send ``obj`` as one JSON data part (UTF-8) and return the reply's one data part
        decoded from JSON: ``client.request_json("add", {"a": 1, "b": 2})``.

        The options and errors are :meth:`request`'s, and:

        :raises TypeError: ``obj`` is not JSON-serialisable (before anything is sent)
        :raises ValueError: ``obj`` holds ``NaN`` or an infinity (before anything is sent);
            the reply is not exactly one UTF-8 JSON part
        """
        response = self.request(
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

    def services(self, *, timeout: float | None = None) -> list[ServiceSummary]:
        """Every service the broker knows, with workers, queue and version (``mmi.services``,
        ``docs/services.md``); :meth:`dcp.Client.services`, blocking. Asked a page at a time
        (``docs/services.md``, "Pages"), so a listing taken while services come and go lists
        every service known throughout.

        Given several brokers, every live one is asked and the lists merged
        (``docs/scaling.md``): a service known to several is listed once, its ``workers``,
        ``idle``, ``busy`` and ``queued`` summed, its version and description from the
        first broker that knows it. A broker that fails to answer is left out while
        another answers.

        :param timeout: seconds for each page's request (default: the client's)
        :raises RuntimeError: the broker does not answer it (not a dcp broker)
        """
        receiver = self._receiver
        if isinstance(receiver, BrokersReceiver):  # each live broker's, merged (services.py)
            return merge_summaries(self._each_broker(receiver, lambda: self._services(timeout)))
        return self._services(timeout)

    def _services(self, timeout: float | None) -> list[ServiceSummary]:
        listing: list[dict[str, Any]] = []
        after: bytes | None = None
        while True:  # directory Rule D6: one page per request, until the last
            response = self.request(
                "mmi.services", *mmi_args(after), timeout=timeout, retries=0, wait_for_worker=True
            )
            page, after = mmi_page("mmi.services", response, after)
            listing += page
            if after is None:
                return summaries(listing)

    def service_info(
        self, name: str | bytes, *, timeout: float | None = None
    ) -> ServiceInfo | None:
        """One service's version, description, metadata and schemas (``mmi.info``);
        ``None`` if the broker knows no such service (several brokers: each live one is
        asked, the answers merged)."""
        receiver = self._receiver
        if isinstance(receiver, BrokersReceiver):
            answers = self._each_broker(
                receiver, lambda: service_info(self._mmi("mmi.info", name, timeout))
            )
            return merge_info(answers)
        return service_info(self._mmi("mmi.info", name, timeout))

    def service_stats(
        self, name: str | bytes, *, timeout: float | None = None
    ) -> ServiceStats | None:
        """One service's live figures from the broker (``mmi.stats``); ``None`` if unknown
        (several brokers: each live one is asked, the figures summed)."""
        receiver = self._receiver
        if isinstance(receiver, BrokersReceiver):
            answers = self._each_broker(
                receiver, lambda: service_stats(self._mmi("mmi.stats", name, timeout))
            )
            return merge_stats(answers)
        return service_stats(self._mmi("mmi.stats", name, timeout))

    def watch_services(
        self, *, interval: float = 1.0, timeout: float | None = None
    ) -> Iterator[ServiceChange]:
        """Services coming up and going down, polled every ``interval`` seconds (sleeping
        between polls): :meth:`dcp.Client.watch_services`, as a plain iterator. Runs until
        the caller stops iterating.

        :raises ValueError: ``interval`` is not a positive finite number (on iteration)
        """
        watch = ServiceWatch(interval)
        while True:
            yield from watch.changes(self.services(timeout=timeout))
            time.sleep(interval)

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
    ) -> Generator[Response, None, None]:
        """Request ``service`` once per payload; yield replies in input order.

        At most ``window`` requests are outstanding (sent, reply not yet yielded). The first
        failure is raised; closing the generator early forgets the outstanding requests.
        The options are :meth:`request`'s, for each request.

        :param payloads: each is ``bytes`` or ``str`` (one data part) or a sequence of
            data parts; each is checked before it is sent
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
        return map_sync(
            self._receiver,
            checked,
            payloads,
            window,
            meta,
            timing,
            ordered=True,
            indexed=False,
            take=response_of,
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
    ) -> Generator[Outcome, None, None]:
        """Like :meth:`map`, but yield every request's outcome instead of raising failures:
        a :class:`~dcp.Response`, or the :exc:`~dcp.RemoteError` or
        :exc:`~dcp.RequestTimeout` that :meth:`map` would raise. One failure does not stop
        the others (e.g. to keep per-row errors, as ``dcp.spark`` does).
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
        return map_sync(
            self._receiver,
            checked,
            payloads,
            window,
            meta,
            timing,
            ordered=True,
            indexed=False,
            take=outcome_of,
            outcomes=True,
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
    ) -> Generator[tuple[int, Response], None, None]:
        """Like :meth:`map`, but yield ``(index, response)`` as replies arrive."""
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
        return map_sync(
            self._receiver,
            checked,
            payloads,
            window,
            meta,
            timing,
            ordered=False,
            indexed=True,
            take=response_of,
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
    ) -> SyncStream:
        """Request ``service`` and iterate over its answer part by part, as
        :meth:`dcp.Client.stream` (the same options and errors)::

            with client.stream("rows", b"query") as parts:
                for part in parts:
                    ...

        Closing it (leaving the ``with`` block, or :meth:`SyncStream.close`) before the end
        cancels the stream at the worker (so does an exception raised while waiting for a
        part). The request is sent when this is called.
        """
        checked, parts, meta, timing = self._stream_options(
            service, data, metadata, timeout, stall_timeout, work_timeout, wait_for_worker
        )
        return SyncStream(self._receiver, checked, parts, meta, timing, window, stall_timeout)

    # ------------------------------------------------------------------ pub/sub

    def publish(self, subject: str | bytes, *data: Part, ack: bool = False) -> int | None:
        """:meth:`dcp.Client.publish`, blocking."""
        return publish_sync(self, self._receiver, subject, data, ack)

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
    ) -> contextlib.AbstractContextManager[SyncSubscription]:
        """:meth:`dcp.Client.subscribe`, blocking: ``for msg in sub`` (or ``sub.next(timeout)``).
        Credit and refreshes are sent while the caller takes messages. Given several
        brokers, it subscribes at every live one (``docs/scaling.md``)."""
        receiver = self._receiver
        options = (pattern, queue, max_pending, overflow, window, refresh, last_value)
        if isinstance(receiver, BrokersReceiver):
            return subscribe_brokers(self, receiver, self._start_plain, *options)
        return subscribe_sync(self, receiver, self._start_plain, *options)

    # ------------------------------------------------------------------ internals

    def _start_plain(
        self,
        service: bytes,
        data: Sequence[bytes],
        *,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> bytes:
        """Start a request without waiting for it (its outcome lands in the receiver's
        ``done``): a subscription's credit.

        :param timeout: seconds for the whole call (default: the client's)
        :param retries: resends (default: the client's)
        """
        timing = self._tracker.timing(timeout, None, retries)
        return self._receiver.start(service, data, self._metadata((), None, None), timing)

    def _mmi(self, question: str, name: str | bytes | None, timeout: float | None) -> Any:
        """Ask the broker ``question`` (an ``mmi.*`` service) about ``name``: its answer."""
        response = self.request(
            question, *mmi_args(name), timeout=timeout, retries=0, wait_for_worker=True
        )
        return mmi_answer(question, response)

    def _each_broker(self, receiver: BrokersReceiver, ask: Callable[[], T]) -> list[T]:
        """``ask()`` of each live broker in turn (each request goes to that broker only;
        Rule SM4), the answers in the order the brokers were given; one that fails is left
        out while another answers. With none live, one ``ask()`` goes as any request (to
        the first broker back). Within :data:`~dcp._client.sync_brokers.SETTLE` of the
        client's making, it first waits for each broker's first handshake.

        :raises Exception: every broker asked failed (the first failure)
        """
        receiver.settle()
        live = receiver.live_brokers()
        if not live:
            return [ask()]
        answers: list[T] = []
        failures: list[Exception] = []
        for broker in live:
            try:
                with receiver.pinned(broker):
                    answers.append(ask())
            except Exception as exc:  # another broker may answer
                failures.append(exc)
        if not answers:
            raise failures[0]
        return answers
