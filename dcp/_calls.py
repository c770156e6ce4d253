"""What building a request takes, shared by the async and the sync client (and the worker):
routing ids, service names, payload parts, and the metadata with dcp's request options."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._messages import work_timeout_option

__all__ = [
    "Payload",
    "check_window",
    "checked_routing_id",
    "make_routing_id",
    "payload_parts",
    "request_metadata",
    "service_bytes",
]

#: One request's data: a single part, or a sequence of parts.
Payload = bytes | Sequence[bytes]


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


def service_bytes(service: str | bytes) -> bytes:
    """The service name as sent: ``str`` is encoded as UTF-8."""
    return service.encode() if isinstance(service, str) else service


def payload_parts(payload: Payload) -> Sequence[bytes]:
    """The data parts of a ``map`` payload: ``bytes`` is one part."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return (bytes(payload),)
    return payload


def request_metadata(
    metadata: Sequence[bytes], work_timeout: float | None, default: float | None
) -> Sequence[bytes]:
    """The metadata to send: dcp's request options (``work_timeout``, else the client's
    ``default``), then the user's."""
    if work_timeout is None:
        work_timeout = default
    if work_timeout is None:
        return metadata
    return (work_timeout_option(work_timeout), *metadata)


def check_window(window: int) -> None:
    """Check a ``map`` window: at least one request in flight."""
    if window < 1:
        raise ValueError(f"window must be >= 1, not {window!r}")
