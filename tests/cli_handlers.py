"""Handlers for the ``dcp worker`` subprocesses of :mod:`tests.test_cli`."""

from __future__ import annotations

import dcp


async def echo(request: dcp.Request) -> list[bytes]:
    """Reply with the request's data parts, upper-cased, in order."""
    return [part.upper() for part in request.data]


#: Not a handler: ``dcp worker`` must refuse it.
not_callable = 42
