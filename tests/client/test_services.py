"""The clients' service answers alone (:mod:`dcp._client.services`): no broker, no socket.
Both clients against a real broker: ``tests/integration/test_services.py`` (async) and
``tests/client/test_sync_client.py`` (blocking)."""

from __future__ import annotations

import pytest

from dcp import ServiceChange, ServiceSummary
from dcp._client.services import (
    ServiceWatch,
    mmi_answer,
    mmi_args,
    mmi_page,
    service_info,
    service_stats,
    summaries,
)
from dcp._models import Response


def summary(name: str, workers: int) -> ServiceSummary:
    return ServiceSummary(name, workers, workers, 0, 0, "", "")


def test_a_watch_reports_what_is_served_then_each_change() -> None:
    watch = ServiceWatch(1.0)
    assert watch.changes([summary("a", 1), summary("idle", 0)]) == [ServiceChange("a", True, 1)]
    assert watch.changes([summary("a", 2)]) == []  # more workers: no change
    assert watch.changes([summary("b", 1), summary("a", 0)]) == [
        ServiceChange("b", True, 1),  # ups first, then downs
        ServiceChange("a", False, 0),
    ]
    assert watch.changes([]) == [ServiceChange("b", False, 0)]
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="interval"):
            ServiceWatch(bad)


def test_answers() -> None:
    assert mmi_args(None) == () and mmi_args("é") == ("é".encode(),) and mmi_args(b"x") == (b"x",)
    assert mmi_answer("mmi.info", Response((b"404",))) is None
    with pytest.raises(RuntimeError, match=r"does not answer mmi\.stats"):
        mmi_answer("mmi.stats", Response((b"501",)))
    assert mmi_answer("mmi.services", Response((b"[]",))) == []
    # A newer broker may say more: unknown fields are left out.
    listing = [{**{f: 0 for f in ("workers", "idle", "busy", "queued")}, "name": "s"}]
    listing[0].update(version="1", description="d", colour="blue")
    assert summaries(listing) == [ServiceSummary("s", 0, 0, 0, 0, "1", "d")]
    assert service_info(None) is None and service_stats(None) is None
    stats = service_stats(
        {
            "name": "s",
            "num_requests": 2,
            "num_errors": 0,
            "processing_time": 3e9,
            "average_processing_time": 1.5e9,
            "queued": 0,
            "oldest_queued_age": 0.0,
            "workers": 1,
            "idle": 1,
            "busy": 0,
        }
    )
    assert stats is not None
    assert (stats.processing_time, stats.average_processing_time) == (3.0, 1.5)  # seconds


def test_pages() -> None:
    """directory Rule D6: a page, and the cursor of the next (none on the last page)."""
    assert mmi_page("mmi.services", Response((b"[]",)), None) == ([], None)
    assert mmi_page("mmi.services", Response((b'[{"name":"a"}]', b"a")), None) == (
        [{"name": "a"}],
        b"a",
    )
    with pytest.raises(RuntimeError, match=r"does not answer mmi\.services"):
        mmi_page("mmi.services", Response((b"501",)), None)
    with pytest.raises(ValueError, match="cursor does not move on"):
        mmi_page("mmi.services", Response((b"[]", b"a")), b"b")
    for bad in ((), (b"[]", b"a", b"b"), (b"{}",)):
        with pytest.raises(ValueError, match=r"data parts|not a JSON list"):
            mmi_page("mmi.services", Response(bad), None)
