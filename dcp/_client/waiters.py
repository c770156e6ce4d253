"""How the async client's callers wait for outcomes: the receive task delivers each request's
outcome to the waiter registered for its id (one per ``request()``, one shared per ``map``)."""

from __future__ import annotations

import anyio

from dcp._models import Outcome

__all__ = ["Sink", "Waiter"]


class Waiter:
    """Where the receive task puts the outcome of one :meth:`~dcp.Client.request`."""

    __slots__ = ("event", "outcome")

    def __init__(self) -> None:
        self.event = anyio.Event()
        #: ``None`` until delivered, and also when the client closed.
        self.outcome: Outcome | None = None

    def deliver(self, rid: bytes, outcome: Outcome | None) -> None:
        self.outcome = outcome
        self.event.set()

    def forget(self) -> None:
        """The call ended without its outcome (cancelled); a traced waiter ends its span."""


class Sink:
    """Where the receive task puts the outcomes of one ``map`` call's requests."""

    __slots__ = ("done", "event")

    def __init__(self) -> None:
        self.done: dict[bytes, Outcome | None] = {}
        self.event: anyio.Event | None = None

    def deliver(self, rid: bytes, outcome: Outcome | None) -> None:
        self.done[rid] = outcome
        if self.event is not None:
            self.event.set()

    def forget(self) -> None:
        """The ``map`` ended; a traced sink ends the spans of unanswered requests."""

    async def wait(self) -> None:
        """Wait for the next delivery (call only when the one you need is not in ``done``)."""
        event = self.event = anyio.Event()
        await event.wait()
