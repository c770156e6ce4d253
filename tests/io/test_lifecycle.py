"""The lifecycle helper of dcp's public context managers (dcp._io.lifecycle, Rules E1 to
E5), on its own: a part with a ``serve`` that records what happened to it."""

from __future__ import annotations

from types import TracebackType

import anyio
import anyio.abc
import pytest

from dcp._io.lifecycle import BaseExceptionGroup, Lifecycle, single_error

pytestmark = pytest.mark.anyio


class Boom(Exception):
    pass


class Part:
    """A part as Broker, Client and Worker use the helper: ``serve`` reports readiness,
    then runs until cancelled or (graceful) until :meth:`stop`."""

    def __init__(
        self,
        *,
        graceful: bool = False,
        fail_first: BaseException | None = None,
        ready: anyio.Event | None = None,
    ) -> None:
        self.lifecycle = Lifecycle("this part is already serving")
        self.graceful = graceful
        self.fail_first = fail_first
        #: Set by the test to let a slow start report readiness.
        self.ready = ready
        self.events: list[str] = []
        self.stopped = anyio.Event()
        self.fail = anyio.Event()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[str]) -> None:
        self.events.append("serve")
        try:
            if self.ready is not None:
                await self.ready.wait()
            if self.fail_first is not None:
                raise self.fail_first
            task_status.started("ready")
            async with anyio.create_task_group() as tg:

                async def fail_on_request() -> None:
                    await self.fail.wait()
                    raise Boom("from serve")

                tg.start_soon(fail_on_request)
                await self.stopped.wait()
                tg.cancel_scope.cancel()
            self.events.append("returned")
        except anyio.get_cancelled_exc_class():
            self.events.append("cancelled")
            raise

    def stop(self) -> None:
        self.events.append("stop")
        self.stopped.set()

    async def __aenter__(self) -> Part:
        if self.graceful:
            await self.lifecycle.enter(self.serve, stop=self.stop, cancel=False)
        else:
            await self.lifecycle.enter(self.serve)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.lifecycle.exit(exc)


async def test_enter_waits_until_ready_and_exit_cancels() -> None:
    part = Part()
    async with part as entered:
        assert entered is part
        assert part.lifecycle.entered
        assert part.events == ["serve"]
    assert part.events == ["serve", "cancelled"]
    assert not part.lifecycle.entered


async def test_enter_returns_what_serve_started_with() -> None:
    lifecycle = Lifecycle("busy")
    part = Part()
    assert await lifecycle.enter(part.serve) == "ready"
    await lifecycle.exit(None)
    assert part.events == ["serve", "cancelled"]


async def test_the_bodys_error_goes_through_unwrapped() -> None:
    part = Part()
    with pytest.raises(Boom, match="from the body") as info:
        async with part:
            raise Boom("from the body")
    assert not isinstance(info.value, BaseExceptionGroup)
    assert part.events == ["serve", "cancelled"]


async def test_a_startup_error_is_raised_alone_and_nothing_runs() -> None:
    part = Part(fail_first=Boom("cannot start"))
    with pytest.raises(Boom, match="cannot start"):
        async with part:
            pytest.fail("entered a part that could not start")
    assert part.events == ["serve"]
    assert not part.lifecycle.entered
    part.fail_first = None  # it may be entered again
    async with part:
        pass
    assert part.events == ["serve", "serve", "cancelled"]


async def test_cancelling_the_body_cancels_serve() -> None:
    part = Part()
    with anyio.move_on_after(0.05) as scope:
        async with part:
            await anyio.sleep(5)
    assert scope.cancelled_caught
    assert part.events == ["serve", "cancelled"]
    assert not part.lifecycle.entered


async def test_cancelling_the_entry_leaves_nothing_running() -> None:
    part = Part(ready=anyio.Event())  # never ready
    with anyio.move_on_after(0.05) as scope:
        async with part:
            pytest.fail("entered a part that never got ready")
    assert scope.cancelled_caught
    assert part.events == ["serve", "cancelled"]
    assert not part.lifecycle.entered


async def test_entering_twice_is_refused_and_leaves_the_first_running() -> None:
    part = Part()
    async with part:
        with pytest.raises(RuntimeError, match="already serving"):
            async with part:
                pytest.fail("entered twice")
        assert part.lifecycle.entered
        assert part.events == ["serve"]  # the first entry still serves
    assert part.events == ["serve", "cancelled"]
    async with part:  # once exited, it may be entered again
        pass
    assert part.events == ["serve", "cancelled", "serve", "cancelled"]


async def test_entering_while_another_entry_starts_is_refused() -> None:
    part = Part(ready=anyio.Event())
    results: list[str] = []

    async def first() -> None:
        async with part:
            results.append("first entered")

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        assert part.lifecycle.entered  # being entered
        with pytest.raises(RuntimeError, match="already serving"):
            await part.lifecycle.enter(part.serve)
        assert part.ready is not None
        part.ready.set()
    assert results == ["first entered"]
    assert part.events == ["serve", "cancelled"]


async def test_a_graceful_exit_stops_and_waits() -> None:
    part = Part(graceful=True)
    async with part:
        pass
    assert part.events == ["serve", "stop", "returned"]


async def test_a_graceful_exit_after_a_body_error_stops_and_waits() -> None:
    part = Part(graceful=True)
    with pytest.raises(Boom, match="from the body"):
        async with part:
            raise Boom("from the body")
    assert part.events == ["serve", "stop", "returned"]


async def test_a_cancelled_body_cancels_even_a_graceful_part() -> None:
    part = Part(graceful=True)
    with anyio.move_on_after(0.05) as scope:
        async with part:
            await anyio.sleep(5)
    assert scope.cancelled_caught
    assert part.events == ["serve", "stop", "cancelled"]


async def test_a_stop_that_fails_cancels_and_is_raised() -> None:
    lifecycle = Lifecycle("busy")
    part = Part()

    def stop() -> None:
        raise Boom("stop failed")

    await lifecycle.enter(part.serve, stop=stop, cancel=False)
    with pytest.raises(Boom, match="stop failed"):
        await lifecycle.exit(None)
    assert part.events == ["serve", "cancelled"]


async def test_an_error_of_serve_while_the_body_runs_is_raised_alone() -> None:
    """serve fails: the body is cancelled (it runs in the part's task group), and the exit
    raises serve's error, unwrapped."""
    part = Part()
    with pytest.raises(Boom, match="from serve") as info:
        async with part:
            part.fail.set()
            await anyio.sleep(5)
            pytest.fail("the body was not cancelled")
    assert not isinstance(info.value, BaseExceptionGroup)
    assert part.events == ["serve"]  # serve ended with its error, not a cancellation
    assert not part.lifecycle.entered


async def test_exit_without_entry_does_nothing() -> None:
    lifecycle = Lifecycle("busy")
    await lifecycle.exit(None)
    await lifecycle.exit(Boom("a body that never entered"))
    assert not lifecycle.entered


def test_single_error_unwraps_one_and_keeps_several() -> None:
    one = Boom("one")
    assert single_error(BaseExceptionGroup("", [BaseExceptionGroup("", [one])])) is one
    several = BaseExceptionGroup("", [Boom("a"), KeyError("b")])
    assert single_error(several) is several
