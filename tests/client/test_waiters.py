"""The events the async client's callers wait on (:func:`dcp._client.waiters.loop_event`):
the event loop's own, one waiting task each, on both anyio backends."""

from __future__ import annotations

import anyio
import pytest

from dcp._client.waiters import Sink, Waiter, loop_event
from dcp._models import Response

pytestmark = pytest.mark.anyio


async def test_an_event_set_before_or_while_its_task_waits_ends_the_wait() -> None:
    new_event = loop_event()
    early = new_event()
    early.set()
    early.set()  # idempotent
    with anyio.fail_after(5):
        await early.wait()
        later = new_event()

        async def wait() -> None:
            await later.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            later.set()


async def test_an_event_whose_waiting_task_was_cancelled_can_still_be_set() -> None:
    new_event = loop_event()
    event = new_event()
    with anyio.move_on_after(0.01) as scope:
        await event.wait()
    assert scope.cancelled_caught
    event.set()  # the wait was cancelled: nothing to wake, nothing raised
    with anyio.fail_after(5):
        event = new_event()  # a new event for the next wait works as ever
        event.set()
        await event.wait()


async def test_waiters_and_sinks_wait_on_the_loops_events() -> None:
    new_event = loop_event()
    waiter, sink = Waiter(), Sink()
    response = Response((b"x",))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter.wait, new_event)
            tg.start_soon(sink.wait, new_event)
            await anyio.wait_all_tasks_blocked()
            waiter.deliver(b"a", response)
            sink.deliver(b"b", response)
        assert waiter.done and waiter.outcome is response and sink.done == {b"b": response}
        await waiter.wait(new_event)  # delivered already: a checkpoint only
