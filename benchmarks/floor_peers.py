"""The smallest DCP peers one can write with pyzmq: measuring sticks for
:mod:`benchmarks.floor`, not dcp code.

``python -m benchmarks.floor_peers worker --kind KIND --endpoint EP``: one DCP echo worker on
a DEALER socket that registers, prints ``READY`` once the broker confirmed, then loops:
receive a message, parse it (:func:`dcp.wire.dcp1.parse`), answer a request with its data.
No credit beyond one request (it never pings), no work timeouts, no handler call; a
keep-alive (``PONG``, which asks for no work) after a second without messages, so the broker
does not forget it while it waits. Kinds (:data:`WORKERS`): *block*, a blocking
``recv_multipart``; *asyncio*, the same loop on ``zmq.asyncio`` (an ``await`` per receive and
send: an event-loop wake-up per request); *asyncio-fd*, the same on asyncio without
``zmq.asyncio``: a non-blocking receive that, when it finds nothing, waits on the zmq
socket's FD (a reader callback registered once, a future per wait: what dcp's own asyncio
wait does), and non-blocking sends; *trio*, the same on trio, waiting with
:func:`trio.lowlevel.wait_readable`.

``python -m benchmarks.floor_peers client --kind KIND --endpoint EP ...``: a DCP client with
one request in flight (window 1): send the request, wait for its reply; prints the common
result record (:mod:`benchmarks.common`). The kinds (:data:`CLIENTS`) wait as the workers of
the same names do.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

import zmq
import zmq.asyncio

from dcp.wire.dcp1 import Pong, Register, Reply, Request, parse, serialize

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

__all__ = ["CLIENTS", "WORKERS", "main"]

#: The worker kinds and the client kinds.
WORKERS = ("block", "asyncio", "asyncio-fd", "trio")
CLIENTS = ("block", "asyncio", "asyncio-fd", "trio")
#: Seconds without a message after which a worker sends a keep-alive (the broker forgets a
#: DCP worker silent for ``liveness x heartbeat_interval``, 3 s by default).
KEEPALIVE = 1.0
#: Seconds a worker waits for the broker to confirm its registration.
REGISTER_TIMEOUT = 30.0

_clock = time.perf_counter_ns
_PONG = serialize(Pong())


def _dealer(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


class _Reader:
    """Waits on a zmq socket's FD on asyncio the cheapest way we know (what dcp's own
    asyncio wait does): one reader callback registered with the loop for good, a future per
    wait. The selector is level-triggered and zmq's FD stays readable until ``zmq.EVENTS``
    is read, so the callback reads it when nothing waits."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[None] | None = None
        self.loop.add_reader(sock.fileno(), self.wake)

    def wake(self) -> None:
        future, self.future = self.future, None
        if future is None:
            self.sock.getsockopt(zmq.EVENTS)  # nothing waits: take the FD's signal
        elif not future.done():
            future.set_result(None)

    async def recv(self) -> list[bytes]:
        """The next message: a non-blocking read, else a wait and another read."""
        while True:
            try:
                return self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                pass
            self.future = self.loop.create_future()
            await self.future

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())


def _confirmed(frames: Sequence[bytes], service: bytes) -> bool:
    msg, _ = parse(frames)
    return type(msg) is Register and msg.service == service


def _block_worker(endpoint: str, service: bytes) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = _dealer(ctx, endpoint)
    s.setsockopt(zmq.RCVTIMEO, int(REGISTER_TIMEOUT * 1000))
    s.send_multipart(serialize(Register(service)))
    while not _confirmed(s.recv_multipart(), service):
        pass
    ready()
    s.setsockopt(zmq.RCVTIMEO, int(KEEPALIVE * 1000))
    while True:
        try:
            frames = s.recv_multipart()
        except zmq.Again:
            s.send_multipart(_PONG)
            continue
        msg, _ = parse(frames)
        if type(msg) is Request:
            s.send_multipart(serialize(Reply(msg.client, msg.metadata, msg.data)))


async def _asyncio_worker(endpoint: str, service: bytes) -> None:
    ctx = zmq.asyncio.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    await s.send_multipart(serialize(Register(service)))
    while not _confirmed(await asyncio.wait_for(s.recv_multipart(), REGISTER_TIMEOUT), service):
        pass
    ready()
    last = time.monotonic()

    async def keepalive() -> None:
        # A timer a second, not a timeout per receive (which would cost every request).
        while True:
            await asyncio.sleep(KEEPALIVE)
            if time.monotonic() - last >= KEEPALIVE:
                await s.send_multipart(_PONG)

    beat = asyncio.create_task(keepalive())
    try:
        while True:
            frames = await s.recv_multipart()
            last = time.monotonic()
            msg, _ = parse(frames)
            if type(msg) is Request:
                await s.send_multipart(serialize(Reply(msg.client, msg.metadata, msg.data)))
    finally:
        beat.cancel()


async def _trio_worker(endpoint: str, service: bytes) -> None:
    import trio

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = _dealer(ctx, endpoint)
    fd = s.fileno()

    async def recv() -> list[bytes]:
        while True:
            try:
                return s.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                pass
            try:  # noqa: SIM105 (a try costs nothing; contextlib.suppress a call per wait)
                await trio.lowlevel.wait_readable(fd)
            except trio.ClosedResourceError:  # woken by the keep-alive below
                pass

    s.send_multipart(serialize(Register(service)))
    with trio.fail_after(REGISTER_TIMEOUT):
        while not _confirmed(await recv(), service):
            pass
    ready()
    last = time.monotonic()

    async def keepalive() -> None:
        while True:
            await trio.sleep(KEEPALIVE)
            if time.monotonic() - last >= KEEPALIVE:
                s.send_multipart(_PONG)
                # zmq's FD is edge-triggered and this send may have taken the edge of a
                # message that came meanwhile: then wake the receive loop's wait (trio's
                # documented way: its waiters get ClosedResourceError; the FD stays open).
                if s.poll(0, zmq.POLLIN):
                    trio.lowlevel.notify_closing(fd)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keepalive)
        while True:
            frames = await recv()
            last = time.monotonic()
            msg, _ = parse(frames)
            if type(msg) is Request:
                s.send_multipart(serialize(Reply(msg.client, msg.metadata, msg.data)))


async def _asyncio_fd_worker(endpoint: str, service: bytes) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = _dealer(ctx, endpoint)
    reader = _Reader(s)
    s.send_multipart(serialize(Register(service)))
    while not _confirmed(await asyncio.wait_for(reader.recv(), REGISTER_TIMEOUT), service):
        pass
    ready()
    last = time.monotonic()

    async def keepalive() -> None:
        while True:
            await asyncio.sleep(KEEPALIVE)
            if time.monotonic() - last >= KEEPALIVE:
                s.send_multipart(_PONG)
                # The send may have taken the FD's signal of a message that came meanwhile.
                if s.poll(0, zmq.POLLIN):
                    reader.wake()

    beat = asyncio.create_task(keepalive())
    try:
        while True:
            frames = await reader.recv()
            last = time.monotonic()
            msg, _ = parse(frames)
            if type(msg) is Request:
                s.send_multipart(serialize(Reply(msg.client, msg.metadata, msg.data)))
    finally:
        beat.cancel()
        reader.close()


def _reply_ok(frames: Sequence[bytes]) -> bool:
    msg, _ = parse(frames)
    return type(msg) is Reply


def _block_phase(
    s: zmq.Socket[bytes], request: list[bytes], count: int, duration: float
) -> tuple[list[int], int]:
    """Latencies (ns) and unexpected messages; a reply missing for the receive timeout
    raises :class:`zmq.Again`."""
    latencies: list[int] = []
    unexpected = 0
    end = _clock() + int(duration * 1e9)
    for _ in range(count):
        t0 = _clock()
        if t0 >= end:
            break
        s.send_multipart(request)
        while not _reply_ok(s.recv_multipart()):
            unexpected += 1
        latencies.append(_clock() - t0)
    return latencies, unexpected


def _run_block_client(st: LoadSettings, request: list[bytes]) -> Result:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = _dealer(ctx, st.endpoint)
    s.setsockopt(zmq.RCVTIMEO, int(st.warmup_timeout * 1000))
    try:
        _block_phase(s, request, st.warmup, st.warmup_timeout)
        s.setsockopt(zmq.RCVTIMEO, int(st.drain_timeout * 1000))
        probe = Probe(st.broker_pid, st.worker_pids)
        probe.start()
        latencies, unexpected = _block_phase(s, request, st.count, st.duration)
        probe.stop()
    finally:
        s.close(0)
        ctx.term()
    return Result.build(latencies, probe, lost=0, unexpected=unexpected)


async def _run_asyncio_client(st: LoadSettings, request: list[bytes]) -> Result:
    ctx = zmq.asyncio.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(st.endpoint)

    async def phase(count: int, duration: float, limit: float | None) -> tuple[list[int], int]:
        latencies: list[int] = []
        unexpected = 0
        end = _clock() + int(duration * 1e9)
        for _ in range(count):
            t0 = _clock()
            if t0 >= end:
                break
            await s.send_multipart(request)
            while True:
                if limit is None:
                    frames = await s.recv_multipart()
                else:
                    frames = await asyncio.wait_for(s.recv_multipart(), limit)
                if _reply_ok(frames):
                    break
                unexpected += 1
            latencies.append(_clock() - t0)
        return latencies, unexpected

    try:
        await phase(st.warmup, st.warmup_timeout, st.warmup_timeout)
        probe = Probe(st.broker_pid, st.worker_pids)
        probe.start()
        # No timeout per receive in the measured phase (a timer per request is not the
        # floor); the process is bounded by its caller's timeout.
        latencies, unexpected = await phase(st.count, st.duration, None)
        probe.stop()
    finally:
        s.close(0)
        ctx.term()
    return Result.build(latencies, probe, lost=0, unexpected=unexpected)


async def _run_asyncio_fd_client(st: LoadSettings, request: list[bytes]) -> Result:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = _dealer(ctx, st.endpoint)
    reader = _Reader(s)

    async def phase(count: int, duration: float) -> tuple[list[int], int]:
        latencies: list[int] = []
        unexpected = 0
        end = _clock() + int(duration * 1e9)
        for _ in range(count):
            t0 = _clock()
            if t0 >= end:
                break
            s.send_multipart(request, zmq.NOBLOCK)
            while not _reply_ok(await reader.recv()):
                unexpected += 1
            latencies.append(_clock() - t0)
        return latencies, unexpected

    try:
        await asyncio.wait_for(phase(st.warmup, st.warmup_timeout), st.warmup_timeout)
        probe = Probe(st.broker_pid, st.worker_pids)
        probe.start()
        latencies, unexpected = await phase(st.count, st.duration)
        probe.stop()
    finally:
        reader.close()
        s.close(0)
        ctx.term()
    return Result.build(latencies, probe, lost=0, unexpected=unexpected)


async def _run_trio_client(st: LoadSettings, request: list[bytes]) -> Result:
    import trio

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = _dealer(ctx, st.endpoint)
    fd = s.fileno()

    async def phase(count: int, duration: float) -> tuple[list[int], int]:
        latencies: list[int] = []
        unexpected = 0
        end = _clock() + int(duration * 1e9)
        for _ in range(count):
            t0 = _clock()
            if t0 >= end:
                break
            s.send_multipart(request, zmq.NOBLOCK)
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    # zmq's FD is edge-triggered: the failed read above reset it, so a
                    # wake-up now means something changed.
                    await trio.lowlevel.wait_readable(fd)
                    continue
                if _reply_ok(frames):
                    break
                unexpected += 1
            latencies.append(_clock() - t0)
        return latencies, unexpected

    try:
        with trio.fail_after(st.warmup_timeout):
            await phase(st.warmup, st.warmup_timeout)
        probe = Probe(st.broker_pid, st.worker_pids)
        probe.start()
        latencies, unexpected = await phase(st.count, st.duration)
        probe.stop()
    finally:
        s.close(0)
        ctx.term()
    return Result.build(latencies, probe, lost=0, unexpected=unexpected)


def _client(kind: str, st: LoadSettings) -> Result:
    if st.window != 1 or st.clients != 1:
        raise SystemExit("floor_peers client: one client, window 1")
    request = serialize(Request(st.service, None, (), (b"x" * st.payload,)))
    if kind == "block":
        return _run_block_client(st, request)
    if kind == "asyncio":
        return asyncio.run(_run_asyncio_client(st, request))
    if kind == "asyncio-fd":
        return asyncio.run(_run_asyncio_fd_client(st, request))
    import trio

    result: Result = trio.run(_run_trio_client, st, request)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor_peers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("worker")
    p.add_argument("--kind", choices=WORKERS, required=True)
    p.add_argument("--endpoint", required=True)
    p.add_argument("--service", default="echo")
    p = sub.add_parser("client")
    p.add_argument("--kind", choices=CLIENTS, required=True)
    add_load_arguments(p)
    args = parser.parse_args(argv)
    raise_fd_limit()
    if args.command == "worker":
        service = str(args.service).encode()
        if args.kind == "block":
            _block_worker(args.endpoint, service)
        elif args.kind == "asyncio":
            asyncio.run(_asyncio_worker(args.endpoint, service))
        elif args.kind == "asyncio-fd":
            asyncio.run(_asyncio_fd_worker(args.endpoint, service))
        else:
            import trio

            trio.run(_trio_worker, args.endpoint, service)
        return
    result = _client(args.kind, settings_from_args(args))
    result.extra["kind"] = args.kind
    emit(result)


if __name__ == "__main__":
    main()
