"""The ``dcp`` command's run: parse the arguments, run the command, turn a user's mistake into
one line and an exit status (Rule CL1 of :mod:`._run`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from dcp._cli._parser import build_parser
from dcp._cli._run import INTERRUPTED, USAGE, CLIError, interrupted
from dcp._io.lifecycle import BaseExceptionGroup

__all__ = ["run"]


def _log_level(verbose: int) -> int:
    """The ``dcp.*`` loggers' level: WARNING, INFO with ``-v``, DEBUG with ``-vv``."""
    if verbose > 1:
        return logging.DEBUG
    return logging.INFO if verbose == 1 else logging.WARNING


def run(argv: Sequence[str] | None = None) -> int:
    """Run the ``dcp`` command with ``argv`` (default: ``sys.argv[1:]``); return its exit
    status (see ``dcp --help``)."""
    try:
        args = build_parser().parse_args(argv)
        # The global options may come before or after the command.
        args.backend = args.sub_backend or args.backend
        args.verbose += args.sub_verbose
        if getattr(args, "log_summary", None) is not None:
            args.verbose = max(args.verbose, 1)  # the summary is an INFO line: show it
        logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
        # The level goes on the dcp loggers only (other libraries stay at WARNING), for
        # this command's run only (main may be called again in the same process).
        dcp_logger = logging.getLogger("dcp")
        saved = dcp_logger.level
        dcp_logger.setLevel(_log_level(args.verbose))
        func: Callable[[argparse.Namespace], int] = args.func
        try:
            return func(args)
        finally:
            dcp_logger.setLevel(saved)
    except CLIError as exc:
        prog = f"dcp {args.command}"
        hint = f" (see '{prog} --help')" if exc.code == USAGE else ""
        print(f"{prog}: {exc.message}{hint}", file=sys.stderr, flush=True)
        return exc.code
    except KeyboardInterrupt:
        return INTERRUPTED
    except BaseExceptionGroup as group:
        if interrupted(group):
            return INTERRUPTED
        raise
