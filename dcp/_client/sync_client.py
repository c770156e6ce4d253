"""The blocking client: plain pyzmq around :class:`~dcp._core.client.tracker.RequestTracker`,
no event loop. Meant for threads and processes that are not async (e.g. Spark executors), so the
per-request path is kept short: one tracker entry, one frames list, one result slot.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from collections.abc import Generator, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import zmq

from dcp._client.maps import map_sync, map_unordered_sync, outcome_of, response_of
from dcp._client.options import ClientOptions
from dcp._client.pubsub import SyncSubscription, deliver, publish_sync, subscribe_sync
from dcp._client.streams import DEFAULT_WINDOW, SyncStream
from dcp._core.client.calls import Part, Payload, Timing, data_parts, service_bytes
from dcp._errors import AuthenticationFailed
from dcp._io.beacon import BEACON_SCHEME, resolve_blocking
from dcp._io.handshake import HandshakeWatch, close_monitor, connect_dealer, read_events
from dcp._io.security import CurveClient
from dcp._io.sockets import recv_frames, send_frames
from dcp._json import encode_json
from dcp._models import Outcome, Response
from dcp.wire.streams import is_stream, parse_part

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from dcp._client.tracing import SyncTracing

__all__ = ["SyncClient"]


_POLLIN = zmq.POLLIN
_POLLOUT = zmq.POLLOUT
# Longest single wait for room in a full send queue, in seconds (then we re-check the time).
_SEND_POLL_MAX = 0.1


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
    """

    _traced: SyncTracing | None = None

    def _trace(self, tracing: bool | TracerProvider, endpoint: str) -> None:
        from dcp._client.tracing import SyncTracing  # imports OpenTelemetry: only when asked

        self._traced = SyncTracing(tracing, endpoint)

    def _setup(
        self, context: zmq.Context[zmq.Socket[bytes]] | None, security: CurveClient | None
    ) -> None:
        if self.endpoint.startswith(BEACON_SCHEME):  # docs/services.md: a beacon to listen to
            key = None if security is None else security.server_key
            self.endpoint = resolve_blocking(self.endpoint, key=key)
        self._pid = os.getpid()
        sock, mon = connect_dealer(context, self.routing_id, security, self.endpoint)
        self._sock = sock
        self._monitor = mon
        self._watch = HandshakeWatch(self.endpoint, secure=security is not None, role="client")
        #: Set when a handshake failure ended the client (see dcp._io.handshake).
        self._failure: AuthenticationFailed | None = None
        self._poller = zmq.Poller()
        self._poller.register(sock, _POLLIN)
        if mon is not None:
            self._poller.register(mon, _POLLIN)
        #: Outcomes received but not yet taken by the caller that waits for them.
        self._done: dict[bytes, Outcome] = {}
        #: Parts of the streams being read (dcp._client.streams), by request id.
        self._stream_parts: dict[bytes, deque[tuple[bytes, ...]]] = {}
        self._subscriptions: dict[bytes, Any] = {}
        self._closed = False
        # The thread the client belongs to: the first one to send a request.
        self._owner: int | None = None
        self._owner_name = ""
        self._owner_lock = threading.Lock()
        if self._traced is not None:
            self._traced.attach(self)

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

    def close(self) -> None:
        """Close the socket (linger 0) and forget pending requests. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pid == os.getpid():
            if self._monitor is not None:
                close_monitor(self._sock, self._monitor)
            self._sock.close(0)
        self._tracker.cancel_all()
        self._done.clear()

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
        metadata = self._metadata(metadata, work_timeout, no_wait)
        timing = self._tracker.timing(timeout, attempt_timeout, retries)
        rid = self._start(service, parts, metadata, timing)
        done = self._done
        try:
            while rid not in done:
                self._pump()
        except BaseException:
            self._forget(rid)
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
            no_wait=no_wait,
        )
        return response.json()

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
    ) -> Generator[Response, None, None]:
        """Request ``service`` once per payload; yield replies in input order.

        At most ``window`` requests are outstanding (sent, reply not yet yielded). The first
        failure is raised; closing the generator early forgets the outstanding requests.
        The options are :meth:`request`'s, for each request.

        :param payloads: each is ``bytes`` or ``str`` (one data part) or a sequence of
            data parts; each is checked before it is sent
        """
        checked, meta, timing = self._map_options(
            window, service, metadata, timeout, attempt_timeout, retries, work_timeout, no_wait
        )
        return map_sync(self, checked, payloads, window, meta, timing, response_of)

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
        no_wait: bool | None = None,
    ) -> Generator[Outcome, None, None]:
        """Like :meth:`map`, but yield every request's outcome instead of raising failures:
        a :class:`~dcp.Response`, or the :exc:`~dcp.RemoteError` or
        :exc:`~dcp.RequestTimeout` that :meth:`map` would raise. One failure does not stop
        the others (e.g. to keep per-row errors, as ``dcp.spark`` does).
        """
        checked, meta, timing = self._map_options(
            window, service, metadata, timeout, attempt_timeout, retries, work_timeout, no_wait
        )
        return map_sync(self, checked, payloads, window, meta, timing, outcome_of)

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
    ) -> Generator[tuple[int, Response], None, None]:
        """Like :meth:`map`, but yield ``(index, response)`` as replies arrive."""
        checked, meta, timing = self._map_options(
            window, service, metadata, timeout, attempt_timeout, retries, work_timeout, no_wait
        )
        return map_unordered_sync(self, checked, payloads, window, meta, timing)

    def stream(
        self,
        service: str | bytes,
        *data: Part,
        metadata: Sequence[Part] = (),
        window: int = DEFAULT_WINDOW,
        timeout: float | None = None,
        stall_timeout: float | None = None,
        work_timeout: float | None = None,
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
            service, data, metadata, timeout, stall_timeout, work_timeout
        )
        return SyncStream(self, checked, parts, meta, timing, window, stall_timeout)

    # ------------------------------------------------------------------ pub/sub

    def publish(self, subject: str | bytes, *data: Part, ack: bool = False) -> int | None:
        """:meth:`dcp.Client.publish`, blocking."""
        return publish_sync(self, subject, data, ack)

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
        Credit and refreshes are sent while the caller takes messages."""
        return subscribe_sync(
            self, pattern, queue, max_pending, overflow, window, refresh, last_value
        )

    # ------------------------------------------------------------------ internals

    def _closed_error(self) -> Exception:
        failure = self._failure
        if failure is not None:
            return AuthenticationFailed(failure.endpoint, failure.reason)
        return anyio.ClosedResourceError("the client is closed")

    def _start(
        self,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timing: Timing,
    ) -> bytes:
        if self._closed:
            raise self._closed_error()
        if self._pid != os.getpid():
            raise RuntimeError("a SyncClient cannot be used in a forked child; create one there")
        if threading.get_ident() != self._owner:
            self._claim()
        tracker = self._tracker
        rid = tracker.request(service, data, time.monotonic(), metadata=metadata, timing=timing)
        (frames,), _ = tracker.drain()  # the request's first attempt
        try:
            self._send(frames, tracker.deadline_of(rid))
        except BaseException:
            tracker.cancel(rid)
            raise
        return rid

    def _send(self, frames: list[bytes], deadline: float) -> None:
        sock = self._sock
        try:
            send_frames(sock, frames)
            return
        except zmq.Again:
            pass
        self._tracker.send_waits += 1
        # A handshake that failed before the first send leaves no connection to queue on
        # (libzmq does not reconnect after it): watch the monitor while waiting, or the
        # failure would only be read once the attempt is over.
        poller = zmq.Poller()
        poller.register(sock, _POLLOUT)
        if self._monitor is not None:
            poller.register(self._monitor, _POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return  # the attempt counts as lost; the retry rule takes over
            ready = dict(poller.poll(math.ceil(min(remaining, _SEND_POLL_MAX) * 1000)))
            if self._monitor is not None and self._monitor in ready:
                self._read_monitor()
            try:
                send_frames(sock, frames)
                return
            except zmq.Again:
                pass

    def _claim(self) -> None:
        """Make this thread the owner if there is none yet, else refuse (one thread per
        client: its zmq socket and its state are not thread-safe)."""
        me = threading.current_thread()
        with self._owner_lock:
            if self._owner is None:
                self._owner = me.ident
                self._owner_name = me.name
                return
        raise RuntimeError(
            f"a SyncClient may be used by one thread only: this one belongs to thread "
            f"{self._owner_name!r}, the first to send on it, and {me.name!r} tried to use "
            "it; create one SyncClient per thread"
        )

    def _forget(self, rid: bytes) -> None:
        if self._done.pop(rid, None) is None:
            self._tracker.cancel(rid)

    def _stream_part(self, frames: list[bytes]) -> None:
        msg = parse_part(frames)
        if msg is not None:
            queue = self._stream_parts.get(msg.metadata[0])
            if queue is not None:
                queue.append(msg.data)

    def _read_monitor(self) -> None:
        """Apply the handshake rules to the monitor's waiting events.

        :raises AuthenticationFailed: the handshake with the broker failed (the client is
            closed)
        """
        assert self._monitor is not None
        for event, value in read_events(self._monitor):
            failure = self._watch.event(event, value)
            if failure is not None:
                self._failure = failure
                self.close()
                raise self._closed_error()

    def _pump(self, wait_max: float | None = None) -> None:
        """Wait for replies or the next deadline (whichever is first, or ``wait_max``
        seconds if given and sooner) and handle them.

        :raises AuthenticationFailed: the handshake with the broker failed (the client is
            closed)
        """
        if self._closed:
            raise self._closed_error()
        if threading.get_ident() != self._owner:
            self._claim()
        tracker = self._tracker
        deadline = tracker.next_deadline()
        if deadline is None:
            wait_ms = None
        else:
            wait_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
        if wait_max is not None:
            most = math.ceil(wait_max * 1000)
            wait_ms = most if wait_ms is None else min(wait_ms, most)
        ready = dict(self._poller.poll(wait_ms))
        if self._monitor is not None and self._monitor in ready:
            self._read_monitor()
        if ready:
            sock = self._sock
            done = self._done
            receive = tracker.receive
            for _ in range(self._batch):
                try:
                    frames = recv_frames(sock)
                except zmq.Again:
                    break
                self._watch.heard = self._watch.handshakes  # handshakes Rule H5
                if self._stream_parts and is_stream(frames):
                    self._stream_part(frames)  # dcp streams (_streams.py)
                    continue
                if self._subscriptions and deliver(self._subscriptions, frames):
                    continue
                resolved = receive(frames)
                if resolved is not None:
                    done[resolved[0]] = resolved[1]
        deadline = tracker.next_deadline()
        if deadline is not None:
            now = time.monotonic()
            if deadline <= now:
                tracker.expire(now)
                out, events = tracker.drain()
                if out and self._watch.unheard():
                    # Handshakes Rule H5: a secure broker ignores this connection.
                    self._watch.heard = self._watch.handshakes
                    self._sock.disconnect(self.endpoint)
                    self._sock.connect(self.endpoint)
                for frames in out:
                    try:
                        send_frames(self._sock, frames)
                    except zmq.Again:
                        tracker.resends_dropped += 1
                for event in events:
                    self._done[event.request_id] = event.error
