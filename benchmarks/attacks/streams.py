"""Streams: two readers ask a streaming service for a window of 999,999,999 parts and never
read.

``python -m benchmarks.attacks.streams ENDPOINT`` is the streaming service (``dcp.Worker``,
an async generator of 1 MiB parts, without end); it prints ``READY`` once registered.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import anyio

import dcp

from ..common import ready
from .frames import request
from .harness import Attacker

__all__ = ["main", "run"]

#: The largest first credit a reader may ask for (``dcp.wire.streams.MAX_CREDIT``).
WINDOW = b"\xffDCP:stream=999999999"


def run(a: Attacker) -> None:
    a.start("streamer", "benchmarks.attacks.streams", a.endpoint)
    for _ in range(2):
        reader = a.socket(rcvhwm=1)
        a.send(reader, request(b"stream", b"", metadata=[b"\xffDCP:id=r", WINDOW]))
    a.hold(a.size(20, 1))


async def _parts(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
    part = b"s" * (1024 * 1024)
    while True:
        yield part


def main() -> None:
    async def serve() -> None:
        async with dcp.Worker(sys.argv[1], "stream", _parts):
            ready()
            await anyio.sleep_forever()

    anyio.run(serve)


if __name__ == "__main__":
    main()
