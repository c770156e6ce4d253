"""The ``dcp`` command line: ``dcp broker``, ``dcp worker``, ``dcp call``, ``dcp demo``,
``dcp keys``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio

if TYPE_CHECKING:
    from ._security import CurveClient, CurveServer

__all__ = ["main"]

logger = logging.getLogger("dcp.cli")


async def _until_signal(
    run: Callable[[], Awaitable[object]], on_signal: Callable[[], object] | None = None
) -> None:
    """Run ``run()`` until it returns or SIGINT/SIGTERM arrives, then stop cleanly.

    With ``on_signal``, the first signal calls it (a graceful stop that makes ``run()``
    return) and a second one cancels; without, the first signal cancels.
    """
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            graceful = on_signal
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if graceful is not None:
                        logger.info("received %s, stopping gracefully (again to force)", name)
                        graceful()
                        graceful = None
                        continue
                    logger.info("received %s, stopping", name)
                    tg.cancel_scope.cancel()
                    return

        async def body() -> None:
            await run()
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(body)


def _server_security(args: argparse.Namespace) -> CurveServer | None:
    """The broker's CURVE settings from ``--keys``, ``--allow-client``, ``--allow-worker``."""
    from ._security import CurveServer

    if args.keys is None:
        if args.allow_client or args.allow_worker or args.allow_any_client:
            raise SystemExit("dcp broker: --allow-client/--allow-worker need --keys")
        return None
    workers: dict[str | bytes, list[str]] = {}
    for spec in args.allow_worker:
        service, sep, path = spec.partition("=")
        if not sep or not path:
            raise SystemExit(f"dcp broker: --allow-worker takes SERVICE=PATH, not {spec!r}")
        workers.setdefault(service, []).append(path)
    clients = None if args.allow_any_client else args.allow_client
    try:
        return CurveServer.from_files(args.keys, clients=clients, workers=workers)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"dcp broker: {exc}") from None


def _client_security(args: argparse.Namespace) -> CurveClient | None:
    """A client's or worker's CURVE settings from ``--keys`` and ``--server-key``."""
    from ._security import CurveClient

    if args.keys is None and args.server_key is None:
        return None
    if args.keys is None or args.server_key is None:
        raise SystemExit(f"dcp {args.command}: --keys and --server-key go together")
    try:
        return CurveClient.from_files(args.keys, server=args.server_key)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"dcp {args.command}: {exc}") from None


def _cmd_broker(args: argparse.Namespace) -> int:
    from ._broker import Broker

    broker = Broker(
        *args.bind,
        heartbeat_interval=args.heartbeat_interval,
        liveness=args.liveness,
        allow_foreign_address=args.allow_foreign_address,
        max_queue=args.max_queue,
        max_message_size=args.max_message_size,
        max_frames=args.max_frames,
        max_client_queued=args.max_client_queued,
        max_client_inflight=args.max_client_inflight,
        work_timeout=args.work_timeout,
        send_hwm=args.send_hwm,
        max_redeliveries=args.max_redeliveries,
        busy_timeout=args.busy_timeout,
        mdp_timeout=args.mdp_timeout,
        security=_server_security(args),
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


def _load_handler(spec: str) -> Callable[..., Awaitable[Any]]:
    """Import ``module:function`` (the module is looked up on ``sys.path`` and the cwd)."""
    import importlib
    import os

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"dcp worker: handler must be module:function, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"dcp worker: cannot load handler {spec!r}: {exc}") from None
    if not callable(obj):
        raise SystemExit(f"dcp worker: {spec!r} is not callable")
    return cast("Callable[..., Awaitable[Any]]", obj)


def _cmd_worker(args: argparse.Namespace) -> int:
    from ._errors import RegistrationRefused
    from ._exceptions import BaseExceptionGroup, single_error
    from ._worker import Worker

    handler = _load_handler(args.handler)
    worker = Worker(
        args.connect,
        args.service.encode(),
        handler,
        concurrency=args.concurrency,
        heartbeat_interval=args.heartbeat_interval,
        liveness=args.liveness,
        security=_client_security(args),
        type_width=args.type_width,
    )

    async def run() -> None:
        logger.info("worker for %r connecting to %s", args.service, args.connect)
        await worker.serve()

    def stop() -> None:
        worker.stop(grace=args.grace)

    try:
        try:
            anyio.run(_until_signal, run, stop, backend=args.backend)
        except BaseExceptionGroup as group:
            raise single_error(group) from None
    except RegistrationRefused as exc:
        print(f"dcp worker: {exc}", file=sys.stderr)
        return 3
    logger.info("worker stopped: %s", worker.statistics())
    return 0


def _cmd_call(args: argparse.Namespace) -> int:
    from ._client import Client
    from ._errors import DCPError

    data = [d.encode() for d in args.data]
    code = 0

    async def run() -> None:
        nonlocal code
        async with Client(
            args.connect,
            timeout=args.timeout,
            retries=args.retries,
            security=_client_security(args),
            type_width=args.type_width,
        ) as client:
            try:
                reply = await client.request(args.service.encode(), *data)
            except DCPError as exc:
                print(f"dcp call: {type(exc).__name__}: {exc}", file=sys.stderr)
                code = 1
                return
        out = sys.stdout.buffer
        for part in reply.data:
            out.write(part + b"\n")
        out.flush()

    anyio.run(run, backend=args.backend)
    return code


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    async def run() -> None:
        summary = await run_demo(
            requests=args.requests,
            clients=args.clients,
            window=args.window,
            progress=not args.no_progress,
            type_width=args.type_width,
        )
        print(summary.render(), flush=True)
        if summary.errors:
            raise SystemExit(1)

    anyio.run(run, backend=args.backend)
    return 0


def _cmd_keys(args: argparse.Namespace) -> int:
    from ._security import write_key_pair

    try:
        public, secret = write_key_pair(args.dir, args.name, overwrite=args.force)
    except (OSError, ValueError) as exc:
        print(f"dcp keys: {exc}", file=sys.stderr)
        return 1
    print(public)
    print(secret)
    return 0


def _add_client_security(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("CURVE security (docs/security.md)")
    g.add_argument("--keys", metavar="FILE", help="this peer's NAME.key_secret file")
    g.add_argument("--server-key", metavar="FILE", help="the broker's public NAME.key file")


def _add_type_width(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--type-width",
        type=int,
        choices=[1, 4],
        default=1,
        help=f"type-frame width of {what}: 1 byte (the DCP spec; default) or 4 (a "
        "little-endian int, for the DagBox C++ reference broker, which aborts on 1-byte types)",
    )


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
    limits = p.add_argument_group("limits (see docs/reliability.md)")
    limits.add_argument(
        "--work-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="default time a worker may hold a request before it is treated as lost",
    )
    limits.add_argument(
        "--busy-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="silence allowed from a busy worker that never beats while it works (MDP, "
        "DagBox C++); it is probed meanwhile",
    )
    limits.add_argument(
        "--mdp-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="silence allowed from an idle Majordomo worker",
    )
    limits.add_argument("--max-redeliveries", type=int, default=5, metavar="N")
    limits.add_argument("--max-queue", type=int, default=100_000, metavar="N")
    limits.add_argument("--max-client-queued", type=int, default=10_000, metavar="N")
    limits.add_argument("--max-client-inflight", type=int, default=20_000, metavar="N")
    limits.add_argument("--max-message-size", type=int, default=256 << 20, metavar="BYTES")
    limits.add_argument("--max-frames", type=int, default=4096, metavar="N")
    limits.add_argument("--send-hwm", type=int, default=1000, metavar="MESSAGES")
    g = p.add_argument_group("CURVE security (docs/security.md)")
    g.add_argument(
        "--keys", metavar="FILE", help="the broker's NAME.key_secret file: turns CURVE on"
    )
    g.add_argument(
        "--allow-client",
        action="append",
        default=[],
        metavar="PATH",
        help="a public .key file, or a directory of them, whose keys may connect (repeatable)",
    )
    g.add_argument(
        "--allow-any-client",
        action="store_true",
        help="let any key connect (encryption without client authentication)",
    )
    g.add_argument(
        "--allow-worker",
        action="append",
        default=[],
        metavar="SERVICE=PATH",
        help="keys in PATH (.key file or directory; '*': any connected key) may register "
        "SERVICE ('*': any service); they may also connect (repeatable)",
    )
    p.set_defaults(func=_cmd_broker)

    p = sub.add_parser("worker", help="serve a service with an async handler function")
    p.add_argument("--connect", required=True, metavar="ENDPOINT", help="broker endpoint")
    p.add_argument("--service", required=True, metavar="NAME", help="service to register")
    p.add_argument("handler", metavar="module:function", help="async def handler(request)")
    p.add_argument("--concurrency", type=int, default=1, metavar="N")
    p.add_argument("--heartbeat-interval", type=float, default=1.0, metavar="SECONDS")
    p.add_argument("--liveness", type=int, default=3, metavar="N")
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, time running requests get to finish (a second signal: now)",
    )
    _add_type_width(p, "every message the worker sends")
    _add_client_security(p)
    p.set_defaults(func=_cmd_worker)

    p = sub.add_parser("call", help="send one request and print the reply's data parts")
    p.add_argument("--connect", required=True, metavar="ENDPOINT", help="broker endpoint")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")
    p.add_argument("--retries", type=int, default=2, metavar="N")
    p.add_argument("service", metavar="SERVICE")
    p.add_argument("data", nargs="*", metavar="DATA", help="data parts (UTF-8)")
    _add_type_width(p, "the request")
    _add_client_security(p)
    p.set_defaults(func=_cmd_call)

    p = sub.add_parser("demo", help="embedded broker, a DAG of workers, clients under load")
    p.add_argument("--requests", type=int, default=4000, metavar="N")
    p.add_argument("--clients", type=int, default=4, metavar="N")
    p.add_argument("--window", type=int, default=32, metavar="N", help="in flight per client")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_type_width(p, "what the clients and workers send")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser(
        "keys", help="generate a CURVE key pair: NAME.key (public), NAME.key_secret (0600)"
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--dir", default=".", metavar="DIR", help="where to write (default: .)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=_cmd_keys)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dcp`` command."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO
    if args.verbose > 1:
        level = logging.DEBUG
    if args.command in ("broker", "worker") and args.verbose == 0:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
