"""Finding 5, subscription lockout: peers that take their whole per-peer share of
subscriptions and vanish fill the broker-wide limit."""

from __future__ import annotations

from .frames import request
from .harness import Attacker

__all__ = ["BROKER", "SHORT_BROKER", "run"]

#: The short run's broker: the same shape of limits, a hundredth of the size.
SHORT_BROKER = ("--max-subscriptions", "200", "--max-subscriptions-per-peer", "20")
BROKER: tuple[str, ...] = ()


def run(a: Attacker) -> None:
    peers = 10
    each = a.size(10_000, 20)
    ok = 0
    for p in range(peers):
        sock = a.socket()
        for i in range(each):
            sid = b"s%d" % i
            pattern = b"lock.%d.%d" % (p, i)
            frames = request(b"\xffDCP:sub", sid, pattern, b"", metadata=[b"\xffDCP:id=" + sid])
            if not a.send(sock, frames):
                break
        got = 0
        while got < each and (answer := a.recv(sock, 3.0)) is not None:
            got += 1
            ok += answer[-1] == b"ok"
    a.notes["subscriptions accepted"] = ok
