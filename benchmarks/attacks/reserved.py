"""Finding 9, reserved names: a plain (no CURVE) peer registers ``\\xffDCP:sub`` and
``\\xffDCP:pub``, the names of the broker's own pub/sub verbs, and stays, answering nothing.
A subscriber that comes meanwhile must still be served by the broker (the check runs while
the rogue worker is there).

``python -m benchmarks.attacks.reserved ENDPOINT`` is the rogue worker: it prints ``READY``
and which names the broker confirmed, then pings until killed.
"""

from __future__ import annotations

import sys
import time

import zmq

from ..common import ready
from .frames import DCP, register
from .harness import Attacker

__all__ = ["NAMES", "main", "run"]

#: The reserved names the rogue worker tries.
NAMES = (b"\xffDCP:sub", b"\xffDCP:pub", b"\xffDCP:credit")


def run(a: Attacker) -> None:
    rogue = a.start("rogue", "benchmarks.attacks.reserved", a.endpoint)
    confirmed = rogue.read_line(10).split()
    a.notes["registered"] = confirmed
    if confirmed:
        a.violations.append(f"registered reserved names: {', '.join(confirmed)}")


def main() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks = []
    for name in NAMES:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(sys.argv[1])
        sock.send_multipart(register(name))
        socks.append(sock)
    ready()
    confirmed: list[str] = []
    for name, sock in zip(NAMES, socks, strict=True):
        if sock.poll(2000):
            frames = sock.recv_multipart()
            if frames[2:3] == [b"\x01"] and frames[-1] == name:
                confirmed.append("\\xff" + name[1:].decode())
    sys.stdout.write(" ".join(confirmed) + "\n")
    sys.stdout.flush()
    while True:
        time.sleep(0.5)
        for sock in socks:
            sock.send_multipart([b"", DCP, b"\x02"])
            while sock.poll(0):
                sock.recv_multipart()


if __name__ == "__main__":
    main()
