"""The broker's byte budget (dcp._core.broker.budget, Rules MB1-MB4)."""

from __future__ import annotations

import pytest

from dcp._core.broker.budget import (
    ENTRY_OVERHEAD,
    FRAME_OVERHEAD,
    SHARES,
    Memory,
    cost,
)
from dcp._core.broker.core import BrokerCore


def test_shares_add_up_to_the_whole() -> None:
    assert sum(SHARES.values()) == pytest.approx(1.0)


def test_cost_counts_frames_and_the_entry() -> None:
    assert cost([]) == ENTRY_OVERHEAD
    assert cost([b"", b"abc"]) == ENTRY_OVERHEAD + 2 * FRAME_OVERHEAD + 3


def test_an_account_refuses_past_its_limit_and_counts_it() -> None:
    memory = Memory(1000, shares={"a": 1.0}, peer_share=1.0)
    account = memory.account("a")
    assert account.charge(b"p", 600)
    assert not account.charge(b"q", 500)
    assert account.refused == 1
    account.release(b"p", 600)
    assert account.charge(b"q", 500)
    assert account.figures().used == 500
    assert account.figures().peak == 600


def test_one_peer_holds_at_most_its_share_but_may_always_start() -> None:
    memory = Memory(1000, shares={"a": 1.0}, peer_share=0.25)
    account = memory.account("a")
    # Rule MB2: a peer holding nothing may put one message larger than its share ...
    assert account.charge(b"p", 400)
    # ... but nothing more until it is released.
    assert not account.charge(b"p", 1)
    assert account.charge(b"q", 250)
    assert not account.charge(b"q", 1)
    assert account.room(b"q") == 0
    assert account.forget(b"p") == 400
    assert account.used == 250
    assert account.figures().peers == 1


def test_release_never_goes_below_zero() -> None:
    account = Memory(1000, shares={"a": 1.0}).account("a")
    account.release(b"nobody", 10)
    assert account.charge(b"p", 10)
    account.release(b"p", 50)
    assert account.used == 0
    assert account.held(b"p") == 0


def test_no_budget_takes_everything_and_still_counts() -> None:
    memory = Memory(None)
    account = memory.account("queued")
    assert account.charge(b"p", 1 << 40)
    assert account.used == 1 << 40
    assert account.figures().limit is None
    assert memory.used == 1 << 40


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_memory"):
        Memory(0)
    with pytest.raises(ValueError, match="peer_share"):
        Memory(100, peer_share=0)


def test_the_core_has_one_budget_with_every_account() -> None:
    core = BrokerCore(max_memory=1 << 20)
    names = [f.name for f in core.memory.figures()]
    assert names == list(SHARES)
    assert core.memory.max_memory == 1 << 20
