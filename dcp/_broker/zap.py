"""A ZAP handler (ZeroMQ RFC 27) as an anyio task: who may complete a CURVE handshake.

libzmq asks the handler bound to ``inproc://zeromq.zap.01`` *in the same context* about every
CURVE handshake on a socket that has a ZAP domain, and waits for the answer before the
connection is usable. A request (after the REQ envelope our ROUTER sees) is::

    version "1.0", request id, domain, address, identity, mechanism, credentials...

and the reply is::

    version "1.0", request id, status code, status text, user id, metadata

We allow (200) a CURVE client whose public key the policy accepts and set the user id to
that key in z85, which libzmq then attaches to every message from the connection
(``zmq.Frame.get("User-Id")``): that is how the broker knows who sent what. Everything else
is denied (400). A request that does not parse gets 500 if it can be answered at all, and is
dropped otherwise; nothing here raises because of what a peer sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import anyio.abc
import zmq
from zmq.utils import z85

from dcp._io.errors import socket_errors
from dcp._io.sockets import AsyncSocket
from dcp._util import LogOnce

__all__ = ["ZAP_ENDPOINT", "ZapHandler"]

logger = logging.getLogger("dcp.broker")

#: Where libzmq looks for the ZAP handler of a context.
ZAP_ENDPOINT = "inproc://zeromq.zap.01"

_VERSION = b"1.0"
#: A well-formed request: ROUTER id, "", and the seven frames of RFC 27 (CURVE: 1 credential).
_CURVE_FRAMES = 9
_BATCH = 64
#: Keys, and addresses per key, whose origin the handler remembers (see ``addresses``).
_MAX_KEYS = 65_536
_MAX_ADDRESSES = 64


def _send_failed(exc: zmq.ZMQError) -> None:  # pragma: no cover - see ZapHandler.serve
    logger.warning("ZAP: could not send a reply: %s", exc)


class ZapHandler:
    """Answers libzmq's ZAP requests in the context ``context``.

    :param context: the context of the sockets to protect
    :param allow: whether a client's public key (z85 ``bytes``) may connect
    """

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        allow: Callable[[bytes], bool],
    ) -> None:
        self._context = context
        #: The policy: whether a public key may connect (replaced by a security reload).
        self.allow = allow
        self._socket: AsyncSocket | None = None
        #: Logs each denied key once among the most recent 4,096 (LRU).
        self._log_once = LogOnce(logger)
        #: Where each allowed key connected from (the request's address: the peer's IP for
        #: tcp, empty for ipc), for a revocation to drop only those connections
        #: (dcp/_broker/connections.py); ``None`` once more than :data:`_MAX_KEYS` keys were seen.
        self.addresses: dict[bytes, set[bytes]] | None = {}
        #: Handshakes allowed, denied (unknown key or not CURVE), and malformed requests.
        self.allowed = 0
        self.denied = 0
        self.malformed = 0

    def bind(self) -> None:
        """Bind the handler's socket now (so it exists before any CURVE socket binds).

        :raises zmq.ZMQError: another ZAP handler is bound in this context (``EADDRINUSE``)
        """
        sock: zmq.Socket[bytes] = self._context.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(ZAP_ENDPOINT)
        except BaseException:
            sock.close(0)
            raise
        # Bounded reads: a request is small; anything else is garbage to count and drop.
        self._socket = AsyncSocket(sock, max_frames=32, max_bytes=8192)

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Answer requests until cancelled or :meth:`close` (call :meth:`bind` first)."""
        asock = self._socket
        assert asock is not None, "bind() first"
        task_status.started()
        try:
            while True:
                await asock.wait_readable()
                for received in asock.drain(_BATCH):
                    reply = self.answer(received.frames, received.dropped_frames)
                    if reply is not None:
                        # Not routable and never full (inproc, no ROUTER_MANDATORY): only a
                        # socket closed under us fails (dcp._io.errors Z4).
                        with socket_errors(_send_failed):
                            asock.send_nowait(reply)
                if asock.has_input():
                    await anyio.lowlevel.checkpoint()
        except anyio.ClosedResourceError:
            pass

    def close(self) -> None:
        """Close the socket (idempotent). libzmq then refuses new handshakes (the broker's
        socket sets ``ZAP_ENFORCE_DOMAIN``)."""
        if self._socket is not None:
            self._socket.close(0)

    def answer(self, frames: list[bytes], dropped: int = 0) -> list[bytes] | None:
        """The reply to one request as the ROUTER received it (``None``: drop it)."""
        if len(frames) < 4 or frames[1] != b"":
            self._count_malformed("no REQ envelope")
            return None
        envelope = frames[:2]
        request_id = frames[3]
        if dropped or frames[2] != _VERSION or len(frames) < _CURVE_FRAMES - 1:
            self._count_malformed("not a ZAP 1.0 request")
            return [*envelope, _VERSION, request_id, b"500", b"Malformed request", b"", b""]
        address = frames[5]
        mechanism = frames[7]
        credentials = frames[8:]
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            self.denied += 1
            self._log_denial(mechanism, address, "only CURVE is accepted")
            return [*envelope, _VERSION, request_id, b"400", b"CURVE only", b"", b""]
        key = z85.encode(credentials[0])
        if not self.allow(key):
            self.denied += 1
            self._log_denial(key, address, "unknown key")
            return [*envelope, _VERSION, request_id, b"400", b"Unknown key", b"", b""]
        self.allowed += 1
        addresses = self.addresses
        if addresses is not None:
            seen = addresses.setdefault(key, set())
            if len(seen) < _MAX_ADDRESSES:
                seen.add(bytes(address[:64]))
            if len(addresses) > _MAX_KEYS:
                self.addresses = None  # too many to keep: a revocation drops every connection
        return [*envelope, _VERSION, request_id, b"200", b"OK", key, b""]

    def peers_of(self, revoked: Callable[[bytes], bool]) -> set[str] | None:
        """The addresses the keys ``revoked`` says are revoked connected from (``None``:
        not known, assume any)."""
        if self.addresses is None:
            return None
        peers: set[str] = set()
        for key, seen in self.addresses.items():
            if revoked(key):
                peers.update(a.decode("ascii", "replace") for a in seen)
        return peers

    def _count_malformed(self, why: str) -> None:
        self.malformed += 1
        if self.malformed == 1:
            logger.warning("ZAP: dropped a malformed request (%s)", why)

    def _log_denial(self, what: bytes, address: bytes, why: str) -> None:
        self._log_once(
            what,
            "ZAP: denied %s from %s (%s)",
            what[:64].decode("ascii", "replace"),
            address[:64].decode("ascii", "replace") or "?",
            why,
        )
