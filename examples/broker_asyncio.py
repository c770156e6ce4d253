"""A broker embedded in an asyncio application.

Run: ``python examples/broker_asyncio.py``. The same as ``broker_trio.py``, on asyncio: anyio
task groups run on asyncio's event loop, so dcp fits into an existing asyncio program.
"""

from __future__ import annotations

import asyncio

import anyio

import dcp


async def reverse(request: dcp.HandlerRequest) -> bytes:
    await asyncio.sleep(0)  # plain asyncio code works inside handlers
    return request.data[0][::-1]


async def main() -> None:
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(dcp.Broker("tcp://127.0.0.1:0").serve)
        await tg.start(dcp.Worker(endpoint, "reverse", reverse, concurrency=4).serve)
        async with dcp.Client(endpoint) as client:
            replies = await asyncio.gather(
                *(client.request("reverse", word) for word in (b"asyncio", b"anyio", b"dcp"))
            )
            for reply in replies:
                print(reply.data[0].decode())
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    asyncio.run(main())
