"""Handler slots (dcp/_worker/slots.py): the worker's long-lived handler tasks, on both
anyio backends; first the slots alone, then through a real broker and worker."""

from __future__ import annotations

import contextvars

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

import dcp
from dcp._worker.slots import HandlerSlots
from tests.integration.test_end_to_end import eventually, fast_broker, fast_worker

pytestmark = pytest.mark.anyio

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


class Jobs:
    """Jobs that block until released, recording what ran and how many at once."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.running = 0
        self.most = 0
        self.done: list[int] = []
        self.cancelled: list[int] = []
        self.dropped: list[int] = []

    async def run(self, job: int) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
            self.done.append(job)
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(job)
            raise
        finally:
            self.running -= 1


async def test_slots_run_every_job_with_at_most_size_at_once() -> None:
    jobs = Jobs()
    async with anyio.create_task_group() as tg:
        slots = HandlerSlots(tg, 3, jobs.run, jobs.dropped.append)
        for i in range(10):
            slots.submit(i)
        await eventually(lambda: jobs.running == 3)
        jobs.release.set()
        await eventually(lambda: len(jobs.done) == 10)
        # Parked slots take new work without new tasks.
        for i in range(10, 13):
            slots.submit(i)
        await eventually(lambda: len(jobs.done) == 13)
        tg.cancel_scope.cancel()
    assert jobs.most == 3
    assert sorted(jobs.done) == list(range(13))
    assert jobs.dropped == []


async def test_cancel_cancels_running_jobs_and_drops_queued_ones() -> None:
    jobs = Jobs()
    async with anyio.create_task_group() as outer:
        inner = anyio.create_task_group()
        started = anyio.Event()

        async def host() -> None:
            async with inner:
                started.set()
                await anyio.sleep_forever()

        outer.start_soon(host)
        await started.wait()
        slots = HandlerSlots(inner, 2, jobs.run, jobs.dropped.append)
        for i in range(5):
            slots.submit(i)
        await eventually(lambda: jobs.running == 2)
        slots.cancel()
        slots.submit(5)  # after the cancel: dropped at once
        slots.cancel()  # idempotent
        await eventually(lambda: jobs.running == 0)
        outer.cancel_scope.cancel()
    assert sorted(jobs.cancelled) == [0, 1]
    assert jobs.dropped == [2, 3, 4, 5]
    assert jobs.done == []


async def test_each_job_runs_in_a_context_of_its_own() -> None:
    seen: list[str] = []

    async def job(i: int) -> None:
        seen.append(VAR.get())
        VAR.set(f"job {i}")
        await anyio.lowlevel.checkpoint()
        seen.append(VAR.get())

    token = VAR.set("submitter")
    try:
        async with anyio.create_task_group() as tg:
            slots = HandlerSlots(tg, 1, job, lambda i: None)
            for i in range(3):
                slots.submit(i)
            await eventually(lambda: len(seen) == 6)
            tg.cancel_scope.cancel()
    finally:
        VAR.reset(token)
    # Each job starts from the submitter's context, never from the previous job's.
    assert seen == ["submitter", "job 0", "submitter", "job 1", "submitter", "job 2"]


async def test_a_job_gets_exceptions_and_cancellation_through_its_slot() -> None:
    outcomes: list[str] = []

    async def job(i: int) -> None:
        with anyio.move_on_after(0.01) as scope:
            await anyio.sleep_forever()
        outcomes.append(f"timed out {scope.cancelled_caught}")
        try:
            async with anyio.create_task_group() as tg:

                async def fail() -> None:
                    raise ValueError("boom")

                tg.start_soon(fail)
                await anyio.sleep_forever()
        except BaseException as exc:  # an exception group on both backends
            outcomes.append(type(exc).__name__)

    async with anyio.create_task_group() as tg:
        slots = HandlerSlots(tg, 1, job, lambda i: None)
        slots.submit(0)
        await eventually(lambda: len(outcomes) == 2)
        tg.cancel_scope.cancel()
    assert outcomes[0] == "timed out True"
    assert "ExceptionGroup" in outcomes[1]


async def test_a_worker_handler_does_not_see_the_previous_requests_context() -> None:
    seen: list[str] = []

    async def handler(request: dcp.HandlerRequest) -> bytes:
        seen.append(VAR.get())
        VAR.set(request.data[0].decode())
        await anyio.lowlevel.checkpoint()
        return request.data[0]

    async with fast_broker() as broker:
        ep = broker.endpoints[0]
        async with fast_worker(ep, "ctx", handler, concurrency=1), dcp.Client(ep) as client:
            for i in range(3):
                assert (await client.request("ctx", b"%d" % i)).data[0] == b"%d" % i
    assert seen == ["unset", "unset", "unset"]
