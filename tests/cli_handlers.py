"""Handlers for the ``dcp worker`` subprocesses of :mod:`tests.test_cli`."""

from __future__ import annotations

import anyio

import dcp


async def echo(request: dcp.Request) -> list[bytes]:
    """Reply with the request's data parts, upper-cased, in order."""
    return [part.upper() for part in request.data]


async def slow(request: dcp.Request) -> bytes:
    """Take ``request.data[0]`` seconds, then reply ``done``."""
    await anyio.sleep(float(request.data[0]))
    return b"done"


#: Not a handler: ``dcp worker`` must refuse it.
not_callable = 42
