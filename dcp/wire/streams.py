"""Frames of dcp streams (a DCP v1 extension, ``docs/streams.md``). Pure: no state.

A stream is a request whose metadata carries the option ``\\xffDCP:stream=<window>``: its
answer is zero or more *partial* replies, then one ordinary (final) reply. Three message
types of dcp's extension range carry the rest, in the DCP envelope (DEALER view, ``T`` the
type frame, 1 byte, or 4 to a peer that writes 4)::

    PARTIAL 0x10  "" DGBX\\x01 T [client] "" metadata... "" data...
    CREDIT  0x11  "" DGBX\\x01 T [client] "" metadata... "" n
    CANCEL  0x12  "" DGBX\\x01 T [client] "" metadata... ""

They have a reply's layout. PARTIAL goes worker -> broker -> client like a reply; CREDIT
(``n``: 1 to 9 ASCII digits, more parts the reader accepts) and CANCEL go client -> broker
-> worker. From the client they carry no address and only the request id as metadata; to
the worker the broker writes the request's (shown) client address and its whole metadata,
which is how a worker names the request. Only peers that asked for a stream ever see one.
"""

from __future__ import annotations

import enum
import typing

import attrs

import dcp.wire.dcp1 as _dcp1
from dcp import _errors
from dcp.wire.options import OPTION_PREFIX as _OPTION_PREFIX

if typing.TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "MAX_CREDIT",
    "STREAM_OPTION",
    "TYPE_FRAMES",
    "BadCredit",
    "StreamMessage",
    "StreamType",
    "build",
    "is_stream",
    "parse_part",
    "parse_stream",
    "stream_option",
    "stream_window",
]

_PROTOCOL = _dcp1.PROTOCOL

#: The metadata option that asks for a stream; its value is the reader's first credit.
STREAM_OPTION = _OPTION_PREFIX + b"stream="
#: Largest credit (and window) written or read.
MAX_CREDIT = 999_999_999


class StreamType(enum.IntEnum):
    """The stream message types (dcp's extension range 0x10-0x17)."""

    #: One part of a stream's answer.
    PARTIAL = 0x10
    #: The reader accepts ``n`` more parts.
    CREDIT = 0x11
    #: The reader is gone: stop producing.
    CANCEL = 0x12


_CODES = {t.value: t for t in StreamType}
_TFRAMES = {w: {t: t.value.to_bytes(w, "little") for t in StreamType} for w in (1, 4)}
#: Type frames (either width) of stream messages, to tell them apart cheaply.
TYPE_FRAMES = frozenset(f for frames in _TFRAMES.values() for f in frames.values())


@attrs.frozen
class StreamMessage:
    """A parsed stream message."""

    type: StreamType
    client: bytes | None
    metadata: tuple[bytes, ...]
    #: A PARTIAL's data parts; empty for the others.
    data: tuple[bytes, ...] = ()
    #: A CREDIT's count; 0 for the others.
    credit: int = 0


def is_stream(frames: Sequence[bytes]) -> bool:
    """Whether ``frames`` (DEALER view) is a DCP message of a stream type."""
    return len(frames) > 2 and frames[2] in TYPE_FRAMES and frames[1] == _PROTOCOL


def parse_stream(frames: Sequence[bytes]) -> StreamMessage:
    """Parse a stream message (one :func:`is_stream` accepted).

    :raises RemoteProtocolError: a malformed one (a CREDIT's count not 1 to 9 digits, a
        CANCEL with data, or a bad layout)
    """
    tframe = frames[2]
    mtype = _CODES[tframe[0] if len(tframe) == 1 else int.from_bytes(tframe, "little")]
    client, metadata, data = _dcp1.split_body(frames, 3)
    if mtype is StreamType.PARTIAL:
        return StreamMessage(mtype, client, metadata, data)
    if mtype is StreamType.CREDIT:
        n = _count(data[0]) if len(data) == 1 else 0
        if not n:
            raise BadCredit("a CREDIT's data must be one count of 1 to 9 ASCII digits")
        return StreamMessage(mtype, client, metadata, credit=n)
    if data:
        raise _errors.UnexpectedFrames(f"a CANCEL has no data; got {len(data)} part(s)")
    return StreamMessage(mtype, client, metadata)


def parse_part(frames: Sequence[bytes]) -> StreamMessage | None:
    """A PARTIAL naming a request (first metadata part), or ``None`` for anything else."""
    try:
        msg = parse_stream(frames)
    except _errors.RemoteProtocolError:
        return None
    if msg.type is not StreamType.PARTIAL or not msg.metadata:
        return None
    return msg


class BadCredit(_errors.RemoteProtocolError):
    """A CREDIT whose count is not 1 to 9 ASCII digits."""

    reason = "bad_credit"


def _count(raw: bytes) -> int:
    raw = bytes(raw)
    if not 0 < len(raw) <= 9 or not raw.isdigit():
        return 0
    return int(raw)


def build(
    mtype: StreamType,
    client: bytes | None,
    metadata: Sequence[bytes],
    data: Sequence[bytes] = (),
    *,
    credit: int = 0,
    width: int = 1,
) -> list[bytes]:
    """The frames (DEALER view) of a stream message."""
    frames = [b"", _PROTOCOL, _TFRAMES[width][mtype]]
    if client is not None:
        frames.append(client)
    frames.append(b"")
    frames += metadata
    frames.append(b"")
    if mtype is StreamType.CREDIT:
        frames.append(str(min(credit, MAX_CREDIT)).encode())
    else:
        frames += data
    return frames


def stream_option(window: int) -> bytes:
    """The metadata option asking for a stream, with the reader's first credit.

    :raises ValueError: ``window`` not in 1 .. 999,999,999
    """
    if isinstance(window, bool) or not isinstance(window, int) or not 0 < window <= MAX_CREDIT:
        raise ValueError(f"window must be an int from 1 to {MAX_CREDIT:,}, not {window!r}")
    return STREAM_OPTION + str(window).encode()


def stream_window(metadata: Sequence[bytes]) -> int | None:
    """The first credit of a stream request (its first valid stream option), or ``None``
    if ``metadata`` asks for no stream."""
    for part in metadata:
        if part[:1] == b"\xff" and part.startswith(STREAM_OPTION):
            n = _count(part[len(STREAM_OPTION) :])
            if n:
                return n
    return None
