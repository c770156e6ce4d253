"""``zmq.proxy``: ROUTER/DEALER forwarding in C, the physical limit of the machine.

``python -m benchmarks.proxy --frontend tcp://127.0.0.1:0 --backend tcp://127.0.0.1:0``
prints ``READY <frontend> <backend>`` and forwards until killed. Clients connect to the
frontend (ROUTER), echo workers to the backend (DEALER, round-robin, no readiness); a worker
returns each message with its envelope, which the ROUTER routes back to the client.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import zmq

from .common import raise_fd_limit, ready

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy", description=__doc__)
    parser.add_argument("--frontend", default="tcp://127.0.0.1:0")
    parser.add_argument("--backend", default="tcp://127.0.0.1:0")
    args = parser.parse_args(argv)
    raise_fd_limit()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    back = ctx.socket(zmq.DEALER)
    for sock in (front, back):
        sock.setsockopt(zmq.LINGER, 0)
    front.bind(args.frontend)
    back.bind(args.backend)
    ready(
        front.getsockopt_string(zmq.LAST_ENDPOINT)
        + " "
        + back.getsockopt_string(zmq.LAST_ENDPOINT)
    )
    zmq.proxy(front, back)


if __name__ == "__main__":
    main()
