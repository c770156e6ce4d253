"""The endpoint as a task of the broker (``Broker(http=...)``): bind, report, serve."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from dcp._http.address import HttpOptions
from dcp._stats import BrokerSnapshot

__all__ = ["run_http"]

logger = logging.getLogger("dcp.http")


async def run_http(
    options: HttpOptions,
    take: Callable[[bool], Awaitable[BrokerSnapshot]],
    endpoints: list[str],
    bound: Callable[[str | None], None],
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``options``' address, report it (to ``bound`` and ``task_status``), and serve the
    endpoint until cancelled; ``bound(None)`` once stopped.

    :param take: takes a snapshot where the broker's core runs (``True``: list every peer)
    :param endpoints: the broker's bound zmq endpoints (shown by ``/status``)
    :raises OSError: the address could not be bound
    """
    from dcp._http.address import HostCheck
    from dcp._http.app import StatusApp
    from dcp._http.server import bind, serve_http
    from dcp._version import __version__

    sock, address = bind(options)
    app = StatusApp(
        take,
        token=options.token,
        version=__version__,
        endpoints=endpoints,
        hosts=HostCheck(options, address),
    )
    bound(address)
    logger.info(
        "HTTP endpoint on http://%s/ (/metrics, /status)%s",
        address,
        " with a bearer token" if options.token else "",
    )
    try:
        await serve_http(app, sock, address, task_status=task_status)
    finally:
        bound(None)
