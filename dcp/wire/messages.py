"""DCP v1 messages as small frozen value classes.

Every message a DCP peer can send is one of six classes under :class:`Message`. They hold
exactly what the wire holds (minus the header) and validate on construction what DCP forbids,
so a message object is always something :func:`dcp.wire.serialize` can put on the wire.
"""

from __future__ import annotations

import enum
import typing

import attrs

from dcp import _errors

__all__ = [
    "ERROR_MARKER",
    "HELD_MARKER",
    "Message",
    "MessageType",
    "Ping",
    "Pong",
    "Reconnect",
    "Register",
    "Reply",
    "Request",
    "error_reply_data",
    "parse_error_reply",
]


class MessageType(enum.IntEnum):
    """The DCP v1 message types (the header's type frame)."""

    #: A worker registers a service; the broker echoes it as confirmation.
    REGISTER = 0x01
    #: Heartbeat from a worker; also asks for more work. Always answered with :attr:`PONG`.
    PING = 0x02
    #: Heartbeat answer from the broker (and, as a dcp extension, a worker's keep-alive).
    PONG = 0x03
    #: A request for a service, from a client or a worker.
    REQUEST = 0x04
    #: A reply to a request, routed by its client address.
    REPLY = 0x05
    #: The broker does not know the worker: it must register again.
    RECONNECT = 0x06


def _check_parts(name: str, parts: tuple[bytes, ...]) -> None:
    for part in parts:
        if not part:
            raise _errors.LocalProtocolError(
                f"{name} parts must be non-empty (an empty part ends them)"
            )


def _check_client(client: bytes | None) -> None:
    if client is not None and not client:
        raise _errors.LocalProtocolError("a client address must be non-empty (or None)")


def _tuple_of_bytes(value: typing.Iterable[bytes]) -> tuple[bytes, ...]:
    return tuple(value)


@attrs.frozen
class Message:
    """Base class of the six DCP v1 messages."""

    #: The type byte this message has on the wire.
    type: typing.ClassVar[MessageType]


@attrs.frozen
class Register(Message):
    """Registration of a worker for ``service`` (also the broker's confirmation)."""

    type = MessageType.REGISTER
    service: bytes


@attrs.frozen
class Ping(Message):
    """Worker heartbeat; tells the broker the worker can take a(nother) request."""

    type = MessageType.PING


@attrs.frozen
class Pong(Message):
    """Broker's answer to a ping; from a worker, a keep-alive that asks for no work."""

    type = MessageType.PONG


@attrs.frozen
class Reconnect(Message):
    """Tells a worker the broker does not know it; the worker must register again."""

    type = MessageType.RECONNECT


@attrs.frozen
class Request(Message):
    """A request for ``service``.

    :ivar client: the address the final reply goes to; ``None`` lets the broker insert the
        sender's address (what a plain client does)
    :ivar metadata: non-empty parts the broker and workers pass through untouched
    :ivar data: the payload, any number of parts; empty parts are data too
    """

    type = MessageType.REQUEST
    service: bytes
    client: bytes | None = attrs.field(default=None)
    metadata: tuple[bytes, ...] = attrs.field(default=(), converter=_tuple_of_bytes)
    data: tuple[bytes, ...] = attrs.field(default=(), converter=_tuple_of_bytes)

    def __attrs_post_init__(self) -> None:
        _check_client(self.client)
        _check_parts("metadata", self.metadata)


@attrs.frozen
class Reply(Message):
    """A reply, routed by the broker to ``client``; ``metadata`` is the request's, unchanged."""

    type = MessageType.REPLY
    client: bytes | None = attrs.field(default=None)
    metadata: tuple[bytes, ...] = attrs.field(default=(), converter=_tuple_of_bytes)
    data: tuple[bytes, ...] = attrs.field(default=(), converter=_tuple_of_bytes)

    def __attrs_post_init__(self) -> None:
        _check_client(self.client)
        _check_parts("metadata", self.metadata)


#: First data part of a dcp error reply. Starts with 0xFF so no UTF-8 text reply can collide
#: with it; a plain DCP v1 peer sees an ordinary reply with three data parts.
ERROR_MARKER = b"\xffDCP-ERROR"
#: The one data part of a dcp HELD notice (docs/scaling.md): a worker serving several
#: brokers lost the one that brought a request it still holds, and tells the client through
#: another broker that the request is running (not lost; its answer may come through any).
HELD_MARKER = b"\xffDCP-HELD"


def error_reply_data(code: str, message: str) -> tuple[bytes, bytes, bytes]:
    """The data parts of a dcp error reply: marker, code, UTF-8 message."""
    return (ERROR_MARKER, code.encode("utf-8", "replace"), message.encode("utf-8", "replace"))


def parse_error_reply(data: tuple[bytes, ...] | list[bytes]) -> tuple[str, str] | None:
    """``(code, message)`` if ``data`` is a dcp error reply's data, else ``None``."""
    if len(data) == 3 and data[0] == ERROR_MARKER:
        return (
            bytes(data[1]).decode("utf-8", "replace"),
            bytes(data[2]).decode("utf-8", "replace"),
        )
    return None
