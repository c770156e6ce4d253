"""The probe: an unrelated, legitimate client calling ``echo`` about every 100 ms.

``python -m benchmarks.attacks.probe ENDPOINT`` prints ``READY`` after its first answer
(asking again every half second until then), then calls until SIGTERM and prints one JSON
line: the latency of every call in seconds, a call still unanswered counting the time it has
waited so far. Plain synchronous pyzmq: one call at
a time, no retries, so a stalled broker shows as one long latency.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from types import FrameType

import zmq

from ..common import ready
from .frames import request

__all__ = ["main"]

#: Seconds between the starts of two calls.
INTERVAL = 0.1


def main() -> None:
    endpoint = sys.argv[1]
    stop = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    latencies: list[float] = []
    n = 0
    first = True
    while not stop:
        n += 1
        tag = b"probe-%d" % n
        sent = time.monotonic()
        sock.send_multipart(request(b"echo", b"ping", metadata=[tag]))
        answered = False
        while not stop and not answered:
            if sock.poll(20, zmq.POLLIN):
                frames = sock.recv_multipart()
                answered = tag in frames
            elif first and time.monotonic() - sent > 0.5:
                break  # echo's worker may not be there yet: ask again
        elapsed = time.monotonic() - sent
        if first:
            if answered:
                first = False
                ready()
            continue
        latencies.append(elapsed)
        while not stop and time.monotonic() < sent + INTERVAL:
            time.sleep(0.01)
    sys.stdout.write(json.dumps({"latencies": latencies}) + "\n")
    sys.stdout.flush()
    sock.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
