"""Review of issue 28: the blocking client with every broker down."""

from __future__ import annotations

import time

import pytest

import dcp
from tests.client.test_brokers import free_port


def test_sync_every_broker_down_a_request_times_out_at_its_deadline() -> None:
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    with dcp.SyncClient(endpoints, timeout=0.6) as client:
        start = time.monotonic()
        with pytest.raises(dcp.RequestTimeout):
            client.request("echo", b"x")
        took = time.monotonic() - start
        assert 0.5 <= took < 1.5
        receiver = client._receiver
        brokers = receiver.brokers  # type: ignore[attr-defined]
        assert [i.outstanding for i in brokers.info()] == [0, 0]
        assert len(brokers) == 0 and not brokers._parked
