"""The client's side of dcp streams: ``Client.stream()`` and ``SyncClient.stream()``.

Rules (the broker's are in :mod:`dcp._core.broker.streams`, the worker's in
:mod:`dcp._worker.streams`, the frames in :mod:`dcp.wire.streams`):

Rule C1 - Request. A stream is one request carrying the stream option with the reader's
  window (its first credit), sent once: it is never resent (``retries=0``), since a resend
  could start a second stream. ``timeout`` bounds the whole stream (the tracker's deadline,
  as for any request); ``stall_timeout``, if given, bounds the wait for each next part (or
  the end) and raises :exc:`~dcp.RequestTimeout`.
Rule C2 - Parts. Each PARTIAL for the stream's request id is one part (its data frames, a
  tuple), kept in order until read; credit keeps at most ``window`` of them unread. The
  final reply ends the stream: with no data (a dcp stream handler's end) it yields nothing
  more; with data (a worker that does not stream, e.g. a plain DCP v1 or Majordomo one) its
  data is the last part. A dcp error reply raises :exc:`~dcp.RemoteError` after the parts
  before it; ``stream_broken`` raises :exc:`~dcp.StreamBroken` with the parts received.
Rule C3 - Credit. Once half the window (at least 1) has been read since the last grant, the
  reader grants that many parts more (CREDIT).
Rule C4 - Leaving early. Leaving the stream before its end (``break``, an exception,
  cancellation, ``close()``) sends CANCEL and forgets the request: parts and the final reply
  that still arrive are dropped.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import zmq

import dcp.wire.streams as wire
from dcp._client.waiters import Sink, Waiter
from dcp._core.client.calls import Timing
from dcp._errors import RemoteError, RequestTimeout, StreamBroken
from dcp._models import Outcome, Response

if TYPE_CHECKING:
    from dcp._client.client import Client
    from dcp._client.sync_client import SyncClient

__all__ = ["Stream", "SyncStream", "StreamWaiter", "deliver_part"]

Part = tuple[bytes, ...]

#: The default window (credit) of a stream, in parts.
DEFAULT_WINDOW = 32


class StreamWaiter(Waiter):
    """Where the client's receive task puts a stream's parts and its final outcome."""

    __slots__ = ("done", "parts")

    def __init__(self) -> None:
        super().__init__()
        self.parts: deque[Part] = deque()
        self.done = False

    def deliver(self, rid: bytes, outcome: Outcome | None) -> None:
        self.outcome = outcome
        self.done = True
        self.event.set()

    def part(self, data: Part) -> None:
        self.parts.append(data)
        self.event.set()


def deliver_part(
    frames: list[bytes], waiters: MutableMapping[bytes, Waiter | Sink]
) -> deque[Part] | None:
    """Rule C2: a PARTIAL from the broker for a stream of ``waiters``; returns the queue it
    went to (``None``: dropped, a part of a stream no longer read, or not a part)."""
    msg = wire.parse_part(frames)
    if msg is None:
        return None
    waiter = waiters.get(msg.metadata[0])
    if not isinstance(waiter, StreamWaiter):
        return None
    waiter.part(msg.data)
    return waiter.parts


def stream_timing(timing: Timing) -> Timing:
    """Rule C1: one attempt, as long as the whole stream."""
    return Timing(timing.timeout, timing.timeout, 0)


def _control(mtype: wire.StreamType, rid: bytes, n: int = 0) -> list[bytes]:
    return wire.build(mtype, None, (rid,), credit=n)


def _answered(done: bool, outcome: Outcome | None) -> bool:
    """Whether the stream's final answer came from the broker (not a local timeout, not the
    client closing): then there is nothing to cancel."""
    return done and outcome is not None and not isinstance(outcome, RequestTimeout)


def _end(outcome: Outcome | None, received: int) -> Part | None:
    """What the final outcome means for the reader (Rule C2): a last part, or the end
    (``None``); raises the stream's error."""
    if isinstance(outcome, Response):
        return outcome.data if outcome.data else None
    if isinstance(outcome, RemoteError) and outcome.code == "stream_broken":
        raise StreamBroken(outcome.message, received)
    assert outcome is not None
    raise outcome


class Stream:
    """A stream being read (from :meth:`dcp.Client.stream`): an async context manager and
    an async iterator of parts, each a tuple of ``bytes`` (the part's data frames)."""

    def __init__(
        self,
        client: Client,
        service: bytes,
        data: tuple[bytes, ...],
        metadata: tuple[bytes, ...],
        timing: Timing,
        window: int,
        stall_timeout: float | None,
    ) -> None:
        self._client = client
        self._request = (service, data, (*metadata, wire.stream_option(window)), timing)
        self._window = window
        self._grant = max(1, window // 2)
        self._stall = stall_timeout
        self._waiter = StreamWaiter()
        self._rid: bytes | None = None
        self._read = 0
        self._ended = self._closed = False
        #: Parts read so far.
        self.received = 0
        #: Called once on :meth:`close` with the final outcome, or ``None`` if there was none
        #: (the stream was left early): a traced stream ends its span (docs/tracing.md).
        self.on_close: Callable[[Outcome | None], None] | None = None

    async def __aenter__(self) -> Stream:
        if self._rid is not None:
            raise RuntimeError("a Stream can be entered only once")
        client = self._client
        service, data, metadata, timing = self._request
        rid, frames = client._start(service, data, metadata, timing, self._waiter)
        self._rid = rid
        try:
            await client._send(rid, frames)
        except BaseException:
            self._ended = True
            client._forget([rid])
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Rule C4: stop reading; the worker is told to stop unless the stream ended.
        Idempotent."""
        if self._closed:
            return
        self._closed = self._ended = True
        if self.on_close is not None:
            self.on_close(self._waiter.outcome if self._waiter.done else None)
        client = self._client
        rid = self._rid
        if rid is None:
            return
        if not _answered(self._waiter.done, self._waiter.outcome) and not client._closed:
            assert client._socket is not None
            # A full queue loses the CANCEL: the worker then waits for credit that never
            # comes, until its work timeout (if any) or the broker forgets this client.
            with contextlib.suppress(zmq.ZMQError):
                client._socket.send_nowait(_control(wire.StreamType.CANCEL, rid))
        client._forget([rid])

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Part:
        if self._rid is None:
            raise RuntimeError("use 'async with client.stream(...) as parts:'")
        waiter = self._waiter
        while not waiter.parts and not waiter.done:
            if self._ended:
                raise StopAsyncIteration
            waiter.event = anyio.Event()
            if self._stall is None:
                await waiter.event.wait()
            else:
                with anyio.move_on_after(self._stall):
                    await waiter.event.wait()
                if not waiter.parts and not waiter.done:
                    self.close()
                    raise RequestTimeout(
                        f"stream stalled: no part for {self._stall:g} s "
                        f"after {self.received} part(s)"
                    )
        if waiter.parts:
            part = waiter.parts.popleft()
            self.received += 1
            self._read += 1
            if self._read >= self._grant and not waiter.done and not self._ended:
                self._credit()
            return part
        if self._ended:
            raise StopAsyncIteration
        self._ended = True
        if waiter.outcome is None:
            raise self._client._closed_error()
        last = _end(waiter.outcome, self.received)
        if last is None:
            raise StopAsyncIteration
        self.received += 1
        return last

    def _credit(self) -> None:
        n, self._read = self._read, 0
        sock = self._client._socket
        assert self._rid is not None and sock is not None
        try:
            sock.send_nowait(_control(wire.StreamType.CREDIT, self._rid, n))
        except zmq.ZMQError:  # full: the credit is kept for the next grant
            self._read += n


class SyncStream:
    """A stream being read (from :meth:`dcp.SyncClient.stream`): an iterator of parts and a
    context manager; :meth:`close` (or leaving the ``with`` block) cancels it."""

    def __init__(
        self,
        client: SyncClient,
        service: bytes,
        data: tuple[bytes, ...],
        metadata: tuple[bytes, ...],
        timing: Timing,
        window: int,
        stall_timeout: float | None,
    ) -> None:
        self._client = client
        self._grant = max(1, window // 2)
        self._stall = stall_timeout
        self._read = 0
        self._ended = self._closed = self._final = False
        self._outcome: Outcome | None = None
        #: Parts read so far.
        self.received = 0
        metadata = (*metadata, wire.stream_option(window))
        self._parts: deque[Part] = deque()
        self._rid = rid = client._start(service, data, metadata, timing)
        client._stream_parts[rid] = self._parts

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._closed and not self._client._closed:
            self.close()

    def close(self) -> None:
        """Rule C4: stop reading; the worker is told to stop unless the stream ended.
        Idempotent."""
        if self._closed:
            return
        self._closed = self._ended = True
        client = self._client
        rid = self._rid
        client._stream_parts.pop(rid, None)
        outcome = client._done.pop(rid, None)
        if outcome is None:
            client._tracker.cancel(rid)
        if outcome is None:
            outcome = self._outcome
        if not _answered(outcome is not None, outcome) and not client._closed:
            with contextlib.suppress(zmq.ZMQError):
                client._sock.send_multipart(
                    _control(wire.StreamType.CANCEL, rid), flags=zmq.NOBLOCK
                )

    def __iter__(self) -> Iterator[Part]:
        return self

    def __next__(self) -> Part:
        client = self._client
        rid = self._rid
        parts = self._parts
        done = client._done
        stall = math.inf if self._stall is None else time.monotonic() + self._stall
        try:
            while not parts and rid not in done:
                if self._ended:
                    raise StopIteration
                now = time.monotonic()
                if now >= stall:
                    raise RequestTimeout(
                        f"stream stalled: no part for {self._stall:g} s "
                        f"after {self.received} part(s)"
                    )
                client._pump(None if stall == math.inf else stall - now)
        except BaseException:
            self.close()  # a stall, or the caller interrupted (e.g. KeyboardInterrupt)
            raise
        if parts:
            part = parts.popleft()
            self.received += 1
            self._read += 1
            if self._read >= self._grant and rid not in done:
                n, self._read = self._read, 0
                client._send(_control(wire.StreamType.CREDIT, rid, n), time.monotonic() + 1)
            return part
        self._ended = self._final = True
        client._stream_parts.pop(rid, None)
        self._outcome = done.pop(rid)
        last = _end(self._outcome, self.received)
        if last is None:
            raise StopIteration
        self.received += 1
        return last
