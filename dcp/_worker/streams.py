"""The worker's side of dcp streams: a handler that is an async generator function.

Rules (the broker's are in :mod:`dcp._core.broker.streams`, the frames in :mod:`dcp.wire.streams`):

Rule WS1 - Which requests stream. A request whose metadata carries the stream option
  (``\\xffDCP:stream=<window>``) is answered part by part: each value the generator yields
  is one PARTIAL (``bytes`` or ``str``, sent as UTF-8, or a sequence of them for a part of
  several frames); when
  the generator returns, an empty final reply ends the stream. A request without the option
  (a plain ``request()``, a plain DCP v1 client) gets the *whole* answer: every part's
  frames, in order, in one final reply.
Rule WS2 - Credit. The stream's credit starts at the window and each CREDIT from the broker
  adds its count; each part sent takes 1. With no credit left, the part waits (the
  generator stays suspended at its ``yield``): a slow reader pauses the writer, and the
  worker holds at most the one part in hand.
Rule WS3 - Cancel. A CANCEL from the broker (the reader left), or the broker forgetting this
  worker (RECONNECT, or the broker lost), cancels the handler's stream: the generator is
  closed (its ``finally`` runs, in a cancelled scope) and an empty final reply releases the
  request at the broker. A CREDIT or CANCEL for a stream the worker does not run is ignored.
Rule WS4 - Failures. A generator that raises ends the stream with a ``handler_error`` error
  reply (after the parts already sent); one that yields something that is not ``bytes``,
  ``str`` or a sequence of them, with ``bad_handler_result``, logged with the request's
  service.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, cast

import anyio

import dcp.wire.streams as wire
from dcp._models import HandlerRequest
from dcp._util import BYTES_LIKE
from dcp._worker.results import error_reply, parts_of
from dcp.wire.dcp1 import TYPE_FRAMES
from dcp.wire.messages import MessageType, Reply, Request

__all__ = ["WorkerStreams", "is_stream_handler"]

logger = logging.getLogger("dcp.worker")

_RECONNECT = frozenset(TYPE_FRAMES[w][MessageType.RECONNECT] for w in (1, 4))
Key = tuple[bytes | None, tuple[bytes, ...]]


def is_stream_handler(handler: object) -> bool:
    """Whether ``handler`` is an async generator function (also through
    :func:`functools.partial`, or an object whose ``__call__`` is one)."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if inspect.isasyncgenfunction(handler):
        return True
    return callable(handler) and inspect.isasyncgenfunction(type(handler).__call__)


class _Open:
    """One stream the worker runs."""

    __slots__ = ("credit", "event", "scope")

    def __init__(self, window: int) -> None:
        self.credit = window
        self.event: anyio.Event | None = None
        self.scope = anyio.CancelScope()

    def add(self, n: int) -> None:
        self.credit += n
        if self.event is not None:
            self.event.set()


class WorkerStreams:
    """The streams one worker runs (the module's rules)."""

    def __init__(self) -> None:
        self._open: dict[Key, _Open] = {}
        #: Streams run, parts sent, streams cancelled, waits for credit.
        self.streams = self.parts = self.cancelled = self.credit_waits = 0

    def receive(self, frames: Sequence[bytes]) -> bool:
        """Handle ``frames`` from the broker if they are a stream message (or a RECONNECT,
        which also cancels every stream, Rule WS3, and is left to the caller too). Returns
        whether the caller is done with them."""
        if len(frames) > 2 and frames[2] in _RECONNECT:
            self.cancel_all()
            return False
        if not wire.is_stream(frames):
            return False
        try:
            msg = wire.parse_stream(frames)
        except Exception as exc:  # a RemoteProtocolError, named by its reason
            logger.warning("malformed stream message from the broker: %s", exc)
            return True
        stream = self._open.get((msg.client, msg.metadata))
        if stream is None:
            return True
        if msg.type is wire.StreamType.CREDIT:
            stream.add(msg.credit)
        elif msg.type is wire.StreamType.CANCEL:
            self.cancelled += 1
            stream.scope.cancel()
        return True

    def cancel_all(self) -> None:
        """Rule WS3: the broker forgot us; no credit will come."""
        for stream in self._open.values():
            stream.scope.cancel()

    async def run(
        self,
        handler: Callable[[HandlerRequest], AsyncIterator[Any]],
        request: Request,
        view: HandlerRequest,
        send: Callable[[list[bytes]], Awaitable[None]],
        width: Callable[[], int],
    ) -> Reply:
        """Run a stream handler for ``request`` (Rules WS1-WS4); the final reply to send.

        :raises Exception: what the generator raised (the caller answers ``handler_error``)
        """
        window = wire.stream_window(request.metadata)
        agen = cast(AsyncGenerator[Any, None], handler(view))
        if window is None:
            parts: list[bytes] = []
            async with aclosing(agen):
                async for item in agen:
                    part = _part(item)
                    if part is None:
                        return _bad(request, view, item)
                    parts += part
            return Reply(request.client, request.metadata, tuple(parts))
        key: Key = (request.client, request.metadata)
        stream = self._open[key] = _Open(window)
        self.streams += 1
        try:
            with stream.scope:
                async with aclosing(agen):
                    async for item in agen:
                        part = _part(item)
                        if part is None:
                            return _bad(request, view, item)
                        while stream.credit <= 0:
                            self.credit_waits += 1
                            stream.event = anyio.Event()
                            await stream.event.wait()
                        stream.credit -= 1
                        self.parts += 1
                        await send(
                            wire.build(
                                wire.StreamType.PARTIAL,
                                request.client,
                                request.metadata,
                                part,
                                width=width(),
                            )
                        )
        finally:
            if self._open.get(key) is stream:
                del self._open[key]
        return Reply(request.client, request.metadata, ())


def _part(item: object) -> Sequence[bytes] | None:
    if item.__class__ is bytes:
        return [item]
    if isinstance(item, str):
        return [item.encode()]
    if isinstance(item, BYTES_LIKE):
        return [bytes(item)]
    if isinstance(item, Sequence):
        try:
            return parts_of(item)
        except TypeError:
            return None
    return None


def _bad(request: Request, view: HandlerRequest, item: object) -> Reply:
    message = (
        f"the stream handler of service {view.service!r} yielded {type(item).__name__}; "
        "expected bytes, str or a sequence of them"
    )
    logger.error("%s", message)
    return error_reply(request, "bad_handler_result", message)
