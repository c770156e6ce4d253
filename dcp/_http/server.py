"""Serve the ASGI app with hypercorn on the running anyio backend.

Why hypercorn: it is a maintained ASGI server that runs natively on both trio and asyncio
(``hypercorn.trio`` / ``hypercorn.asyncio``), so the endpoint is a task in the broker's own
task group on either backend: no thread, no second event loop, and cancelling the broker
stops it. (uvicorn is asyncio only; a hand-written HTTP/1.1 server would be ours to keep
correct.) The app itself is plain ASGI (:mod:`.app`): three GET paths do not earn a framework.

We bind the listening socket ourselves and hand it to hypercorn's ``worker_serve`` (what its
``serve`` calls once it has made sockets from the config): a bind error surfaces before the
broker reports it is ready, port 0 is resolved, and the socket is closed when we stop
whatever hypercorn does. Hypercorn is stopped through its shutdown trigger when we are
cancelled (which also keeps its asyncio side from installing SIGINT/SIGTERM handlers of its
own), within a bounded, shielded wait.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import sniffio
from hypercorn.config import Config, Sockets
from hypercorn.utils import wrap_app

from dcp._http.address import HttpOptions

__all__ = ["serve_http"]

logger = logging.getLogger("dcp.http")

#: Seconds hypercorn has to stop (it gives open connections half of it).
_STOP_TIMEOUT = 1.0


def bind(options: HttpOptions) -> tuple[socket.socket, str]:
    """A listening socket on ``options``' host and port, and its address as ``HOST:PORT``.

    :raises OSError: the address cannot be bound (in use, not on this host, ...)
    """
    infos = socket.getaddrinfo(
        options.host, options.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    return sock, (f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}")


async def serve_http(
    app: Any,
    sock: socket.socket,
    address: str,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on the listening ``sock`` until cancelled (reporting ``address`` once
    ready); the socket is closed then."""
    config = Config()
    config.accesslog = None
    # hypercorn's own messages ("Running on ...") only when something is wrong.
    errors = logging.getLogger("dcp.http.server")
    errors.setLevel(logging.WARNING)
    config.errorlog = errors
    config.include_server_header = False
    config.graceful_timeout = _STOP_TIMEOUT / 2
    sockets = Sockets([], [sock], [])
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    worker_serve: Callable[..., Awaitable[None]]
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio.run import worker_serve
    else:
        from hypercorn.asyncio.run import worker_serve as asyncio_serve

        worker_serve = asyncio_serve
    stop = anyio.Event()
    stopped = anyio.Event()
    inner = anyio.CancelScope(shield=True)

    async def run() -> None:
        # Stopped by its shutdown trigger, not by cancellation: hypercorn's asyncio side
        # does not survive being cancelled with connections open (a browser's keep-alive).
        with inner:
            try:
                await worker_serve(wrapped, config, sockets=sockets, shutdown_trigger=stop.wait)
            finally:
                stopped.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            task_status.started(address)
            try:
                await anyio.sleep_forever()
            finally:
                stop.set()
                with anyio.CancelScope(shield=True), anyio.move_on_after(_STOP_TIMEOUT):
                    await stopped.wait()
                inner.cancel()  # it did not stop in time (or it has: then this is a no-op)
    finally:
        sock.close()
