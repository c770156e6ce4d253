"""The broker core's parts on their own, put together by hand as
:class:`~dcp._core.broker.core.BrokerCore` does: each is given its collaborators, and none
needs more than it is given (sans-IO, explicit ``now``)."""

from __future__ import annotations

import logging

from dcp._core.broker.admission import Limits
from dcp._core.broker.approval import ApprovalRequest, Approvals
from dcp._core.broker.dialects import DCP1, DCP4, DbpDialect, MdpDialect, mdp_dialect
from dcp._core.broker.directory import Directory, Mmi
from dcp._core.broker.majordomo import MdpPeers
from dcp._core.broker.outputs import LogLine, Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.redelivery import Redelivery
from dcp._core.broker.routing import Routing
from dcp._core.broker.streams import RETRY_DELAY, Streams
from dcp._stats import BrokerCounters
from dcp.wire import Register, dbp, mdp
from dcp.wire.messages import parse_error_reply
from tests.helpers import C1, ECHO, W1, W2, given, out

V02W = mdp.peer(mdp.Form.V02, envelope=False, worker=True)
V02C = mdp.peer(mdp.Form.V02, envelope=False, worker=False)


class Parts:
    """Outputs, sessions, streams, directory, routing and redelivery, wired together."""

    def __init__(self, *, max_redeliveries: int = 5, approve: bool = False) -> None:
        self.out = Outputs(BrokerCounters())
        self.limits = Limits(max_redeliveries=max_redeliveries)
        self.sessions = Sessions(timeout=3.0, mdp_timeout=10.0, max_remembered=10)
        self.streams = Streams(self.out)
        self.directory = Directory()
        self.approvals = Approvals(self.out.events.append) if approve else None
        self.routing = Routing(
            limits=self.limits,
            sessions=self.sessions,
            outputs=self.out,
            streams=self.streams,
            directory=self.directory,
            guard=None,
            approvals=self.approvals,
            work_timeout=None,
        )
        self.redelivery = Redelivery(
            routing=self.routing,
            sessions=self.sessions,
            streams=self.streams,
            directory=self.directory,
            outputs=self.out,
            limits=self.limits,
            guard=None,
            quarantine=3.0,
        )

    def take(self) -> list[list[bytes]]:
        return self.out.drain()[0]


def test_outputs_drain_both_lists_in_order_and_count_refusals() -> None:
    out = Outputs(BrokerCounters())
    outbox, events = out.outbox, out.events
    out.outbox.append([b"a"])
    out.refuse(C1, DCP4, ECHO, (b"m",), "queue_full", "full")
    out.reject(C1, "queue_full", "again")  # counted, not logged again within the minute
    out.note(logging.INFO, "hello %s", "there")
    sent, taken = out.drain()
    assert sent[0] == [b"a"]
    assert sent[1] == [C1, *DCP4.error(C1, ECHO, (b"m",), "queue_full", "full")[1:]]
    assert [(e.level, e.msg % e.args) for e in taken if isinstance(e, LogLine)] == [
        (logging.WARNING, f"rejected message from peer {C1.hex()}: queue_full (full)"),
        (logging.INFO, "hello there"),
    ]
    assert out.counters.rejections == {"queue_full": 2}
    assert out.drain() == ([], [])
    assert out.outbox is outbox and out.events is events  # emptied, never replaced


def test_routing_and_redelivery_without_a_dialect_handler() -> None:
    """Registration, dispatch, release and a worker that leaves (Rules R1, R2, R5), through
    the parts' own methods."""
    parts = Parts(max_redeliveries=1)
    routing = parts.routing
    w1 = routing.register(W1, None, ECHO, DCP1, 0.0, None)
    w2 = routing.register(W2, None, ECHO, DCP1, 0.0, None)
    assert w1 is not None and w2 is not None
    assert parts.take() == [out(W1, Register(ECHO)), out(W2, Register(ECHO))]
    assert routing.submit(C1, DCP1, ECHO, (b"m1",), (b"d1",), 1.0, forward=False) is None
    assert parts.take() == [given(W1, 1, C1)]  # the least recently used idle worker
    assert routing.loads[C1].inflight == 1
    parts.redelivery.remove_worker(w1, 2.0, "left")
    assert parts.take() == [given(W2, 1, C1)]  # redelivered to the other
    assert parts.out.counters.redeliveries == 1
    released = routing.release(w2, C1, (b"m1",), 2.5)
    assert released is not None and released.service.answered == 1
    assert C1 not in routing.loads  # nothing in flight
    # Past max_redeliveries the client is told.
    routing.credit(w2, 2.5, released=True)
    routing.submit(C1, DCP1, ECHO, (b"m2",), (b"d2",), 3.0, forward=False)
    parts.take()
    parts.redelivery.remove_worker(w2, 3.0, "left")
    w3 = routing.register(W1, None, ECHO, DCP1, 3.0, None)
    assert w3 is not None
    parts.take()
    routing.submit(C1, DCP1, ECHO, (b"m3",), (b"d3",), 3.0, forward=False)
    parts.take()
    parts.redelivery.remove_worker(w3, 4.0, "left")
    errors = [f for f in parts.take() if f[0] == C1]
    assert [parse_error_reply(f[8:]) is not None for f in errors] == [True]
    assert parts.out.counters.rejections["redelivery_limit"] == 1


def test_streams_hold_for_a_full_socket_and_ask_for_a_retry() -> None:
    """Streams Rule ST3 on its own: a held message makes ``next_retry`` a deadline, and a
    retry before it does nothing."""
    out = Outputs(BrokerCounters())
    streams = Streams(out)
    assert streams.next_retry() is None
    out.now = 5.0
    frames = [b"M", *V02C.client_answer(ECHO, [b"x"], final=False)]
    assert streams.undelivered(frames, "full")
    streams.answer(b"M", [b"M", b"final"])  # after what is held
    assert out.outbox == []
    assert streams.next_retry() == 5.0 + RETRY_DELAY
    streams.retry(5.001)
    assert out.outbox == []  # not yet
    streams.retry(5.0 + RETRY_DELAY)
    assert out.drain()[0] == [frames, [b"M", b"final"]]
    assert streams.next_retry() == 5.0 + 2 * RETRY_DELAY  # was it sent whole? ask again
    streams.retry(5.0 + 2 * RETRY_DELAY)
    assert streams.next_retry() is None
    assert streams.statistics().held == 1


def test_mdp_heartbeats_start_a_tick_after_the_first_beating_worker() -> None:
    """Majordomo Rule M4: the schedule belongs to the MDP handler; the workers it beats
    (MDP, DBP) are the sessions'."""
    parts = Parts()
    mmi = Mmi(parts.out, parts.directory, parts.sessions, parts.routing.services, dict)
    handler = MdpPeers(
        outputs=parts.out,
        sessions=parts.sessions,
        routing=parts.routing,
        streams=parts.streams,
        mmi=mmi,
        redelivery=parts.redelivery,
        heartbeat_interval=1.0,
    )
    assert handler.next_beat() is None
    handler.receive(W1, V02W.worker_ready(ECHO), None, 10.0, None)
    dialect = parts.sessions.dialect_of(W1)
    assert isinstance(dialect, MdpDialect) and dialect is mdp_dialect(V02W)
    assert handler.next_beat() == 10.25
    handler.beat(10.2)
    assert parts.take() == []
    handler.beat(10.25)
    assert parts.take() == [[W1, *V02W.worker_heartbeat()]]
    assert handler.next_beat() == 11.25
    dbp_dialect = DbpDialect(lambda: 1234.5)
    parts.routing.register(W2, None, b"svc", dbp_dialect, 10.5, None)  # DBP services beat too
    assert parts.take() == [[W2, *dbp.approved(1234.5)]]
    handler.beat(11.25)
    assert [f[0] for f in parts.take()] == [W1, W2]


def test_approvals_tell_the_driver_through_the_events() -> None:
    parts = Parts(approve=True)
    assert parts.routing.register(W1, None, ECHO, DCP1, 0.0, None) is None  # waits
    sent, events = parts.out.drain()
    assert sent == []
    (question,) = events
    assert isinstance(question, ApprovalRequest) and question.service == ECHO
