"""Shared test helpers: the broker core in memory, and raw DEALER peers for broker tests.

The broker core (sans-IO, :class:`~dcp._core.broker.core.BrokerCore`): messages go in as the
ROUTER sees them (routing id first, :func:`out`, :func:`feed`), what it wants sent comes back
with :func:`take`, its events (log lines, approval questions) with :func:`take_events`.
:func:`req`, :func:`given` and :func:`answer` name request number *n* as a client sends it,
as a worker gets it and as the worker answers it.

A :class:`RawPeer` is a plain pyzmq DEALER with a chosen routing id: exact frames in, exact
frames out, no dcp logic. It never blocks the event loop: receiving polls with ``NOBLOCK``
and sleeps briefly between tries, bounded by a deadline. :class:`Peers` creates them and
closes them all (linger 0) on exit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TypeVar

import anyio
import zmq

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.outputs import Event
from dcp._io.context import get_context
from dcp._io.security import CurveClient, configure_client_socket
from dcp.wire import Message, Register, Reply, Request, parse, serialize
from dcp.wire.messages import parse_error_reply

__all__ = [
    "C1",
    "C2",
    "ECHO",
    "POLL",
    "W1",
    "W2",
    "W3",
    "Peers",
    "RawPeer",
    "answer",
    "error_of",
    "feed",
    "given",
    "out",
    "req",
    "take",
    "take_events",
    "wait_for",
    "workers",
]

E = TypeVar("E")

# ---------------------------------------------------------------- the broker core

W1, W2, W3 = b"W1", b"W2", b"W3"
C1, C2 = b"C1", b"C2"
ECHO = b"echo"


def out(peer: bytes, msg: Message, width: int = 1) -> list[bytes]:
    """A message as the ROUTER sends (or receives) it."""
    return [peer, *serialize(msg, width=width)]


def feed(
    core: BrokerCore,
    peer: bytes,
    msg: Message | Sequence[bytes],
    width: int = 1,
    *,
    now: float = 0.0,
) -> None:
    """``msg`` from ``peer`` at ``now``: a DCP message (serialized in ``width``), or the
    frames after the routing id."""
    if isinstance(msg, Message):
        core.receive(out(peer, msg, width), now)
    else:
        core.receive([peer, *msg], now)


def take(core: BrokerCore) -> list[list[bytes]]:
    """The messages the core wants sent, taken (its events are left for
    :func:`take_events`)."""
    sent = list(core.outbox)
    core.outbox.clear()
    return sent


def take_events(core: BrokerCore, kind: type[E]) -> list[E]:
    """The core's events of ``kind``, taken (the others are left)."""
    events = core.events
    taken: list[E] = [e for e in events if isinstance(e, kind)]
    kept: list[Event] = [e for e in events if not isinstance(e, kind)]
    events[:] = kept
    return taken


def req(n: int, service: bytes = ECHO, client: bytes | None = None) -> Request:
    """Request number ``n``: its metadata and data name it."""
    return Request(service, client, (b"m%d" % n,), (b"d%d" % n,))


def given(
    worker: bytes, n: int, client: bytes, service: bytes = ECHO, width: int = 1
) -> list[bytes]:
    """Request ``n`` from ``client`` as dispatched to ``worker``."""
    return out(worker, req(n, service, client), width)


def answer(n: int, client: bytes) -> Reply:
    """The reply to request ``n`` of ``client``."""
    return Reply(client, (b"m%d" % n,), (b"r%d" % n,))


def error_of(frames: list[bytes]) -> tuple[bytes, str, tuple[bytes, ...]]:
    """(recipient, error code, metadata) of an error reply as sent by the ROUTER."""
    msg, _ = parse(frames[1:])
    assert isinstance(msg, Reply)
    assert msg.client == frames[0]
    parsed = parse_error_reply(msg.data)
    assert parsed is not None, frames
    return frames[0], parsed[0], msg.metadata


def workers(core: BrokerCore, *idents: bytes, service: bytes = ECHO) -> None:
    """Register each worker for ``service`` and discard the echoes."""
    for ident in idents:
        feed(core, ident, Register(service))
    take(core)


# ---------------------------------------------------------------- raw peers

#: Seconds between receive attempts.
POLL = 0.001

T = TypeVar("T")


async def wait_for(probe: Callable[[], T], within: float = 5.0) -> T:
    """Call ``probe`` every :data:`POLL` seconds until it returns something true; return it.

    :raises TimeoutError: still false after ``within`` seconds
    """
    with anyio.fail_after(within):
        while True:
            value = probe()
            if value:
                return value
            await anyio.sleep(POLL)


class RawPeer:
    """A DEALER socket connected to a broker, speaking one type-frame width by default."""

    def __init__(self, sock: zmq.Socket[bytes], ident: bytes, width: int) -> None:
        self.sock = sock
        self.ident = ident
        self.width = width

    def send(self, msg: Message, *, width: int | None = None) -> None:
        """Send ``msg`` serialized in ``width`` (default: the peer's width)."""
        self.send_frames(serialize(msg, width=self.width if width is None else width))

    def send_frames(self, frames: Sequence[bytes]) -> None:
        self.sock.send_multipart(list(frames), zmq.NOBLOCK)

    async def recv_frames(self, within: float = 5.0) -> list[bytes]:
        """The next message's frames (DEALER side, starting with the empty delimiter).

        :raises TimeoutError: nothing arrived within ``within`` seconds
        """
        with anyio.fail_after(within):
            while True:
                try:
                    return self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    await anyio.sleep(POLL)

    async def recv(self, within: float = 5.0) -> tuple[Message, int]:
        """The next message, parsed, with its type-frame width."""
        return parse(await self.recv_frames(within))

    async def expect(self, msg: Message, *, width: int | None = None) -> None:
        """Receive one message and check it is exactly ``msg`` in ``width``, frame by frame."""
        expected = serialize(msg, width=self.width if width is None else width)
        got = await self.recv_frames()
        assert got == expected, f"{self.ident!r} got {got!r}, expected {expected!r}"

    async def expect_silence(self, seconds: float = 0.05) -> None:
        """Check that nothing arrives for ``seconds``."""
        with anyio.move_on_after(seconds):
            got = await self.recv_frames(seconds + 1)
            raise AssertionError(f"{self.ident!r} got unexpected {got!r}")

    def close(self) -> None:
        self.sock.close(0)


class Peers:
    """Makes :class:`RawPeer` sockets connected to ``endpoint``; closes them on exit."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._peers: list[RawPeer] = []

    def __call__(
        self,
        ident: bytes,
        *,
        width: int = 1,
        rcvhwm: int | None = None,
        security: CurveClient | None = None,
    ) -> RawPeer:
        sock: zmq.Socket[bytes] = get_context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, ident)
        configure_client_socket(sock, security)
        if rcvhwm is not None:
            sock.setsockopt(zmq.RCVHWM, rcvhwm)
        sock.connect(self.endpoint)
        peer = RawPeer(sock, ident, width)
        self._peers.append(peer)
        return peer

    def __enter__(self) -> Peers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for peer in self._peers:
            peer.close()
