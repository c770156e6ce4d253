"""Queued requests of departed clients: clients queue large requests (or requests of many
empty frames) to a service with no worker, then disconnect."""

from __future__ import annotations

from .frames import request
from .harness import MB, Attacker

__all__ = ["empty_frames", "run"]


def run(a: Attacker) -> None:
    clients = 4
    each = a.size(400, 25)
    body = b"q" * MB
    sent = 0
    for _ in range(clients):
        sock = a.socket()
        for _ in range(each):
            if not a.send(sock, request(b"nobody-home", body)):
                break
            sent += 1
    a.notes["requests"] = sent
    a.hold(a.size(3, 0.5))


def empty_frames(a: Attacker) -> None:
    """Requests of 4,000 empty data frames each (under ``max_frames``), queued for no
    worker, then gone: a byte count that ignores what a frame costs sees nothing."""
    count = a.size(10_000, 100)
    frames = request(b"nobody-home", *[b""] * 4000)
    sock = a.socket()
    sent = 0
    for _ in range(count):
        if not a.send(sock, frames):
            break
        sent += 1
    a.notes["requests"] = sent
    a.hold(a.size(3, 0.5))
