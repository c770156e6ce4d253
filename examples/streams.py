"""A stream: a worker sends its answer part by part, the client reads the parts as they
come, and leaving early stops the worker (``docs/streams.md``).

Run: ``python examples/streams.py``. It starts a broker, a ``countdown`` worker whose
handler is an async generator, and reads three streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio

import dcp

#: Set when a stream's generator has finished (its ``finally`` ran), by request data.
finished: dict[bytes, anyio.Event] = {}


async def countdown(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
    """Each ``yield`` is one part; returning ends the stream."""
    try:
        for n in range(int(request.data[0]), 0, -1):
            yield b"%d" % n  # waits here while the reader has no credit left
        yield b"liftoff"
    finally:
        # This runs also when the reader leaves early.
        finished.setdefault(request.data[0], anyio.Event()).set()


async def main() -> None:
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(dcp.Broker("tcp://127.0.0.1:0").serve)
        async with (
            dcp.Worker(endpoint, "countdown", countdown),
            dcp.Client(endpoint, timeout=10) as client,
        ):
            # Every part, in order.
            async with client.stream("countdown", b"3") as parts:
                print("parts:", [part[0].decode() async for part in parts])
            # A plain request gets the whole answer at once.
            reply = await client.request("countdown", b"2")
            print("request:", [p.decode() for p in reply.data])
            # Leaving early cancels the stream: the generator's finally runs.
            async with client.stream("countdown", b"1000000", window=8) as parts:
                async for part in parts:
                    if part == (b"999998",):
                        break
            with anyio.fail_after(1):  # the cancel reaches the worker at once
                await finished.setdefault(b"1000000", anyio.Event()).wait()
            print("stopped early: the worker's generator was closed")
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
