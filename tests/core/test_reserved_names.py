"""Reserved names (admission Rule AD4): ``mmi.*``, ``\\xffDCP*`` and every dialect's command
words are never services, in any dialect, with or without CURVE; a request to one never
reaches a worker. The pure core, with real frames."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from dcp._core.broker.admission import RESERVED_NAMES, is_reserved
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.guard import Guard
from dcp.wire import dbp, mc0, mdp
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import Register, Reply, Request, parse_error_reply

KEY = "k" * 40
#: Names a DCP or Majordomo worker can send (any bytes).
NAMES = [
    b"mmi.service",
    b"\xffDCP:sub",
    b"\xffDCP:pub",
    b"\xffDCP:anything",
    b"\xffDCP-ERROR",
    dbp.REGISTER,
    dbp.REQUEST,
    b"CONNECT",
    b"SUB",
    mdp.W01,
    mdp.C02,
]
V01W = mdp.peer(mdp.Form.V01, envelope=True, worker=True)
V02W = mdp.peer(mdp.Form.V02, envelope=False, worker=True)
MTW = mdp.peer(mdp.Form.V02, envelope=True, worker=True)  # majortomo's Worker
V02C = mdp.peer(mdp.Form.V02, envelope=False, worker=False)


def make_core(secure: bool) -> tuple[BrokerCore, Callable[[bytes, list[bytes]], None]]:
    # The guard lets every key register anything: only Rule AD4 refuses.
    core = BrokerCore(guard=Guard(lambda key, service: True, b"s" * 32) if secure else None)

    def feed(peer: bytes, frames: list[bytes]) -> None:
        core.receive([peer, *frames], 0.0, KEY if secure else None)

    return core, feed


def registrations(name: bytes) -> list[tuple[str, list[bytes]]]:
    """A registration of ``name`` in every dialect that can carry it."""
    regs = [
        ("DCP/1", serialize(Register(name))),
        ("DCP/4", serialize(Register(name), width=4)),
        ("MDP/0.1", V01W.worker_ready(name)),
        ("MDP/0.2", V02W.worker_ready(name)),
        ("majortomo", MTW.worker_ready(name)),
    ]
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return regs  # DBP names are JSON text: \xff cannot be one
    return [*regs, ("DBP", [b"", dbp.REGISTER, b"1.0", json.dumps({"name": text}).encode()])]


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
@pytest.mark.parametrize("name", NAMES, ids=repr)
def test_reserved_names_cannot_be_registered_in_any_dialect(name: bytes, secure: bool) -> None:
    core, feed = make_core(secure)
    regs = registrations(name)
    for i, (_, frames) in enumerate(regs):
        feed(b"W%d" % i, frames)
    stats = core.statistics()
    assert stats.workers == 0, [d for d, _ in regs]
    assert name not in stats.services
    assert stats.rejections == {"reserved_service": len(regs)}
    # Each worker was told in its dialect: DCP a registration_refused reply, MDP DISCONNECT,
    # DBP denied.
    told = {bytes(m[0]): m[1:] for m in core.drain()[0]}
    assert len(told) == len(regs)
    for i, (dialect, _) in enumerate(regs):
        answer = told[b"W%d" % i]
        if dialect.startswith("DCP"):
            msg, _ = parse(answer)
            assert isinstance(msg, Reply) and msg.client is None
            error = parse_error_reply(msg.data)
            assert error is not None and error[0] == "registration_refused"
        elif dialect == "DBP":
            assert dbp.is_denied(answer[1])
        else:
            assert mdp.W01 in answer[:2] or mdp.W02 in answer[:2], (dialect, answer)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
def test_a_request_to_a_reserved_name_never_reaches_a_worker(secure: bool) -> None:
    core, feed = make_core(secure)
    feed(b"W", V02W.worker_ready(b"echo"))  # a worker that would take anything it is given
    for name in (b"\xffDCP:sub", b"\xffDCP:x", b"CONNECT", dbp.REQUEST, mdp.C01):
        feed(b"M", V02C.client_request(name, [b"x"]))  # Majordomo: told nothing (Rule M1)
    feed(b"D", serialize(Request(b"UwU", None, (b"rid",), (b"x",))))
    sent = core.drain()[0]
    assert [m[0] for m in sent] == [b"D"]  # the DCP client's error reply; W got nothing
    msg, _ = parse(sent[0][1:])
    assert isinstance(msg, Reply)
    error = parse_error_reply(msg.data)
    assert error is not None and error[0] == "reserved_service"
    stats = core.statistics()
    assert set(stats.services) == {b"echo"} and stats.requests == 0
    assert stats.rejections == {"reserved_service": 6}


def test_the_reserved_names() -> None:
    assert {*dbp.COMMANDS, *mc0.VERBS, mdp.C01, mdp.W01, mdp.C02, mdp.W02} <= RESERVED_NAMES
    for name in (b"mmi.", b"mmi.x", b"\xffDCP", b"\xffDCP:sub", b"UwU", b"NOOP"):
        assert is_reserved(name), name
    for name in (b"echo", b"mmi", b"connect", b"\xffDC", b"UwU2", b"", b"REQS"):
        assert not is_reserved(name), name
