"""The common echo workers: many DEALER sockets in one synchronous pyzmq process.

``python -m benchmarks.echo_worker --proto dcp|mdp|proxy --endpoint ... --sockets 4``

Each socket is one worker that answers each request at once with the request's data:

- ``dcp``: a plain DCP v1 worker: registers, replies ``"" DGBX\\x01 0x05 client "" meta ""
  data`` (a reply frees its slot, so it never needs to ping under load) and pings when it
  sent nothing for a heartbeat interval; re-registers on Reconnect.
- ``mdp``: an MDP 0.2 worker (majortomo): READY, FINAL replies, heartbeats.
- ``proxy``: behind ``zmq.proxy``'s DEALER: returns each message unchanged (envelope
  included), so the proxy routes it back to the client.

``--distinct`` registers socket ``i`` for service ``<service>-<i>`` (the services sweep).
It prints ``READY`` once every registration is confirmed (DCP) or sent (MDP), then serves
until killed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import zmq

from .common import DCP, MDPW, raise_fd_limit, ready

__all__ = ["main"]

_NOBLOCK = zmq.NOBLOCK


def serve(
    endpoint: str,
    proto: str,
    services: Sequence[bytes],
    heartbeat: float,
    register_timeout: float,
) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.setsockopt(zmq.LINGER, 0)
    sockets: list[zmq.Socket[bytes]] = []
    poller = zmq.Poller()
    if proto == "dcp":
        hello = [[b"", DCP, b"\x01", s] for s in services]
        ping: list[bytes] = [b"", DCP, b"\x02"]
    elif proto == "mdp":
        hello = [[b"", MDPW, b"\x01", s] for s in services]
        ping = [b"", MDPW, b"\x05"]
    else:
        hello = []
        ping = []
    for _ in services:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(endpoint)
        sockets.append(sock)
        poller.register(sock, zmq.POLLIN)
    index = {sock: i for i, sock in enumerate(sockets)}
    for sock, msg in zip(sockets, hello, strict=False):
        sock.send_multipart(msg)
    active = [False] * len(sockets)

    # DCP: wait until the broker echoed every registration (bounded).
    if proto == "dcp":
        waiting = set(range(len(sockets)))
        deadline = time.monotonic() + register_timeout
        resend = time.monotonic() + 2.0
        while waiting:
            now = time.monotonic()
            if now > deadline:
                raise SystemExit(f"echo_worker: {len(waiting)} registrations not confirmed")
            if now > resend:  # registering again is harmless (echoed again)
                resend = now + 2.0
                for i in waiting:
                    sockets[i].send_multipart(hello[i])
            for sock, _ in poller.poll(100):
                while True:
                    try:
                        frames = sock.recv_multipart(_NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) >= 3 and frames[2] == b"\x01":
                        waiting.discard(index[sock])
    ready(str(len(sockets)))

    reply_dcp = [b"", DCP, b"\x05"]
    final_mdp = [b"", MDPW, b"\x04"]
    next_beat = time.monotonic() + heartbeat
    while True:
        for sock, _ in poller.poll(int(heartbeat * 250)):
            i = index[sock]
            while True:
                try:
                    frames = sock.recv_multipart(_NOBLOCK)
                except zmq.Again:
                    break
                if proto == "proxy":
                    sock.send_multipart(frames)
                    continue
                kind = frames[2] if len(frames) > 2 else b""
                if proto == "dcp":
                    if kind == b"\x04":
                        # "" DGBX 04 service client "" meta... "" data...
                        sock.send_multipart(reply_dcp + frames[4:])
                        active[i] = True
                    elif kind == b"\x06":
                        sock.send_multipart(hello[i])
                elif kind == b"\x02":  # MDP REQUEST: "" MDPW02 02 client "" body...
                    sock.send_multipart(final_mdp + frames[3:])
                    active[i] = True
                elif kind == b"\x06":  # MDP DISCONNECT: register again
                    sock.send_multipart(hello[i])
        if ping and time.monotonic() >= next_beat:
            next_beat = time.monotonic() + heartbeat
            for i, sock in enumerate(sockets):
                if not active[i]:
                    sock.send_multipart(ping)
                active[i] = False


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.echo_worker", description=__doc__)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--proto", choices=["dcp", "mdp", "proxy"], default="dcp")
    parser.add_argument("--service", default="echo")
    parser.add_argument("--sockets", type=int, default=4)
    parser.add_argument("--distinct", action="store_true", help="one service per socket")
    parser.add_argument("--offset", type=int, default=0, help="first index for --distinct")
    parser.add_argument("--heartbeat", type=float, default=None, help="seconds")
    parser.add_argument("--register-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    raise_fd_limit()
    base = str(args.service)
    if args.distinct:
        services = [f"{base}-{args.offset + i}".encode() for i in range(args.sockets)]
    else:
        services = [base.encode()] * args.sockets
    heartbeat = args.heartbeat or (1.0 if args.proto == "dcp" else 2.5)
    serve(args.endpoint, args.proto, services, heartbeat, args.register_timeout)


if __name__ == "__main__":
    main()
