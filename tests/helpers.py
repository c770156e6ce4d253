"""Raw DEALER peers for broker tests: exact frames in, exact frames out, no dcp logic.

A :class:`RawPeer` is a plain pyzmq DEALER with a chosen routing id. It never blocks the
event loop: receiving polls with ``NOBLOCK`` and sleeps briefly between tries, bounded by a
deadline. :class:`Peers` creates them and closes them all (linger 0) on exit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TypeVar

import anyio
import zmq

from dcp._io.context import get_context
from dcp._io.security import CurveClient, configure_client_socket
from dcp.wire import Message, parse, serialize

__all__ = ["POLL", "Peers", "RawPeer", "wait_for"]

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
