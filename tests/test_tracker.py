"""The sans-IO request tracker, driven by hand with explicit ``now`` (no sockets, no sleeps)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import NamedTuple

import pytest

from dcp import LocalProtocolError, RemoteError, RequestTimeout
from dcp._messages import Ping, Reply, Request, error_reply_data
from dcp._tracker import RequestTracker, Response
from dcp.wire.dcp1 import parse, serialize


def reply_frames(
    request_frames: list[bytes], *data: bytes, client: bytes | None = b"client-addr"
) -> list[bytes]:
    """What a worker (through the broker) sends back for ``request_frames``."""
    req, _ = parse(request_frames)
    assert isinstance(req, Request)
    return serialize(Reply(client, req.metadata, data))


def take(t: RequestTracker) -> list[list[bytes]]:
    """Drain the tracker's outbox (the frames its last calls asked to send)."""
    out, t.outbox = t.outbox, []
    return out


def request(
    t: RequestTracker,
    service: bytes,
    data: Sequence[bytes],
    now: float,
    *,
    metadata: Sequence[bytes] = (),
    timeout: float | None = None,
    retries: int | None = None,
) -> tuple[bytes, list[bytes]]:
    """Start a request: its id and the frames it put in the outbox."""
    rid = t.request(service, data, now, metadata=metadata, timeout=timeout, retries=retries)
    (frames,) = take(t)
    return rid, frames


class Expired(NamedTuple):
    """What :meth:`RequestTracker.expire` did: frames it put in the outbox, and its answer."""

    resend: list[list[bytes]]
    failed: list[tuple[bytes, RequestTimeout]]


def expire(t: RequestTracker, now: float) -> Expired:
    failed = t.expire(now)
    return Expired(take(t), failed)


def make(**options: object) -> RequestTracker:
    defaults: dict[str, object] = {
        "timeout": 1.0,
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
    assert rid == b"ABCDEFGH" + (1).to_bytes(8, "big")
    req, width = parse(frames)
    assert width == 1
    assert req == Request(b"echo", None, (rid, b"m1", b"m2"), (b"x", b""))
    rid2, _ = request(t, b"echo", [], 0.0)
    assert rid2 == b"ABCDEFGH" + (2).to_bytes(8, "big")


def test_outbox_keeps_what_to_send_in_order_until_the_driver_drains_it() -> None:
    t = make(retries=1, backoff=0.0)
    rid1 = t.request(b"s", [b"1"], 0.0)
    rid2 = t.request(b"s", [b"2"], 0.0, retries=0)
    first, second = t.outbox
    failed = t.expire(1.0)  # rid1 is resent (no backoff), rid2 fails
    assert [rid for rid, _ in failed] == [rid2]
    assert t.receive(reply_frames(first, b"ok")) == (rid1, Response((b"ok",)))
    assert t.outbox == [first, second, first]  # receiving sends nothing
    out, t.outbox = t.outbox, []
    assert len(out) == 3 and t.outbox == []


def test_ids_are_unique_and_prefixes_differ_per_tracker() -> None:
    a, b = RequestTracker(), RequestTracker()
    ids = {request(a, b"s", [], 0.0)[0] for _ in range(1000)}
    ids |= {request(b, b"s", [], 0.0)[0] for _ in range(1000)}
    assert len(ids) == 2000
    assert all(len(i) == 16 for i in ids)


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
    assert expire(t, 13.5) == ([frames], [])  # attempt 3
    assert t.next_deadline() == 14.5
    resend, failed = expire(t, 14.5)
    assert resend == []
    assert [r for r, _ in failed] == [rid]
    assert isinstance(failed[0][1], RequestTimeout)
    assert "3 attempt(s)" in str(failed[0][1])
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
    rid, _ = request(t, b"s", [], 0.0, timeout=math.inf)
    assert t.next_deadline() is None
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
