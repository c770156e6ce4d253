"""A prefetching worker serving several brokers (Rules WB1, WB4 with core Rules W4, W12):
real dcp brokers on tcp 127.0.0.1 port 0, real clients, both anyio backends."""

from __future__ import annotations

import collections

import anyio
import pytest

from dcp._client.client import Client
from dcp._models import HandlerRequest
from dcp._worker.worker import Worker
from dcp.wire.messages import HELD_MARKER, Ping, Pong, Reply, Request, parse_error_reply
from dcp.wire.options import expires_in_option
from tests.helpers import wait_for
from tests.worker.test_brokers import RawClient, brokers, data_of, rid
from tests.worker.test_worker import CLIENT, SVC, FakeBroker

pytestmark = pytest.mark.anyio


async def test_a_lost_brokers_prefetched_requests_run_once() -> None:
    """Rule WB4: a broker is killed while requests it brought wait in the worker's prefetch
    (its core's backlog, kept across the loss: core Rule W12). The client, connected to both
    brokers, must learn that the worker holds them (a HELD notice), or it moves them to the
    other broker after its grace, where another worker runs them a second time."""
    runs: collections.Counter[bytes] = collections.Counter()
    release = anyio.Event()

    async def gated(request: HandlerRequest) -> bytes:
        runs[request.data[0]] += 1
        if request.data[0] != b"warm-up":
            await release.wait()
        return request.data[0]

    async def quick(request: HandlerRequest) -> bytes:
        runs[request.data[0]] += 1
        return request.data[0]

    async with brokers(2) as (tg, (a, b)):
        first = Worker([a.endpoint, b.endpoint], "svc", gated, concurrency=1, prefetch=2)
        await tg.start(first.serve)
        await wait_for(lambda: all(s.registered for s in first.brokers().values()))
        names = [b"%d" % i for i in range(6)]
        got: dict[bytes, bytes] = {}
        # A long grace: a notice is not late, however slowly a loaded machine runs the test.
        async with Client([a.endpoint, b.endpoint], timeout=30, failover_grace=2.0) as client:

            async def call(name: bytes) -> None:
                got[name] = (await client.request("svc", name)).bytes

            # Until the client has used both brokers (both live: it alternates between them
            # while none has more outstanding, Rule BK3, so the calls below split 3 and 3).
            at = first.brokers()
            while not (at[a.endpoint].received and at[b.endpoint].received):
                await client.request("svc", b"warm-up")
                at = first.brokers()
            async with anyio.create_task_group() as calls:
                for name in names:
                    calls.start_soon(call, name)
                # Each broker gave its concurrency plus its prefetch: one in the pool at A
                # (running), two waiting in A's core; the same at B (one waiting in the pool).
                await wait_for(lambda: first.brokers()[a.endpoint].backlog == 2, within=10)
                await wait_for(lambda: first.brokers()[b.endpoint].backlog == 2, within=10)
                a.stop()
                await wait_for(lambda: not first.brokers()[a.endpoint].registered)
                # Three of A's requests outstanding: each either held (a notice) or moved.
                await wait_for(
                    lambda: client.statistics().held + client.statistics().failovers >= 3,
                    within=10,
                )
                # Another worker at B, free: a moved request would run there at once.
                second = Worker(b.endpoint, "svc", quick)
                await tg.start(second.serve)
                await wait_for(lambda: second.registered)
                await anyio.sleep(0.2)  # not a speed: what B has queued goes to it meanwhile
                release.set()
            stats = client.statistics()
        assert got == {name: name for name in names}
        del runs[b"warm-up"]
        assert runs == {name: 1 for name in names}, (runs, stats)
        assert stats.held == 3 and stats.failovers == 0
        await second.aclose()
        await first.aclose()


async def test_a_prefetched_requests_deadline_counts_from_its_arrival_at_the_worker() -> None:
    """Rule WB1 with core Rule W4: a request that waited in A's prefetch (its core's backlog)
    and then waits again in the pool, behind B's, keeps the deadline counted from its arrival
    at the worker: past it, it is answered ``expired`` without running, not given its
    expires-in again from when it entered the pool."""
    a, b = FakeBroker(), FakeBroker()
    gates: dict[bytes, anyio.Event] = {name: anyio.Event() for name in (b"a1", b"b1")}
    started: list[bytes] = []

    async def gated(request: HandlerRequest) -> bytes:
        name = request.data[0]
        started.append(name)
        if name in gates:
            await gates[name].wait()
        return name

    # Heartbeats far apart: the fake brokers never answer them.
    worker = Worker(
        [a.endpoint, b.endpoint], SVC, gated, concurrency=1, prefetch=1, heartbeat_interval=5.0
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve)
            ida, idb = await a.register(), await b.register()
            a.send(ida, Request(SVC, CLIENT, (b"rid-a1",), (b"a1",)))
            await a.expect(Ping)  # busy: room for one more (its prefetch)
            a.send(ida, Request(SVC, CLIENT, (b"rid-a2", expires_in_option(1.0)), (b"a2",)))
            await wait_for(lambda: worker.brokers()[a.endpoint].backlog == 1)
            arrived = anyio.current_time()  # a2 arrived at the worker before this
            b.send(idb, Request(SVC, CLIENT, (b"rid-b1",), (b"b1",)))  # waits in the pool
            await wait_for(lambda: worker.brokers()[b.endpoint].received == 1)
            await anyio.sleep(0.8)  # at least: a2's deadline is 1 s from its arrival
            gates[b"a1"].set()  # A's core starts a2: it joins the pool's queue behind b1
            await wait_for(lambda: started == [b"a1", b"b1"])
            await anyio.sleep(max(0.0, arrived + 1.05 - anyio.current_time()))
            gates[b"b1"].set()  # a2's caller gave up a moment ago
            answers: dict[bytes, tuple[bytes, ...]] = {}
            for fake in (a, b, a):
                _, msg = await fake.recv()
                while not isinstance(msg, Reply):
                    assert isinstance(msg, (Ping, Pong)), msg
                    _, msg = await fake.recv()
                answers[msg.metadata[0]] = msg.data
            await worker.aclose()
    finally:
        a.close()
        b.close()
    assert answers[b"rid-a1"] == (b"a1",) and answers[b"rid-b1"] == (b"b1",)
    error = parse_error_reply(answers[b"rid-a2"])
    assert error is not None and error[0] == "expired", answers
    assert started == [b"a1", b"b1"]
    assert worker.statistics().expired == 1


async def test_no_held_notice_through_a_broker_that_prefetched_the_same_request() -> None:
    """Rule WB4 with Rule WB3: a request waiting in A's prefetch and, sent again through B,
    in B's too. When A is lost, its notice must not go through B: there it would match B's
    copy (given to this worker) and be taken for its answer."""
    runs: collections.Counter[bytes] = collections.Counter()
    release = anyio.Event()

    async def gated(request: HandlerRequest) -> bytes:
        runs[request.data[0]] += 1
        await release.wait()
        return request.data[0].upper()

    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "svc", gated, concurrency=1, prefetch=1)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            first, second, same = rid(1), rid(2), rid(3)
            client.send(0, b"svc", (first,), b"r1")
            await wait_for(lambda: runs[b"r1"] == 1)
            client.send(0, b"svc", (same,), b"x")  # waits in A's core (its prefetch)
            await wait_for(lambda: worker.brokers()[a.endpoint].backlog == 1)
            client.send(1, b"svc", (second,), b"r2")  # waits in the pool
            await wait_for(lambda: worker.brokers()[b.endpoint].received == 1)
            client.send(1, b"svc", (same,), b"x")  # the same request, in B's core
            await wait_for(lambda: worker.brokers()[b.endpoint].backlog == 1)
            a.stop()
            await wait_for(lambda: not worker.brokers()[a.endpoint].registered)
            notice = await client.recv(1)  # r1's: held, running
            assert data_of(notice) == [HELD_MARKER] and first in notice
            release.set()
            answers: dict[bytes, list[bytes]] = {}
            held: list[list[bytes]] = []
            while len(answers) < 3:
                frames = await client.recv(1)
                if data_of(frames) == [HELD_MARKER]:
                    held.append(frames)
                else:
                    answers[next(f for f in frames if f in (first, second, same))] = frames
        finally:
            client.close()
        assert held == []  # no notice for x: B holds its copy (given to this worker)
        assert {key: data_of(frames) for key, frames in answers.items()} == {
            first: [b"R1"],
            second: [b"R2"],
            same: [b"X"],
        }
        assert runs == {b"r1": 1, b"r2": 1, b"x": 1}
        await worker.aclose()


async def test_a_stop_runs_what_a_lost_broker_brought_and_the_worker_announced() -> None:
    """Rule WB5 with Rule WB4: a stop drops what waits, for its broker to give to another
    worker when this one leaves; a lost broker gives nothing back. What it brought and the
    worker announced held (a request waiting for the one handler, another in A's prefetch)
    runs within the stop's grace: dropped, its client would wait for its attempt timeout."""
    runs: collections.Counter[bytes] = collections.Counter()
    release = anyio.Event()

    async def gated(request: HandlerRequest) -> bytes:
        runs[request.data[0]] += 1
        await release.wait()
        return request.data[0].upper()

    async with brokers(2) as (tg, (a, b)):
        worker = Worker([a.endpoint, b.endpoint], "svc", gated, concurrency=1, prefetch=1)
        await tg.start(worker.serve)
        await wait_for(lambda: all(s.registered for s in worker.brokers().values()))
        client = RawClient(a.endpoint, b.endpoint)
        try:
            ids = {name: rid(n) for n, name in enumerate((b"b1", b"a1", b"a2"))}
            client.send(1, b"svc", (ids[b"b1"],), b"b1")
            await wait_for(lambda: runs[b"b1"] == 1)
            client.send(0, b"svc", (ids[b"a1"],), b"a1")  # waits for the one handler
            await wait_for(lambda: worker.brokers()[a.endpoint].received == 1)
            client.send(0, b"svc", (ids[b"a2"],), b"a2")  # waits in A's core (its prefetch)
            await wait_for(lambda: worker.brokers()[a.endpoint].backlog == 1)
            a.stop()
            await wait_for(lambda: not worker.brokers()[a.endpoint].registered)
            notices = [await client.recv(1), await client.recv(1)]
            assert all(data_of(frames) == [HELD_MARKER] for frames in notices)
            worker.stop(grace=30)
            release.set()
            answers = [data_of(await client.recv(1)) for _ in range(3)]
        finally:
            client.close()
        await worker.aclose()
    assert sorted(answers) == [[b"A1"], [b"A2"], [b"B1"]]
    assert runs == {b"b1": 1, b"a1": 1, b"a2": 1}
