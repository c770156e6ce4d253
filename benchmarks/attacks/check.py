"""Is a legitimate peer refused? Run against the broker once the attacker is gone.

``python -m benchmarks.attacks.check ENDPOINT [--timeout S]`` tries, with dcp's own client
and worker (asyncio, all at once), what a user would do, and prints one JSON object: each
check's name and ``null`` if it worked, else why not:

- ``subscribe``: a fresh ``Client.subscribe`` receives a message published to it;
- ``service``: a fresh service registered (``dcp.Worker``) and called;
- ``wait``: a call with ``wait_for_worker`` (``dcp call --wait``) to a service whose worker
  starts half a second later;
- ``mc0_sub``: an mc0 peer's ``SUB`` with an ``ID`` is answered ``OK``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.abc
import anyio.to_thread
import zmq

import dcp

from .frames import mc0

__all__ = ["main"]


def _why(exc: BaseException) -> str:
    inner: tuple[BaseException, ...] = getattr(exc, "exceptions", ())
    while len(inner) == 1:  # an exception group of one: say what it holds
        exc = inner[0]
        inner = getattr(exc, "exceptions", ())
    return f"{type(exc).__name__}: {exc}"[:200]


async def _subscribe(endpoint: str, tag: str, limit: float) -> None:
    subject = f"attacks.check.{tag}"
    async with dcp.Client(endpoint, timeout=limit) as client, client.subscribe(subject) as sub:
        await client.publish(subject, b"hello", ack=True)
        async for msg in sub:
            assert msg.data[-1] == b"hello", msg
            return


async def _echo(request: dcp.HandlerRequest) -> bytes:
    return request.data[0] if request.data else b""


async def _service(endpoint: str, tag: str, limit: float) -> None:
    name = f"fresh-{tag}"
    async with dcp.Client(endpoint, timeout=limit) as client, dcp.Worker(endpoint, name, _echo):
        response = await client.request(name, b"hi")
        assert tuple(response.data) == (b"hi",), response


async def _wait(endpoint: str, tag: str, limit: float) -> None:
    name = f"late-{tag}"
    async with dcp.Client(endpoint, timeout=limit) as client, anyio.create_task_group() as tg:

        async def late_worker(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            task_status.started()
            await anyio.sleep(0.5)
            async with dcp.Worker(endpoint, name, _echo):
                await anyio.sleep_forever()

        await tg.start(late_worker)
        response = await client.request(name, b"hi", wait_for_worker=True)
        assert tuple(response.data) == (b"hi",), response
        tg.cancel_scope.cancel()


async def _mc0_sub(endpoint: str, tag: str, limit: float) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(mc0(b"SUB", [(b"ID", b"1")], f"attacks.mc0.{tag}".encode()))
        if not await anyio.to_thread.run_sync(sock.poll, int(limit * 1000)):
            raise TimeoutError(f"no answer to SUB in {limit} s")
        frames = sock.recv_multipart()
        if frames[0] != b"OK":
            raise RuntimeError(repr([f[:80] for f in frames]))
    finally:
        sock.close(0)


CHECKS: dict[str, Callable[[str, str, float], Awaitable[None]]] = {
    "subscribe": _subscribe,
    "service": _service,
    "wait": _wait,
    "mc0_sub": _mc0_sub,
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attacks.check")
    parser.add_argument("endpoint")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    tag = f"{os.getpid()}"
    results: dict[str, str | None] = {}

    async def one(name: str, check: Callable[[str, str, float], Awaitable[None]]) -> None:
        try:
            with anyio.fail_after(args.timeout + 1):
                await check(args.endpoint, tag, args.timeout)
        except Exception as exc:  # the report says what it was
            results[name] = _why(exc)
        else:
            results[name] = None

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            for name, check in CHECKS.items():
                tg.start_soon(one, name, check)

    anyio.run(run)
    results = {name: results[name] for name in CHECKS}
    sys.stdout.write(json.dumps(results) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
