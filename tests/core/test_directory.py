"""The directory (Rules D1-D5) and approval (Rules AP1-AP4) in the sans-IO broker core, with
explicit ``now``, and the worker core's Rule W14 (several services), without sockets."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp._core.broker import directory
from dcp._core.broker.approval import Approval, ApprovalRequest, Approvals, to_approval
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.dialects import DCP1
from dcp._core.worker.core import DESCRIBE_TAG, Refused, State, WorkerCore
from dcp.wire import (
    Ping,
    Pong,
    Reconnect,
    Register,
    Reply,
    Request,
    mdp,
    parse,
    serialize,
)
from dcp.wire.messages import error_reply_data, parse_error_reply
from tests.helpers import C1, W1, W2, feed, take, take_events, take_worker

INFO = {"version": "1.0.0", "description": "d", "metadata": {"k": "v"}}


def ask(core: BrokerCore, name: bytes, *data: bytes, now: float = 0.0) -> tuple[bytes, ...]:
    """What the broker answers client C1's request for ``name``."""
    feed(core, C1, Request(name, None, (b"id",), data), now=now)
    (frames,) = take(core)
    msg, _ = parse(frames[1:])
    assert isinstance(msg, Reply) and msg.metadata == (b"id",)
    return msg.data


def describe(core: BrokerCore, peer: bytes, name: bytes, info: Any) -> bytes:
    raw = info if isinstance(info, bytes) else json.dumps(info).encode()
    feed(core, peer, Request(directory.DESCRIBE, None, (DESCRIBE_TAG,), (name, raw)))
    (frames,) = take(core)
    msg, _ = parse(frames[1:])
    assert isinstance(msg, Reply)
    return msg.data[0]


def test_listing_info_and_stats() -> None:
    core = BrokerCore()
    assert json.loads(ask(core, b"mmi.services")[0]) == []
    assert describe(core, W1, b"a", INFO) == b"200"
    feed(core, W1, Register(b"a"))
    feed(core, W1, Register(b"b"))
    take(core)
    listing = json.loads(ask(core, b"mmi.services")[0])
    assert listing == [
        {"name": "a", "workers": 1, "idle": 1, "busy": 0, "queued": 0}
        | {"version": "1.0.0", "description": "d"},
        {"name": "b", "workers": 1, "idle": 1, "busy": 0, "queued": 0}
        | {"version": "", "description": ""},
    ]
    info = json.loads(ask(core, b"mmi.info", b"a")[0])
    assert info["metadata"] == {"k": "v"} and info["versions"] == ["1.0.0"]
    assert info["request_schema"] is None
    assert ask(core, b"mmi.info", b"zzz") == (b"404",)
    assert ask(core, b"mmi.stats", b"zzz") == (b"404",)
    assert ask(core, b"mmi.service", b"a") == (b"200",)
    assert ask(core, b"mmi.other") == (b"501",)

    # Rule D5: timing from dispatch to answer; errors; the queue's oldest request's age.
    feed(core, C1, Request(b"a", None, (b"m1",), (b"x",)), now=10.0)
    take(core)  # dispatched to W1 at t=10
    feed(core, W1, Reply(C1, (b"m1",), error_reply_data("handler_error", "x")), now=10.5)
    take(core)
    feed(core, C1, Request(b"b", None, (b"m2",), (b"x",)), now=11.0)
    feed(core, C1, Request(b"a", None, (b"m3",), (b"x",)), now=11.0)
    take(core)  # W1 holds m2 (b) and has no credit: m3 waits
    stats = json.loads(ask(core, b"mmi.stats", b"a", now=13.0)[0])
    assert stats["num_requests"] == 2 and stats["num_errors"] == 1
    assert stats["processing_time"] == 500_000_000
    assert stats["average_processing_time"] == 500_000_000
    assert stats["queued"] == 1 and stats["oldest_queued_age"] == 2.0
    assert stats["busy"] == 1 and stats["idle"] == 0
    every = json.loads(ask(core, b"mmi.stats", now=13.0)[0])
    assert [s["name"] for s in every] == ["a", "b"]

    # Rule D4: a worker that leaves takes its info with it.
    feed(core, W1, Reconnect())
    take(core)
    assert json.loads(ask(core, b"mmi.info", b"a")[0])["version"] == ""


def test_describe_rules() -> None:
    core = BrokerCore()
    bad: list[Any] = [
        b"\xff",
        [],
        {"version": "1"},
        {"version": 1},
        {"description": 2},
        {"metadata": {"k": 1}},
        {"request_schema": 3},
        b"{" + b" " * directory.MAX_INFO + b"}",
    ]
    for info in bad:
        assert describe(core, W1, b"a", info) == b"400"
    assert core.counters.rejections["bad_service_info"] == len(bad)
    feed(core, W1, Request(directory.DESCRIBE, None, (DESCRIBE_TAG,), (b"a",)))
    take(core)
    # Registered already: a description replaces the info at once.
    feed(core, W1, Register(b"a"))
    feed(core, W2, Register(b"a"))
    take(core)
    assert describe(core, W1, b"a", {"version": "1.0.0", "ignored": 1}) == b"200"
    assert describe(core, W2, b"a", {"version": "2.0.0-rc.1+b5"}) == b"200"
    info = json.loads(ask(core, b"mmi.info", b"a")[0])
    assert info["version"] == "2.0.0-rc.1+b5"
    assert info["versions"] == ["1.0.0", "2.0.0-rc.1+b5"]
    feed(core, W2, Reconnect())
    take(core)
    assert json.loads(ask(core, b"mmi.info", b"a")[0])["version"] == "1.0.0"


def test_waiting_descriptions_are_bounded() -> None:
    d = directory.Directory(max_waiting=2)
    for n in range(3):
        d.describe(b"p", b"s%d" % n, {"version": "1.0.0"}, registered=False)
    assert d.waiting_info(b"p", b"s0") is None
    assert d.waiting_info(b"p", b"s2") == {"version": "1.0.0"}
    d.registered(b"p", b"s2")
    assert d.info(b"s2") == {"version": "1.0.0"}
    d.registered(b"p", b"nothing")
    assert d.info(b"nothing") is None
    d.forget(b"other", [b"s2"])
    assert d.info(b"s2") is not None


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=64))
def test_any_describe_bytes_are_answered(raw: bytes) -> None:
    core = BrokerCore()
    assert describe(core, W1, b"a", raw) in (b"200", b"400")


# ------------------------------------------------------------------------------ approval


def test_approval_rules() -> None:
    core = BrokerCore(approve=True)
    describe(core, W1, b"a", INFO)
    feed(core, W1, Register(b"a"))
    assert take(core) == []  # Rule AP1: waits, unconfirmed
    assert core.approvals is not None
    (question,) = take_events(core, ApprovalRequest)  # the driver's question
    assert question.service == b"a" and question.info == INFO and question.routing_id == W1
    feed(core, W1, Register(b"a"))  # a repeat asks nothing more
    assert take_events(core, ApprovalRequest) == [] and len(core.approvals) == 1
    core.decide(question.token, Approval(True), now=1.0)
    assert take(core) == [[W1, *serialize(Register(b"a"))]]
    core.decide(question.token, Approval(False, "late"), now=1.0)  # Rule AP3: not pending
    assert take(core) == []
    feed(core, W1, Register(b"a"))  # provides it already: not asked again
    assert take(core) == [[W1, *serialize(Register(b"a"))]]
    assert take_events(core, ApprovalRequest) == []

    # Denied: told why, in the worker's dialect.
    feed(core, W2, Register(b"b"))
    (question,) = take_events(core, ApprovalRequest)
    core.decide(question.token, Approval.deny("no b here"), now=2.0)
    (frames,) = take(core)
    msg, _ = parse(frames[1:])
    assert isinstance(msg, Reply) and msg.client is None and msg.metadata == (b"b",)
    assert parse_error_reply(msg.data) == ("registration_refused", "no b here")
    assert core.counters.rejections["registration_refused"] == 1

    # An MDP worker denied gets DISCONNECT.
    ready = mdp.peer(mdp.Form.V02, worker=True, envelope=False)
    core.receive([b"M1", mdp.W02, b"\x01", b"m"], 3.0)
    (question,) = take_events(core, ApprovalRequest)
    core.decide(question.token, Approval(False), now=3.0)
    assert take(core) == [[b"M1", *ready.worker_disconnect()]]


def test_too_many_waiting_are_refused() -> None:
    core = BrokerCore(approve=True)
    assert core.approvals is not None
    core.approvals.max_pending = 1
    feed(core, W1, Register(b"a"))
    feed(core, W2, Register(b"a"))
    (frames,) = take(core)
    msg, _ = parse(frames[1:])
    assert isinstance(msg, Reply)
    assert parse_error_reply(msg.data) == (
        "registration_refused",
        "too many registrations await approval",
    )


def test_to_approval() -> None:
    assert to_approval(True) == Approval(True, "")
    assert to_approval(False).reason
    assert to_approval((False, "why")) == Approval(False, "why")
    assert to_approval(Approval.deny("x")) == Approval(False, "x")
    for bad in ("yes", None, (1, "x"), (True,)):
        with pytest.raises(TypeError, match="approver must return"):
            to_approval(bad)
    asked: list[ApprovalRequest] = []
    approvals = Approvals(asked.append)
    assert approvals.take(99) is None
    assert approvals.ask(W1, b"a", DCP1, None, None)
    assert [q.service for q in asked] == [b"a"]


# ------------------------------------------------------------------- worker core Rule W14


def test_worker_core_several_services() -> None:
    core = WorkerCore(b"a", more_services=(b"b",), infos={b"b": b'{"version":"1.0.0"}'})
    core.connect(0.0)
    assert take_worker(core) == [
        Request(b"mmi.describe", None, (DESCRIBE_TAG,), (b"b", b'{"version":"1.0.0"}')),
        Register(b"a"),
        Register(b"b"),
    ]
    core.receive(serialize(Reply(b"me", (DESCRIBE_TAG,), (b"200",))), 0.1)
    core.receive(serialize(Register(b"a")), 0.1)
    assert core.state is State.REGISTERING  # Rule W14: "b" not echoed yet
    core.receive(serialize(Register(b"b")), 0.1)
    assert cast("State", core.state) is State.READY
    assert take_worker(core) == [Pong()]
    assert core.statistics().unexpected == 0
    # A broker RECONNECT: everything again.
    core.receive(serialize(Reconnect()), 0.2)
    assert take_worker(core)[1:] == [Register(b"a"), Register(b"b")]
    core.receive(serialize(Ping()), 0.2)
    # A refusal of either closes the core, naming the service.
    refusal = Reply(None, (b"b",), error_reply_data("registration_refused", "no"))
    core.receive(serialize(refusal), 0.3)
    refused = take_worker(core)
    assert refused == [Refused("no")]
    assert isinstance(refused[0], Refused) and refused[0].service == b"b"
    assert cast("State", core.state) is State.CLOSED


def test_mdp_clients_get_discovery_answers_too() -> None:
    core = BrokerCore()
    feed(core, W1, Register(b"a"))
    take(core)
    core.receive([b"M", b"", mdp.C01, b"mmi.services"], 0.0)
    (frames,) = take(core)
    assert frames[:4] == [b"M", b"", mdp.C01, b"mmi.services"]
    assert [e["name"] for e in json.loads(frames[4])] == ["a"]
    core.receive([b"M", b"", mdp.C01, b"mmi.stats", b"a"], 0.0)
    (frames,) = take(core)
    assert json.loads(frames[4])["workers"] == 1
