"""``dcp services`` (the broker's list of services), ``dcp find`` (a broker's beacon), the
broker's ``--beacon`` options and the worker's several ``--service NAME MODULE:FUNC`` pairs
(``docs/services.md``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dcp._cli._docs import doc_url
from dcp._cli._run import USAGE, CLIError, add_wait_for_broker, beacon_errors, run_async

__all__ = [
    "add_broker_beacon",
    "add_commands",
    "cmd_find",
    "cmd_services",
    "render_table",
    "worker_services",
]

_COLUMNS = ("name", "workers", "idle", "busy", "queued", "version", "description")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a UDP port, not {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, not {value}")
    return value


def add_broker_beacon(p: argparse.ArgumentParser) -> None:
    """``dcp broker --beacon PORT [--beacon-address ADDR]``."""
    g = p.add_argument_group(f"beacon ({doc_url('services')})")
    g.add_argument(
        "--beacon",
        type=_port,
        metavar="PORT",
        help="announce the broker (its first tcp:// endpoint's port, and its CURVE key) on "
        "this UDP port every second",
    )
    g.add_argument(
        "--beacon-address",
        default="255.255.255.255",
        metavar="ADDR",
        help="where beacons go",
    )


def add_commands(
    command: Callable[..., argparse.ArgumentParser],
    connect: Callable[[str], list[str]],
    seconds: Callable[[str], float],
    security: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``dcp services`` and ``dcp find`` (``command`` makes a subcommand's parser)."""
    p = command(
        "services",
        help="list the services a broker knows",
        description="Ask the broker (mmi.services) and print a table: each service's\n"
        "workers (idle, busy), queued requests, version and description.",
    )
    p.add_argument(
        "--connect",
        required=True,
        action="extend",
        type=connect,
        metavar="ENDPOINT",
        help="broker endpoint, e.g. tcp://127.0.0.1:5555; several times (or a "
        "comma-separated list): every broker's services, merged",
    )
    p.add_argument(
        "--timeout", type=seconds, default=5.0, metavar="SECONDS", help="seconds to wait"
    )
    p.add_argument("--json", action="store_true", help="print one JSON list instead")
    add_wait_for_broker(p)
    security(p)
    p.set_defaults(func=cmd_services)

    p = command(
        "find",
        help="print the endpoint of the first broker beacon heard",
        description="Listen for a broker's beacon (dcp broker --beacon PORT) and print its\n"
        "endpoint. A beacon is a hint: anyone on the network can send one.",
    )
    p.add_argument("--beacon", type=_port, required=True, metavar="PORT", help="UDP port")
    p.add_argument(
        "--host", default="", metavar="ADDR", help="address to listen on (default: every one)"
    )
    p.add_argument(
        "--timeout", type=seconds, default=5.0, metavar="SECONDS", help="seconds to wait"
    )
    p.set_defaults(func=cmd_find)


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The services as an aligned text table (header first)."""
    cells = [list(_COLUMNS)] + [[str(row.get(c, "")) for c in _COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
        for r in cells
    )


def cmd_services(args: argparse.Namespace) -> int:
    from dcp._cli._security import client_security
    from dcp._client.client import Client
    from dcp._errors import DCPError

    security = client_security(args)
    rows: list[dict[str, Any]] = []

    async def run() -> None:
        async with Client(
            args.connect,
            security=security,
            timeout=args.timeout,
            wait_for_broker=args.wait_for_broker,  # dcp._cli._run Rule CR5
        ) as client:
            rows.extend({c: getattr(s, c) for c in _COLUMNS} for s in await client.services())

    try:
        with beacon_errors(args.connect):
            run_async(args.backend, run)
    except (DCPError, RuntimeError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        print(json.dumps(rows, ensure_ascii=False))
    else:
        print(render_table(rows))
    return 0


def cmd_find(args: argparse.Namespace) -> int:
    from dcp._io.beacon import find_broker

    found: list[str] = []

    async def run() -> None:
        found.append(await find_broker(args.beacon, host=args.host, timeout=args.timeout))

    try:
        run_async(args.backend, run)
    except TimeoutError as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"cannot listen on UDP port {args.beacon}: {exc}") from None
    print(found[0])
    return 0


def worker_services(
    specs: list[list[str]], handler: str | None, load: Callable[[str], Any]
) -> tuple[str, Any] | dict[str, Any]:
    """The worker's ``--service`` options: one ``(name, handler)`` (``--service NAME`` with
    the positional handler), or names to handlers (``--service NAME MODULE:FUNC``
    pairs)."""
    if len(specs) == 1 and len(specs[0]) == 1:
        if handler is None:
            raise CLIError("--service NAME needs a handler, module:function", USAGE)
        return specs[0][0], load(handler)
    if len(specs) == 1 and len(specs[0]) == 2 and handler is None:
        return specs[0][0], load(specs[0][1])  # one service: the plain form
    if handler is not None:
        raise CLIError(
            f"a handler ({handler!r}) goes after one --service NAME; with several services, "
            "give each as --service NAME MODULE:FUNC",
            USAGE,
        )
    table: dict[str, Any] = {}
    for spec in specs:
        if len(spec) != 2:
            raise CLIError(f"--service takes NAME MODULE:FUNC, not {' '.join(spec)!r}", USAGE)
        name, target = spec
        if name in table:
            raise CLIError(f"service {name!r} given twice", USAGE)
        table[name] = load(target)
    return table
