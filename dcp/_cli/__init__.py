"""The ``dcp`` command line: ``dcp broker``, ``dcp worker``, ``dcp call``, ``dcp demo``,
``dcp keys``.

Layout: :mod:`._main` (the run: parse, dispatch, one-line errors), :mod:`._parser`
(arguments, checked as they are parsed), :mod:`._commands`, :mod:`._worker` and
:mod:`._call` (one ``cmd_*`` function per command), :mod:`._security` (the CURVE options read
into settings), :mod:`._run` (one-line user errors, signals, exit codes; its rules are at its
top). This module imports none of them until a command needs them: ``dcp --version`` is
answered before (issue 25, finding 9: it loads no part of the command, nor anyio or zmq).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dcp`` command; returns its exit status (see ``dcp --help``)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        from dcp._version import DISTRIBUTION, __version__

        print(f"dcp ({DISTRIBUTION}) {__version__}")  # as argparse's version action says it
        return 0
    from dcp._cli._main import run

    return run(argv)
