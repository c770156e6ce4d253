"""The sans-IO request tracker, driven by hand with explicit ``now`` (no sockets, no sleeps)."""

from __future__ import annotations

import ast
import inspect
import math
import pickle
import random
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcp._core.client.tracker as tracker_module
from dcp import BrokerUnreachable, LocalProtocolError, NoWorkers, RemoteError, RequestTimeout
from dcp._core.client.calls import Timing
from dcp._core.client.events import TimedOut
from dcp._core.client.tracker import RequestTracker
from dcp._models import Response
from dcp.wire.dcp1 import parse, serialize
from dcp.wire.messages import Ping, Reply, Request, error_reply_data
from dcp.wire.options import (
    OPTION_PREFIX,
    REQUEST_ID_PREFIX,
    expires_in_option,
    request_expires_in,
)
from tests.helpers import take_tracker as take


def reply_frames(
    request_frames: list[bytes], *data: bytes, client: bytes | None = b"client-addr"
) -> list[bytes]:
    """What a worker (through the broker) sends back for ``request_frames``."""
    req, _ = parse(request_frames)
    assert isinstance(req, Request)
    return serialize(Reply(client, req.metadata, data))


def request(
    t: RequestTracker,
    service: bytes,
    data: Sequence[bytes],
    now: float,
    *,
    metadata: Sequence[bytes] = (),
    timeout: float | None = None,
    attempt_timeout: float | None = None,
    retries: int | None = None,
) -> tuple[bytes, list[bytes]]:
    """Start a request: its id and the frames it put in the outbox."""
    timing = t.timing(timeout, attempt_timeout, retries)
    rid = t.request(service, data, now, metadata=metadata, timing=timing)
    (frames,) = take(t)
    return rid, frames


class Expired(NamedTuple):
    """What :meth:`RequestTracker.expire` did: frames it put in the outbox, and the requests
    it ended (its events, as ``(id, error)``)."""

    resend: list[list[bytes]]
    failed: list[tuple[bytes, RequestTimeout]]


def expire(t: RequestTracker, now: float) -> Expired:
    t.expire(now)
    out, events = t.drain()
    return Expired(out, [(e.request_id, e.error) for e in events])


def make(**options: object) -> RequestTracker:
    """A tracker whose attempts have 1 s each, with no overall limit and no probe: the
    retry schedule alone (the whole-call limit, expiry options and probes have their own
    tests)."""
    defaults: dict[str, object] = {
        "timeout": math.inf,
        "attempt_timeout": 1.0,
        "probe": False,
        "retries": 2,
        "backoff": 0.5,
        "jitter": 0.0,
        "rng": random.Random(1),
    }
    defaults.update(options)
    return RequestTracker(**defaults)  # type: ignore[arg-type]


def test_request_frames_carry_the_id_first_then_user_metadata() -> None:
    t = make(id_prefix=b"ABCDEFGH")
    rid, frames = request(t, b"echo", [b"x", b""], 0.0, metadata=[b"m1", b"m2"])
    assert rid == REQUEST_ID_PREFIX + b"ABCDEFGH" + (1).to_bytes(8, "big")
    req, width = parse(frames)
    assert width == 1
    assert req == Request(b"echo", None, (rid, b"m1", b"m2"), (b"x", b""))
    rid2, _ = request(t, b"echo", [], 0.0)
    assert rid2 == REQUEST_ID_PREFIX + b"ABCDEFGH" + (2).to_bytes(8, "big")


def test_outbox_keeps_what_to_send_in_order_until_the_driver_drains_it() -> None:
    t = make(retries=1, backoff=0.0)
    rid1 = t.request(b"s", [b"1"], 0.0)
    rid2 = t.request(b"s", [b"2"], 0.0, timing=t.timing(retries=0))
    first, second = t.outbox
    t.expire(1.0)  # rid1 is resent (no backoff), rid2 fails
    assert [e.request_id for e in t.events] == [rid2]
    assert t.receive(reply_frames(first, b"ok")) == (rid1, Response((b"ok",)))
    assert t.outbox[:2] == [first, second]  # receiving sends nothing
    # The resend: the same request, now with the time left (its last attempt's 1 s).
    assert t.outbox[2] == [*first[:6], expires_in_option(1.0), *first[6:]]
    out, events = t.drain()
    assert len(out) == 3 and t.outbox == []
    assert [e.request_id for e in events] == [rid2] and t.events == []


def test_ids_are_unique_and_prefixes_differ_per_tracker() -> None:
    a, b = RequestTracker(), RequestTracker()
    ids = {request(a, b"s", [], 0.0)[0] for _ in range(1000)}
    ids |= {request(b, b"s", [], 0.0)[0] for _ in range(1000)}
    assert len(ids) == 2000
    assert all(len(i) == 24 and i.startswith(REQUEST_ID_PREFIX) for i in ids)


def test_reply_completes_with_data_and_user_metadata() -> None:
    t = make()
    rid, frames = request(t, b"echo", [b"in"], 0.0, metadata=[b"meta"])
    assert t.receive(reply_frames(frames, b"out", b"")) == (
        rid,
        Response((b"out", b""), (b"meta",)),
    )
    assert not t.is_pending(rid)
    assert t.next_deadline() is None
    s = t.statistics()
    assert (s.requests, s.replies, s.pending) == (1, 1, 0)


def test_reply_without_client_address_also_matches() -> None:
    t = make()
    rid, frames = request(t, b"echo", [b"in"], 0.0)
    assert t.receive(reply_frames(frames, b"out", client=None)) == (rid, Response((b"out",)))


def test_error_reply_becomes_remote_error() -> None:
    t = make()
    rid, frames = request(t, b"echo", [], 0.0)
    resolved = t.receive(reply_frames(frames, *error_reply_data("queue_full", "too much: é")))
    assert resolved is not None
    assert resolved[0] == rid
    err = resolved[1]
    assert isinstance(err, RemoteError)
    assert (err.code, err.message) == ("queue_full", "too much: é")
    assert t.statistics().errors == 1
    assert t.statistics().replies == 0


def test_replies_out_of_order_match_their_requests() -> None:
    t = make()
    sent = [request(t, b"s", [str(i).encode()], 0.0) for i in range(50)]
    rng = random.Random(7)
    rng.shuffle(sent)
    for rid, frames in sent:
        req, _ = parse(frames)
        assert isinstance(req, Request)
        assert t.receive(reply_frames(frames, req.data[0] + b"!")) == (
            rid,
            Response((req.data[0] + b"!",)),
        )
    assert len(t) == 0


def test_duplicate_late_and_unknown_replies_are_counted_and_dropped() -> None:
    t = make()
    _, f1 = request(t, b"s", [], 0.0)
    rid2, f2 = request(t, b"s", [], 0.0)
    rid3, f3 = request(t, b"s", [], 0.0, retries=0)
    assert t.receive(reply_frames(f1, b"a")) is not None
    assert t.receive(reply_frames(f1, b"a")) is None  # duplicate
    assert t.cancel(rid2)
    assert t.receive(reply_frames(f2, b"b")) is None  # late (cancelled)
    assert expire(t, 1.0).failed[0][0] == rid3
    assert t.receive(reply_frames(f3, b"c")) is None  # late (timed out)
    other = RequestTracker()
    _, foreign = request(other, b"s", [], 0.0)
    assert t.receive(reply_frames(foreign, b"d")) is None  # unknown
    s = t.statistics()
    assert (s.duplicates, s.late, s.unknown, s.cancelled, s.timeouts) == (1, 2, 1, 1, 1)
    assert (s.replies, s.pending) == (1, 0)


def test_finished_id_memory_is_bounded() -> None:
    t = make(remember=3)
    sent = [request(t, b"s", [], 0.0) for _ in range(5)]
    for _, frames in sent:
        assert t.receive(reply_frames(frames)) is not None
    assert len(t._finished) == 3
    assert len(t._finished_order) == 3
    for _, frames in sent:
        assert t.receive(reply_frames(frames)) is None
    s = t.statistics()
    # The two oldest are forgotten: unknown, not duplicates.
    assert (s.duplicates, s.unknown) == (3, 2)


def test_remember_zero_counts_everything_unknown() -> None:
    t = make(remember=0)
    _, frames = request(t, b"s", [], 0.0)
    assert t.receive(reply_frames(frames)) is not None
    assert t.receive(reply_frames(frames)) is None
    assert t.statistics().unknown == 1


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"x"], "too_few_frames"),
        ([b"junk", b"DGBX\x01", b"\x05", b"", b"id", b""], "missing_envelope_delimiter"),
        ([b"", b"HTTP/", b"\x05"], "bad_protocol_frame"),
        ([b"", b"DGBX\x02", b"\x05"], "unsupported_version"),
        ([b"", b"DGBX\x01", b"\x09"], "unknown_message_type"),
        ([b"", b"DGBX\x01", b"\x05", b"", b"id"], "missing_metadata_delimiter"),
        (serialize(Ping()), "not_a_reply"),
        (serialize(Reply(None, (), (b"data",))), "missing_request_id"),
    ],
)
def test_malformed_messages_are_counted_by_reason(frames: list[bytes], reason: str) -> None:
    t = make()
    rid, _ = request(t, b"s", [], 0.0)
    assert t.receive(frames) is None
    assert t.statistics().malformed == {reason: 1}
    assert t.is_pending(rid)


def test_count_malformed_from_the_driver() -> None:
    t = make()
    t.count_malformed("too_many_frames")
    t.count_malformed("too_many_frames")
    assert t.statistics().malformed == {"too_many_frames": 2}


def test_timeout_retry_schedule_without_jitter() -> None:
    # timeout 1 s per attempt, 2 retries, backoff 0.5 s doubling.
    t = make()
    rid, frames = request(t, b"s", [b"x"], 10.0)
    assert t.next_deadline() == 11.0
    assert expire(t, 10.999) == ([], [])
    assert expire(t, 11.0) == ([], [])  # attempt 1 timed out: wait 0.5 s
    assert t.next_deadline() == 11.5
    assert expire(t, 11.5) == ([frames], [])  # attempt 2, same frames (same id)
    assert t.next_deadline() == 12.5
    assert expire(t, 12.5) == ([], [])  # wait 1.0 s
    assert t.next_deadline() == 13.5
    # Attempt 3, the last: its end is known, so it carries the time left (Rule RT4).
    assert expire(t, 13.5) == ([[*frames[:6], expires_in_option(1.0), *frames[6:]]], [])
    assert t.next_deadline() == 14.5
    resend, failed = expire(t, 14.5)
    assert resend == []
    assert [r for r, _ in failed] == [rid]
    assert isinstance(failed[0][1], RequestTimeout)
    assert "(3 attempts sent)" in str(failed[0][1])  # Rule RT7
    assert t.next_deadline() is None
    s = t.statistics()
    assert (s.retries, s.timeouts, s.pending) == (2, 1, 0)


def test_reply_during_backoff_completes_the_request() -> None:
    t = make()
    rid, frames = request(t, b"s", [], 0.0)
    expire(t, 1.0)  # now waiting 0.5 s before the resend
    assert t.receive(reply_frames(frames, b"slow")) == (rid, Response((b"slow",)))
    assert expire(t, 100.0) == ([], [])
    assert t.statistics().retries == 0


def test_reply_to_first_attempt_after_resend_then_duplicate() -> None:
    t = make()
    rid, frames = request(t, b"s", [], 0.0)
    expire(t, 1.0)
    assert expire(t, 1.5).resend == [frames]
    assert t.receive(reply_frames(frames, b"first")) == (rid, Response((b"first",)))
    assert t.receive(reply_frames(frames, b"second")) is None
    assert t.statistics().duplicates == 1


def test_per_request_timeout_and_retries_override_defaults() -> None:
    t = make()
    request(t, b"s", [], 0.0, timeout=0.25, retries=0)
    assert t.next_deadline() == 0.25
    assert len(expire(t, 0.25).failed) == 1


def test_infinite_timeout_never_expires() -> None:
    t = make()
    rid, frames = request(t, b"s", [], 0.0, timeout=math.inf, attempt_timeout=math.inf)
    assert t.next_deadline() is None
    assert not any(f.startswith(OPTION_PREFIX + b"expires-in") for f in frames)
    assert expire(t, 1e12) == ([], [])
    assert t.is_pending(rid)


def test_backoff_grows_and_is_capped() -> None:
    t = make(backoff=0.1, backoff_factor=3.0, backoff_max=1.0)
    assert [t.backoff_delay(k) for k in range(1, 6)] == pytest.approx([0.1, 0.3, 0.9, 1.0, 1.0])


def test_jitter_stays_within_bounds_and_is_deterministic() -> None:
    a = make(backoff=0.2, backoff_max=3.0, jitter=0.5, rng=random.Random(42))
    b = make(backoff=0.2, backoff_max=3.0, jitter=0.5, rng=random.Random(42))
    delays = []
    for k in range(1, 9):
        cap = min(3.0, 0.2 * 2 ** (k - 1))
        for _ in range(200):
            d = a.backoff_delay(k)
            assert cap * 0.5 < d <= cap
            assert d == b.backoff_delay(k)
            delays.append(d / cap)
    # The jitter really spreads the delays over its range.
    assert min(delays) < 0.55
    assert max(delays) > 0.95


def test_full_jitter_never_gives_a_negative_delay() -> None:
    t = make(backoff=1.0, jitter=1.0, rng=random.Random(3))
    assert all(0 < t.backoff_delay(1) <= 1.0 for _ in range(1000))


def test_jittered_schedule_uses_the_injected_rng() -> None:
    t = make(jitter=0.5, rng=random.Random(9))
    expected_delay = 0.5 * (1 - 0.5 * random.Random(9).random())
    request(t, b"s", [], 0.0)
    expire(t, 1.0)
    assert t.next_deadline() == pytest.approx(1.0 + expected_delay)


def test_cancel_forgets_at_once() -> None:
    t = make()
    rid, _ = request(t, b"s", [], 0.0)
    assert t.cancel(rid)
    assert not t.cancel(rid)
    assert not t.is_pending(rid)
    assert t.next_deadline() is None  # stale heap entry skipped
    assert expire(t, 100.0) == ([], [])
    assert t.statistics().cancelled == 1


def test_cancel_all() -> None:
    t = make()
    rids = [request(t, b"s", [], 0.0)[0] for _ in range(5)]
    assert sorted(t.cancel_all()) == sorted(rids)
    assert len(t) == 0
    assert t.next_deadline() is None


def test_deadline_heap_stays_bounded_with_lazy_deletion() -> None:
    t = make()
    keep = [request(t, b"s", [], 0.0) for _ in range(10)]
    for i in range(20_000):
        _, frames = request(t, b"s", [], float(i))
        assert t.receive(reply_frames(frames)) is not None
        assert len(t._heap) <= 2 * (len(t) + 1) + 1024
    # The long-lived requests still expire on time after all the rebuilds.
    assert t.next_deadline() == 1.0
    assert len(expire(t, 1.0).resend) == 0
    assert t.next_deadline() == 1.5
    assert len(expire(t, 1.5).resend) == len(keep)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="timeout"):
        RequestTracker(timeout=0)
    with pytest.raises(ValueError, match="timeout"):
        RequestTracker(timeout=math.nan)
    with pytest.raises(ValueError, match="retries"):
        RequestTracker(retries=-1)
    with pytest.raises(ValueError, match="jitter"):
        RequestTracker(jitter=1.5)
    with pytest.raises(ValueError, match="backoff"):
        RequestTracker(backoff_factor=0.5)
    with pytest.raises(ValueError, match="remember"):
        RequestTracker(remember=-1)
    with pytest.raises(ValueError, match="id_prefix"):
        RequestTracker(id_prefix=b"short")
    t = RequestTracker()
    with pytest.raises(ValueError, match="timeout"):
        request(t, b"s", [], 0.0, timeout=-1)
    with pytest.raises(ValueError, match="retries"):
        request(t, b"s", [], 0.0, retries=-1)
    with pytest.raises(LocalProtocolError):
        request(t, b"s", [], 0.0, metadata=[b""])
    assert len(t) == 0


def test_random_simulation_resolves_every_request_exactly_once() -> None:
    """A lossy, duplicating, reordering network: each request ends exactly once."""
    rng = random.Random(2024)
    t = RequestTracker(timeout=1.0, retries=3, backoff=0.1, rng=random.Random(5))
    now = 0.0
    wire: list[list[bytes]] = []  # replies in flight, in random order
    outcomes: dict[bytes, object] = {}
    started: set[bytes] = set()
    cancelled: set[bytes] = set()
    for _ in range(20_000):
        now += rng.random() * 0.05
        op = rng.random()
        if op < 0.2:
            rid, frames = request(t, b"s", [b"%d" % len(started)], now)
            started.add(rid)
            if rng.random() < 0.7:  # not lost
                wire.append(reply_frames(frames, b"ok"))
        elif op < 0.25 and started:
            rid = rng.choice(sorted(started))
            if t.cancel(rid):
                cancelled.add(rid)
        elif op < 0.6 and wire:
            frames = wire.pop(rng.randrange(len(wire)))
            if rng.random() < 0.2:  # duplicated on the way
                wire.append(frames)
            resolved = t.receive(frames)
            if resolved is not None:
                assert resolved[0] not in outcomes
                outcomes[resolved[0]] = resolved[1]
        else:
            resend, failed = expire(t, now)
            for rid, exc in failed:
                assert rid not in outcomes
                outcomes[rid] = exc
            for frames in resend:
                if rng.random() < 0.7:
                    wire.append(reply_frames(frames, b"ok"))
    # Drain: everything pending ends by timeout, the rest of the wire is dropped.
    while t.next_deadline() is not None:
        now = max(now, t.next_deadline() or now)
        for rid, exc in expire(t, now).failed:
            outcomes[rid] = exc
    assert len(t) == 0
    assert set(outcomes) | cancelled == started
    assert not set(outcomes) & cancelled
    s = t.statistics()
    assert s.requests == len(started)
    assert s.replies + s.timeouts + s.cancelled == len(started)
    assert s.duplicates > 0
    assert s.late > 0
    assert s.retries > 0


# ---------------------------------------------------------------- whole-call timeout (issue 15)


def _expires_in(frames: list[bytes]) -> float | None:
    req, _ = parse(frames)
    assert isinstance(req, Request)
    return request_expires_in(req.metadata)


def test_timing_defaults_split_the_call_among_its_attempts() -> None:
    t = RequestTracker()
    assert t.timing() == Timing(30.0, 10.0, 2)  # the documented defaults
    assert t.timing(timeout=8.0, retries=3) == Timing(8.0, 2.0, 3)
    assert t.timing(timeout=8.0, attempt_timeout=5.0) == Timing(8.0, 5.0, 2)
    assert t.timing(timeout=math.inf) == Timing(math.inf, math.inf, 2)
    t2 = RequestTracker(timeout=6.0, attempt_timeout=1.5, retries=1)
    assert t2.timing() == Timing(6.0, 1.5, 1)
    assert t2.timing(timeout=60.0) == Timing(60.0, 1.5, 1)  # the client's attempt_timeout
    with pytest.raises(ValueError, match="attempt_timeout must be > 0"):
        t.timing(attempt_timeout=0)
    with pytest.raises(ValueError, match="attempt_timeout must be > 0"):
        RequestTracker(attempt_timeout=-1.0)


def test_timeout_bounds_the_whole_call_and_each_attempt_carries_the_time_left() -> None:
    # 3 s in all, attempts of 1 s, backoff 0.5 s then 1 s: the third attempt never starts.
    t = make(timeout=3.0, attempt_timeout=None, retries=2)
    rid, frames = request(t, b"s", [b"x"], 10.0)
    assert _expires_in(frames) == 3.0
    assert t.deadline_of(rid) == 11.0
    assert expire(t, 11.0) == ([], [])  # attempt 1 timed out: wait 0.5 s
    [resend] = expire(t, 11.5).resend
    assert _expires_in(resend) == 1.5  # what is left of the 3 s
    assert parse(resend)[0] == Request(b"s", None, (rid, expires_in_option(1.5)), (b"x",))
    assert t.next_deadline() == 12.5
    assert expire(t, 12.5) == ([], [])  # attempt 2 timed out: the 1 s backoff outlasts the call
    assert t.next_deadline() == 13.0
    resend_, failed = expire(t, 13.0)
    assert resend_ == []
    assert [r for r, _ in failed] == [rid]
    assert type(failed[0][1]) is RequestTimeout
    # Rule RT7: the time waited and the attempts sent (not "3 attempts of 1 s"), and nothing
    # was ever heard from the broker.
    assert str(failed[0][1]) == (
        "no reply after 3s (2 attempts sent); nothing heard from the endpoint: "
        "is a dcp broker running there?"
    )
    s = t.statistics()
    assert (s.retries, s.timeouts, s.no_workers, s.pending) == (1, 1, 0, 0)


def test_the_last_attempt_ends_the_call_when_it_ends_first() -> None:
    t = make(timeout=100.0, attempt_timeout=1.0, retries=1)
    rid, frames = request(t, b"s", [], 0.0)
    assert _expires_in(frames) == 100.0  # a resend may come: the call's deadline
    expire(t, 1.0)
    [resend] = expire(t, 1.5).resend
    assert _expires_in(resend) == 1.0  # the last attempt: the call ends with it
    assert [r for r, _ in expire(t, 2.5).failed] == [rid]


def test_each_first_attempt_carries_the_time_left_of_its_own_limits() -> None:
    """Rule RT4 for first attempts made one after the other, at different times, with the
    same limits (the tracker reuses the option) and with other limits."""
    t = make(timeout=3.0, attempt_timeout=None, retries=0)
    got = [_expires_in(request(t, b"s", [], now)[1]) for now in (0.0, 12345.678, 7e6)]
    assert got == [3.0, 3.0, 3.0]
    assert _expires_in(request(t, b"s", [], 8.0, timeout=0.25)[1]) == 0.25
    assert _expires_in(request(t, b"s", [], 9.0, timeout=5.0, retries=1)[1]) == 5.0
    assert _expires_in(request(t, b"s", [], 9.5, attempt_timeout=0.5)[1]) == 0.5  # its end
    assert _expires_in(request(t, b"s", [], 10.0)[1]) == 3.0
    t2 = make(timeout=math.inf, retries=1)
    assert _expires_in(request(t2, b"s", [], 0.0)[1]) is None  # no end: no option
    assert _expires_in(request(t2, b"s", [], 1.0, timeout=2.0)[1]) == 2.0


def _probe_of(frames: list[bytes]) -> Request:
    req, _ = parse(frames)
    assert isinstance(req, Request)
    assert req.service == b"mmi.service"
    return req


def _answer(probe_frames: list[bytes], code: bytes) -> list[bytes]:
    return reply_frames(probe_frames, code)


@pytest.mark.parametrize(("answer", "error"), [(b"404", NoWorkers), (b"200", RequestTimeout)])
def test_a_probe_before_the_end_tells_no_workers_from_a_timeout(
    answer: bytes, error: type[RequestTimeout]
) -> None:
    t = make(timeout=20.0, attempt_timeout=None, retries=0, probe=True)
    rid, _ = request(t, b"echo", [b"x"], 0.0)
    assert t.next_deadline() == 19.0  # the probe: min(1 s, 10% of 20 s) before the end
    [probe] = expire(t, 19.0).resend
    req = _probe_of(probe)
    assert req.data == (b"echo",)
    assert req.metadata[0].startswith(REQUEST_ID_PREFIX) and req.metadata[0] != rid
    assert request_expires_in(req.metadata) == 1.0
    assert t.receive(_answer(probe, answer)) is None  # it completes nothing
    assert t.is_pending(rid)
    assert t.next_deadline() == 20.0
    [(failed_rid, exc)] = expire(t, 20.0).failed
    assert failed_rid == rid
    assert type(exc) is error
    s = t.statistics()
    assert s.probes == 1
    assert (s.timeouts, s.no_workers) == ((0, 1) if error is NoWorkers else (1, 0))
    if error is NoWorkers:
        assert isinstance(exc, NoWorkers)
        assert exc.service == b"echo"
        assert str(exc) == (
            "no worker serves 'echo' (the broker says so; no reply after 20s (1 attempt sent))"
        )
    else:  # Rule RT7: the broker is there, and so is a worker
        assert str(exc) == (
            "no reply after 20s (1 attempt sent); the broker answers, and a worker serves "
            "'echo': it did not reply in time"
        )
    assert (s.unknown, s.late, s.duplicates) == (0, 0, 0)


def test_a_request_answered_meanwhile_makes_its_probe_answer_late() -> None:
    t = make(timeout=1.0, attempt_timeout=None, retries=0, probe=True)
    rid, frames = request(t, b"echo", [], 0.0)
    [probe] = expire(t, 0.9).resend  # 10% of 1 s before the end
    assert t.receive(reply_frames(frames, b"ok")) == (rid, Response((b"ok",)))
    assert t.receive(_answer(probe, b"404")) is None
    assert t.statistics().late == 1
    assert t.next_deadline() is None


def test_no_probe_for_mmi_services_without_an_end_or_when_off() -> None:
    for tracker, service, timeout in [
        (make(timeout=1.0, attempt_timeout=None, retries=0, probe=True), b"mmi.service", 1.0),
        (make(timeout=math.inf, attempt_timeout=math.inf, probe=True), b"s", math.inf),
        (make(timeout=1.0, attempt_timeout=None, retries=0, probe=False), b"s", 1.0),
    ]:
        request(tracker, service, [], 0.0)
        if timeout < math.inf:
            assert tracker.next_deadline() == timeout
            assert expire(tracker, timeout).resend == []
        assert tracker.statistics().probes == 0


def test_a_no_workers_error_reply_is_no_workers() -> None:
    t = make()
    rid, frames = request(t, b"echo", [], 0.0)
    reply = reply_frames(frames, *error_reply_data("no_workers", "nobody serves it"))
    result = t.receive(reply)
    assert result is not None
    got_rid, exc = result
    assert got_rid == rid
    assert isinstance(exc, NoWorkers) and isinstance(exc, RequestTimeout)
    assert str(exc) == "no worker serves 'echo': nobody serves it"
    s = t.statistics()
    assert (s.no_workers, s.errors, s.timeouts) == (1, 0, 0)


def test_no_workers_pickles() -> None:
    exc = NoWorkers(b"echo", "no worker serves 'echo'")
    copy = pickle.loads(pickle.dumps(exc))
    assert (type(copy), copy.service, str(copy)) == (NoWorkers, b"echo", str(exc))


# ---------------------------------------------------------------- the core contract


def test_the_tracker_follows_the_core_contract() -> None:
    """:mod:`dcp._core`: frames to ``outbox``, decided outcomes to ``events`` (frozen values),
    both taken by ``drain()``; ``expire(now)`` answers nothing; ``next_deadline()`` says when
    it next has something to do; a method's own answer is its return value."""
    t = make(retries=1, backoff=0.0)
    assert t.drain() == ([], ()) and t.next_deadline() is None
    rid = t.request(b"s", [b"x"], 0.0)
    assert isinstance(rid, bytes)  # request()'s own answer: the id, not in the lists
    assert t.events == [] and len(t.outbox) == 1
    assert all(type(f) is bytes for f in t.outbox[0])
    quick = t.request(b"s", [b"y"], 0.0, timing=t.timing(retries=0))
    (first, second), events = t.drain()
    assert not events and t.outbox == [] and t.events == []
    assert t.next_deadline() == 1.0
    assert inspect.signature(RequestTracker.expire).return_annotation == "None"
    t.expire(0.999)  # nothing is due before next_deadline()
    assert t.drain() == ([], ())
    t.expire(1.0)  # rid is resent, quick ends: in the lists, not returned
    out, events = t.drain()
    assert [f[-1] for f in out] == [b"x"]
    assert events == [TimedOut(quick, events[0].error)]
    assert isinstance(events[0].error, RequestTimeout)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        events[0].request_id = b"other"
    # receive()'s own answer is its return value; it puts nothing in the lists.
    assert t.receive(reply_frames(first, b"ok")) == (rid, Response((b"ok",)))
    assert t.receive(reply_frames(second, b"late")) is None
    assert t.drain() == ([], ()) and t.next_deadline() is None
    assert (t.statistics().replies, t.statistics().late) == (1, 1)


@settings(deadline=None)  # a loaded machine must not fail it
@given(st.lists(st.binary(max_size=12), max_size=12))
def test_nothing_from_the_network_raises_out_of_the_tracker(frames: list[bytes]) -> None:
    t = make()
    t.request(b"s", [], 0.0)
    t.drain()
    for message in (frames, [b"", *frames], [b"", b"DGBX\x01", b"\x03", *frames]):
        assert t.receive(message) is None
    assert t.drain() == ([], ())
    assert sum(t.statistics().malformed.values()) + t.statistics().unknown == 3


def test_the_client_core_reads_no_clock_and_does_no_io() -> None:
    """The contract's "does NOT do": no module of :mod:`dcp._core.client` imports a clock,
    sockets, threads, an event loop or logging."""
    banned = {"anyio", "asyncio", "logging", "socket", "threading", "time", "trio", "zmq"}
    package = Path(tracker_module.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            assert not {n.split(".")[0] for n in names} & banned, (path.name, names)


def test_a_timeout_says_whether_the_broker_was_ever_heard() -> None:
    """Rule RT7: nothing ever heard names the endpoint; heard before, but the probe unanswered,
    says the broker did not answer it either."""
    t = make(timeout=20.0, attempt_timeout=None, retries=0, probe=True)
    t.endpoint = "tcp://broker:5555"
    request(t, b"echo", [b"x"], 0.0)
    expire(t, 19.0)  # the probe, never answered
    [(_, exc)] = expire(t, 20.0).failed
    assert str(exc) == (
        "no reply after 20s (1 attempt sent); nothing heard from tcp://broker:5555: "
        "is a dcp broker running there?"
    )
    _, frames = request(t, b"echo", [b"x"], 30.0)
    assert t.receive(reply_frames(frames, b"ok")) is not None  # the broker was there
    request(t, b"echo", [b"x"], 40.0)
    expire(t, 59.0)
    [(_, exc)] = expire(t, 60.0).failed
    assert str(exc) == (
        "no reply after 20s (1 attempt sent); no answer from the broker at "
        "tcp://broker:5555 to mmi.service either"
    )


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("timeout", [30.0, math.inf])
def test_a_request_is_the_frames_serialize_gives(width: int, timeout: float) -> None:
    """Requests are built from the tracker's template: the same frames as the message."""
    t = RequestTracker(type_width=width, timeout=timeout, retries=0)
    rid, frames = request(t, b"svc", [b"a", b"", b"c"], 1.0, metadata=[b"m1", b"m2"])
    head = (rid, expires_in_option(timeout)) if timeout < math.inf else (rid,)
    want = Request(b"svc", None, (*head, b"m1", b"m2"), (b"a", b"", b"c"))
    assert frames == serialize(want, width=width)


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("client", [b"client-addr", None])
def test_replies_read_without_a_message_object_are_what_parse_gives(
    width: int, client: bytes | None
) -> None:
    """The common reply is split by the tracker itself; every other shape goes through
    parse: the outcome is the same."""
    t = RequestTracker()
    opt = OPTION_PREFIX + b"x=1"
    cases = [
        ((b"u1", b"u2"), (b"d", b"")),  # the user's metadata after dcp's options
        ((), ()),
    ]
    for user, data in cases:
        rid, frames = request(t, b"svc", [b"q"], 0.0, metadata=user)
        req, _ = parse(frames)
        assert isinstance(req, Request)
        reply = serialize(Reply(client, req.metadata, data), width=width)
        assert t.receive(reply) == (rid, Response(data, user))
    # An option after the user's first part is the user's (left as it is).
    rid, frames = request(t, b"svc", [b"q"], 0.0, metadata=[b"u", opt], timeout=math.inf)
    req, _ = parse(frames)
    assert isinstance(req, Request)
    reply = serialize(Reply(client, req.metadata, ()), width=width)
    assert t.receive(reply) == (rid, Response((), (b"u", opt)))
    # Options mixed into the user's parts after dcp's own are left out, as before.
    rid, frames = request(t, b"svc", [b"q"], 0.0, metadata=[opt, b"u", opt])
    req, _ = parse(frames)
    assert isinstance(req, Request)
    reply = serialize(Reply(client, req.metadata, ()), width=width)
    assert t.receive(reply) == (rid, Response((), (b"u",)))


def test_malformed_replies_near_the_common_shape_are_counted_by_parse() -> None:
    t = RequestTracker()
    rid, frames = request(t, b"svc", [b"q"], 0.0)
    good = reply_frames(frames, b"d")
    no_delimiter = [f for f in good if f != b""]  # no empty frame anywhere
    no_meta_end = [*good[:5], rid]  # client, "", id: no end of the metadata
    two_addresses = [*good[:3], b"a", b"b", b"", rid, b"", b"d"]
    for frames_ in (no_delimiter, no_meta_end, two_addresses):
        assert t.receive(frames_) is None
    assert sum(t.statistics().malformed.values()) == 3
    assert t.receive(good) == (rid, Response((b"d",), ()))


def test_service_names_given_as_str_are_encoded_once() -> None:
    from dcp._core.client import calls

    assert calls.service_bytes("sérvice") == "sérvice".encode()
    assert calls.service_bytes("sérvice") is calls.service_bytes("sérvice")  # kept
    assert calls.service_bytes(b"raw") == b"raw"
    with pytest.raises(ValueError, match="service is not encodable"):
        calls.service_bytes("\ud800")
    assert "\ud800" not in calls._NAMES
    with pytest.raises(TypeError, match="service must be bytes or str"):
        calls.service_bytes(["x"])  # type: ignore[arg-type]
    before = dict(calls._NAMES)
    try:  # full: still encoded, not kept
        calls._NAMES.update({f"s{i}": b"" for i in range(calls._NAMES_MAX)})
        assert calls.service_bytes("one more") == b"one more"
        assert "one more" not in calls._NAMES
    finally:
        calls._NAMES.clear()
        calls._NAMES.update(before)


def test_an_unreachable_broker_ends_every_pending_request_at_once() -> None:
    """Rule RT9: each pending request ends with a BrokerUnreachable naming the endpoints and
    the refused connection, counted as a timeout; a reply after it is late."""
    t = make(timeout=30.0, attempt_timeout=None, probe=True)
    t.endpoint = "tcp://a:1, ipc:///tmp/b"  # the message's text
    t.endpoints = ("tcp://a:1", "ipc:///tmp/b")  # the error's, one by one
    rid1, frames1 = request(t, b"echo", [b"x"], 0.0)
    rid2, _ = request(t, b"echo", [b"y"], 0.1)
    t.unreachable()
    out, events = t.drain()
    assert out == []
    assert [e.request_id for e in events] == [rid1, rid2]
    for event in events:
        error = event.error
        assert type(error) is BrokerUnreachable
        assert isinstance(error, RequestTimeout)
        assert error.endpoints == ("tcp://a:1", "ipc:///tmp/b")
        assert str(error) == (
            "cannot connect to tcp://a:1, ipc:///tmp/b: connection refused (nothing listens "
            "there): is a dcp broker running there?"
        )
        assert pickle.loads(pickle.dumps(error)).endpoints == error.endpoints
    assert events[0].error is not events[1].error  # one each: raised in different tasks
    assert len(t) == 0 and t.next_deadline() is None
    stats = t.statistics()
    assert stats.timeouts == 2 and stats.pending == 0
    assert t.receive(reply_frames(frames1, b"late")) is None
    assert t.statistics().late == 1
    t.unreachable()  # nothing pending: nothing to do
    assert t.drain() == ([], ())
