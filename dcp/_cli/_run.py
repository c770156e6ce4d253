"""What every ``dcp`` command shares at run time: user errors as one line, signals, exit
codes, and exception groups unwrapped at the edge of the command line (what zmq's errors
become is :mod:`dcp._io.errors`'s: a failed bind or connect is one line there, Rule Z3).

Rules:

Rule CR1 - A user error (a bad argument, a port in use, a missing key file, an error reply) is a
   :class:`CLIError`: one line ``dcp COMMAND: message`` on stderr and its exit code, never a
   traceback. Code 2 is for mistakes visible in the command line itself (usage errors), 1 for
   the rest.
Rule CR2 - SIGINT (Ctrl-C) and SIGTERM stop a command through :func:`until_signal`, which reports
   the signal; a command stopped by SIGINT exits with 130 and prints nothing more. A command
   that stops gracefully (``dcp worker``) is told the first signal and says what it is
   finishing; a second one cancels at once.
Rule CR3 - An ``ExceptionGroup`` around one real error is unwrapped (:func:`run_async`), so Rule
   CR1 sees the error itself.
Rule CR4 - A ``beacon://`` endpoint that hears no beacon in time, or whose UDP port cannot be
   listened on, is a user error of every command that takes one (:func:`beacon_errors`), as
   in ``dcp find``: one line, exit status 1.
Rule CR5 - A one-shot command (``dcp call``, ``dcp services``, ``dcp pub``, ``dcp top --once``:
   one request, then exit; ``dcp._cli._top`` Rule TP8) does not wait for a broker that is not
   there: its client has ``wait_for_broker=False``, so a refused connection is one line
   within half a second (:exc:`~dcp.BrokerUnreachable`), with that command's exit status for
   a timeout. ``--wait-for-broker`` (:func:`add_wait_for_broker`) waits for one within
   ``--timeout``, as a script started beside its broker needs; ``dcp call --wait`` does too.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

import anyio

from dcp._io.lifecycle import BaseExceptionGroup, single_error

__all__ = [
    "INTERRUPTED",
    "USAGE",
    "CLIError",
    "add_wait_for_broker",
    "beacon_errors",
    "exit_code",
    "interrupted",
    "run_async",
    "until_signal",
]

logger = logging.getLogger("dcp.cli")

T = TypeVar("T")

#: Exit code of a usage error (argparse's).
USAGE = 2
#: Exit code after SIGINT (128 + 2, as a shell reports a process killed by it).
INTERRUPTED = 128 + signal.SIGINT


def add_wait_for_broker(p: argparse.ArgumentParser) -> None:
    """Rule CR5: the ``--wait-for-broker`` flag of a one-shot command."""
    p.add_argument(
        "--wait-for-broker",
        action="store_true",
        help="wait (within --timeout) for a broker that is not listening yet (default: fail "
        "within 0.5 s when the connection is refused)",
    )


class CLIError(Exception):
    """A user error: printed as one line ``dcp COMMAND: message``, then exit with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


async def until_signal(
    run: Callable[[], Awaitable[object]],
    on_signal: Callable[[signal.Signals], object] | None = None,
) -> signal.Signals | None:
    """Run ``run()`` until it returns or SIGINT/SIGTERM arrives; return the first signal
    received, or ``None``.

    With ``on_signal``, the first signal is given to it (a graceful stop that makes ``run()``
    return; it says so) and a second one cancels; without, the first signal cancels.
    """
    received: signal.Signals | None = None
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal received
            graceful = on_signal
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    sig = signal.Signals(signum)
                    if received is None:
                        received = sig
                    if graceful is not None:
                        graceful(sig)
                        graceful = None
                        continue
                    logger.info("received %s, stopping", sig.name)
                    tg.cancel_scope.cancel()
                    return

        async def body() -> None:
            await run()
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(body)
    return received


def run_async(backend: str, func: Callable[..., Awaitable[T]], *args: object) -> T:
    """``anyio.run(func, *args)`` on ``backend``, with one real error unwrapped from its
    exception group (Rule CR3)."""
    try:
        return anyio.run(func, *args, backend=backend)
    except BaseExceptionGroup as group:
        exc = single_error(group)
        if exc is group:
            raise
        raise exc from None


@contextlib.contextmanager
def beacon_errors(endpoints: Sequence[str]) -> Iterator[None]:
    """Rule CR4: with a ``beacon://`` endpoint among ``endpoints``, the block's failure to
    hear one (``TimeoutError``, not a :exc:`dcp.RequestTimeout`) or to listen (``OSError``)
    is raised again as a :class:`CLIError`."""
    from dcp._errors import DCPError
    from dcp._io.beacon import BEACON_SCHEME

    if not any(endpoint.startswith(BEACON_SCHEME) for endpoint in endpoints):
        yield
        return
    try:
        yield
    except DCPError:
        raise
    except TimeoutError as exc:  # dcp._io.beacon.resolve: nothing heard
        raise CLIError(str(exc)) from None
    except OSError as exc:  # the beacon's UDP port
        raise CLIError(f"cannot listen for a beacon: {exc.strerror or exc}") from None


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``KeyboardInterrupt``, alone or in (nested) groups."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(KeyboardInterrupt)
        return rest is None
    return isinstance(exc, KeyboardInterrupt)


def exit_code(received: signal.Signals | None) -> int:
    """A server's exit code after :func:`until_signal`: 130 after SIGINT, else 0 (a SIGTERM
    stop, or the end of the work)."""
    return INTERRUPTED if received is signal.SIGINT else 0
