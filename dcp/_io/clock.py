"""The running event loop, looked up once: which one it is, and its clock.

``anyio.current_time()`` finds the running backend on every call (sniffio, then anyio's
backend table: about six Python calls, several per request on the client's and the
worker's hot paths). :func:`loop_clock` does that lookup once and returns the backend's own
clock function, which gives the same values: ``trio.current_time`` on trio, the running
loop's ``time`` on asyncio, and ``anyio.current_time`` itself on anything else. The parts
that use the loop's own objects on their hot paths (the sockets' waits, the client's
events) ask :func:`running_loop` which loop that is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Literal

import anyio

__all__ = ["loop_clock", "running_loop"]


def running_loop() -> Literal["trio", "asyncio"] | None:
    """Which event loop runs in this thread (``None``: neither)."""
    # trio is imported only where it runs: a program on asyncio never loads it, and asyncio
    # is imported only when trio does not run.
    if "trio" in sys.modules:
        import trio

        if trio.lowlevel.in_trio_run():
            return "trio"
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    return "asyncio"


def loop_clock() -> Callable[[], float]:
    """The clock of the event loop running in this thread (call it from that loop)."""
    loop = running_loop()
    if loop == "trio":
        import trio

        return trio.current_time
    if loop == "asyncio":
        import asyncio

        return asyncio.get_running_loop().time
    return anyio.current_time  # pragma: no cover - anyio runs on trio or asyncio
