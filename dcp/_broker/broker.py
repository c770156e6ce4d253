"""The broker: a thin anyio driver around :class:`~dcp._core.broker.core.BrokerCore`.

:class:`Broker` holds the configuration and composes its parts, each given its
collaborators: :class:`~dcp._broker.thread.CoreCalls` (work for the core from the event
loop), :class:`~dcp._broker.reload.SecurityReload` (the security settings in force, the ZAP
handler, the reload), :class:`~dcp._broker.stats.Reports` (statistics, HTTP snapshots), and
for each serve a :class:`~dcp._broker.link.CoreLink` (the core and the socket) run by an
:class:`~dcp._broker.thread.IOThread` or by the link's own event-loop tasks. ``async with
broker`` runs :meth:`Broker.serve` through :class:`dcp._io.lifecycle.Lifecycle`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import zmq
from zmq.utils import z85

from dcp._broker.approver import Approver, ApproverRunner
from dcp._broker.link import CoreLink
from dcp._broker.oplog import log_summaries
from dcp._broker.reload import SecurityReload
from dcp._broker.stats import Reports
from dcp._broker.thread import CoreCalls, IOThread
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.guard import Guard
from dcp._core.broker.pubsub import PubSubStatistics
from dcp._errors import BindFailed
from dcp._http import http_options
from dcp._http import require as require_http
from dcp._io.beacon import send_beacons
from dcp._io.context import get_context
from dcp._io.endpoints import ipc_in_use, is_loopback_host
from dcp._io.errors import bind_errors
from dcp._io.lifecycle import Lifecycle, ki_protected
from dcp._io.security import CurveServer, configure_server_socket
from dcp._io.sockets import AsyncSocket
from dcp._stats import BrokerStatistics

__all__ = ["Broker"]

#: Frames this large (or larger) pass through the broker without a copy in Python; below it,
#: a copy into ``bytes`` is cheaper than a ``zmq.Frame`` object. (pyzmq's own default
#: ``copy_threshold`` for sends is 64 KiB too.)
_ZERO_COPY_THRESHOLD = 65_536
#: The default ``max_message_size``: 64 MiB, all frames together; also zmq's per-frame
#: ``MAXMSGSIZE``. Above the largest message dcp's own tools send (4 MiB replies in the
#: benchmarks; "several megabytes" in seed 002) and below the byte budget's queued account
#: (35 % of 512 MiB), so a few such messages fit in it.
DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024


logger = logging.getLogger("dcp.broker")


#: The docs site's page on the security modes (``dcp._cli._docs.doc_url("security")``).
_SECURITY_DOCS = "https://dagbox.github.io/dcp/security.html#modes"


def plaintext_notice(bound: Sequence[str], *, beacon: bool = False) -> tuple[int, str]:
    """What a broker without CURVE says once at start (``docs/security.md``, "Modes"): a
    WARNING when an endpoint is reachable from other hosts, an INFO when every one is
    loopback, ``ipc://`` or ``inproc://`` (only local processes can reach it)."""
    exposed = [e for e in bound if not _local(e)]
    if not exposed:
        return logging.INFO, (
            "no CURVE: any process on this host can register any service and answer its "
            f"requests (local endpoints only; {_SECURITY_DOCS})"
        )
    return logging.WARNING, (
        f"no CURVE: anyone who can reach {', '.join(exposed)} can register any service and "
        "answer its requests, and forge replies to Majordomo clients"
        + (", and spoof this broker's beacons" if beacon else "")
        + f"; turn CURVE on unless the network is yours alone: {_SECURITY_DOCS}"
    )


def _local(endpoint: str) -> bool:
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    return is_loopback_host(rest.rpartition(":")[0].strip("[]"))


def _core_options() -> frozenset[str]:
    """The keywords :class:`BrokerCore` takes that :class:`Broker` passes on as they are."""
    code = BrokerCore.__init__.__code__
    names = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    return frozenset(names) - {"guard", "approve", "dbp_clock"}


#: Seconds an ``ipc://`` path someone listens on is probed again before the bind is refused:
#: a broker of this process stopped a moment ago on the same path still listens until zmq's
#: I/O thread has closed its socket (milliseconds); a live one stays.
IPC_SETTLE = 0.5


async def _ipc_taken(endpoint: str) -> bool:
    """Whether a live listener holds the ``ipc://`` endpoint (:func:`ipc_in_use` for
    :data:`IPC_SETTLE` seconds; ``False`` for any other scheme)."""
    deadline = anyio.current_time() + IPC_SETTLE
    while ipc_in_use(endpoint):
        if anyio.current_time() >= deadline:
            return True
        await anyio.sleep(0.01)
    return False


#: What a ``Broker(**core_options)`` may hold (anything else is a ``TypeError`` naming Broker).
_CORE_OPTIONS = _core_options()


class Broker:
    """A DCP v1 broker, run as a task in any anyio task group (trio or asyncio), that also
    serves Majordomo peers (MDP/0.1, MDP/0.2, majortomo) on the same endpoints.

    ::

        broker = Broker("tcp://127.0.0.1:5555", "ipc:///tmp/dcp.sock")
        async with anyio.create_task_group() as tg:
            endpoints = await tg.start(broker.serve)

    or ``async with Broker("tcp://127.0.0.1:0") as broker: ...`` (see :attr:`endpoints`).

    One ROUTER socket is bound to every endpoint; one task of the event loop owns it (with
    ``io_thread=True``, a thread of its own). Routing follows the rules in
    :mod:`dcp._core.broker.core`. Socket options: ``ROUTER_MANDATORY`` (so a send to a gone or
    full peer is known, counted and, for a worker, turned into redelivery),
    ``ROUTER_HANDOVER`` (a peer reconnecting with the same routing id keeps its address),
    ``MAXMSGSIZE`` (zmq disconnects a peer that sends a frame larger than the whole
    message limit; it may reconnect), zmq heartbeats (a dead connection is dropped within
    the liveness, so a probe to a busy worker that never beats fails once it is gone).

    With ``security`` (CURVE, see ``docs/security.md``) the socket is a CURVE server whose
    handshakes a ZAP handler task checks against the allow-lists; every message is
    attributed to its sender's key, registrations need permission, client addresses are
    sealed before workers see them, ``ROUTER_HANDOVER`` is off (a routing id in use cannot
    be taken over) and zmq heartbeats drop dead connections after ``liveness x
    heartbeat_interval``. Without a ``context``, a secure broker uses a zmq context of its
    own (a context has one ZAP handler). inproc endpoints have no handshake and are refused.

    :param endpoints: zmq endpoints to bind (``tcp://host:0`` picks a free port)
    :param heartbeat_interval: seconds between worker heartbeats (agreed with workers)
    :param liveness: heartbeats a worker may miss before its requests are redelivered
    :param allow_foreign_address: let non-workers send requests carrying another client's
        address (off by default: a client could steer replies to another peer)
    :param max_queue: requests queued per service before ``queue_full`` error replies
    :param max_message_size: largest message accepted, all frames together, in bytes
        (-1: no limit; default 64 MiB). Larger messages are counted (``message_too_large``)
        and dropped; a single frame over it makes zmq drop the sender's connection
        (``MAXMSGSIZE``, set to this value). zmq limits each frame, not the message, and
        buffers a message whole before the broker sees it: what one message of many
        frames costs before it is refused is in ``docs/security.md``.
    :param max_frames: frames per message; longer messages are counted and dropped (a
        request whose metadata survived the cut gets an error reply, as for the size limit)
    :param max_client_queued: requests of one client waiting in queues before
        ``client_limit`` error replies
    :param max_client_inflight: requests of one client accepted and unanswered (queued or
        at a worker) before ``client_limit`` error replies
    :param work_timeout: seconds a worker may hold a request that carries no work timeout
        of its own (``None``: no limit); a worker past it is treated as lost
    :param send_hwm: zmq's send high-water mark, in messages, per peer: a reply to a
        client that stopped reading is dropped (counted; the client retries) once this many
        are waiting for it, and a worker that stopped reading is treated as gone
    :param receive_hwm: zmq's receive high-water mark, in messages, per peer: past it zmq
        stops reading that peer's connection (back-pressure) while others are still served
    :param batch: messages handled per wake-up before yielding to other tasks
    :param context: zmq context (default: one shared per process; with ``security``, one of
        the broker's own)
    :param security: CURVE keys and allow-lists (default: no security)
    :param io_thread: run the socket's I/O loop (and the routing core) in a thread of its
        own, blocking in a ``recv`` on the socket (:mod:`dcp._io.blocking`), instead of in
        the event loop: a message costs a ``poll(2)`` wake-up in libzmq there instead of an
        event loop's wait and task switch (``docs/performance-broker.md``). It suits a
        broker that has its process to itself (``dcp broker`` uses it); where the same
        process's event loop also runs busy workers or clients, the thread and the loop
        take turns on the GIL at every zmq call (pyzmq releases it), which costs more than
        it saves: ``dcp demo`` served 1.25x more requests without it (median of six
        alternated runs). The broker is still a task of your task group; cancelling it
        stops the thread promptly. ``False`` (the default) keeps everything in the event
        loop
    :param approve: a registration approver (``docs/services.md``): called (plain ``def``,
        on the event loop: keep it quick; or ``async def``) with a
        :class:`dcp.ApprovalRequest` for each registration (service, the info the worker
        gave, routing id, CURVE key) and returns ``True``, ``False``, ``(bool, reason)`` or
        a :class:`dcp.Approval`; a denied worker is told the reason. CURVE allow-lists
        apply first
    :param beacon: a UDP port to announce the broker on, every second (the first
        ``tcp://`` endpoint's port, and with CURVE its public key; ``docs/services.md``)
    :param beacon_address: where the beacon goes (default: the broadcast address)
    :param http: serve ``/metrics`` (Prometheus), ``/status`` (JSON) and a live status page
        on this ``HOST:PORT`` (port 0: a free one, see :attr:`http_address`; needs the
        ``http`` extra; ``docs/operations.md``). Off by default
    :param http_token: a bearer token every HTTP request must carry
    :param http_public: allow an ``http`` host that is not a loopback address
    :param http_hosts: further names the ``Host`` header of an HTTP request may give
        (``NAME``: any port, or ``NAME:PORT``), besides the bound address, its IP, and
        ``localhost`` for a loopback one; a request under any other gets ``421`` (DNS
        rebinding; ``docs/security.md``)
    :param log_summary: seconds between one-line INFO summaries on the ``dcp.broker``
        logger (requests/s, replies/s, errors, queue depth, workers idle/busy, clients;
        ``docs/operations.md``); ``None``: none
    :param core_options: further :class:`~dcp._core.broker.core.BrokerCore` keyword
        arguments, among them ``max_memory``: bytes the broker may hold on its peers' behalf
        (queued requests, held replies, subscription buffers, last values, stream parts,
        descriptions, peer state), split into accounts with per-peer shares (default 512 MiB;
        ``None``: no budget; ``docs/security.md``). A message past its account's room is
        refused with ``memory_budget``; :meth:`statistics` shows every account's figures. Any
        other keyword is a ``TypeError`` (naming ``Broker``)
    """

    def __init__(
        self,
        *endpoints: str,
        heartbeat_interval: float = 1.0,
        liveness: int = 3,
        allow_foreign_address: bool = False,
        max_queue: int = 100_000,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_frames: int = 4096,
        max_client_queued: int = 10_000,
        max_client_inflight: int = 20_000,
        work_timeout: float | None = None,
        send_hwm: int = 1000,
        receive_hwm: int = 1000,
        batch: int = 256,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        security: CurveServer | None = None,
        io_thread: bool = False,
        approve: Approver | None = None,
        beacon: int | None = None,
        beacon_address: str = "255.255.255.255",
        http: str | None = None,
        http_token: str | None = None,
        http_public: bool = False,
        http_hosts: Sequence[str] = (),
        log_summary: float | None = None,
        **core_options: Any,
    ) -> None:
        if not endpoints:
            raise ValueError("a broker needs at least one endpoint to bind")
        for option in core_options:
            if option not in _CORE_OPTIONS:  # named as Python names any wrong keyword
                raise TypeError(f"Broker() got an unexpected keyword argument {option!r}")
        if log_summary is not None and not 0 < log_summary < float("inf"):
            raise ValueError("log_summary must be None or a positive finite number of seconds")
        self._log_summary = log_summary
        if security is not None and any(e.startswith("inproc://") for e in endpoints):
            raise ValueError("inproc:// has no CURVE handshake: a secure broker cannot bind it")
        self._bind: tuple[str, ...] = endpoints
        self.heartbeat_interval = heartbeat_interval
        self._max_message_size = max_message_size
        self._max_frames = max_frames
        self._batch = batch
        self._io_thread = io_thread
        self._context = context
        self._send_hwm = send_hwm
        self._receive_hwm = receive_hwm
        guard = None
        if security is not None:
            # The sealing key comes from the broker's secret key (Guard derives its own key
            # from it, for this one use), so a restarted broker opens the client addresses
            # its predecessor sealed: work finished across a restart still reaches clients.
            guard = Guard(
                security.may_register,
                z85.decode(security.secret_key),
                may_connect=security.may_connect,
            )
        self._core = BrokerCore(
            heartbeat_interval=heartbeat_interval,
            liveness=liveness,
            allow_foreign_address=allow_foreign_address,
            max_queue=max_queue,
            max_client_queued=max_client_queued,
            max_client_inflight=max_client_inflight,
            work_timeout=work_timeout,
            guard=guard,
            approve=approve is not None,
            dbp_clock=time.time,
            **core_options,
        )
        self._approve = approve
        #: Work for the core from the event loop, run where the core runs.
        self._calls = CoreCalls(threaded=io_thread)
        #: The security settings in force, the ZAP handler, the reload.
        self._security = SecurityReload(security, self._core, self._calls)
        self._reports = Reports(self._core, self._calls, self._security)
        if beacon is not None and not any(e.startswith("tcp://") for e in endpoints):
            raise ValueError("a beacon announces a tcp:// endpoint: bind one")
        self._beacon = beacon
        self._beacon_address = beacon_address
        self._http = (
            None
            if http is None
            else http_options(http, token=http_token, public=http_public, hosts=http_hosts)
        )
        if self._http is not None:
            require_http()
        #: The HTTP endpoint's bound address (``HOST:PORT``) while serving; ``None`` before,
        #: after, or without ``http``.
        self.http_address: str | None = None
        self._serving = False
        self._lifecycle = Lifecycle("this broker is already serving")
        #: The bound endpoints (ports resolved) while serving; empty before.
        self.endpoints: list[str] = []

    def pubsub_statistics(self) -> PubSubStatistics:
        """Pub/sub counters and gauges (published, routed, delivered, lost, ...)."""
        return self._reports.pubsub_statistics()

    def statistics(self) -> BrokerStatistics:
        """Counters (requests, replies, forwards, redeliveries, rejections by reason) and
        gauges (workers, per-service queue depth). With CURVE, ``rejections`` also counts
        handshakes the ZAP handler denied (``zap_denied``) and malformed ZAP requests
        (``zap_malformed``)."""
        return self._reports.statistics()

    async def reload_security(self, security: CurveServer) -> int:
        """Replace the allow-lists while the broker runs (``dcp broker`` does on SIGHUP).

        New handshakes follow the new lists at once. When a key may no longer connect, every
        connection the broker accepted on its tcp and ipc endpoints from an address that key
        connected from is dropped (zmq cannot tell which connection a key came in on, nor
        close just one; see :mod:`dcp._broker.connections`): each peer reconnects and handshakes
        again, and a revoked key fails (a dcp peer raises :exc:`~dcp.AuthenticationFailed`).
        Until then, and on inproc connections, every message from a revoked key is refused
        (``revoked`` in ``statistics().rejections``). A worker whose key may no longer
        register one of its services is removed and told (a dcp worker's ``serve`` raises
        :exc:`~dcp.RegistrationRefused`), and the requests it held go to other workers.

        :param security: the new settings, with this broker's key pair
        :returns: how many workers were removed
        :raises ValueError: the broker has no security, or ``security`` has another key pair
            (restart the broker to change its keys: every peer must learn the new one)
        """
        return await self._security.reload(security, lambda: self.endpoints)

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[list[str]] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind, report the bound endpoints through ``task_status``, and route until
        cancelled. Cancellation closes the socket (linger 0) before returning.

        :raises BindFailed: an endpoint could not be bound (its port is in use, a live
            process listens on its ``ipc://`` path, ...), the reason in one line
        :raises OSError: the HTTP address could not be bound
        :raises RuntimeError: the broker is already serving
        """
        if self._serving:
            raise RuntimeError("this broker is already serving")
        security = self._security.security
        # Cleanups run last in, first out: the socket, then the ZAP handler, then the context.
        with contextlib.ExitStack() as cleanup:
            ctx = self._context
            if ctx is None and security is not None:
                # A context has one ZAP handler: a secure broker keeps a context of its own.
                ctx = zmq.Context()
                cleanup.callback(ctx.term)
            elif ctx is None:
                ctx = get_context()
            # Bound before the broker's socket and closed after it: no handshake goes
            # unchecked (and with ZAP_ENFORCE_DOMAIN, libzmq refuses one that finds no
            # handler).
            zap = self._security.open_zap(ctx)
            if zap is not None:
                cleanup.callback(zap.close)
            sock: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
            # +1: the ROUTER adds the routing-id frame, which the limit does not count.
            asock = AsyncSocket(
                sock,
                max_frames=self._max_frames + 1,
                # Routing ids are at most 255 bytes; the exact check is in CoreLink.handle.
                max_bytes=self._max_message_size + 255 if self._max_message_size >= 0 else 0,
                # Large data parts are forwarded as zmq's own buffers, never copied in Python.
                zero_copy_threshold=_ZERO_COPY_THRESHOLD,
                # With CURVE, each message's sender key (the ZAP user id) goes to the core.
                user_ids=security is not None,
            )
            cleanup.callback(asock.close, 0)
            try:
                self._serving = True
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
                sock.setsockopt(zmq.MAXMSGSIZE, self._max_message_size)
                sock.setsockopt(zmq.SNDHWM, self._send_hwm)
                sock.setsockopt(zmq.RCVHWM, self._receive_hwm)
                # zmq heartbeats drop a dead connection within the liveness, so a send to a
                # busy worker that does not beat itself (MDP, DagBox C++) fails once its
                # connection is gone (peers Rule L3), and in secure mode its id is freed.
                interval = max(1, round(self.heartbeat_interval * 1000))
                sock.setsockopt(zmq.HEARTBEAT_IVL, interval)
                sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, interval * self._core.liveness)
                if security is None:
                    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
                else:
                    # No handover: a connection that claims a routing id in use is refused.
                    configure_server_socket(sock, security)
                for endpoint in self._bind:
                    if await _ipc_taken(endpoint):  # zmq would take it over without a word
                        raise BindFailed(
                            f"cannot bind {endpoint}: Address already in use (a process "
                            "listens there)",
                            endpoint,
                            errno.EADDRINUSE,
                        )
                bound = []
                for endpoint in self._bind:
                    with bind_errors(endpoint):  # dcp's own error (dcp._io.errors Rule Z3)
                        sock.bind(endpoint)
                    bound.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
                approver = None if self._approve is None else ApproverRunner(self._approve)
                link = CoreLink(
                    self._core,
                    asock,
                    max_message_size=self._max_message_size,
                    approver=approver,
                )
                self._calls.link = link
                self.endpoints = bound
                self._core.started = time.monotonic() if self._io_thread else anyio.current_time()
                logger.info(
                    "broker bound to %s%s", ", ".join(bound), " (CURVE)" if security else ""
                )
                if security is None:
                    level, text = plaintext_notice(bound, beacon=self._beacon is not None)
                    logger.log(level, "%s", text)
                async with anyio.create_task_group() as tg:
                    if zap is not None:
                        tg.start_soon(zap.serve)
                    if self._beacon is not None:
                        await tg.start(self._send_beacons, bound)
                    if self._http is not None:
                        await tg.start(
                            self._reports.serve_http, self._http, bound, self._http_bound
                        )
                    if self._log_summary is not None:
                        tg.start_soon(log_summaries, self._core.overview, self._log_summary)
                    if approver is not None:
                        tg.start_soon(approver.run, link.answered)
                    if self._io_thread:
                        task_status.started(bound)
                        await IOThread(
                            link,
                            self._calls,
                            ctx,
                            batch=self._batch,
                            period=self.heartbeat_interval / 4,
                        ).run()
                    else:
                        tg.start_soon(link.expire_loop, self.heartbeat_interval / 4)
                        task_status.started(bound)
                        await link.receive_loop(self._batch)
            finally:
                self._calls.link = None
                self._serving = False
                self.endpoints = []

    def _http_bound(self, address: str | None) -> None:
        self.http_address = address

    async def _send_beacons(
        self, bound: list[str], *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        assert self._beacon is not None
        port = next(int(e.rpartition(":")[2]) for e in bound if e.startswith("tcp://"))
        security = self._security.security
        key = None if security is None else security.public_key
        await send_beacons(
            self._beacon, port, address=self._beacon_address, key=key, task_status=task_status
        )

    @ki_protected  # dcp._io.lifecycle Rule E6
    async def __aenter__(self) -> Broker:
        await self._lifecycle.enter(self.serve)
        return self

    @ki_protected
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        # Rules E2 and E3 of dcp._io.lifecycle: cancelled, then the body's exception goes on
        # unwrapped (an error of the broker's own is raised instead, unwrapped too).
        await self._lifecycle.exit(exc)
        return None
