"""Publish/subscribe through the broker: wildcards, a queue group, a gap notice.

Run: ``python examples/pubsub.py`` (starts its own broker on a free port).
"""

from __future__ import annotations

import anyio

import dcp


async def main() -> None:
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(dcp.Broker("tcp://127.0.0.1:0").serve)
        async with dcp.Client(endpoint) as client:
            async with (
                client.subscribe("orders.>") as everything,
                client.subscribe("orders.*.paid", queue="billing") as billing_a,
                client.subscribe("orders.*.paid", queue="billing") as billing_b,
            ):
                n = await client.publish("orders.eu.paid", b"order 1", ack=True)
                print(f"orders.eu.paid went to {n} subscriptions")
                await client.publish("orders.us.new", b"order 2")
                async for msg in everything:
                    print(f"everything: {msg.subject} {msg.data[0].decode()}")
                    if msg.subject == "orders.us.new":
                        break
                with anyio.move_on_after(0.2):
                    async for msg in billing_a:
                        print("billing a:", msg.data[0].decode())
                with anyio.move_on_after(0.2):
                    async for msg in billing_b:
                        print("billing b:", msg.data[0].decode())
            # A subscriber that does not keep up: its broker buffer holds 10 messages.
            async with client.subscribe("ticks", max_pending=10, window=5) as slow:
                for i in range(100):
                    await client.publish("ticks", b"%d" % i)
                await client.publish("ticks", b"last", ack=True)
                async for msg in slow:
                    if msg.gap:
                        print(f"lost {msg.gap} ticks before tick {msg.data[0].decode()}")
                    if msg.data[0] == b"last":
                        break
                print(f"total lost: {slow.lost}")
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
