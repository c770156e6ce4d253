"""The pub/sub cores without sockets: the subject trie against a brute-force matcher
(hypothesis), the overflow rules and gap counts, permissions, mc0 commands."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.pubsub import Overflow, PubSub, Writer
from dcp._core.broker.pubsub_peers import PubSubOptions, covers
from dcp._core.broker.subjects import (
    SubjectError,
    SubjectTrie,
    check_pattern,
    check_subject,
    matches,
)
from tests.helpers import take

tokens = st.sampled_from([b"a", b"b", b"c"])
subjects = st.lists(tokens, min_size=1, max_size=4).map(b".".join)
patterns = st.lists(st.sampled_from([b"a", b"b", b"*"]), min_size=1, max_size=4).flatmap(
    lambda ts: st.sampled_from([b".".join(ts), b".".join([*ts, b">"])])
)


@given(st.lists(patterns, max_size=12), st.lists(subjects, max_size=12))
def test_trie_matches_brute_force(pats: list[bytes], subs: list[bytes]) -> None:
    trie: SubjectTrie[int] = SubjectTrie()
    for i, p in enumerate(pats):
        trie.add(check_pattern(p), i)
    for s in subs:
        got = sorted(trie.match(check_subject(s)))
        assert got == [i for i, p in enumerate(pats) if matches(p, s)]
    for i, p in enumerate(pats):
        assert trie.remove(check_pattern(p), i)
    assert len(trie) == 0
    assert not trie.remove([b"zz"], 0)


@given(patterns, patterns, subjects)
def test_covers_implies_matches(allowed: bytes, pattern: bytes, subject: bytes) -> None:
    if covers(allowed, pattern) and matches(pattern, subject):
        assert matches(allowed, subject)


@pytest.mark.parametrize("bad", [b"", b"a..b", b"a b", b".a", b"a.", b"x" * 2000])
def test_bad_subjects(bad: bytes) -> None:
    with pytest.raises(SubjectError):
        check_pattern(bad)
    with pytest.raises(SubjectError):
        check_subject(bad)


def test_wildcards_in_subjects_and_patterns() -> None:
    with pytest.raises(SubjectError, match="wildcard"):
        check_subject(b"a.*")
    with pytest.raises(SubjectError, match="last token"):
        check_pattern(b"a.>.b")
    assert check_subject(b"a*.b>") == [b"a*", b"b>"]


class Recorder(Writer):
    def message(
        self, peer: bytes, sid: bytes, subject: bytes, data: Sequence[bytes]
    ) -> list[bytes]:
        return [peer, b"msg", *data]

    def gap(self, peer: bytes, sid: bytes, lost: int, reason: str) -> list[bytes] | None:
        return [peer, b"gap", b"%d" % lost, reason.encode()]


def run(policy: Overflow, n: int, credit: int, pending: int) -> tuple[PubSub, list[list[bytes]]]:
    ps = PubSub()
    assert (
        ps.subscribe(
            b"p",
            b"s",
            [b"x"],
            Recorder(),
            0.0,
            max_pending=pending,
            overflow=policy,
            credit=credit,
            timeout=5.0,
        )
        is None
    )
    for i in range(n):
        assert ps.publish([b"x"], b"x", [b"%d" % i]) == 1
    return ps, ps.outbox


def test_drop_oldest_tells_the_gap_before_the_survivors() -> None:
    ps, out = run(Overflow.DROP_OLDEST, 10, credit=2, pending=3)
    assert out == [[b"p", b"msg", b"0"], [b"p", b"msg", b"1"]]
    out.clear()
    assert ps.refresh(b"p", b"s", 10, 1.0)
    assert out == [
        [b"p", b"gap", b"5", b"drop-oldest"],
        [b"p", b"msg", b"7"],
        [b"p", b"msg", b"8"],
        [b"p", b"msg", b"9"],
    ]
    assert ps.statistics().lost == 5


def test_drop_newest_tells_the_gap_after_the_survivors() -> None:
    ps, out = run(Overflow.DROP_NEWEST, 10, credit=1, pending=2)
    out.clear()
    ps.refresh(b"p", b"s", 10, 1.0)
    assert out == [
        [b"p", b"msg", b"1"],
        [b"p", b"msg", b"2"],
        [b"p", b"gap", b"7", b"drop-newest"],
    ]
    out.clear()
    ps.publish([b"x"], b"x", [b"late"])
    assert out == [[b"p", b"msg", b"late"]]


def test_drop_oldest_with_a_buffer_of_one() -> None:
    ps, out = run(Overflow.DROP_OLDEST, 4, credit=0, pending=1)
    ps.refresh(b"p", b"s", 1, 1.0)
    assert out == [[b"p", b"gap", b"3", b"drop-oldest"], [b"p", b"msg", b"3"]]


def test_disconnect_and_expiry() -> None:
    ps, out = run(Overflow.DISCONNECT, 4, credit=1, pending=2)
    assert out[-1] == [b"p", b"gap", b"3", b"disconnect"]
    assert len(ps) == 0 and ps.statistics().disconnected == 1
    assert not ps.refresh(b"p", b"s", 1, 1.0)
    ps.subscribe(b"p", b"t", [b"y"], Recorder(), 0.0, credit=1, timeout=5.0)
    assert ps.next_expiry() == 5.0
    assert ps.expire(4.0) == 0
    assert ps.expire(5.0) == 1
    assert ps.next_expiry() is None
    assert ps.subscribe(b"p", b"t", [b"y"], Recorder(), 0.0, max_pending=0) == "bad_subscription"


def test_limits_and_undelivered() -> None:
    ps = PubSub(max_subscriptions=2, max_subscriptions_per_peer=1)
    w = Recorder()
    assert ps.subscribe(b"p", b"1", [b"x"], w, 0.0, credit=1) is None
    assert ps.subscribe(b"p", b"2", [b"x"], w, 0.0) == "too_many_subscriptions"
    assert ps.subscribe(b"p", b"1", [b"y"], w, 0.0, credit=1) is None  # replaced
    assert ps.subscribe(b"q", b"1", [b"y"], w, 0.0) is None
    assert ps.subscribe(b"r", b"1", [b"y"], w, 0.0) == "too_many_subscriptions"
    ps.publish([b"y"], b"y", [b"m"])
    ps.undelivered(b"p", b"1", 1, counted=False)
    ps.outbox.clear()
    ps.refresh(b"p", b"1", 0, 1.0)
    assert ps.outbox == [[b"p", b"gap", b"1", b"drop-oldest"]]
    ps.undelivered(b"gone", b"1", 1, counted=False)
    assert ps.statistics().lost == 2
    assert ps.drop_peer(b"p") == 1 and ps.drop_peer(b"p") == 0
    assert not ps.unsubscribe(b"p", b"1")


P = b"DGBX\x01"


def dcp_req(
    core: BrokerCore,
    peer: bytes,
    name: bytes,
    meta: list[bytes],
    data: list[bytes],
    key: str | None = None,
) -> list[list[bytes]]:
    core.receive([peer, b"", P, b"\x04", b"\xffDCP:" + name, b"", *meta, b"", *data], 0.0, key)
    return take(core)


def test_broker_refusals() -> None:
    core = BrokerCore()
    rid = [b"\xffDCP:id=1"]
    for name, data, code in [
        (b"sub", [b"s"], b"bad_subscription"),
        (b"sub", [b"s", b"a..b", b""], b"bad_subject"),
        (b"sub", [b"s", b"a", b"", b"overflow=never"], b"bad_subscription"),
        (b"sub", [b"s", b"a", b"", b"window=x"], b"bad_subscription"),
        (b"unsub", [], b"bad_subscription"),
        (b"credit", [b"s"], b"bad_subscription"),
        (b"credit", [b"s", b"1"], b"unknown_subscription"),
        (b"pub", [b"a.*", b"x"], b"bad_subject"),
        (b"what", [], b"unknown_pubsub_command"),
    ]:
        [reply] = dcp_req(core, b"c", name, rid, data)
        assert reply[-2] == code, (name, data, reply)
    assert dcp_req(core, b"c", b"pub", [], [b"a.*"]) == []  # fire and forget: counted only
    assert core.statistics().rejections["bad_subject"] >= 2
    core.receive([b"c", b"", P, b"\x04", b"\xffDCP:pub", b"other", b"", *rid, b"", b"a"], 0.0)
    assert core.outbox[0][-2] == b"forbidden_address"


def test_a_dcp_delivery_the_driver_cannot_send_is_lost_and_told() -> None:
    # Rule P4 on the DCP wire (routing id first): counted as lost, not as a dropped reply;
    # its credit given back; the subscriber told in a gap notice before the next message.
    core = BrokerCore()
    opts = [b"max-pending=10", b"overflow=drop-oldest", b"window=1"]
    assert dcp_req(core, b"c", b"sub", [b"r1"], [b"s", b"t", b"", *opts])[0][-1] == b"ok"
    [delivery] = dcp_req(core, b"p", b"pub", [], [b"t", b"1"])
    assert delivery[6:] == [b"\xffDCP:msg=s", b"", b"t", b"1"]
    core.undeliverable(delivery, "full")
    stats = core.pubsub.statistics()
    assert (stats.delivered, stats.lost) == (0, 1)
    assert core.statistics().dropped_replies == 0
    [gap, message] = dcp_req(core, b"p", b"pub", [], [b"t", b"2"])
    assert gap[6:] == [b"\xffDCP:gap=s", b"", b"1", b"drop-oldest"]
    assert message[6:] == [b"\xffDCP:msg=s", b"", b"t", b"2"]
    # A gap notice the driver cannot send is told again, as soon as there is credit.
    core.undeliverable(gap, "gone")
    [ok, gap] = dcp_req(core, b"c", b"credit", [b"g1"], [b"s", b"1"])
    assert ok[-1] == b"ok"
    assert gap[6:] == [b"\xffDCP:gap=s", b"", b"1", b"drop-oldest"]
    assert core.pubsub.statistics().lost == 1  # counted once, where it was lost


def test_permissions() -> None:
    opts = PubSubOptions(publishers={"news.>": ["K1"]}, subscribers={"news.*": ["*"]})
    core = BrokerCore(pubsub=opts)
    rid = [b"\xffDCP:id=1"]
    assert dcp_req(core, b"c", b"pub", rid, [b"news.x", b"m"], "K1")[0][-1] == b"0"
    assert (
        dcp_req(core, b"c", b"pub", rid, [b"sport.x", b"m"], "K1")[0][-2] == b"forbidden_subject"
    )
    assert dcp_req(core, b"d", b"pub", rid, [b"news.x", b"m"], "K2")[0][-2] == b"forbidden_subject"
    assert dcp_req(core, b"d", b"sub", rid, [b"s", b"news.x", b""], "K2")[0][-1] == b"ok"
    assert (
        dcp_req(core, b"d", b"sub", rid, [b"s", b"news.>", b""], "K2")[0][-2]
        == b"forbidden_subject"
    )
    assert opts.may_publish(b"K1", b"news.a.b") and not opts.may_subscribe(b"K1", b"other")


def test_mc0_commands() -> None:
    core = BrokerCore()

    def mc0(peer: bytes, *frames: bytes, now: float = 0.0) -> list[list[bytes]]:
        core.receive([peer, *frames], now)
        return take(core)

    assert mc0(b"m", b"CONNECT", b"VERSION", b"0.3", b"TTL", b"1000", b"ID", b"1") == [
        [b"m", b"OK", b"ID", b"1"]
    ]
    assert mc0(b"m", b"SUB", b"", b"t1", b"t2") == []
    assert mc0(b"n", b"PUT", b"TOPIC", b"t2", b"", b"body") == [
        [b"m", b"MESSAGE", b"TOPIC", b"t2", b"", b"body"]
    ]
    assert mc0(b"m", b"UNSUB", b"", b"t2") == []
    assert mc0(b"n", b"PUT", b"TOPIC", b"t2", b"ID", b"2", b"", b"x") == [
        [b"n", b"OK", b"ID", b"2"]
    ]
    assert mc0(b"m", b"SUB", b"ID", b"3", b"", b"a.*")[0][:4] == [b"m", b"ERROR", b"ID", b"3"]
    assert mc0(b"m", b"SUB", b"", b"a..b")[0][1] == b"ERROR"
    assert mc0(b"m", b"PUT", b"", b"x")[0][1] == b"ERROR"
    assert mc0(b"m", b"PUT", b"TOPIC", b"a.*", b"", b"x")[0][1] == b"ERROR"
    assert mc0(b"m", b"CONNECT", b"TTL", b"5")[0][1] == b"ERROR"
    assert mc0(b"m", b"NOOP", b"ID")[0][1] == b"ERROR"
    assert mc0(b"m", b"NOOP", b"ID", b"4") == [[b"m", b"OK", b"ID", b"4"]]
    # TTL: a NOOP after a second of silence, then again every second.
    assert core.next_deadline() == 1.0
    core.expire(1.0)
    assert take(core) == [[b"m", b"NOOP"]]
    core.undeliverable([b"m", b"NOOP"], "gone")
    assert core.pubsub.subscriptions_of(b"m") == 0
    mc0(b"m", b"SUB", b"", b"t1")
    core.undeliverable([b"m", b"MESSAGE", b"TOPIC", b"t1", b"", b"x"], "full")
    assert core.pubsub.statistics().lost == 1
    assert mc0(b"m", b"DISCONNECT") == []
    assert core.pubsub.subscriptions_of(b"m") == 0
    assert core.statistics().rejections["bad_mc0_message"] == 2


def test_mc0_peer_limit() -> None:
    core = BrokerCore(pubsub=PubSubOptions(max_mc0_peers=1))
    core.receive([b"a", b"SUB", b"", b"t"], 0.0)
    core.receive([b"b", b"SUB", b"", b"t"], 0.0)
    assert core.pubsub.subscriptions_of(b"a") == 0
    assert core.statistics().rejections["mc0_peer_evicted"] == 1
