"""``dcp broker``, ``dcp demo`` and ``dcp keys`` (``dcp call`` is in :mod:`._call`,
``dcp worker`` in :mod:`._worker`). Each ``cmd_*`` returns the exit code or raises
:class:`~._run.CLIError`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import anyio
import anyio.abc

from dcp._cli._http import broker_http
from dcp._cli._run import USAGE, CLIError, exit_code, run_async, until_signal
from dcp._cli._security import server_security
from dcp._errors import BindFailed
from dcp._io.errors import endpoint_errors

__all__ = ["cmd_broker", "cmd_demo", "cmd_keys"]

logger = logging.getLogger("dcp.cli")


def cmd_broker(args: argparse.Namespace) -> int:
    from dcp._broker.broker import Broker

    security = server_security(args)
    http = broker_http(args)
    try:
        broker = Broker(
            *args.bind,
            io_thread=True,  # the process is the broker's: its own I/O thread is cheaper
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
            receive_hwm=args.receive_hwm,
            max_redeliveries=args.max_redeliveries,
            max_service_name=args.max_service_name,
            max_services=args.max_services,
            max_services_per_worker=args.max_services_per_worker,
            max_memory=args.max_memory,
            busy_timeout=args.busy_timeout,
            mdp_timeout=args.mdp_timeout,
            mdp_work_timeout=args.mdp_work_timeout or None,
            max_client_services=args.max_client_services or None,
            max_queue_wait=args.max_queue_wait or None,
            security=security,
            beacon=args.beacon,
            beacon_address=args.beacon_address,
            **http,
            log_summary=args.log_summary,
        )
    except ValueError as exc:
        raise CLIError(str(exc), USAGE) from None
    except ModuleNotFoundError as exc:
        raise CLIError(str(exc)) from None

    async def reload_on_sighup(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            task_status.started()
            async for _ in signals:
                try:
                    new = server_security(args)
                except CLIError as exc:
                    logger.error("SIGHUP: kept the allow-lists in force: %s", exc)
                    continue
                assert new is not None
                logger.info("SIGHUP: reloading the allow-lists")
                await broker.reload_security(new)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            endpoints = await tg.start(broker.serve)
            for endpoint in endpoints:
                logger.info("broker listening on %s", endpoint)
            if security is not None:
                await tg.start(reload_on_sighup)  # before anyone can know we run
            if broker.http_address is not None:
                endpoints = [*endpoints, f"http://{broker.http_address}/"]
            print("\n".join(endpoints), flush=True)

    try:
        with endpoint_errors("bind", args.bind, CLIError):  # one line (dcp._io.errors Z3)
            received = run_async(args.backend, until_signal, run)
    except BindFailed as exc:  # one line (dcp._io.errors Rule Z3), an ipc:// path in use
        raise CLIError(str(exc)) from None
    except OSError as exc:  # only the HTTP endpoint binds with plain sockets
        raise CLIError(f"cannot serve HTTP on {args.http}: {exc.strerror or exc}") from None
    logger.info("broker stopped: %s", broker.statistics())
    return exit_code(received)


def cmd_demo(args: argparse.Namespace) -> int:
    from dcp._cli.demo import run_demo

    code = 0

    async def run() -> None:
        nonlocal code
        summary = await run_demo(
            requests=args.requests,
            clients=args.clients,
            window=args.window,
            progress=not args.no_progress,
            type_width=args.type_width,
        )
        print(summary.render(), flush=True)
        code = 1 if summary.errors else 0

    received = run_async(args.backend, until_signal, run)
    if received is not None:
        if not args.no_progress:
            print(file=sys.stderr)  # end the progress bar's line
        return 128 + received
    return code


def cmd_keys(args: argparse.Namespace) -> int:
    from dcp._io.security import write_key_pair

    try:
        public, secret = write_key_pair(args.dir, args.name, overwrite=args.force)
    except (OSError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    print(public)
    print(secret)
    return 0
