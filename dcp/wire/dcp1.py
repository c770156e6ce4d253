"""Parse and build DCP v1 frames. Pure: no sockets, no clocks.

Frames here are the *DEALER-side* view: a message starts with the empty envelope delimiter.
A ROUTER prepends the peer's routing id; the broker strips it before calling :func:`parse`
and prepends it to what :func:`serialize` returns.

A frame may also be any buffer with ``len()`` (the broker keeps large frames as zero-copy
``zmq.Frame`` objects); :func:`parse` turns service names, addresses and metadata into
``bytes`` and passes data parts through as they are.

Type-frame width: the spec says the type is one byte. The DagBox C++ reference writes it as a
4-byte little-endian ``int``. :func:`parse` accepts both and reports which it saw, so a
peer can be answered in the width it uses; :func:`serialize` writes either.
"""

from __future__ import annotations

import typing

from dcp import _errors
from dcp.wire.messages import Message, MessageType, Ping, Pong, Reconnect, Register, Reply, Request

if typing.TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "PROTOCOL",
    "TYPE_FRAMES",
    "WIDTHS",
    "Message",
    "MessageType",
    "Ping",
    "Pong",
    "Reconnect",
    "Register",
    "Reply",
    "Request",
    "check_type_width",
    "parse",
    "serialize",
    "split_body",
]

#: The protocol frame: ``DGBX`` and version 1.
PROTOCOL = b"DGBX\x01"
_MAGIC = b"DGBX"

#: Type-frame widths in use: 1 (the spec) and 4 (DagBox C++, little-endian).
WIDTHS = (1, 4)

_TYPES = {t.value: t for t in MessageType}
#: Pre-built type frames, indexed ``[width][type]``, so building a message allocates no
#: header bytes.
TYPE_FRAMES: dict[int, dict[MessageType, bytes]] = {
    w: {t: t.value.to_bytes(w, "little") for t in MessageType} for w in WIDTHS
}
# Messages parse has checked are built without their classes' __init__ (attrs converters
# and checks: about 0.5 us a message, measured with benchmarks/core_cycle.py), as that
# __init__ itself does: object.__setattr__ on the frozen slots.
_new = object.__new__
_set = object.__setattr__


def _request(
    service: bytes, client: bytes | None, metadata: tuple[bytes, ...], data: tuple[bytes, ...]
) -> Request:
    msg = _new(Request)
    _set(msg, "service", service)
    _set(msg, "client", client)
    _set(msg, "metadata", metadata)
    _set(msg, "data", data)
    return msg


def _reply(client: bytes | None, metadata: tuple[bytes, ...], data: tuple[bytes, ...]) -> Reply:
    msg = _new(Reply)
    _set(msg, "client", client)
    _set(msg, "metadata", metadata)
    _set(msg, "data", data)
    return msg


_HEADER_ONLY: dict[MessageType, Message] = {
    MessageType.PING: Ping(),
    MessageType.PONG: Pong(),
    MessageType.RECONNECT: Reconnect(),
}


def parse(frames: Sequence[bytes]) -> tuple[Message, int]:
    """Parse one DCP v1 message.

    :param frames: the message's frames, starting with the empty envelope delimiter
    :returns: the message and the width (1 or 4) of its type frame
    :raises RemoteProtocolError: a subclass naming exactly what is wrong
    """
    n = len(frames)
    if n < 3:
        raise _errors.TooFewFrames(f"{n} frame(s); the DCP header needs 3")
    if frames[0]:
        raise _errors.MissingEnvelopeDelimiter("first frame must be empty")
    proto = frames[1]
    if proto != PROTOCOL:
        if len(proto) == 5 and proto[:4] == _MAGIC:
            raise _errors.UnsupportedVersion(f"DCP version {proto[4]}; only 1 is supported")
        raise _errors.BadProtocolFrame(
            f"protocol frame {bytes(memoryview(proto)[:16])!r} is not b'DGBX\\x01'"
        )
    tframe = frames[2]
    width = len(tframe)
    if width == 1:
        code = tframe[0]
    elif width == 4:
        code = int.from_bytes(tframe, "little")
    else:
        raise _errors.BadTypeFrame(f"type frame is {width} bytes; expected 1 (or 4, DagBox C++)")
    mtype = _TYPES.get(code)
    if mtype is None:
        raise _errors.UnknownMessageType(f"message type {code:#x}")

    if mtype is MessageType.REQUEST:
        if n < 4:
            raise _errors.MissingServiceName("request without a service frame")
        # split_body's parts are what Request checks for: a non-empty client address or
        # None, non-empty metadata parts, tuples.
        client, meta, data = split_body(frames, 4)
        return _request(_small(frames[3]), client, meta, data), width
    if mtype is MessageType.REPLY:
        client, meta, data = split_body(frames, 3)
        return _reply(client, meta, data), width
    if mtype is MessageType.REGISTER:
        if n == 3:
            raise _errors.MissingServiceName("registration without a service frame")
        if n > 4:
            raise _errors.UnexpectedFrames(
                f"registration has {n - 4} frame(s) after the service name"
            )
        return Register(_small(frames[3])), width
    if n > 3:
        raise _errors.UnexpectedFrames(
            f"{mtype.name.lower()} must be header-only; got {n - 3} more"
        )
    return _HEADER_ONLY[mtype], width


def split_body(
    frames: Sequence[bytes], i: int
) -> tuple[bytes | None, tuple[bytes, ...], tuple[bytes, ...]]:
    """Split ``[client] "" metadata... "" data...`` starting at index ``i``."""
    n = len(frames)
    if i >= n:
        raise _errors.MissingClientDelimiter("no client-address delimiter")
    client: bytes | None
    if frames[i]:
        client = _small(frames[i])
        i += 1
        if i >= n or frames[i]:
            raise _errors.MissingClientDelimiter("client address not followed by an empty frame")
    else:
        client = None
    i += 1
    # Metadata runs to the next empty frame, which must exist.
    j = i
    while j < n and frames[j]:
        j += 1
    if j >= n:
        raise _errors.MissingMetadataDelimiter("no empty frame after the metadata parts")
    meta = tuple(frames[i:j])
    for part in meta:
        if part.__class__ is not bytes:
            meta = tuple(map(_small, meta))
            break
    return client, meta, tuple(frames[j + 1 :])


def _small(frame: bytes) -> bytes:
    """``frame`` as ``bytes``: the broker keeps large frames as zero-copy ``zmq.Frame``
    buffers, which is right for data parts but not for names, addresses and metadata,
    which are compared and hashed."""
    return frame if frame.__class__ is bytes else bytes(frame)


def check_type_width(type_width: int) -> None:
    """Check a ``type_width`` option: 1 (the spec) or 4 (the DagBox C++ reference).

    :raises ValueError: any other value
    """
    if type_width not in WIDTHS:
        raise ValueError(
            f"type_width must be 1 or 4 (4: the DagBox C++ reference broker), not {type_width!r}"
        )


def serialize(message: Message, *, width: int = 1) -> list[bytes]:
    """Build the frames of ``message``, starting with the empty envelope delimiter.

    :param width: type-frame width, 1 (the spec) or 4 (to answer a DagBox C++ peer)
    :raises LocalProtocolError: for an unsupported width
    """
    try:
        tframe = TYPE_FRAMES[width][message.type]
    except KeyError:
        raise _errors.LocalProtocolError(
            f"type-frame width must be 1 or 4, not {width!r}"
        ) from None
    frames = [b"", PROTOCOL, tframe]
    if isinstance(message, Register):
        frames.append(message.service)
    elif isinstance(message, (Request, Reply)):
        if isinstance(message, Request):
            frames.append(message.service)
        if message.client is not None:
            frames.append(message.client)
        frames.append(b"")
        frames += message.metadata
        frames.append(b"")
        frames += message.data
    return frames
