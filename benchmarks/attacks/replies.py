"""Replies from non-workers: a peer that never registered sends large replies to made-up
client addresses, which the broker keeps for the reply grace."""

from __future__ import annotations

from .frames import reply
from .harness import MB, Attacker

__all__ = ["run"]


def run(a: Attacker) -> None:
    count = a.size(200, 12)
    body = b"r" * a.size(10 * MB, 8 * MB)
    sock = a.socket()
    sent = 0
    for i in range(count):
        if not a.send(sock, reply(b"\x00fake%08d" % i, body, metadata=[b"m"])):
            break
        sent += 1
    a.notes["replies"] = sent
    a.hold(a.size(3, 0.5))
