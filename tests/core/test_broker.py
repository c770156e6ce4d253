"""The broker's sans-IO routing core, one rule at a time, with explicit ``now`` (no sockets).

Messages go in as the ROUTER sees them (routing id first); what the core wants to send is taken
from its outbox (:func:`tests.helpers.take`) and compared frame by frame with
:func:`dcp.wire.serialize` output.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from dcp._broker.oplog import write_log
from dcp._core.broker.approval import Approval, ApprovalRequest
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.outputs import MAX_LOG_LINES, LogLine
from dcp._core.broker.unreachable import Unreachable
from dcp._stats import QueueStatistics
from dcp.wire import (
    PROTOCOL,
    Message,
    Ping,
    Pong,
    Reconnect,
    Register,
    Reply,
    Request,
    parse,
    serialize,
)
from dcp.wire.messages import ERROR_MARKER
from dcp.wire.options import work_timeout_option
from tests.helpers import (
    C1,
    C2,
    ECHO,
    W1,
    W2,
    W3,
    answer,
    error_of,
    feed,
    given,
    out,
    req,
    take,
    take_events,
    workers,
)
from tests.wire.vectors import vectors_or_skip

# ----------------------------------------------------------------- Rule R1, Rule R4


@pytest.mark.parametrize("width", [1, 4])
def test_registration_is_echoed_in_the_senders_width(width: int) -> None:
    core = BrokerCore()
    feed(core, W1, Register(ECHO), width)
    assert take(core) == [out(W1, Register(ECHO), width)]
    stats = core.statistics()
    assert stats.workers == 1
    assert stats.services == {ECHO: QueueStatistics(workers=1, idle=1, queued=0)}
    assert stats.rejections == {}


@pytest.mark.parametrize("width", [1, 4])
def test_ping_from_worker_gets_pong_and_grants_one_request(width: int) -> None:
    core = BrokerCore()
    feed(core, W1, Register(ECHO), width)
    take(core)
    feed(core, C1, req(1))
    feed(core, C1, req(2))
    assert take(core) == [given(W1, 1, C1, width=width)]
    feed(core, W1, Ping(), width)
    # Busy worker asks for more: pong, and the queued request right away.
    assert take(core) == [out(W1, Pong(), width), given(W1, 2, C1, width=width)]
    assert core.statistics().services[ECHO].queued == 0


def test_pong_from_worker_is_a_keepalive_only() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    workers(core, W1)
    feed(core, C1, req(1))
    feed(core, C1, req(2))
    take(core)
    assert core.next_deadline() == 3.0
    feed(core, W1, Pong(), now=2.0)
    assert take(core) == [out(W1, Pong())]
    assert core.statistics().services[ECHO].queued == 1
    assert core.next_deadline() == 5.0
    core.expire(4.9)
    assert core.statistics().workers == 1


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("beat", [Ping(), Pong()], ids=["ping", "pong"])
def test_heartbeat_from_unknown_peer_gets_reconnect(beat: Message, width: int) -> None:
    core = BrokerCore()
    feed(core, W1, beat, width)
    assert take(core) == [out(W1, Reconnect(), width)]
    assert core.statistics().reconnects_sent == 1
    assert core.statistics().rejections == {}
    assert core.statistics().workers == 0


def test_readiness_does_not_pile_up() -> None:
    core = BrokerCore()
    workers(core, W1)
    for _ in range(10):
        feed(core, W1, Ping())
    assert take(core) == [out(W1, Pong())] * 10
    for n in range(3):
        feed(core, C1, req(n))
    assert take(core) == [given(W1, 0, C1)]
    assert core.statistics().services[ECHO] == QueueStatistics(workers=1, idle=0, queued=2)


def test_each_finished_request_frees_one_slot() -> None:
    """A worker that asked for more (pinged while busy) keeps its extra slot: each reply adds
    one credit, so it is given exactly as many requests as it has free slots, even when
    replies arrive while the queue is empty."""
    core = BrokerCore()
    workers(core, W1, W2)
    for n in range(2):
        feed(core, C1, req(n))
    assert take(core) == [given(W1, 0, C1), given(W2, 1, C1)]
    feed(core, W1, Ping())  # W1 asks for a second request; none is queued
    assert take(core) == [out(W1, Pong())]
    feed(core, C1, req(2))
    assert take(core) == [given(W1, 2, C1)]  # W1 now holds 2
    feed(core, W1, answer(0, C1))
    feed(core, W1, answer(2, C1))
    take(core)
    assert core.statistics().services[ECHO].idle == 1  # W1: two credits, W2: busy
    for n in range(3, 6):
        feed(core, C1, req(n))
    # W1 has two free slots: two requests; the third waits for a slot.
    assert take(core) == [given(W1, 3, C1), given(W1, 4, C1)]
    assert core.statistics().services[ECHO] == QueueStatistics(workers=2, idle=0, queued=1)


def test_a_worker_with_credit_left_goes_to_the_back_of_the_idle_list() -> None:
    core = BrokerCore()
    workers(core, W1, W2)
    feed(core, C1, req(0))
    feed(core, C1, req(1))
    feed(core, W1, Ping())  # W1 holds 0 and asks for more: credit 1, first in the idle list
    feed(core, W1, answer(0, C1))  # a finished request frees a slot: credit 2
    feed(core, W2, Ping())  # W2 holds 1 and asks for more: credit 1, behind W1
    take(core)
    for n in range(2, 5):
        feed(core, C1, req(n))
    # W1 takes one and, with credit left, goes behind W2; then W2; then W1 again.
    assert take(core) == [given(W1, 2, C1), given(W2, 3, C1), given(W1, 4, C1)]
    assert core.statistics().services[ECHO] == QueueStatistics(workers=2, idle=0, queued=0)


def test_a_worker_holds_one_request_until_it_replies() -> None:
    core = BrokerCore()
    workers(core, W1)
    for n in range(3):
        feed(core, C1, req(n))
    assert take(core) == [given(W1, 0, C1)]
    for n in range(3):
        feed(core, W1, answer(n, C1))
        expected = [out(C1, answer(n, C1))]
        if n < 2:
            expected.append(given(W1, n + 1, C1))
        assert take(core) == expected
    stats = core.statistics()
    assert (stats.requests, stats.dispatched, stats.replies) == (3, 3, 3)
    assert stats.services[ECHO] == QueueStatistics(workers=1, idle=1, queued=0)


# ------------------------------------------------------------------ Rule R2


def test_least_recently_used_idle_worker_goes_first() -> None:
    core = BrokerCore()
    workers(core, W1, W2, W3)
    for n in range(3):
        feed(core, C1, req(n))
    assert take(core) == [given(W1, 0, C1), given(W2, 1, C1), given(W3, 2, C1)]
    # They free up in the order W3, W1, W2: that is the new LRU order.
    for worker, n in ((W3, 2), (W1, 0), (W2, 1)):
        feed(core, worker, answer(n, C1))
    take(core)
    for n in range(3, 6):
        feed(core, C1, req(n))
    assert take(core) == [given(W3, 3, C1), given(W1, 4, C1), given(W2, 5, C1)]


def test_queue_is_fifo() -> None:
    core = BrokerCore()
    for n in range(5):
        feed(core, C1 if n % 2 else C2, req(n))
    assert take(core) == []
    assert core.statistics().services[ECHO] == QueueStatistics(workers=0, idle=0, queued=5)
    feed(core, W1, Register(ECHO))
    assert take(core) == [out(W1, Register(ECHO)), given(W1, 0, C2)]
    for n in range(5):
        feed(core, W1, answer(n, C1 if n % 2 else C2))
        sent = take(core)
        assert sent[0] == out(C1 if n % 2 else C2, answer(n, C1 if n % 2 else C2))
        assert sent[1:] == ([given(W1, n + 1, C2 if n % 2 else C1)] if n < 4 else [])


def test_multi_service_worker_gets_the_oldest_request_across_its_services() -> None:
    core = BrokerCore()
    feed(core, W1, Register(b"a"))
    feed(core, W1, Register(b"b"))
    assert take(core) == [out(W1, Register(b"a")), out(W1, Register(b"b"))]
    feed(core, C1, req(1, b"a"))
    feed(core, C1, req(2, b"b"))
    feed(core, C1, req(3, b"a"))
    assert take(core) == [given(W1, 1, C1, b"a")]
    feed(core, W1, answer(1, C1))
    assert take(core) == [out(C1, answer(1, C1)), given(W1, 2, C1, b"b")]
    feed(core, W1, answer(2, C1))
    assert take(core) == [out(C1, answer(2, C1)), given(W1, 3, C1, b"a")]


def test_ready_worker_registering_another_service_takes_its_queued_request() -> None:
    core = BrokerCore()
    workers(core, W1, service=b"a")
    feed(core, C1, req(1, b"b"))
    assert take(core) == []
    feed(core, W1, Register(b"b"))
    assert take(core) == [out(W1, Register(b"b")), given(W1, 1, C1, b"b")]
    assert core.statistics().services[b"b"] == QueueStatistics(workers=1, idle=0, queued=0)
    assert core.statistics().services[b"a"].idle == 0


def test_service_is_forgotten_when_its_last_worker_leaves() -> None:
    core = BrokerCore()
    workers(core, W1, W2)
    feed(core, W1, Reconnect())
    assert core.statistics().services == {ECHO: QueueStatistics(workers=1, idle=1, queued=0)}
    feed(core, W2, Reconnect())
    assert core.statistics().services == {}
    assert core.statistics().workers == 0


def test_service_with_queued_requests_is_kept_when_its_last_worker_leaves() -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(1))
    feed(core, C1, req(2))
    take(core)
    feed(core, W1, Reconnect())
    # Both requests wait for the next worker, the held one first.
    assert core.statistics().services == {ECHO: QueueStatistics(workers=0, idle=0, queued=2)}
    feed(core, W2, Register(ECHO))
    assert take(core) == [out(W2, Register(ECHO)), given(W2, 1, C1)]


# ------------------------------------------------------------------ Rule R3


def test_client_address_is_inserted() -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, Request(ECHO, None, (b"id",), (b"x", b"", b"y", b"")))
    assert take(core) == [out(W1, Request(ECHO, C1, (b"id",), (b"x", b"", b"y", b"")))]


def test_explicit_own_address_is_allowed() -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(1, client=C1))
    assert take(core) == [given(W1, 1, C1)]
    stats = core.statistics()
    assert (stats.requests, stats.forwards, stats.rejections) == (1, 0, {})


@pytest.mark.parametrize("width", [1, 4])
def test_foreign_address_from_a_non_worker_is_refused(width: int) -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(1, client=C2), width)
    [sent] = take(core)
    reply_type = (5).to_bytes(width, "little")
    head = [C1, b"", PROTOCOL, reply_type, C1, b"", b"m1", b"", ERROR_MARKER, b"forbidden_address"]
    assert sent[:-1] == head
    assert error_of(sent) == (C1, "forbidden_address", (b"m1",))
    stats = core.statistics()
    assert stats.rejections == {"forbidden_address": 1}
    assert (stats.requests, stats.dispatched) == (0, 0)
    assert stats.services[ECHO].idle == 1


def test_foreign_address_allowed_when_configured() -> None:
    core = BrokerCore(allow_foreign_address=True)
    workers(core, W1)
    feed(core, C1, req(1, client=C2))
    assert take(core) == [given(W1, 1, C2)]
    assert core.statistics().rejections == {}


def test_forwarding_keeps_the_client_address_and_frees_the_forwarder() -> None:
    core = BrokerCore()
    workers(core, W1, service=b"a")
    workers(core, W2, service=b"b")
    feed(core, C1, req(1, b"a"))
    feed(core, C1, req(2, b"a"))
    assert take(core) == [given(W1, 1, C1, b"a")]
    # W1 does part of the work and hands it on to service b, for C1.
    feed(core, W1, Request(b"b", C1, (b"m1",), (b"half",)))
    assert take(core) == [
        out(W2, Request(b"b", C1, (b"m1",), (b"half",))),
        given(W1, 2, C1, b"a"),
    ]
    feed(core, W2, Reply(C1, (b"m1",), (b"done",)))
    assert take(core) == [out(C1, Reply(C1, (b"m1",), (b"done",)))]
    stats = core.statistics()
    assert (stats.requests, stats.forwards, stats.replies, stats.dispatched) == (3, 1, 1, 3)
    # W1 holds only request 2 now: if it leaves, only that one is redelivered.
    feed(core, W1, Reconnect())
    assert core.statistics().services[b"a"].queued == 1
    assert core.statistics().redeliveries == 1


def test_workers_own_request_comes_back_to_it() -> None:
    core = BrokerCore()
    workers(core, W1, service=b"a")
    workers(core, W2, service=b"b")
    feed(core, W1, req(1, b"b"))
    assert take(core) == [given(W2, 1, W1, b"b")]
    feed(core, W2, answer(1, W1))
    assert take(core) == [out(W1, answer(1, W1))]
    assert core.statistics().forwards == 0


@pytest.mark.parametrize(("client_width", "worker_width"), [(1, 4), (4, 1), (4, 4), (1, 1)])
def test_reply_goes_out_in_the_clients_width(client_width: int, worker_width: int) -> None:
    core = BrokerCore()
    feed(core, W1, Register(ECHO), worker_width)
    take(core)
    feed(core, C1, req(1), client_width)
    assert take(core) == [given(W1, 1, C1, width=worker_width)]
    feed(core, W1, answer(1, C1), worker_width)
    assert take(core) == [out(C1, answer(1, C1), client_width)]


def test_four_and_one_byte_clients_side_by_side() -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(1), 4)
    feed(core, C2, req(2), 1)
    take(core)
    feed(core, W1, answer(1, C1))
    feed(core, W1, answer(2, C2))
    sent = take(core)
    assert sent[0] == out(C1, answer(1, C1), 4)
    assert sent[2] == out(C2, answer(2, C2), 1)
    # A peer that switches back to 1-byte frames is answered in 1 byte again.
    feed(core, C1, req(3), 1)
    take(core)
    feed(core, W1, answer(3, C1))
    assert take(core)[0] == out(C1, answer(3, C1), 1)


def test_only_the_most_recent_four_byte_peers_are_remembered() -> None:
    core = BrokerCore(max_width_peers=2)
    workers(core, W1)
    clients = [b"A", b"B", b"C"]
    for n, client in enumerate(clients):
        feed(core, client, req(n), 4)
    for n, client in enumerate(clients):
        feed(core, W1, answer(n, client))
    sent = [m for m in take(core) if m[0] in clients]
    # An accepted request keeps its client's dialect: each is answered in 4 bytes.
    assert [m[3] for m in sent] == [b"\x05\x00\x00\x00"] * 3
    # An answer that matches no request goes by what is remembered: A was pushed out by C,
    # so it is answered in the spec's 1 byte; C in 4.
    for client in (b"A", b"C"):
        feed(core, W1, answer(9, client))
    sent = [m for m in take(core) if m[0] in clients]
    assert [m[3] for m in sent] == [b"\x05", b"\x05\x00\x00\x00"]


def test_reply_from_a_non_worker_is_rejected_once_its_grace_is_over() -> None:
    core = BrokerCore()  # grace: liveness x heartbeat_interval = 3 s
    feed(core, C1, answer(1, C2), now=0.0)
    assert take(core) == []
    assert core.statistics().rejections == {}  # kept: it may register (unreachable U4)
    core.expire(2.9)
    assert core.statistics().rejections == {}
    core.expire(3.0)
    assert take(core) == []
    assert core.statistics().rejections == {"reply_from_non_worker": 1}
    assert core.statistics().replies == 0
    # With no grace, at once.
    core = BrokerCore(reply_grace=0)
    feed(core, C1, answer(1, C2))
    assert core.statistics().rejections == {"reply_from_non_worker": 1}


def test_answers_ahead_of_a_registration_are_handled_after_it() -> None:
    # A worker's answers finished while its connection was down reach a restarted broker
    # ahead of its REGISTER (unreachable Rule U4): routed once it has registered.
    core = BrokerCore()
    feed(core, W1, answer(1, C1), now=0.0)
    feed(core, W1, answer(2, C2), now=0.0)
    feed(core, W3, answer(3, C1), now=0.0)  # never registers
    assert take(core) == []
    feed(core, W1, Register(b"a"), now=0.5)
    assert take(core) == [out(W1, Register(b"a")), out(C1, answer(1, C1)), out(C2, answer(2, C2))]
    stats = core.statistics()
    assert (stats.replies, stats.unmatched, stats.rejections) == (2, 2, {})
    core.expire(3.0)
    assert core.statistics().rejections == {"reply_from_non_worker": 1}
    assert len(core.early) == 0


def test_reply_without_client_is_rejected_but_frees_the_worker() -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(1))
    feed(core, C1, req(2))
    take(core)
    feed(core, W1, Reply(None, (b"m1",), (b"r1",)))
    assert take(core) == [given(W1, 2, C1)]
    assert core.statistics().rejections == {"reply_without_client": 1}
    assert core.statistics().replies == 0


# ------------------------------------------------------------------ Rule R5


def test_silent_worker_expires_and_its_request_goes_to_another() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    workers(core, W1, W2)
    feed(core, C1, req(1))
    assert take(core) == [given(W1, 1, C1)]
    feed(core, W1, Pong())  # W1 beats while busy: silence means it hung (Rule L3)
    feed(core, W2, Ping(), now=2.5)
    take(core)
    assert core.next_deadline() == 3.0
    core.expire(2.999)
    assert take(core) == []
    core.expire(3.0)
    assert take(core) == [given(W2, 1, C1)]
    stats = core.statistics()
    assert (stats.workers, stats.expired_workers, stats.redeliveries) == (1, 1, 1)
    assert (stats.dispatched, stats.requests) == (2, 1)
    assert core.next_deadline() == 5.5
    core.expire(5.5)
    assert take(core) == [out(W2, Pong())]  # W2 never beat while busy: probed (Rule L3)
    core.expire(2.5 + 60.0)  # silent for the whole busy timeout
    # Queues Rule Q5: the queues' fronts are checked max_queue_wait (300 s) after a
    # request without an expiry was first queued (given back at 3.0).
    assert core.next_deadline() == 3.0 + 300.0
    assert core.statistics().services == {ECHO: QueueStatistics(0, 0, 1)}


def test_expired_workers_request_goes_to_the_front_of_the_queue() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    workers(core, W1, W2)
    for n in range(1, 5):
        feed(core, C1, req(n))
    assert take(core) == [given(W1, 1, C1), given(W2, 2, C1)]
    feed(core, W1, Pong())  # a worker that beats while busy (Rule L3)
    take(core)
    feed(core, W2, answer(2, C1), now=2.0)
    assert take(core) == [out(C1, answer(2, C1)), given(W2, 3, C1)]
    core.expire(3.0)
    assert take(core) == []
    assert core.statistics().services[ECHO].queued == 2
    feed(core, W2, answer(3, C1), now=3.5)
    assert take(core) == [out(C1, answer(3, C1)), given(W2, 1, C1)]
    feed(core, W2, answer(1, C1), now=3.6)
    assert take(core) == [out(C1, answer(1, C1)), given(W2, 4, C1)]


def test_redelivery_limit_answers_the_client_with_an_error() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=1, max_redeliveries=1)
    workers(core, W1)
    feed(core, C1, req(1), 4)
    feed(core, W1, Pong())  # workers that beat while busy (Rule L3)
    take(core)
    core.expire(1.0)
    assert core.statistics().redeliveries == 1
    feed(core, W2, Register(ECHO), now=1.0)
    assert take(core) == [out(W2, Register(ECHO)), given(W2, 1, C1)]
    feed(core, W2, Pong(), now=1.0)
    take(core)
    core.expire(2.0)
    [sent] = take(core)
    assert error_of(sent) == (C1, "redelivery_limit", (b"m1",))
    assert sent[3] == b"\x05\x00\x00\x00"
    stats = core.statistics()
    assert stats.rejections == {"redelivery_limit": 1}
    assert (stats.redeliveries, stats.expired_workers) == (1, 2)


def test_a_busy_worker_that_never_beats_is_probed_not_expired() -> None:
    """Rule L3: MDP and DagBox C++ workers send nothing while they work. Such a worker keeps
    its request past the idle liveness; it is probed with a pong each liveness window."""
    core = BrokerCore(heartbeat_interval=1.0, liveness=3, busy_timeout=60.0)
    workers(core, W1)
    feed(core, C1, req(1))
    assert take(core) == [given(W1, 1, C1)]
    for t in (3.0, 6.0, 9.0):
        assert core.next_deadline() == t
        core.expire(t)
        assert take(core) == [out(W1, Pong())]
    assert core.statistics().workers == 1
    feed(core, W1, answer(1, C1), now=10.0)
    assert take(core)[0] == out(C1, answer(1, C1))
    stats = core.statistics()
    assert (stats.replies, stats.redeliveries, stats.expired_workers) == (1, 0, 0)
    # Idle again, it keeps to the idle liveness.
    core.expire(13.0)
    assert core.statistics().workers == 0


def test_a_probe_that_cannot_be_sent_removes_the_busy_worker() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    workers(core, W1, W2)
    feed(core, C1, req(1))
    feed(core, W2, Ping(), now=0.0)
    take(core)
    core.expire(3.0)
    [probe] = [m for m in take(core) if m[0] == W1]
    core.undeliverable(probe, "gone")  # the driver's send failed: the connection is gone
    stats = core.statistics()
    assert (stats.workers, stats.redeliveries) == (0, 1)
    assert stats.rejections == {"worker_unreachable_gone": 1}


def test_a_busy_silent_worker_expires_after_the_busy_timeout_or_work_timeout() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=3, busy_timeout=10.0)
    workers(core, W1, W2)
    feed(core, C1, req(1))
    feed(core, C1, Request(ECHO, None, (b"m2", work_timeout_option(20)), (b"d2",)))
    take(core)
    for t in (3.0, 6.0, 9.0):
        core.expire(t)
    assert core.statistics().workers == 2
    core.expire(12.0)  # W1: silent for 12 s > 10 s; W2 holds a 20 s job: probed
    assert core.statistics().workers == 1
    assert core.statistics().expired_workers == 1
    core.expire(21.0)  # W2 past its request's work timeout (Rule R7)
    assert core.statistics().work_timeouts == 1


def test_worker_reconnect_means_leaving_and_redelivers() -> None:
    core = BrokerCore(reply_grace=0)  # a reply from a non-worker is refused at once
    workers(core, W1, W2)
    feed(core, C1, req(1))
    feed(core, C1, req(2))
    take(core)
    feed(core, W1, Reconnect())
    assert take(core) == []
    assert core.statistics().workers == 1
    feed(core, W2, answer(2, C1))
    assert take(core) == [out(C1, answer(2, C1)), given(W2, 1, C1)]
    # W1 is gone: its late reply is refused, its ping gets reconnect.
    feed(core, W1, answer(1, C1))
    feed(core, W1, Ping())
    assert take(core) == [out(W1, Reconnect())]
    assert core.statistics().rejections == {"reply_from_non_worker": 1}
    assert core.statistics().reconnects_sent == 1


def test_reconnect_from_a_non_worker_is_rejected() -> None:
    core = BrokerCore()
    feed(core, C1, Reconnect())
    assert take(core) == []
    assert core.statistics().rejections == {"unexpected_reconnect": 1}


def test_unreachable_worker_is_removed_and_its_request_redelivered() -> None:
    core = BrokerCore()
    workers(core, W1, W2)
    feed(core, C1, req(1))
    assert take(core) == [given(W1, 1, C1)]
    core.undeliverable(given(W1, 1, C1), "gone")
    assert take(core) == [given(W2, 1, C1)]
    stats = core.statistics()
    assert stats.rejections == {"worker_unreachable_gone": 1}
    assert (stats.workers, stats.redeliveries, stats.dropped_replies) == (1, 1, 0)


@pytest.mark.parametrize("width", [1, 4])
def test_unreachable_client_counts_a_dropped_reply(width: int) -> None:
    core = BrokerCore()  # grace: liveness x heartbeat_interval = 3 s
    reply = [C1, *serialize(Reply(C1, (b"m",), (b"d",)), width=width)]
    core.undeliverable(reply, "gone")  # kept (unreachable Rule U1)
    core.undeliverable(reply, "full")  # a slow reader: dropped at once
    core.undeliverable([C1, *serialize(Reconnect(), width=width)], "gone")
    stats = core.statistics()
    assert (stats.dropped_replies, stats.undeliverable) == (1, 1)
    # Sent again on each tick (U2) until the grace is over, then dropped.
    core.expire(1.0)
    assert take(core) == [reply]
    core.undeliverable(reply, "gone")  # refused again: keeps its first deadline
    core.expire(2.0)
    assert take(core) == [reply]
    core.undeliverable(reply, "gone")
    core.expire(3.0)
    assert take(core) == []
    stats = core.statistics()
    assert (stats.dropped_replies, stats.undeliverable) == (2, 1)
    assert stats.rejections == {}


def test_unreachable_replies_are_bounded_and_delivered_when_the_client_comes() -> None:
    kept = Unreachable(grace=1.0, limit=2)
    a, b, c = [b"a"], [b"b"], [b"c"]
    assert kept.refused(a, 0.0) and kept.refused(b, 0.0)
    assert not kept.refused(c, 0.0)  # U3: full
    assert kept.due(0.5) == ([a, b], 0)
    assert kept.refused(a, 0.6)  # a still unreachable; b got through
    assert kept.due(0.9) == ([a], 0)
    assert kept.due(2.0) == ([], 0)  # b and a were sent; nothing kept
    assert kept.refused(c, 2.0)
    assert kept.due(3.5) == ([], 1)  # U2: grace over


# ------------------------------------------------------------------ Rule R6: bounds


def test_queue_full_gets_an_error_reply() -> None:
    core = BrokerCore(max_queue=2)
    for n in range(3):
        feed(core, C1, req(n))
    [sent] = take(core)
    assert error_of(sent) == (C1, "queue_full", (b"m2",))
    stats = core.statistics()
    assert stats.rejections == {"queue_full": 1}
    assert (stats.requests, stats.services[ECHO].queued) == (2, 2)


def test_queue_full_for_a_forward_tells_the_client_and_frees_the_forwarder() -> None:
    core = BrokerCore(max_queue=1)
    workers(core, W1, service=b"a")
    workers(core, W2, service=b"b")
    feed(core, C1, req(1, b"a"))
    feed(core, C1, req(2, b"a"))
    feed(core, C2, req(3, b"b"))  # W2 is busy with it
    feed(core, C2, req(4, b"b"))  # and b's queue is full
    take(core)
    feed(core, W1, Request(b"b", C1, (b"m1",), (b"half",)))
    [refused, nxt] = take(core)
    # The original client hears of the refusal (the forwarder is done with the request).
    assert error_of(refused) == (C1, "queue_full", (b"m1",))
    assert nxt == given(W1, 2, C1, b"a")
    stats = core.statistics()
    assert stats.forwards == 0  # a refused forward is not counted as one
    # The forward released what W1 held: if W1 dies now only what it holds now (request
    # 2) is redelivered, and W2's request 3.
    core.expire(1e9)
    assert core.statistics().redeliveries == 2


def test_too_many_services() -> None:
    core = BrokerCore(max_services=2)
    feed(core, W1, Register(b"a"))
    feed(core, C1, req(1, b"b"))
    take(core)
    feed(core, C1, req(2, b"c"))
    [sent] = take(core)
    assert error_of(sent) == (C1, "too_many_services", (b"m2",))
    # Requests for made-up names cannot lock real workers out: registering still works.
    feed(core, W2, Register(b"c"))
    assert take(core) == [out(W2, Register(b"c"))]
    stats = core.statistics()
    assert stats.rejections == {"too_many_services": 1}
    assert set(stats.services) == {b"a", b"b", b"c"}
    assert stats.workers == 2


def test_services_per_worker_are_bounded() -> None:
    core = BrokerCore(max_services_per_worker=2)
    for name in (b"a", b"b", b"c"):
        feed(core, W1, Register(name))
    assert take(core) == [out(W1, Register(b"a")), out(W1, Register(b"b"))]
    assert core.statistics().rejections == {"too_many_services": 1}


def test_a_forward_to_a_new_service_still_frees_the_forwarder() -> None:
    """A forward can never make a service (routing Rule R9: nobody would serve it), so
    ``max_services`` is never what refuses it."""
    core = BrokerCore(max_services=1)
    workers(core, W1, service=b"a")
    feed(core, C1, req(1, b"a"))
    feed(core, C1, req(2, b"a"))
    take(core)
    feed(core, W1, Request(b"b", C1, (b"m1",), (b"half",)))
    [refused, nxt] = take(core)
    assert error_of(refused) == (C1, "no_workers", (b"m1",))
    assert nxt == given(W1, 2, C1, b"a")
    assert set(core.statistics().services) == {b"a"}


def test_service_name_too_long() -> None:
    core = BrokerCore(max_service_name=4)
    feed(core, W1, Register(b"abcde"))
    assert take(core) == []
    feed(core, C1, req(1, b"abcde"))
    [sent] = take(core)
    assert error_of(sent) == (C1, "service_name_too_long", (b"m1",))
    feed(core, W1, Register(b"abcd"))
    assert take(core) == [out(W1, Register(b"abcd"))]
    stats = core.statistics()
    assert stats.rejections == {"service_name_too_long": 2}
    assert set(stats.services) == {b"abcd"}


def test_invalid_core_options() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval"):
        BrokerCore(heartbeat_interval=0)
    with pytest.raises(ValueError, match="liveness"):
        BrokerCore(liveness=0)


def test_statistics_figures() -> None:
    core = BrokerCore(reply_grace=0)
    workers(core, W1, W2, service=b"a")
    workers(core, W3, service=b"b")
    for n in range(4):
        feed(core, C1, req(n, b"a"))
    feed(core, W1, answer(0, C1))
    feed(core, W1, Request(b"b", C1, (b"m2",), (b"half",)))
    feed(core, W3, Reply(C1, (b"m2",), (b"done",)))
    feed(core, C2, answer(9, C1))
    stats = core.statistics()
    assert stats.requests == 5
    assert stats.replies == 2
    assert stats.forwards == 1
    assert stats.dispatched == 5
    assert stats.redeliveries == 0
    assert stats.dropped_replies == 0
    assert stats.expired_workers == 0
    assert stats.rejections == {"reply_from_non_worker": 1}
    assert stats.workers == 3
    assert stats.services == {
        b"a": QueueStatistics(workers=2, idle=0, queued=0),
        b"b": QueueStatistics(workers=1, idle=1, queued=0),
    }
    # A snapshot: later traffic does not change it.
    feed(core, C2, answer(9, C1))
    assert stats.rejections == {"reply_from_non_worker": 1}


# ------------------------------------------------------------------ Rule R6: bad input

P = PROTOCOL
MALFORMED: list[tuple[str, list[bytes]]] = [
    # No DCP or MDP header: the dialect is not known (Rule R6).
    ("unknown_protocol", []),
    ("unknown_protocol", [b""]),
    ("unknown_protocol", [b"x", P, b"\x02"]),
    ("unknown_protocol", [b"", b"", b"\x02"]),
    ("unknown_protocol", [b"", b"MDPX01", b"\x02"]),
    ("too_few_frames", [b"", P]),
    ("bad_protocol_frame", [b"", b"DGBX", b"\x02"]),
    ("unsupported_version", [b"", b"DGBX\x02", b"\x02"]),
    ("bad_type_frame", [b"", P, b""]),
    ("bad_type_frame", [b"", P, b"\x02\x00"]),
    ("bad_type_frame", [b"", P, b"\x02\x00\x00\x00\x00"]),
    ("unknown_message_type", [b"", P, b"\x00"]),
    ("unknown_message_type", [b"", P, b"\x07"]),
    ("unknown_message_type", [b"", P, b"\x02\x00\x00\x01"]),
    ("unexpected_frames", [b"", P, b"\x02", b""]),
    ("unexpected_frames", [b"", P, b"\x03", b"x"]),
    ("unexpected_frames", [b"", P, b"\x06", b"x"]),
    ("unexpected_frames", [b"", P, b"\x01", b"echo", b"more"]),
    ("missing_service_name", [b"", P, b"\x01"]),
    ("missing_service_name", [b"", P, b"\x04"]),
    ("missing_client_delimiter", [b"", P, b"\x04", ECHO]),
    ("missing_client_delimiter", [b"", P, b"\x04", ECHO, C1]),
    ("missing_client_delimiter", [b"", P, b"\x04", ECHO, C1, b"m"]),
    ("missing_client_delimiter", [b"", P, b"\x05"]),
    ("missing_client_delimiter", [b"", P, b"\x05", C1, b"m", b""]),
    ("missing_metadata_delimiter", [b"", P, b"\x04", ECHO, b""]),
    ("missing_metadata_delimiter", [b"", P, b"\x04", ECHO, C1, b"", b"m1", b"m2"]),
    ("missing_metadata_delimiter", [b"", P, b"\x05", b"", b"m"]),
    ("missing_metadata_delimiter", [b"", P, b"\x05\x00\x00\x00", C1, b""]),
]


@pytest.mark.parametrize(
    ("reason", "frames"), [pytest.param(r, f, id=f"{r}-{i}") for i, (r, f) in enumerate(MALFORMED)]
)
@pytest.mark.parametrize("sender", [C1, W1], ids=["client", "worker"])
def test_malformed_message_is_counted_and_dropped(
    reason: str, frames: list[bytes], sender: bytes
) -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(1))
    take(core)
    before = core.statistics()
    core.receive([sender, *frames], 1.0)
    assert take(core) == []
    after = core.statistics()
    assert after.rejections == {reason: 1}
    assert after.workers == 1
    # Bad input refreshes nobody's liveness and changes no routing state.
    assert core.next_deadline() == 3.0
    assert after.services == before.services
    # The worker still works.
    feed(core, W1, answer(1, C1))
    assert take(core) == [out(C1, answer(1, C1))]


def test_every_malformed_message_in_a_row() -> None:
    core = BrokerCore()
    for _reason, frames in MALFORMED:
        core.receive([C1, *frames], 0.0)
    expected: dict[str, int] = {}
    for reason, _ in MALFORMED:
        expected[reason] = expected.get(reason, 0) + 1
    assert core.statistics().rejections == expected
    assert core.outbox == []


def test_too_many_frames_from_the_driver_is_counted() -> None:
    core = BrokerCore()
    core.reject_too_many_frames([C1, b"", P, b"\x02"], 5, 0.0)
    assert core.statistics().rejections == {"too_many_frames": 1}
    assert core.outbox == []


def test_refusals_are_logged_once_per_reason_per_minute(caplog: pytest.LogCaptureFixture) -> None:
    core = BrokerCore()
    with caplog.at_level(logging.WARNING, logger="dcp.broker"):
        for _ in range(5):
            core.receive([C1, b"", P, b"\x07"], 0.0)
            core.receive([C1, b"", P], 0.0)
            core.receive([C2, b"", P], 30.0)
        write_log(take_events(core, LogLine))  # what the driver does (the core does no I/O)
    assert len(caplog.records) == 2  # one per reason, whatever the peer
    assert core.statistics().rejections == {"unknown_message_type": 5, "too_few_frames": 10}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dcp.broker"):
        core.receive([C2, b"", P], 60.0)  # a minute after the first: logged, with the count
        write_log(take_events(core, LogLine))
    (record,) = caplog.records
    assert record.getMessage() == (
        f"rejected message from peer {C2.hex()}: too_few_frames (2 frame(s); the DCP header "
        "needs 3) (and 9 more like it in the last 60 s)"
    )


# ------------------------------------------------------------------ DagBox reference frames


def test_dagbox_reference_conversation() -> None:
    """The captured DagBox conversation, and DagBox's queued-request bug, which we avoid."""
    vectors = {v.name: v for v in vectors_or_skip()}

    def router(name: str) -> list[bytes]:
        frames = vectors[name].router_frames
        assert frames is not None
        return list(frames)

    worker = vectors["registration"].peer_id
    bug = vectors["BUG_queued_request_bounced_to_client"]
    assert worker is not None and bug.peer_id is not None
    core = BrokerCore()
    core.receive(router("registration"), 0.0)
    assert take(core) == [router("registration_confirmation")]
    core.receive(router("ping"), 0.1)
    assert take(core) == [router("pong")]
    core.receive(router("request_from_client"), 0.2)
    assert take(core) == [router("request_to_worker")]
    # A second client's request arrives while the worker is busy: it is queued.
    second = Request(ECHO, None, (b"req-1",), (b"payload-1",))
    core.receive(out(bug.peer_id, second, 4), 0.3)
    assert take(core) == []
    core.receive(router("reply_from_worker"), 0.4)
    sent = take(core)
    assert sent[0] == router("reply_to_client")
    # DagBox sent the queued request back to its client; it must go to the worker.
    assert sent[1] != list(bug.router_frames or ())
    assert sent[1] == [worker, *bug.frames]
    assert sent[1:] == [out(worker, Request(ECHO, bug.peer_id, (b"req-1",), (b"payload-1",)), 4)]


def test_dagbox_reference_reconnect() -> None:
    vectors = {v.name: v for v in vectors_or_skip()}
    core = BrokerCore()
    ping = vectors["ping"].router_frames
    assert ping is not None
    core.receive(list(ping), 0.0)
    assert take(core) == [list(vectors["reconnect"].router_frames or ())]


# ------------------------------------------------------------------ never raises, invariants

_PEERS = [W1, W2, C1, C2]
_SERVICES = [b"a", b"b"]
_parts = st.lists(
    st.sampled_from([b"m", b"n", b"x" * 3, work_timeout_option(1.0), work_timeout_option(3.0)]),
    max_size=2,
)
_messages = st.one_of(
    st.builds(Register, st.sampled_from(_SERVICES)),
    st.just(Ping()),
    st.just(Pong()),
    st.just(Reconnect()),
    st.builds(
        Request,
        st.sampled_from(_SERVICES),
        st.sampled_from([None, *_PEERS]),
        _parts,
        st.lists(st.sampled_from([b"", b"d"]), max_size=2),
    ),
    st.builds(Reply, st.sampled_from([None, *_PEERS, b"gone"]), _parts, _parts),
)
_frames = st.lists(
    st.sampled_from([b"", PROTOCOL, b"\x01", b"\x04", b"\x05\x00\x00\x00", b"\x09", b"a"]),
    max_size=8,
)
_message_step = st.tuples(st.sampled_from(_PEERS), _messages, st.sampled_from([1, 4]))
_steps = st.lists(
    st.one_of(
        _message_step,
        _message_step,
        _message_step,
        _message_step,
        st.tuples(st.sampled_from(_PEERS), _frames),
        st.tuples(st.just("expire")),
        st.tuples(st.just("unreachable"), st.sampled_from([*_PEERS, b"gone"])),
    ),
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@hypothesis_given(_steps)
def test_any_traffic_keeps_the_routing_invariants(steps: list[tuple[object, ...]]) -> None:
    """Whatever arrives: nothing raises, every message sent parses (replies go to their
    client), no idle worker waits beside a non-empty queue, nothing is dispatched twice,
    and the per-client counts match the requests queued and held."""
    core = BrokerCore(
        heartbeat_interval=1.0,
        liveness=5,
        max_queue=3,
        max_redeliveries=1,
        max_client_queued=2,
        max_client_inflight=3,
        work_timeout=2.0,
    )
    now = 0.0
    for step in steps:
        now += 0.5
        if step[0] == "expire":
            core.expire(now)
        elif step[0] == "unreachable":
            assert isinstance(step[1], bytes)
            core.undeliverable([step[1], *serialize(Ping())], "gone")
        elif len(step) == 3:
            peer, msg, width = step
            assert isinstance(peer, bytes) and isinstance(msg, Message)
            assert isinstance(width, int)
            feed(core, peer, msg, width, now=now)
        else:
            peer, frames = step
            assert isinstance(peer, bytes) and isinstance(frames, list)
            core.receive([peer, *frames], now)
        for frames in take(core):
            msg, _ = parse(frames[1:])
            if isinstance(msg, Reply):
                assert msg.client == frames[0]
        stats = core.statistics()
        for name, service in stats.services.items():
            assert not (service.idle and service.queued), (name, service)
            assert service.idle <= service.workers
        assert stats.dispatched <= stats.requests + stats.redeliveries
        held = [p for w in core.sessions.workers.values() for p in w.held]
        queued = [p for svc in core.routing.services.values() for p in svc.queue]
        for client, load in core.routing.loads.items():
            assert load.inflight == sum(p.client == client for p in held + queued) > 0
            assert load.queued == sum(p.client == client for p in queued)
        assert all(p.client in core.routing.loads for p in held + queued)
        assert all(p.holder is not None for p in held)
        # Every request has a work timeout here.
        assert core.routing.work_deadlines.live == len(held)


# ------------------------------------------------- which request an answer finishes


def test_a_reply_releases_exactly_the_request_it_answers() -> None:
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(0))
    feed(core, W1, Ping())
    feed(core, C1, req(1))
    take(core)  # W1 holds 0 and 1
    feed(core, W1, answer(1, C1))  # the newer one first
    core.expire(1e9)  # W1 dies holding 0
    assert take(core)[-1:] == [out(C1, answer(1, C1))]
    feed(core, W2, Register(ECHO))
    assert take(core) == [out(W2, Register(ECHO)), given(W2, 0, C1)]  # 0, not 1
    assert core.statistics().unmatched == 0


def test_an_answer_that_matches_nothing_releases_nothing() -> None:
    """A late reply (or one with changed metadata) is routed, but the requests the worker
    still holds stay held, so they are redelivered if it dies."""
    core = BrokerCore()
    workers(core, W1)
    feed(core, C1, req(0))
    take(core)
    feed(core, W1, Reply(C1, (b"stale",), (b"late",)))
    feed(core, W1, Request(b"other", C1, (b"changed",), (b"half",)))
    sent = take(core)
    assert sent[0] == out(C1, Reply(C1, (b"stale",), (b"late",)))
    assert core.statistics().unmatched == 2
    core.expire(1e9)
    feed(core, W2, Register(ECHO))
    assert take(core) == [out(W2, Register(ECHO)), given(W2, 0, C1)]


def test_held_requests_are_bounded_for_a_worker_whose_answers_never_match() -> None:
    core = BrokerCore(max_held=2)
    workers(core, W1)
    for n in range(4):
        feed(core, C1, req(n))
        feed(core, W1, Reply(C1, (b"mangled",), ()))  # matches nothing, asks for more
    take(core)
    assert core.statistics().rejections == {"held_overflow": 2}
    core.expire(1e9)
    assert core.statistics().redeliveries == 2  # only the two still tracked


def test_registering_again_at_the_services_limit_is_echoed() -> None:
    core = BrokerCore(max_services_per_worker=1)
    feed(core, W1, Register(b"a"))
    feed(core, W1, Register(b"a"))
    assert take(core) == [out(W1, Register(b"a"))] * 2
    assert core.statistics().rejections == {}


# ------------------------------------------------- the contract of the cores (dcp._core)


def test_the_core_follows_the_contract_of_the_sans_io_cores() -> None:
    """``drain()`` takes both lists, in order, and leaves them empty (never replaced);
    ``expire`` with no input does nothing; ``next_deadline`` is ``None`` when idle and
    says when ``expire`` next has something to do."""
    core = BrokerCore(approve=True)
    outbox, events = core.outbox, core.events
    assert core.next_deadline() is None  # idle: nothing until more input
    for now in (0.0, 100.0, 50.0):
        core.expire(now)
    assert core.drain() == ([], [])
    assert core.next_deadline() is None
    assert core.statistics() == BrokerCore().statistics()
    feed(core, W1, Register(ECHO), now=100.0)  # waits for the approver: a question
    core.receive([C1, b"", PROTOCOL, b"\x07"], 100.0)  # refused: a log line
    sent, taken = core.drain()
    assert sent == []
    assert [type(e) for e in taken] == [ApprovalRequest, LogLine]
    assert core.outbox is outbox and core.events is events
    assert outbox == [] and events == []
    assert core.drain() == ([], [])
    question = taken[0]
    assert isinstance(question, ApprovalRequest) and question.routing_id == W1
    core.decide(question.token, Approval(True), now=100.5)
    sent, taken = core.drain()
    assert sent == [out(W1, Register(ECHO))]
    assert all(isinstance(e, LogLine) and e.level == logging.INFO for e in taken)
    assert core.next_deadline() == 103.5  # the worker's liveness (3 x 1 s after it was heard)
    core.expire(103.4)
    assert core.drain() == ([], [])
    core.expire(103.5)
    sent, taken = core.drain()
    assert sent == [] and core.statistics().workers == 0  # expired
    assert [type(e) for e in taken] == [LogLine]  # "worker ... expired: ..."
    assert core.next_deadline() is None


def test_next_deadline_covers_replies_kept_for_later() -> None:
    """Rules U2 and U4 in the time API: a reply kept for an unreachable client is sent
    again every tick (``heartbeat_interval / 4``), one kept for a peer that may register
    is refused when its grace is over."""
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    reply = [C1, *serialize(Reply(C1, (b"m",), (b"d",)))]
    core.undeliverable(reply, "gone")
    assert core.next_deadline() == 0.25
    core.expire(0.1)
    assert take(core) == []  # not yet
    core.expire(0.25)
    assert take(core) == [reply]
    assert core.next_deadline() is None  # sent: nothing kept until it is refused again
    core.undeliverable(reply, "gone")
    assert core.next_deadline() == 0.5
    core.expire(0.5)
    assert take(core) == [reply]
    # A reply from a peer that is not (yet) a worker: kept for the grace (3 s).
    feed(core, W1, answer(1, C2), now=1.0)
    assert core.next_deadline() == 4.0
    core.expire(4.0)
    assert core.statistics().rejections == {"reply_from_non_worker": 1}
    assert core.next_deadline() is None


def test_log_lines_left_unread_are_bounded() -> None:
    """Past ``MAX_LOG_LINES`` unread, the oldest line goes; other events stay."""
    core = BrokerCore(approve=True)
    core.receive([C1, b"", PROTOCOL, b"\x07"], 0.0)  # one line
    feed(core, W1, Register(ECHO))  # one question
    for n in range(MAX_LOG_LINES):
        core.receive([C2, b"", PROTOCOL, b"\x07"], 60.0 * (n + 1))  # one line a minute
    _, events = core.drain()
    lines = [e for e in events if isinstance(e, LogLine)]
    assert len(lines) == MAX_LOG_LINES
    assert [str(line.args[0]) for line in lines] == [C2.hex()] * MAX_LOG_LINES  # C1's went
    assert [type(e) for e in events].count(ApprovalRequest) == 1
    assert core.statistics().rejections == {"unknown_message_type": MAX_LOG_LINES + 1}
