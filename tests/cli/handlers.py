"""Handlers for the ``dcp worker`` subprocesses of :mod:`tests.cli.test_commands`."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator

import anyio

import dcp


async def echo(request: dcp.HandlerRequest) -> list[bytes]:
    """Reply with the request's data parts, upper-cased, in order."""
    return [part.upper() for part in request.data]


async def slow(request: dcp.HandlerRequest) -> bytes:
    """Take ``request.data[0]`` seconds, then reply ``done``."""
    await anyio.sleep(float(request.data[0]))
    return b"done"


async def slow_announced(request: dcp.HandlerRequest) -> bytes:
    """:func:`slow`, after a ``handling`` line on stderr (a test waits for it)."""
    print("handling", file=sys.stderr, flush=True)
    return await slow(request)


#: Not a handler: ``dcp worker`` must refuse it.
not_callable = 42


async def trickle(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
    """A stream: ``request.data[0]`` parts, ``part <i>``, one every 0.2 s."""
    for i in range(int(request.data[0])):
        if i:
            await anyio.sleep(0.2)
        yield b"part %d" % i


async def boom(request: dcp.HandlerRequest) -> bytes:
    """Fail: an error reply (``handler_error``)."""
    raise ValueError(f"cannot do {request.text!r}")


#: Not handlers that ``dcp worker`` accepts (issue 25, finding 5): a plain ``def`` generator
#: and an ``async def`` without the request parameter.
def gen(request: dcp.HandlerRequest) -> Iterator[bytes]:
    yield request.bytes


async def no_parameter() -> bytes:
    return b""
