"""The broker driver's side of registration approval (``Broker(approve=...)``): it runs the
user's approver for each question the core asks (:mod:`dcp._core.broker.approval`) and hands the
answer back to whichever thread owns the core.

The approver runs in the broker's event loop, one task per question, so a slow (``async``)
approver never holds up routing. A plain ``def`` approver is called on the event loop: it
must be quick. An approver that raises or returns something else denies (approval Rule AP4).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeAlias

import anyio
import anyio.abc
import anyio.from_thread

from dcp._core.broker.approval import Approval, ApprovalRequest, to_approval
from dcp._util import PeerId

__all__ = ["Approver", "ApproverRunner"]

logger = logging.getLogger("dcp.broker")

#: What ``Broker(approve=...)`` takes: ``approve(request) -> bool | (bool, reason) |
#: dcp.Approval``, or an ``async def`` returning the same.
Approver: TypeAlias = Callable[[ApprovalRequest], object | Awaitable[object]]


class ApproverRunner:
    """Questions out of the core, answers back in (the driver owns one per serve)."""

    def __init__(self, approve: Approver) -> None:
        self.approve = approve
        self._send, self._receive = anyio.create_memory_object_stream[ApprovalRequest](
            max_buffer_size=math.inf
        )
        #: Answers for the thread that owns the core (deque: thread-safe appends and pops).
        self.answers: deque[tuple[int, Approval]] = deque()

    def ask(self, questions: list[ApprovalRequest], *, threaded: bool) -> None:
        """Pass the core's questions to :meth:`run` (``threaded``: from the I/O thread)."""
        for question in questions:
            # Closed: the broker is stopping, and the worker will not be confirmed.
            with contextlib.suppress(anyio.ClosedResourceError):
                if threaded:
                    anyio.from_thread.run_sync(self._send.send_nowait, question)
                else:
                    self._send.send_nowait(question)

    async def run(self, answered: Callable[[], None]) -> None:
        """Answer questions until cancelled; after each answer, call ``answered`` (which
        feeds :attr:`answers` to the core, or wakes the thread that does)."""
        async with self._send, self._receive, anyio.create_task_group() as tg:
            async for question in self._receive:
                tg.start_soon(self._one, question, answered)

    async def _one(self, question: ApprovalRequest, answered: Callable[[], None]) -> None:
        try:
            result = self.approve(question)
            if inspect.isawaitable(result):
                result = await result
            answer = to_approval(result)
        except Exception as exc:
            logger.error(
                "approver failed for worker %s, service %r: %s: %s (denied)",
                PeerId(question.routing_id),
                question.service[:64],
                type(exc).__name__,
                exc,
            )
            answer = Approval.deny("the broker's approver failed")
        self.answers.append((question.token, answer))
        answered()
