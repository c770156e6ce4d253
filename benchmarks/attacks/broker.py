"""The broker under attack, in a process of its own, with the options the CLI may lack.

``python -m benchmarks.attacks.broker [--max-memory BYTES] [--last-values N] ...`` binds
``tcp://127.0.0.1:0``, prints ``READY <endpoint>`` and serves until killed. An option left out
keeps the broker's default; ``--max-memory`` is passed only to a broker core that takes it.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Sequence
from typing import Any

import anyio

import dcp
from dcp._core.broker.core import BrokerCore

from ..common import ready

__all__ = ["main"]


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``dcp.Broker`` keyword arguments the command line asks for."""
    kwargs: dict[str, Any] = {}
    if args.max_memory is not None and "max_memory" in inspect.signature(BrokerCore).parameters:
        kwargs["max_memory"] = args.max_memory
    if args.max_services is not None:
        kwargs["max_services"] = args.max_services
    if args.max_message_size is not None:
        kwargs["max_message_size"] = args.max_message_size
    given = (args.last_values, args.max_subscriptions, args.max_subscriptions_per_peer)
    if any(v is not None for v in given):
        default = dcp.PubSubOptions()
        kwargs["pubsub"] = dcp.PubSubOptions(
            last_values=_or(args.last_values, default.last_values),
            max_subscriptions=_or(args.max_subscriptions, default.max_subscriptions),
            max_subscriptions_per_peer=_or(
                args.max_subscriptions_per_peer, default.max_subscriptions_per_peer
            ),
        )
    return kwargs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attacks.broker")
    parser.add_argument("--max-memory", type=int, default=None, help="bytes")
    parser.add_argument("--max-services", type=int, default=None)
    parser.add_argument("--max-message-size", type=int, default=None, help="bytes")
    parser.add_argument("--last-values", type=int, default=None)
    parser.add_argument("--max-subscriptions", type=int, default=None)
    parser.add_argument("--max-subscriptions-per-peer", type=int, default=None)
    args = parser.parse_args(argv)
    kwargs = options(args)

    async def run() -> None:
        broker = dcp.Broker("tcp://127.0.0.1:0", **kwargs)
        async with anyio.create_task_group() as tg:
            [endpoint] = await tg.start(broker.serve)
            ready(endpoint)
            await anyio.sleep_forever()

    anyio.run(run)


if __name__ == "__main__":
    main()
