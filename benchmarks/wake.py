"""The cost of one wake-up: an event loop waiting on a zmq socket against ``zmq.poll``.

``python -m benchmarks.wake [--count N]`` ping-pongs one-frame messages between the main
thread and an echo thread over tcp://127.0.0.1 and prints the main thread's CPU and the wall
time per round trip, for dcp's :class:`~dcp._io.sockets.AsyncSocket` on trio and on asyncio, and
for a plain blocking ``poll``/``recv`` loop. The difference is what every wake-up of an
anyio-driven broker, client or worker costs on top of a synchronous pyzmq loop.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Sequence

import anyio
import zmq

from dcp._io.sockets import AsyncSocket


def _pair(ctx: zmq.Context[zmq.Socket[bytes]]) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    a = ctx.socket(zmq.PAIR)
    a.setsockopt(zmq.LINGER, 0)
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b = ctx.socket(zmq.PAIR)
    b.setsockopt(zmq.LINGER, 0)
    b.connect(f"tcp://127.0.0.1:{port}")
    return a, b


def _echo(sock: zmq.Socket[bytes], count: int) -> None:
    for _ in range(count):
        sock.send(sock.recv())


def _measure(count: int, body: Callable[[zmq.Socket[bytes]], None]) -> tuple[float, float]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    a, b = _pair(ctx)
    echo = threading.Thread(target=_echo, args=(b, count))
    echo.start()
    try:
        cpu, wall = time.thread_time(), time.perf_counter()
        body(a)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    finally:
        echo.join(timeout=10)
        a.close(0)
        b.close(0)
        ctx.term()
    return cpu / count * 1e6, wall / count * 1e6


def sync_loop(count: int) -> tuple[float, float]:
    def body(sock: zmq.Socket[bytes]) -> None:
        for _ in range(count):
            sock.send(b"x")
            sock.poll()
            sock.recv()

    return _measure(count, body)


def async_loop(count: int, backend: str) -> tuple[float, float]:
    def body(sock: zmq.Socket[bytes]) -> None:
        async def main() -> None:
            asock = AsyncSocket(sock)
            for _ in range(count):
                asock.send_nowait([b"x"])
                await asock.wait_readable()
                asock.drain(16)

        anyio.run(main, backend=backend)

    return _measure(count, body)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wake", description=__doc__)
    parser.add_argument("--count", type=int, default=5000, help="round trips per loop")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rows: dict[str, list[tuple[float, float]]] = {"sync poll": [], "trio": [], "asyncio": []}
    for _ in range(args.rounds):  # interleaved rounds; medians below
        rows["sync poll"].append(sync_loop(args.count))
        rows["trio"].append(async_loop(args.count, "trio"))
        rows["asyncio"].append(async_loop(args.count, "asyncio"))
    print("| loop | main-thread CPU us/round trip | wall us/round trip |")
    print("|---|---|---|")
    for name, runs in rows.items():
        cpu = sorted(r[0] for r in runs)[len(runs) // 2]
        wall = sorted(r[1] for r in runs)[len(runs) // 2]
        print(f"| {name} | {cpu:.1f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
