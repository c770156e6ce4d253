"""The lifecycle of dcp's public async context managers, and unwrapping exception groups
at their edge.

A public part (a broker, a client, a worker) has a ``serve(*, task_status)`` that reports
through ``task_status.started`` once it is ready; ``async with part`` runs it in a task
group the part owns, entered as mqttproto's ``__aenter__`` does (``AsyncExitStack`` and
``pop_all()``), through one :class:`Lifecycle`::

    async def __aenter__(self) -> Part:
        await self._lifecycle.enter(self.serve)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._lifecycle.exit(exc)

Rules:

Rule E1 - Entering starts ``serve`` in a task group of the part's own and returns once
  ``serve`` is ready, with what it gave ``task_status.started``. If ``serve`` fails first
  (or the entering task is cancelled), nothing is left running and that error is raised.
Rule E2 - Exiting stops ``serve`` and returns once it has returned: ``stop()`` is called
  first, if given; then the task group is cancelled, or, with ``cancel=False`` (a graceful
  stop: ``stop`` makes ``serve`` return by itself), waited for, unless the body was
  cancelled (or ``stop`` failed): then it is cancelled at once. An error of ``serve`` is
  raised from the exit (the body's exception, if any, is its context).
Rule E3 - The body's own exception goes on as it is: it is not given to the task group,
  which would wrap it in an ``ExceptionGroup``.
Rule E4 - One real error is never handed out inside an ``ExceptionGroup`` (trio-websocket's
  ``open_websocket``): :func:`single_error` unwraps it. A group of several stays a group.
Rule E5 - A part is entered once at a time: entering it again before it has exited raises
  :exc:`RuntimeError` and leaves the first entry running. Exiting without entering does
  nothing; after an exit it may be entered again (if its ``serve`` allows that).
Rule E6 - Ctrl-C. On trio, a ``KeyboardInterrupt`` never lands inside entering or exiting
  (:meth:`Lifecycle.enter`, :meth:`Lifecycle.exit`, the parts' ``__aenter__`` and
  ``__aexit__``, marked :func:`ki_protected`), nor inside the serving task (its own task
  groups are exited as the part's is; the client's receive task and handshake watch are
  marked too): trio delivers it at the main task's next checkpoint instead, as it does for
  its own code, so a task group is never left half entered or half exited (trio's "Nursery
  stack corrupted"). The marks
  are handed to trio (``trio.lowlevel.enable_ki_protection``) the first time a part is
  entered while trio is imported: nothing imports trio for it. On asyncio, Ctrl-C cancels
  the main task (``asyncio.run``), which exiting handles as any cancellation (Rule E2).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

import anyio

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
else:  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found, unused-ignore]

__all__ = ["BaseExceptionGroup", "Lifecycle", "ki_protected", "single_error"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Rule E6: the functions trio must not interrupt with ``KeyboardInterrupt``, and whether
#: trio has been told (once it is imported and a part is entered).
_KI_PROTECTED: list[Callable[..., Any]] = []
_ki_told = False


def ki_protected(function: _F) -> _F:
    """Mark ``function`` (a part's ``__aenter__`` or ``__aexit__``) for trio's
    ``KeyboardInterrupt`` protection (Rule E6); returns it unchanged."""
    _KI_PROTECTED.append(function)
    if _ki_told:
        _tell_trio((function,))
    return function


def _protect_on_trio() -> None:
    """Rule E6: hand the marks to trio, if it is imported (a part is entered under trio, or
    trio is at least loaded; the marks do nothing elsewhere). Once."""
    global _ki_told
    if not _ki_told and "trio" in sys.modules:
        _ki_told = True
        _tell_trio(_KI_PROTECTED)


def _tell_trio(functions: Iterable[Callable[..., Any]]) -> None:
    import trio.lowlevel  # loaded already (see _protect_on_trio)

    for function in functions:
        # trio >= 0.28 records the code object: the function itself stays as it is.
        trio.lowlevel.enable_ki_protection(function)


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one real error of ``group`` (unwrapping nested groups), else the group itself
    (Rule E4)."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class Lifecycle:
    """One part's serving task, run for its ``async with`` blocks (Rules E1 to E5).

    :param busy: the message of the :exc:`RuntimeError` for entering twice (Rule E5)
    """

    def __init__(self, busy: str) -> None:
        self._busy = busy
        self._entering = False
        #: The task group's exit, while entered (its ``__aenter__`` ran in the entering task).
        self._stack: contextlib.AsyncExitStack | None = None
        self._scope: anyio.CancelScope | None = None
        self._stop: Callable[[], object] | None = None
        self._cancel = True

    @property
    def entered(self) -> bool:
        """Whether the part is entered (or being entered) and not exited yet."""
        return self._entering or self._stack is not None

    @ki_protected
    async def enter(
        self,
        serve: Callable[..., Coroutine[Any, Any, object]],
        *,
        stop: Callable[[], object] | None = None,
        cancel: bool = True,
    ) -> Any:
        """Start ``serve`` and wait until it is ready (Rule E1); call from ``__aenter__``.

        :param serve: the part's ``serve(*, task_status)``
        :param stop: called first on exit (Rule E2): a graceful stop, a close
        :param cancel: cancel ``serve`` on exit; ``False``: wait for it to return
        :returns: what ``serve`` gave ``task_status.started``
        :raises RuntimeError: the part is entered already (Rule E5)
        """
        if self.entered:
            raise RuntimeError(self._busy)
        _protect_on_trio()
        self._entering = True
        try:
            async with contextlib.AsyncExitStack() as stack:
                tg = await stack.enter_async_context(anyio.create_task_group())
                started = await tg.start(_serving, serve)
                self._stack = stack.pop_all()
        except BaseExceptionGroup as group:
            raise single_error(group) from None
        finally:
            self._entering = False
        self._scope = tg.cancel_scope
        self._stop = stop
        self._cancel = cancel
        return started

    @ki_protected
    async def exit(self, exc: BaseException | None) -> None:
        """Stop ``serve`` and wait until it has returned (Rules E2, E3); call from
        ``__aexit__`` with the body's exception. Does nothing unless entered.

        :raises BaseException: the error ``serve`` ended with, if any (unwrapped, Rule E4)
        """
        stack, self._stack = self._stack, None
        scope, self._scope = self._scope, None
        stop, self._stop = self._stop, None
        if stack is None or scope is None:
            return
        stopped = False
        try:
            if stop is not None:
                stop()
            stopped = True
        finally:
            if self._cancel or not stopped or isinstance(exc, anyio.get_cancelled_exc_class()):
                scope.cancel()
            try:
                await stack.aclose()
            except BaseExceptionGroup as group:
                raise single_error(group) from None


@ki_protected
async def _serving(
    serve: Callable[..., Coroutine[Any, Any, object]],
    *,
    task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
) -> object:
    """The serving task: ``serve``, protected from ``KeyboardInterrupt`` on trio (Rule E6)."""
    return await serve(task_status=task_status)
