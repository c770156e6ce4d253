"""Pub/sub throughput and the broker's CPU per delivered message.

``python -m benchmarks.pubsub`` measures, in one run, messages/s published and delivered to
1, 10 and 100 subscribers (16 B and 1 KiB bodies) through four brokers, each in a process
of its own: a ZeroMQ XPUB/XSUB proxy in C (``zmq.proxy``: the limit of the machine), a
minimal Python pub/sub broker (a ROUTER, a dict from subject to subscribers, no buffers, no
credit, drops at zmq's high-water mark), the dcp broker and ``nats-server`` (Debian's
package, from ``PATH``, on 127.0.0.1 with a free port: what an async Python team would most
likely pick; it drops a subscriber that falls 64 MiB behind). The publisher (this process)
and the subscribers (one process holding every subscriber socket) are raw loops for all
four (pyzmq; for NATS, TCP sockets speaking its text protocol: ``PUB``, ``SUB``, ``MSG``), so
the brokers are what differs. NATS is skipped, with a one-line reason, without
``nats-server``. Then the dcp broker's CPU seconds per delivered
message while idle subscriptions (half exact subjects, half ``>`` patterns) grow from 0 to
10,000: flat means no scan over subscriptions per message.

Options: ``--messages N`` (deliveries per case, about), ``--kinds a,b`` (the brokers, default
all), ``--tiny`` (a smoke run), ``--json FILE`` (the records). Internal: ``--serve KIND``,
``--receive ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from . import nats_peers
from .common import cpu_seconds, raise_fd_limit, ready

__all__ = ["main"]

P = b"DGBX\x01"
REQ = b"\x04"
SUBJECT = b"bench"
KINDS = ("proxy", "python", "dcp", "nats")
NATS_CONNECT = b'CONNECT {"verbose":false,"pedantic":false}\r\n'


# ------------------------------------------------------------------ brokers (--serve)


def serve_proxy() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    xsub.bind("tcp://127.0.0.1:0")
    xpub.bind("tcp://127.0.0.1:0")
    ready(
        f"{xsub.getsockopt_string(zmq.LAST_ENDPOINT)} {xpub.getsockopt_string(zmq.LAST_ENDPOINT)}"
    )
    zmq.proxy(xsub, xpub)


def serve_python() -> None:
    """The minimal Python broker: ``[S, subject]`` subscribes, ``[P, subject, body]``
    publishes to the exact subject's subscribers (a full queue drops)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.bind("tcp://127.0.0.1:0")
    ep = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    ready(f"{ep} {ep}")
    subs: dict[bytes, list[bytes]] = {}
    while True:
        frames = sock.recv_multipart()
        if frames[1] == b"S":
            subs.setdefault(frames[2], []).append(frames[0])
        elif frames[1] == b"P":
            for peer in subs.get(frames[2], ()):
                with contextlib.suppress(zmq.ZMQError):  # a full queue drops
                    sock.send_multipart([peer, frames[2], frames[3]], zmq.NOBLOCK)


def serve_dcp() -> None:
    import anyio

    import dcp

    async def run() -> None:
        broker = dcp.Broker("tcp://127.0.0.1:0")
        async with anyio.create_task_group() as tg:
            [ep] = await tg.start(broker.serve)
            ready(f"{ep} {ep}")
            await anyio.sleep_forever()

    anyio.run(run)


# ------------------------------------------------------------------ clients


def sub_request(sid: bytes, pattern: bytes, *options: bytes) -> list[bytes]:
    return [
        b"",
        P,
        REQ,
        b"\xffDCP:sub",
        b"",
        b"\xffDCP:id=" + sid,
        b"",
        sid,
        pattern,
        b"",
        *options,
    ]


def credit(sid: bytes, n: int) -> list[bytes]:
    return [b"", P, REQ, b"\xffDCP:credit", b"", b"\xffDCP:id=c", b"", sid, b"%d" % n]


def subscriber_socket(
    ctx: zmq.Context[zmq.Socket[bytes]], kind: str, ep: str, i: int
) -> zmq.Socket[bytes]:
    if kind == "proxy":
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, SUBJECT)
        sock.connect(ep)
        return sock
    sock = ctx.socket(zmq.DEALER)
    sock.connect(ep)
    if kind == "python":
        sock.send_multipart([b"S", SUBJECT])
    else:
        sock.send_multipart(
            sub_request(b"s%06d" % i, SUBJECT, b"window=400", b"max-pending=100000")
        )
    return sock


def nats_socket(ep: str) -> socket.socket:
    """A raw NATS connection to ``host:port``: the server's ``INFO`` read, ``CONNECT`` sent
    (no ``+OK`` acknowledgements)."""
    host, port = ep.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    info = b""
    while b"\r\n" not in info:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("nats-server closed the connection")
        info += chunk
    sock.sendall(NATS_CONNECT)
    return sock


def receive_nats(ep: str, n: int, expected: int, idle: float) -> None:
    """:func:`receive` for NATS: ``n`` raw connections, one ``SUB`` each."""
    socks = [nats_socket(ep) for _ in range(n)]
    sel = selectors.DefaultSelector()
    for i, sock in enumerate(socks):
        sock.sendall(b"SUB %s %d\r\n" % (SUBJECT, i))
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, i)
    buffers = [b""] * n
    warm = [False] * n
    got = [0] * n
    real = 0
    first = last = 0.0
    announced = False
    while True:
        events = sel.select(idle)
        if not events:
            if announced and real:
                break
            continue
        for key, _ in events:
            i = key.data
            sock = socks[i]
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError(f"nats-server closed subscriber {i}")
            buf = buffers[i] + chunk
            pos = 0
            while True:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                if buf.startswith(b"MSG", pos):
                    size = int(buf[buf.rfind(b" ", pos, end) + 1 : end])
                    if len(buf) < end + 2 + size + 2:
                        break
                    if buf[end + 2 : end + 3] == b"m":
                        got[i] += 1
                        real += 1
                        last = time.time()
                        if real == 1:
                            first = last
                    else:
                        warm[i] = True
                    pos = end + 2 + size + 2
                else:
                    if buf.startswith(b"PING", pos):
                        sock.sendall(b"PONG\r\n")
                    pos = end + 2  # PONG, +OK, INFO, -ERR
            buffers[i] = buf[pos:]
        if not announced and all(warm):
            announced = True
            ready()
        if real >= expected * n:
            break
    print(
        json.dumps({"received": real, "first": first, "last": last, "min": min(got)}), flush=True
    )


def receive(kind: str, ep: str, n: int, expected: int, idle: float) -> None:
    """The subscribers' process: ``n`` sockets; print READY once each got a warm-up message,
    then count real messages (body starting with ``m``) until all arrived or ``idle`` s
    pass without any; print a JSON record."""
    raise_fd_limit()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks = [subscriber_socket(ctx, kind, ep, i) for i in range(n)]
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    index = {s: i for i, s in enumerate(socks)}
    warm = [False] * n
    got = [0] * n
    owed = [0] * n
    real = 0
    first = last = 0.0
    announced = False
    while True:
        events = poller.poll(int(idle * 1000))
        if not events:
            if announced and real:
                break
            continue
        for s, _ in events:
            i = index[s]
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                body = frames[-1]
                if kind == "dcp":
                    if not frames[5].startswith(b"\xffDCP:msg="):
                        continue  # a reply
                    owed[i] += 1
                    if owed[i] >= 200:
                        s.send_multipart(credit(b"s%06d" % i, owed[i]))
                        owed[i] = 0
                if body[:1] == b"m":
                    got[i] += 1
                    real += 1
                    last = time.time()
                    if real == 1:
                        first = last
                else:
                    warm[i] = True
        if not announced and all(warm):
            announced = True
            ready()
        if real >= expected * n:
            break
    print(
        json.dumps({"received": real, "first": first, "last": last, "min": min(got)}), flush=True
    )


def publisher(ctx: zmq.Context[zmq.Socket[bytes]], kind: str, ep: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.PUB if kind == "proxy" else zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 0 if kind == "proxy" else 1000)
    sock.connect(ep)
    return sock


def publish_frames(kind: str, body: bytes) -> list[bytes]:
    if kind == "nats":
        return [b"PUB %s %d\r\n%s\r\n" % (SUBJECT, len(body), body)]
    if kind == "proxy":
        return [SUBJECT, body]
    if kind == "python":
        return [b"P", SUBJECT, body]
    return [b"", P, REQ, b"\xffDCP:pub", b"", b"", SUBJECT, body]


def _start(args: Sequence[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.pubsub", *args],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"{args[:2]} did not start: {line!r}")
    return proc, line[5:].strip()


def case(kind: str, n: int, size: int, messages: int) -> dict[str, Any]:
    """One measurement: ``messages`` published to ``n`` subscribers through ``kind``."""
    if kind == "nats":
        argv, port = nats_peers.server_argv()
        broker = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        nats_peers.wait_accepting(port, broker)
        pub_ep = sub_ep = f"127.0.0.1:{port}"
    else:
        broker, eps = _start(["--serve", kind])
        pub_ep, sub_ep = eps.split()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub: zmq.Socket[bytes] | None = None
    raw: socket.socket | None = None
    send: Callable[[list[bytes]], object]
    if kind == "nats":
        raw = conn = nats_socket(pub_ep)
        send = lambda frames: conn.sendall(frames[0])  # noqa: E731
    else:
        pub = publisher(ctx, kind, pub_ep)
        send = pub.send_multipart
    recv = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.pubsub",
            "--receive",
            kind,
            sub_ep,
            str(n),
            str(messages),
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert recv.stdout is not None
        warmup = publish_frames(kind, b"w" * size)
        os.set_blocking(recv.stdout.fileno(), False)
        line = ""
        deadline = time.time() + 30
        while not line.startswith("READY"):
            if time.time() > deadline:
                raise RuntimeError("subscribers never warmed up")
            send(warmup)
            time.sleep(0.01)
            line = recv.stdout.readline() or line
        os.set_blocking(recv.stdout.fileno(), True)
        frames = publish_frames(kind, b"m" * size)
        cpu0 = cpu_seconds(broker.pid)
        t0 = time.time()
        for _ in range(messages):
            send(frames)
        t1 = time.time()
        out = recv.stdout.readline()
        cpu = cpu_seconds(broker.pid) - cpu0
        rec = json.loads(out)
    finally:
        recv.kill()
        broker.kill()
        if pub is not None:
            pub.close(0)
        if raw is not None:
            raw.close()
        ctx.term()
        recv.wait()
        broker.wait()
    received = rec["received"]
    elapsed = max(rec["last"] - t0, 1e-9)
    return {
        "kind": kind,
        "subscribers": n,
        "size": size,
        "published": messages,
        "publish_rate": messages / max(t1 - t0, 1e-9),
        "delivered": received,
        "delivery_rate": received / elapsed,
        "lost": messages * n - received,
        "broker_cpu_us_per_delivery": cpu / max(received, 1) * 1e6,
    }


def scaling(idle: int, messages: int) -> dict[str, Any]:
    """The dcp broker's CPU per delivered message with ``idle`` other subscriptions."""
    broker, eps = _start(["--serve", "dcp"])
    ep = eps.split()[0]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    filler = ctx.socket(zmq.DEALER)
    filler.connect(ep)
    try:
        for i in range(idle):
            pattern = b"idle.%d" % i if i % 2 else b"idle.%d.>" % i
            filler.send_multipart(sub_request(b"f%06d" % i, pattern, b"timeout=3600000"))
        for _ in range(idle):
            filler.recv_multipart()
        return case_on(broker, ep, ctx, idle, messages)
    finally:
        filler.close(0)
        broker.kill()
        broker.wait()
        ctx.term()


def case_on(
    broker: subprocess.Popen[str],
    ep: str,
    ctx: zmq.Context[zmq.Socket[bytes]],
    idle: int,
    messages: int,
) -> dict[str, Any]:
    sub = ctx.socket(zmq.DEALER)
    sub.connect(ep)
    pub = publisher(ctx, "dcp", ep)
    try:
        sub.send_multipart(sub_request(b"a", SUBJECT, b"window=400", b"max-pending=100000"))
        sub.recv_multipart()
        frames = publish_frames("dcp", b"m" * 16)
        cpu0 = cpu_seconds(broker.pid)
        got = owed = 0
        sent = 0
        while got < messages:
            while sent < messages and sent - got < 500:
                pub.send_multipart(frames)
                sent += 1
            msg = sub.recv_multipart()
            if msg[5].startswith(b"\xffDCP:msg="):
                got += 1
                owed += 1
                if owed >= 250:
                    sub.send_multipart(credit(b"a", owed))
                    owed = 0
        cpu = cpu_seconds(broker.pid) - cpu0
    finally:
        sub.close(0)
        pub.close(0)
    return {
        "idle_subscriptions": idle,
        "delivered": got,
        "broker_cpu_us_per_delivery": cpu / got * 1e6,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pubsub", description=__doc__)
    parser.add_argument("--serve", choices=KINDS[:3])
    parser.add_argument("--receive", nargs=4, metavar=("KIND", "EP", "N", "M"))
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated brokers")
    parser.add_argument("--subscribers", default="1,10,100")
    parser.add_argument("--sizes", default="16,1024")
    parser.add_argument("--idle", default="0,100,1000,10000")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if args.serve:
        {"proxy": serve_proxy, "python": serve_python, "dcp": serve_dcp}[args.serve]()
        return
    if args.receive:
        kind, ep, n, m = args.receive
        if kind == "nats":
            receive_nats(ep, int(n), int(m), idle=2.0)
        else:
            receive(kind, ep, int(n), int(m), idle=2.0)
        return
    raise_fd_limit()
    kinds = [k for k in args.kinds.split(",") if k]
    if "nats" in kinds and (why := nats_peers.missing(client=False)) is not None:
        print(f"nats skipped: {why}", file=sys.stderr)
        kinds.remove("nats")
    total = 2000 if args.tiny else args.messages
    subscribers = [1, 3] if args.tiny else [int(x) for x in args.subscribers.split(",")]
    sizes = [16] if args.tiny else [int(x) for x in args.sizes.split(",")]
    idles = [0, 200] if args.tiny else [int(x) for x in args.idle.split(",")]
    records: list[dict[str, Any]] = []
    print("| broker | subs | size | published/s | delivered/s | lost | broker CPU us/delivery |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in subscribers:
        for size in sizes:
            for kind in kinds:
                messages = max(200, min(100_000, total // n))
                r = case(kind, n, size, messages)
                records.append(r)
                rates = f"{r['publish_rate']:,.0f} | {r['delivery_rate']:,.0f}"
                cpu = r["broker_cpu_us_per_delivery"]
                print(f"| {kind} | {n} | {size} | {rates} | {r['lost']} | {cpu:.2f} |", flush=True)
    print()
    print("| idle subscriptions | dcp broker CPU us/delivery |")
    print("|---:|---:|")
    for idle in idles:
        r = scaling(idle, 2000 if args.tiny else 50_000)
        records.append(r)
        print(f"| {idle:,} | {r['broker_cpu_us_per_delivery']:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
