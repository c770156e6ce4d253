"""NATS (nats-server, Debian's package, with nats-py on asyncio): the anchor of the whole-stack
comparison (issue 27), what an async Python team would most likely pick for request/reply.

- :func:`start_server`: ``nats-server -a 127.0.0.1 -p PORT`` (no config file) from ``PATH``,
  started in a :class:`~benchmarks.procs.Procs` group (so ended by its PID with it); returns
  once it accepts connections (:func:`server_argv` and :func:`wait_accepting` for others,
  :mod:`benchmarks.pubsub`).
- ``python -m benchmarks.nats_peers workers --endpoint nats://... --count N``: one nats-py
  connection with ``N`` queue subscriptions on the subject ``echo`` (queue group ``echo``),
  each replying with the request's body; nats-py runs each subscription's callback in one
  task of its own, one message at a time, so ``N`` is the requests served at once.
- ``python -m benchmarks.nats_peers client ...``: one nats-py connection, *window* tasks each
  looping ``await nc.request("echo", payload)``; the same phases and JSON result as every
  load generator (:mod:`benchmarks.common`).

:func:`missing` says in one line why NATS cannot run here (no ``nats-server`` on ``PATH``, or
no ``nats`` package: the ``bench`` extra installs nats-py), or ``None``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from .common import (
    LoadSettings,
    Probe,
    Result,
    add_load_arguments,
    emit,
    raise_fd_limit,
    ready,
    settings_from_args,
)
from .procs import ProcessFailed, Procs

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg

__all__ = [
    "SUBJECT",
    "main",
    "missing",
    "server_argv",
    "start_server",
    "versions",
    "wait_accepting",
]

SUBJECT = "echo"
_clock = time.perf_counter_ns


def missing(client: bool = True) -> str | None:
    """Why NATS cannot run here (one line), or ``None`` when it can; ``client=False``: only
    the server is needed (:mod:`benchmarks.pubsub`'s raw sockets)."""
    if shutil.which("nats-server") is None:
        return "nats-server is not on PATH (Debian: apt-get install nats-server)"
    if client and find_spec("nats") is None:
        return "nats-py is not installed (the bench extra: pip install -e '.[bench]')"
    return None


def versions() -> dict[str, str]:
    """``nats-server``'s and nats-py's versions (``?`` where unknown)."""
    out = {"nats-server": "?", "nats-py": "?"}
    path = shutil.which("nats-server")
    if path is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
            out["nats-server"] = proc.stdout.split()[-1] if proc.stdout.split() else "?"
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        out["nats-py"] = version("nats-py")
    return out


def server_argv() -> tuple[list[str], int]:
    """The command line of a ``nats-server`` on 127.0.0.1 with a free port (no config
    file), and that port."""
    path = shutil.which("nats-server")
    if path is None:
        raise ProcessFailed("nats-server is not on PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return [path, "-a", "127.0.0.1", "-p", str(port)], port


def wait_accepting(port: int, popen: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    """Return once a connection to ``port`` gets the server's ``INFO`` line."""
    deadline = time.monotonic() + timeout
    while True:
        if popen.poll() is not None:
            raise ProcessFailed(f"nats-server exited ({popen.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                if s.recv(4096).startswith(b"INFO"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ProcessFailed(f"nats-server did not accept connections within {timeout:.0f}s")
        time.sleep(0.05)


def start_server(procs: Procs, timeout: float = 20.0) -> tuple[str, int]:
    """Start ``nats-server`` in ``procs``; returns (``nats://`` URL, PID) once it accepts
    connections."""
    argv, port = server_argv()
    proc = procs.start("nats-server", *argv, module=False)
    try:
        wait_accepting(port, proc.popen, timeout)
    except ProcessFailed as exc:
        raise ProcessFailed(f"{exc}\n{proc.log_tail()}") from None
    return f"nats://127.0.0.1:{port}", proc.pid


async def _connect(endpoint: str) -> Client:
    import nats

    # No reconnection: a benchmark whose server went away has failed.
    return await nats.connect(endpoint, allow_reconnect=False, max_reconnect_attempts=0)


async def _workers(endpoint: str, count: int) -> None:
    nc = await _connect(endpoint)

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    for _ in range(count):
        await nc.subscribe(SUBJECT, queue=SUBJECT, cb=echo)
    await nc.flush()
    ready(str(count))
    await asyncio.Event().wait()


async def _phase(
    nc: Client, s: LoadSettings, count: int, duration: float, timeout: float
) -> tuple[list[int], int]:
    """*window* tasks looping ``await nc.request``; at most ``count`` requests started within
    ``duration`` s. Returns the latencies (ns) and the requests lost (no reply within
    ``timeout`` s)."""
    import nats.errors

    payload = b"x" * s.payload
    latencies: list[int] = []
    started = 0
    lost = 0
    end = _clock() + int(duration * 1e9)

    async def loop() -> None:
        nonlocal started, lost
        while started < count and _clock() < end:
            started += 1
            t0 = _clock()
            try:
                await nc.request(SUBJECT, payload, timeout=timeout)
            except nats.errors.TimeoutError:
                lost += 1
            else:
                latencies.append(_clock() - t0)

    await asyncio.gather(*(loop() for _ in range(s.window)))
    return latencies, lost


async def _client(s: LoadSettings) -> Result:
    nc = await _connect(s.endpoint)
    try:
        _, lost = await _phase(nc, s, s.warmup, s.warmup_timeout, s.warmup_timeout)
        if lost:
            raise SystemExit("nats client: warm-up requests lost")
        probe = Probe(s.broker_pid, s.worker_pids)
        probe.start()
        latencies, lost = await _phase(nc, s, s.count, s.duration, s.drain_timeout)
        probe.stop()
    finally:
        await nc.close()
    return Result.build(latencies, probe, lost=lost)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nats_peers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("workers")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--count", type=int, default=1, help="queue subscriptions")
    p = sub.add_parser("client")
    add_load_arguments(p)
    args = parser.parse_args(argv)
    raise_fd_limit()
    if args.command == "workers":
        asyncio.run(_workers(args.endpoint, args.count))
    else:
        emit(asyncio.run(_client(settings_from_args(args))))


if __name__ == "__main__":
    main()
