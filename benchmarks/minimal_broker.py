"""A minimal synchronous pyzmq DCP v1 broker: the best plain Python can do.

``python -m benchmarks.minimal_broker --bind tcp://127.0.0.1:0`` (prints ``READY <endpoint>``)

One ROUTER socket; per-service deques of queued requests and of idle workers; after each
poll it drains the socket with ``NOBLOCK`` receives (bounded batches). It routes exactly
like dcp for the load it is given: requests get the sender's address inserted when they
carry none and go to the least recently idle worker of their service (or wait in the
service's queue); a reply goes to the address it names and frees its worker; a ping is
answered with a pong and frees the worker; a registration is echoed.

What it does NOT do (and dcp does): heartbeat expiry and redelivery, the 4-byte type
frame, validation of anything beyond the type frame, error replies, limits, statistics.
"""

from __future__ import annotations

import argparse
from collections import deque
from collections.abc import Sequence

import zmq

from .common import DCP, raise_fd_limit, ready

__all__ = ["MinimalBroker", "main"]

_NOBLOCK = zmq.NOBLOCK
_REQUEST = b"\x04"
_REPLY = b"\x05"
_PING = b"\x02"
_REGISTER = b"\x01"
_RECONNECT = b"\x06"


class MinimalBroker:
    def __init__(self, sock: zmq.Socket[bytes], batch: int = 256) -> None:
        self.sock = sock
        self.batch = batch
        #: worker address -> service
        self.workers: dict[bytes, bytes] = {}
        #: workers waiting for work (a set mirrors the deques, to never enqueue one twice)
        self.idle: dict[bytes, deque[bytes]] = {}
        self.idle_set: set[bytes] = set()
        self.queues: dict[bytes, deque[list[bytes]]] = {}

    def serve_forever(self) -> None:
        sock = self.sock
        batch = self.batch
        handle = self.handle
        while True:
            sock.poll(1000)
            for _ in range(batch):
                try:
                    frames = sock.recv_multipart(_NOBLOCK)
                except zmq.Again:
                    break
                if len(frames) > 3:
                    handle(frames)

    def handle(self, frames: list[bytes]) -> None:
        # frames: [sender, "", DGBX\x01, type, ...]
        kind = frames[3]
        sender = frames[0]
        if kind == _REQUEST:
            if len(frames) < 7:
                return
            service = frames[4]
            if not frames[5]:
                frames.insert(5, sender)
            idle = self.idle.get(service)
            if idle:
                worker = idle.popleft()
                self.idle_set.discard(worker)
                frames[0] = worker
                self.sock.send_multipart(frames)
            else:
                queue = self.queues.get(service)
                if queue is None:
                    queue = self.queues[service] = deque()
                queue.append(frames)
        elif kind == _REPLY:
            if len(frames) < 5 or sender not in self.workers:
                return
            frames[0] = frames[4]
            self.sock.send_multipart(frames)
            self.make_ready(sender)
        elif kind == _PING:
            if sender in self.workers:
                self.sock.send_multipart([sender, b"", DCP, b"\x03"])
                self.make_ready(sender)
            else:
                self.sock.send_multipart([sender, b"", DCP, _RECONNECT])
        elif kind == _REGISTER and len(frames) == 5:
            self.workers[sender] = frames[4]
            self.sock.send_multipart(frames)
            self.make_ready(sender)
        elif kind == _RECONNECT:
            gone = self.workers.pop(sender, b"")
            if sender in self.idle_set:
                self.idle_set.discard(sender)
                self.idle[gone].remove(sender)

    def make_ready(self, worker: bytes) -> None:
        if worker in self.idle_set:
            return
        service = self.workers[worker]
        queue = self.queues.get(service)
        if queue:
            frames = queue.popleft()
            frames[0] = worker
            self.sock.send_multipart(frames)
            return
        idle = self.idle.get(service)
        if idle is None:
            idle = self.idle[service] = deque()
        idle.append(worker)
        self.idle_set.add(worker)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.minimal_broker", description=__doc__
    )
    parser.add_argument("--bind", default="tcp://127.0.0.1:0")
    args = parser.parse_args(argv)
    raise_fd_limit()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(args.bind)
    ready(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    MinimalBroker(sock).serve_forever()


if __name__ == "__main__":
    main()
