"""Security, piece by piece: keys and key files, the guard (S1-S4), ZAP answers (and the
ZAP task on inproc), and the broker and worker cores with a guard (explicit ``now``, frames
in, frames out).

The live tests (real CURVE over tcp, both backends) are in ``test_security.py``.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import anyio
import pytest
import zmq
import zmq.auth
from zmq.utils import z85

from dcp import CurveClient, CurveServer
from dcp._broker.oplog import write_log
from dcp._broker.zap import ZapHandler
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.guard import Guard
from dcp._core.broker.outputs import LogLine
from dcp._core.worker.core import Refused, State, WorkerCore
from dcp._io.security import ANY, load_public_keys, write_key_pair, z85_key
from dcp.wire import PROTOCOL, Ping, Register, Reply, Request, serialize
from dcp.wire.messages import error_reply_data, parse_error_reply
from tests.helpers import ECHO, out, take, take_events, take_worker, wait_for

BROKER = zmq.curve_keypair()
ALICE = zmq.curve_keypair()
BOB = zmq.curve_keypair()
WORKER = zmq.curve_keypair()


# -- keys -------------------------------------------------------------------------------


def test_keys_are_z85_bytes_whatever_form_they_come_in() -> None:
    public = ALICE[0]
    assert z85_key(public) == public
    assert z85_key(public.decode()) == public
    assert z85_key(z85.decode(public)) == public
    bad_keys: list[str | bytes] = [b"", b"x" * 39, b"~" * 40, b"\x00" * 40, "é" * 40, b"#" * 40]
    for bad in bad_keys:
        with pytest.raises(ValueError, match="CURVE key"):
            z85_key(bad)


def test_a_key_pair_must_match_and_the_secret_is_not_shown() -> None:
    client = CurveClient(BROKER[0], ALICE[0], ALICE[1])
    assert ALICE[1].decode() not in repr(client)
    assert ALICE[0].decode() in repr(client)
    with pytest.raises(ValueError, match="does not belong"):
        CurveClient(BROKER[0], ALICE[0], BOB[1])
    server = CurveServer(BROKER[0], BROKER[1])
    assert BROKER[1].decode() not in repr(server)
    with pytest.raises(ValueError, match="does not belong"):
        CurveServer(BROKER[0], ALICE[1])
    with pytest.raises(TypeError, match="collection of keys"):
        CurveServer(BROKER[0], BROKER[1], clients=ALICE[0])  # type: ignore[arg-type]


def test_allow_lists() -> None:
    server = CurveServer(
        BROKER[0],
        BROKER[1],
        clients=[ALICE[0]],
        workers={"echo": [WORKER[0]], b"upper": ["*"], "*": [BOB[0].decode()]},
    )
    assert server.may_connect(ALICE[0])
    assert server.may_connect(WORKER[0])  # workers connect too
    assert server.may_connect(BOB[0])
    assert not server.may_connect(BROKER[0])
    assert server.may_register(WORKER[0], ECHO)
    assert not server.may_register(WORKER[0], b"other")
    assert not server.may_register(ALICE[0], ECHO)
    assert server.may_register(ALICE[0], b"upper")  # any connected key
    assert server.may_register(BOB[0], b"anything")  # any service
    assert not server.may_register(None, b"upper")
    anyone = CurveServer(BROKER[0], BROKER[1], clients=None)
    assert anyone.may_connect(ALICE[0])
    assert not anyone.may_register(ALICE[0], ECHO)
    nobody = CurveServer(BROKER[0], BROKER[1])
    assert not nobody.may_connect(ALICE[0])


def test_key_files_are_zpl_certificates_and_the_secret_one_is_private(tmp_path: Path) -> None:
    public_path, secret_path = write_key_pair(tmp_path, "alice")
    assert (public_path.name, secret_path.name) == ("alice.key", "alice.key_secret")
    assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(public_path).st_mode) == 0o644
    # pyzmq (and czmq, same format) read them.
    public, secret = zmq.auth.load_certificate(secret_path)
    assert secret is not None and zmq.curve_public(secret) == public
    assert zmq.auth.load_certificate(public_path) == (public, None)
    with pytest.raises(FileExistsError, match="--force"):
        write_key_pair(tmp_path, "alice")
    os.chmod(secret_path, 0o644)
    write_key_pair(tmp_path, "alice", overwrite=True)
    assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
    assert zmq.auth.load_certificate(public_path)[0] != public  # a new pair
    for bad in ["", ".", "..", "a/b"]:
        with pytest.raises(ValueError, match="plain file name"):
            write_key_pair(tmp_path, bad)


def test_loading_keys_from_files_and_directories(tmp_path: Path) -> None:
    clients = tmp_path / "clients"
    workers = tmp_path / "workers"
    clients.mkdir()
    workers.mkdir()
    broker_public, broker_secret = write_key_pair(tmp_path, "broker")
    a, a_secret = write_key_pair(clients, "a")
    b, _ = write_key_pair(clients, "b")
    w, _w_secret = write_key_pair(workers, "w")
    keys = {name: zmq.auth.load_certificate(path)[0] for name, path in [("a", a), ("b", b)]}
    assert load_public_keys(clients) == frozenset(keys.values())  # *.key only
    server = CurveServer.from_files(
        broker_secret, clients=[clients], workers={"echo": [w], "*": ["*"]}
    )
    assert server.clients == frozenset(keys.values())
    w_key = zmq.auth.load_certificate(w)[0]
    assert server.workers == {ECHO: frozenset([w_key]), ANY: frozenset([ANY])}
    assert CurveServer.from_files(broker_secret, clients=None).clients is None
    client = CurveClient.from_files(a_secret, server=broker_public)
    assert client.server_key == zmq.auth.load_certificate(broker_public)[0]
    assert client.public_key == keys["a"]
    with pytest.raises(ValueError, match="no secret key"):
        CurveClient.from_files(a, server=broker_public)
    with pytest.raises(OSError):
        CurveServer.from_files(tmp_path / "missing.key_secret")
    bad = tmp_path / "bad.key"
    bad.write_text('curve\n    public-key = "not a key"\n')
    with pytest.raises(ValueError, match="CURVE key"):
        load_public_keys(bad)


# -- the guard --------------------------------------------------------------------------


def make_guard(max_bound: int = 65_536) -> Guard:
    server = CurveServer(BROKER[0], BROKER[1], workers={"echo": [WORKER[0]], "next": [WORKER[0]]})
    return Guard(server.may_register, b"k" * 32, max_bound=max_bound)


def test_guard_admits_authenticated_explicit_ids_and_binds_them_to_keys() -> None:
    guard = make_guard(max_bound=2)
    alice, bob = ALICE[0].decode(), BOB[0].decode()
    assert guard.admit(b"A", None) == "unauthenticated"
    # A zmq-generated id (first byte 0x00) is bound to its key like any other (Rule S2).
    assert guard.admit(b"\x00\x01\x02\x03\x04", alice) is None
    assert guard.admit(b"\x00\x01\x02\x03\x04", bob) == "routing_id_taken"
    assert guard.admit(b"A", alice) is None
    assert guard.admit(b"A", alice) is None
    assert guard.admit(b"A", bob) == "routing_id_taken"
    assert guard.owner(b"A") == alice
    # Bounded, least recently used out.
    assert guard.admit(b"B", bob) is None
    assert guard.admit(b"A", alice) is None  # refreshes A
    assert guard.admit(b"C", bob) is None  # evicts B
    assert guard.owner(b"B") is None
    assert guard.owner(b"A") == alice
    with pytest.raises(ValueError, match="32 bytes"):
        Guard(lambda key, service: True, b"short")


@pytest.mark.parametrize("size", [1, 16, 63, 64, 65, 200, 255])
def test_sealed_addresses_round_trip_and_reveal_nothing(size: int) -> None:
    guard = make_guard()
    address = bytes(range(1, size + 1))
    sealed = guard.seal(address)
    assert len(sealed) == 16 + size
    assert address not in sealed
    assert guard.seal(address) == sealed  # deterministic
    assert guard.unseal(sealed) == address
    # Every single-bit change is detected.
    for i in range(len(sealed)):
        tampered = bytearray(sealed)
        tampered[i] ^= 0x01
        assert guard.unseal(bytes(tampered)) is None
    # Another broker's seal (another key) is not accepted.
    other = Guard(lambda key, service: True, b"o" * 32)
    assert other.unseal(sealed) is None


@pytest.mark.parametrize("cache", [0, 1, 4096])
def test_the_seal_cache_changes_nothing_but_speed(cache: int) -> None:
    guard = Guard(lambda key, service: True, b"k" * 32, cache=cache)
    uncached = Guard(lambda key, service: True, b"k" * 32, cache=0)
    addresses = [b"\x01a", b"\x01b", b"\x01a", b"\x01c" * 30]
    sealed = [guard.seal(a) for a in addresses]
    assert sealed == [uncached.seal(a) for a in addresses]
    assert [guard.unseal(s) for s in sealed] == addresses
    assert [uncached.unseal(s) for s in sealed] == addresses
    assert guard.cached() == (min(cache, 3), min(cache, 3))


def test_unseal_refuses_what_is_not_a_sealed_address() -> None:
    guard = make_guard()
    for junk in [b"", b"x", b"x" * 16, b"x" * 17, os.urandom(40)]:
        assert guard.unseal(junk) is None


# -- ZAP answers ------------------------------------------------------------------------


def zap_request(mechanism: bytes, *credentials: bytes, version: bytes = b"1.0") -> list[bytes]:
    return [b"zid", b"", version, b"7", b"dcp", b"127.0.0.1", b"", mechanism, *credentials]


def test_zap_answers(caplog: pytest.LogCaptureFixture) -> None:
    handler = ZapHandler(zmq.Context.instance(), lambda key: key == ALICE[0])
    raw_alice = z85.decode(ALICE[0])
    with caplog.at_level(logging.WARNING, logger="dcp.broker"):
        ok = handler.answer(zap_request(b"CURVE", raw_alice))
        assert ok == [b"zid", b"", b"1.0", b"7", b"200", b"OK", ALICE[0], b""]
        denied = handler.answer(zap_request(b"CURVE", z85.decode(BOB[0])))
        assert denied is not None and denied[4:] == [b"400", b"Unknown key", b"", b""]
        handler.answer(zap_request(b"CURVE", z85.decode(BOB[0])))  # logged once per key
        for request in [
            zap_request(b"PLAIN", b"user", b"password"),
            zap_request(b"NULL"),
            zap_request(b"CURVE", b"short"),
            zap_request(b"CURVE", raw_alice, raw_alice),
        ]:
            answer = handler.answer(request)
            assert answer is not None and answer[4] == b"400"
        # Malformed: 500 if the envelope is there, else nothing.
        for request, dropped in [
            (zap_request(b"CURVE", raw_alice, version=b"2.0"), 0),
            (zap_request(b"CURVE", raw_alice), 3),
            ([b"zid", b"", b"1.0", b"8"], 0),
        ]:
            answer = handler.answer(request, dropped)
            assert answer is not None
            assert answer[:4] == [b"zid", b"", b"1.0", request[3]]
            assert answer[4] == b"500"
        assert handler.answer([b"zid", b"1.0", b"7"]) is None
        assert handler.answer([b"zid"]) is None
    assert (handler.allowed, handler.denied, handler.malformed) == (1, 6, 5)
    denials = [
        r
        for r in caplog.records
        if "Unknown key" in r.getMessage() or "unknown key" in r.getMessage()
    ]
    assert len(denials) == 1
    assert BOB[0].decode() in denials[0].getMessage()
    assert sum("malformed" in r.getMessage() for r in caplog.records) == 1


# -- the broker core with a guard -------------------------------------------------------

W, C, X = b"W", b"C", b"X"
WKEY, CKEY, XKEY = WORKER[0].decode(), ALICE[0].decode(), BOB[0].decode()


def secure_core() -> BrokerCore:
    return BrokerCore(guard=make_guard())


def test_core_refuses_a_registration_without_permission_and_tells_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = secure_core()
    with caplog.at_level(logging.WARNING, logger="dcp.broker"):
        core.receive(out(X, Register(ECHO)), 0.0, XKEY)
        write_log(take_events(core, LogLine))  # what the driver does (the core does no I/O)
    [refusal] = take(core)
    assert refusal[:5] == [X, b"", PROTOCOL, b"\x05", b""]
    assert refusal[5:7] == [ECHO, b""]
    error = parse_error_reply(refusal[7:])
    assert error is not None and error[0] == "registration_refused"
    assert XKEY in error[1] and "echo" in error[1]
    stats = core.statistics()
    assert stats.rejections == {"registration_refused": 1}
    assert stats.workers == 0
    assert "registration_refused" in caplog.text
    # In the 4-byte width, and with an empty service name (no metadata part).
    core.receive(out(X, Register(b""), width=4), 0.0, XKEY)
    [refusal] = take(core)
    assert refusal == [X, b"", PROTOCOL, b"\x05\0\0\0", b"", b"", *refusal[6:]]
    assert parse_error_reply(refusal[6:]) is not None
    # The permitted key registers as usual.
    core.receive(out(W, Register(ECHO)), 0.0, WKEY)
    assert take(core) == [out(W, Register(ECHO))]


def test_core_drops_messages_the_guard_does_not_admit() -> None:
    core = secure_core()
    core.receive(out(C, Request(ECHO, None, (b"m",), (b"d",))), 0.0, None)
    core.receive(out(C, Request(ECHO, None, (b"m",), (b"d",))), 0.0, CKEY)
    core.receive(out(C, Request(ECHO, None, (b"m2",), (b"d",))), 0.0, XKEY)
    core.receive(out(C, Ping()), 0.0, XKEY)
    assert take(core) == []
    stats = core.statistics()
    assert stats.requests == 1
    assert stats.services[ECHO].queued == 1
    assert stats.rejections == {
        "unauthenticated": 1,
        "routing_id_taken": 2,
    }


def registered_core() -> BrokerCore:
    core = secure_core()
    core.receive(out(W, Register(ECHO)), 0.0, WKEY)
    take(core)
    return core


def test_workers_see_sealed_client_addresses_and_answer_through_them() -> None:
    core = registered_core()
    guard = core.guard
    assert guard is not None
    core.receive(out(C, Request(ECHO, None, (b"m",), (b"d",))), 0.0, CKEY)
    [dispatched] = take(core)
    sealed = dispatched[5]
    assert sealed != C and guard.unseal(sealed) == C
    assert dispatched == out(W, Request(ECHO, sealed, (b"m",), (b"d",)))
    # A reply naming the raw address (or anything else not sealed) goes nowhere.
    core.receive(out(W, Reply(C, (b"m",), (b"forged",))), 0.0, WKEY)
    assert take(core) == []
    assert core.statistics().rejections == {"bad_client_address": 1}
    # The sealed one reaches the client, with its own address in the frame.
    core.receive(out(W, Reply(sealed, (b"m",), (b"r",))), 0.0, WKEY)
    assert take(core) == [out(C, Reply(C, (b"m",), (b"r",)))]
    stats = core.statistics()
    assert (stats.replies, stats.unmatched) == (1, 0)


def test_forwards_carry_sealed_addresses_too() -> None:
    core = registered_core()
    core.receive(out(b"W2", Register(b"next")), 0.0, WKEY)
    assert take(core) == [out(b"W2", Register(b"next"))]
    core.receive(out(C, Request(ECHO, None, (b"m",), (b"d",))), 0.0, CKEY)
    [dispatched] = take(core)
    sealed = dispatched[5]
    # A forward naming an address that is not sealed is dropped (the worker keeps credit).
    core.receive(out(W, Request(b"next", C, (b"m",), (b"d2",))), 0.0, WKEY)
    assert take(core) == []
    assert core.statistics().rejections["bad_client_address"] == 1
    core.receive(out(W, Request(b"next", sealed, (b"m",), (b"d2",))), 0.0, WKEY)
    assert take(core) == [out(b"W2", Request(b"next", sealed, (b"m",), (b"d2",)))]
    assert core.statistics().forwards == 1
    core.receive(out(b"W2", Reply(sealed, (b"m",), (b"done",))), 0.0, WKEY)
    assert take(core) == [out(C, Reply(C, (b"m",), (b"done",)))]


def test_cut_messages_go_through_the_guard_and_cut_forwards_are_unsealed() -> None:
    core = registered_core()
    core.receive(out(C, Request(ECHO, None, (b"m",), (b"d",))), 0.0, CKEY)
    [dispatched] = take(core)
    sealed = dispatched[5]
    # Not admitted: nothing is answered.
    core.reject_too_many_frames(out(C, Request(ECHO, None, (b"m",), ())), 9, 0.0, None)
    assert take(core) == []
    # A cut forward with a forged address: refused, the held request stays held.
    forged = out(W, Request(b"next", C, (b"m",), ()))
    core.reject_too_large(forged, 1 << 30, 1024, 0.0, WKEY)
    assert take(core) == []
    # With the sealed address: the original client is told, with its own address.
    cut = out(W, Request(b"next", sealed, (b"m",), ()))
    core.reject_too_large(cut, 1 << 30, 1024, 0.0, WKEY)
    [refusal] = take(core)
    assert refusal[:6] == [C, b"", PROTOCOL, b"\x05", C, b""]
    assert parse_error_reply(refusal[8:]) is not None
    assert core.statistics().rejections == {
        "unauthenticated": 1,
        "bad_client_address": 1,
        "message_too_large": 1,
    }
    assert core.statistics().clients == 0


def test_without_a_guard_principals_are_ignored() -> None:
    core = BrokerCore()
    core.receive(out(W, Register(ECHO)), 0.0, None)
    core.receive(out(C, Request(ECHO, None, (b"m",), (b"d",))), 0.0, "whoever")
    assert take(core)[-1] == out(W, Request(ECHO, C, (b"m",), (b"d",)))


# -- the worker core --------------------------------------------------------------------


def refusal(service: bytes, code: str = "registration_refused") -> list[bytes]:
    metadata = (service,) if service else ()
    return serialize(Reply(None, metadata, error_reply_data(code, "not you")))


@pytest.mark.parametrize("service", [ECHO, b""])
def test_worker_core_stops_on_a_refused_registration(service: bytes) -> None:
    core = WorkerCore(service)
    core.connect(0.0)
    take_worker(core)  # the REGISTER
    core.receive(refusal(service), 0.1)
    assert take_worker(core) == [Refused("not you")]
    assert core.state is State.CLOSED
    core.expire(100.0)
    assert take_worker(core) == []


def test_worker_core_ignores_other_replies() -> None:
    core = WorkerCore(ECHO)
    core.connect(0.0)
    take_worker(core)  # the REGISTER
    core.receive(refusal(b"other"), 0.1)
    assert take_worker(core) == []
    core.receive(refusal(ECHO, "queue_full"), 0.1)
    assert take_worker(core) == []
    core.receive(serialize(Reply(None, (ECHO,), (b"hello",))), 0.1)
    assert take_worker(core) == []
    core.receive(serialize(Reply(b"C", (ECHO,), error_reply_data("x", "y"))), 0.1)
    assert take_worker(core) == []
    assert core.statistics().unexpected == 4
    assert core.state is State.REGISTERING


def test_zap_denials_are_logged_once_per_key_within_a_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = ZapHandler(zmq.Context.instance(), lambda key: False)
    handler._log_once.size = 1  # the driver's ZapHandler has no public knob for it
    alice, bob = z85.decode(ALICE[0]), z85.decode(BOB[0])
    with caplog.at_level(logging.WARNING, logger="dcp.broker"):
        for raw in [alice, alice, bob, alice]:
            handler.answer(zap_request(b"CURVE", raw))
    assert len(caplog.records) == 3  # alice, bob (alice forgotten), alice again
    assert handler.denied == 4


@pytest.mark.anyio
async def test_zap_handler_task_drains_in_batches_and_stops_on_close() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    handler = ZapHandler(ctx, lambda key: True)
    handler.close()  # before bind: nothing to close
    handler.bind()
    client: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect("inproc://zeromq.zap.01")
    try:
        raw = z85.decode(ALICE[0])
        for i in range(150):  # more than one batch
            client.send_multipart(
                zap_request(b"CURVE", raw)[1:3] + [b"%d" % i] + [b""] * 3 + [b"CURVE", raw]
            )
        async with anyio.create_task_group() as tg:
            await tg.start(handler.serve)
            await wait_for(lambda: handler.allowed == 150)
            handler.close()  # the task ends by itself
        assert client.recv_multipart()[3] == b"200"
    finally:
        client.close(0)
        ctx.term()


def test_async_socket_reads_user_ids_only_when_asked() -> None:
    from dcp._io.sockets import AsyncSocket

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    server: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
    sender: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    try:
        server.bind("inproc://uid")
        sender.connect("inproc://uid")
        sender.send(b"x")
        sender.send(b"y")
        asocket = AsyncSocket(server, user_ids=True)
        assert server.poll(5000)
        received = asocket.drain(1) + AsyncSocket(server).drain(1)
        # inproc has no handshake, hence no user id.
        assert [(r.frames[1:], r.user_id) for r in received] == [([b"x"], None), ([b"y"], None)]
    finally:
        sender.close(0)
        server.close(0)
        ctx.term()
