"""Deterministic per-request counts of dcp's Client and Worker: Python calls, event-loop
waits on a socket, messages in and out. Unlike timings, these do not depend on how busy the
machine is, so they A/B a change to the hot paths on a shared machine.

``python -m benchmarks.stack_counts [--backend trio|asyncio] [--window 64] [--concurrency 1]
[--prefetch 0] [--requests 2000] [--cpu]``

Starts ``dcp broker`` as a process, then twice: (1) one :class:`dcp.Worker` in this process,
counted, loaded by a ``benchmarks.dcp_peers`` client process; (2) one :class:`dcp.Client`
in this process (``map_unordered``, or ``request`` for window 1), counted, against one
worker process. Python calls are counted with :func:`sys.setprofile` (``call`` and
``c_call`` events) in the event loop's thread only. Every process is killed by its PID.

``--cpu``: instead of counting calls (which slows everything down), measure the CPU time of
the event loop's thread per request (:func:`time.thread_time`, user and system): a timing,
so it moves with the machine's load, but far less than a whole-stack run's throughput.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import anyio

import dcp
import dcp._io.sockets as _zmqio

from .procs import Procs
from .variants import START_TIMEOUT, Load, start_broker

__all__ = ["main"]


class Counts:
    def __init__(self, cpu: bool = False) -> None:
        self.c: collections.Counter[str] = collections.Counter()
        #: Time the thread's CPU instead of counting Python calls.
        self.cpu = cpu

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            self.c["python calls"] += 1


@contextmanager
def _counting(counts: Counts) -> Iterator[None]:
    """Count socket waits and messages (patched into dcp._io.sockets), and Python calls."""
    c = counts.c
    cls = _zmqio.AsyncSocket
    orig_wait, orig_drain, orig_send = cls.wait_readable, cls.drain, cls.send_nowait
    orig_anyio_wait = anyio.wait_readable

    async def anyio_wait(fd: Any) -> None:
        c["event-loop waits on a socket"] += 1
        await orig_anyio_wait(fd)

    def drain(self: _zmqio.AsyncSocket, batch: int) -> list[_zmqio.Received]:
        out = orig_drain(self, batch)
        c["messages in"] += len(out)
        c["drains"] += 1
        return out

    def send(self: _zmqio.AsyncSocket, frames: Sequence[bytes]) -> None:
        c["messages out"] += 1
        orig_send(self, frames)

    cls.drain = drain  # type: ignore[method-assign]
    cls.send_nowait = send  # type: ignore[method-assign]
    anyio.wait_readable = anyio_wait  # type: ignore[assignment]
    try:
        yield
    finally:
        cls.wait_readable, cls.drain, cls.send_nowait = orig_wait, orig_drain, orig_send  # type: ignore[method-assign]
        anyio.wait_readable = orig_anyio_wait


async def _profiled(counts: Counts, body: Callable[[], Any]) -> Any:
    assert threading.current_thread() is threading.main_thread()
    if counts.cpu:
        start = time.thread_time()
        try:
            return await body()
        finally:
            counts.c["event-loop thread CPU us"] += round((time.thread_time() - start) * 1e6)
    sys.setprofile(counts.profile)
    try:
        return await body()
    finally:
        sys.setprofile(None)


async def _echo(request: dcp.HandlerRequest) -> Sequence[bytes]:
    return request.data


def count_worker(
    procs: Procs,
    endpoint: str,
    backend: str,
    window: int,
    concurrency: int,
    requests: int,
    cpu: bool = False,
    prefetch: int = 0,
) -> dict[str, float]:
    counts = Counts(cpu)

    async def run() -> int:
        worker = dcp.Worker(endpoint, "echo", _echo, concurrency=concurrency, prefetch=prefetch)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.serve)
            load = Load(16, window, 100, requests, 60.0)
            client = procs.start(
                "client", "benchmarks.dcp_peers", "client", "--endpoint", endpoint, *load.argv()
            )
            # Count only the measured phase: from the warm-up's end to the last reply. (Polls
            # of the counter: a few calls per 50 ms, noise next to the requests'.)
            total = load.warmup + requests
            while worker.statistics().replies < load.warmup:  # noqa: ASYNC110
                await anyio.sleep(0.05)
            n0 = worker.statistics().replies
            with _counting(counts):

                async def wait() -> int:
                    while worker.statistics().replies < total:  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                    return worker.statistics().replies - n0

                n: int = await _profiled(counts, wait)
            await anyio.to_thread.run_sync(client.result, 60.0)
            tg.cancel_scope.cancel()
        return n

    n = anyio.run(run, backend=backend)
    return {k: v / n for k, v in counts.c.items()}


def count_client(
    procs: Procs,
    endpoint: str,
    backend: str,
    window: int,
    concurrency: int,
    requests: int,
    cpu: bool = False,
    prefetch: int = 0,
) -> dict[str, float]:
    worker = procs.start(
        "worker",
        "benchmarks.dcp_peers",
        "workers",
        "--endpoint",
        endpoint,
        "--count",
        "1",
        "--concurrency",
        str(concurrency),
        "--prefetch",
        str(prefetch),
    )
    worker.wait_ready(START_TIMEOUT)
    counts = Counts(cpu)

    async def run() -> None:
        async with dcp.Client(endpoint, retries=0) as client:
            await client.request("echo", b"x" * 16)

            async def load() -> None:
                payloads = (b"x" * 16 for _ in range(requests))
                if window == 1:
                    for p in payloads:
                        await client.request("echo", p)
                else:
                    async for _ in client.map_unordered("echo", payloads, window=window):
                        pass

            with _counting(counts):
                await _profiled(counts, load)

    anyio.run(run, backend=backend)
    return {k: v / requests for k, v in counts.c.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stack_counts", description=__doc__)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=1, help="the worker's")
    parser.add_argument("--prefetch", type=int, default=0, help="the worker's (dcp.Worker)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--cpu", action="store_true", help="time the event loop thread's CPU, count no calls"
    )
    args = parser.parse_args(argv)
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="dcp-counts-") as tmp:
        for name, fn in (("worker", count_worker), ("client", count_client)):
            with Procs(Path(tmp)) as procs:
                endpoint, _, _ = start_broker(procs, "dcp")
                out[name] = fn(
                    procs,
                    endpoint,
                    args.backend,
                    args.window,
                    args.concurrency,
                    args.requests,
                    args.cpu,
                    args.prefetch,
                )
    print(
        f"per request ({args.backend}, window {args.window}, worker concurrency "
        f"{args.concurrency}, prefetch {args.prefetch}, {args.requests} requests):"
    )
    keys = sorted({k for d in out.values() for k in d})
    print("| count | " + " | ".join(out) + " |")
    print("|---|" + "---|" * len(out))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{d.get(k, 0.0):.2f}" for d in out.values()) + " |")


if __name__ == "__main__":
    main()
