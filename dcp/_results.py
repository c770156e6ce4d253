"""What a handler's answer becomes on the wire: a reply, a forward to another service (the
DAG), or an error reply."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ._messages import Reply, Request, error_reply_data

__all__ = ["Forward", "error_reply", "result_message"]

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


def error_reply(request: Request, code: str, message: str) -> Reply:
    """The dcp error reply to ``request``: its client and metadata, error data parts."""
    return Reply(request.client, request.metadata, error_reply_data(code, message))


def result_message(request: Request, result: object) -> Reply | Request:
    """Turn a handler's return value into the message to send.

    :param result: ``bytes`` (one data part), a sequence of ``bytes``, or a :class:`Forward`
    :raises TypeError: for anything else (the caller answers ``bad_handler_result``)
    """
    if isinstance(result, Forward):
        return Request(result.service, request.client, request.metadata, result.data)
    if isinstance(result, _BYTES_LIKE):
        return Reply(request.client, request.metadata, (bytes(result),))
    if isinstance(result, Sequence) and not isinstance(result, str):
        parts = tuple(_to_bytes(part, "a reply part") for part in result)
        return Reply(request.client, request.metadata, parts)
    raise TypeError(
        f"handler returned {type(result).__name__}; expected bytes, a sequence of bytes "
        "or dcp.Forward"
    )
