"""A forwarding DAG of three services: ``parse`` -> ``enrich`` -> ``render``.

Run: ``python examples/dag.py``. The client asks ``parse`` only. Each of the first two
services does its part and *forwards* the request (``return dcp.Forward(...)``); the broker
keeps the original client's address on it, so ``render``'s reply goes straight to the client.
No worker waits for another: each is free again as soon as it has forwarded.
"""

from __future__ import annotations

import json

import anyio

import dcp

PRICES = {"apple": 0.5, "pear": 0.75, "plum": 0.2}


async def parse(request: dcp.HandlerRequest) -> dcp.Forward:
    """``b"3 apple"`` -> ``{"n": 3, "item": "apple"}``."""
    n, item = request.data[0].decode().split()
    return dcp.Forward("enrich", json.dumps({"n": int(n), "item": item}).encode())


async def enrich(request: dcp.HandlerRequest) -> dcp.Forward:
    """Add the unit price and the total."""
    order = json.loads(request.data[0])
    order["total"] = round(order["n"] * PRICES[order["item"]], 2)
    return dcp.Forward("render", json.dumps(order).encode())


async def render(request: dcp.HandlerRequest) -> bytes:
    """Format the final line; this reply goes to the client that called ``parse``."""
    order = json.loads(request.data[0])
    return f"{order['n']} x {order['item']} = {order['total']:.2f}".encode()


async def main() -> None:
    async with anyio.create_task_group() as tg:
        broker = dcp.Broker("tcp://127.0.0.1:0")
        [endpoint] = await tg.start(broker.serve)
        for name, handler in (("parse", parse), ("enrich", enrich), ("render", render)):
            await tg.start(dcp.Worker(endpoint, name, handler, concurrency=4).serve)
        async with dcp.Client(endpoint) as client:
            orders = [b"3 apple", b"2 pear", b"10 plum"]
            async for reply in client.map("parse", orders, window=8):
                print(reply.data[0].decode())
        print("forwards seen by the broker:", broker.statistics().forwards)
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
