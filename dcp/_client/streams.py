"""The client's side of dcp streams: ``Client.stream()`` and ``SyncClient.stream()``.

Rules (the broker's are in :mod:`dcp._core.broker.streams`, the worker's in
:mod:`dcp._worker.streams`, the frames in :mod:`dcp.wire.streams`):

Rule CS1 - Request. A stream is one request carrying the stream option with the reader's
  window (its first credit), sent once: it is never resent (``retries=0``), since a resend
  could start a second stream. ``timeout`` bounds the whole stream (the tracker's deadline,
  as for any request); ``stall_timeout``, if given, bounds the wait for each next part (or
  the end) and raises :exc:`~dcp.RequestTimeout`.
Rule CS2 - Parts. Each PARTIAL for the stream's request id is one part (its data frames, a
  tuple), kept in order until read; credit keeps at most ``window`` of them unread. The
  final reply ends the stream: with no data (a dcp stream handler's end) it yields nothing
  more; with data (a worker that does not stream, e.g. a plain DCP v1 or Majordomo one) its
  data is the last part. A dcp error reply raises :exc:`~dcp.RemoteError` after the parts
  before it; ``stream_broken`` raises :exc:`~dcp.StreamBroken` with the parts received.
Rule CS3 - Credit. Once half the window (at least 1) has been read since the last grant, the
  reader grants that many parts more (CREDIT).
Rule CS4 - Leaving early. Leaving the stream before its end (``break``, an exception,
  cancellation, ``close()``) sends CANCEL and forgets the request: parts and the final reply
  that still arrive are dropped.

:class:`StreamReader` holds what both flavours keep and decide alike (the parts, the credit,
the end); :class:`Stream` and :class:`SyncStream` add their way of waiting and sending.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

import anyio

import dcp.wire.streams as wire
from dcp._client.receive import Receiver
from dcp._client.sync_receive import SyncReceiver
from dcp._client.waiters import Part, StreamWaiter
from dcp._core.client.calls import Timing
from dcp._errors import RemoteError, RequestTimeout, StreamBroken
from dcp._io.errors import socket_errors
from dcp._models import Outcome, Response

__all__ = ["DEFAULT_WINDOW", "Stream", "StreamReader", "SyncStream", "stream_timing"]

#: The default window (credit) of a stream, in parts.
DEFAULT_WINDOW = 32


def stream_timing(timing: Timing) -> Timing:
    """Rule CS1: one attempt, as long as the whole stream."""
    return Timing(timing.timeout, timing.timeout, 0)


def _control(mtype: wire.StreamType, rid: bytes, n: int = 0) -> list[bytes]:
    return wire.build(mtype, None, (rid,), credit=n)


class _Link(Protocol):
    """What a stream needs of either client's receiver besides its flavour's own calls."""

    closed: bool

    def send_nowait(self, frames: list[bytes]) -> None: ...


_L = TypeVar("_L", bound=_Link)


class StreamReader(Generic[_L]):
    """What a stream of either client keeps and decides alike (Rules CS2-CS4): the parts
    received and not yet read, the credit owed, the end, and leaving early. A flavour adds
    how it starts and forgets the request (:meth:`_open`, :meth:`_forget`), waits and sends.

    :param receiver: the client's receiver
    :param window: the stream's window, in parts (its first credit)
    :param stall_timeout: seconds to wait for each next part (``None``: no limit)
    """

    def __init__(
        self,
        receiver: _L,
        service: bytes,
        data: tuple[bytes, ...],
        metadata: tuple[bytes, ...],
        timing: Timing,
        window: int,
        stall_timeout: float | None,
    ) -> None:
        self._receiver = receiver
        self._grant = max(1, window // 2)
        self._stall = stall_timeout
        self._read = 0
        self._ended = self._closed = False
        #: Where the client puts the stream's parts as they arrive (Rule CS2).
        self._parts: deque[Part] = deque()
        #: Parts read so far.
        self.received = 0
        self._open(service, data, (*metadata, wire.stream_option(window)), timing)

    def _open(
        self, service: bytes, data: tuple[bytes, ...], metadata: tuple[bytes, ...], timing: Timing
    ) -> None:
        """Start the stream's request (the blocking flavour), or keep it for later."""
        raise NotImplementedError

    def _forget(self) -> bytes | None:
        """Forget the request: its id if the worker must be told to stop (Rule CS4)."""
        raise NotImplementedError

    def close(self) -> None:
        """Rule CS4: stop reading; the worker is told to stop unless the stream ended.
        Idempotent."""
        if self._closed:
            return
        self._closed = self._ended = True
        rid = self._forget()
        if rid is not None and not self._receiver.closed:
            # A full queue loses the CANCEL: the worker then waits for credit that never
            # comes, until its work timeout (if any) or the broker forgets this client.
            with socket_errors():
                self._receiver.send_nowait(_control(wire.StreamType.CANCEL, rid))

    def _next_part(self, done: bool) -> tuple[Part, int]:
        """Read the oldest part received; with it, how many parts to grant now (Rule CS3:
        0 for none, or once the stream's end arrived or it was left)."""
        part = self._parts.popleft()
        self.received += 1
        self._read += 1
        if self._read < self._grant or done or self._ended:
            return part, 0
        n, self._read = self._read, 0
        return part, n

    def _last(self, outcome: Outcome) -> Part | None:
        """Rule CS2: the stream's final outcome read; its last part, or ``None`` for the end.

        :raises StreamBroken: the worker went away mid-stream
        :raises RemoteError: the stream ended with an error reply
        :raises RequestTimeout: the stream's ``timeout`` passed
        """
        self._ended = True
        if isinstance(outcome, Response):
            if not outcome.data:
                return None
            self.received += 1
            return outcome.data
        if isinstance(outcome, RemoteError) and outcome.code == "stream_broken":
            raise StreamBroken(outcome.message, self.received)
        raise outcome

    def _stalled(self) -> RequestTimeout:
        """Rule CS1: no part within ``stall_timeout``."""
        return RequestTimeout(
            f"stream stalled: no part for {self._stall:g} s after {self.received} part(s)"
        )


def _answered(done: bool, outcome: Outcome | None) -> bool:
    """Whether the stream's final answer came from the broker (not a local timeout, not the
    client closing): then there is nothing to cancel (Rule CS4)."""
    return done and outcome is not None and not isinstance(outcome, RequestTimeout)


class Stream(StreamReader[Receiver]):
    """A stream being read (from :meth:`dcp.Client.stream`): an async context manager and
    an async iterator of parts, each a tuple of ``bytes`` (the part's data frames)."""

    #: Called once on :meth:`close` with the final outcome, or ``None`` if there was none
    #: (the stream was left early): a traced stream ends its span (docs/tracing.md).
    on_close: Callable[[Outcome | None], None] | None = None

    def _open(
        self, service: bytes, data: tuple[bytes, ...], metadata: tuple[bytes, ...], timing: Timing
    ) -> None:
        self._waiter = StreamWaiter(self._parts)
        self._request = (service, data, metadata, timing)
        self._rid: bytes | None = None  # sent on entry

    async def __aenter__(self) -> Stream:
        if self._rid is not None:
            raise RuntimeError("a Stream can be entered only once")
        receiver = self._receiver
        service, data, metadata, timing = self._request
        rid, frames = receiver.start(service, data, metadata, timing, self._waiter)
        self._rid = rid
        try:
            await receiver.send(rid, frames)
        except BaseException:
            self._ended = True
            receiver.forget([rid])
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def _forget(self) -> bytes | None:
        waiter = self._waiter
        if self.on_close is not None:
            self.on_close(waiter.outcome if waiter.done else None)
        rid = self._rid
        if rid is None:
            return None
        self._receiver.forget([rid])
        return None if _answered(waiter.done, waiter.outcome) else rid

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
                    raise self._stalled()
        if waiter.parts:
            part, grant = self._next_part(waiter.done)
            if grant:
                self._credit(grant)
            return part
        if self._ended:
            raise StopAsyncIteration
        if waiter.outcome is None:
            self._ended = True
            raise self._receiver.closed_error()
        last = self._last(waiter.outcome)
        if last is None:
            raise StopAsyncIteration
        return last

    def _credit(self, n: int) -> None:
        assert self._rid is not None
        with socket_errors(self._keep_credit(n)):  # full: kept for the next grant
            self._receiver.send_nowait(_control(wire.StreamType.CREDIT, self._rid, n))

    def _keep_credit(self, n: int) -> Callable[[BaseException], None]:
        def keep(exc: BaseException) -> None:
            self._read += n

        return keep


class SyncStream(StreamReader[SyncReceiver]):
    """A stream being read (from :meth:`dcp.SyncClient.stream`): an iterator of parts and a
    context manager; :meth:`close` (or leaving the ``with`` block) cancels it."""

    def _open(
        self, service: bytes, data: tuple[bytes, ...], metadata: tuple[bytes, ...], timing: Timing
    ) -> None:
        self._outcome: Outcome | None = None
        self._rid = rid = self._receiver.start(service, data, metadata, timing)
        self._receiver.stream_parts[rid] = self._parts

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._closed and not self._receiver.closed:
            self.close()

    def _forget(self) -> bytes | None:
        receiver = self._receiver
        rid = self._rid
        receiver.stream_parts.pop(rid, None)
        outcome = receiver.forget(rid)
        if outcome is None:
            outcome = self._outcome
        return None if _answered(outcome is not None, outcome) else rid

    def __iter__(self) -> Iterator[Part]:
        return self

    def __next__(self) -> Part:
        receiver = self._receiver
        rid = self._rid
        parts = self._parts
        done = receiver.done
        stall = math.inf if self._stall is None else time.monotonic() + self._stall
        try:
            while not parts and rid not in done:
                if self._ended:
                    raise StopIteration
                now = time.monotonic()
                if now >= stall:
                    raise self._stalled()
                receiver.pump(None if stall == math.inf else stall - now)
        except BaseException:
            self.close()  # a stall, or the caller interrupted (e.g. KeyboardInterrupt)
            raise
        if parts:
            part, grant = self._next_part(rid in done)
            if grant:
                receiver.send(_control(wire.StreamType.CREDIT, rid, grant), time.monotonic() + 1)
            return part
        receiver.stream_parts.pop(rid, None)
        self._outcome = done.pop(rid)
        last = self._last(self._outcome)
        if last is None:
            raise StopIteration
        return last
