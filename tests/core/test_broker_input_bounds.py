"""Check before you build (issue 26): what a peer sends is held to its size before it is
parsed or kept, in the sans-IO broker core with real frames: DBP registrations (dbp Rule
DB2, with and without CURVE), service info (directory Rule D3), dcp option parts (queues Rule
Q1), mc0 headers and DBP name frames."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from typing import Any

import pytest

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.guard import Guard
from dcp.wire import Reply, Request, dbp, mc0, parse
from dcp.wire.messages import parse_error_reply
from dcp.wire.options import MAX_OPTION, REQUEST_ID_PREFIX
from tests.helpers import C1, feed, take

T = b"1700000000.0"


def no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - the point of the tests
        raise AssertionError("the JSON was parsed")

    monkeypatch.setattr(json, "loads", parse)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
def test_an_oversized_dbp_registration_is_refused_before_it_is_parsed(
    secure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Secure: a client-only key (no service may be registered with it).
    guard = Guard(lambda key, name: False, os.urandom(32)) if secure else None
    core = BrokerCore(guard=guard)
    principal = "CLIENT-KEY" if secure else None
    # 4 MiB of empty lists: Python's parser would keep about 90 MB and take about a second.
    doc = b'{"name": "s", "x": [' + b"[]," * ((4 << 20) // 3) + b"[]]}"
    no_parsing(monkeypatch)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        core.receive([b"P", b"", dbp.REGISTER, T, doc], 0.0, principal)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # nothing of the document's size was built (not even a copy)
    assert elapsed < 0.5
    assert core.counters.rejections == {"json_too_large": 1}
    ((peer, empty, command, _, reason),) = take(core)
    assert (peer, empty, command) == (b"P", b"", dbp.DENIED)
    assert reason.startswith(b"json_too_large: DBP registration is ")
    assert not core.routing.services


@pytest.mark.parametrize(
    "doc",
    [
        b'{"name": "s", "x": '
        + b"[" * 2000
        + b"]" * 2000
        + b"}",  # Python's parser: RecursionError
        b'{"name": "s", "x": ' + b"[" * 33 + b"]" * 33 + b"}",
        b'{"name": "s", "x": [' + b"0," * 10_000 + b"0]}",
    ],
    ids=["deeper-than-python", "depth-33", "10001-elements"],
)
def test_dbp_documents_too_deep_or_too_many_are_refused(doc: bytes) -> None:
    core = BrokerCore()
    for command in (dbp.REGISTER, dbp.UPDATE):
        core.receive([b"P", b"", command, T, doc], 0.0)
    assert core.counters.rejections == {"json_too_large": 2}
    ((*_, denied, _, reason),) = take(core)  # only the registration is answered
    assert denied == dbp.DENIED and reason.startswith(b"json_too_large")
    # Within the limits, the same shape registers.
    core.receive([b"P", b"", dbp.REGISTER, T, b'{"name": "s", "x": [[[0, 1]]]}'], 0.0)
    assert take(core)[0][2] == dbp.APPROVED


def test_service_info_nested_past_pythons_parser_is_refused() -> None:
    core = BrokerCore()
    info = b'{"metadata": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    feed(core, C1, Request(b"mmi.describe", None, (b"id",), (b"svc", info)))
    ((frames),) = take(core)
    msg, _ = parse(frames[1:])
    assert isinstance(msg, Reply) and msg.data == (b"400",)
    assert core.counters.rejections == {"bad_service_info": 1}


def test_a_dcp_option_part_over_the_limit_is_refused_before_it_is_kept() -> None:
    core = BrokerCore()
    for part in (
        REQUEST_ID_PREFIX + b"x" * MAX_OPTION,
        b"\xffDCP:expires-in=" + b"1" * MAX_OPTION,
    ):
        feed(core, C1, Request(b"svc", None, (part,), (b"data",)))
        ((frames),) = take(core)
        msg, _ = parse(frames[1:])
        assert isinstance(msg, Reply)
        error = parse_error_reply(msg.data)
        assert error is not None and error[0] == "header_too_long"
    assert core.counters.rejections == {"header_too_long": 2}
    assert not core.routing.services  # nothing queued, no service made
    # At the limit, and a plain (non-option) metadata part of any length, are accepted.
    part = REQUEST_ID_PREFIX + b"x" * (MAX_OPTION - len(REQUEST_ID_PREFIX))
    feed(core, C1, Request(b"svc", None, (part, b"m" * 2 * MAX_OPTION), (b"data",)))
    assert take(core) == []
    assert core.routing.services[b"svc"].queue


def test_mc0_header_values_over_the_limit_are_refused() -> None:
    core = BrokerCore()
    long = b"v" * (mc0.MAX_HEADER + 1)
    core.receive([b"m", b"CONNECT", b"VERSION", long, b"ID", b"1"], 0.0)
    core.receive([b"m", b"CONNECT", long, b"0.3"], 0.0)
    assert core.counters.rejections == {"header_too_long": 2}
    assert [frames[1] for frames in take(core)] == [b"ERROR"] * 2
    core.receive([b"m", b"CONNECT", b"VERSION", long[1:], b"ID", b"1"], 0.0)
    assert take(core) == [[b"m", b"OK", b"ID", b"1"]]
    with pytest.raises(mc0.BadMc0Message):  # a long verb is not copied either
        mc0.parse([b"CONNECT" * 1000])


def test_dbp_name_and_client_frames_over_the_limit_are_refused() -> None:
    core = BrokerCore()
    long = b"n" * (dbp.MAX_HEADER + 1)
    core.receive([b"P", b"", dbp.INFO_REQUEST, T, long], 0.0)
    core.receive([b"P", b"", dbp.REPLY, T, long, b"", b"x"], 0.0)
    assert core.counters.rejections == {"header_too_long": 2}
    assert take(core) == []
