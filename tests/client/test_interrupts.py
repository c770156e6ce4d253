"""Ctrl-C in the middle of a client's cleanup (dcp._io.lifecycle Rule E6, issue 25 finding 11).

A second Ctrl-C landing in ``Client.__aexit__`` left trio reporting "Nursery stack corrupted"
(or a ``TrioInternalError``). These tests raise ``SIGINT`` at every traced line of the exit
in turn (trio's and anyio's code included), through the event loop's own signal handling
(``trio.run``, ``asyncio.run``), and check that each run ends with a plain
``KeyboardInterrupt`` and a closed client. Real zmq sockets; no broker is needed.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import warnings
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any

import pytest
import trio

from dcp import Client

#: An endpoint nobody listens at: the client connects in the background, for ever.
NOWHERE = "tcp://127.0.0.1:1"

Runner = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


def _trio(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    trio.run(main)


def _asyncio(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


RUNNERS = [pytest.param(_trio, id="trio"), pytest.param(_asyncio, id="asyncio")]


class Interrupter:
    """A trace function that raises ``SIGINT`` at the ``at``-th line run once armed
    (``at=0``: never), counting the lines."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.lines = 0
        #: Whether it raised ``SIGINT`` (a run may take fewer lines than the one counted).
        self.fired = False

    def __call__(self, frame: FrameType, event: str, arg: object) -> Interrupter:
        if event == "line":
            self.lines += 1
            if self.lines == self.at:
                self.fired = True
                signal.raise_signal(signal.SIGINT)
        return self


def _exit_interrupted(
    run: Runner, at: int
) -> tuple[BaseException | None, Client, Interrupter, int]:
    """Enter a client, then trace its exit and raise ``SIGINT`` at its ``at``-th line:
    what the run raised, the client, the tracer, and the lines the exit ran."""
    client = Client(NOWHERE, timeout=1)
    tracer = Interrupter(at)
    # The trace function in place (coverage's, under scripts/test) comes back afterwards:
    # leaving None would stop coverage measuring the rest of the run.
    previous = sys.gettrace()
    counted: list[int] = []

    async def main() -> None:
        async with client:
            sys.settrace(tracer)
        counted.append(tracer.lines)
        sys.settrace(previous)

    try:
        run(main)
    except BaseException as exc:  # what the run ended with is the result
        return exc, client, tracer, counted[0] if counted else tracer.lines
    finally:
        sys.settrace(previous)
    return None, client, tracer, counted[0]


@pytest.mark.parametrize("run", RUNNERS)
def test_ctrl_c_anywhere_in_the_client_exit_ends_cleanly(run: Runner) -> None:
    # The loop's own SIGINT handling is what is under test: trio and asyncio install theirs
    # only over Python's default handler.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    error, client, _, lines = _exit_interrupted(run, 0)  # count the exit's lines
    assert error is None and client.closed and lines > 0
    stride = max(1, lines // 200)  # every line of the first 400, then spread out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for at in [*range(1, min(lines, 400)), *range(400, lines, stride)]:
            error, client, tracer, _ = _exit_interrupted(run, at)
            if not tracer.fired:
                continue  # this run's exit took fewer lines
            assert client.closed, f"SIGINT at line {at} of {lines}: the client is still open"
            if error is None and run is _asyncio:
                # asyncio.Runner cancels the main task on a first SIGINT; one landing while
                # anyio delivers its own cancellation can be absorbed (the run ends normally).
                continue
            assert type(error) is KeyboardInterrupt, f"SIGINT at line {at} of {lines}: {error!r}"
        gc.collect()
    # A SIGINT landing in anyio's wrapper of a task that has not started yet (a task's root
    # frame, which trio never protects) leaves its coroutine never awaited: a RuntimeWarning,
    # harmless. A socket left open is not.
    leaks = [w.message for w in caught if not issubclass(w.category, RuntimeWarning)]
    assert not leaks
