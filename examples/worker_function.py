"""A worker is a plain ``async def`` function.

Run it against a broker of your own::

    dcp broker --bind tcp://127.0.0.1:5555 &
    python examples/worker_function.py tcp://127.0.0.1:5555      # serves until Ctrl-C
    dcp call --connect tcp://127.0.0.1:5555 wordcount "to be or not to be"

(Ctrl-C or SIGTERM stops it gracefully: the requests in progress are answered first), or
with no argument, to start a broker in-process, call the service once and exit.
The same handler also runs under the CLI: ``dcp worker --connect EP --service wordcount
examples.worker_function:wordcount``.
"""

from __future__ import annotations

import signal
import sys
from collections import Counter

import anyio

import dcp


async def wordcount(request: dcp.HandlerRequest) -> bytes:
    """Count the words of the request's text; reply with JSON."""
    text = b" ".join(request.data).decode()
    counts = Counter(text.split())
    return dcp.json_reply(dict(counts.most_common()))


async def serve(endpoint: str) -> None:
    """Serve until Ctrl-C or SIGTERM, then stop gracefully (not with a KeyboardInterrupt)."""
    worker = dcp.Worker(endpoint, "wordcount", wordcount, concurrency=8)
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve)
            async for _ in signals:
                worker.stop()  # serve() returns once the requests in progress are answered
                break


async def main(endpoint: str | None) -> None:
    if endpoint is not None:
        await serve(endpoint)
        return
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(dcp.Broker("tcp://127.0.0.1:0").serve)
        await tg.start(dcp.Worker(endpoint, "wordcount", wordcount).serve)
        async with dcp.Client(endpoint) as client:
            reply = await client.request("wordcount", "to be or not to be")
        print(reply.json())
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else None)
