"""``dcp worker``: serve services with handler functions named ``MODULE:FUNC``, and say what
it does.

Rules:

Rule CW1 - A handler that cannot be used is a usage error (exit status 2, one line, never a
   traceback): a ``MODULE:FUNC`` that is malformed, a module that cannot be imported
   (whatever it raised, named with its type and where), a name the module lacks, and a
   handler the worker refuses (:mod:`dcp._worker.services` Rule WV1).
Rule CW2 - At default verbosity it prints one line on stderr once the broker has echoed the
   registration (the services, the broker endpoint, the concurrency, the prefetch if any;
   with several ``--connect``, once the first broker has, naming every endpoint), and one
   when the first SIGINT or SIGTERM begins the graceful stop (how many requests it is finishing,
   within how long, and that the signal again forces it). A signal that comes before the
   broker has echoed the registration (a wrong endpoint, a broker not started yet) stops it
   at once, nothing being in progress: it says so, and exits as after a stop (130 after
   SIGINT, 0 after SIGTERM), never with a traceback. ``-v`` adds the library's INFO lines on
   ``dcp.worker``; its warnings show at every verbosity: among them, at once, a connection
   refused at the endpoint (nothing listens there; the worker keeps trying, Rule WC8 of
   :mod:`dcp._worker.connection`).
Rule CW3 - ``--ready-file PATH``: a stale file is removed at start; the file is written
   (atomically: a temporary file renamed) once the broker has echoed the registration, and
   removed when the command exits, however it exits (but SIGKILL). It holds one JSON object:
   ``pid``, ``endpoint`` (the first broker's) and ``services``; with several brokers also
   ``endpoints``, all of them.
Rule CW4 - ``--connect`` given several times, or with a comma-separated value, serves every
   broker named (:class:`dcp.Worker` given a list; docs/scaling.md); one endpoint is
   exactly today's worker.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from dcp._cli._run import USAGE, CLIError, beacon_errors, exit_code, run_async, until_signal
from dcp._cli._security import client_security
from dcp._cli._services import worker_services
from dcp._io.errors import endpoint_errors

__all__ = ["ReadyFile", "cmd_worker", "load_handler"]

logger = logging.getLogger("dcp.cli")


def _where(exc: BaseException) -> str:
    """`` (at FILE:LINE)``: where a ``SyntaxError`` is (its traceback ends in importlib), or
    the innermost frame of ``exc``'s traceback, if any."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno})"


def load_handler(spec: str) -> Any:
    """Import ``MODULE:FUNC`` (the module is looked up on ``sys.path`` and the cwd; ``FUNC``
    may be dotted, ``Class.method``). Rule CW1: every failure is a :class:`CLIError` with
    exit status 2."""
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"handler must be module:function, not {spec!r}", USAGE)
    if module_name.startswith("."):
        raise CLIError(
            f"handler {spec!r}: the module must be an absolute name (e.g. mypackage.handlers), "
            "not a relative one",
            USAGE,
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise CLIError(f"cannot load handler {spec!r}: {exc}", USAGE) from None
    except Exception as exc:  # the module's own code failed: say what, and where
        raise CLIError(
            f"cannot load handler {spec!r}: importing {module_name} raised "
            f"{type(exc).__name__}: {exc.msg if isinstance(exc, SyntaxError) else exc}"
            f"{_where(exc)}",
            USAGE,
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise CLIError(f"cannot load handler {spec!r}: {exc}", USAGE) from None
    if not callable(obj):
        raise CLIError(f"{spec!r} is not callable", USAGE)
    return obj


class ReadyFile:
    """``--ready-file PATH`` (Rule CW3).

    :param path: where to write it (``None``: nothing to do)
    :raises CLIError: ``path``'s directory does not exist (a usage error)
    """

    def __init__(self, path: str | None) -> None:
        self._path = None if path is None else Path(path)
        if self._path is None:
            return
        if not self._path.parent.is_dir():
            raise CLIError(f"--ready-file {path}: no directory {str(self._path.parent)!r}", USAGE)
        self._path.unlink(missing_ok=True)  # stale: a supervisor must not see it

    def write(self, endpoints: Sequence[str], services: Sequence[str]) -> None:
        """Write the file, atomically.

        :raises CLIError: it cannot be written
        """
        if self._path is None:
            return
        doc: dict[str, object] = {
            "pid": os.getpid(),
            "endpoint": endpoints[0],
            "services": list(services),
        }
        if len(endpoints) > 1:
            doc["endpoints"] = list(endpoints)
        temporary = self._path.with_name(f".{self._path.name}.{os.getpid()}")
        try:
            temporary.write_text(json.dumps(doc) + "\n")
            temporary.replace(self._path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise CLIError(f"cannot write --ready-file {self._path}: {exc.strerror}") from None

    def remove(self) -> None:
        """Remove the file if it is there."""
        if self._path is not None:
            self._path.unlink(missing_ok=True)


def _say(line: str) -> None:
    """Rule CW2: one line on stderr."""
    print(f"dcp worker: {line}", file=sys.stderr, flush=True)


def cmd_worker(args: argparse.Namespace) -> int:
    from dcp._errors import AuthenticationFailed, RegistrationRefused
    from dcp._worker.services import Service, handler_problem
    from dcp._worker.worker import Worker

    served = worker_services(args.service, args.handler, load_handler)
    try:
        if isinstance(served, dict):
            one: tuple[str | None, Any] = (None, None)
            for name, handler in served.items():
                problem = handler_problem(handler)  # Rule CW1: named as the Worker names it
                if problem is not None:
                    raise CLIError(f"service {name!r}: {problem}", USAGE)
            several = {k: Service(h, concurrency=args.concurrency) for k, h in served.items()}
        else:
            one, several = served, None
        worker = Worker(
            args.connect[0] if len(args.connect) == 1 else args.connect,
            one[0],
            one[1],
            services=several,
            concurrency=args.concurrency,
            heartbeat_interval=args.heartbeat_interval,
            liveness=args.liveness,
            security=client_security(args),
            type_width=args.type_width,
            prefetch=args.prefetch,
        )
    except (TypeError, ValueError) as exc:
        raise CLIError(str(exc), USAGE) from None
    ready = ReadyFile(args.ready_file)

    names = ", ".join(repr(name) for name in worker.services)
    each = " each" if len(worker.services) > 1 else ""
    if args.prefetch:
        each += f", prefetch {args.prefetch}"

    # Rule CW2: a signal before the registration stops the worker; serve() then reports
    # readiness as it returns, and this says nothing more.
    early = started = False

    async def run() -> None:
        nonlocal started
        logger.info("worker for %s connecting to %s", names, ", ".join(args.connect))
        async with anyio.create_task_group() as tg:
            await tg.start(worker.serve)
            if early:
                return
            started = True
            at = ", ".join(worker.endpoints)
            _say(f"serving {names} at {at} (concurrency {args.concurrency}{each})")
            ready.write(worker.endpoints, worker.services)

    def stop(sig: signal.Signals) -> None:
        nonlocal early
        if not started:
            early = True
            worker.stop(grace=args.grace)
            _say(f"{sig.name}: stopping (the broker has not confirmed the registration yet)")
            return
        running = worker.statistics().in_progress
        worker.stop(grace=args.grace)
        again = "Ctrl-C" if sig is signal.SIGINT else sig.name
        if running:
            _say(
                f"{sig.name}: stopping; finishing {running} request(s), for at most "
                f"{args.grace:g} s ({again} again to force)"
            )
        else:
            _say(f"{sig.name}: stopping (no request in progress)")

    try:
        with endpoint_errors("connect to", args.connect, CLIError), beacon_errors(args.connect):
            received = run_async(args.backend, until_signal, run, stop)
    except (RegistrationRefused, AuthenticationFailed) as exc:
        raise CLIError(f"{type(exc).__name__}: {exc}", 3) from None
    finally:
        ready.remove()
    logger.info("worker stopped: %s", worker.statistics())
    return exit_code(received)
