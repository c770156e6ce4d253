"""dcp streams end to end (real sockets, both anyio backends): parts in order, the whole
answer for a plain request, early exit and cancellation closing the worker's generator, a
worker killed mid-stream, a slow reader pausing the writer, Majordomo peers on either side,
``SyncClient.stream`` and ``dcp call --stream``. The rules are in :mod:`dcp._core.broker.streams`,
:mod:`dcp._worker.streams` and :mod:`dcp._client.streams`; their sans-IO tests in
``test_streams_core.py``."""

from __future__ import annotations

import functools
import subprocess
import sys
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq
from majortomo import Client as MtClient

import dcp
import dcp.wire.streams as wire
from dcp._client.streams import StreamReader
from dcp._client.waiters import StreamWaiter, deliver_part
from dcp._core.client.calls import Timing
from dcp._io.context import get_context
from dcp._models import Outcome
from dcp._worker.streams import WorkerStreams, is_stream_handler
from dcp.wire import mdp
from tests.cli.procs import Proc, start, start_broker
from tests.helpers import Peers, wait_for
from tests.interop.test_mdp_peers import majortomo_worker

pytestmark = pytest.mark.anyio

V02C = mdp.peer(mdp.Form.V02, envelope=False, worker=False)


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[tuple[dcp.Broker, str]]:
    broker = dcp.Broker("tcp://127.0.0.1:0", **options)
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(broker.serve)
        yield broker, endpoint
        tg.cancel_scope.cancel()


class Counting:
    """A stream handler: ``int(data[0])`` parts (``b"<i>"``, or 64 KiB each with ``big``),
    counting what it produced and whether its ``finally`` ran."""

    def __init__(
        self, *, big: bool = False, pause_after: int | None = None, repeat: int = 8192
    ) -> None:
        self.produced = 0
        self.closed = anyio.Event()
        self.started = anyio.Event()
        self.big = big
        self.pause_after = pause_after
        self.repeat = repeat

    async def __call__(self, request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        self.started.set()
        try:
            for i in range(int(request.data[0])):
                if i == self.pause_after:
                    await anyio.sleep_forever()  # busy, not at a yield
                self.produced += 1
                yield (b"%08d" % i) * self.repeat if self.big else b"%d" % i
        finally:
            self.closed.set()


async def test_a_thousand_parts_in_order_and_a_plain_request_gets_them_all() -> None:
    handler = Counting()
    async with (
        serving() as (broker, endpoint),
        dcp.Worker(endpoint, "count", handler),
        dcp.Client(endpoint, timeout=20) as client,
    ):
        async with client.stream("count", b"1000", window=16) as parts:
            got = [part async for part in parts]
        assert got == [(b"%d" % i,) for i in range(1000)]
        assert parts.received == 1000
        # A plain request gets the whole answer: every part, in order, in one reply.
        reply = await client.request("count", b"5")
        assert reply.data == (b"0", b"1", b"2", b"3", b"4")
        stats = broker.statistics()
        assert stats.partials == 1000
        assert stats.streams.open == 0
        assert stats.streams.outstanding_max <= 16
        assert stats.redeliveries == 0


async def test_leaving_early_closes_the_workers_generator() -> None:
    handler = Counting()
    async with (
        serving() as (broker, endpoint),
        dcp.Worker(endpoint, "count", handler) as worker,
        dcp.Client(endpoint, timeout=20) as client,
    ):
        async with client.stream("count", b"1000000", window=8) as parts:
            async for part in parts:
                if part == (b"20",):
                    break
        with anyio.fail_after(10):  # the cancel reaches the generator (a hang guard)
            await handler.closed.wait()
        assert handler.produced < 1000
        await wait_for(lambda: worker.statistics().in_progress == 0)
        # The slot is free again: the next stream runs.
        async with client.stream("count", b"3") as parts:
            assert [p async for p in parts] == [(b"0",), (b"1",), (b"2",)]
        assert broker.statistics().streams.cancelled == 1


async def test_an_exception_in_the_reader_cancels_a_generator_busy_at_an_await() -> None:
    handler = Counting(pause_after=3)
    async with (
        serving() as (_, endpoint),
        dcp.Worker(endpoint, "count", handler),
        dcp.Client(endpoint, timeout=20) as client,
    ):
        with pytest.raises(KeyError):
            async with client.stream("count", b"10") as parts:
                async for part in parts:
                    if part == (b"2",):
                        raise KeyError("reader failed")
        with anyio.fail_after(10):
            await handler.closed.wait()


async def test_cancelling_the_reader_and_cancelling_before_the_first_part() -> None:
    async def late(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        try:
            await anyio.sleep(0.3)
            yield b"first"
            await anyio.sleep_forever()
        finally:
            closed.set()

    closed = anyio.Event()
    async with (
        serving() as (broker, endpoint),
        dcp.Worker(endpoint, "late", late),
        dcp.Client(endpoint, timeout=20) as client,
    ):
        with anyio.move_on_after(0.1):
            async with client.stream("late") as parts:
                async for _ in parts:
                    pass  # pragma: no cover - cancelled before the first part
        # The broker remembered the cancel and acts on the first part.
        with anyio.fail_after(2):
            await closed.wait()
        assert broker.statistics().streams.cancelled == 1


async def test_stall_timeout_and_handler_errors_mid_stream() -> None:
    async def failing(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        yield b"one"
        if request.data[0] == b"stall":
            await anyio.sleep_forever()
        if request.data[0] == b"bad":
            yield 42  # type: ignore[misc]
        raise ValueError("broken source")

    async with (
        serving() as (_, endpoint),
        dcp.Worker(endpoint, "fail", failing, concurrency=4),
        dcp.Client(endpoint, timeout=20) as client,
    ):
        got: list[tuple[bytes, ...]] = []
        with pytest.raises(dcp.RemoteError, match="handler_error: ValueError: broken source"):
            async with client.stream("fail", b"raise") as parts:
                async for part in parts:
                    got.append(part)
        assert got == [(b"one",)]
        with pytest.raises(dcp.RemoteError, match="bad_handler_result"):
            async with client.stream("fail", b"bad") as parts:
                async for _ in parts:
                    pass
        with pytest.raises(dcp.RequestTimeout, match="stalled"):
            async with client.stream("fail", b"stall", stall_timeout=0.3) as parts:
                async for _ in parts:
                    pass
        with pytest.raises(dcp.RequestTimeout):
            async with client.stream("fail", b"stall", timeout=0.5) as parts:
                async for _ in parts:
                    pass
        with pytest.raises(ValueError, match="window"):
            client.stream("fail", window=0)
        with pytest.raises(ValueError, match="stall_timeout"):
            client.stream("fail", stall_timeout=0)


async def test_a_worker_killed_mid_stream_breaks_it_and_it_is_not_redelivered() -> None:
    handler = Counting(pause_after=5)
    others: list[bytes] = []

    async def other(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        others.append(request.data[0])
        yield b"from the other worker"

    options: dict[str, Any] = {"heartbeat_interval": 0.2, "liveness": 2}
    async with (
        serving(**options) as (broker, endpoint),
        dcp.Client(endpoint, timeout=20) as client,
        anyio.create_task_group() as tg,
    ):
        doomed = dcp.Worker(endpoint, "count", handler, **options)
        await tg.start(doomed.serve)
        got: list[tuple[bytes, ...]] = []
        with pytest.raises(dcp.StreamBroken) as caught:
            async with client.stream("count", b"10") as parts:
                async for part in parts:
                    got.append(part)
                    if len(got) == 5:
                        # The other worker registers, then the first dies silently (its
                        # serving task cancelled: no goodbye to the broker).
                        await tg.start(dcp.Worker(endpoint, "count", other, **options).serve)
                        tg.cancel_scope.cancel()
        assert caught.value.parts == 5
        assert caught.value.code == "stream_broken"
        assert "after 5 part(s)" in str(caught.value)
        stats = broker.statistics()
        assert stats.redeliveries == 0
        assert stats.streams.broken == 1
        assert others == []  # never redelivered


async def test_a_slow_reader_pauses_the_writer_and_bounds_the_broker() -> None:
    window = 8
    handler = Counting(big=True)
    async with (
        serving() as (broker, endpoint),
        dcp.Worker(endpoint, "big", handler) as worker,
        dcp.Client(endpoint, timeout=30) as client,
    ):
        read = 0
        ahead = 0
        async with client.stream("big", b"100000", window=window) as parts:
            async for part in parts:
                assert len(part[0]) == 65536
                read += 1
                await anyio.sleep(0.01)  # ~100x slower than the writer
                ahead = max(ahead, handler.produced - read)
                if read == 60:
                    break
        # The writer was paused: never more than a window (and the part in hand) ahead.
        assert ahead <= window + 1
        assert worker._streams.credit_waits > 0
        streams = broker.statistics().streams
        assert 0 < streams.outstanding_max <= window


async def test_mdp02_and_majortomo_clients_stream_from_a_dcp_worker() -> None:
    handler = Counting()
    async with serving() as (broker, endpoint), dcp.Worker(endpoint, "count", handler):
        with Peers(endpoint) as peers:
            c = peers(b"C2")
            c.send_frames(V02C.client_request(b"count", [b"100"]))
            got = [await c.recv_frames() for _ in range(101)]
        assert got == [
            *(V02C.client_answer(b"count", [b"%d" % i], final=False) for i in range(100)),
            V02C.client_answer(b"count", [], final=True),
        ]

        def majortomo() -> list[list[bytes]]:
            with MtClient(endpoint) as mt:
                mt.send(b"count", b"40")
                return list(mt.recv_all(timeout=5))

        parts = await anyio.to_thread.run_sync(majortomo)
        # The end of the stream: a FINAL with one empty body frame (RFC 18, Rule M1).
        assert parts == [*([b"%d" % i] for i in range(40)), [b""]]
        assert broker.statistics().streams.overruns == 0


async def test_a_dcp_client_streams_from_majortomo_workers_partials() -> None:
    async with (
        serving(heartbeat_interval=0.5) as (broker, endpoint),
        majortomo_worker(endpoint, "mt"),
    ):
        await wait_for(lambda: broker.statistics().services.get(b"mt"))
        async with dcp.Client(endpoint, timeout=10) as client:
            async with client.stream("mt", b"a", b"b") as parts:
                got = [part async for part in parts]
            # Two partials, then the FINAL's body as the last part.
            assert got == [(b"partial",), (b"more",), (b"final:a|b",)]
            # A plain request still gets the FINAL only.
            assert (await client.request("mt", b"x")).data == (b"final:x",)
        assert broker.statistics().rejections.get("partial_dropped") == 2


async def test_sync_client_stream() -> None:
    async def stall(request: dcp.HandlerRequest) -> AsyncIterator[bytes]:
        yield b"one"
        await anyio.sleep_forever()

    async def plain(request: dcp.HandlerRequest) -> bytes:
        return b"whole"

    handler = Counting()
    async with (
        serving() as (_, endpoint),
        dcp.Worker(endpoint, "count", handler),
        dcp.Worker(endpoint, "stall", stall),
        dcp.Worker(endpoint, "plain", plain),
    ):

        def read() -> tuple[list[tuple[bytes, ...]], list[tuple[bytes, ...]]]:
            with dcp.SyncClient(endpoint, timeout=20) as client:
                with client.stream("count", b"1000", window=10) as parts:
                    everything = list(parts)
                some = []
                with client.stream("count", b"1000000", window=4) as parts:
                    for part in parts:
                        some.append(part)
                        if len(some) == 3:
                            break
                stalled: list[tuple[bytes, ...]] = []
                with (
                    pytest.raises(dcp.RequestTimeout, match="stalled"),
                    client.stream("stall", stall_timeout=0.3) as parts,
                ):
                    stalled.extend(parts)
                assert stalled == [(b"one",)]
                # A worker that does not stream: its reply is the one last part.
                with client.stream("plain") as parts:
                    assert list(parts) == [(b"whole",)]
                return everything, some

        everything, some = await anyio.to_thread.run_sync(read)
        assert everything == [(b"%d" % i,) for i in range(1000)]
        assert some == [(b"0",), (b"1",), (b"2",)]
        with anyio.fail_after(10):
            await handler.closed.wait()


def test_dcp_call_stream_prints_parts_as_they_arrive(tmp_path: Path) -> None:
    procs: list[Proc] = []
    try:
        _, tcp = start_broker(procs, tmp_path)
        start(
            procs, "worker", "--connect", tcp, "--service", "trickle", "tests.cli.handlers:trickle"
        )
        call = start(procs, "call", "--connect", tcp, "--wait", "--stream", "trickle", "5")
        # The first part is printed while the stream still runs.
        assert call.read_lines(1) == ["part 0"]
        assert call.popen.poll() is None
        code, out, err = call.finish(10)
        assert (code, out, err) == (0, "part 1\npart 2\npart 3\npart 4\n", "")
        json_call = start(procs, "call", "--connect", tcp, "--stream", "--json", "trickle", "2")
        code, out, err = json_call.finish(10)
        assert (code, out) == (0, '{"data": ["part 0"]}\n{"data": ["part 1"]}\n'), err
        args = ("call", "--connect", tcp, "--stream", "--timeout", "0.3", "none")
        code, out, err = start(procs, *args, "--wait").finish(10)
        # --wait: queued until --timeout; the client's mmi.service question says why.
        assert (code, out) == (4, "")
        assert err.startswith("dcp call: no worker serves 'none' (the broker says so")
        # Without --wait, nobody serving the service is told at once (mmi.service first).
        code, out, err = start(procs, *args[:-3], "--timeout", "30", "none").finish(10)
        assert (code, out) == (4, "")
        assert err.startswith("dcp call: no worker serves 'none' (start one with 'dcp worker'")
    finally:
        for proc in procs:
            proc.kill()


async def test_stream_objects_misused_exhausted_and_closed() -> None:
    handler = Counting()

    class Bad:
        async def __call__(self, request: dcp.HandlerRequest) -> AsyncIterator[object]:
            yield [b"fine", b"parts"]
            yield 42

    async with (
        serving() as (_, endpoint),
        dcp.Worker(endpoint, "count", functools.partial(handler)),
        dcp.Worker(endpoint, "bad", Bad()),
        dcp.Client(endpoint, timeout=20) as client,
    ):
        stream = client.stream("count", b"2")
        stream.close()  # before it started: nothing to do
        stream = client.stream("count", b"2")
        with pytest.raises(RuntimeError, match="async with"):
            await stream.__anext__()
        async with stream as parts:
            assert [p async for p in parts] == [(b"0",), (b"1",)]
            with pytest.raises(StopAsyncIteration):
                await parts.__anext__()
        with pytest.raises(RuntimeError, match="once"):
            await stream.__aenter__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        # A plain request to a generator that yields a bad part.
        with pytest.raises(dcp.RemoteError, match="bad_handler_result"):
            await client.request("bad")
        async with client.stream("bad") as parts:
            assert await parts.__anext__() == (b"fine", b"parts")
            with pytest.raises(dcp.RemoteError, match="yielded int"):
                await parts.__anext__()
        # The client closing under a reader.
        with pytest.raises(anyio.ClosedResourceError):
            async with client.stream("count", b"1000000", window=2) as parts:
                await parts.__anext__()
                await client.aclose()
                async for _part in parts:
                    pass


def test_a_malformed_part_is_dropped() -> None:
    waiters: dict[bytes, Any] = {b"rid": StreamWaiter()}
    assert deliver_part([b"", b"DGBX\x01", b"\x10", b"", b"rid"], waiters) is None
    frames = wire.build(wire.StreamType.PARTIAL, None, (b"other",), (b"x",))
    assert deliver_part(frames, waiters) is None
    frames = wire.build(wire.StreamType.PARTIAL, None, (b"rid",), (b"x",))
    assert deliver_part(frames, waiters) == deque([(b"x",)])


class _Link:
    """A receiver that keeps what it is asked to send."""

    def __init__(self) -> None:
        self.closed = False
        self.sent: list[list[bytes]] = []

    def send_nowait(self, frames: list[bytes]) -> None:
        self.sent.append(frames)


class _Reader(StreamReader[_Link]):
    """The part both clients' streams share, driven by hand."""

    def _open(
        self, service: bytes, data: tuple[bytes, ...], metadata: tuple[bytes, ...], timing: Timing
    ) -> None:
        self.metadata = metadata

    def _forget(self) -> bytes | None:
        return b"rid"

    def feed(self, *parts: tuple[bytes, ...]) -> _Reader:
        self._parts.extend(parts)
        return self

    def read(self, done: bool = False) -> tuple[tuple[bytes, ...], int]:
        return self._next_part(done)

    def end(self, outcome: Outcome) -> tuple[bytes, ...] | None:
        return self._last(outcome)


def _reader(window: int, link: _Link | None = None) -> _Reader:
    return _Reader(link or _Link(), b"s", (), (b"m",), Timing(1.0, 1.0, 0), window, None)


def test_the_shared_reader_grants_half_a_window_and_ends_as_the_rules_say() -> None:
    reader = _reader(4).feed(*((b"%d" % i,) for i in range(6)))
    assert reader.metadata == (b"m", wire.stream_option(4))  # Rule CS1: the first credit
    # Rule CS3: once half the window is read, that many parts are granted.
    assert [reader.read() for _ in range(4)] == [
        ((b"0",), 0), ((b"1",), 2), ((b"2",), 0), ((b"3",), 2)
    ]  # fmt: skip
    assert reader.read(done=True) == ((b"4",), 0)  # the end arrived: no more credit
    # Rule CS2: the final reply's data is the last part; an empty one ends the stream.
    assert reader.end(dcp.Response((b"last",))) == (b"last",)
    assert reader.received == 6
    assert _reader(1).end(dcp.Response(())) is None
    with pytest.raises(dcp.StreamBroken) as broken:
        reader.end(dcp.RemoteError("stream_broken", "gone"))
    assert broken.value.parts == 6
    with pytest.raises(dcp.RemoteError, match="other"):
        reader.end(dcp.RemoteError("other", "no"))


def test_the_shared_reader_cancels_once_when_left() -> None:
    """Rule CS4: CANCEL once, not on a closed client; a part still buffered is read without
    granting more."""
    link = _Link()
    left = _reader(2, link).feed((b"a",), (b"b",))
    left.close()
    left.close()
    assert link.sent == [wire.build(wire.StreamType.CANCEL, None, (b"rid",))]
    assert left.read() == ((b"a",), 0)
    link.closed = True
    _reader(2, link).close()
    assert len(link.sent) == 1


async def test_worker_streams_ignore_what_they_do_not_run() -> None:
    streams = WorkerStreams()
    assert not streams.receive([b"", b"DGBX\x01", b"\x05", b"", b"", b""])
    assert streams.receive([b"", b"DGBX\x01", b"\x11", b"", b"rid", b"", b"x"])  # malformed
    assert streams.receive(wire.build(wire.StreamType.CREDIT, b"C", (b"rid",), credit=1))
    assert streams.receive(wire.build(wire.StreamType.CANCEL, b"C", (b"rid",)))
    assert not streams.receive([b"", b"DGBX\x01", b"\x06"])  # RECONNECT: also the core's
    assert streams.cancelled == 0
    assert not is_stream_handler(lambda request: b"")


async def test_sync_stream_exhausted_closed_and_collected() -> None:
    handler = Counting()
    async with serving() as (_, endpoint), dcp.Worker(endpoint, "count", handler):

        def read() -> None:
            with dcp.SyncClient(endpoint, timeout=20) as client:
                parts = client.stream("count", b"2")
                assert list(parts) == [(b"0",), (b"1",)]
                with pytest.raises(StopIteration):
                    next(parts)
                parts.close()
                parts.close()
                with pytest.raises(ValueError, match="stall_timeout"):
                    client.stream("count", stall_timeout=-1)
                abandoned = client.stream("count", b"1000000", window=2)
                assert next(abandoned) == (b"0",)
                del abandoned  # collected: cancelled

        await anyio.to_thread.run_sync(read)
        with anyio.fail_after(2):
            await handler.closed.wait()


def test_the_streams_benchmark_runs(tmp_path: Path) -> None:
    """``benchmarks.streams --tiny``: every variant moves its parts and the section is
    written into the page (the full run's figures are in docs/performance.md)."""
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n")
    command = [sys.executable, "-m", "benchmarks.streams", "--tiny", "--rounds", "1"]
    proc = subprocess.run(
        [*command, "--page", str(page)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert "## Streams: one stream against unary requests" in text
    for variant in ("dcp stream", "dcp unary", "majortomo partials", "via dcp"):
        assert text.count(f"| {variant}") >= 2 or variant == "via dcp"
    assert "Traceback" not in proc.stderr


async def test_a_slow_mdp02_reader_pauses_a_dcp_worker_and_loses_nothing() -> None:
    """Streams Rule ST3 with real sockets: the broker's queue to the MDP client is tiny
    (inproc, high-water marks of 4), so parts are held and the worker paused; every part
    arrives, in order, and nothing is dropped."""
    handler = Counting()
    # A fresh name: zmq frees an inproc name after the socket closes, in its own time.
    broker = dcp.Broker(f"inproc://streams-slow-mdp-{uuid.uuid4().hex}", send_hwm=4)
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(broker.serve)
        async with dcp.Worker(endpoint, "count", handler) as worker:
            with Peers(endpoint) as peers:
                reader = peers(b"M", rcvhwm=4)
                reader.send_frames(V02C.client_request(b"count", [b"200"]))
                got = []
                ahead = 0
                for _ in range(201):
                    got.append(await reader.recv_frames())
                    ahead = max(ahead, handler.produced - len(got))
                    await anyio.sleep(0.002)  # far slower than the worker
        tg.cancel_scope.cancel()
    assert got == [
        *(V02C.client_answer(b"count", [b"%d" % i], final=False) for i in range(200)),
        V02C.client_answer(b"count", [], final=True),
    ]
    # Paused: never more ahead than the queues, the broker's hold and one window.
    assert ahead <= 4 + 4 + 65 + 32
    assert worker._streams.credit_waits > 0
    stats = broker.statistics()
    assert stats.dropped_replies == 0
    assert "partial_dropped" not in stats.rejections
    assert stats.streams.held > 0


async def test_a_worker_waits_for_room_in_its_own_send_queue() -> None:
    """With ample credit and a broker that does not read for a while (a raw ROUTER here),
    the worker's zmq queue fills: the parts wait for room (none is lost) and arrive in
    order."""
    router: zmq.Socket[bytes] = get_context().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, 8)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    handler = Counting(big=True, repeat=512)  # 4 KiB parts
    rid = b"\xffDCP:id=" + b"w" * 16
    metadata = [rid, wire.stream_option(10_000)]

    async def recv() -> list[bytes]:
        with anyio.fail_after(10):
            while True:
                try:
                    return router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    await anyio.sleep(0.001)

    try:
        worker = dcp.Worker(f"tcp://127.0.0.1:{port}", "big", handler, heartbeat_interval=5)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve)
            ident, *register = await recv()
            router.send_multipart([ident, *register])  # the echo: registered
            request = [b"", b"DGBX\x01", b"\x04", b"big", b"C", b"", *metadata, b"", b"4000"]
            router.send_multipart([ident, *request])
            with anyio.fail_after(10):
                while handler.produced < 1000:  # noqa: ASYNC110 (a counter, not an event)
                    await anyio.sleep(0.01)
            await anyio.sleep(0.2)  # the worker is stuck on a full queue now
            assert handler.produced < 4000
            parts: list[list[bytes]] = []
            while len(parts) < 4001:
                frames = await recv()
                if frames[3] in (b"\x10", b"\x05"):
                    parts.append(frames)
            tg.cancel_scope.cancel()
    finally:
        router.close(0)
    assert [p[-1][:8] for p in parts[:4000]] == [b"%08d" % i for i in range(4000)]
    assert parts[4000][3] == b"\x05"  # the final reply


def test_stream_broken_pickles() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(dcp.StreamBroken("gone", 3)))
    assert (error.code, error.parts, error.message) == (
        "stream_broken",
        3,
        "gone (3 part(s) received)",
    )
