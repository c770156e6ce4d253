"""Handlers: what they see of a request (:class:`HandlerRequest`: the caller's own metadata,
dcp's parts apart), how they are called (``async def`` on the event loop, plain ``def`` in a
thread), and what their answer becomes on the wire: a reply, a forward to another service
(the DAG), or an error reply."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Sequence
from typing import ClassVar

import anyio
import attrs

from ._messages import OPTION_PREFIX, Reply, Request, error_reply_data
from ._response import OnePart

__all__ = [
    "Forward",
    "HandlerRequest",
    "blocked_loop_hint",
    "error_reply",
    "handler_name",
    "handler_view",
    "is_async_handler",
    "result_message",
    "wait_blocked",
]

_BYTES_LIKE = (bytes, bytearray, memoryview)


def _to_bytes(value: object, what: str) -> bytes:
    if isinstance(value, _BYTES_LIKE):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, not {type(value).__name__}")


@attrs.frozen(init=False)
class Forward:
    """A handler's answer that passes the request on to another service (the DAG).

    The worker sends a REQUEST for ``service`` carrying the original client address and the
    original metadata, unchanged, so the final reply goes straight to the client and still
    names its request (dcp clients match replies by the first metadata part), and so the
    broker knows which request the forward finishes. There is deliberately no way to change
    the metadata on the way.

    :ivar service: the service that handles the rest of the request
    :ivar data: the data parts of the new request
    """

    service: bytes
    data: tuple[bytes, ...]

    def __init__(self, service: str | bytes, *data: bytes) -> None:
        svc = service.encode() if isinstance(service, str) else _to_bytes(service, "service")
        parts = tuple(_to_bytes(part, "a data part") for part in data)
        self.__attrs_init__(svc, parts)


def _tuple_of_bytes(value: Iterable[bytes]) -> tuple[bytes, ...]:
    return tuple(value)


@attrs.frozen
class HandlerRequest(Request, OnePart):
    """A request as a worker's handler sees it: :attr:`metadata` holds the caller's own parts
    only; dcp's parts (every part starting with ``\\xffDCP:``: a dcp client's request id,
    ``\\xffDCP:id=...``, and request options such as ``work-timeout`` and ``expires-in``)
    are in :attr:`dcp_metadata`, in the order they came. :attr:`text`, :attr:`bytes` and
    :meth:`json` read its one data part, as on a :class:`~dcp.Response`. The worker answers
    (and forwards) with the request's metadata exactly as it arrived, whatever the handler
    sees.

    :ivar dcp_metadata: dcp's metadata parts, removed from :attr:`metadata`
    """

    _what: ClassVar[str] = "request"
    dcp_metadata: tuple[bytes, ...] = attrs.field(default=(), converter=_tuple_of_bytes)


def handler_view(request: Request) -> HandlerRequest:
    """What the handler of ``request`` sees (:class:`HandlerRequest`)."""
    own: list[bytes] = []
    dcp: list[bytes] = []
    for part in request.metadata:
        (dcp if part[:1] == b"\xff" and part.startswith(OPTION_PREFIX) else own).append(part)
    return HandlerRequest(request.service, request.client, own, request.data, dcp)


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


def _parts(result: Sequence[object]) -> tuple[bytes, ...]:
    if all(part.__class__ is bytes for part in result):
        return tuple(result)  # type: ignore[arg-type]
    return tuple(_to_bytes(part, "a reply part") for part in result)


def result_message(request: Request, result: object) -> Reply | Request:
    """Turn a handler's return value into the message to send.

    :param result: ``bytes`` (one data part), a sequence of ``bytes``, or a :class:`Forward`
    :raises TypeError: for anything else (the caller answers ``bad_handler_result``)
    """
    if result.__class__ is tuple or result.__class__ is list:  # the common case, first
        return Reply(request.client, request.metadata, _parts(result))
    if isinstance(result, Forward):
        return Request(result.service, request.client, request.metadata, result.data)
    if isinstance(result, _BYTES_LIKE):
        return Reply(request.client, request.metadata, (bytes(result),))
    if isinstance(result, Sequence) and not isinstance(result, str):
        return Reply(request.client, request.metadata, _parts(result))
    raise TypeError(
        f"handler returned {type(result).__name__}; expected bytes, a sequence of bytes "
        "or dcp.Forward"
    )
