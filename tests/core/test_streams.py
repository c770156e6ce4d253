"""Sans-IO tests of dcp streams: the frames (:mod:`dcp.wire.streams`) and the broker's
credit, cancel and failure rules (Rules ST1-ST7 of :mod:`dcp._core.broker.streams`), in memory,
time by the ``now`` argument."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dcp.wire.streams as wire
from dcp._core.broker.core import BrokerCore
from dcp._core.broker.guard import Guard
from dcp._core.broker.streams import MAX_HELD, RETRY_DELAY
from dcp._errors import RemoteProtocolError
from dcp.wire import mdp
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import Ping, Register, Reply, Request, parse_error_reply
from dcp.wire.streams import StreamType
from tests.helpers import feed, take

SVC = b"rows"
RID = b"\xffDCP:id=" + b"r" * 16
V02C = mdp.peer(mdp.Form.V02, envelope=False, worker=False)
V02W = mdp.peer(mdp.Form.V02, envelope=False, worker=True)
V01C = mdp.peer(mdp.Form.V01, envelope=True, worker=False)


def stalled(core: BrokerCore) -> bool:
    """Whether messages are held for full sockets (or were just sent again): the core then
    wants :meth:`~BrokerCore.expire` called again within ``RETRY_DELAY`` (Rule ST3)."""
    return core.streams.next_retry() is not None


def retry(core: BrokerCore) -> None:
    """What the driver does while messages are held: call ``expire`` when the core's next
    deadline comes (Rule ST3: it sends them again)."""
    due = core.next_deadline()
    assert due is not None
    core.expire(due)


def meta(window: int | None = 2) -> tuple[bytes, ...]:
    return (RID,) if window is None else (RID, wire.stream_option(window))


def started(window: int | None = 2, core: BrokerCore | None = None) -> BrokerCore:
    """A DCP worker ``W`` holding client ``C``'s stream request."""
    core = core if core is not None else BrokerCore()
    feed(core, b"W", serialize(Register(SVC)))
    feed(core, b"C", serialize(Request(SVC, None, meta(window), (b"q",))))
    [_echo, given_] = take(core)
    msg, _ = parse(given_[1:])
    assert msg == Request(SVC, b"C", meta(window), (b"q",))
    return core


def part(data: bytes, window: int | None = 2, client: bytes = b"C") -> list[bytes]:
    return wire.build(StreamType.PARTIAL, client, meta(window), (data,))


def to_client(data: bytes, window: int | None = 2) -> list[bytes]:
    return [b"C", *part(data, window)]


def to_worker(mtype: StreamType, n: int = 0, window: int | None = 2) -> list[bytes]:
    return [b"W", *wire.build(mtype, b"C", meta(window), credit=n)]


def from_reader(mtype: StreamType, n: int = 0) -> list[bytes]:
    return wire.build(mtype, None, (RID,), credit=n)


# ---------------------------------------------------------------------- frames


@given(
    st.sampled_from(list(StreamType)),
    st.one_of(st.none(), st.binary(min_size=1, max_size=20)),
    st.lists(st.binary(min_size=1, max_size=20), max_size=4),
    st.lists(st.binary(max_size=20), max_size=4),
    st.integers(1, 999_999_999),
    st.sampled_from([1, 4]),
)
def test_frames_round_trip(
    mtype: StreamType,
    client: bytes | None,
    metadata: list[bytes],
    data: list[bytes],
    credit: int,
    width: int,
) -> None:
    data = data if mtype is StreamType.PARTIAL else []
    frames = wire.build(mtype, client, metadata, data, credit=credit, width=width)
    assert wire.is_stream(frames)
    msg = wire.parse_stream(frames)
    assert (msg.type, msg.client, msg.metadata, msg.data) == (
        mtype,
        client,
        tuple(metadata),
        tuple(data),
    )
    assert msg.credit == (credit if mtype is StreamType.CREDIT else 0)


def test_malformed_frames_and_options() -> None:
    base = [b"", b"DGBX\x01", b"\x11", b"", RID, b""]
    for bad in ([], [b"0"], [b"x1"], [b"1234567890"], [b"1", b"2"]):
        with pytest.raises(RemoteProtocolError, match="CREDIT"):
            wire.parse_stream([*base, *bad])
    with pytest.raises(RemoteProtocolError, match="CANCEL"):
        wire.parse_stream([b"", b"DGBX\x01", b"\x12", b"", RID, b"", b"data"])
    with pytest.raises(RemoteProtocolError):
        wire.parse_stream([b"", b"DGBX\x01", b"\x10", b"", RID])  # no metadata delimiter
    assert wire.parse_part([b"", b"DGBX\x01", b"\x10", b"", RID]) is None
    assert wire.parse_part(wire.build(StreamType.CANCEL, None, (RID,))) is None
    assert wire.parse_part(wire.build(StreamType.PARTIAL, None, ())) is None
    assert not wire.is_stream([b"", b"DGBX\x01", b"\x05"])
    assert not wire.is_stream([b"", b"DGBX\x02", b"\x10"])
    for window in (0, -1, 10**9, True, 1.5):
        with pytest.raises(ValueError, match="window"):
            wire.stream_option(window)  # type: ignore[arg-type]
    assert wire.stream_window((RID, b"\xffDCP:stream=x", wire.stream_option(7))) == 7
    assert wire.stream_window((RID, b"plain")) is None


# ---------------------------------------------------------------------- broker


def test_parts_take_credit_and_credit_is_relayed() -> None:
    """Rules ST1, ST2: two parts fit the window of 2; the reader's CREDIT is relayed."""
    core = started()
    feed(core, b"W", part(b"0"))
    feed(core, b"W", part(b"1"))
    assert take(core) == [to_client(b"0"), to_client(b"1")]
    stats = core.statistics()
    assert (stats.partials, stats.streams.open, stats.streams.outstanding) == (2, 1, 2)
    feed(core, b"C", from_reader(StreamType.CREDIT, 2))
    assert take(core) == [to_worker(StreamType.CREDIT, 2)]
    assert core.statistics().streams.outstanding == 0
    feed(core, b"W", part(b"2"))
    assert take(core) == [to_client(b"2")]
    # Rule ST7: the final reply ends it.
    feed(core, b"W", serialize(Reply(b"C", meta(), ())))
    [final] = take(core)
    assert final == [b"C", *serialize(Reply(b"C", meta(), ()))]
    stats = core.statistics()
    assert (stats.streams.open, stats.streams.outstanding_max, stats.replies) == (0, 2, 1)


def test_a_part_without_credit_is_an_overrun() -> None:
    core = started(window=1)
    feed(core, b"W", part(b"0", 1))
    feed(core, b"W", part(b"1", 1))
    sent = take(core)
    assert sent[0] == to_client(b"0", 1)
    assert sent[1] == to_worker(StreamType.CANCEL, window=1)
    error = parse(sent[2][1:])[0]
    assert isinstance(error, Reply)
    assert parse_error_reply(error.data) == (
        "stream_overrun",
        "the worker sent a part without credit",
    )
    stats = core.statistics()
    assert stats.streams.overruns == 1
    assert stats.rejections["stream_overrun"] == 1
    # Later parts are dropped; the final still releases the request.
    feed(core, b"W", part(b"2", 1))
    assert take(core) == []
    feed(core, b"W", serialize(Reply(b"C", meta(1), ())))
    assert len(take(core)) == 1
    assert core.statistics().streams.open == 0


def test_cancel_is_relayed_and_later_parts_dropped() -> None:
    """Rule ST5."""
    core = started()
    feed(core, b"W", part(b"0"))
    take(core)
    feed(core, b"C", from_reader(StreamType.CANCEL))
    assert take(core) == [to_worker(StreamType.CANCEL)]
    feed(core, b"C", from_reader(StreamType.CANCEL))  # twice: told once
    feed(core, b"C", from_reader(StreamType.CREDIT, 5))  # credit for a cancelled stream
    feed(core, b"W", part(b"1"))
    assert take(core) == []
    stats = core.statistics()
    assert stats.streams.cancelled == 1
    assert stats.rejections["partial_dropped"] == 1
    assert stats.rejections["stream_unknown"] == 1


def test_a_cancel_before_the_first_part_is_remembered() -> None:
    core = started()
    feed(core, b"C", from_reader(StreamType.CANCEL))
    assert take(core) == []
    feed(core, b"W", part(b"0"))
    assert take(core) == [to_worker(StreamType.CANCEL)]
    assert core.statistics().streams.cancelled == 1


def test_early_cancels_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from dcp._core.broker import streams

    monkeypatch.setattr(streams, "MAX_CANCELLED", 2)
    core = BrokerCore()
    for i in range(5):
        feed(core, b"C", wire.build(StreamType.CANCEL, None, (b"id%d" % i,)))
    assert list(core.streams.early_cancels) == [(b"C", b"id3"), (b"C", b"id4")]


def test_a_plain_dcp_client_gets_no_parts() -> None:
    """Rule ST1: no stream option: the part is dropped and the worker told to stop."""
    core = started(window=None)
    feed(core, b"W", part(b"0", None))
    assert take(core) == [to_worker(StreamType.CANCEL, window=None)]
    assert core.statistics().rejections == {"partial_dropped": 1}


def test_bad_stream_messages_are_counted() -> None:
    core = started()
    feed(core, b"C", part(b"x"))  # a part from a client
    feed(core, b"W", wire.build(StreamType.PARTIAL, None, meta(), (b"x",)))  # no address
    feed(core, b"W", part(b"x", client=b"other"))  # matches nothing held
    assert take(core) == [[b"W", *wire.build(StreamType.CANCEL, b"other", meta())]]
    feed(core, b"C", [b"", b"DGBX\x01", b"\x11", b"", RID, b"", b"zero"])
    feed(core, b"C", wire.build(StreamType.CREDIT, None, (), credit=1))  # no request id
    feed(core, b"C", from_reader(StreamType.CREDIT, 1))  # a stream not open yet
    assert take(core) == []
    assert core.statistics().rejections == {
        "partial_from_non_worker": 1,
        "reply_without_client": 1,
        "stream_unmatched": 1,
        "bad_credit": 1,
        "stream_without_id": 1,
        "stream_unknown": 1,
    }


def test_no_redelivery_after_a_part() -> None:
    """Rule ST6: a worker lost mid-stream: the reader gets stream_broken; nothing requeued."""
    core = started()
    feed(core, b"W", part(b"0"))
    take(core)
    feed(core, b"W2", serialize(Register(SVC)))  # a worker that could take it
    take(core)
    core.expire(100.0)  # W is long silent
    sent = take(core)
    errors = [parse(f[1:])[0] for f in sent if f[0] == b"C"]
    assert len(errors) == 1 and isinstance(errors[0], Reply)
    assert parse_error_reply(errors[0].data) == (
        "stream_broken",
        "the worker went away after 1 part(s)",
    )
    assert not any(f[0] == b"W2" for f in sent)
    stats = core.statistics()
    assert (stats.redeliveries, stats.streams.broken, stats.streams.open) == (0, 1, 0)


def test_a_stream_without_parts_is_redelivered_as_any_request() -> None:
    core = started()
    feed(core, b"W2", serialize(Register(SVC)), now=99.0)
    take(core)
    core.expire(100.0)  # W is long silent; W2 was heard just now
    sent = take(core)
    assert any(f[0] == b"W2" for f in sent)
    stats = core.statistics()
    assert (stats.redeliveries, stats.streams.broken) == (1, 0)


def test_a_cancelled_stream_whose_worker_dies_is_not_reported_broken() -> None:
    core = started()
    feed(core, b"W", part(b"0"))
    feed(core, b"C", from_reader(StreamType.CANCEL))
    take(core)
    core.expire(100.0)
    assert not any(f[0] == b"C" for f in take(core))
    assert core.statistics().streams.broken == 0


def test_mdp02_readers_get_parts_and_the_broker_grants_credit() -> None:
    """Rule ST3: the broker asks for a stream for an MDP/0.2 client and is its reader."""
    core = BrokerCore()
    feed(core, b"W", serialize(Register(SVC)))
    feed(core, b"M", V02C.client_request(SVC, [b"q"]))
    [_echo, given_] = take(core)
    option = wire.stream_option(32)
    assert parse(given_[1:])[0] == Request(SVC, b"M", (option,), (b"q",))
    for i in range(17):
        feed(core, b"W", wire.build(StreamType.PARTIAL, b"M", (option,), (b"%d" % i,)))
    sent = take(core)
    assert sent[:16] == [
        [b"M", *V02C.client_answer(SVC, [b"%d" % i], final=False)] for i in range(16)
    ]
    # Half the window used: the broker tops the worker's credit up.
    assert sent[16] == [b"W", *wire.build(StreamType.CREDIT, b"M", (option,), credit=16)]
    assert sent[17] == [b"M", *V02C.client_answer(SVC, [b"16"], final=False)]
    # A part the client's socket cannot take is held, with what follows, and the worker
    # gets no more credit (it pauses).
    core.undeliverable(sent[17], "full")
    assert stalled(core)
    assert core.next_deadline() == RETRY_DELAY  # the driver need not poll a flag
    for i in range(17, 32):
        feed(core, b"W", wire.build(StreamType.PARTIAL, b"M", (option,), (b"%d" % i,)))
    feed(core, b"W", serialize(Reply(b"M", (option,), ())))  # the end, held too
    assert take(core) == []
    # The retry sends them in order; once it went out whole, the streams get credit.
    retry(core)
    resent = take(core)
    assert resent[0] == sent[17]
    assert resent[1:16] == [
        [b"M", *V02C.client_answer(SVC, [b"%d" % i], final=False)] for i in range(17, 32)
    ]
    assert resent[16] == [b"M", *V02C.client_answer(SVC, [], final=True)]
    retry(core)
    assert take(core) == []  # that stream has ended: nothing to top up
    assert not stalled(core)
    stats = core.statistics()
    assert (stats.streams.open, stats.dropped_replies, stats.partials) == (0, 0, 32)
    # MDP/0.1 clients get no parts (their requests carry no option).
    feed(core, b"M1", V01C.client_request(SVC, [b"q"]))
    [given_] = take(core)
    assert parse(given_[1:])[0] == Request(SVC, b"M1", (), (b"q",))


def test_mdp_writers_parts_reach_a_dcp_reader() -> None:
    """Rule ST4: a Majordomo worker's partials, forwarded as they come; a cancel stops them."""
    core = BrokerCore()
    feed(core, b"W", V02W.worker_ready(SVC))
    feed(core, b"C", serialize(Request(SVC, None, meta(), (b"q",))))
    take(core)
    feed(core, b"W", V02W.worker_answer(b"C", [b"0"], final=False))
    assert take(core) == [to_client(b"0")]
    feed(core, b"C", from_reader(StreamType.CREDIT, 1))  # nothing to tell an MDP worker
    feed(core, b"C", from_reader(StreamType.CANCEL))
    feed(core, b"W", V02W.worker_answer(b"C", [b"1"], final=False))
    assert take(core) == []
    feed(core, b"W", V02W.worker_answer(b"X", [b"1"], final=False))  # holds nothing for X
    assert core.statistics().rejections["partial_dropped"] == 2


def test_parts_under_a_guard_carry_sealed_addresses() -> None:
    core = BrokerCore(guard=Guard(lambda key, service: True, b"s" * 32))
    core.receive([b"W", *serialize(Register(SVC))], 0.0, "kw")
    core.receive([b"C", *serialize(Request(SVC, None, meta(), (b"q",)))], 0.0, "kc")
    [_echo, given_] = take(core)
    msg = parse(given_[1:])[0]
    assert isinstance(msg, Request)
    sealed = msg.client
    assert sealed is not None and sealed != b"C"
    core.receive([b"W", *wire.build(StreamType.PARTIAL, sealed, meta(), (b"0",))], 0.0, "kw")
    assert take(core) == [to_client(b"0")]
    core.receive([b"C", *from_reader(StreamType.CREDIT, 1)], 0.0, "kc")
    assert take(core) == [[b"W", *wire.build(StreamType.CREDIT, sealed, meta(), credit=1)]]
    core.receive([b"W", *wire.build(StreamType.PARTIAL, b"forged", meta(), (b"0",))], 0.0, "kw")
    assert take(core) == []
    assert core.statistics().rejections == {"bad_client_address": 1}


def test_mdp01_readers_get_no_parts_and_lost_streams_spare_other_requests() -> None:
    core = BrokerCore()
    feed(core, b"W", V02W.worker_ready(SVC))
    feed(core, b"M1", V01C.client_request(SVC, [b"q"]))
    take(core)
    feed(core, b"W", V02W.worker_answer(b"M1", [b"0"], final=False))
    assert take(core) == []
    assert core.statistics().rejections == {"partial_dropped": 1}
    # A DCP worker holding a stream with parts and a plain request: only the plain one
    # is redelivered when it goes away.
    core = started()
    feed(core, b"W", part(b"0"))
    feed(core, b"W", serialize(Ping()))  # ask for one more
    feed(core, b"C2", serialize(Request(SVC, None, (b"plain",), (b"x",))))
    take(core)
    core.expire(100.0)
    stats = core.statistics()
    assert (stats.redeliveries, stats.streams.broken) == (1, 1)


def test_held_parts_pause_the_worker_until_a_retry_goes_out_whole() -> None:
    """Rule ST3 in detail: credit comes back only after a whole retry; a client that is gone
    cancels; holding is bounded."""
    core = BrokerCore()
    feed(core, b"W", serialize(Register(SVC)))
    feed(core, b"M", V02C.client_request(SVC, [b"q"]))
    take(core)
    option = (wire.stream_option(32),)

    def worker_part(i: int) -> None:
        feed(core, b"W", wire.build(StreamType.PARTIAL, b"M", option, (b"%d" % i,)))

    for i in range(10):
        worker_part(i)
    first = take(core)
    core.undeliverable(first[5], "full")
    for frames in first[6:]:
        core.undeliverable(frames, "gone")  # the rest of that flush, in order
    retry(core)
    assert take(core) == first[5:]
    for i in range(10, 20):
        worker_part(i)  # while the retry's fate is unknown: sent, but no credit yet
    assert len(take(core)) == 10
    retry(core)  # the retry went out whole: credit again (20 used, 12 left -> 32)
    assert take(core) == [[b"W", *wire.build(StreamType.CREDIT, b"M", option, credit=20)]]
    # A client that is gone: its streams are cancelled.
    core.undeliverable([b"M", *V02C.client_answer(SVC, [b"x"], final=False)], "gone")
    assert take(core) == [[b"W", *wire.build(StreamType.CANCEL, b"M", option)]]
    assert core.statistics().dropped_replies == 1
    # Bounded: a worker without credit (an MDP one) fills the hold; then parts are dropped.
    core = BrokerCore()
    feed(core, b"W", V02W.worker_ready(SVC))
    feed(core, b"M", V02C.client_request(SVC, [b"q"]))
    take(core)
    core.undeliverable([b"M", *V02C.client_answer(SVC, [b"x"], final=False)], "full")
    for i in range(MAX_HELD):  # one held already: the last one is dropped
        feed(core, b"W", V02W.worker_answer(b"M", [b"%d" % i], final=False))
    assert take(core) == []
    assert core.statistics().rejections["partial_dropped"] == 1
    retry(core)
    assert len(take(core)) == MAX_HELD
    core.undeliverable([b"M", *V02C.client_answer(SVC, [b"x"], final=False)], "full")
    for _ in range(MAX_HELD + 1):  # the driver's rest of a flush, past the bound
        core.undeliverable([b"M", *V02C.client_answer(SVC, [b"y"], final=False)], "gone")
    assert core.statistics().rejections["partial_dropped"] == 3
    # A full DCP reader is not held: its stream is cancelled.
    core = started()
    feed(core, b"W", part(b"0"))
    [frames] = take(core)
    core.undeliverable(frames, "full")
    assert take(core) == [to_worker(StreamType.CANCEL)]
    assert not stalled(core)
