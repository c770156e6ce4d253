"""The ``dcp`` command line: ``dcp broker``, ``dcp worker``, ``dcp call``, ``dcp demo``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

import anyio

__all__ = ["main"]

logger = logging.getLogger("dcp.cli")


async def _until_signal(run: Callable[[], Awaitable[object]]) -> None:
    """Run ``run()`` until it returns or SIGINT/SIGTERM arrives, then stop cleanly."""
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    logger.info("received %s, stopping", signal.Signals(signum).name)
                    tg.cancel_scope.cancel()
                    return

        async def body() -> None:
            await run()
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(body)


def _cmd_broker(args: argparse.Namespace) -> int:
    from ._broker import Broker

    broker = Broker(
        *args.bind,
        heartbeat_interval=args.heartbeat_interval,
        liveness=args.liveness,
        allow_foreign_address=args.allow_foreign_address,
    )

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            endpoints = await tg.start(broker.serve)
            for endpoint in endpoints:
                logger.info("broker listening on %s", endpoint)
            print("\n".join(endpoints), flush=True)

    anyio.run(_until_signal, run, backend=args.backend)
    logger.info("broker stopped: %s", broker.statistics())
    return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dcp", description="DagBox Communication Protocol v1 broker, worker and client."
    )
    parser.add_argument(
        "--backend",
        choices=["trio", "asyncio"],
        default="trio",
        help="async backend to run on (default: trio)",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", help="run a broker until SIGINT or SIGTERM")
    p.add_argument(
        "--bind",
        action="append",
        required=True,
        metavar="ENDPOINT",
        help="zmq endpoint to bind, e.g. tcp://127.0.0.1:5555 (repeatable)",
    )
    p.add_argument("--heartbeat-interval", type=float, default=1.0, metavar="SECONDS")
    p.add_argument("--liveness", type=int, default=3, metavar="N")
    p.add_argument(
        "--allow-foreign-address",
        action="store_true",
        help="let non-workers send requests carrying another client's address",
    )
    p.set_defaults(func=_cmd_broker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dcp`` command."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO
    if args.verbose > 1:
        level = logging.DEBUG
    if args.command == "broker" and args.verbose == 0:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
