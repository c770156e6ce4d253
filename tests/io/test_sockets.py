"""The zmq/anyio adapter on real sockets (inproc and tcp://127.0.0.1), on both backends."""

from __future__ import annotations

import itertools
import select
import socket
import time
from collections.abc import Iterator

import anyio
import pytest
import zmq

from dcp._io.sockets import AsyncSocket, Received

pytestmark = pytest.mark.anyio

_inproc_names = itertools.count()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture(params=["inproc", "tcp"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def bind(sock: zmq.Socket[bytes], transport: str) -> str:
    """Bind ``sock`` to a fresh endpoint and return it (tcp: port chosen by the OS)."""
    if transport == "tcp":
        sock.bind("tcp://127.0.0.1:0")
        return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    endpoint = f"inproc://test-zmqio-{next(_inproc_names)}"
    sock.bind(endpoint)
    return endpoint


def recv_blocking(sock: zmq.Socket[bytes]) -> list[bytes]:
    """Receive on a plain (not adapted) socket, blocking the event loop for at most 5 s."""
    assert sock.poll(5000), "no message within 5 s"
    return sock.recv_multipart(zmq.NOBLOCK)


def fd_readable(fd: int, timeout: float) -> bool:
    """Whether the raw FD is readable, *without* touching the zmq socket's state."""
    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable)


class Pair:
    """A ROUTER (bound) and a DEALER (connected to it) with a known routing id."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], transport: str) -> None:
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        endpoint = bind(self.router, transport)
        self.dealer = ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.ROUTING_ID, b"dealer-1")
        self.dealer.connect(endpoint)

        # Wait until the ROUTER knows the DEALER, so it can route to it.
        self.dealer.send_multipart([b"hello"])
        assert recv_blocking(self.router) == [b"dealer-1", b"hello"]


@pytest.fixture
def pair(ctx: zmq.Context[zmq.Socket[bytes]], transport: str) -> Pair:
    return Pair(ctx, transport)


async def receive_all(asock: AsyncSocket, count: int, batch: int) -> list[list[Received]]:
    """Drain ``count`` messages, returning the batches as drained (bounded by fail_after)."""
    batches: list[list[Received]] = []
    with anyio.fail_after(5):
        while sum(len(b) for b in batches) < count:
            await asock.wait_readable()
            got = asock.drain(batch)
            if got:
                batches.append(got)
    return batches


# --- drain ---------------------------------------------------------------------------------


async def test_drain_returns_whole_messages_and_respects_batch(pair: Pair, transport: str) -> None:
    asock = AsyncSocket(pair.router)
    sent = [[b"m%d" % i, b"", *(b"part" for _ in range(i))] for i in range(5)]
    for message in sent:
        pair.dealer.send_multipart(message)
    if transport == "inproc":
        # inproc delivers synchronously: all five are queued before the first drain.
        assert asock.has_input()
    batches = await receive_all(asock, 5, batch=2)
    assert all(1 <= len(b) <= 2 for b in batches)
    if transport == "inproc":
        assert [len(b) for b in batches] == [2, 2, 1]
    received = [r for b in batches for r in b]
    assert [r.frames for r in received] == [[b"dealer-1", *m] for m in sent]
    assert [r.dropped_frames for r in received] == [0] * 5
    assert asock.drain(10) == []
    assert not asock.has_input()


async def test_drain_on_empty_socket(pair: Pair) -> None:
    asock = AsyncSocket(pair.dealer)
    assert asock.drain(5) == []
    assert asock.drain(0) == []


async def test_max_frames_keeps_first_frames_and_counts_the_rest(pair: Pair) -> None:
    asock = AsyncSocket(pair.router, max_frames=3)
    pair.dealer.send_multipart([b"a", b"b", b"c", b"d", b"e"])  # 6 frames with the id
    pair.dealer.send_multipart([b"x", b"y"])  # exactly 3: nothing dropped
    pair.dealer.send_multipart([b"z"])
    batches = await receive_all(asock, 3, batch=10)
    received = [r for b in batches for r in b]
    assert [(r.frames, r.dropped_frames) for r in received] == [
        ([b"dealer-1", b"a", b"b"], 3),
        ([b"dealer-1", b"x", b"y"], 0),
        ([b"dealer-1", b"z"], 0),
    ]


async def test_max_frames_zero_means_no_limit(pair: Pair) -> None:
    asock = AsyncSocket(pair.router, max_frames=0)
    frames = [b"%d" % i for i in range(100)]
    pair.dealer.send_multipart(frames)
    (batch,) = await receive_all(asock, 1, batch=1)
    assert batch[0].frames == [b"dealer-1", *frames]
    assert batch[0].dropped_frames == 0


# --- wait_readable -------------------------------------------------------------------------


async def test_wait_readable_returns_at_once_when_a_message_is_queued(pair: Pair) -> None:
    asock = AsyncSocket(pair.dealer)
    pair.router.send_multipart([b"dealer-1", b"one"])
    with anyio.fail_after(5):
        await asock.wait_readable()  # this may park, and consumes the FD's edge
    # The message is still queued but the edge is gone: waiting on the FD would hang. So
    # wait_readable must not even reach a checkpoint (a cancelled scope would raise).
    with anyio.CancelScope() as scope:
        scope.cancel()
        await asock.wait_readable()
    assert not scope.cancelled_caught
    assert [r.frames for r in asock.drain(5)] == [[b"one"]]


async def test_cancelled_wait_readable_loses_nothing(pair: Pair) -> None:
    asock = AsyncSocket(pair.dealer)
    with anyio.move_on_after(0.05) as scope:
        await asock.wait_readable()
    assert scope.cancelled_caught
    pair.router.send_multipart([b"dealer-1", b"after"])
    (batch,) = await receive_all(asock, 1, batch=5)
    assert [r.frames for r in batch] == [[b"after"]]


async def test_send_nowait_wakes_an_owner_whose_edge_it_consumed(pair: Pair) -> None:
    """The owner is parked on the FD; a reply arrives; another task sends before the owner
    runs. That send processes the socket's commands and can consume the edge; send_nowait
    must then wake the owner itself."""
    asock = AsyncSocket(pair.dealer)
    parked = anyio.Event()
    received: list[list[bytes]] = []

    async def owner() -> None:
        parked.set()
        while not received:
            await asock.wait_readable()
            received.extend(r.frames for r in asock.drain(10))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
            await parked.wait()
            await anyio.wait_all_tasks_blocked()
            # libzmq skips command processing in a send that comes less than ~1 ms (3M TSC
            # ticks) after the previous send: let that pass so the send below really
            # processes the pending "activate read" command, and so eats the edge.
            await anyio.sleep(0.02)
            pair.router.send_multipart([b"dealer-1", b"reply"])
            # Synchronously (no checkpoint, so the owner cannot run) wait until the edge is
            # there, then send: the owner's wake-up now depends on send_nowait.
            assert fd_readable(asock.sock.FD, 5)
            asock.send_nowait([b"request"])
    assert received == [[b"reply"]]
    assert recv_blocking(pair.router) == [b"dealer-1", b"request"]


async def test_ping_pong_owner_waits_another_task_sends(pair: Pair) -> None:
    """Many round trips where only a non-owner task sends on the owner's socket."""
    rounds = 200
    client = AsyncSocket(pair.dealer)
    server = AsyncSocket(pair.router)
    send_replies, replies = anyio.create_memory_object_stream[list[bytes]](rounds)

    async def echo() -> None:
        while True:
            await server.wait_readable()
            for r in server.drain(16):
                server.send_nowait(r.frames)

    async def owner() -> None:
        async with send_replies:
            for _ in range(rounds):
                await client.wait_readable()
                for r in client.drain(16):
                    send_replies.send_nowait(r.frames)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg, replies:
            tg.start_soon(echo)
            tg.start_soon(owner)
            for i in range(rounds):
                client.send_nowait([b"ping", b"%d" % i])
                assert await replies.receive() == [b"ping", b"%d" % i]
            tg.cancel_scope.cancel()


# --- deadlines, wake-ups, the loop's own wait ------------------------------------------------


async def test_wait_readable_returns_false_at_its_deadline(pair: Pair) -> None:
    asock = AsyncSocket(pair.dealer)
    with anyio.fail_after(5):
        start = anyio.current_time()
        assert not await asock.wait_readable(start + 0.05)
    assert anyio.current_time() >= start + 0.05
    pair.router.send_multipart([b"dealer-1", b"later"])  # the socket still works after
    (batch,) = await receive_all(asock, 1, batch=5)
    assert [r.frames for r in batch] == [[b"later"]]


async def test_move_deadline_and_wake_end_a_pending_wait(pair: Pair) -> None:
    asock = AsyncSocket(pair.dealer)
    ended: list[float] = []

    async def owner() -> None:
        await asock.wait_readable(anyio.current_time() + 60)
        ended.append(anyio.current_time())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
            await anyio.wait_all_tasks_blocked()
            moved = anyio.current_time() + 0.05
            asock.move_deadline(anyio.current_time() + 120)  # later: ignored
            asock.move_deadline(moved)
        assert ended and ended[0] >= moved
        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
            await anyio.wait_all_tasks_blocked()
            asock.wake()
        assert len(ended) == 2
    asock.wake()  # nobody waits: nothing happens
    asock.move_deadline(0.0)


async def test_an_idle_socket_that_receives_does_not_busy_the_loop(pair: Pair) -> None:
    """asyncio: the FD's reader stays registered between waits and the selector is
    level-triggered; a message that comes while nobody waits must not make the loop spin."""
    asock = AsyncSocket(pair.dealer)
    with anyio.move_on_after(0.01):
        await asock.wait_readable()  # registers (asyncio), then nobody waits
    pair.router.send_multipart([b"dealer-1", b"unread"])
    assert fd_readable(asock.sock.FD, 5)
    cpu = time.thread_time()
    await anyio.sleep(0.3)
    assert time.thread_time() - cpu < 0.15  # a spinning loop would burn the whole 0.3 s
    assert await asock.wait_readable()
    assert [r.frames for r in asock.drain(5)] == [[b"unread"]]


def test_a_socket_waits_on_one_loop_then_on_another(pair: Pair) -> None:
    """Each wait parks the way of the loop running it, whichever ran the previous one."""
    asock = AsyncSocket(pair.dealer)

    async def one(text: bytes) -> list[list[bytes]]:
        pair.router.send_multipart([b"dealer-1", text])
        batches = await receive_all(asock, 1, batch=5)
        with anyio.move_on_after(0.01):
            await asock.wait_readable()
        return [r.frames for b in batches for r in b]

    for backend in ("asyncio", "trio", "asyncio"):
        assert anyio.run(one, backend.encode(), backend=backend) == [[backend.encode()]]


# --- close ---------------------------------------------------------------------------------


async def test_close_wakes_a_parked_waiter_and_is_idempotent(pair: Pair) -> None:
    asock = AsyncSocket(pair.dealer)
    parked = anyio.Event()
    outcome: list[BaseException] = []

    async def owner() -> None:
        parked.set()
        try:
            await asock.wait_readable()
        except anyio.ClosedResourceError as exc:
            outcome.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
            await parked.wait()
            await anyio.wait_all_tasks_blocked()
            assert not asock.closed
            asock.close()
    assert len(outcome) == 1
    assert asock.closed
    assert pair.dealer.closed
    asock.close()
    asock.close(linger=100)
    assert asock.closed
    with pytest.raises(anyio.ClosedResourceError):
        await asock.wait_readable()


async def test_close_without_a_waiter(pair: Pair) -> None:
    asock = AsyncSocket(pair.router)
    asock.close(linger=0)
    assert asock.closed
    assert pair.router.closed
    with pytest.raises(anyio.ClosedResourceError):
        await asock.wait_readable()


# --- send_nowait errors --------------------------------------------------------------------


async def test_send_nowait_raises_again_without_peers(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """A DEALER with no peer at all cannot queue anything: EAGAIN at once."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 1)
    asock = AsyncSocket(dealer)
    with pytest.raises(zmq.Again):
        asock.send_nowait([b"", b"DGBX\x01", b"\x02"])
    asock.close()


async def test_send_nowait_raises_again_at_hwm(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """Connected to an endpoint nobody serves, a DEALER queues up to its HWM, then EAGAIN."""
    listener = ctx.socket(zmq.ROUTER)
    endpoint = bind(listener, "tcp")
    listener.close(linger=0)  # the port now accepts nothing
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 1)
    dealer.connect(endpoint)
    asock = AsyncSocket(dealer)
    queued = 0
    with pytest.raises(zmq.Again):
        for _ in range(1000):
            asock.send_nowait([b"x"])
            queued += 1
    assert 1 <= queued <= 10
    asock.close()


async def test_send_nowait_to_unknown_routing_id(pair: Pair) -> None:
    """ROUTER_MANDATORY: an unknown routing id is EHOSTUNREACH, not a silent drop."""
    asock = AsyncSocket(pair.router)
    with pytest.raises(zmq.ZMQError) as excinfo:
        asock.send_nowait([b"nobody", b"", b"DGBX\x01", b"\x03"])
    assert excinfo.value.errno == zmq.EHOSTUNREACH
    assert not isinstance(excinfo.value, zmq.Again)
    asock.send_nowait([b"dealer-1", b"still works"])
    assert recv_blocking(pair.dealer) == [b"still works"]


@pytest.mark.anyio
async def test_zero_copy_threshold_keeps_large_frames_as_zmq_buffers() -> None:
    ctx = zmq.Context()
    a = ctx.socket(zmq.PAIR)
    b = ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://zero-copy")
        b.connect("inproc://zero-copy")
        asock = AsyncSocket(b, zero_copy_threshold=1000)
        big = b"z" * 5000
        a.send_multipart([b"small", big, b""])
        with anyio.fail_after(5):
            await asock.wait_readable()
        [msg] = asock.drain(10)
        small, large, empty = msg.frames
        assert (small, empty) == (b"small", b"")
        kept: object = large
        assert isinstance(kept, zmq.Frame) and kept.bytes == big
        assert msg.nbytes == 5005
        # Sent on again as it is: no copy in Python, the same bytes on the other side.
        asock.send_nowait([large])
        assert a.recv() == big
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


@pytest.mark.anyio
async def test_a_failed_send_still_wakes_a_parked_owner() -> None:
    """A send that fails (here EHOSTUNREACH) also lets zmq process its commands, which can
    eat the edge the owner waits for: the owner must be woken all the same."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    asock = AsyncSocket(router)
    got: list[list[bytes]] = []
    arrivals = [anyio.Event(), anyio.Event()]
    try:
        async with anyio.create_task_group() as tg:

            async def owner() -> None:
                while True:
                    await asock.wait_readable()
                    got.extend(m.frames[1:] for m in asock.drain(16))
                    for event in arrivals[: len(got)]:
                        event.set()

            tg.start_soon(owner)
            dealer.send(b"warm")
            with anyio.fail_after(5):
                await arrivals[0].wait()
            await anyio.sleep(0.2)  # the owner is parked now
            dealer.send(b"m1")
            # Let it reach the router's pipe without running the event loop (on purpose).
            time.sleep(0.05)  # noqa: ASYNC251
            with pytest.raises(zmq.ZMQError):
                asock.send_nowait([b"nobody", b"x"])
            with anyio.fail_after(10):
                await arrivals[1].wait()
            assert got == [[b"warm"], [b"m1"]]
            tg.cancel_scope.cancel()
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stale_selector_entry_for_the_fd_number_does_not_hide_the_socket(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """asyncio's selector keeps a reader it was never told was closed; a socket whose FD
    gets that number must still be watched (add_reader alone would only swap callbacks)."""
    import asyncio
    import os

    loop = asyncio.get_running_loop()
    router = ctx.socket(zmq.ROUTER)
    endpoint = bind(router, "tcp")
    r, w = os.pipe()
    loop.add_reader(r, lambda: None)
    os.close(w)
    os.close(r)  # closed without remove_reader: a stale entry for the number r
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"dealer-1")
    dealer.connect(endpoint)
    try:
        if r != dealer.FD:  # the lowest free number is usually ours; say so if not
            loop.remove_reader(r)
            pytest.skip(f"the new socket's FD is {dealer.FD}, not the stale {r}")
        asock = AsyncSocket(dealer)
        dealer.send(b"hello")
        assert recv_blocking(router) == [b"dealer-1", b"hello"]
        readable: list[bool] = []

        async def owner() -> None:
            readable.append(await asock.wait_readable())

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(owner)
                await anyio.wait_all_tasks_blocked()  # parked: the reply must wake it
                router.send_multipart([b"dealer-1", b"reply"])
        assert readable == [True]
        assert [m.frames for m in asock.drain(5)] == [[b"reply"]]
        asock.close()
    finally:
        router.close(0)


@pytest.mark.parametrize(
    "anyio_backend",
    ["asyncio", pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"), "trio"],
)
async def test_a_wait_never_ends_before_its_deadline(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """uvloop's timers fire up to a millisecond early; a wait that says "nothing came" must
    be past its deadline by the loop's clock, or a caller that waits until then spins."""
    a = ctx.socket(zmq.PAIR)
    endpoint = bind(a, "inproc")
    b = ctx.socket(zmq.PAIR)
    b.connect(endpoint)
    asock = AsyncSocket(a)
    try:
        with anyio.fail_after(10):
            for k in range(20):
                deadline = anyio.current_time() + 0.0101 + k * 0.00037
                assert not await asock.wait_readable(deadline)
                assert anyio.current_time() >= deadline
    finally:
        asock.close()
        b.close(0)


@pytest.mark.parametrize(
    "anyio_backend",
    ["asyncio", pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"), "trio"],
)
async def test_each_wait_ends_at_its_own_deadline_after_a_wait_that_had_another(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """asyncio keeps the timer of a wait for the next (no timer made per wait): a later
    deadline is not ended by the earlier wait's timer, an earlier one is not left to it, and
    a wait without a deadline after one with a deadline is woken only by a message."""
    a = ctx.socket(zmq.PAIR)
    endpoint = bind(a, "inproc")
    b = ctx.socket(zmq.PAIR)
    b.connect(endpoint)
    asock = AsyncSocket(a)
    try:
        with anyio.fail_after(10):
            first = anyio.current_time() + 0.02
            b.send(b"one")  # the first wait ends with a message, its timer still set
            assert await asock.wait_readable(first)
            assert [m.frames for m in asock.drain(5)] == [[b"one"]]
            later = first + 0.03  # the kept timer fires first: not the end of this wait
            assert not await asock.wait_readable(later)
            assert anyio.current_time() >= later
            b.send(b"two")  # a wait for 60 s ends with a message: its timer is kept
            assert await asock.wait_readable(anyio.current_time() + 60)
            assert [m.frames for m in asock.drain(5)] == [[b"two"]]
            sooner = anyio.current_time() + 0.02  # a timer for 60 s is kept: this is sooner
            assert not await asock.wait_readable(sooner)
            assert anyio.current_time() >= sooner

            async def send_later() -> None:
                await anyio.sleep(0.05)
                b.send(b"three")

            async with anyio.create_task_group() as tg:
                tg.start_soon(send_later)
                assert await asock.wait_readable()  # no deadline: only the message ends it
            assert [m.frames for m in asock.drain(5)] == [[b"three"]]
    finally:
        asock.close()
        b.close(0)


async def test_a_second_waiter_is_refused(pair: Pair) -> None:
    """One task waits on a socket at a time (its FD is edge-triggered): a second is told."""
    asock = AsyncSocket(pair.dealer)
    async with anyio.create_task_group() as tg:
        tg.start_soon(asock.wait_readable)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(anyio.BusyResourceError):
            await asock.wait_readable()
        tg.cancel_scope.cancel()
    pair.router.send_multipart([b"dealer-1", b"after"])  # the first wait left no trace
    (batch,) = await receive_all(asock, 1, batch=5)
    assert [r.frames for r in batch] == [[b"after"]]


@pytest.mark.parametrize(
    "anyio_backend",
    ["asyncio", pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")],
)
async def test_a_timer_that_fires_early_is_set_once_more_not_spun_on(
    ctx: zmq.Context[zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop counts milliseconds and runs a timer for less than half of one at once: a timer
    set again for what is left of the deadline would run at every turn of the loop until its
    clock passes it (hundreds of times). It is set for a whole millisecond then: each wait
    that times out runs its timer twice at most."""
    from dcp._io import sockets

    runs = 0
    timeout = sockets._AsyncioPark._timeout

    def counted(park: sockets._AsyncioPark) -> None:
        nonlocal runs
        runs += 1
        timeout(park)

    monkeypatch.setattr(sockets._AsyncioPark, "_timeout", counted)
    a = ctx.socket(zmq.PAIR)
    endpoint = bind(a, "inproc")
    b = ctx.socket(zmq.PAIR)
    b.connect(endpoint)
    asock = AsyncSocket(a)
    try:
        with anyio.fail_after(10):
            for k in range(20):
                deadline = anyio.current_time() + 0.0101 + k * 0.00037
                assert not await asock.wait_readable(deadline)
                assert anyio.current_time() >= deadline
        assert runs <= 2 * 20
    finally:
        asock.close()
        b.close(0)


def _trio_timer_tasks() -> int:
    """How many of trio's system tasks are :class:`AsyncSocket` timers now."""
    import trio

    root = trio.lowlevel.current_root_task()
    assert root is not None
    tasks = [t for n in root.child_nurseries for t in n.child_tasks]  # system tasks among them
    return sum(t.name == "dcp socket timer" for t in tasks)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_waits_share_one_timer_that_close_ends(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """On trio a wait makes no cancel scope: its deadline is one timer task's, kept across
    waits whose deadlines are no earlier (none made per wait), woken again for a pending
    wait's later deadline, and ended by close()."""
    a = ctx.socket(zmq.PAIR)
    endpoint = bind(a, "inproc")
    b = ctx.socket(zmq.PAIR)
    b.connect(endpoint)
    asock = AsyncSocket(a)
    try:
        with anyio.fail_after(10):
            assert _trio_timer_tasks() == 0
            start = anyio.current_time()

            async def send_once_parked() -> None:
                await anyio.wait_all_tasks_blocked()
                b.send(b"m")

            for k in range(20):  # each wait parks, ends with a message before its deadline
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send_once_parked)
                    assert await asock.wait_readable(start + 0.05 + k * 0.001)
                assert len(asock.drain(5)) == 1
                assert _trio_timer_tasks() == 1
            late = start + 0.3  # the timer fires first for an earlier wait's deadline
            assert not await asock.wait_readable(late)
            assert anyio.current_time() >= late
            assert _trio_timer_tasks() == 0  # it fired for this wait: nothing pending
            async with anyio.create_task_group() as tg:
                tg.start_soon(send_once_parked)
                assert await asock.wait_readable(anyio.current_time() + 60)
            asock.drain(5)
            assert _trio_timer_tasks() == 1  # asleep for 60 s: close() ends it
    finally:
        asock.close()
        b.close(0)
    await anyio.wait_all_tasks_blocked()
    assert _trio_timer_tasks() == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_wait_whose_deadline_has_passed_is_a_checkpoint(pair: Pair) -> None:
    """A deadline already past ends the wait at once (no message: False), but it is still a
    checkpoint: a cancelled caller sees its cancellation there."""
    asock = AsyncSocket(pair.dealer)
    assert not await asock.wait_readable(anyio.current_time() - 1)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await asock.wait_readable(anyio.current_time() - 1)
        pytest.fail("not a checkpoint")  # pragma: no cover
    assert scope.cancelled_caught
    pair.router.send_multipart([b"dealer-1", b"m"])
    with anyio.fail_after(10):
        while not await asock.wait_readable(anyio.current_time() - 1):  # noqa: ASYNC110
            await anyio.sleep(0.001)
    assert [r.frames for r in asock.drain(5)] == [[b"m"]]


def test_a_trio_timer_left_by_one_run_does_not_stop_the_next_runs_deadlines(pair: Pair) -> None:
    """A trio run that ends with the socket's timer task asleep takes it with it; a wait in
    the next run still ends at its own deadline."""
    asock = AsyncSocket(pair.dealer)

    async def message_before_a_late_deadline() -> None:
        async def send_once_parked() -> None:
            await anyio.wait_all_tasks_blocked()
            pair.router.send_multipart([b"dealer-1", b"m"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_once_parked)
            assert await asock.wait_readable(anyio.current_time() + 60)
        assert [r.frames for r in asock.drain(5)] == [[b"m"]]
        assert _trio_timer_tasks() == 1  # asleep for 60 s when the run ends

    async def deadline() -> None:
        with anyio.fail_after(10):
            due = anyio.current_time() + 0.02
            assert not await asock.wait_readable(due)
            assert anyio.current_time() >= due

    anyio.run(message_before_a_late_deadline, backend="trio")
    anyio.run(deadline, backend="trio")
    asock.close()


async def test_a_close_after_the_fd_woke_the_waiter_raises_closed(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """The owner's FD turns readable and, before the owner runs again, another task woken
    in the same pass of the event loop closes the socket: the owner sees it closed
    (``ClosedResourceError``), never the closed zmq socket's own error (``ENOTSOCK``)."""
    outcomes: set[str] = set()
    for _ in range(40):  # the order of the two tasks in one pass is the loop's: both tried
        a = ctx.socket(zmq.PAIR)
        b = ctx.socket(zmq.PAIR)
        endpoint = f"inproc://test-zmqio-{next(_inproc_names)}"
        a.bind(endpoint)
        b.connect(endpoint)
        asock = AsyncSocket(a)
        r, w = socket.socketpair()

        async def owner(asock: AsyncSocket = asock) -> None:
            try:
                await asock.wait_readable()
                outcomes.add("readable")
            except anyio.ClosedResourceError:
                outcomes.add("closed")

        async def closer(asock: AsyncSocket = asock, r: socket.socket = r) -> None:
            await anyio.wait_readable(r)
            asock.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
            tg.start_soon(closer)
            await anyio.wait_all_tasks_blocked()
            b.send(b"x")  # the owner's FD and the closer's ready for the same pass
            w.send(b"x")
        b.close(0)
        r.close()
        w.close()
    assert outcomes <= {"readable", "closed"}
