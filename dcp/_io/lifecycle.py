"""Unwrapping exception groups at the edge of a public context manager.

A context manager that owns a task group must not hand its caller an ``ExceptionGroup``
when there is one real error (trio-websocket's ``open_websocket`` rule).
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
else:  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found, unused-ignore]

__all__ = ["BaseExceptionGroup", "single_error"]


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one real error of ``group`` (unwrapping nested groups), else the group itself."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
