"""How the async client's callers wait for outcomes: the receive task
(:class:`~dcp._client.receive.Receiver`) delivers each request's outcome to the waiter
registered for its id (one per ``request()``, one shared per ``map``, one per ``stream``, which
also takes the stream's parts)."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.lowlevel

import dcp.wire.streams as wire
from dcp._io.clock import running_loop
from dcp._models import Outcome

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Event",
    "FutureEvent",
    "Part",
    "Sink",
    "StreamWaiter",
    "Waiter",
    "deliver_part",
    "loop_event",
]

#: One part of a stream: its data frames.
Part = tuple[bytes, ...]


class Event(Protocol):
    """What a waiter waits on: :class:`anyio.Event`, or the loop's own (:func:`loop_event`)."""

    def set(self) -> object: ...

    def wait(self) -> Awaitable[object]: ...


def loop_event() -> Callable[[], Event]:
    """What makes the events of the waiters in the event loop running in this thread (call
    it from that loop): ``trio.Event`` on trio, a :class:`FutureEvent` on asyncio, else
    :class:`anyio.Event`. Each event is waited on by one task at most.

    ``anyio.Event()`` finds the running backend on every call and wraps that backend's own
    event (about ten Python calls per event made, set and waited on); a waiter waits on one
    per request. Waiting on the backend's own is the same wait: the same checkpoint, the
    same cancellation (anyio cancels trio's natively and asyncio's by cancelling the task).
    """
    loop = running_loop()
    if loop == "trio":
        import trio

        return trio.Event
    if loop == "asyncio":
        import asyncio

        create = asyncio.get_running_loop().create_future
        return lambda: FutureEvent(create())
    return anyio.Event  # pragma: no cover - anyio runs on trio or asyncio


class FutureEvent:
    """asyncio: an event one task waits on, as the future it awaits (``asyncio.Event`` makes
    a future per wait besides itself, and a list of them). Cancelling that task cancels the
    future: a later :meth:`set` does nothing."""

    __slots__ = ("_fut",)

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self._fut = fut

    def set(self) -> None:
        fut = self._fut
        if not fut.done():
            fut.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        return self._fut


class Waiter:
    """Where the receive task (or the call itself, reading the socket: Rule RX5 of
    :mod:`dcp._client.receive`) puts the outcome of one :meth:`~dcp.Client.request`."""

    __slots__ = ("done", "event", "outcome")

    def __init__(self) -> None:
        #: Made by :meth:`wait` only: a call that reads its own reply needs none.
        self.event: Event | None = None
        #: ``None`` until delivered, and also when the client closed.
        self.outcome: Outcome | None = None
        #: True once delivered.
        self.done = False

    def deliver(self, rid: bytes, outcome: Outcome | None) -> None:
        self.outcome = outcome
        self.done = True
        event = self.event
        if event is not None:
            event.set()

    async def wait(self, new_event: Callable[[], Event] = anyio.Event) -> None:
        """Wait until delivered (a checkpoint even if it was), on an event ``new_event``
        makes (:func:`loop_event`)."""
        if self.done:
            await anyio.lowlevel.checkpoint()
            return
        event = self.event = new_event()
        await event.wait()

    def forget(self) -> None:
        """The call ended without its outcome (cancelled); a traced waiter ends its span."""


class Sink:
    """Where the receive task puts the outcomes of one ``map`` call's requests (:attr:`done`
    is the arrivals of the map's :class:`~dcp._core.client.window.Window`)."""

    __slots__ = ("done", "event")

    def __init__(self) -> None:
        self.done: dict[bytes, Outcome | None] = {}
        self.event: Event | None = None

    def deliver(self, rid: bytes, outcome: Outcome | None) -> None:
        self.done[rid] = outcome
        if self.event is not None:
            self.event.set()

    def forget(self) -> None:
        """The ``map`` ended; a traced sink ends the spans of unanswered requests."""

    async def wait(self, new_event: Callable[[], Event] = anyio.Event) -> None:
        """Wait for the next delivery (call only when the one you need is not in ``done``),
        on an event ``new_event`` makes (:func:`loop_event`)."""
        event = self.event = new_event()
        await event.wait()


class StreamWaiter(Waiter):
    """Where the receive task puts a stream's parts and its final outcome
    (:class:`~dcp.Stream`, which sets :attr:`event` before each wait)."""

    __slots__ = ("parts",)

    def __init__(self, parts: deque[Part] | None = None) -> None:
        super().__init__()
        #: The parts received and not yet read (the stream's own queue, if given).
        self.parts: deque[Part] = deque() if parts is None else parts

    def part(self, data: Part) -> None:
        self.parts.append(data)
        event = self.event
        if event is not None:
            event.set()


def deliver_part(
    frames: list[bytes], waiters: MutableMapping[bytes, Waiter | Sink]
) -> deque[Part] | None:
    """Streams Rule CS2: a PARTIAL from the broker for a stream of ``waiters``; returns the
    queue it went to (``None``: dropped, a part of a stream no longer read, or not a part)."""
    msg = wire.parse_part(frames)
    if msg is None:
        return None
    waiter = waiters.get(msg.metadata[0])
    if not isinstance(waiter, StreamWaiter):
        return None
    waiter.part(msg.data)
    return waiter.parts
