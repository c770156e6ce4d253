"""Routing Rules R8 (at most once while the worker lives: requests in flight, and the retries
that join them) and R9 (forward chains: their deadline, a forward to a service nobody serves,
and the chain in error replies), and R11 (answered elsewhere: the queued copy ends, the queue's
front stays live, a service left with neither worker nor queue is forgotten); without
sockets, with explicit ``now``.

Messages go in as the ROUTER sees them (routing id first).
"""

from __future__ import annotations

import logging

import pytest

from dcp import NoWorkers, RemoteError, Response
from dcp._broker.oplog import write_log
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.outputs import LogLine
from dcp._core.broker.routing import MAX_CHAIN
from dcp._core.client.tracker import RequestTracker
from dcp.wire import Ping, Pong, Register, Reply, Request, parse, serialize
from dcp.wire.messages import error_reply_data
from dcp.wire.options import REQUEST_ID_PREFIX, expires_in_option, via_parts
from tests.helpers import (
    C1,
    C2,
    ECHO,
    W1,
    W2,
    W3,
    Wired,
    error_of,
    feed,
    out,
    take,
    take_events,
    workers,
)

NF, SLOW, NOBODY = b"nf", b"slow", b"nobody"


def rid(n: int) -> bytes:
    return REQUEST_ID_PREFIX + b"%d" % n


def call(n: int, seconds: float, service: bytes = ECHO) -> Request:
    """Request ``n`` as a dcp client sends it (an attempt with ``seconds`` left)."""
    return Request(service, None, (rid(n), expires_in_option(seconds)), (b"d%d" % n,))


def dispatched(frames: list[list[bytes]], worker: bytes) -> list[Request]:
    """The requests among ``frames`` given to ``worker``."""
    found = []
    for sent in frames:
        if sent[0] == worker:
            msg, _ = parse(sent[1:])
            if isinstance(msg, Request):
                found.append(msg)
    return found


def inflight(core: BrokerCore) -> int:
    return len(core.routing.inflight)


# ------------------------------------------------------------ Rule R8: requests in flight


def test_a_retry_of_a_held_request_is_answered_by_the_running_one() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, W2)
    feed(core, C1, call(1, 3.0), now=0.0)
    [given] = dispatched(take(core), W1)
    # The client's attempts time out while W1 works; W2 is idle, and gets none of them.
    feed(core, C1, call(1, 2.0), now=1.0)
    feed(core, C1, call(1, 0.9), now=2.1)
    assert take(core) == []
    stats = core.statistics()
    assert (stats.requests, stats.dispatched, stats.replaced) == (1, 1, 2)
    assert stats.services[ECHO].idle == 1
    # W1's answer reaches the client, once; the request is no longer in flight.
    reply = Reply(C1, given.metadata, (b"done",))
    feed(core, W1, reply, now=2.5)
    assert take(core) == [out(C1, Reply(C1, given.metadata, (b"done",)))]
    assert (inflight(core), core.statistics().clients) == (0, 0)


def test_a_held_request_is_redelivered_once_whatever_the_retries() -> None:
    """Across a worker death: the broker gives the request back once, from the worker, not
    once per attempt of the client."""
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    workers(core, W1)
    feed(core, C1, call(1, 30.0), now=0.0)
    feed(core, W1, Pong(), now=0.0)  # it beats while busy: its silence means it is gone
    take(core)
    for attempt in range(1, 5):  # W1 went silent: every attempt times out
        feed(core, C1, call(1, 30.0 - attempt), now=float(attempt))
    assert take(core) == []
    feed(core, W2, Register(ECHO), now=2.5)
    assert dispatched(take(core), W2) == []  # idle, but the request is W1's
    core.expire(3.0)  # W1 expires (liveness 3 x 1 s): its request goes to W2
    [again] = dispatched(take(core), W2)
    assert again.data == (b"d1",)
    feed(core, C1, call(1, 25.0), now=5.0)  # another attempt: W2 has it
    assert take(core) == []
    stats = core.statistics()
    assert (stats.requests, stats.dispatched, stats.redeliveries) == (1, 2, 1)
    assert stats.replaced == 5


def test_a_retry_extends_the_deadline_of_a_held_request() -> None:
    """A retry's expires-in is the request's deadline if its worker gives it back."""
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    workers(core, W1)
    feed(core, C1, call(1, 2.0), now=0.0)  # the first attempt: 2 s
    feed(core, C1, call(1, 8.0), now=1.0)  # a later one: until 9.0
    feed(core, W1, Pong(), now=0.0)  # it beats while busy: its silence means it is gone
    take(core)
    core.expire(3.0)  # W1 expires after the first attempt's deadline
    stats = core.statistics()
    assert (stats.redeliveries, stats.expired_in_queue) == (1, 0)
    assert stats.services[ECHO].queued == 1
    core.expire(9.0)  # dropped at the latest attempt's deadline (queues Rule Q3)
    assert core.statistics().expired_in_queue == 1
    assert inflight(core) == 0


def test_a_retry_without_expires_in_keeps_the_deadline() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, call(1, 2.0), now=0.0)
    feed(core, C1, Request(ECHO, None, (rid(1),), (b"d1",)), now=1.0)
    assert core.next_deadline() == 2.0
    core.expire(2.0)
    assert (core.statistics().expired_in_queue, inflight(core)) == (1, 0)


def test_a_retry_without_expires_in_gets_a_deadline_from_a_later_one() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    feed(core, C1, Request(ECHO, None, (rid(1),), (b"d1",)), now=0.0)
    assert core.next_deadline() == 300.0  # queues Rule Q5: the broker's longest wait
    feed(core, C1, call(1, 2.0), now=1.0)
    assert core.next_deadline() == 3.0
    core.expire(3.0)
    assert (core.statistics().expired_in_queue, inflight(core)) == (1, 0)
    workers(core, W1)
    assert core.statistics().dispatched == 0


def test_an_answered_request_is_no_longer_in_flight() -> None:
    """Once answered, the same id is a new request (a client never sends one: its ids are
    fresh; the index forgets what ended)."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    feed(core, C1, call(1, 5.0))
    [given] = dispatched(take(core), W1)
    feed(core, W1, Reply(C1, given.metadata, (b"r",)))
    take(core)
    feed(core, C1, call(1, 5.0))
    assert len(dispatched(take(core), W1)) == 1
    assert core.statistics().requests == 2


@pytest.mark.parametrize("how", ["expired", "redelivery_limit", "refused", "forward_refused"])
def test_a_request_that_ends_leaves_the_index(how: str) -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=1, max_redeliveries=0, max_queue=1)
    if how == "expired":
        feed(core, C1, call(1, 1.0))
        core.expire(1.0)
        assert core.statistics().expired_in_queue == 1
    elif how == "redelivery_limit":
        workers(core, W1)
        feed(core, C1, call(1, 60.0))
        feed(core, W1, Pong())
        core.expire(1.0)
        assert error_of(take(core)[-1])[1] == "redelivery_limit"
    elif how == "refused":
        feed(core, C1, call(1, 60.0))
        feed(core, C1, call(2, 60.0))
        assert error_of(take(core)[-1])[1] == "queue_full"
        assert inflight(core) == 1
        feed(core, C2, call(1, 60.0))  # another client, the same id: its own request
        assert error_of(take(core)[-1])[1] == "queue_full"
        return
    else:
        workers(core, W1, service=NF)
        feed(core, C1, call(1, 60.0, NF))
        [given] = dispatched(take(core), W1)
        feed(core, W1, Request(NOBODY, C1, given.metadata, (b"x",)))
        assert error_of(take(core)[0])[1] == "no_workers"
    assert inflight(core) == 0


def test_requests_without_a_dcp_id_are_not_retries() -> None:
    """Plain DCP (and MDP) clients' requests are not indexed: each is run."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, W2)
    feed(core, C1, Request(ECHO, None, (b"m1",), (b"d",)))
    feed(core, C1, Request(ECHO, None, (b"m1",), (b"d",)))
    sent = take(core)
    assert len(dispatched(sent, W1)) + len(dispatched(sent, W2)) == 2
    assert inflight(core) == 0


def test_a_retry_of_a_forwarded_request_does_not_run_the_upstream_handler_again() -> None:
    """Rules R8 and R9: the forward carries the client's address and id, so the chain is one
    request in flight."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, W3, service=NF)
    workers(core, W2, service=SLOW)
    feed(core, C1, call(1, 3.0, NF), now=0.0)
    [given] = dispatched(take(core), W1)
    feed(core, W1, Request(SLOW, C1, given.metadata, (b"half",)), now=0.1)
    [forwarded] = dispatched(take(core), W2)
    feed(core, C1, call(1, 2.0, NF), now=1.0)  # the attempt timed out: W3 is idle...
    feed(core, C1, call(1, 0.9, NF), now=2.1)
    assert take(core) == []  # ...and runs nothing
    feed(core, W2, Reply(C1, forwarded.metadata, (b"whole",)), now=2.5)
    assert take(core) == [out(C1, Reply(C1, given.metadata, (b"whole",)))]
    stats = core.statistics()
    assert (stats.requests, stats.forwards, stats.replaced, stats.dispatched) == (2, 1, 2, 2)


def test_a_forward_of_a_request_in_flight_elsewhere_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker the broker gave up on, whose request went to another worker, forwards it
    after all: the chain already runs there. The log line names the worker that sent it."""
    core = BrokerCore(heartbeat_interval=1.0, liveness=3)
    workers(core, W1, service=NF)
    workers(core, W2, service=SLOW)
    feed(core, C1, call(1, 30.0, NF), now=0.0)
    feed(core, W1, Pong(), now=0.0)
    [given] = dispatched(take(core), W1)
    feed(core, W2, Ping(), now=2.9)
    core.expire(3.0)  # W1 expired: the request is queued again
    feed(core, W3, Register(NF), now=3.0)
    [again] = dispatched(take(core), W3)
    feed(core, W1, Register(NF), now=3.1)  # W1 comes back, and forwards its copy
    feed(core, W1, Request(SLOW, C1, given.metadata, (b"half",)), now=3.2)
    assert dispatched(take(core), W2) == []
    assert core.statistics().rejections == {"duplicate_forward": 1}
    with caplog.at_level(logging.WARNING, logger="dcp.broker"):
        write_log(take_events(core, LogLine))
    [line] = [r.getMessage() for r in caplog.records if "duplicate_forward" in r.getMessage()]
    assert line == (
        f"rejected message from peer {W1.hex()}: duplicate_forward "
        "(a forward of a request in flight elsewhere (for 'nf'))"
    )
    feed(core, W3, Request(SLOW, C1, again.metadata, (b"half",)), now=3.3)
    assert len(dispatched(take(core), W2)) == 1


def test_in_memory_a_slow_request_runs_once_with_the_trackers_retries() -> None:
    """The issue's reproduction without sockets: the client's tracker (attempts of 1 s of a
    3 s call), the broker core and a worker core: the handler takes 1.5 s and runs once."""
    wired = Wired(1)
    tracker = RequestTracker(timeout=3.0, retries=2, jitter=0.0)

    def send() -> None:
        for frames in tracker.drain()[0]:
            wired.broker.receive([b"C", *frames], wired.now)
        wired.pump()

    request_id = tracker.request(ECHO, [b"x"], wired.now)
    send()
    while wired.now < 1.5:
        wired.advance(0.05)
        tracker.expire(wired.now)
        send()
    assert tracker.statistics().retries == 1  # the first attempt timed out, and was resent
    wired.finish(0)
    [reply] = wired.replies
    outcome = tracker.receive(serialize(reply))
    assert outcome is not None
    assert outcome[0] == request_id
    assert isinstance(outcome[1], Response)
    assert wired.worker.statistics().received == 1
    assert wired.broker.statistics().replaced == 1


# ------------------------------------------------------------ Rule R9: forward chains


def test_a_forward_to_a_service_nobody_serves_fails_the_chain_at_once() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, service=NF)
    feed(core, C1, call(1, 3.0, NF))
    [given] = dispatched(take(core), W1)
    feed(core, C1, call(2, 3.0, NF))  # queued behind it
    take(core)
    feed(core, W1, Request(NOBODY, C1, given.metadata, (b"x",)))
    [refused, nxt] = take(core)
    client, code, metadata = error_of(refused)
    assert (client, code) == (C1, "no_workers")
    assert metadata == (*given.metadata, *via_parts((NF, NOBODY)))
    assert dispatched([nxt], W1)[0].data == (b"d2",)  # the forwarder was freed
    stats = core.statistics()
    assert (stats.forwards, stats.rejections) == (0, {"no_workers": 1})
    assert NOBODY not in stats.services
    # The client's tracker names the service and the chain.
    tracker = RequestTracker()
    request_id = tracker.request(NF, [b"x"], 0.0)
    msg, _ = parse(refused[1:])
    assert isinstance(msg, Reply)
    outcome = tracker.receive(serialize(Reply(C1, (request_id, *metadata[1:]), msg.data)))
    assert outcome is not None
    error = outcome[1]
    assert isinstance(error, NoWorkers)
    assert str(error) == "no worker serves 'nobody' (nf -> nobody)"
    assert (error.service, error.chain) == (NOBODY, ("nf", "nobody"))


def test_a_workers_error_reply_down_a_chain_names_the_chain() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, service=NF)
    workers(core, W2, service=SLOW)
    feed(core, C1, call(1, 3.0, NF))
    [given] = dispatched(take(core), W1)
    feed(core, W1, Request(SLOW, C1, given.metadata, (b"half",)))
    [forwarded] = dispatched(take(core), W2)
    error = error_reply_data("handler_error", "ValueError: no")
    feed(core, W2, Reply(C1, forwarded.metadata, error))
    [sent] = take(core)
    msg, _ = parse(sent[1:])
    assert isinstance(msg, Reply)
    assert msg.metadata == (*given.metadata, *via_parts((NF, SLOW)))
    assert msg.data == error
    assert core.statistics().services[SLOW].workers == 1
    # What the client makes of it.
    tracker = RequestTracker()
    request_id = tracker.request(NF, [b"x"], 0.0)
    outcome = tracker.receive(serialize(Reply(C1, (request_id, *msg.metadata[1:]), msg.data)))
    assert outcome is not None
    remote = outcome[1]
    assert isinstance(remote, RemoteError)
    assert (remote.code, remote.message, remote.chain) == (
        "handler_error",
        "ValueError: no",
        ("nf", "slow"),
    )
    assert str(remote) == "handler_error: ValueError: no (at 'slow', via nf -> slow)"


def test_an_answer_down_a_chain_is_left_alone() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, service=NF)
    workers(core, W2, service=SLOW)
    feed(core, C1, call(1, 3.0, NF))
    [given] = dispatched(take(core), W1)
    feed(core, W1, Request(SLOW, C1, given.metadata, (b"half",)))
    [forwarded] = dispatched(take(core), W2)
    feed(core, W2, Reply(C1, forwarded.metadata, (b"fine",)))
    assert take(core) == [out(C1, Reply(C1, given.metadata, (b"fine",)))]


def test_a_broker_error_down_a_chain_names_the_chain() -> None:
    core = BrokerCore(heartbeat_interval=1.0, liveness=1, max_redeliveries=0)
    workers(core, W1, service=NF)
    feed(core, C1, call(1, 30.0, NF), now=0.0)
    [given] = dispatched(take(core), W1)
    feed(core, W2, Register(SLOW), now=0.5)
    feed(core, W1, Request(SLOW, C1, given.metadata, (b"half",)), now=0.5)
    feed(core, W2, Pong(), now=0.5)
    take(core)
    feed(core, W1, Ping(), now=1.2)
    core.expire(1.5)  # W2 expires holding the forward
    client, code, metadata = error_of(take(core)[-1])
    assert (client, code) == (C1, "redelivery_limit")
    assert metadata == (*given.metadata, *via_parts((NF, SLOW)))


def test_a_plain_dcp_client_gets_no_chain() -> None:
    """Only a dcp client (its request id first) is told the chain: others match replies by
    their metadata as sent."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, service=NF)
    feed(core, C1, Request(NF, None, (b"mine",), (b"x",)))
    take(core)
    feed(core, W1, Request(NOBODY, C1, (b"mine",), (b"x",)))
    [refused] = take(core)
    assert error_of(refused) == (C1, "no_workers", (b"mine",))


def test_a_chain_keeps_its_latest_services() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    names = [b"s%d" % i for i in range(MAX_CHAIN + 4)]
    for i, name in enumerate(names):
        workers(core, b"W%d" % i, service=name)
    feed(core, C1, call(1, 30.0, names[0]))
    [given] = dispatched(take(core), b"W0")
    for i, name in enumerate(names[1:], start=1):
        feed(core, b"W%d" % (i - 1), Request(name, C1, given.metadata, (b"x",)))
        [given] = dispatched(take(core), b"W%d" % i)
    feed(core, b"W%d" % (len(names) - 1), Request(NOBODY, C1, given.metadata, (b"x",)))
    [refused] = take(core)
    _, _, metadata = error_of(refused)
    assert metadata[2:] == via_parts((*names, NOBODY)[-MAX_CHAIN:])


def test_a_forward_keeps_its_callers_deadline() -> None:
    """The forward's expires-in counts from the client's attempt, not from the forward."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, service=NF)
    workers(core, W2, service=SLOW)
    feed(core, C2, call(9, 60.0, SLOW), now=0.0)  # W2 is busy
    feed(core, C1, call(1, 5.0, NF), now=0.0)
    [given] = dispatched(take(core), W1)
    feed(core, W1, Request(SLOW, C1, given.metadata, (b"half",)), now=4.0)
    assert core.statistics().services[SLOW].queued == 1
    assert core.next_deadline() == 5.0  # not 9.0
    core.expire(5.0)
    stats = core.statistics()
    assert (stats.expired_in_queue, stats.services[SLOW].queued) == (1, 0)
    assert inflight(core) == 1  # C2's


def test_a_forward_after_its_callers_deadline_is_dropped() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1, service=NF)
    workers(core, W2, service=SLOW)
    feed(core, C1, call(1, 5.0, NF), now=0.0)
    [given] = dispatched(take(core), W1)
    feed(core, W1, Request(SLOW, C1, given.metadata, (b"half",)), now=6.0)
    sent = take(core)
    assert dispatched(sent, W2) == []
    assert sent == []  # the caller gave up: no reply (queues Rule Q3)
    stats = core.statistics()
    assert (stats.expired_in_queue, stats.clients, stats.services[SLOW].idle) == (1, 0, 1)
    assert inflight(core) == 0


# ------------------------------------------------------------ Rule R11: answered elsewhere

OTHER = b"other"


@pytest.mark.parametrize("expiring", [True, False], ids=["expires-in", "no-deadline"])
@pytest.mark.parametrize("data", [(b"done",), (b"\xffDCP-HELD",)], ids=["reply", "held"])
def test_an_answer_from_elsewhere_ends_the_queued_copy_unrun(
    expiring: bool, data: tuple[bytes, ...]
) -> None:
    """A request queued here that a worker answered (or holds) through another broker, or
    after this broker gave up on it, is not run again: its queued copy ends."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    workers(core, W2, service=OTHER)
    feed(core, C1, call(1, 30.0), now=0.0)
    [given] = dispatched(take(core), W1)
    second = call(2, 30.0) if expiring else Request(ECHO, None, (rid(2),), (b"d2",))
    feed(core, C1, second, now=0.1)
    assert take(core) == []  # W1 is busy: request 2 waits in the queue
    assert core.statistics().services[ECHO].queued == 1
    # W2 (registered here for another service) answers request 2: it came to W2 through
    # another broker. The answer reaches the client; the queued copy ends.
    feed(core, W2, Reply(C1, second.metadata, data), now=0.2)
    assert take(core) == [out(C1, Reply(C1, second.metadata, data))]
    stats = core.statistics()
    assert (stats.answered_elsewhere, stats.unmatched, stats.expired_in_queue) == (1, 1, 0)
    assert stats.services[ECHO].queued == 0
    assert inflight(core) == 1
    # W1 answers request 1 and is free: nothing is left to give it.
    feed(core, W1, Reply(C1, given.metadata, (b"one",)), now=0.3)
    assert take(core) == [out(C1, Reply(C1, given.metadata, (b"one",)))]
    assert (inflight(core), core.statistics().clients) == (0, 0)
    assert core.memory.used == 0


def test_an_answer_from_elsewhere_leaves_a_running_copy_and_other_clients_alone() -> None:
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    workers(core, W2, service=OTHER)
    feed(core, C1, call(1, 30.0), now=0.0)
    [given] = dispatched(take(core), W1)
    feed(core, C2, call(2, 30.0), now=0.1)
    # An answer naming request 1 (held by W1: it keeps running) and one naming request 2 of
    # another client (C1 never sent a request 2): neither ends anything here.
    feed(core, W2, Reply(C1, given.metadata, (b"x",)), now=0.2)
    feed(core, W2, Reply(C1, call(2, 30.0).metadata, (b"y",)), now=0.2)
    take(core)
    stats = core.statistics()
    assert (stats.answered_elsewhere, stats.services[ECHO].queued) == (0, 1)
    feed(core, W1, Reply(C1, given.metadata, (b"one",)), now=0.3)
    [sent] = dispatched(take(core), W1)  # W1 is free: C2's request 2 runs
    assert sent.metadata[0] == rid(2)


@pytest.mark.parametrize("expiring", [True, False], ids=["expires-in", "no-deadline"])
def test_a_service_left_without_worker_nor_queue_is_forgotten(expiring: bool) -> None:
    """Rule R11 ends the last queued request of a service nobody provides: the service is
    forgotten then, as when it expires (queues Rule Q3; admission Rule AD5 no longer counts
    it for the client that made it)."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W2, service=OTHER)
    one = call(1, 30.0, NOBODY) if expiring else Request(NOBODY, None, (rid(1),), (b"d1",))
    feed(core, C1, one, now=0.0)
    assert take(core) == []
    assert NOBODY in core.routing.services
    assert core.routing.made == {C1: 1}
    feed(core, W2, Reply(C1, one.metadata, (b"done",)), now=0.1)
    assert take(core) == [out(C1, Reply(C1, one.metadata, (b"done",)))]
    assert core.statistics().answered_elsewhere == 1
    assert inflight(core) == 0
    assert NOBODY not in core.routing.services
    assert core.routing.made == {}


def test_the_queue_front_stays_live_after_ending_a_copy_behind_a_dead_one() -> None:
    """Queues Rule Q3: a queue's front is never a tombstone. Rule R11 ends the front (no
    deadline) while the next is a tombstone (expired): the worker freed next gets the live
    request behind them."""
    core = BrokerCore(heartbeat_interval=100.0)
    workers(core, W1)
    workers(core, W2, service=OTHER)
    feed(core, C1, call(1, 30.0), now=0.0)
    [given] = dispatched(take(core), W1)
    plain = Request(ECHO, None, (rid(2),), (b"d2",))
    feed(core, C1, plain, now=0.1)
    feed(core, C1, call(3, 0.5), now=0.2)
    feed(core, C1, call(4, 30.0), now=0.3)
    core.expire(1.0)  # request 3 expired in the queue: a tombstone behind request 2
    take(core)
    feed(core, W2, Reply(C1, plain.metadata, (b"two",)), now=1.1)
    take(core)
    assert core.statistics().services[ECHO].queued == 1
    feed(core, W1, Reply(C1, given.metadata, (b"one",)), now=1.2)
    [sent] = dispatched(take(core), W1)
    assert sent.metadata[0] == rid(4)
    feed(core, W1, Reply(C1, sent.metadata, (b"four",)), now=1.3)
    take(core)
    assert (inflight(core), core.statistics().clients, core.memory.used) == (0, 0, 0)
    assert core.routing.loads == {}
