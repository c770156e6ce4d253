"""DCP v1 messages as small frozen value classes.

Every message a DCP peer can send is one of six classes under :class:`Message`. They hold
exactly what the wire holds (minus the header) and validate on construction what DCP forbids,
so a message object is always something :func:`dcp.serialize` can put on the wire.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import ClassVar

import attrs

from dcp._errors import LocalProtocolError

__all__ = [
    "ERROR_MARKER",
    "NO_WAIT_OPTION",
    "REQUEST_ID_PREFIX",
    "Message",
    "MessageType",
    "Ping",
    "Pong",
    "Reconnect",
    "Register",
    "Reply",
    "Request",
    "error_reply_data",
    "expires_in_option",
    "parse_error_reply",
    "parse_work_timeout",
    "request_expires_in",
    "request_no_wait",
    "request_work_timeout",
    "without_options",
    "work_timeout_option",
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
            raise LocalProtocolError(f"{name} parts must be non-empty (an empty part ends them)")


def _check_client(client: bytes | None) -> None:
    if client is not None and not client:
        raise LocalProtocolError("a client address must be non-empty (or None)")


def _tuple_of_bytes(value: Iterable[bytes]) -> tuple[bytes, ...]:
    return tuple(value)


@attrs.frozen
class Message:
    """Base class of the six DCP v1 messages."""

    #: The type byte this message has on the wire.
    type: ClassVar[MessageType]


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


#: Metadata parts that start with this are dcp request options, read by dcp brokers (byte 0xFF
#: again: no UTF-8 text starts with it). A client puts them right after its request id.
OPTION_PREFIX = b"\xffDCP:"
_WORK_TIMEOUT = OPTION_PREFIX + b"work-timeout="


#: A dcp client's request id (the first metadata part) starts with this, so a worker can tell
#: it, like the options, from the caller's own metadata.
REQUEST_ID_PREFIX = OPTION_PREFIX + b"id="
_EXPIRES_IN = OPTION_PREFIX + b"expires-in="
#: Request option: answer at once with a ``no_workers`` error reply if no worker serves the
#: service when the request arrives, instead of queueing it (NATS's "no responders").
NO_WAIT_OPTION = OPTION_PREFIX + b"no-wait"


def without_options(metadata: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """``metadata`` without its dcp options (the request id, not an option, is kept)."""
    return tuple(
        part
        for part in metadata
        if part[:1] != b"\xff"
        or not part.startswith(OPTION_PREFIX)
        or part.startswith(REQUEST_ID_PREFIX)
    )


def _millis_option(prefix: bytes, seconds: float, what: str) -> bytes:
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{what} must be a positive finite number of seconds")
    return prefix + str(max(1, round(seconds * 1000))).encode()


def _parse_millis(part: bytes, prefix: bytes) -> float | None:
    if part.startswith(prefix):
        digits = part[len(prefix) :]
        if 0 < len(digits) <= 12 and digits.isdigit():
            millis = int(digits)
            if millis:
                return millis / 1000
    return None


def expires_in_option(seconds: float) -> bytes:
    """The metadata part telling the broker and the worker that the caller gives up on this
    request ``seconds`` after sending it (whole milliseconds, at least 1): the broker drops it
    from its queue once that time has passed since it arrived, a worker skips it. Relative,
    so the peers' clocks need not agree."""
    return _millis_option(_EXPIRES_IN, seconds, "expires_in")


def request_expires_in(metadata: tuple[bytes, ...]) -> float | None:
    """The expires-in option a request's metadata carries (the first valid one), if any."""
    for part in metadata:
        if part[:1] == b"\xff":
            seconds = _parse_millis(part, _EXPIRES_IN)
            if seconds is not None:
                return seconds
    return None


def request_no_wait(metadata: tuple[bytes, ...]) -> bool:
    """Whether a request's metadata carries :data:`NO_WAIT_OPTION`."""
    return any(part == NO_WAIT_OPTION for part in metadata if part[:1] == b"\xff")


def work_timeout_option(seconds: float) -> bytes:
    """The metadata part asking the broker to take a request back from a worker that has
    not answered it within ``seconds`` (sent as whole milliseconds, at least 1)."""
    return _millis_option(_WORK_TIMEOUT, seconds, "work_timeout")


def parse_work_timeout(part: bytes) -> float | None:
    """The work timeout in seconds if ``part`` is a valid work-timeout option, else ``None``."""
    return _parse_millis(part, _WORK_TIMEOUT)


def request_work_timeout(metadata: tuple[bytes, ...]) -> float | None:
    """The work timeout a request's metadata carries (the first valid option), if any."""
    for part in metadata:
        if part[:1] == b"\xff":  # cheap test first: most parts are not options
            seconds = parse_work_timeout(part)
            if seconds is not None:
                return seconds
    return None
