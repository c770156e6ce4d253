"""The directory's bounds in the sans-IO broker core, with real frames and explicit ``now``:
listings in pages (Rule D6), descriptions and listing answers charged to the byte budget,
waiting descriptions expiring (Rule D7)."""

from __future__ import annotations

import json
from typing import Any

from dcp._core.broker import directory
from dcp._core.broker.core import BrokerCore
from dcp._core.worker.core import DESCRIBE_TAG
from dcp.wire import Ping, Reconnect, Register, Reply, Request, parse
from dcp.wire.messages import parse_error_reply
from tests.helpers import C1, C2, W1, feed, take

T = b"1700000000.000"


def asked(
    core: BrokerCore, name: bytes, *data: bytes, peer: bytes = C1, now: float = 0.0
) -> tuple[bytes, ...]:
    """The data of the broker's answer to ``peer``'s request for ``name``."""
    feed(core, peer, Request(name, None, (b"id",), data), now=now)
    (frames,) = take(core)
    msg, _ = parse(frames[1:])
    assert isinstance(msg, Reply) and msg.metadata == (b"id",)
    return msg.data


def queue_for(core: BrokerCore, names: list[bytes]) -> None:
    """Make ``names`` known to the broker: one queued request each, from C2."""
    for n, name in enumerate(names):
        feed(core, C2, Request(name, None, (b"q%d" % n,), (b"x",)))
    assert take(core) == []


def every_page(core: BrokerCore, name: bytes, first: tuple[bytes, ...]) -> list[Any]:
    """Every entry of a listing, asking page after page with the cursor (Rule D6)."""
    listing: list[Any] = []
    data: tuple[bytes, ...] = first
    while True:
        answer = asked(core, name, *data)
        assert len(answer[0]) <= directory.PAGE_BYTES
        page = json.loads(answer[0])
        assert 0 < len(page) <= directory.PAGE_ENTRIES
        listing += page
        if len(answer) == 1:
            return listing
        (_, cursor) = answer
        assert cursor == page[-1]["name"].encode()
        data = (cursor,) if name == b"mmi.services" else (b"", cursor)


def test_listings_come_in_pages_that_cover_every_service() -> None:
    core = BrokerCore()
    names = [b"s%04d" % n for n in range(directory.PAGE_ENTRIES + 30)]
    queue_for(core, names[::-1])  # known in reverse order: pages list by name
    # An old peer's request (no cursor) gets the first page, and a cursor it can ignore.
    first = asked(core, b"mmi.services")
    assert len(first) == 2 and len(json.loads(first[0])) == directory.PAGE_ENTRIES
    expected = [n.decode() for n in names]
    assert [e["name"] for e in every_page(core, b"mmi.services", ())] == expected
    for question in (b"mmi.info", b"mmi.stats"):
        assert [e["name"] for e in every_page(core, question, (b"",))] == expected
        assert [e["name"] for e in every_page(core, question, ())] == expected
    # The last page's cursor asks for nothing more.
    assert asked(core, b"mmi.services", names[-1]) == (b"[]",)


def test_pages_are_bounded_by_bytes() -> None:
    core = BrokerCore()
    names = [b"%04d" % n + b"n" * 1000 for n in range(200)]  # 200 x 1 KB: about 230 KB
    queue_for(core, names)
    listing = every_page(core, b"mmi.services", ())
    assert [e["name"].encode() for e in listing] == names


def test_dbp_listing_is_capped_with_a_marker() -> None:
    core = BrokerCore()
    names = [b"s%04d" % n for n in range(directory.PAGE_ENTRIES + 1)]
    queue_for(core, names)
    feed(core, b"D1", [b"", b"u_U", T, b""])
    (frames,) = take(core)
    assert frames[:3] == [b"D1", b"", b"o_O"]
    listing = json.loads(frames[-1])
    assert len(frames[-1]) <= directory.PAGE_BYTES + 100
    assert listing[-1] == {
        "truncated": True,
        "listed": directory.PAGE_ENTRIES,
        "services": directory.PAGE_ENTRIES + 1,
    }
    assert [e["name"] for e in listing[:-1]] == [n.decode() for n in names[:-1]]


def test_listing_answers_are_charged_to_their_asker_for_a_while() -> None:
    # directory: 10% of 8 MiB; one peer: a quarter of it, about 210 KB (three 64 KiB pages)
    core = BrokerCore(max_memory=8 * 1024 * 1024)
    account = core.memory.account("directory")
    queue_for(core, [b"%04d" % n + b"n" * 1000 for n in range(200)])
    answers = [asked(core, b"mmi.services", now=1.0) for _ in range(10)]
    refused = [a for a in answers if parse_error_reply(a) is not None]
    assert 0 < len(refused) < 10
    assert parse_error_reply(refused[0]) == ("memory_budget", "too many listings; ask later")
    assert core.counters.rejections["memory_budget"] == len(refused)
    assert account.held(C1) <= account.peer_limit  # type: ignore[operator]
    # Another peer is answered meanwhile, and the asker again once its answers were held.
    assert parse_error_reply(asked(core, b"mmi.services", peer=b"C3", now=1.0)) is None
    assert core.next_deadline() == 1.0 + directory.LISTING_HOLD
    core.expire(1.0 + directory.LISTING_HOLD)
    assert account.used == 0
    assert parse_error_reply(asked(core, b"mmi.services", now=12.0)) is None
    # Small answers are not charged.
    assert asked(core, b"mmi.service", b"0000", peer=b"C4") == (b"404",)
    assert account.held(b"C4") == 0


def describe(core: BrokerCore, peer: bytes, name: bytes, raw: bytes, now: float = 0.0) -> bytes:
    feed(core, peer, Request(directory.DESCRIBE, None, (DESCRIBE_TAG,), (name, raw)), now=now)
    (frames,) = take(core)
    msg, _ = parse(frames[1:])
    assert isinstance(msg, Reply)
    return msg.data[0]


def test_a_description_is_bounded_by_its_parsed_size() -> None:
    core = BrokerCore()
    lists = b"[" + b",".join([b"[]"] * 21_000) + b"]"  # 62 KB of JSON, 1.4 MB parsed
    raw = b'{"request_schema": {"a": ' + lists + b"}}"
    assert len(raw) <= directory.MAX_INFO
    assert describe(core, W1, b"a", raw) == b"400"
    assert core.counters.rejections["bad_service_info"] == 1
    assert core.memory.account("directory").used == 0
    # Nesting too deep for the parser is refused, not raised out of the core.
    deep = b'{"request_schema": ' + b"[" * 32_000 + b"]" * 32_000 + b"}"
    assert len(deep) <= directory.MAX_INFO
    assert describe(core, W1, b"a", deep) == b"400"
    # A real schema of the same size is taken.
    props = {f"f{i}": {"type": "string", "description": "a field"} for i in range(1100)}
    schema = json.dumps({"request_schema": {"properties": props}}).encode()
    assert 50_000 < len(schema) <= directory.MAX_INFO
    assert describe(core, W1, b"a", schema) == b"200"


def test_descriptions_are_charged_expire_and_leave_with_their_peer() -> None:
    core = BrokerCore(max_memory=8 * 1024 * 1024)  # one peer: about 210 KB of descriptions
    account = core.memory.account("directory")
    props = {f"f{i}": {"type": "string"} for i in range(200)}  # about 75 KB parsed
    raw = json.dumps({"request_schema": {"properties": props}}).encode()
    # A peer that never registers: its descriptions are charged, until its share is spent.
    said = [describe(core, C1, b"s%d" % n, raw, now=1.0) for n in range(20)]
    assert said[0] == b"200" and b"400" in said
    assert core.counters.rejections["memory_budget"] == said.count(b"400")
    assert 0 < account.held(C1) <= account.peer_limit  # type: ignore[operator]
    # Waiting descriptions expire, releasing their bytes.
    assert core.next_deadline() == 1.0 + directory.WAITING_TTL
    core.expire(1.0 + directory.WAITING_TTL)
    assert account.used == 0 and not core.directory.waiting
    # A worker's description is kept while it is registered, and leaves with it.
    assert describe(core, W1, b"a", raw, now=70.0) == b"200"
    assert describe(core, W1, b"b", raw, now=70.0) == b"200"
    feed(core, W1, Register(b"a"), now=70.0)
    take(core)
    assert core.directory.info(b"a") is not None and account.held(W1) > 0
    for t in range(72, 72 + int(directory.WAITING_TTL), 2):  # it stays alive, "b" expires
        feed(core, W1, Ping(), now=t)
        core.expire(t)
    take(core)
    assert core.directory.info(b"a") is not None
    assert core.directory.waiting_info(W1, b"b") is None
    assert describe(core, W1, b"b", raw, now=200.0) == b"200"  # waits again
    feed(core, W1, Reconnect(), now=200.0)  # it leaves
    take(core)
    assert core.directory.info(b"a") is None and not core.directory.waiting
    assert account.used == 0
