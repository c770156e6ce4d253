"""A broker embedded in a trio application, next to the app's own tasks.

Run: ``python examples/broker_trio.py``. It starts a broker and an ``upper`` worker in the
app's nursery, calls the service a few times, prints the replies and the broker's figures,
and shuts everything down by cancelling the nursery.
"""

from __future__ import annotations

import trio

import dcp


async def upper(request: dcp.HandlerRequest) -> bytes:
    return b" ".join(request.data).upper()


async def main() -> None:
    broker = dcp.Broker("tcp://127.0.0.1:0", "inproc://example-broker")
    async with trio.open_nursery() as nursery:
        tcp_endpoint, inproc_endpoint = await nursery.start(broker.serve)
        print("broker bound to", tcp_endpoint, "and", inproc_endpoint)
        await nursery.start(dcp.Worker(inproc_endpoint, "upper", upper).serve)
        async with dcp.Client(tcp_endpoint) as client:
            for word in (b"hello", b"trio", b"world"):
                reply = await client.request("upper", word)
                print(word.decode(), "->", reply.data[0].decode())
        stats = broker.statistics()
        print(f"requests={stats.requests} replies={stats.replies}")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
