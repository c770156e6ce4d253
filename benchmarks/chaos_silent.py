"""Chaos-test workers that send nothing while they work (``python -m benchmarks.chaos_peers
worker --kind majortomo|dagbox``), as the broker meets them from other libraries:

- ``majortomo``: majortomo 0.2.0's own :class:`majortomo.Worker` (MDP/0.2), a blocking loop
  that heartbeats only while it waits for a request;
- ``dagbox``: a plain DCP v1 worker in the DagBox C++ reference's manner: 4-byte type
  frames, a PING every heartbeat interval while idle, silence while busy, and REGISTER
  again on a RECONNECT.

Both answer ``[b"ok:" + payload, pid]`` after ``--work`` seconds and append a ``run`` event
per request to the ``--events`` file, like the dcp workers of :mod:`benchmarks.chaos_peers`.
They print ``READY <pid>`` once registered (majortomo: once connected; MDP has no echo),
connect again when the broker forgot them (majortomo: a DISCONNECT; dagbox: a RECONNECT),
and end on SIGTERM (the default action).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import zmq

from dcp.wire import Message, Ping, Reconnect, Register, Reply, Request, parse, serialize

__all__ = ["serve_dagbox", "serve_majortomo"]


def _ready(pid: int) -> None:
    sys.stdout.write(f"READY {pid}\n")
    sys.stdout.flush()


def serve_majortomo(args: argparse.Namespace, log: Callable[..., Any]) -> None:
    from majortomo import Worker as MtWorker
    from majortomo.error import Disconnected

    pid = os.getpid()
    worker = MtWorker(
        args.endpoint,
        args.service.encode(),
        heartbeat_interval=args.heartbeat_interval,
        heartbeat_timeout=args.heartbeat_interval * args.liveness,
        zmq_linger=0,
    )
    worker.connect()
    _ready(pid)
    while True:
        try:
            client, body = worker.wait_for_request()
        except Disconnected:
            # The broker dropped it for silence (a process descheduled past the liveness on
            # a loaded machine) and answered its next command with DISCONNECT: an MDP
            # worker connects again (RFC 7), as an application of majortomo's would.
            worker.connect()
            continue
        payload = body[0] if body else b""
        log(
            ev="run",
            id=payload.decode(errors="replace"),
            pid=pid,
            t=time.monotonic(),
            kind="majortomo",
        )
        time.sleep(args.work)  # busy and silent
        worker.send_reply_final(client, [b"ok:" + payload, str(pid).encode()])


def serve_dagbox(args: argparse.Namespace, log: Callable[..., Any]) -> None:
    pid = os.getpid()
    service = args.service.encode()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.endpoint)

    def send(message: Message) -> None:
        sock.send_multipart(serialize(message, width=4))

    send(Register(service))
    registered = False
    interval_ms = max(1, int(args.heartbeat_interval * 1000))
    while True:
        if not sock.poll(interval_ms):
            send(Ping())  # idle: heartbeat (and ask for work)
            continue
        message, _ = parse(sock.recv_multipart())
        if isinstance(message, Register) and not registered:
            registered = True
            _ready(pid)
        elif isinstance(message, Reconnect):
            send(Register(service))
        elif isinstance(message, Request):
            payload = message.data[0] if message.data else b""
            log(
                ev="run",
                id=payload.decode(errors="replace"),
                pid=pid,
                t=time.monotonic(),
                kind="dagbox",
            )
            time.sleep(args.work)  # busy and silent
            send(Reply(message.client, message.metadata, (b"ok:" + payload, str(pid).encode())))
