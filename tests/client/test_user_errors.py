"""Errors a new user sees from a client (real sockets, both anyio backends): a call to a
service nobody serves says so once (the broker's own text only when it adds something)."""

from __future__ import annotations

import pytest

import dcp
from dcp._core.client.tracker import _no_workers_text
from tests.fakes import broker_in_thread


@pytest.mark.anyio
async def test_no_workers_says_it_once() -> None:
    async with (
        dcp.Broker("tcp://127.0.0.1:0") as broker,
        dcp.Client(broker.endpoints[0], timeout=30) as client,
    ):
        with pytest.raises(dcp.NoWorkers) as info:
            await client.request("nothere", b"x")
        assert str(info.value) == "no worker serves 'nothere'"


def test_no_workers_says_it_once_in_the_sync_client() -> None:
    with broker_in_thread() as endpoint, dcp.SyncClient(endpoint, timeout=30) as client:
        with pytest.raises(dcp.NoWorkers) as info:
            client.request("nothere", b"x")
        assert str(info.value) == "no worker serves 'nothere'"


def test_the_brokers_text_is_kept_when_it_adds_something() -> None:
    # dcp's broker says "no worker serves b'x'"; another broker may say more, or only why.
    assert _no_workers_text(b"x", "no worker serves b'x'") == "no worker serves 'x'"
    assert _no_workers_text(b"x", "") == "no worker serves 'x'"
    assert _no_workers_text(b"x", "draining") == "no worker serves 'x': draining"
