"""Real-socket peers for the client tests, each running in its own thread.

- :class:`FakeBroker`: a plain ROUTER that answers client requests itself, by a *policy*
  (echo, drop the first attempt, answer twice, error reply, stay silent, delay, ...), and
  records what it saw. It stands in for the broker where a test needs to misbehave.
- :class:`RawWorker`: a plain DEALER worker (register, ping, echo) for tests against the real
  :class:`dcp.Broker`.
- :func:`broker_in_thread`: a real :class:`dcp.Broker` on an event loop in another thread, for
  the blocking client.
- :class:`DagBoxBroker`: a plain ROUTER standing in for the DagBox C++ reference broker,
  which writes 4-byte type frames and aborts on any other width.

Every loop is bounded in time; sockets are created, used and closed in their own thread.
"""

from __future__ import annotations

import contextlib
import heapq
import queue
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType

import anyio.from_thread
import zmq

from dcp._broker.broker import Broker
from dcp._io.context import get_context
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import (
    Message,
    Ping,
    Pong,
    Reconnect,
    Register,
    Reply,
    Request,
    error_reply_data,
)

#: A policy answers (request, attempt number for its id) with replies to send:
#: (delay in seconds, data parts) pairs. An empty list drops the request.
Policy = Callable[[Request, int], Sequence[tuple[float, Sequence[bytes]]]]

_LIFETIME = 60.0  # no helper thread outlives this, whatever a test does


def echo(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    return [(0.0, req.data)]


def silent(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    return []


def drop_first(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    return [] if attempt == 1 else [(0.0, req.data)]


def twice(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    return [(0.0, req.data), (0.01, req.data)]


def fail(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
    return [(0.0, error_reply_data("boom", "the handler failed"))]


def random_delay(max_delay: float, seed: int = 0) -> Policy:
    """Echo after a random delay in ``[0, max_delay)``: replies come back reordered."""
    rng = random.Random(seed)

    def policy(req: Request, attempt: int) -> Sequence[tuple[float, Sequence[bytes]]]:
        return [(rng.random() * max_delay, req.data)]

    return policy


class FakeBroker:
    """A ROUTER that answers requests itself (see the module docstring).

    :param hold_until_idle: if > 0, hold every request until none arrived for this many
        seconds, then answer all held ones in random order; :attr:`max_held` then tells the
        most requests a client had outstanding at once
    """

    def __init__(self, policy: Policy = echo, *, hold_until_idle: float = 0.0) -> None:
        self.policy = policy
        self.hold_until_idle = hold_until_idle
        self.endpoint = ""
        #: Every request received, in order (resends included).
        self.requests: list[Request] = []
        #: Attempts seen per request id (the first metadata part).
        self.attempts: Counter[bytes] = Counter()
        #: Routing ids of the peers that sent requests.
        self.peers: set[bytes] = set()
        self.max_held = 0
        self.replies_sent = 0
        self._outbox: queue.SimpleQueue[list[bytes]] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> FakeBroker:
        self._thread.start()
        assert self._ready.wait(5), "fake broker did not start"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        assert not self._thread.is_alive()
        if self._error is not None and exc is None:
            raise self._error

    def inject(self, frames: list[bytes]) -> None:
        """Send raw ``frames`` (routing id first) from the broker's socket."""
        self._outbox.put(frames)

    def _run(self) -> None:
        try:
            sock = get_context().socket(zmq.ROUTER)
        except BaseException as exc:  # pragma: no cover - setup failure
            self._error = exc
            self._ready.set()
            return
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind("tcp://127.0.0.1:0")
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self._ready.set()
            self._loop(sock)
        except BaseException as exc:  # pragma: no cover - reported by __exit__
            self._error = exc
        finally:
            sock.close(0)
            self._ready.set()

    def _loop(self, sock: zmq.Socket[bytes]) -> None:
        scheduled: list[tuple[float, int, list[bytes]]] = []
        held: list[tuple[bytes, Request, int]] = []
        last_arrival = 0.0
        seq = 0
        end = time.monotonic() + _LIFETIME
        while not self._stop.is_set() and time.monotonic() < end:
            if sock.poll(2):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    ident = frames[0]
                    msg, _ = parse(frames[1:])
                    if not isinstance(msg, Request):
                        continue
                    self.requests.append(msg)
                    self.peers.add(ident)
                    rid = msg.metadata[0] if msg.metadata else b""
                    self.attempts[rid] += 1
                    if self.hold_until_idle > 0:
                        held.append((ident, msg, self.attempts[rid]))
                        self.max_held = max(self.max_held, len(held))
                        last_arrival = time.monotonic()
                        continue
                    for delay, data in self.policy(msg, self.attempts[rid]):
                        seq += 1
                        reply = [ident, *serialize(Reply(ident, msg.metadata, tuple(data)))]
                        heapq.heappush(scheduled, (time.monotonic() + delay, seq, reply))
            now = time.monotonic()
            if held and now - last_arrival >= self.hold_until_idle:
                random.shuffle(held)
                for ident, msg, attempt in held:
                    for delay, data in self.policy(msg, attempt):
                        seq += 1
                        reply = [ident, *serialize(Reply(ident, msg.metadata, tuple(data)))]
                        heapq.heappush(scheduled, (now + delay, seq, reply))
                held.clear()
            while scheduled and scheduled[0][0] <= now:
                sock.send_multipart(heapq.heappop(scheduled)[2])
                self.replies_sent += 1
            while not self._outbox.empty():
                sock.send_multipart(self._outbox.get())


class RawWorker:
    """A DCP worker written with plain pyzmq: registers, pings, answers with ``handler``."""

    def __init__(
        self,
        endpoint: str,
        service: bytes = b"echo",
        handler: Callable[[tuple[bytes, ...]], Sequence[bytes]] = lambda data: data,
        *,
        ping_interval: float = 0.2,
    ) -> None:
        self.endpoint = endpoint
        self.service = service
        self.handler = handler
        self.ping_interval = ping_interval
        self.handled = 0
        #: Set once the broker confirmed the registration.
        self.registered = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> RawWorker:
        """Start the thread; does not wait for the registration (see :attr:`registered`)."""
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        assert not self._thread.is_alive()
        if self._error is not None and exc is None:
            raise self._error

    def _run(self) -> None:
        sock = get_context().socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.endpoint)
            sock.send_multipart(serialize(Register(self.service)))
            next_ping = time.monotonic() + self.ping_interval
            end = time.monotonic() + _LIFETIME
            while not self._stop.is_set() and time.monotonic() < end:
                if sock.poll(2):
                    while True:
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        msg, _ = parse(frames)
                        if isinstance(msg, Register):
                            self.registered.set()
                        elif isinstance(msg, Request):
                            data = tuple(self.handler(msg.data))
                            sock.send_multipart(serialize(Reply(msg.client, msg.metadata, data)))
                            self.handled += 1
                if time.monotonic() >= next_ping:
                    sock.send_multipart(serialize(Ping()))
                    next_ping = time.monotonic() + self.ping_interval
        except BaseException as exc:  # pragma: no cover - reported by __exit__
            self._error = exc
        finally:
            sock.close(0)


class DagBoxBroker:
    """A ROUTER standing in for the DagBox C++ reference broker, in its own thread.

    DagBox writes the type frame as a 4-byte little-endian ``int`` and aborts on a message
    whose type frame is anything else. So does this: the first such message stops it, and
    leaving the ``with`` block raises an :exc:`AssertionError` that names it (even when the
    test failed otherwise, e.g. timed out because the stand-in had stopped).

    Routing is the least that lets a request through, with readiness as one flag per worker
    (as DagBox keeps it): a registration is echoed and makes the worker ready; a ping is
    answered with a pong and makes it ready; a request (client address inserted when
    missing) is queued for its service and given to a ready worker, and one from a worker
    (a forward) makes that worker ready; a reply goes to its client address and makes its
    worker ready; a reconnect forgets the worker.

    :param answer_width: type-frame width of what it writes: 4, as DagBox; 1 to check that a
        peer told to write 4 keeps doing so whatever its broker writes
    """

    def __init__(self, *, answer_width: int = 4) -> None:
        self.answer_width = answer_width
        self.endpoint = ""
        #: Type-frame widths of every message received, counted.
        self.widths: Counter[int] = Counter()
        #: Every message received, with its sender's routing id, in order.
        self.seen: list[tuple[bytes, Message]] = []
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def received(self, kind: type[Message]) -> list[bytes]:
        """Routing ids of the senders of every ``kind`` message received so far, in order."""
        return [ident for ident, msg in list(self.seen) if isinstance(msg, kind)]

    def __enter__(self) -> DagBoxBroker:
        self._thread.start()
        assert self._ready.wait(5), "DagBox stand-in did not start"
        if self._error is not None:  # pragma: no cover - setup failure
            raise self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        assert not self._thread.is_alive()
        if self._error is not None:
            raise self._error  # the test's own failure, if any, is its __context__

    def _run(self) -> None:
        sock = get_context().socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind("tcp://127.0.0.1:0")
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self._ready.set()
            self._loop(sock)
        except BaseException as exc:
            self._error = exc
        finally:
            sock.close(0)
            self._ready.set()

    def _loop(self, sock: zmq.Socket[bytes]) -> None:
        services: dict[bytes, bytes] = {}  # worker -> its service
        ready: dict[bytes, deque[bytes]] = {}  # service -> ready workers, oldest first
        queued: dict[bytes, deque[Request]] = {}  # service -> requests waiting

        def send(ident: bytes, msg: Message) -> None:
            sock.send_multipart([ident, *serialize(msg, width=self.answer_width)])

        def make_ready(ident: bytes) -> None:
            service = services.get(ident)
            if service is not None and ident not in ready.setdefault(service, deque()):
                ready[service].append(ident)

        end = time.monotonic() + _LIFETIME
        while not self._stop.is_set() and time.monotonic() < end:
            if not sock.poll(2):
                continue
            while True:
                try:
                    ident, *frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                width = len(frames[2]) if len(frames) > 2 else 0
                self.widths[width] += 1
                if width != 4:
                    raise AssertionError(
                        f"DagBox aborts: {ident!r} sent a {width}-byte type frame: {frames!r}"
                    )
                msg, _ = parse(frames)
                self.seen.append((ident, msg))
                if isinstance(msg, Register):
                    services[ident] = msg.service
                    send(ident, msg)
                    make_ready(ident)
                elif isinstance(msg, Ping):
                    send(ident, Pong())
                    make_ready(ident)
                elif isinstance(msg, Request):
                    client = ident if msg.client is None else msg.client
                    request = Request(msg.service, client, msg.metadata, msg.data)
                    queued.setdefault(msg.service, deque()).append(request)
                    make_ready(ident)
                elif isinstance(msg, Reply):
                    if msg.client is not None:
                        send(msg.client, msg)
                    make_ready(ident)
                elif isinstance(msg, Reconnect):
                    service = services.pop(ident, None)
                    if service is not None and ident in ready.get(service, ()):
                        ready[service].remove(ident)
            for service, waiting in queued.items():
                idle = ready.get(service)
                while waiting and idle:
                    send(idle.popleft(), waiting.popleft())


@contextlib.contextmanager
def broker_in_thread(**options: object) -> Iterator[str]:
    """Run a real :class:`dcp.Broker` on an event loop in another thread; yield its endpoint."""
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            Broker("tcp://127.0.0.1:0", **options)  # type: ignore[arg-type]
        ) as broker,
    ):
        yield broker.endpoints[0]
