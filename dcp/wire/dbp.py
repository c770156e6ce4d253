"""DBP frames (the Distributive Broker Protocol draft's Core Catalog Service: info requests,
service registration, heartbeats). Pure.

Frames here are the DEALER-side view (no ROUTER routing id). Every DBP command starts with an
empty frame, then a short command frame, then the sender's time (text, epoch seconds; read
but not used):

==============  ===================================  =========================================
command         frames after ``"" cmd time``          meaning
==============  ===================================  =========================================
``u_U``         ``[name]``                           info request (empty or none: every
                                                     service)
``o_O``         ``json``                             info reply (broker to peer)
``UwU``         ``json``                             registration (``name`` and the service's
                                                     info)
``UoU``         ``json``                             update of a registered service's info
``OwO``         ``[config...]``                      approved (broker to service)
``(O_O)``       ``reason...``                        denied; the draft implementation's
                                                     ``OmO`` is read too
``<3``          ``[name]``                           heartbeat (both ways)
``</3``         (none)                               disconnect (both ways)
``u.u``         (none)                               acknowledgement (read and ignored)
``REQ``         ``client "" body...``                a request, broker to service (dcp's)
``REP``         ``client "" body...``                its reply, service to broker (dcp's)
==============  ===================================  =========================================

The draft does not say how a registered service receives work; ``REQ`` and ``REP`` are dcp's
(MDP's shape, after the time frame), documented in ``docs/services.md``.
"""

from __future__ import annotations

import typing

import attrs

from dcp import _errors, _json

if typing.TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "ACK",
    "APPROVED",
    "COMMANDS",
    "DENIED",
    "DENIED_DRAFT",
    "DISCONNECT",
    "HEARTBEAT",
    "INFO_REPLY",
    "INFO_REQUEST",
    "MAX_DOCUMENT",
    "MAX_DOCUMENT_DEPTH",
    "MAX_DOCUMENT_ITEMS",
    "MAX_HEADER",
    "REGISTER",
    "REPLY",
    "REQUEST",
    "UPDATE",
    "Ack",
    "Disconnect",
    "Event",
    "Heartbeat",
    "InfoRequest",
    "Registration",
    "ServiceReply",
    "Update",
    "approved",
    "beat",
    "denied",
    "disconnect",
    "info_reply",
    "is_denied",
    "parse",
    "request",
]

INFO_REQUEST = b"u_U"
INFO_REPLY = b"o_O"
REGISTER = b"UwU"
UPDATE = b"UoU"
APPROVED = b"OwO"
DENIED = b"(O_O)"
#: What the draft's public implementation sends for DENIED.
DENIED_DRAFT = b"OmO"
HEARTBEAT = b"<3"
DISCONNECT = b"</3"
ACK = b"u.u"
REQUEST = b"REQ"
REPLY = b"REP"

#: The largest ``UwU``/``UoU`` JSON document, in bytes: checked before it is parsed (a larger
#: one is refused ``json_too_large``). Twice the largest service info the broker keeps
#: (the broker core's ``MAX_INFO``), for the draft's other fields.
MAX_DOCUMENT = 131_072
#: The deepest nesting of arrays and objects in such a document.
MAX_DOCUMENT_DEPTH = 32
#: The most elements (values and containers, all levels together) in such a document.
MAX_DOCUMENT_ITEMS = 10_000

#: The longest name (``u_U``) or client address (``REP``) frame, in bytes; a longer one is
#: refused (``header_too_long``) before it is copied.
MAX_HEADER = 4096

#: Every command frame a peer may send (what sniffing looks for).
COMMANDS = frozenset({INFO_REQUEST, REGISTER, UPDATE, HEARTBEAT, DISCONNECT, ACK, REPLY})


@attrs.frozen
class InfoRequest:
    """``u_U``: what is known of service :attr:`name` (``b""``: every service)."""

    name: bytes


@attrs.frozen
class Registration:
    """``UwU``: register service :attr:`name`; :attr:`document` is the whole JSON object."""

    name: bytes
    document: dict[str, typing.Any]


@attrs.frozen
class Update:
    """``UoU``: new values for a registered service's info."""

    document: dict[str, typing.Any]


@attrs.frozen
class Heartbeat:
    """``<3``."""


@attrs.frozen
class Disconnect:
    """``</3``."""


@attrs.frozen
class Ack:
    """``u.u``."""


@attrs.frozen
class ServiceReply:
    """``REP``: a service's answer to the request it was given for :attr:`client`."""

    client: bytes
    body: tuple[bytes, ...]


Event: typing.TypeAlias = (
    InfoRequest | Registration | Update | Heartbeat | Disconnect | Ack | ServiceReply
)


def _document(frames: Sequence[bytes], what: str) -> dict[str, typing.Any]:
    if len(frames) < 4:
        raise _errors.TooFewFrames(f"DBP {what} without its JSON frame")
    try:
        # Size, depth and element count are checked before anything is parsed or copied.
        doc = _json.decode_json_limited(
            frames[3],
            max_bytes=MAX_DOCUMENT,
            max_depth=MAX_DOCUMENT_DEPTH,
            max_items=MAX_DOCUMENT_ITEMS,
            name=f"DBP {what}",
        )
    except _json.JsonLimitError as exc:
        raise _errors.JsonTooLarge(str(exc)) from None
    except ValueError as exc:
        raise _errors.RemoteProtocolError(f"DBP {what}: not UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _errors.RemoteProtocolError(f"DBP {what}: the JSON is not an object")
    return doc


def parse(frames: Sequence[bytes]) -> Event:
    """One DBP message from a peer (DEALER-side frames).

    :raises RemoteProtocolError: it is not one (a subclass names what is wrong)
    """
    if len(frames) < 3:
        raise _errors.TooFewFrames(f"{len(frames)} frame(s); DBP needs '' command time")
    if frames[0]:
        raise _errors.MissingEnvelopeDelimiter("DBP: the first frame must be empty")
    command = bytes(frames[1])
    if command in (INFO_REQUEST, REPLY) and len(frames) > 3 and len(frames[3]) > MAX_HEADER:
        raise _errors.HeaderTooLong(f"DBP {command[:8]!r}: a frame over {MAX_HEADER} bytes")
    if command == INFO_REQUEST:
        return InfoRequest(bytes(frames[3]) if len(frames) > 3 else b"")
    if command == REGISTER:
        doc = _document(frames, "registration")
        name = doc.get("name")
        if not isinstance(name, str) or not name:
            raise _errors.MissingServiceName("DBP registration without a 'name'")
        return Registration(name.encode("utf-8"), doc)
    if command == UPDATE:
        return Update(_document(frames, "update"))
    if command == HEARTBEAT:
        return Heartbeat()
    if command == DISCONNECT:
        return Disconnect()
    if command == ACK:
        return Ack()
    if command == REPLY:
        if len(frames) < 5 or not frames[3] or frames[4]:
            raise _errors.MissingClientDelimiter("DBP REP needs: client, empty frame, body")
        return ServiceReply(bytes(frames[3]), tuple(frames[5:]))
    raise _errors.UnknownMessageType(f"DBP command {command[:8]!r}")


def is_denied(command: bytes) -> bool:
    """Whether a broker's command frame is DENIED: the draft's ``(O_O)``, or ``OmO`` as its
    public implementation sends it (for DBP services reading a broker's answer)."""
    return command in (DENIED, DENIED_DRAFT)


def _head(command: bytes, now: float) -> list[bytes]:
    return [b"", command, b"%.3f" % now]


def info_reply(document: bytes, now: float) -> list[bytes]:
    """``o_O``: the answer to an info request."""
    return [*_head(INFO_REPLY, now), document]


def approved(now: float) -> list[bytes]:
    """``OwO``."""
    return _head(APPROVED, now)


def denied(reason: str, now: float) -> list[bytes]:
    """``(O_O)`` with the reason."""
    return [*_head(DENIED, now), reason.encode("utf-8", "replace")]


def beat(now: float) -> list[bytes]:
    """``<3``."""
    return _head(HEARTBEAT, now)


def disconnect(now: float) -> list[bytes]:
    """``</3``."""
    return _head(DISCONNECT, now)


def request(client: bytes, body: Sequence[bytes], now: float) -> list[bytes]:
    """``REQ``: a request for a registered service, to be answered for ``client``."""
    return [*_head(REQUEST, now), client, b"", *body]
