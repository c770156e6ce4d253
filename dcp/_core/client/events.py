"""What the request tracker (:mod:`dcp._core.client.tracker`) tells its driver besides the
frames to send: the events of :attr:`~dcp._core.client.tracker.RequestTracker.events`."""

from __future__ import annotations

import attrs

from dcp._errors import RequestTimeout

__all__ = ["TimedOut"]


@attrs.frozen
class TimedOut:
    """Event: a request ended unanswered (tracker Rules RT3 and RT5); the driver hands
    :attr:`error` to the request's caller."""

    #: The request's id.
    request_id: bytes
    #: What the caller gets: a :class:`~dcp.RequestTimeout`, or a :class:`~dcp.NoWorkers`
    #: when the broker said that no worker serves the service.
    error: RequestTimeout
