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
from collections.abc import AsyncGenerator, Iterable, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.lowlevel
import zmq

from ._calls import (
    Part,
    Payload,
    check_window,
    checked_routing_id,
    data_parts,
    payload_parts,
    request_metadata,
    service_bytes,
)
from ._context import get_context
from ._json import encode_json
from ._messages import work_timeout_option
from ._security import CurveClient, configure_client_socket
from ._tracker import ClientStatistics, Outcome, RequestTracker, Response
from ._waiters import Sink, Waiter
from ._zmqio import AsyncSocket

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

    Requests are matched to replies by an id dcp puts first in the metadata; every request
    is retried on timeout with the same id (see :class:`~dcp._tracker.RequestTracker` for
    the exact rule). Many tasks may call :meth:`request` at once.

    Sends never block the event loop: when zmq's send queue is full (high-water mark) the
    caller pauses 1 ms, doubling up to 50 ms, and tries again until its attempt's deadline,
    after which the attempt counts as lost and the retry rule takes over. A *resend* that
    finds the queue full is not made (counted in ``resends_dropped``); that attempt simply
    times out again.

    :param endpoint: the broker's zmq endpoint
    :param timeout: default seconds per attempt (``math.inf``: no timeout)
    :param retries: default resends after a timed-out attempt
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
        default); see :doc:`reliability`
    :param security: CURVE keys (see ``docs/security.md``; default: no security). A broker
        that does not accept the key, or is not the one whose key is given, never
        completes the handshake: requests time out.
    :param type_width: width of the type frame of every request: 1 (the spec, default) or 4
        (a little-endian ``int``, as the DagBox C++ reference writes it; its broker aborts on
        1-byte types). Replies are read in either width.
    :raises ValueError: a bad option (e.g. ``type_width`` not 1 or 4), before any socket
        exists
    """

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
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
    ) -> None:
        routing_id = checked_routing_id(routing_id)
        if work_timeout is not None:
            work_timeout_option(work_timeout)  # check it now
        #: Default work timeout of requests (seconds; ``None``: the broker's).
        self.work_timeout = work_timeout
        self.endpoint = endpoint
        self._security = security
        #: The socket's zmq routing id: the broker's address for this client.
        self.routing_id = routing_id
        self._tracker = RequestTracker(
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            backoff_factor=backoff_factor,
            backoff_max=backoff_max,
            jitter=jitter,
            rng=rng,
            remember=remember,
            type_width=type_width,
        )
        self._context = context
        self._batch = batch
        self._socket: AsyncSocket | None = None
        self._waiters: dict[bytes, Waiter | Sink] = {}
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._closed = False
        self._broken: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Client:
        if self._socket is not None or self._closed:
            raise RuntimeError("a Client can be entered only once")
        ctx = self._context if self._context is not None else get_context()
        sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
            configure_client_socket(sock, self._security)
            sock.connect(self.endpoint)
        except BaseException:
            sock.close(0)
            raise
        self._socket = AsyncSocket(sock)
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self._shutdown, None)
            tg = await stack.enter_async_context(anyio.create_task_group())
            tg.start_soon(self._receive_loop)
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
        timeout: float | None = None,  # noqa: ASYNC109 (per attempt, not overall)
        retries: int | None = None,
        work_timeout: float | None = None,
    ) -> Response:
        """Send a request and wait for its reply.

        Cancelling the caller forgets the request at once (a reply arriving later is counted
        as late and dropped); nothing is left behind.

        :param data: the data parts
        :param metadata: non-empty parts the worker returns unchanged in the reply
        :param timeout: seconds per attempt (default: the client's)
        :param retries: resends after timed-out attempts (default: the client's)
        :param work_timeout: seconds a worker may hold it (default: the client's)
        :raises RequestTimeout: no reply after the last attempt
        :raises RemoteError: a dcp error reply (from a worker or the broker)
        :raises anyio.ClosedResourceError: the client is (or was, while waiting) closed
        :raises anyio.BrokenResourceError: the socket failed
        """
        waiter = Waiter()
        service = service_bytes(service)
        parts = data_parts(data)
        metadata = request_metadata(metadata, work_timeout, self.work_timeout)
        rid, frames, deadline = self._start(service, parts, metadata, timeout, retries, waiter)
        try:
            await self._send(rid, frames, deadline)
            await waiter.event.wait()
        finally:
            if self._waiters.pop(rid, None) is not None:
                self._tracker.cancel(rid)
        return self._result(waiter.outcome)

    async def request_json(
        self,
        service: str | bytes,
        obj: Any,
        *,
        metadata: Sequence[Part] = (),
        timeout: float | None = None,  # noqa: ASYNC109 (see request())
        retries: int | None = None,
        work_timeout: float | None = None,
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
            retries=retries,
            work_timeout=work_timeout,
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
        retries: int | None = None,
        work_timeout: float | None = None,
    ) -> AsyncGenerator[Response, None]:
        """Request ``service`` once per payload; yield the replies in input order.

        ::

            async for response in client.map("echo", [b"a", b"b", (b"two", b"parts")]):
                ...

        At most ``window`` requests are outstanding (sent, reply not yet yielded), so at
        most ``window`` replies are buffered. The first failure is raised and the
        outstanding requests are forgotten. Leaving the loop early forgets them when the
        generator is closed: ``async with contextlib.aclosing(client.map(...)) as replies:``
        makes that immediate (otherwise it happens when the generator is collected).

        :param payloads: each is ``bytes`` (one data part) or a sequence of data parts
        :raises ValueError: ``window`` < 1 (at once, not on iteration)
        """
        check_window(window)
        service = service_bytes(service)
        metadata = request_metadata(metadata, work_timeout, self.work_timeout)
        return self._map(service, payloads, window, metadata, timeout, retries)

    def map_unordered(
        self,
        service: str | bytes,
        payloads: Iterable[Payload],
        *,
        window: int = 64,
        metadata: Sequence[Part] = (),
        timeout: float | None = None,
        retries: int | None = None,
        work_timeout: float | None = None,
    ) -> AsyncGenerator[tuple[int, Response], None]:
        """Like :meth:`map`, but yield ``(index, response)`` as replies arrive (``index``
        is the payload's position in ``payloads``)."""
        check_window(window)
        service = service_bytes(service)
        metadata = request_metadata(metadata, work_timeout, self.work_timeout)
        return self._map_unordered(service, payloads, window, metadata, timeout, retries)

    async def _map(
        self,
        service: bytes,
        payloads: Iterable[Payload],
        window: int,
        metadata: Sequence[bytes],
        attempt_timeout: float | None,
        retries: int | None,
    ) -> AsyncGenerator[Response, None]:
        sink = Sink()
        order: deque[bytes] = deque()
        done = sink.done
        try:
            for index, payload in enumerate(payloads):
                if len(order) >= window:
                    while order[0] not in done:
                        await sink.wait()
                    yield self._result(done.pop(order.popleft()))
                rid, frames, deadline = self._start(
                    service,
                    payload_parts(payload, index),
                    metadata,
                    attempt_timeout,
                    retries,
                    sink,
                )
                order.append(rid)
                await self._send(rid, frames, deadline)
            while order:
                while order[0] not in done:
                    await sink.wait()
                yield self._result(done.pop(order.popleft()))
        finally:
            self._forget(order)

    async def _map_unordered(
        self,
        service: bytes,
        payloads: Iterable[Payload],
        window: int,
        metadata: Sequence[bytes],
        attempt_timeout: float | None,
        retries: int | None,
    ) -> AsyncGenerator[tuple[int, Response], None]:
        sink = Sink()
        inflight: dict[bytes, int] = {}
        done = sink.done
        try:
            for index, payload in enumerate(payloads):
                if len(inflight) >= window:
                    while not done:
                        await sink.wait()
                    rid = next(iter(done))
                    yield inflight.pop(rid), self._result(done.pop(rid))
                rid, frames, deadline = self._start(
                    service,
                    payload_parts(payload, index),
                    metadata,
                    attempt_timeout,
                    retries,
                    sink,
                )
                inflight[rid] = index
                await self._send(rid, frames, deadline)
            while inflight:
                while not done:
                    await sink.wait()
                rid = next(iter(done))
                yield inflight.pop(rid), self._result(done.pop(rid))
        finally:
            self._forget(inflight)

    # ------------------------------------------------------------------ internals

    def _start(
        self,
        service: bytes,
        data: Sequence[bytes],
        metadata: Sequence[bytes],
        timeout: float | None,
        retries: int | None,
        waiter: Waiter | Sink,
    ) -> tuple[bytes, list[bytes], float]:
        if self._closed:
            raise self._closed_error()
        if self._socket is None:
            raise RuntimeError("use 'async with Client(...)' before sending requests")
        tracker = self._tracker
        now = anyio.current_time()
        rid = tracker.request(
            service, data, now, metadata=metadata, timeout=timeout, retries=retries
        )
        out, tracker.outbox = tracker.outbox, []
        (frames,) = out  # the request's first attempt; sent (or waited for) by _send
        self._waiters[rid] = waiter
        deadline = now + (tracker.timeout if timeout is None else timeout)
        asock = self._socket
        if asock is not None:
            asock.move_deadline(deadline)
        return rid, frames, deadline

    async def _send(self, rid: bytes, frames: list[bytes], deadline: float) -> None:
        """Send a request's first attempt, pausing while zmq's queue is full."""
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
            self._socket.close(0)
        self._tracker.cancel_all()
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
        failure: BaseException | None = None
        try:
            while True:
                deadline = tracker.next_deadline()
                await asock.wait_readable(math.inf if deadline is None else deadline)
                if asock.closed:
                    break
                for msg in asock.drain(batch):
                    resolved = tracker.receive(msg.frames)
                    if resolved is not None:
                        rid, outcome = resolved
                        waiter = waiters.pop(rid, None)
                        if waiter is not None:
                            waiter.deliver(rid, outcome)
                now = anyio.current_time()
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
