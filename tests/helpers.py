"""Shared test helpers: the sans-IO cores in memory, and raw DEALER peers for broker tests.

The broker core (sans-IO, :class:`~dcp._core.broker.core.BrokerCore`): messages go in as the
ROUTER sees them (routing id first, :func:`out`, :func:`feed`), what it wants sent comes back
with :func:`take`, its events (log lines, approval questions) with :func:`take_events`.
:func:`req`, :func:`given` and :func:`answer` name request number *n* as a client sends it,
as a worker gets it and as the worker answers it.

A :class:`RawPeer` is a plain pyzmq DEALER with a chosen routing id: exact frames in, exact
frames out, no dcp logic. It never blocks the event loop: receiving polls with ``NOBLOCK``
and sleeps briefly between tries, bounded by a deadline. :class:`Peers` creates them and
closes them all (linger 0) on exit.

:func:`take_worker` drains a :class:`~dcp._core.worker.core.WorkerCore`; :class:`Wired` and
:class:`Crossed` connect one to a :class:`~dcp._core.broker.core.BrokerCore` in memory (h11's
``ConnectionPair``): synchronous, with an explicit ``now``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Sequence
from types import TracebackType
from typing import TypeVar

import anyio
import zmq

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.outputs import Event
from dcp._core.client.tracker import RequestTracker
from dcp._core.worker.core import Event as WorkerEvent
from dcp._core.worker.core import Run, WorkerCore
from dcp._io.context import get_context
from dcp._io.security import CurveClient, configure_client_socket
from dcp._worker.results import result_message
from dcp.wire import Message, Register, Reply, Request, parse, serialize
from dcp.wire.messages import parse_error_reply

__all__ = [
    "C1",
    "C2",
    "SVC",
    "ECHO",
    "POLL",
    "W1",
    "W2",
    "W3",
    "Crossed",
    "Peers",
    "RawPeer",
    "Wired",
    "answer",
    "error_of",
    "feed",
    "given",
    "out",
    "req",
    "take",
    "take_events",
    "take_tracker",
    "take_worker",
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

    async def recv_frames(
        self, within: float = 5.0, *, skip: Collection[Sequence[bytes]] = ()
    ) -> list[bytes]:
        """The next message's frames (DEALER side, starting with the empty delimiter).

        :param skip: messages to pass over, frame for frame (those the protocol allows in
            between at any time, such as the broker's heartbeats)
        :raises TimeoutError: nothing else arrived within ``within`` seconds
        """
        skipped = [list(frames) for frames in skip]
        with anyio.fail_after(within):
            while True:
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    await anyio.sleep(POLL)
                    continue
                if frames not in skipped:
                    return frames

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


# -- the worker core, alone and wired to the broker core in memory ---------------------------

#: The service of :class:`Wired` and :class:`Crossed`.
SVC = b"echo"


def take_worker(core: WorkerCore) -> list[Message | WorkerEvent]:
    """Drain ``core`` (:meth:`~dcp._core.worker.core.WorkerCore.drain`): the messages it
    would send, parsed back from their frames, in order, then its events, in order. (The two
    lists are apart: the order between a message and an event is not the core's to say.)"""
    outbox, events = core.drain()
    return [*(parse(frames)[0] for frames in outbox), *events]


def _broker_sent(broker: BrokerCore) -> list[list[bytes]]:
    return broker.drain()[0]


class Wired:
    """A WorkerCore (routing id ``W``) and a BrokerCore connected in memory, with one client
    (``C``): every message is delivered at once."""

    def __init__(self, n: int, prefetch: int = 0) -> None:
        self.now = 0.0
        self.broker = BrokerCore(heartbeat_interval=1.0, liveness=3)
        self.worker = WorkerCore(SVC, concurrency=n, prefetch=prefetch)
        self.running: list[Request] = []
        self.max_running = 0
        self.replies: list[Reply] = []
        self.worker.connect(self.now)
        self.flush()
        self.pump()

    def flush(self) -> None:
        """Deliver the worker's messages to the broker; start its runs."""
        outbox, events = self.worker.drain()
        for frames in outbox:
            self.broker.receive([b"W", *frames], self.now)
        for event in events:
            assert isinstance(event, Run), event
            self.running.append(event.request)
            self.max_running = max(self.max_running, len(self.running))
            assert len(self.running) == self.worker.in_progress

    def pump(self) -> None:
        for _ in range(10_000):
            if not self.broker.outbox:
                return
            for frames in _broker_sent(self.broker):
                if frames[0] == b"W":
                    self.worker.receive(frames[1:], self.now)
                    self.flush()
                else:
                    assert frames[0] == b"C"
                    msg, _ = parse(frames[1:])
                    assert isinstance(msg, Reply)
                    self.replies.append(msg)
        raise AssertionError("broker and worker did not settle")  # pragma: no cover

    def client_request(self, i: int) -> None:
        msg = Request(SVC, None, (b"id-%d" % i,), (b"%d" % i,))
        self.broker.receive([b"C", *serialize(msg)], self.now)
        self.pump()

    def finish(self, index: int) -> None:
        request = self.running.pop(index)
        self.worker.finish(result_message(request, request.data[0]), self.now)
        self.flush()
        self.pump()

    def advance(self, dt: float) -> None:
        self.now += dt
        self.worker.expire(self.now)
        self.flush()
        self.broker.expire(self.now)
        self.pump()


class Crossed:
    """A WorkerCore and a BrokerCore whose messages travel through two FIFO pipes, delivered
    in an order the test chooses: requests and replies cross each other in flight."""

    def __init__(self, n: int) -> None:
        self.broker = BrokerCore(heartbeat_interval=1.0, liveness=3)
        self.worker = WorkerCore(SVC, concurrency=n)
        self.to_broker: deque[list[bytes]] = deque()
        self.to_worker: deque[list[bytes]] = deque()
        self.running: list[Request] = []
        self.replies: list[Reply] = []
        self.worker.connect(0.0)
        self.flush()

    def flush(self) -> None:
        """Put the worker's messages in the pipe to the broker; start its runs."""
        outbox, events = self.worker.drain()
        for frames in outbox:
            self.to_broker.append([b"W", *frames])
        for event in events:
            assert isinstance(event, Run), event
            self.running.append(event.request)

    def collect(self) -> None:
        for frames in _broker_sent(self.broker):
            if frames[0] == b"W":
                self.to_worker.append(frames[1:])
            else:
                msg, _ = parse(frames[1:])
                assert isinstance(msg, Reply)
                self.replies.append(msg)

    def step(self, kind: str, k: int) -> None:
        if kind == "up" and self.to_broker:
            self.broker.receive(self.to_broker.popleft(), 0.0)
            self.collect()
        elif kind == "down" and self.to_worker:
            self.worker.receive(self.to_worker.popleft(), 0.0)
            self.flush()
        elif kind == "fin" and self.running:
            request = self.running.pop(k % len(self.running))
            self.worker.finish(result_message(request, request.data[0]), 0.0)
            self.flush()

    def settle(self) -> None:
        while self.to_broker or self.to_worker:
            self.step("up", 0)
            self.step("down", 0)


# -- the client's request tracker ------------------------------------------------------------


def take_tracker(tracker: RequestTracker) -> list[list[bytes]]:
    """Drain ``tracker`` (:meth:`~dcp._core.client.tracker.RequestTracker.drain`): the frames
    its last calls asked to send; there must be no event (only ``expire`` makes them)."""
    out, events = tracker.drain()
    assert not events
    return out
