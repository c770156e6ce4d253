"""Pub/sub and mc0 under attack, on the pure core with real frames (issue 26, findings 4 and
5): mc0 peer state bounded and forgotten, subscriptions of vanished peers expiring and a
reserve no few peers can fill, subscription buffers and last values within the byte budget,
and fan-out in slices with a request answered between them."""

from __future__ import annotations

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.mc0 import MAX_VERSION
from dcp._core.broker.pubsub import SMALL_PEER
from dcp._core.broker.pubsub_peers import PubSubOptions
from tests.helpers import take

P = b"DGBX\x01"


def dcp_req(
    core: BrokerCore, peer: bytes, name: bytes, meta: list[bytes], data: list[bytes], now: float
) -> list[list[bytes]]:
    core.receive([peer, b"", P, b"\x04", b"\xffDCP:" + name, b"", *meta, b"", *data], now)
    return take(core)


def mc0(core: BrokerCore, peer: bytes, *frames: bytes, now: float = 0.0) -> list[list[bytes]]:
    core.receive([peer, *frames], now)
    return take(core)


def subscribe(
    core: BrokerCore, peer: bytes, sid: bytes, pattern: bytes, *opts: bytes, now: float = 0.0
) -> bytes:
    """The answer's last frame (``ok``, or the error's code is the one before it)."""
    [answer] = dcp_req(core, peer, b"sub", [b"r"], [sid, pattern, b"", *opts], now)
    return answer[-1] if answer[-1] == b"ok" else answer[-2]


# ---------------------------------------------------------------- 4: mc0 CONNECT


def test_mc0_version_is_bounded_charged_and_released() -> None:
    core = BrokerCore(max_memory=1 << 20)
    peers = core.memory.account("peers")
    [error] = mc0(core, b"m", b"CONNECT", b"VERSION", b"v" * 20_000, b"ID", b"1")
    assert error[:2] == [b"m", b"ERROR"] and b"header_too_long" in error[-1]
    assert core.statistics().rejections["header_too_long"] == 1
    assert mc0(core, b"m", b"CONNECT", b"VERSION", b"v" * MAX_VERSION, b"ID", b"2") == [
        [b"m", b"OK", b"ID", b"2"]
    ]
    held = peers.held(b"m")
    assert held >= MAX_VERSION  # its state is charged to the peers account
    assert mc0(core, b"m", b"DISCONNECT") == []
    assert peers.used == 0  # forgotten: released


def test_mc0_peers_account_refuses_a_new_peer_it_has_no_room_for() -> None:
    core = BrokerCore(max_memory=20_000)  # the peers account: 1,000 bytes
    answers = [mc0(core, b"m%d" % i, b"NOOP", b"ID", b"x") for i in range(10)]
    assert answers[0] == [[b"m0", b"OK", b"ID", b"x"]]
    assert any(b"memory_budget" in a[0][-1] for a in answers)
    assert core.memory.account("peers").used <= 1_000


def test_an_mc0_peer_without_ttl_is_probed_when_idle_and_forgotten_when_gone() -> None:
    core = BrokerCore(pubsub=PubSubOptions(mc0_idle=60.0))
    assert mc0(core, b"m", b"CONNECT", b"VERSION", b"0.3") == []
    mc0(core, b"m", b"SUB", b"", b"t1", b"t2", now=10.0)
    assert core.pubsub.subscriptions_of(b"m") == 2
    assert core.next_deadline() == 70.0  # 60 s after it was last heard
    core.expire(70.0)
    [probe] = take(core)
    assert probe == [b"m", b"NOOP"]
    core.undeliverable(probe, "gone")  # it left without DISCONNECT
    assert core.pubsub.subscriptions_of(b"m") == 0
    assert core.memory.account("peers").used == 0
    assert core.next_deadline() is None


# ---------------------------------------------------------------- 5: subscription lockout


def test_vanished_subscribers_cannot_lock_new_ones_out() -> None:
    options = PubSubOptions(max_subscriptions=1000, max_subscriptions_per_peer=100)
    core = BrokerCore(pubsub=options)
    # The attack: 10 peers try to reach their own limit (5 dcp ones asking for the longest
    # timeout, 5 mc0 ones), then fall silent.
    for i in range(5):
        for k in range(100):
            subscribe(core, b"d%d" % i, b"%d" % k, b"x.%d" % k, b"timeout=3600000")
    for i in range(5):
        for k in range(100):
            mc0(core, b"m%d" % i, b"SUB", b"", b"y.%d" % k)
    # The last tenth is kept for peers holding fewer than SMALL_PEER (Rule P7): the last
    # attacker gets only as many.
    assert 900 <= len(core.pubsub) <= 900 + SMALL_PEER
    assert subscribe(core, b"d0", b"more", b"x.more") == b"too_many_subscriptions"
    # A new subscriber of each kind gets in at once.
    assert subscribe(core, b"new", b"s", b"news.>") == b"ok"
    assert mc0(core, b"new-mc0", b"SUB", b"ID", b"1", b"", b"news") == [
        [b"new-mc0", b"OK", b"ID", b"1"]
    ]
    # And the vanished peers' subscriptions do not outlive max_subscription_timeout (dcp)
    # and mc0_idle (mc0: its probe cannot be sent).
    assert dcp_req(core, b"new", b"credit", [b"g"], [b"s", b"1"], 100.0)[0][-1] == b"ok"
    core.expire(options.max_subscription_timeout + 1)
    for frames in take(core):
        if frames[1:] == [b"NOOP"] and frames[0] != b"new-mc0":
            core.undeliverable(frames, "gone")
    assert len(core.pubsub) == 2
    assert core.statistics().rejections["too_many_subscriptions"] >= 80


# ---------------------------------------------------------------- bytes


def test_a_stalled_subscribers_buffer_is_bounded_in_bytes() -> None:
    core = BrokerCore(max_memory=1_000_000)  # subscriptions: 200,000; one peer: 50,000
    buffers = core.memory.account("subscriptions")
    assert buffers.peer_limit == 50_000
    opts = (b"window=1", b"max-pending=1000", b"overflow=drop-oldest")
    assert subscribe(core, b"slow", b"s", b"t", *opts) == b"ok"
    for i in range(200):  # 200 x 1 KB: four times its share
        dcp_req(core, b"pub", b"pub", [], [b"t", b"%04d" % i + b"x" * 1000], 0.0)
    stats = core.pubsub.statistics()
    assert 0 < buffers.held(b"slow") <= 50_000
    assert stats.pending < 60 and stats.lost > 140
    assert stats.pending_bytes == buffers.used
    # It reads again: the gap is told, then the newest survivors, in order.
    answers = dcp_req(core, b"slow", b"credit", [b"g"], [b"s", b"1000"], 1.0)
    assert answers[0][-1] == b"ok"
    gap = answers[1]
    assert gap[6] == b"\xffDCP:gap=s" and int(gap[8]) == stats.lost
    got = [a[9][:4] for a in answers[2:]]
    assert got == [b"%04d" % i for i in range(200 - len(got), 200)]
    assert 0 < buffers.used <= 50_000  # in flight now: charged until granted back
    assert dcp_req(core, b"slow", b"unsub", [b"u"], [b"s"], 1.0)[0][-1] == b"ok"
    assert buffers.used == 0


def test_a_subscriber_that_never_grants_credit_back_holds_its_share_in_flight() -> None:
    # A window of 1,000 lets 1,000 messages go out at once (zmq's queue to it); what is in
    # flight is charged too, so a subscriber that neither reads nor grants holds its share.
    core = BrokerCore(max_memory=1_000_000)
    buffers = core.memory.account("subscriptions")
    opts = (b"window=1000", b"max-pending=100000")
    assert subscribe(core, b"stalled", b"s", b"t", *opts) == b"ok"
    sent = 0
    for _i in range(200):  # 200 x 1 KB: four times its share
        out = dcp_req(core, b"pub", b"pub", [], [b"t", b"x" * 1000], 0.0)
        sent += len(out)
    assert 0 < buffers.held(b"stalled") <= 50_000
    assert sent < 50 and core.pubsub.statistics().lost > 150
    core.expire(31.0)  # it never refreshed: gone, and what it held with it
    assert buffers.used == 0


def test_drop_newest_and_disconnect_at_the_byte_bound_and_release_on_expiry() -> None:
    core = BrokerCore(max_memory=1_000_000)
    buffers = core.memory.account("subscriptions")
    assert subscribe(core, b"a", b"s", b"t", b"window=1", b"overflow=drop-newest") == b"ok"
    assert subscribe(core, b"b", b"s", b"t", b"window=1", b"overflow=disconnect") == b"ok"
    for i in range(100):
        out = dcp_req(core, b"pub", b"pub", [], [b"t", b"%04d" % i + b"x" * 1000], 0.0)
        if any(f[0] == b"b" and f[6] == b"\xffDCP:gap=s" for f in out):
            disconnect = [f for f in out if f[0] == b"b"][-1]
            assert disconnect[-1] == b"disconnect"
    assert core.pubsub.subscriptions_of(b"b") == 0 and buffers.held(b"b") == 0
    assert 0 < buffers.held(b"a") <= buffers.peer_limit  # type: ignore[operator]
    # The subscriber vanishes: its buffer is released when its subscription expires.
    core.expire(31.0)
    assert core.pubsub.subscriptions_of(b"a") == 0 and buffers.used == 0


def test_last_values_are_charged_and_evicted() -> None:
    core = BrokerCore(max_memory=1_000_000, pubsub=PubSubOptions(last_values=10_000))
    kept = core.memory.account("last_values")  # 50,000; one publisher: 12,500
    for p in range(8):
        for i in range(20):  # 8 publishers x 20 subjects x 1 KB
            dcp_req(core, b"p%d" % p, b"pub", [], [b"s.%d.%d" % (p, i), b"x" * 1000], 0.0)
        assert kept.held(b"p%d" % p) <= 12_500
    assert kept.used <= 50_000
    stats = core.pubsub.statistics()
    assert stats.last_values_evicted > 0
    dcp_req(core, b"p0", b"pub", [], [b"s.big", b"x" * 60_000], 0.0)  # over the account
    assert core.pubsub.statistics().last_values_refused == 1
    # The newest values are kept: a new subscriber gets them.
    opts = [b"last-value", b"window=100"]
    [ok, *got] = dcp_req(core, b"c", b"sub", [b"r"], [b"s", b"s.7.*", b"", *opts], 0.0)
    assert ok[-1] == b"ok"
    assert [f[8] for f in got] == [b"s.7.%d" % i for i in range(20 - len(got), 20)]
    assert len(got) >= 8  # what its share (12,500 bytes) holds


# ---------------------------------------------------------------- fan-out fairness


def _deliveries(out: list[list[bytes]]) -> list[tuple[bytes, bytes, bytes]]:
    """(subscriber, sid, data) of each delivery, in order."""
    return [(f[0], f[6][9:], f[9]) for f in out if f[6][:9] == b"\xffDCP:msg="]


def test_a_large_fan_out_is_delivered_in_slices_with_a_request_answered_between() -> None:
    core = BrokerCore(pubsub=PubSubOptions(fanout_slice=100))
    n = 2_000
    for k in range(n):
        assert subscribe(core, b"many", b"%d" % k, b">", b"window=10") == b"ok"
    core.receive([b"pub", b"", P, b"\x04", b"\xffDCP:pub", b"", b"", b"a.b", b"1"], 1.0)
    core.receive([b"pub", b"", P, b"\x04", b"\xffDCP:pub", b"", b"", b"a.b", b"2"], 1.0)
    core.receive([b"asker", b"", P, b"\x04", b"mmi.service", b"", b"m1", b"", b"echo"], 1.0)
    out = take(core)
    answer = [i for i, f in enumerate(out) if f[0] == b"asker"]
    assert answer and len(_deliveries(out)) < 2 * n  # answered before the burst was done
    rounds = 0
    while (due := core.next_deadline()) is not None and due <= 1.0:
        core.expire(1.0)
        out += take(core)
        rounds += 1
    assert rounds >= (2 * n) // 400 - 2  # four slices per expire
    got = _deliveries(out)
    assert len(got) == 2 * n  # exactly once per subscription, in order for each
    first: dict[bytes, bytes] = {}
    for _, sid, data in got:
        if data == b"1":
            assert sid not in first
            first[sid] = data
        else:
            assert first.get(sid) == b"1"
    assert answer[0] < len(out) - 1
    assert core.pubsub.statistics().backlog == 0
    # What is in flight (sent, not granted back) is charged until the subscriber leaves.
    buffers = core.memory.account("subscriptions")
    assert buffers.used >= 2 * n * 256
    assert core.pubsub.drop_peer(b"many") == n
    assert buffers.used == 0


def test_queue_groups_take_one_each_across_slices() -> None:
    core = BrokerCore(pubsub=PubSubOptions(fanout_slice=10))
    for k in range(50):
        assert subscribe(core, b"s", b"%d" % k, b"t", b"window=100") == b"ok"
    for k in range(3):
        [ok] = dcp_req(core, b"g%d" % k, b"sub", [b"r"], [b"q", b"t", b"grp", b"window=100"], 0.0)
        assert ok[-1] == b"ok"
    for i in range(4):
        core.receive([b"pub", b"", P, b"\x04", b"\xffDCP:pub", b"", b"", b"t", b"%d" % i], 0.0)
    out = take(core)
    while core.next_deadline() == 0.0:
        core.expire(0.0)
        out += take(core)
    got = _deliveries(out)
    grouped = [d for d in got if d[0].startswith(b"g")]
    assert sorted(d[2] for d in grouped) == [b"0", b"1", b"2", b"3"]
    assert len(got) == 4 * 51


def test_a_full_backlog_refuses_publishes() -> None:
    # One publisher's backlog holds at most a quarter of max_backlog (here 25 deliveries),
    # but a publisher with nothing waiting may always queue one publish.
    core = BrokerCore(pubsub=PubSubOptions(fanout_slice=10, max_backlog=100))
    for k in range(30):
        assert subscribe(core, b"s", b"%d" % k, b"t", b"window=1000") == b"ok"
    rid = [b"\xffDCP:id=1"]
    assert dcp_req(core, b"p", b"pub", rid, [b"t", b"1"], 0.0)[0][-1] == b"30"
    [refused] = [f for f in dcp_req(core, b"p", b"pub", rid, [b"t", b"2"], 0.0) if f[0] == b"p"]
    assert refused[-2] == b"pubsub_busy"
    assert core.statistics().rejections["pubsub_busy"] == 1
    assert core.pubsub.statistics().refused == 1
    # Another publisher is not held back by it: its message is delivered in turns with the
    # first one's, not after it.
    out = dcp_req(core, b"q", b"pub", rid, [b"t", b"3"], 0.0)
    assert out[0][-1] == b"30"
    while core.next_deadline() == 0.0:
        core.expire(0.0)
        out += take(core)
    got = _deliveries(out)
    assert sorted(d[2] for d in got) == [b"1"] * 20 + [b"3"] * 30
    assert core.pubsub.statistics().backlog == 0


def test_another_publisher_does_not_wait_for_a_burst() -> None:
    core = BrokerCore(pubsub=PubSubOptions(fanout_slice=50))
    for k in range(1000):
        assert subscribe(core, b"many", b"%d" % k, b">", b"window=1000") == b"ok"
    assert subscribe(core, b"fresh", b"s", b"news.x") == b"ok"
    for _i in range(20):  # a burst: 20,000 deliveries
        core.receive([b"flood", b"", P, b"\x04", b"\xffDCP:pub", b"", b"", b"a.b", b"x"], 0.0)
    core.receive([b"legit", b"", P, b"\x04", b"\xffDCP:pub", b"", b"", b"news.x", b"hi"], 0.0)
    out = take(core)
    while core.next_deadline() == 0.0:
        core.expire(0.0)
        out += take(core)
    got = _deliveries(out)
    fresh = [i for i, d in enumerate(got) if d[0] == b"fresh"]
    assert len(got) == 20 * 1000 + 1001 and len(fresh) == 1
    assert fresh[0] < 5_000  # in the first turns, not after the burst's 20,000
