"""The broker core with Majordomo peers, in memory (sans-IO): Rules M1-M5 of
:mod:`dcp._core.broker.majordomo`, MMI (:mod:`dcp._core.broker.directory`), cross-protocol calls
and the liveness of busy workers that never beat (peers Rule L3). Time goes by the ``now``
argument."""

from __future__ import annotations

import pytest

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.guard import Guard
from dcp.wire import mdp, streams
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import Register, Reply, Request, parse_error_reply
from dcp.wire.options import work_timeout_option
from dcp.wire.streams import StreamType
from tests.helpers import feed, take

ECHO = b"echo"
V01C = mdp.peer(mdp.Form.V01, envelope=True, worker=False)
V01W = mdp.peer(mdp.Form.V01, envelope=True, worker=True)
V02C = mdp.peer(mdp.Form.V02, envelope=False, worker=False)
V02W = mdp.peer(mdp.Form.V02, envelope=False, worker=True)
MTC = mdp.peer(mdp.Form.MAJORTOMO, envelope=True, worker=False)
MTW = mdp.peer(mdp.Form.V02, envelope=True, worker=True)  # majortomo's Worker


def mdp_worker(core: BrokerCore, ident: bytes, form: mdp.MdpPeer, service: bytes = ECHO) -> None:
    feed(core, ident, form.worker_ready(service))
    assert take(core) == []  # MDP confirms nothing
    assert core.statistics().services[service].workers >= 1


@pytest.mark.parametrize(("client", "worker"), [(V01C, V01W), (V02C, V02W), (MTC, MTW)])
def test_mdp_client_to_mdp_worker_in_each_form(client: mdp.MdpPeer, worker: mdp.MdpPeer) -> None:
    core = BrokerCore()
    mdp_worker(core, b"W", worker)
    feed(core, b"C", client.client_request(ECHO, [b"hi", b""]))
    assert take(core) == [[b"W", *worker.worker_request(b"C", [b"hi", b""])]]
    feed(core, b"W", worker.worker_answer(b"C", [b"HI"], final=True))
    assert take(core) == [[b"C", *client.client_answer(ECHO, [b"HI"], final=True)]]
    stats = core.statistics()
    assert (stats.requests, stats.replies, stats.unmatched, stats.rejections) == (1, 1, 0, {})
    assert stats.services[ECHO].idle == 1  # FINAL frees the worker (one request at a time)


def test_partials_reach_a_streaming_client_in_order_then_final() -> None:
    core = BrokerCore()
    mdp_worker(core, b"W", V02W)
    feed(core, b"C", V02C.client_request(ECHO, [b"q"]))
    take(core)
    for i in range(3):
        feed(core, b"W", V02W.worker_answer(b"C", [b"part%d" % i], final=False))
    feed(core, b"W", V02W.worker_answer(b"C", [b"end"], final=True))
    assert take(core) == [
        [b"C", *V02C.client_answer(ECHO, [b"part0"], final=False)],
        [b"C", *V02C.client_answer(ECHO, [b"part1"], final=False)],
        [b"C", *V02C.client_answer(ECHO, [b"part2"], final=False)],
        [b"C", *V02C.client_answer(ECHO, [b"end"], final=True)],
    ]
    assert (core.statistics().partials, core.statistics().replies) == (3, 1)


def test_partials_to_a_dcp_or_mdp01_client_are_dropped_and_counted() -> None:
    core = BrokerCore()
    mdp_worker(core, b"W", V02W)
    feed(core, b"D", serialize(Request(ECHO, None, (b"id",), (b"q",))))
    feed(core, b"M", V01C.client_request(ECHO, [b"q"]))
    take(core)
    feed(core, b"W", V02W.worker_answer(b"D", [b"p"], final=False))
    assert take(core) == []
    assert core.statistics().rejections == {"partial_dropped": 1}


def test_dcp_client_served_by_mdp_worker_gets_its_metadata_back() -> None:
    core = BrokerCore()
    mdp_worker(core, b"W", V01W)
    feed(core, b"D", serialize(Request(ECHO, None, (b"rid-1", b"m2"), (b"x", b"y")), width=4))
    # MDP has no metadata: the worker gets the body only; the broker keeps the metadata.
    assert take(core) == [[b"W", *V01W.worker_request(b"D", [b"x", b"y"])]]
    feed(core, b"W", V01W.worker_answer(b"D", [b"XY"], final=True))
    [reply] = take(core)
    assert reply == [b"D", *serialize(Reply(b"D", (b"rid-1", b"m2"), (b"XY",)), width=4)]


def test_mdp_client_served_by_dcp_worker_gets_a_final() -> None:
    core = BrokerCore()
    feed(core, b"W", serialize(Register(ECHO)))
    take(core)
    feed(core, b"M", MTC.client_request(ECHO, [b"x"]))
    [given] = take(core)
    msg, _ = parse(given[1:])
    # An MDP/0.2 (here majortomo) client can take parts: the broker asks for a stream.
    stream = (b"\xffDCP:stream=32",)
    assert msg == Request(ECHO, b"M", stream, (b"x",))
    feed(core, b"W", serialize(Reply(b"M", stream, (b"X",))))
    assert take(core) == [[b"M", *MTC.client_answer(ECHO, [b"X"], final=True)]]


@pytest.mark.parametrize("client", [V01C, V02C, MTC])
@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        ("max_queue", "queue_full"),
        ("max_client_inflight", "client_limit"),
        ("max_services", "too_many_services"),
    ],
)
def test_a_refused_mdp_request_gets_no_answer(
    client: mdp.MdpPeer, limit: str, reason: str
) -> None:
    """Finding 12 (c), majordomo Rule M1: MDP has no error reply, so a refusal is counted
    and the MDP client told nothing (it read a ``\xffDCP-ERROR`` body as a reply: the
    zguide's mdclient2 counted 12 replies where 5 were real). Its next answer is a real one;
    a DCP client refused the same way still gets its error reply."""
    core = BrokerCore(
        max_queue=0 if limit == "max_queue" else 100_000,
        max_client_inflight=1 if limit == "max_client_inflight" else 20_000,
        max_services=1 if limit == "max_services" else 10_000,
    )
    feed(core, b"W", serialize(Register(b"other")))
    take(core)
    if reason == "client_limit":
        feed(core, b"M", client.client_request(ECHO, [b"first"]))  # queued: the limit is 1
    feed(core, b"M", client.client_request(ECHO, [b"x"]))
    assert take(core) == []
    assert core.statistics().rejections == {reason: 1}
    feed(core, b"M", client.client_request(b"other", [b"y"]))
    if reason == "client_limit":
        assert take(core) == []  # still at its limit: told nothing again
        assert core.statistics().rejections == {reason: 2}
        return
    [given] = take(core)
    msg, _ = parse(given[1:])
    assert isinstance(msg, Request)
    feed(core, b"W", serialize(Reply(b"M", msg.metadata, (b"Y",))))
    assert take(core) == [[b"M", *client.client_answer(b"other", [b"Y"], final=True)]]
    feed(core, b"D", serialize(Request(ECHO, None, (b"rid",), (b"x",))))
    [sent] = take(core)
    reply, _ = parse(sent[1:])
    assert isinstance(reply, Reply)
    error = parse_error_reply(reply.data)
    assert error is not None and error[0] == reason


def test_a_redelivery_limit_is_not_told_to_an_mdp_client() -> None:
    """Finding 12 (c): a request given up after its workers kept going away (routing Rule R5)
    is counted; its MDP client is told nothing, a DCP client gets ``redelivery_limit``."""
    core = BrokerCore(max_redeliveries=0)
    mdp_worker(core, b"W1", V02W)
    feed(core, b"M", V01C.client_request(ECHO, [b"x"]))
    assert take(core) == [[b"W1", *V02W.worker_request(b"M", [b"x"])]]
    feed(core, b"W1", V02W.worker_disconnect())
    assert take(core) == []
    assert core.statistics().rejections == {"redelivery_limit": 1}
    mdp_worker(core, b"W2", V02W)
    feed(core, b"D", serialize(Request(ECHO, None, (b"rid",), (b"x",))))
    take(core)
    feed(core, b"W2", V02W.worker_disconnect())
    [sent] = take(core)
    reply, _ = parse(sent[1:])
    assert isinstance(reply, Reply)
    error = parse_error_reply(reply.data)
    assert error is not None and error[0] == "redelivery_limit"


# ------------------------------------------- finding 12: what Majordomo peers receive

#: What each client form gets for no data: its REPLY/FINAL with one empty body frame, written
#: out by hand from RFC 7 ("4 or more frames": "" MDPC01 service body) and RFC 18 ("4 or
#: more frames": MDPC02 0x03 service body), and majortomo's FINAL ("" MDPC02 0x04 body).
EMPTY_FINAL = {
    V01C: [b"", b"MDPC01", ECHO, b""],
    V02C: [b"MDPC02", b"\x03", ECHO, b""],
    MTC: [b"", b"MDPC02", b"\x04", b""],
}


@pytest.mark.parametrize("client", [V01C, V02C, MTC])
def test_an_answer_with_no_data_has_an_empty_body_frame(client: mdp.MdpPeer) -> None:
    """Finding 12 (a), majordomo Rule M1: a dcp handler that returns nothing reaches an MDP
    client as a REPLY/FINAL with one empty body frame, never a bodiless one (the zguide's
    mdcliapi2.c asserts 4 frames)."""
    core = BrokerCore()
    feed(core, b"W", serialize(Register(ECHO)))
    feed(core, b"M", client.client_request(ECHO, [b"x"]))
    [_echo, given] = take(core)
    msg, _ = parse(given[1:])
    assert isinstance(msg, Request)
    feed(core, b"W", serialize(Reply(b"M", msg.metadata, ())))
    [sent] = take(core)
    assert sent == [b"M", *EMPTY_FINAL[client]]
    assert len(sent) - 1 >= 4  # RFC 7 and 18: 4 or more frames (routing id aside)


def test_the_end_of_a_stream_has_an_empty_body_frame() -> None:
    """Finding 12 (a): a dcp stream handler's parts reach an MDP/0.2 client as PARTIALs and
    its end (a reply with no data) as a FINAL with one empty body frame; a part with no data
    is an empty body frame too (RFC 18: PARTIAL and FINAL have 4 or more frames)."""
    core = BrokerCore()
    feed(core, b"W", serialize(Register(ECHO)))
    feed(core, b"M", V02C.client_request(ECHO, [b"q"]))
    [_echo, given] = take(core)
    msg, _ = parse(given[1:])
    assert isinstance(msg, Request)
    for data in ((b"p0",), ()):
        feed(core, b"W", streams.build(StreamType.PARTIAL, b"M", msg.metadata, data))
    feed(core, b"W", serialize(Reply(b"M", msg.metadata, ())))
    assert take(core) == [
        [b"M", b"MDPC02", b"\x02", ECHO, b"p0"],
        [b"M", b"MDPC02", b"\x02", ECHO, b""],
        [b"M", b"MDPC02", b"\x03", ECHO, b""],
    ]


@pytest.mark.parametrize(
    ("worker", "frames"),
    [
        (V01W, [b"", b"MDPW01", b"\x02", b"D", b"", b""]),  # RFC 7: 6 or more frames
        (V02W, [b"MDPW02", b"\x02", b"D", b"", b""]),  # RFC 18: 5 or more frames
        (MTW, [b"", b"MDPW02", b"\x02", b"D", b"", b""]),  # majortomo: drops fewer
    ],
)
def test_a_request_with_no_data_reaches_mdp_workers_with_an_empty_body_frame(
    worker: mdp.MdpPeer, frames: list[bytes]
) -> None:
    """Finding 12 (b), majordomo Rule M2: ``dcp call svc`` (no data) reaches an MDP worker as a
    REQUEST with one empty body frame."""
    core = BrokerCore()
    mdp_worker(core, b"W", worker)
    feed(core, b"D", serialize(Request(ECHO, None, (b"rid",), ())))
    assert take(core) == [[b"W", *frames]]
    # An MDP peer's own message without a body is read as no data.
    feed(core, b"W", worker.worker_answer(b"D", [], final=True))
    assert take(core) == [[b"D", *serialize(Reply(b"D", (b"rid",), ()))]]


@pytest.mark.parametrize("client", [V01C, V02C, MTC])
def test_mmi_for_mdp_clients(client: mdp.MdpPeer) -> None:
    core = BrokerCore()
    mdp_worker(core, b"W", V02W)
    for name, body, code in [
        (b"mmi.service", [ECHO], b"200"),
        (b"mmi.service", [b"nobody"], b"404"),
        (b"mmi.service", [], b"404"),
        (b"mmi.other", [ECHO], b"501"),
    ]:
        feed(core, b"C", client.client_request(name, body))
        assert take(core) == [[b"C", *client.client_answer(name, [code], final=True)]]
    assert core.statistics().requests == 0  # answered by the broker, never queued


def test_mmi_for_dcp_clients_keeps_the_metadata() -> None:
    core = BrokerCore()
    feed(core, b"D", serialize(Request(b"mmi.service", None, (b"rid",), (ECHO,))))
    assert take(core) == [[b"D", *serialize(Reply(b"D", (b"rid",), (b"404",)))]]


def test_workers_may_not_register_mmi_names() -> None:
    core = BrokerCore()
    feed(core, b"W", V02W.worker_ready(b"mmi.service"))
    assert take(core) == [[b"W", *V02W.worker_disconnect()]]
    feed(core, b"D", serialize(Register(b"mmi.x")))
    [refusal] = take(core)
    msg, _ = parse(refusal[1:])
    assert isinstance(msg, Reply) and msg.client is None
    error = parse_error_reply(msg.data)
    assert error is not None and error[0] == "registration_refused"
    stats = core.statistics()
    assert (stats.workers, stats.rejections) == (0, {"reserved_service": 2})


def test_unexpected_mdp_worker_commands_get_disconnect() -> None:
    core = BrokerCore()
    # Not registered: anything but READY (and DISCONNECT itself) gets DISCONNECT (RFC 7).
    feed(core, b"X", V01W.worker_heartbeat())
    feed(core, b"X", V01W.worker_answer(b"C", [b"r"], final=True))
    feed(core, b"X", V01W.worker_disconnect())
    assert take(core) == [[b"X", *V01W.worker_disconnect()]] * 2
    assert core.statistics().reconnects_sent == 2
    # Registered: a second READY, or a command MDP does not know, ends the session.
    mdp_worker(core, b"W", V02W)
    feed(core, b"W", V02W.worker_ready(ECHO))
    assert take(core) == [[b"W", *V02W.worker_disconnect()]]
    mdp_worker(core, b"W", V02W)
    feed(core, b"W", [b"MDPW02", b"\x09"])
    assert take(core) == [[b"W", *V02W.worker_disconnect()]]
    stats = core.statistics()
    assert stats.workers == 0
    assert stats.rejections == {"unexpected_ready": 1, "unknown_message_type": 1}


def test_a_worker_keeps_its_dialect() -> None:
    core = BrokerCore()
    mdp_worker(core, b"W", V02W)
    feed(core, b"W", serialize(Register(b"other")))
    feed(core, b"W", V02C.client_request(ECHO, []))
    feed(core, b"D", serialize(Register(ECHO)))
    take(core)
    feed(core, b"D", V02W.worker_heartbeat())
    assert core.statistics().rejections == {"dialect_mismatch": 3}


def test_the_broker_heartbeats_mdp_workers_and_expires_silent_idle_ones() -> None:
    core = BrokerCore(heartbeat_interval=1.0, mdp_timeout=10.0)
    mdp_worker(core, b"W", V02W)
    # The first heartbeat is due a tick (heartbeat_interval / 4) after the worker registered.
    assert core.next_deadline() == 0.25
    core.expire(0.2)
    assert take(core) == []
    core.expire(0.25)
    assert take(core) == [[b"W", *V02W.worker_heartbeat()]]
    assert core.next_deadline() == 1.25
    core.expire(0.5)
    assert take(core) == []
    feed(core, b"W", V02W.worker_heartbeat(), now=5.0)  # its own heartbeats keep it alive
    core.expire(14.9)
    assert core.statistics().workers == 1
    core.expire(15.0)
    assert core.statistics().workers == 0
    assert core.statistics().expired_workers == 1


def test_a_busy_silent_mdp_worker_keeps_its_request_and_answers_once() -> None:
    """zguide and majortomo workers send nothing while a handler runs: a 40 s job is not
    taken away after the idle timeout; the broker's heartbeats are its probes."""
    core = BrokerCore(heartbeat_interval=1.0, mdp_timeout=10.0, busy_timeout=60.0)
    mdp_worker(core, b"W", V01W)
    feed(core, b"C", V01C.client_request(ECHO, [b"job"]))
    take(core)
    for t in range(1, 41):
        core.expire(float(t))
    assert core.statistics().workers == 1
    assert core.statistics().redeliveries == 0
    feed(core, b"W", V01W.worker_answer(b"C", [b"done"], final=True), now=40.5)
    sent = [m for m in take(core) if m[0] == b"C"]
    assert sent == [[b"C", *V01C.client_answer(ECHO, [b"done"], final=True)]]
    assert core.statistics().replies == 1


def test_a_dead_busy_mdp_worker_is_found_by_a_failed_heartbeat() -> None:
    core = BrokerCore(heartbeat_interval=1.0)
    mdp_worker(core, b"W1", V02W)
    mdp_worker(core, b"W2", V02W)
    feed(core, b"C", V02C.client_request(ECHO, [b"job"]))
    [first] = take(core)
    dead = first[0]
    core.expire(1.0)
    beats = take(core)
    assert len(beats) == 2
    [to_dead] = [m for m in beats if m[0] == dead]
    core.undeliverable(to_dead, "gone")  # the driver's send failed
    alive = b"W2" if dead == b"W1" else b"W1"
    assert take(core) == [[alive, *V02W.worker_request(b"C", [b"job"])]]
    assert core.statistics().redeliveries == 1


def test_mdp_workers_in_secure_mode_see_and_return_sealed_addresses() -> None:
    """Security Rule S4 holds for Majordomo workers too: the client address they get is
    sealed, and a forged one in a FINAL or PARTIAL is refused."""
    key = "k" * 40  # any principal: the test's guard lets every key register
    core = BrokerCore(guard=Guard(lambda key, service: True, b"s" * 32))

    def feed_as(peer: bytes, frames: list[bytes]) -> None:
        core.receive([peer, *frames], 0.0, key)

    feed_as(b"W", V02W.worker_ready(ECHO))
    feed_as(b"C", V02C.client_request(ECHO, [b"x"]))
    [given] = take(core)
    sealed = given[3]
    assert given == [b"W", *V02W.worker_request(sealed, [b"x"])]
    assert sealed != b"C"
    assert core.guard is not None and core.guard.unseal(sealed) == b"C"
    for final in (False, True):
        feed_as(b"W", V02W.worker_answer(b"C", [b"forged"], final=final))
    assert take(core) == []
    assert core.statistics().rejections == {"bad_client_address": 2}
    feed_as(b"W", V02W.worker_answer(sealed, [b"p"], final=False))
    feed_as(b"W", V02W.worker_answer(sealed, [b"f"], final=True))
    assert take(core) == [
        [b"C", *V02C.client_answer(ECHO, [b"p"], final=False)],
        [b"C", *V02C.client_answer(ECHO, [b"f"], final=True)],
    ]


# ------------------------------------ finding 12 (b): a worker that drops a request


@pytest.mark.parametrize("worker", [V01W, V02W, MTW])
def test_an_mdp_worker_that_drops_a_request_cannot_hold_it_for_ever(
    worker: mdp.MdpPeer,
) -> None:
    """Finding 12 (b), majordomo Rule M5: an MDP worker that drops a request and keeps
    heartbeating (majortomo's did with a bodiless REQUEST) is removed after the default
    ``mdp_work_timeout`` (60 s), and the request goes to another worker; before, the broker
    let it hold the request for ever and the service's later requests all waited."""
    core = BrokerCore(heartbeat_interval=1.0)
    mdp_worker(core, b"W1", worker)
    feed(core, b"C", V01C.client_request(ECHO, [b"job"]))
    assert take(core) == [[b"W1", *worker.worker_request(b"C", [b"job"])]]
    mdp_worker(core, b"W2", worker)
    t = 0.0
    while t < 59.5:  # W1 heartbeats (alive and idle as far as it knows), never answers
        t += 0.5
        for ident in (b"W1", b"W2"):
            feed(core, ident, worker.worker_heartbeat(), now=t)
        core.expire(t)
    take(core)
    assert core.statistics().work_timeouts == 0
    due = core.next_deadline()
    assert due is not None and due <= 60.0
    feed(core, b"W1", worker.worker_heartbeat(), now=60.0)
    core.expire(60.0)
    sent = take(core)
    assert [b"W1", *worker.worker_disconnect()] in sent
    assert [b"W2", *worker.worker_request(b"C", [b"job"])] in sent
    stats = core.statistics()
    assert (stats.work_timeouts, stats.redeliveries) == (1, 1)
    feed(core, b"W2", worker.worker_answer(b"C", [b"done"], final=True), now=60.5)
    assert take(core) == [[b"C", *V01C.client_answer(ECHO, [b"done"], final=True)]]


def test_the_mdp_work_timeout_is_the_brokers_to_set() -> None:
    """Majordomo Rule M5: ``mdp_work_timeout`` sets it (``None``: no limit, as before); a
    request's own work timeout (a dcp client's) or the broker's ``work_timeout`` come first;
    dcp workers (which have an error reply) get none by default; an answer in time leaves no
    deadline."""
    core = BrokerCore(mdp_work_timeout=5.0)
    mdp_worker(core, b"W", V02W)
    feed(core, b"C", V02C.client_request(ECHO, [b"a"]))
    take(core)
    assert core.next_deadline() == 0.25  # the first heartbeat tick; the timeout is later
    core.expire(0.25)
    assert core.redelivery.next_deadline() == 5.0
    feed(core, b"W", V02W.worker_answer(b"C", [b"A"], final=True), now=1.0)
    take(core)
    assert core.redelivery.next_deadline() is None
    # A dcp client's own work timeout wins.
    feed(core, b"D", serialize(Request(ECHO, None, (b"rid", work_timeout_option(20.0)), ())))
    take(core)
    assert core.redelivery.next_deadline() == 20.0
    # The broker's work_timeout comes before mdp_work_timeout; a dcp worker gets neither.
    for core, expected in (
        (BrokerCore(work_timeout=7.0), 7.0),
        (BrokerCore(mdp_work_timeout=None), None),
    ):
        mdp_worker(core, b"W", V01W)
        feed(core, b"C", V01C.client_request(ECHO, [b"a"]))
        assert core.redelivery.next_deadline() == expected
    core = BrokerCore()
    feed(core, b"W", serialize(Register(ECHO)))
    feed(core, b"C", V01C.client_request(ECHO, [b"a"]))
    assert len(take(core)) == 2
    assert core.redelivery.next_deadline() is None
    with pytest.raises(ValueError, match="mdp_work_timeout"):
        BrokerCore(mdp_work_timeout=0)


def test_each_partial_starts_the_mdp_work_timeout_again() -> None:
    """Majordomo Rule M5: an MDP/0.2 worker that streams for longer than
    ``mdp_work_timeout`` keeps its request while each PARTIAL comes within it; once it goes
    quiet (heartbeats only) for that long, it is removed. A request's own work timeout is a
    limit on the whole, which PARTIALs do not move."""
    core = BrokerCore(heartbeat_interval=1.0)
    mdp_worker(core, b"W", V02W)
    feed(core, b"C", V02C.client_request(ECHO, [b"long"]))
    take(core)
    for n in range(5, 305, 5):  # a part every 5 s for 300 s
        feed(core, b"W", V02W.worker_answer(b"C", [b"%d" % n], final=False), now=float(n))
        core.expire(float(n))
    assert core.statistics().work_timeouts == 0
    assert core.statistics().partials == 60
    t = 300.0
    while t < 359.5:  # then heartbeats only
        t += 0.5
        feed(core, b"W", V02W.worker_heartbeat(), now=t)
        core.expire(t)
    assert core.statistics().work_timeouts == 0
    core.expire(360.0)
    assert core.statistics().work_timeouts == 1
    # A dcp client's own work timeout (20 s) is not moved by parts.
    core = BrokerCore(heartbeat_interval=1.0)
    mdp_worker(core, b"W", V02W)
    feed(core, b"D", serialize(Request(ECHO, None, (b"rid", work_timeout_option(20.0)), ())))
    for when in (5.0, 10.0, 15.0, 20.0):
        feed(core, b"W", V02W.worker_answer(b"D", [b"p"], final=False), now=when)
        core.expire(when)
    assert core.statistics().work_timeouts == 1
