"""A message's whole size is checked only after zmq received all of it: messages of six
frames, each under the per-frame limit, all together far over the message limit."""

from __future__ import annotations

from .frames import request
from .harness import MB, Attacker

__all__ = ["run"]


def run(a: Attacker) -> None:
    frame = b"f" * a.size(200 * MB, 10 * MB)
    sock = a.socket()
    sent = 0
    for _ in range(2):
        if not a.send(sock, request(b"nobody", *[frame] * 6)):
            break
        sent += 1
    a.notes["messages"] = sent
    a.hold(a.size(8, 1))
