"""``dcp broker --http HOST:PORT [--http-token TOKEN | --http-token-file FILE] [--http-public]
[--http-host NAME]...`` (the broker's HTTP endpoint, ``docs/operations.md``)."""

from __future__ import annotations

import argparse
from typing import Any

from dcp._cli._docs import doc_url
from dcp._cli._run import USAGE, CLIError

__all__ = ["add_broker_http", "broker_http"]


def add_broker_http(p: argparse.ArgumentParser) -> None:
    """The HTTP endpoint's options of ``dcp broker``."""
    g = p.add_argument_group(
        "HTTP endpoint: /metrics, /status, a live page",
        f"(see {doc_url('operations')})",
    )
    g.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve HTTP there, e.g. 127.0.0.1:8222 (port 0: a free one; its URL is printed "
        "after the endpoints); loopback only unless --http-public. Needs the http extra",
    )
    tokens = g.add_mutually_exclusive_group()
    tokens.add_argument(
        "--http-token", metavar="TOKEN", help="every request needs 'Authorization: Bearer TOKEN'"
    )
    tokens.add_argument(
        "--http-token-file",
        metavar="FILE",
        help="as --http-token, the token read from FILE (not shown by ps)",
    )
    g.add_argument(
        "--http-public",
        action="store_true",
        help="allow a --http host that is not a loopback address",
    )
    g.add_argument(
        "--http-host",
        metavar="NAME[:PORT]",
        action="append",
        default=[],
        help="a further name HTTP requests may give in their Host header (repeatable; "
        "besides the bound address, its IP, and localhost for loopback): others get 421",
    )


def broker_http(args: argparse.Namespace) -> dict[str, Any]:
    """The ``Broker`` keyword arguments for the HTTP options (none without ``--http``)."""
    if args.http is None:
        if args.http_token or args.http_token_file or args.http_public or args.http_host:
            raise CLIError(
                "--http-token, --http-token-file, --http-public and --http-host need --http",
                USAGE,
            )
        return {}
    token = args.http_token
    if args.http_token_file is not None:
        try:
            with open(args.http_token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"cannot read --http-token-file: {exc}", USAGE) from None
        if not token:
            raise CLIError(f"--http-token-file {args.http_token_file} is empty", USAGE)
    return {
        "http": args.http,
        "http_token": token,
        "http_public": args.http_public,
        "http_hosts": args.http_host,
    }
