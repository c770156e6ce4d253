"""Services the broker answers itself (ZeroMQ RFC 8, MMI), for every dialect. Pure.

Rule D1 - A request for a name starting with ``mmi.`` is answered by the broker, never
  queued: ``mmi.service`` with ``200`` if a worker serves the service named by the request's
  last data part, ``404`` if none does; any other ``mmi.*`` name with ``501``. The answer's
  data is that code alone (the zguide broker replaces the request body with it).
Rule D2 - Workers may not register ``mmi.*`` names (refused: ``reserved_service``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["PREFIX", "answer", "is_reserved"]

#: Names the broker answers itself.
PREFIX = b"mmi."


def is_reserved(name: bytes) -> bool:
    """Rule D2: whether ``name`` is the broker's own."""
    return name[:4] == PREFIX


def answer(name: bytes, data: Sequence[bytes], served: Callable[[bytes], bool]) -> bytes:
    """Rule D1: the status code answering a request for ``name`` (an ``mmi.*`` name).

    :param served: whether some worker serves a service
    """
    if name == b"mmi.service":
        return b"200" if data and served(bytes(data[-1])) else b"404"
    return b"501"
