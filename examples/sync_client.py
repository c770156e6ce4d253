"""Call a service from plain synchronous code: no event loop in the caller.

Run: ``python examples/sync_client.py [ENDPOINT]``. Without an endpoint it starts a broker
and a ``square`` worker on an event loop in a background thread (they need one; the caller
does not), then uses :class:`dcp.SyncClient` from the main thread.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import anyio.from_thread

import dcp


async def square(request: dcp.HandlerRequest) -> bytes:
    return str(int(request.data[0]) ** 2).encode()


@contextlib.contextmanager
def service_in_background() -> Iterator[str]:
    """A broker and a worker on an event loop in another thread, for the demo's sake."""
    with anyio.from_thread.start_blocking_portal() as portal:
        _, endpoints = portal.start_task(dcp.Broker("tcp://127.0.0.1:0").serve)
        portal.start_task(dcp.Worker(endpoints[0], "square", square).serve)
        try:
            yield endpoints[0]
        finally:
            portal.call(portal.stop, True)  # cancel the broker and the worker


def run(endpoint: str) -> None:
    with dcp.SyncClient(endpoint, timeout=5.0) as client:
        print("7 squared is", client.request("square", "7").text)
        payloads = [str(i) for i in range(10)]  # str parts are sent as UTF-8
        print("squares:", [int(r.text) for r in client.map("square", payloads)])


def main() -> None:
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        with service_in_background() as endpoint:
            run(endpoint)


if __name__ == "__main__":
    main()
