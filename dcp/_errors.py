"""The exception hierarchy.

Everything dcp raises on purpose derives from :class:`DCPError`. Protocol errors are split the
way h11 splits them: a :class:`LocalProtocolError` is a message *we* were asked to build that
DCP cannot express; a :class:`RemoteProtocolError` is a message a *peer* sent that does not
parse. Each way a remote message can be malformed is its own subclass with a short, stable
``reason`` string, which is also the key of the broker's rejection counters.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthenticationFailed",
    "BadProtocolFrame",
    "BadTypeFrame",
    "BindFailed",
    "DCPError",
    "HeaderTooLong",
    "JsonTooLarge",
    "LocalProtocolError",
    "MessageTooLarge",
    "MissingClientDelimiter",
    "MissingEnvelopeDelimiter",
    "MissingMetadataDelimiter",
    "MissingServiceName",
    "NoWorkers",
    "ProtocolError",
    "RegistrationRefused",
    "RemoteError",
    "RemoteProtocolError",
    "RequestTimeout",
    "TooFewFrames",
    "TooManyFrames",
    "UnexpectedFrames",
    "UnknownMessageType",
    "UnsupportedVersion",
]


class DCPError(Exception):
    """Base class of every exception dcp raises on purpose."""


class ProtocolError(DCPError):
    """A message that DCP v1 cannot express or that does not parse."""

    #: Short, stable identifier of what is wrong; used as a counter key.
    reason: ClassVar[str] = "protocol_error"


class LocalProtocolError(ProtocolError, ValueError):
    """We were asked to build a message that DCP v1 cannot express."""

    reason = "local_protocol_error"


class RemoteProtocolError(ProtocolError):
    """A peer sent a message that is not valid DCP v1.

    Subclasses name the precise defect; :attr:`reason` is stable across releases.
    """

    reason = "malformed"


class TooFewFrames(RemoteProtocolError):
    """The message is shorter than the DCP header (or than its message type needs)."""

    reason = "too_few_frames"


class TooManyFrames(RemoteProtocolError):
    """The message has more frames than the receiver's configured limit."""

    reason = "too_many_frames"


class MessageTooLarge(RemoteProtocolError):
    """The message has more bytes, all frames together, than the receiver's limit."""

    reason = "message_too_large"


class JsonTooLarge(RemoteProtocolError):
    """A JSON document in the message is over the receiver's limits (bytes, nesting depth
    or elements); it was refused before it was parsed."""

    reason = "json_too_large"


class HeaderTooLong(RemoteProtocolError):
    """A header field of the message (a dcp option part, an mc0 header) is longer than the
    receiver's limit for it."""

    reason = "header_too_long"


class MissingEnvelopeDelimiter(RemoteProtocolError):
    """The empty frame that starts every DCP message is missing."""

    reason = "missing_envelope_delimiter"


class BadProtocolFrame(RemoteProtocolError):
    """The protocol frame is not ``DGBX`` followed by one version byte."""

    reason = "bad_protocol_frame"


class UnsupportedVersion(RemoteProtocolError):
    """The protocol frame names a DCP version other than 1."""

    reason = "unsupported_version"


class BadTypeFrame(RemoteProtocolError):
    """The message-type frame is neither 1 byte (the spec) nor 4 bytes (DagBox C++)."""

    reason = "bad_type_frame"


class UnknownMessageType(RemoteProtocolError):
    """The message type is not one of 0x01-0x06."""

    reason = "unknown_message_type"


class UnexpectedFrames(RemoteProtocolError):
    """A message type with a fixed shape carries extra frames (e.g. a ping with a body)."""

    reason = "unexpected_frames"


class MissingServiceName(RemoteProtocolError):
    """A registration or request has no service-name frame."""

    reason = "missing_service_name"


class MissingClientDelimiter(RemoteProtocolError):
    """A request or reply lacks the empty frame that ends the (optional) client address."""

    reason = "missing_client_delimiter"


class MissingMetadataDelimiter(RemoteProtocolError):
    """A request or reply lacks the empty frame that ends the metadata parts."""

    reason = "missing_metadata_delimiter"


class RequestTimeout(DCPError, TimeoutError):
    """A request got no reply within its timeout, after its last retry."""


class NoWorkers(RequestTimeout):
    """A request ended because no worker serves its service: the broker said so, either
    answering a no-wait request at once or answering the client's ``mmi.service`` question
    before the request timed out, or because a handler on the way forwarded it to a service
    nobody serves (``docs/forward.md``). A :class:`RequestTimeout`, so ``except
    RequestTimeout`` catches it too.

    :ivar service: the service nobody serves (for a forward chain, the last one)
    :ivar chain: the services the request went through, in order, the last being
        ``service``, if it was forwarded (else empty)
    """

    def __init__(self, service: bytes, message: str, chain: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.service = service
        self.message = message
        self.chain = chain

    def __reduce__(self) -> tuple[type[NoWorkers], tuple[bytes, str, tuple[str, ...]]]:
        return (type(self), (self.service, self.message, self.chain))


class RemoteError(DCPError):
    """The other side answered a request with an error instead of a result.

    Raised by clients for dcp error replies (see ``docs/protocol.md``), which come from a
    worker whose handler raised, or from the broker when it refuses a request. An error
    further down a forward chain names where it happened (``docs/forward.md``):
    ``handler_error: ValueError: no (at 'b', via a -> b)``.

    :ivar code: short machine-readable code, e.g. ``"handler_error"`` or ``"queue_full"``
    :ivar message: human-readable text from the side that failed
    :ivar chain: the services the request went through, in order, the last being the one
        that failed, if it was forwarded (else empty)
    """

    def __init__(self, code: str, message: str, chain: tuple[str, ...] = ()) -> None:
        where = f" (at {chain[-1]!r}, via {' -> '.join(chain)})" if chain else ""
        super().__init__(f"{code}: {message}{where}")
        self.code = code
        self.message = message
        self.chain = chain

    def __reduce__(self) -> tuple[type[RemoteError], tuple[object, ...]]:
        return (type(self), (self.code, self.message, self.chain))


class RegistrationRefused(DCPError):
    """The broker refused to let this worker register its service (dcp extension: a
    ``registration_refused`` error reply; see ``docs/security.md``).

    :ivar service: the service the worker tried to register
    :ivar message: the broker's explanation
    """

    def __init__(self, service: str, message: str) -> None:
        super().__init__(f"the broker refused the registration for {service!r}: {message}")
        self.service = service
        self.message = message


class BindFailed(DCPError, OSError):
    """A broker could not bind one of its endpoints, in one line: ``cannot bind
    tcp://127.0.0.1:5555: Address already in use`` (a port another socket holds, an
    ``ipc://`` path where a live process listens, an address this host does not have).
    Raised by :meth:`Broker.serve <dcp.Broker.serve>` (and ``async with``) instead of zmq's
    error.

    :ivar endpoint: the endpoint that could not be bound
    :ivar errno: the system's error number (``errno.EADDRINUSE`` for an address in use), or
        ``None``
    """

    def __init__(self, message: str, endpoint: str, code: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.errno = code

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[type[BindFailed], tuple[str, str, int | None]]:
        return (BindFailed, (str(self.args[0]), self.endpoint, self.errno))


class AuthenticationFailed(DCPError, ConnectionError):
    """The broker will not talk to this peer: it refused the peer's CURVE key, or one side
    uses CURVE and the other does not, or the peer has the wrong broker key. Raised within
    about a second of connecting (zmq's handshake events), instead of a timeout.

    :ivar endpoint: the broker endpoint the peer connected to
    :ivar reason: what the handshake said
    """

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"{endpoint}: {reason}")
        self.endpoint = endpoint
        self.reason = reason

    def __reduce__(self) -> tuple[type[AuthenticationFailed], tuple[str, str]]:
        return (AuthenticationFailed, (self.endpoint, self.reason))


class StreamBroken(RemoteError):
    """A stream ended early because its worker went away after some parts were delivered
    (dcp streams, ``docs/streams.md``; the broker never gives such a request to another
    worker). A :class:`RemoteError` with code ``stream_broken``.

    :ivar parts: how many parts the reader had received
    """

    def __init__(self, message: str, parts: int) -> None:
        super().__init__("stream_broken", f"{message} ({parts} part(s) received)")
        self.parts = parts
        self._said = message

    def __reduce__(self) -> tuple[type[StreamBroken], tuple[str, int]]:
        return (type(self), (self._said, self.parts))
