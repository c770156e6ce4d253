"""One stream's throughput: dcp streams against the same data as unary requests, and against
majortomo's partials.

``python -m benchmarks.streams [--rounds 3] [--tiny] [--page docs/performance.md]``

Each variant moves the same data, ``count`` parts of ``size`` bytes (16 B and 64 KiB), from
one worker to one client through one broker; broker, worker and client are three processes
(spawned afresh per variant and round) on 127.0.0.1 tcp:

- *dcp stream*: ``Client.stream`` (window 32) from an async-generator worker, dcp broker;
- *dcp unary*: the same parts as ``count`` requests with ``Client.map`` (window 32, so the
  same number in flight), one part per reply;
- *majortomo partials*: majortomo 0.2.0's ``Worker`` sending ``count`` PARTIALs then a
  FINAL, read with its ``Client.recv_all``, through majortomo's ``Broker`` (no credit: the
  worker writes as fast as it can);
- *majortomo partials via dcp*: the same majortomo peers through the dcp broker (which
  forwards the partials to the majortomo client as it reads them, streams Rule ST3).

The clock runs from the request to the last part. Figures are medians over rounds: parts/s
and MB/s (10^6 bytes of part data per second).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import multiprocessing.connection
import platform
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from .sections import put_section

__all__ = ["main", "measure"]

SIZES = ((16, 20_000), (65_536, 2_000))
TINY_SIZES = ((16, 200), (65_536, 20))
WINDOW = 32
VARIANTS = ("dcp stream", "dcp unary", "majortomo partials", "majortomo partials via dcp")


# ------------------------------------------------------------------ processes


def _dcp_broker(conn: multiprocessing.connection.Connection) -> None:
    import anyio

    import dcp

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            [endpoint] = await tg.start(dcp.Broker("tcp://127.0.0.1:0").serve)
            conn.send(endpoint)
            await anyio.to_thread.run_sync(conn.recv)
            tg.cancel_scope.cancel()

    anyio.run(run)


def _mt_broker(conn: multiprocessing.connection.Connection) -> None:
    import threading

    import zmq
    from majortomo.broker import Broker

    class Announcing(Broker):
        def bind(self) -> None:
            super().bind()  # type: ignore[no-untyped-call]
            conn.send(self._socket.getsockopt_string(zmq.LAST_ENDPOINT))

    broker = Announcing(bind="tcp://127.0.0.1:*")

    def stop() -> None:
        conn.recv()
        broker.stop()  # type: ignore[no-untyped-call]

    threading.Thread(target=stop, daemon=True).start()
    # majortomo's close() disconnects its bind address, which fails for a wildcard port.
    with contextlib.suppress(zmq.ZMQError):
        broker.run()  # type: ignore[no-untyped-call]


def _dcp_worker(conn: multiprocessing.connection.Connection, endpoint: str, size: int) -> None:
    import anyio

    import dcp

    part = b"x" * size

    async def stream(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        for _ in range(int(request.data[0])):
            yield part

    async def unary(request: dcp.HandlerRequest) -> bytes:
        return part

    async def run() -> None:
        async with (
            dcp.Worker(endpoint, "stream", stream),
            dcp.Worker(endpoint, "unary", unary, concurrency=WINDOW),
        ):
            conn.send("ready")
            await anyio.to_thread.run_sync(conn.recv)

    anyio.run(run)


def _mt_worker(conn: multiprocessing.connection.Connection, endpoint: str, size: int) -> None:
    from majortomo import Worker

    part = b"x" * size
    worker = Worker(endpoint, b"stream", zmq_linger=0)
    worker.connect()
    conn.send("ready")
    while True:
        client, body = worker.wait_for_request()
        if body == [b"stop"]:
            worker.send_reply_final(client, [b"stopped"])
            break
        for _ in range(int(body[0])):
            worker.send_reply_partial(client, [part])
        worker.send_reply_final(client, [])
    worker.close()  # type: ignore[no-untyped-call]


# ------------------------------------------------------------------ clients


def _dcp_client(endpoint: str, variant: str, count: int, size: int) -> float:
    import anyio

    import dcp

    async def run() -> float:
        async with dcp.Client(endpoint, timeout=300) as client:
            await client.request("unary")  # warm up: connected, workers registered
            started = time.perf_counter()
            got = 0
            if variant == "dcp stream":
                async with client.stream("stream", b"%d" % count, window=WINDOW) as parts:
                    async for part in parts:
                        got += len(part[0])
            else:
                async for reply in client.map("unary", [b""] * count, window=WINDOW):
                    got += len(reply.data[0])
            elapsed = time.perf_counter() - started
        assert got == count * size, (got, count, size)
        return elapsed

    return anyio.run(run)


def _mt_client(endpoint: str, count: int, size: int) -> float:
    from majortomo import Client

    with Client(endpoint) as client:
        started = time.perf_counter()
        client.send(b"stream", b"%d" % count)
        got = sum(len(part[0]) for part in client.recv_all(timeout=300) if part)
        elapsed = time.perf_counter() - started
        client.send(b"stream", b"stop")
        list(client.recv_all(timeout=30))
    assert got == count * size, (got, count, size)
    return elapsed


def _start(
    ctx: Any, target: Callable[..., None], *args: Any
) -> tuple[Any, multiprocessing.connection.Connection]:
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=target, args=(theirs, *args), daemon=True)
    proc.start()
    return proc, mine


def measure(variant: str, count: int, size: int) -> float:
    """Seconds for ``count`` parts of ``size`` bytes in ``variant`` (fresh processes)."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    try:
        broker_target = _mt_broker if variant == "majortomo partials" else _dcp_broker
        broker, broker_conn = _start(ctx, broker_target)
        procs.append((broker, broker_conn))
        if not broker_conn.poll(60):
            raise RuntimeError("the broker did not start")
        endpoint = broker_conn.recv()
        mt = variant.startswith("majortomo")
        worker, worker_conn = _start(ctx, _mt_worker if mt else _dcp_worker, endpoint, size)
        procs.append((worker, worker_conn))
        if not worker_conn.poll(60):
            raise RuntimeError("the worker did not start")
        worker_conn.recv()
        if mt:
            return _mt_client(endpoint, count, size)
        return _dcp_client(endpoint, variant, count, size)
    finally:
        for proc, conn in reversed(procs):
            if proc.is_alive():
                with contextlib.suppress(OSError):  # it exited already
                    conn.send("stop")
                proc.join(5)
            if proc.is_alive():  # pragma: no cover - a stuck process
                proc.kill()
                proc.join(5)


# ------------------------------------------------------------------ report


def run(rounds: int, tiny: bool) -> dict[tuple[str, int], list[float]]:
    """Seconds per (variant, size), one per round (variants rotated each round)."""
    sizes = TINY_SIZES if tiny else SIZES
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for size, count in sizes:
            for variant in order:
                seconds = measure(variant, count, size)
                times.setdefault((variant, size), []).append(seconds)
                print(
                    f"round {r + 1} {variant:28} {size:>6} B x {count}: {seconds:.3f} s",
                    file=sys.stderr,
                )
    return times


def render(times: dict[tuple[str, int], list[float]], tiny: bool, command: str) -> str:
    sizes = TINY_SIZES if tiny else SIZES
    lines = [
        "## Streams: one stream against unary requests and majortomo's partials",
        "",
        f"`$ {command}` ({platform.machine()}, {multiprocessing.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; broker, worker and client are three processes on "
        "127.0.0.1 tcp; medians of "
        f"{len(next(iter(times.values())))} rounds; see `benchmarks/streams.py`).",
        "",
        "| variant | part size | parts | parts/s | MB/s | vs dcp stream |",
        "|---|---|---|---|---|---|",
    ]
    for size, count in sizes:
        base = statistics.median(times[("dcp stream", size)])
        for variant in VARIANTS:
            seconds = statistics.median(times[(variant, size)])
            rate = count / seconds
            mbps = count * size / seconds / 1e6
            label = "16 B" if size == 16 else f"{size // 1024} KiB"
            lines.append(
                f"| {variant} | {label} | {count:,} | {rate:,.0f} | {mbps:,.1f} | "
                f"{base / seconds:.2f}x |"
            )
    lines += [
        "",
        "*dcp unary* moves the same parts as one request each (window 32, the stream's "
        "window); *majortomo partials* has no flow control (its worker never waits), *dcp "
        "stream* waits for credit (window 32). The last column is throughput relative to "
        "*dcp stream* at the same part size.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streams", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a few parts: a smoke test")
    parser.add_argument("--page", type=Path, help="write the section into this page")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.streams" + (" --tiny" if args.tiny else "")
    if args.rounds != 3:
        command += f" --rounds {args.rounds}"
    times = run(args.rounds, args.tiny)
    section = render(times, args.tiny, command)
    print(section)
    if args.page is not None:
        text = args.page.read_text()
        args.page.write_text(put_section(text, "streams", section))
        print(f"wrote the streams section of {args.page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
