"""Raw frames the attackers and the probe send (DEALER view), built by hand so an attacker
can send what no dcp peer would."""

from __future__ import annotations

import time
from collections.abc import Sequence

__all__ = [
    "DCP",
    "dbp",
    "mc0",
    "register",
    "reply",
    "request",
]

#: DCP v1's protocol frame.
DCP = b"DGBX\x01"


def request(service: bytes, *data: bytes, metadata: Sequence[bytes] = ()) -> list[bytes]:
    """A DCP request: ``"" DGBX\\x01 0x04 service "" metadata... "" data...``."""
    return [b"", DCP, b"\x04", service, b"", *metadata, b"", *data]


def reply(client: bytes, *data: bytes, metadata: Sequence[bytes] = ()) -> list[bytes]:
    """A DCP reply to ``client``, as a worker sends it."""
    return [b"", DCP, b"\x05", client, b"", *metadata, b"", *data]


def register(service: bytes) -> list[bytes]:
    """A DCP worker's registration."""
    return [b"", DCP, b"\x01", service]


def dbp(command: bytes, *rest: bytes) -> list[bytes]:
    """A DBP command: ``"" command time rest...``."""
    return [b"", command, b"%.3f" % time.time(), *rest]


def mc0(
    verb: bytes, headers: Sequence[tuple[bytes, bytes]] = (), *positional: bytes
) -> list[bytes]:
    """An mc0 command: ``VERB KEY VAL ... "" positional...``."""
    frames = [verb]
    for key, value in headers:
        frames += [key, value]
    frames.append(b"")
    frames += positional
    return frames
