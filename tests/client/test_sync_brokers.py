"""The blocking client given several brokers (``docs/scaling.md``): real :class:`dcp.Broker`
s on 127.0.0.1 in a background event loop (each anyio backend), the client in a thread of its
own, and plain-pyzmq workers the test drives (to hold a request, send a HELD notice, answer
late). At the end, the cases with every broker (or one) down, and streams and subscriptions
ended at the right broker: the brokers in the test's own event loop, the client in a worker
thread."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import pytest
import zmq

from dcp import (
    BindFailed,
    Broker,
    Client,
    HandlerRequest,
    RequestTimeout,
    StreamBroken,
    SyncSubscription,
    Worker,
)
from dcp._client.subscriptions import SubscriptionState
from dcp._client.sync_brokers import BrokersReceiver
from dcp._client.sync_client import SyncClient
from dcp._client.sync_receive import SyncReceiver
from dcp._core.client.brokers import BrokerState
from dcp._io.context import get_context
from dcp._models import Response
from dcp.wire import Register, Reply, Request, parse, serialize
from dcp.wire.messages import HELD_MARKER
from tests.cli.procs import Proc
from tests.cli.procs import start_broker as start_cli_broker
from tests.client.test_brokers import free_port
from tests.fakes import RawWorker
from tests.helpers import wait_for

T = TypeVar("T")


class Brokers:
    """Real brokers on an event loop in a background thread, started and stopped at will."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal) -> None:
        self.portal = portal
        self._running: dict[str, concurrent.futures.Future[None]] = {}
        self._workers: list[concurrent.futures.Future[None]] = []

    def start(self, endpoint: str = "tcp://127.0.0.1:0") -> str:
        """Start a broker (again, on the port of ``endpoint``): the port may be held a
        moment by a client's connection attempt that met itself (TCP's simultaneous open
        on loopback), so a restart waits until it binds."""
        deadline = time.monotonic() + 10
        while True:
            # Slow heartbeats: the plain-pyzmq workers here do not ping.
            broker = Broker(endpoint, heartbeat_interval=5.0)
            try:
                future, endpoints = self.portal.start_task(broker.serve)
            except BindFailed as exc:  # Broker.serve's (was zmq's error)
                if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
                continue
            self._running[endpoints[0]] = future
            return str(endpoints[0])

    def worker(self, endpoint: str, service: str, handler: Any) -> None:
        """A :class:`dcp.Worker` of ``service`` at ``endpoint``, on the brokers' loop (it
        stops with them)."""
        future, _ = self.portal.start_task(Worker(endpoint, service, handler).serve)
        self._workers.append(future)

    def stop(self, endpoint: str) -> None:
        future = self._running.pop(endpoint)
        future.cancel()
        concurrent.futures.wait([future], timeout=10)
        assert future.done()


@pytest.fixture
def brokers(anyio_backend: str) -> Iterator[Brokers]:
    """The brokers run on each anyio backend in turn."""
    with anyio.from_thread.start_blocking_portal(backend=anyio_backend) as portal:
        b = Brokers(portal)
        try:
            yield b
        finally:
            for future in b._workers:
                future.cancel()
            for endpoint in list(b._running):
                b.stop(endpoint)


class Holder:
    """A plain-pyzmq worker of ``svc`` registered at each of ``endpoints`` (one socket each):
    it takes requests and answers only when told."""

    def __init__(self, endpoints: list[str]) -> None:
        self.socks: list[zmq.Socket[bytes]] = []
        for endpoint in endpoints:
            sock = get_context().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            sock.send_multipart(serialize(Register(b"svc")))
            self.socks.append(sock)
        for sock in self.socks:  # the broker's confirmation
            assert isinstance(self._next(sock, Register), Register)

    def _next(self, sock: zmq.Socket[bytes], kind: type[T], timeout: float = 10) -> T | None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if sock.poll(int(left * 1000) + 1):
                msg, _ = parse(sock.recv_multipart())
                if isinstance(msg, kind):
                    return msg
        return None

    def request(self, timeout: float = 10) -> tuple[int, Request]:
        """The next request, and the index of the broker that brought it."""
        poller = zmq.Poller()
        for sock in self.socks:
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(int(left * 1000) + 1):
                msg, _ = parse(sock.recv_multipart())
                if isinstance(msg, Request):
                    return self.socks.index(sock), msg
        raise AssertionError("no request came")

    def quiet(self, index: int, seconds: float) -> bool:
        """True if no request comes through broker ``index`` within ``seconds``."""
        return self._next(self.socks[index], Request, seconds) is None

    def answer(self, index: int, request: Request, *data: bytes) -> None:
        self.socks[index].send_multipart(serialize(Reply(request.client, request.metadata, data)))

    def close(self) -> None:
        for sock in self.socks:
            sock.close(0)


@contextlib.contextmanager
def holder(endpoints: list[str]) -> Iterator[Holder]:
    h = Holder(endpoints)
    try:
        yield h
    finally:
        h.close()


def in_thread(fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Run ``fn`` in a new thread (a SyncClient belongs to the thread that uses it)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    return future


def receiver(client: SyncClient) -> BrokersReceiver:
    rx = client._receiver
    assert isinstance(rx, BrokersReceiver)
    return rx


def state(client: SyncClient, broker: int) -> BrokerState:
    return receiver(client).brokers.info()[broker].state


def wait_live(client: SyncClient, *brokers: int) -> None:
    """Pump until each of ``brokers`` is live (their handshakes are read by the pump)."""
    rx = receiver(client)
    deadline = time.monotonic() + 10
    while any(state(client, i) is not BrokerState.LIVE for i in brokers):
        assert time.monotonic() < deadline, rx.brokers.info()
        rx.pump(0.05)


def handled(worker: RawWorker, n: int) -> None:
    """Wait until ``worker`` counted ``n`` requests (it counts after sending the reply)."""
    deadline = time.monotonic() + 10
    while worker.handled < n:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert worker.handled == n


def _upper(data: tuple[bytes, ...]) -> list[bytes]:
    return [d.upper() for d in data]


def test_endpoints_are_checked_and_one_takes_todays_path() -> None:
    cases: list[tuple[list[object], str]] = [
        ([], "empty list"),
        (["tcp://127.0.0.1:1", "tcp://127.0.0.1:1"], "given twice"),
        (["tcp://127.0.0.1:1", b"tcp://127.0.0.1:2"], "must be a str"),
        (["tcp://127.0.0.1:1", "tcp://*:2"], "bad endpoint"),
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            SyncClient(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="failover_grace"):
        SyncClient(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], failover_grace=-1)
    with SyncClient(["tcp://127.0.0.1:1"]) as one:
        assert type(one._receiver) is SyncReceiver
        assert (one.endpoint, one.endpoints) == ("tcp://127.0.0.1:1", ("tcp://127.0.0.1:1",))
    two = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]
    with SyncClient(two) as client:
        assert (client.endpoint, client.endpoints) == (two[0], tuple(two))
        assert receiver(client).brokers.grace == 0.2  # failover_grace, by default
        rx = receiver(client)
        assert [link.sock.getsockopt(zmq.ROUTING_ID) for link in rx.links] == [
            client.routing_id
        ] * 2
    assert client.closed
    assert all(link.sock.closed for link in rx.links)


def test_requests_spread_over_every_broker(brokers: Brokers) -> None:
    a, b = brokers.start(), brokers.start()
    payloads = [b"p%d" % i for i in range(200)]
    with (
        RawWorker(a, b"svc", _upper) as wa,
        RawWorker(b, b"svc", _upper) as wb,
        SyncClient([a, b], timeout=10) as client,
    ):
        assert wa.registered.wait(10) and wb.registered.wait(10)
        wait_live(client, 0, 1)
        assert [r.data[0] for r in client.map("svc", payloads, window=16)] == _upper(
            tuple(payloads)
        )
        assert client.request("svc", b"one") == Response((b"ONE",))
        s = client.statistics()
        assert (s.replies, s.retries, s.pending) == (201, 0, 0)
        assert len(receiver(client).brokers) == 0
    # Least outstanding first: both carry a fair share.
    assert wa.handled > 50 and wb.handled > 50, (wa.handled, wb.handled)


def test_a_request_at_a_lost_broker_moves_to_another_at_once(brokers: Brokers) -> None:
    """Broker A is stopped while its request is held there: after the grace the request
    goes to B with the same id (not a retry), long before its attempt would time out."""
    a, b = brokers.start(), brokers.start()
    with holder([a]) as hold, RawWorker(b, b"svc", _upper) as wb:
        assert wb.registered.wait(10)
        client = SyncClient([a, b], timeout=60, attempt_timeout=30)

        def call() -> list[bytes]:
            with client:
                wait_live(client, 0, 1)
                return [r.data[0] for r in client.map("svc", [b"x", b"y"], window=2)]

        started = time.monotonic()
        replies = in_thread(call)
        via, _ = hold.request()  # the first request went to A (fewest outstanding)
        assert via == 0
        brokers.stop(a)
        assert replies.result(timeout=20) == [b"X", b"Y"]
        assert time.monotonic() - started < 20  # not the 30 s attempt timeout
        s = client.statistics()
        assert (s.replies, s.retries) == (2, 0)
        assert receiver(client).brokers.moved == 1
        handled(wb, 2)


def test_a_held_request_does_not_move_and_its_answer_comes_through_another_broker(
    brokers: Brokers,
) -> None:
    """The worker holding a request tells the client through B that it runs it (HELD) when
    A is lost: the request stays, and the answer sent later through B completes it once."""
    a, b = brokers.start(), brokers.start()
    with holder([a, b]) as hold:
        client = SyncClient([a, b], timeout=60, attempt_timeout=30, failover_grace=0.3)
        checked: list[bool] = []

        def call() -> Response:
            with client:
                wait_live(client, 0, 1)
                return client.request("svc", b"x")

        reply = in_thread(call)
        via, request = hold.request()
        other = 1 - via
        brokers.stop([a, b][via])
        hold.answer(other, request, HELD_MARKER)
        # Past the grace (and the client seeing the broker lost): nothing came to B.
        checked.append(hold.quiet(other, 1.5))
        hold.answer(other, request, b"DONE")
        assert reply.result(timeout=20) == Response((b"DONE",))
        spread = receiver(client).brokers
        assert checked == [True]
        assert (spread.held, spread.moved) == (1, 0)
        assert client.statistics().replies == 1


def test_a_recovered_broker_is_used_again(brokers: Brokers) -> None:
    a, b = brokers.start(), brokers.start()
    with RawWorker(b, b"svc", _upper) as wb:
        assert wb.registered.wait(10)
        with SyncClient([a, b], timeout=10) as client:
            wait_live(client, 0, 1)
            brokers.stop(a)
            rx = receiver(client)
            deadline = time.monotonic() + 10
            while state(client, 0) is not BrokerState.LOST:
                assert time.monotonic() < deadline
                rx.pump(0.05)
            assert client.request("svc", b"b") == Response((b"B",))  # only B is live
            assert brokers.start(a) == a  # the same port again
            with RawWorker(a, b"svc", _upper) as wa:
                assert wa.registered.wait(10)
                wait_live(client, 0)  # zmq reconnected by itself
                payloads = [b"%d" % i for i in range(100)]
                assert len(list(client.map("svc", payloads, window=8))) == 100
            assert wa.handled > 0


def test_with_no_broker_up_a_request_waits_for_the_first_one_back(brokers: Brokers) -> None:
    """Neither broker is up when the client starts: the request waits in the client
    (brokers Rule BK3) and goes to the first broker that comes."""
    a, b = brokers.start(), brokers.start()
    brokers.stop(a)
    brokers.stop(b)
    client = SyncClient([a, b], timeout=60, attempt_timeout=30, wait_for_worker=True)
    reply = in_thread(lambda: client.request("svc", b"late"))
    deadline = time.monotonic() + 10
    while client.statistics().pending != 1:  # (read from this thread: a counter)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    brokers.start(b)
    with RawWorker(b, b"svc", _upper) as wb:
        assert reply.result(timeout=20) == Response((b"LATE",))
        handled(wb, 1)
    assert client.statistics().retries == 0
    client.close()  # (from this thread, once the other is done with it)


def test_services_are_asked_of_every_broker_and_merged(brokers: Brokers) -> None:
    a, b = brokers.start(), brokers.start()
    with (
        RawWorker(a, b"svc", _upper) as wa,
        RawWorker(b, b"svc", _upper) as wb,
        RawWorker(b, b"only-b", _upper) as wo,
        SyncClient([a, b], timeout=10) as client,
    ):
        assert wa.registered.wait(10) and wb.registered.wait(10) and wo.registered.wait(10)
        wait_live(client, 0, 1)
        listed = {s.name: s.workers for s in client.services()}
        assert listed == {"svc": 2, "only-b": 1}
        info = client.service_info("only-b")  # A does not know it: B's answer
        assert info is not None and info.workers == 1
        assert client.service_info("nobody") is None
        brokers.stop(a)
        deadline = time.monotonic() + 10
        while receiver(client).live_brokers() != [1]:
            assert time.monotonic() < deadline
            receiver(client).pump(0.05)
        assert {s.name for s in client.services()} == {"svc", "only-b"}  # B alone answers


def test_a_stream_breaks_when_its_broker_is_lost(brokers: Brokers) -> None:
    a, b = brokers.start(), brokers.start()
    with holder([a, b]) as hold:
        client = SyncClient([a, b], timeout=60)

        def read() -> BaseException | None:
            with client:
                wait_live(client, 0, 1)
                try:
                    with client.stream("svc", b"x") as parts:
                        list(parts)
                except Exception as exc:
                    return exc
                return None

        error = in_thread(read)
        via, _ = hold.request()
        brokers.stop([a, b][via])
        exc = error.result(timeout=20)
        assert isinstance(exc, StreamBroken), exc
        assert "was lost" in str(exc)
        assert receiver(client).brokers.moved == 0


async def parts(request: HandlerRequest) -> AsyncIterator[bytes]:
    """A stream of ``int(request.data[0])`` parts."""
    for i in range(int(request.data[0])):
        yield b"%d" % i


def test_streams_on_each_broker_get_their_credit_there(brokers: Brokers) -> None:
    """Two streams, one on each broker (spread), each longer than its window: each reader's
    credit goes to the broker its stream is on (Rule SM3), so both run to the end."""
    a, b = brokers.start(), brokers.start()
    brokers.worker(a, "parts", parts)
    brokers.worker(b, "parts", parts)
    with SyncClient([a, b], timeout=20, wait_for_worker=True) as client:
        wait_live(client, 0, 1)
        one = client.stream("parts", b"100", window=4, stall_timeout=10)
        two = client.stream("parts", b"100", window=4, stall_timeout=10)
        rx = receiver(client)
        assert {rx.brokers.where(one._rid), rx.brokers.where(two._rid)} == {0, 1}
        with one, two:
            got_one = [p[0] for p in one]
            got_two = [p[0] for p in two]
        assert got_one == got_two == [b"%d" % i for i in range(100)]
        assert len(rx.brokers) == 0


def sub_state(sub: SyncSubscription) -> SubscriptionState:
    return sub._state


def test_a_subscription_is_at_every_broker(brokers: Brokers) -> None:
    """Pubsub Rule CP5: a message published through either broker is delivered once; a
    broker lost and back is subscribed at again."""
    a, b = brokers.start(), brokers.start()
    with (
        SyncClient([a, b], timeout=10) as sub_client,
        SyncClient([a, b], timeout=10) as pub_a,  # publishes through A (the first live)
        SyncClient([b, a], timeout=10) as pub_b,  # through B
    ):
        wait_live(pub_a, 0, 1)
        wait_live(pub_b, 0, 1)
        with sub_client.subscribe("news.>", refresh=0.2) as sub:
            assert sub_state(sub).at == {0, 1}
            assert pub_a.publish("news.a", b"1", ack=True) == 1
            assert pub_b.publish("news.b", b"2", ack=True) == 1
            got = [sub.next(timeout=10), sub.next(timeout=10)]
            assert sorted(m.data for m in got if m is not None) == [(b"1",), (b"2",)]
            assert sub.next(timeout=0.3) is None  # each once
            brokers.stop(a)
            assert brokers.start(a) == a
            deadline = time.monotonic() + 15
            # Read on: the client sees A lost and back, and subscribes there again.
            while not (
                sub_state(sub).at == {0, 1}
                and receiver(sub_client).brokers.info()[0].lost == 1
                and receiver(pub_a).live_brokers() == [0, 1]
            ):
                assert time.monotonic() < deadline, sub_state(sub).at
                assert sub.next(timeout=0.05) is None
                receiver(pub_a).pump(0.01)
            deadline = time.monotonic() + 15
            while pub_a.publish("news.a", b"3", ack=True) != 1:  # A has the subscription
                assert time.monotonic() < deadline
                time.sleep(0.05)
            msg = sub.next(timeout=10)
            assert msg is not None and msg.data == (b"3",)


def test_a_silent_broker_is_lost_by_heartbeats_and_a_killed_one_at_once(
    procs: list[Proc], tmp_path: Path
) -> None:
    """``dcp broker`` processes: one stopped (SIGSTOP: no FIN, no RST) is lost when zmq's
    heartbeats time out and its request moves; back after SIGCONT; SIGKILL loses it at
    once."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    broker_a, a = start_cli_broker(procs, tmp_path / "a")
    _, b = start_cli_broker(procs, tmp_path / "b")
    owner = concurrent.futures.ThreadPoolExecutor(1)  # the client's one thread
    try:
        with holder([a]) as hold, RawWorker(b, b"svc", _upper) as wb:
            assert wb.registered.wait(10)
            client = SyncClient([a, b], timeout=60, attempt_timeout=30)

            def call() -> list[bytes]:
                wait_live(client, 0, 1)
                return [r.data[0] for r in client.map("svc", [b"x", b"y"], window=2)]

            replies = owner.submit(call)
            via, _ = hold.request()
            assert via == 0
            os.kill(broker_a.popen.pid, signal.SIGSTOP)
            try:
                assert replies.result(timeout=20) == [b"X", b"Y"]  # not the 30 s attempt
            finally:
                os.kill(broker_a.popen.pid, signal.SIGCONT)
            assert receiver(client).brokers.moved == 1
            assert client.statistics().retries == 0
            owner.submit(wait_live, client, 0).result(timeout=20)  # back

            def lost_at_once() -> None:
                broker_a.kill()
                deadline = time.monotonic() + 5  # not the heartbeats' 3 s and more
                while state(client, 0) is not BrokerState.LOST:
                    assert time.monotonic() < deadline
                    receiver(client).pump(0.05)
                assert client.request("svc", b"z") == Response((b"Z",))

            owner.submit(lost_at_once).result(timeout=20)
            owner.submit(client.close).result(timeout=5)
    finally:
        owner.shutdown(wait=False)


def test_sync_every_broker_down_a_request_times_out_at_its_deadline() -> None:
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    with SyncClient(endpoints, timeout=0.6) as client:
        start = time.monotonic()
        with pytest.raises(RequestTimeout):
            client.request("echo", b"x")
        took = time.monotonic() - start
        assert 0.5 <= took < 1.5
        receiver = client._receiver
        brokers = receiver.brokers  # type: ignore[attr-defined]
        assert [i.outstanding for i in brokers.info()] == [0, 0]
        assert len(brokers) == 0 and not brokers._parked


@pytest.mark.anyio
@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("several", [False, True])
async def test_a_sync_stream_timed_out_or_left_is_cancelled_at_its_worker(
    several: bool, early: bool
) -> None:
    """Streams Rule CS4 for the blocking client: a stream that timed out, or was left early,
    is cancelled at its worker; with several brokers the CANCEL goes to the stream's broker,
    not the home broker."""
    cancelled = anyio.Event()

    async def stall(request: HandlerRequest) -> AsyncIterator[bytes]:
        try:
            yield b"one"
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    async with Broker("tcp://127.0.0.1:0") as a, Broker("tcp://127.0.0.1:0") as b:
        endpoints = [a.endpoints[0], b.endpoints[0]]
        # The worker is only at the second broker: the stream cannot start at the home one.
        async with Worker(endpoints[1], "stall", stall):
            await wait_for(lambda: b.statistics().workers == 1)

            def read() -> list[tuple[bytes, ...]]:
                got: list[tuple[bytes, ...]] = []
                with SyncClient(endpoints if several else endpoints[1], timeout=0.5) as c:
                    if several:
                        c.services()  # both brokers live (their first handshakes)
                        # The least outstanding, round-robin: use up the first broker's turn.
                        c.request("mmi.services", wait_for_worker=True, retries=0)
                    if early:
                        with c.stream("stall") as parts:
                            got.append(next(parts))
                    else:
                        with pytest.raises(RequestTimeout), c.stream("stall") as parts:
                            got.extend(parts)
                return got

            assert await anyio.to_thread.run_sync(read) == [(b"one",)]
            with anyio.fail_after(5):
                await cancelled.wait()


def test_a_sync_publish_with_every_broker_down_returns() -> None:
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    with SyncClient(endpoints) as client:
        assert client.publish("t.a", b"x") is None


@pytest.mark.anyio
async def test_a_sync_publish_just_after_making_the_client_is_not_dropped() -> None:
    """One broker: a publish right after the client is made is queued and delivered; with
    several it goes through the first live broker once it connected (not dropped)."""
    down = f"tcp://127.0.0.1:{free_port()}"
    async with Broker("tcp://127.0.0.1:0") as a:
        endpoint = a.endpoints[0]
        async with Client(endpoint) as sub_client, sub_client.subscribe("t.>") as sub:

            def publish() -> None:
                with SyncClient([endpoint, down]) as client:
                    client.publish("t.a", b"x")
                    client.request("mmi.services", wait_for_worker=True, retries=0)

            await anyio.to_thread.run_sync(publish)
            with anyio.fail_after(3):
                msg = await anext(sub)
            assert msg.data == (b"x",)


def test_a_sync_subscription_refused_by_a_live_broker_is_asked_there_again() -> None:
    """Pubsub Rule CP5 for the blocking client (as the async one)."""
    # Live (its handshakes succeed) but never answers.
    fake: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    fake.linger = 0
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    subs = 0

    async def main() -> None:
        async with Broker("tcp://127.0.0.1:0") as a:
            endpoints = [a.endpoints[0], f"tcp://127.0.0.1:{port}"]

            def sync() -> None:
                with SyncClient(endpoints, timeout=0.5) as client:
                    client._receiver.settle()  # type: ignore[attr-defined]
                    with client.subscribe("t.>", refresh=0.2) as sub:
                        time.sleep(0.1)
                        while fake.poll(0):  # the first SUB's attempts: not counted
                            fake.recv_multipart()
                        end = time.monotonic() + 2
                        while time.monotonic() < end:
                            sub.next(0.1)

            await anyio.to_thread.run_sync(sync)

    try:
        anyio.run(main)
        while fake.poll(100):
            subs += any(f == b"\xffDCP:sub" for f in fake.recv_multipart())
    finally:
        fake.close(0)
    assert subs >= 1  # asked again after the first SUB failed


def test_a_pin_holds_within_its_block_and_is_lifted_whatever_happens() -> None:
    """Rule SM4: :meth:`BrokersReceiver.pinned` asks one broker within its block only."""
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    with SyncClient(endpoints, timeout=0.5) as client:
        rx = receiver(client)

        def pin() -> int | None:
            return rx.pin  # (read afresh: mypy would narrow the attribute)

        assert pin() is None
        with rx.pinned(1):
            assert pin() == 1
        assert pin() is None
        with pytest.raises(RuntimeError, match="inside"), rx.pinned(0):
            assert pin() == 0
            raise RuntimeError("inside")
        assert pin() is None
