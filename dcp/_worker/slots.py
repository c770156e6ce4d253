"""Handler slots: a worker's requests run in long-lived tasks fed from a queue.

Spawning a task per request costs about 10 us of CPU here (trio and asyncio alike: anyio
makes a cancel scope and an ``Event`` per task, the loop a task object and a context copy);
handing a request to a parked task costs about 2. So :class:`HandlerSlots` keeps at most
``size`` tasks, each taking requests off a queue until none is left, then parking.

Rules:

Rule SL1 - Never more than ``size`` tasks; started lazily. A request goes to a parked slot
  if there is one, else a new slot is started if fewer than ``size`` exist, else it waits in
  the queue for the next slot to become free. The worker core never has more than
  ``concurrency`` requests running (its in-progress count includes those queued here), so
  with ``size = concurrency`` a request never waits for a slot longer than it takes a
  finishing handler to report.
Rule SL2 - Each request runs in a context of its own: a copy of the context the slot started
  in (as a task per request would get), so a ``ContextVar`` a handler sets is not seen by the
  next request of its slot. The handler's coroutine is stepped inside that context.
Rule SL3 - Cancellation. :meth:`cancel` cancels every slot (a running handler gets the
  cancellation as before) and hands each request still queued to ``drop``, so that it is
  accounted for as cancelled; a request submitted after that is dropped at once. The tasks
  started with :meth:`HandlerSlots.start_soon` (the worker's serving tasks, which run some
  requests themselves: :class:`Inline`) are cancelled with them.
Rule SL4 - A request run inline (:class:`Inline`) by the task that read it is stepped in a
  context of its own as in Rule SL2; the first time it suspends (yields to the event loop),
  and before the event loop sees that, its ``on_suspend`` is called once, so the task's
  other duties (the socket) can be handed to another task while it waits.
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc

__all__ = ["HandlerSlots", "Inline", "park"]

T = TypeVar("T")
#: One queued request: whatever the worker hands over (its request and generation).
Job = TypeVar("Job")


async def park(parked: list[anyio.Event]) -> None:
    """Wait on a new event put last in ``parked`` until whoever wakes a parked task (the
    most recently parked: ``parked.pop().set()``) sets it; taken out again if cancelled."""
    event = anyio.Event()
    parked.append(event)
    try:
        await event.wait()
    finally:
        if not event.is_set():  # cancelled while parked
            parked.remove(event)


class _InContext(Generic[T]):
    """Await ``coro`` with each of its steps run in ``ctx`` (Rule SL2): what a task of its
    own would give it, without the task. The event loop's traps pass through unchanged."""

    __slots__ = ("_coro", "_ctx")

    def __init__(self, coro: Coroutine[Any, Any, T], ctx: contextvars.Context) -> None:
        self._coro = coro
        self._ctx = ctx

    def __await__(self) -> Generator[Any, Any, T]:
        run = self._ctx.run
        coro = self._coro
        send = coro.send
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                trap = run(send, value) if error is None else run(coro.throw, error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                value = yield trap
                error = None
            except BaseException as exc:  # passed on into the coroutine
                value = None
                error = exc


class Inline:
    """Await ``coro`` in ``ctx`` as :class:`_InContext` does, calling ``on_suspend`` once
    when it first yields to the event loop (Rule SL4); :attr:`suspended` tells afterwards.

    A handler that never suspends (a plain ``async def`` that computes its answer) costs
    no task switch at all: it is run by the task that read its request, to the end.
    """

    __slots__ = ("_coro", "_ctx", "_on_suspend", "suspended")

    def __init__(
        self,
        coro: Coroutine[Any, Any, None],
        ctx: contextvars.Context,
        on_suspend: Callable[[], None],
    ) -> None:
        self._coro = coro
        self._ctx = ctx
        self._on_suspend = on_suspend
        #: Whether the coroutine yielded to the event loop at least once.
        self.suspended = False

    def __await__(self) -> Generator[Any, Any, None]:
        run = self._ctx.run
        coro = self._coro
        send = coro.send
        try:
            trap = run(send, None)
        except StopIteration:
            return  # done without suspending: the hot path
        self.suspended = True
        self._on_suspend()
        while True:
            try:
                value = yield trap
            except BaseException as exc:  # passed on into the coroutine
                try:
                    trap = run(coro.throw, exc)
                except StopIteration:
                    return
                continue
            try:
                trap = run(send, value)
            except StopIteration:
                return


class HandlerSlots(Generic[Job]):
    """At most ``size`` tasks in ``tg`` awaiting ``run(job)`` for each submitted job.

    :param tg: the task group the slots run in (cancelled by :meth:`cancel`)
    :param size: most slots (the worker's concurrency)
    :param run: serves one job (its coroutine is stepped in a context of its own, Rule SL2);
        must not raise but for cancellation
    :param drop: accounts for a job that will never run (Rule SL3)
    """

    def __init__(
        self,
        tg: anyio.abc.TaskGroup,
        size: int,
        run: Callable[[Job], Coroutine[Any, Any, None]],
        drop: Callable[[Job], None],
    ) -> None:
        self._tg = tg
        self._size = size
        self._run = run
        self._drop = drop
        self._queue: deque[Job] = deque()
        #: Events of the parked slots, the most recently parked last.
        self._parked: list[anyio.Event] = []
        self._slots = 0
        self._cancelled = False

    def submit(self, job: Job) -> None:
        """Run ``job`` as soon as a slot is free (Rule SL1)."""
        if self._cancelled:
            self._drop(job)
            return
        self._queue.append(job)
        if self._parked:
            self._parked.pop().set()
        elif self._slots < self._size:
            self._slots += 1
            self._tg.start_soon(self._slot, contextvars.copy_context())

    def start_soon(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start ``fn()`` in the slots' task group: cancelled with them (Rule SL3)."""
        self._tg.start_soon(fn)

    def cancel(self) -> None:
        """Cancel every slot; drop what is queued (Rule SL3). Idempotent."""
        self._cancelled = True
        self._tg.cancel_scope.cancel()
        queue = self._queue
        while queue:
            self._drop(queue.popleft())

    async def _slot(self, ctx: contextvars.Context) -> None:
        queue, parked, run = self._queue, self._parked, self._run
        try:
            while True:
                while queue:
                    await _InContext(run(queue.popleft()), ctx.copy())
                await park(parked)
        finally:
            self._slots -= 1
