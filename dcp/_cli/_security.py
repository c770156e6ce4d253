"""The CURVE options of every ``dcp`` command, read into settings: the broker's
(``--keys``, ``--allow-client``, ``--allow-worker``) and a client's or worker's (``--keys``,
``--server-key``; ``docs/security.md``). A missing or bad key file is a user error
(:class:`~._run.CLIError`); a missing one is named with its option (``--keys K: no such
file``)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from dcp._cli._run import USAGE, CLIError

if TYPE_CHECKING:
    from dcp._io.security import CurveClient, CurveServer

__all__ = ["client_security", "server_security"]


def _exists(option: str, path: str, what: str = "file", given: str | None = None) -> None:
    """A missing ``path`` is named with its option and the value ``given`` (default: the
    path) where zmq would say ``Invalid certificate file``."""
    if not os.path.exists(path):
        raise CLIError(f"{option} {given or path}: no such {what}")


def server_security(args: argparse.Namespace) -> CurveServer | None:
    """The broker's CURVE settings from ``--keys``, ``--allow-client``, ``--allow-worker``."""
    from dcp._io.security import CurveServer

    if args.keys is None:
        if args.allow_client or args.allow_worker or args.allow_any_client:
            raise CLIError("--allow-client/--allow-worker need --keys", USAGE)
        return None
    workers: dict[str | bytes, list[str]] = {}
    for spec in args.allow_worker:
        service, sep, path = spec.partition("=")
        if not sep or not path:
            raise CLIError(f"--allow-worker takes SERVICE=PATH, not {spec!r}", USAGE)
        workers.setdefault(service, []).append(path)
    clients = None if args.allow_any_client else args.allow_client
    _exists("--keys", args.keys)
    for path in args.allow_client:
        _exists("--allow-client", path, "file or directory")
    for spec in args.allow_worker:
        path = spec.partition("=")[2]
        if path != "*":
            _exists("--allow-worker", path, "file or directory", given=spec)
    try:
        return CurveServer.from_files(args.keys, clients=clients, workers=workers)
    except (OSError, ValueError) as exc:
        raise CLIError(str(exc)) from None


def client_security(args: argparse.Namespace) -> CurveClient | None:
    """A client's or worker's CURVE settings from ``--keys`` and ``--server-key``."""
    from dcp._io.security import CurveClient

    if args.keys is None and args.server_key is None:
        return None
    if args.keys is None or args.server_key is None:
        raise CLIError("--keys and --server-key go together", USAGE)
    _exists("--keys", args.keys)
    _exists("--server-key", args.server_key)
    try:
        return CurveClient.from_files(args.keys, server=args.server_key)
    except (OSError, ValueError) as exc:
        raise CLIError(str(exc)) from None
