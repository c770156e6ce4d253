"""Parse and build mc0 frames (the Marionette Collective 0MQ broker protocol, draft 0.3).
Pure: no sockets, no clocks.

A message is ``[VERB, KEY1, VAL1, ..., "", POSITIONAL...]``: a verb, header pairs, and,
after an empty frame, positional parts (DEALER view: no envelope delimiter). Peers send
``CONNECT`` (headers ``VERSION``, ``TTL`` in ms), ``DISCONNECT``, ``SUB``/``UNSUB`` (topics
as positionals), ``PUT`` (header ``TOPIC``, the body as positionals) and ``NOOP``; any may
carry an ``ID`` header, which asks for ``OK``/``ERROR`` with that ``ID``. The broker sends
``MESSAGE`` (``TOPIC`` header, body), ``OK``, ``ERROR`` (``MESSAGE`` header) and ``NOOP``.
A header key or value longer than :data:`MAX_HEADER` bytes is refused (reason
``header_too_long``), as are more than 32 headers.
"""

from __future__ import annotations

import typing

import attrs

from dcp import _errors

if typing.TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "MAX_HEADER",
    "VERBS",
    "BadMc0Message",
    "Command",
    "error",
    "message",
    "noop",
    "ok",
    "parse",
]

#: Verbs a peer may send.
VERBS = frozenset({b"CONNECT", b"DISCONNECT", b"SUB", b"UNSUB", b"PUT", b"NOOP"})
_MAX_HEADERS = 32
#: The longest header key or value a peer may send, in bytes (a ``TOPIC`` is at most 1,024).
MAX_HEADER = 4096


class BadMc0Message(_errors.RemoteProtocolError):
    """An mc0 message that does not parse (odd header frames, a verb we do not take)."""

    reason = "bad_mc0_message"


@attrs.frozen
class Command:
    """One parsed mc0 command."""

    #: ``CONNECT``, ``DISCONNECT``, ``SUB``, ``UNSUB``, ``PUT`` or ``NOOP``.
    verb: bytes
    #: Header pairs in order (the first of a repeated key counts).
    headers: dict[bytes, bytes]
    #: Parts after the empty frame (topics, or a PUT's body).
    positional: tuple[bytes, ...]

    @property
    def id(self) -> bytes | None:
        """The ``ID`` header, if any: the command asks for OK/ERROR."""
        return self.headers.get(b"ID")


def parse(frames: Sequence[bytes]) -> Command:
    """Parse one mc0 command (frames as a DEALER sent them).

    :raises BadMc0Message: saying what is wrong
    :raises ~dcp.RemoteProtocolError: a header key or value is over :data:`MAX_HEADER`
        (reason ``header_too_long``; nothing of it is copied)
    """
    if not frames:
        raise BadMc0Message("empty message")
    if len(frames[0]) > 16:
        raise BadMc0Message(
            f"verb {bytes(memoryview(frames[0])[:16])!r}... is not one a peer sends"
        )
    verb = bytes(frames[0])
    if verb not in VERBS:
        raise BadMc0Message(f"verb {verb[:16]!r} is not one a peer sends")
    headers: dict[bytes, bytes] = {}
    i = 1
    n = len(frames)
    while i < n and frames[i]:
        if i + 1 >= n:
            raise BadMc0Message(f"header {bytes(memoryview(frames[i])[:16])!r} has no value")
        if len(headers) >= _MAX_HEADERS:
            raise BadMc0Message(f"more than {_MAX_HEADERS} headers")
        if len(frames[i]) > MAX_HEADER or len(frames[i + 1]) > MAX_HEADER:
            raise _errors.HeaderTooLong(
                f"header {bytes(memoryview(frames[i])[:16])!r} longer than {MAX_HEADER} bytes"
            )
        headers.setdefault(bytes(frames[i]), bytes(frames[i + 1]))
        i += 2
    positional = tuple(frames[i + 1 :]) if i < n else ()
    return Command(verb, headers, positional)


def message(topic: bytes, body: Sequence[bytes]) -> list[bytes]:
    """A delivery: ``[MESSAGE, TOPIC, topic, "", body...]``."""
    return [b"MESSAGE", b"TOPIC", topic, b"", *body]


def ok(ident: bytes) -> list[bytes]:
    """``[OK, ID, ident]``."""
    return [b"OK", b"ID", ident]


def error(ident: bytes | None, description: str) -> list[bytes]:
    """``[ERROR, ID, ident, MESSAGE, description]`` (no ``ID`` pair without ``ident``)."""
    head = [b"ERROR"] if ident is None else [b"ERROR", b"ID", ident]
    return [*head, b"MESSAGE", description.encode("utf-8", "replace")]


def noop() -> list[bytes]:
    """``[NOOP]``."""
    return [b"NOOP"]
