"""Live fuzz of pub/sub (both anyio backends): while a real publisher and subscriber exchange
messages, raw DEALER peers send seeded-random mc0-shaped commands and DCP pub/sub requests,
valid and mutated. Each garbage message's fate is predicted here from the rules
(``dcp._core.broker.mc0`` Rules MC1-MC2, ``dcp._core.broker.pubsub_peers`` Rule PS1); the broker's
rejection counters must equal the prediction exactly, and the real subscriber gets every message.
``DCP_FUZZ_COUNT`` raises the count for a soak."""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Sequence

import anyio
import anyio.lowlevel
import pytest
import zmq

import dcp
from dcp._core.broker.subjects import SubjectError, check_pattern, check_subject
from dcp._io.context import get_context
from dcp.wire import mc0
from dcp.wire.sniff import Family, sniff

pytestmark = pytest.mark.anyio

COUNT = max(20_000, int(os.environ.get("DCP_FUZZ_COUNT", "0") or 0))
SEED = int(os.environ.get("DCP_FUZZ_SEED", "20261123"))
REAL = 300
PEERS = (b"F-one", b"F-two", b"F-three")
TOPICS = (b"t", b"t.a", b"t.b.c", b"a.*", b"a.>", b">", b"a..b", b"x y", b".", b"*", b"")
OPTIONS = (
    b"window=10",
    b"max-pending=5",
    b"overflow=drop-newest",
    b"overflow=disconnect",
    b"last-value",
    b"timeout=1000",
    b"x=y",
    b"window=0",
    b"window=abc",
    b"overflow=never",
    b"max-pending=0",
    b"timeout=",
)
NAMES = (b"sub", b"unsub", b"credit", b"pub", b"pub", b"nope")
VERBS = (b"CONNECT", b"DISCONNECT", b"SUB", b"UNSUB", b"PUT", b"NOOP")


def _count(value: bytes | None, low: int, high: int) -> bool:
    return value is None or (value.isdigit() and len(value) <= 12 and low <= int(value) <= high)


def predict(frames: Sequence[bytes], peer: bytes) -> str | None:
    """The rejection reason the broker counts for ``frames`` from ``peer`` (``None``: none);
    ``"skip"``: not to be sent (it would touch the real traffic)."""
    if any(f.startswith(b"real") for f in frames):
        return "skip"
    family = sniff(frames)
    if family is Family.MC0:
        return predict_mc0(frames)
    if family is not Family.DCP:
        return "skip"
    try:
        msg, _ = dcp.wire.parse(frames)
    except dcp.RemoteProtocolError as exc:
        return exc.reason
    if not isinstance(msg, dcp.wire.Request) or not msg.service.startswith(b"\xffDCP:"):
        return "skip"
    if msg.client is not None and msg.client != peer:
        return "forbidden_address"
    name, data = msg.service[5:], msg.data
    if name == b"pub":
        try:
            check_subject(data[0] if data else b"")
        except SubjectError:
            return "bad_subject"
        return None
    if name == b"credit":
        ok = len(data) == 2 and data[1].isdigit() and _count(data[1], 0, 1_000_000)
        return None if ok else "bad_subscription"
    if name == b"unsub":
        return None if len(data) == 1 else "bad_subscription"
    if name != b"sub":
        return "unknown_pubsub_command"
    if len(data) < 3 or not data[0]:
        return "bad_subscription"
    try:
        check_pattern(data[1])
    except SubjectError:
        return "bad_subject"
    opts: dict[bytes, bytes] = {}
    for part in data[3:]:
        k, _, v = part.partition(b"=")
        opts.setdefault(k, v)
    good = (
        _count(opts.get(b"max-pending"), 1, 100_000)
        and _count(opts.get(b"window"), 1, 1_000_000)
        and _count(opts.get(b"timeout"), 1, 3_600_000)
        and opts.get(b"overflow", b"drop-oldest")
        in (b"drop-oldest", b"drop-newest", b"disconnect")
    )
    return None if good else "bad_subscription"


def predict_mc0(frames: Sequence[bytes]) -> str | None:
    try:
        cmd = mc0.parse(frames)
    except dcp.RemoteProtocolError as exc:
        return exc.reason
    if cmd.verb == b"PUT":
        topic = cmd.headers.get(b"TOPIC")
        if topic is None:
            return "bad_mc0_message"
        try:
            check_subject(topic)
        except SubjectError:
            return "bad_subject"
    elif cmd.verb == b"SUB":
        for topic in cmd.positional:
            try:
                tokens = check_pattern(topic)
            except SubjectError:
                return "bad_subject"
            if b"*" in tokens or b">" in tokens:
                return "bad_subject"
    elif cmd.verb == b"CONNECT":
        ttl = cmd.headers.get(b"TTL")
        if ttl is not None and (not ttl.isdigit() or not 100 <= int(ttl[:12]) <= 86_400_000):
            return "bad_ttl"
    return None


class Garbage:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def mc0(self) -> list[bytes]:
        r = self.rng
        verb = r.choice(VERBS)
        frames = [verb]
        for _ in range(r.randrange(3)):
            key = r.choice([b"ID", b"TOPIC", b"TTL", b"VERSION", b"X-Y"])
            value = {
                b"TTL": r.choice([b"500", b"5", b"abc", b"99999999999"]),
                b"TOPIC": r.choice(TOPICS),
            }
            frames += [key, value.get(key, b"%d" % r.randrange(100))]
        if r.random() < 0.8:
            frames.append(b"")
            frames += [r.choice(TOPICS) for _ in range(r.randrange(3))]
        return frames

    def dcp(self, peer: bytes) -> list[bytes]:
        r = self.rng
        name = r.choice(NAMES)
        meta = [b"\xffDCP:id=%d" % r.randrange(10**6)] if r.random() < 0.7 else []
        if name == b"sub":
            data = [b"sid%d" % r.randrange(4), r.choice(TOPICS), r.choice([b"", b"q"])]
            data += [r.choice(OPTIONS) for _ in range(r.randrange(3))]
        elif name == b"pub":
            data = [r.choice(TOPICS), b"body"]
        else:
            data = [b"sid%d" % r.randrange(4), r.choice([b"1", b"x", b""])][: r.randrange(4)]
        client = [] if r.random() < 0.9 else [r.choice([peer, b"someone"])]
        return [
            b"",
            dcp.wire.PROTOCOL,
            b"\x04",
            b"\xffDCP:" + name,
            *client,
            b"",
            *meta,
            b"",
            *data,
        ]

    def mutate(self, frames: list[bytes]) -> list[bytes]:
        r = self.rng
        frames = list(frames)
        op = r.randrange(4)
        i = r.randrange(len(frames))
        if op == 0 and len(frames) > 1:
            del frames[i]
        elif op == 1:
            frames.insert(i, r.choice([b"", b"ID", r.randbytes(3)]))
        elif op == 2:
            frames = frames[: i + 1]
        else:
            frames[i] = r.randbytes(len(frames[i]))
        return frames


async def send_garbage(
    endpoint: str, rng: random.Random, expected: Counter[str], done: anyio.Event
) -> None:
    gen = Garbage(rng)
    socks: dict[bytes, zmq.Socket[bytes]] = {}
    for ident in PEERS:
        sock: zmq.Socket[bytes] = get_context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, ident)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(endpoint)
        socks[ident] = sock
    sent = 0
    try:
        while sent < COUNT:
            peer = rng.choice(PEERS)
            frames = gen.mc0() if rng.random() < 0.5 else gen.dcp(peer)
            if rng.random() < 0.3:
                frames = gen.mutate(frames)
            reason = predict(frames, peer)
            if reason == "skip":
                continue
            try:
                socks[peer].send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                await anyio.sleep(0.001)
                continue
            sent += 1
            if reason is not None:
                expected[reason] += 1
            if sent % 32 == 0:
                await anyio.lowlevel.checkpoint()
                for s in socks.values():
                    while s.poll(0):
                        s.recv_multipart()
        done.set()
        while True:
            for s in socks.values():
                while s.poll(0):
                    s.recv_multipart()
            await anyio.sleep(0.005)
    finally:
        for s in socks.values():
            s.close(0)


async def test_pubsub_survives_garbage() -> None:
    rng = random.Random(SEED)
    expected: Counter[str] = Counter()
    broker = dcp.Broker("tcp://127.0.0.1:0")
    async with anyio.create_task_group() as tg:
        [endpoint] = await tg.start(broker.serve)
        async with (
            dcp.Client(endpoint) as pub,
            dcp.Client(endpoint) as c,
            c.subscribe("real.>", max_pending=REAL) as sub,
        ):
            got: list[dcp.PubSubMessage] = []
            with anyio.fail_after(60):
                async with anyio.create_task_group() as fuzz:
                    done = anyio.Event()
                    fuzz.start_soon(send_garbage, endpoint, rng, expected, done)
                    for i in range(REAL):
                        await pub.publish(f"real.{i % 7}", b"%d" % i, ack=i % 10 == 0)
                    async for msg in sub:
                        got.append(msg)
                        if len(got) == REAL:
                            break

                    await done.wait()

                    def settled() -> bool:
                        s = broker.statistics().rejections
                        return sum(s.values()) >= sum(expected.values())

                    while not settled():  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                    await anyio.sleep(0.1)  # nothing more arrives
                    fuzz.cancel_scope.cancel()
            assert [m.data[0] for m in got] == [b"%d" % i for i in range(REAL)]
            assert sub.lost == 0
            routed = await pub.publish("real.0", b"still", ack=True)
            assert routed is not None and routed >= 1
        stats = broker.statistics()
        tg.cancel_scope.cancel()
    assert dict(stats.rejections) == dict(expected)
    assert {"bad_mc0_message", "bad_subject", "bad_subscription", "bad_ttl"} <= set(expected)
