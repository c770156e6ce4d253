"""The running event loop's clock, looked up once.

``anyio.current_time()`` finds the running backend on every call (sniffio, then anyio's
backend table: about six Python calls, several per request on the client's and the
worker's hot paths). :func:`loop_clock` does that lookup once and returns the backend's own
clock function, which gives the same values: ``trio.current_time`` on trio, the running
loop's ``time`` on asyncio, and ``anyio.current_time`` itself on anything else.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import anyio

__all__ = ["loop_clock"]


def loop_clock() -> Callable[[], float]:
    """The clock of the event loop running in this thread (call it from that loop)."""
    # trio is imported only where it runs: a program on asyncio never loads it.
    if "trio" in sys.modules:
        import trio

        if trio.lowlevel.in_trio_run():
            return trio.current_time
    import asyncio

    try:
        return asyncio.get_running_loop().time
    except RuntimeError:  # pragma: no cover - anyio runs on trio or asyncio
        return anyio.current_time
