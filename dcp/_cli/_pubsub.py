"""``dcp pub`` and ``dcp sub``: publish one message; print messages as they arrive."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from dcp._cli._run import (
    USAGE,
    CLIError,
    add_wait_for_broker,
    beacon_errors,
    run_async,
    until_signal,
)
from dcp._cli._security import client_security
from dcp._io.errors import endpoint_errors

__all__ = ["add_pubsub_commands"]


def add_pubsub_commands(
    command: Callable[..., argparse.ArgumentParser],
    endpoints: Callable[[str], list[str]],
    seconds: Callable[[str], float],
    positive: Callable[[str], int],
    security: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``pub`` and ``sub`` to the ``dcp`` parser (``command`` makes a subparser;
    ``endpoints`` parses a ``--connect`` value: one endpoint or a comma-separated list)."""
    p = command(
        "pub",
        help="publish one message to a subject; print how many subscriptions it reached",
        description="Publish DATA (UTF-8 parts) to SUBJECT and print the number of\n"
        "subscriptions the broker routed it to (the publish is acknowledged).",
    )
    p.add_argument(
        "--connect",
        required=True,
        action="extend",
        type=endpoints,
        metavar="ENDPOINT",
        help="broker endpoint; give it several times (or a comma-separated list) for "
        "several brokers",
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        default=5.0,
        metavar="SECONDS",
        help="seconds the broker has to acknowledge the publish, resends included",
    )
    p.add_argument("subject", metavar="SUBJECT", help="where to publish, e.g. orders.eu.paid")
    p.add_argument("data", nargs="*", metavar="DATA", help="data parts (UTF-8)")
    add_wait_for_broker(p)
    security(p)
    p.set_defaults(func=cmd_pub)

    p = command(
        "sub",
        help="subscribe to a pattern and print messages as they arrive",
        description="Print each message on PATTERN ('*': one token, '>': the rest) as one\n"
        "line: the subject, then the data parts (UTF-8), separated by spaces. Gap notices\n"
        "('lost N message(s)', or a lost broker's) go to stderr. Runs until SIGINT or\n"
        "--count messages. Given several brokers, it subscribes at every one.",
    )
    p.add_argument(
        "--connect",
        required=True,
        action="extend",
        type=endpoints,
        metavar="ENDPOINT",
        help="broker endpoint; give it several times (or a comma-separated list) for "
        "several brokers",
    )
    p.add_argument("--queue", metavar="NAME", help="join this queue group")
    p.add_argument("--count", type=positive, metavar="N", help="exit after N messages")
    p.add_argument("--max-pending", type=positive, default=1000, metavar="N", help="broker buffer")
    p.add_argument(
        "--overflow",
        choices=["drop-oldest", "drop-newest", "disconnect"],
        default="drop-oldest",
        help="what the broker does when the buffer is full",
    )
    p.add_argument(
        "pattern", metavar="PATTERN", help="subjects to receive, e.g. orders.*.paid or orders.>"
    )
    security(p)
    p.set_defaults(func=cmd_sub)


def _run(args: argparse.Namespace, body: Callable[[Any], Any]) -> int:
    from dcp._client.client import Client
    from dcp._client.pubsub import SlowConsumer
    from dcp._errors import DCPError

    security = client_security(args)

    async def run() -> None:
        connect = args.connect[0] if len(args.connect) == 1 else args.connect
        async with Client(
            connect,
            timeout=getattr(args, "timeout", 5.0),
            security=security,
            # dcp._cli._run Rule CR5: dcp pub does not wait for a broker; dcp sub does
            wait_for_broker=getattr(args, "wait_for_broker", True),
        ) as client:
            try:
                await body(client)
            except SlowConsumer as exc:
                raise CLIError(str(exc)) from None
            except DCPError as exc:
                raise CLIError(f"{type(exc).__name__}: {exc}") from None

    try:
        with (
            endpoint_errors("connect to", args.connect, CLIError),  # dcp._io.errors Z3
            beacon_errors(args.connect),
        ):
            received = run_async(args.backend, until_signal, run)
    except (TypeError, ValueError) as exc:
        raise CLIError(str(exc), USAGE) from None
    return 0 if received is None else 128 + received


def cmd_pub(args: argparse.Namespace) -> int:
    async def body(client: Any) -> None:
        n = await client.publish(args.subject, *(d.encode() for d in args.data), ack=True)
        print(n, flush=True)

    return _run(args, body)


def cmd_sub(args: argparse.Namespace) -> int:
    async def body(client: Any) -> None:
        seen = 0
        async with client.subscribe(
            args.pattern,
            queue=args.queue,
            max_pending=args.max_pending,
            overflow=args.overflow,
        ) as sub:
            async for msg in sub:
                if msg.gap:
                    print(f"lost {msg.gap} message(s)", file=sys.stderr, flush=True)
                if msg.broker_lost:
                    print(
                        "a broker was lost: messages it held are lost (how many is unknown)",
                        file=sys.stderr,
                        flush=True,
                    )
                parts = (p.decode("utf-8", "backslashreplace") for p in msg.data)
                print(msg.subject, *parts, flush=True)
                seen += 1
                if args.count is not None and seen >= args.count:
                    return

    return _run(args, body)
