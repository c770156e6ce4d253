"""What building a request takes, shared by the async and the sync client (and the worker):
routing ids, service names, payload parts, and the metadata with dcp's request options.

Every part a caller hands in is checked (and ``str`` encoded as UTF-8) here, once, before the
request's first frame is sent: a zmq multipart send that fails half-way would leave the
frames already queued to be glued to the next message. The fast path (``bytes``) costs one
type test per part.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import cast

import attrs

from dcp.wire.options import NO_WAIT_OPTION, work_timeout_option

__all__ = [
    "Part",
    "Payload",
    "check_window",
    "checked_routing_id",
    "data_parts",
    "make_routing_id",
    "payload_parts",
    "request_metadata",
    "service_bytes",
]

#: One data or metadata part: ``bytes`` as is, ``str`` as UTF-8 (``bytearray`` and
#: ``memoryview`` are copied into ``bytes``).
Part = bytes | str
#: One request's data for ``map``: a single part, or a sequence of parts.
Payload = bytes | str | Sequence[bytes | str]

_BUFFERS = (bytearray, memoryview)
#: Service names given as ``str``, encoded (at most ``_NAMES_MAX``; then encoded each time).
_NAMES: dict[str, bytes] = {}
_NAMES_MAX = 1024


def make_routing_id() -> bytes:
    """A random 16-byte zmq routing id. zmq reserves ids starting with a 0x00 byte."""
    ident = os.urandom(16)
    return ident if ident[0] else b"\x01" + ident[1:]


def checked_routing_id(routing_id: bytes | None) -> bytes:
    """``routing_id`` if zmq accepts it as an explicit id, a fresh random one for ``None``.

    :raises ValueError: empty, longer than 255 bytes, or starting with 0x00 (reserved)
    """
    if routing_id is None:
        return make_routing_id()
    if not 0 < len(routing_id) <= 255 or routing_id[0] == 0:
        raise ValueError("routing_id must be 1-255 bytes and not start with 0x00")
    return routing_id


def _part(part: object, name: str) -> bytes:
    """One part as ``bytes`` (the slow path: anything but ``bytes``)."""
    if isinstance(part, bytes):
        return bytes(part)  # a subclass: plain bytes for zmq and for comparisons
    if isinstance(part, str):
        try:
            return part.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{name} is not encodable as UTF-8: {exc}") from None
    if isinstance(part, _BUFFERS):
        return bytes(part)
    raise TypeError(f"{name} must be bytes or str, not {type(part).__name__}")


def service_bytes(service: str | bytes) -> bytes:
    """The service name as sent: ``str`` is encoded as UTF-8.

    :raises TypeError: not ``bytes`` or ``str``
    :raises ValueError: a ``str`` that UTF-8 cannot encode (a lone surrogate)
    """
    if type(service) is bytes:
        return service
    if type(service) is str:  # a name is encoded once (most programs call a few services)
        name = _NAMES.get(service)
        if name is None:
            name = _part(service, "service")
            if len(_NAMES) < _NAMES_MAX:
                _NAMES[service] = name
        return name
    return _part(service, "service")


def data_parts(parts: Iterable[Part], name: str = "data") -> tuple[bytes, ...]:
    """The data parts as sent, each checked: ``name[i]`` in error messages.

    :raises TypeError: a part that is not ``bytes``, ``str`` or a bytes-like buffer
    :raises ValueError: a ``str`` part that UTF-8 cannot encode
    """
    parts = tuple(parts)
    for part in parts:
        if type(part) is not bytes:
            break
    else:
        return parts  # type: ignore[return-value]  # all bytes: the fast path
    return tuple(_part(part, f"{name}[{i}]") for i, part in enumerate(parts))


def payload_parts(payload: Payload, index: int) -> tuple[bytes, ...]:
    """The data parts of ``map``'s payload number ``index``: ``bytes`` or ``str`` is one
    part, a sequence is several (errors name ``payloads[index]``)."""
    if type(payload) is bytes:
        return (payload,)
    if isinstance(payload, (bytes, str, bytearray, memoryview)):
        return (_part(payload, f"payloads[{index}]"),)
    if not isinstance(payload, Sequence):
        raise TypeError(
            f"payloads[{index}] must be bytes, str or a sequence of them, "
            f"not {type(payload).__name__}"
        )
    return data_parts(cast("Sequence[Part]", payload), f"payloads[{index}]")


def request_metadata(
    metadata: Sequence[Part],
    work_timeout: float | None,
    default: float | None,
    *,
    no_wait: bool = False,
) -> tuple[bytes, ...]:
    """The metadata to send after dcp's request id (and expires-in option, which the tracker
    adds): dcp's request options (``work_timeout``, else the client's ``default``; the
    no-wait flag), then the user's parts, each checked.

    :raises TypeError: ``metadata`` is not a sequence of parts, or a part is not ``bytes``
        or ``str``
    :raises ValueError: an empty part (an empty frame ends the metadata on the wire), or a
        bad ``work_timeout``
    """
    if isinstance(metadata, (bytes, str, bytearray, memoryview)) or not isinstance(
        metadata, Sequence
    ):
        raise TypeError(
            f"metadata must be a sequence of bytes or str parts, not {type(metadata).__name__}"
        )
    user = data_parts(metadata, "metadata")
    for i, part in enumerate(user):
        if not part:
            raise ValueError(f"metadata[{i}] is empty (an empty frame ends the metadata)")
    if work_timeout is None:
        work_timeout = default
    options: tuple[bytes, ...] = ()
    if work_timeout is not None:
        options = (work_timeout_option(work_timeout),)
    if no_wait:
        options = (*options, NO_WAIT_OPTION)
    return (*options, *user) if options else user


def check_window(window: int) -> None:
    """Check a ``map`` window: at least one request in flight."""
    if window < 1:
        raise ValueError(f"window must be >= 1, not {window!r}")


@attrs.frozen
class Timing:
    """The time limits of one call, checked (from
    :meth:`~dcp._core.client.tracker.RequestTracker.timing`).

    :ivar timeout: seconds for the whole call, every attempt and backoff included
    :ivar attempt_timeout: seconds for each attempt
    :ivar retries: resends after timed-out attempts
    """

    timeout: float
    attempt_timeout: float
    retries: int

    @classmethod
    def resolve(
        cls,
        defaults: tuple[float, float | None, int],
        timeout: float | None,
        attempt_timeout: float | None,
        retries: int | None,
    ) -> Timing:
        """Each limit given, else its default (``defaults``: timeout, attempt timeout or
        ``None``, retries); an attempt timeout given by neither is ``timeout / (retries +
        1)``.

        :raises ValueError: a timeout that is not > 0, or ``retries`` < 0
        """
        if timeout is None:
            timeout = defaults[0]
        else:
            check_timeout(timeout, "timeout")
        if retries is None:
            retries = defaults[2]
        else:
            check_retries(retries)
        if attempt_timeout is None:
            attempt_timeout = defaults[1]
            if attempt_timeout is None:
                attempt_timeout = timeout / (retries + 1)
        else:
            check_timeout(attempt_timeout, "attempt_timeout")
        return cls(timeout, attempt_timeout, retries)


def check_timeout(timeout: float, name: str) -> None:
    if not timeout > 0:  # also rejects NaN
        raise ValueError(f"{name} must be > 0 seconds, not {timeout!r}")


def check_retries(retries: int) -> None:
    if retries < 0:
        raise ValueError(f"retries must be >= 0, not {retries!r}")


class PendingCall:
    """One request awaiting its answer (the request tracker's record of a call)."""

    __slots__ = (
        "attempt",
        "deadline",
        "end",
        "frames",
        "gen",
        "has_expires",
        "no_workers",
        "probe_at",
        "probe_id",
        "resending",
        "retry_at",
        "service",
        "start",
        "timing",
    )

    def __init__(self, service: bytes, timing: Timing, start: float) -> None:
        self.service = service
        self.timing = timing
        self.start = start
        self.frames: list[bytes] = []
        #: Whether :attr:`frames` carries an expires-in option (at ``_EXPIRES_AT``).
        self.has_expires = False
        #: Attempts sent so far.
        self.attempt = 0
        #: When the request fails (Rule RT3); moves earlier when the last attempt is sent.
        self.end = start + timing.timeout
        #: When the current attempt times out, or its backoff delay ends (``resending``);
        #: ``inf`` once no resend is left.
        self.retry_at = math.inf
        #: True while waiting out a backoff delay before the next attempt.
        self.resending = False
        #: When to send the mmi.service probe (``inf``: not, or already sent).
        self.probe_at = math.inf
        self.probe_id: bytes | None = None
        #: The latest probe answer was 404 (``True``) or 200 (``False``); ``None``: none yet.
        self.no_workers: bool | None = None
        #: The heap entry standing for this request: when, and its generation.
        self.deadline = math.inf
        self.gen = 0
