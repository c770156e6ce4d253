"""Handlers: what they see of a request (:class:`HandlerRequest`: the caller's own metadata,
dcp's parts apart), how they are called (``async def`` on the event loop, plain ``def`` in a
thread), and what their answer becomes on the wire: a reply, a forward to another service
(the DAG), or an error reply."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import anyio

from dcp._models import Forward
from dcp._util import BYTES_LIKE
from dcp.wire.messages import Reply, Request, error_reply_data

__all__ = [
    "blocked_loop_hint",
    "error_reply",
    "handler_name",
    "is_async_handler",
    "parts_of",
    "result_message",
    "wait_blocked",
]


def is_async_handler(handler: object) -> bool:
    """Whether calling ``handler`` gives a coroutine (``async def``; also through
    :func:`functools.partial`, a bound method, or an object whose ``__call__`` is
    ``async def``): then it runs on the event loop, else in a worker thread."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if inspect.iscoroutinefunction(handler):
        return True
    return callable(handler) and inspect.iscoroutinefunction(type(handler).__call__)


async def wait_blocked(interval: float) -> float:
    """Return once the event loop was blocked for longer than ``interval`` seconds (a sleep
    of ``interval / 4`` overshot by that much): how long it was. Cheap: four wake-ups per
    interval."""
    period = interval / 4
    while True:
        start = anyio.current_time()
        await anyio.sleep(period)
        blocked = anyio.current_time() - start - period
        if blocked > interval:
            return blocked


def blocked_loop_hint(is_async: bool) -> str:
    """What to do about a blocked event loop, for a worker whose handler ``is_async`` or not."""
    if is_async:
        return (
            "an async handler must not block: make it a plain def (it then runs in a thread) "
            "or move blocking work to anyio.to_thread.run_sync"
        )
    return "the handler runs in threads: something else blocks the event loop"


def handler_name(handler: object) -> str:
    """A handler's name for log messages (``module.qualname``)."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if not hasattr(handler, "__qualname__"):
        handler = type(handler)
    module = getattr(handler, "__module__", None)
    name = getattr(handler, "__qualname__", repr(handler))
    return f"{module}.{name}" if module else name


def error_reply(request: Request, code: str, message: str) -> Reply:
    """The dcp error reply to ``request``: its client and metadata, error data parts."""
    return Reply(request.client, request.metadata, error_reply_data(code, message))


def _part(part: object) -> bytes:
    if isinstance(part, str):
        return part.encode()
    if isinstance(part, BYTES_LIKE):
        return bytes(part)
    raise TypeError(f"a part of type {type(part).__name__}; parts are bytes or str")


def parts_of(result: Sequence[object]) -> tuple[bytes, ...]:
    """A sequence of data parts as ``bytes`` (``str`` in UTF-8).

    :raises TypeError: a part that is neither bytes-like nor ``str``
    """
    if all(part.__class__ is bytes for part in result):
        return tuple(result)  # type: ignore[arg-type]
    return tuple(_part(part) for part in result)


def _expected(result: object) -> str:
    hint = ""
    if isinstance(result, dict):
        hint = " (for JSON, return dcp.json_reply(obj))"
    return (
        f"returned {type(result).__name__}; expected bytes, str, a sequence of them or "
        f"dcp.Forward{hint}"
    )


def result_message(request: Request, result: object) -> Reply | Request:
    """Turn a handler's return value into the message to send.

    :param result: ``bytes`` or ``str`` (one data part, ``str`` in UTF-8), a sequence of
        them, or a :class:`Forward`
    :raises TypeError: for anything else, saying what it returned (the caller answers
        ``bad_handler_result``)
    """
    if result.__class__ is tuple or result.__class__ is list:  # the common case, first
        try:
            return Reply(request.client, request.metadata, parts_of(result))
        except TypeError as exc:
            raise TypeError(f"returned a {type(result).__name__} with {exc}") from None
    if result.__class__ is bytes:
        return Reply(request.client, request.metadata, (result,))
    if isinstance(result, str):
        return Reply(request.client, request.metadata, (result.encode(),))
    if isinstance(result, Forward):
        service = result.service.encode("utf-8", "surrogateescape")
        return Request(service, request.client, request.metadata, result.data)
    if isinstance(result, BYTES_LIKE):
        return Reply(request.client, request.metadata, (bytes(result),))
    if isinstance(result, Sequence):
        try:
            return Reply(request.client, request.metadata, parts_of(result))
        except TypeError as exc:
            raise TypeError(f"returned a {type(result).__name__} with {exc}") from None
    raise TypeError(_expected(result))
