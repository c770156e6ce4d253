"""What dcp does with zmq's errors (httpcore's ``_exceptions.py``). They are caught here
and in the rest of :mod:`dcp._io` (the socket adapter's hot path), and no module outside
``dcp/_io`` catches ``zmq.ZMQError`` or ``zmq.Again`` itself (``tests/io/test_errors.py``
lists the few that still do).

zmq reports every failure as a :exc:`zmq.ZMQError` with an ``errno`` (:exc:`zmq.Again` for
``EAGAIN``); what one means depends on the call that raised it. The helpers here are named
by what it means to dcp, so the drivers see outcomes, not errnos.

Rules:

Rule Z1 - A send that finds the peer's queue full (``zmq.Again`` from a non-blocking send:
  the high-water mark) is :data:`FULL`, not an error: the caller decides what to do (the
  broker's core counts it and treats that peer as unreachable for now; a client or a worker
  waits and tries again). A multipart message is atomic: nothing of it was queued.
Rule Z2 - A send from a ``ROUTER_MANDATORY`` socket to a peer that has no connection
  (``EHOSTUNREACH``) is :data:`GONE`. Any other error of a send is the socket's own (closed,
  its context terminated), not the peer's doing: it is raised as
  :exc:`anyio.BrokenResourceError`, the zmq error its cause. (:func:`refusal`; the socket adapter's
  :meth:`~dcp._io.sockets.AsyncSocket.try_send` returns them, the broker sends with it.)
Rule Z3 - A bind or connect that failed is told in one line, ``cannot bind
  tcp://127.0.0.1:5555: Address already in use`` (:func:`endpoint_problem`): the endpoint
  zmq names (pyzmq appends it to the message), else the ones that were tried. What the
  line becomes is the caller's (the command line raises its own error with it:
  :func:`endpoint_errors`; a broker's bind, :exc:`dcp.BindFailed` with zmq's errno:
  :func:`bind_errors`).
Rule Z4 - A socket closed under us (by our own shutdown, its context terminated, a monitor
  already stopped) can no longer be used, and what zmq says about it then is not an error
  of ours: :func:`socket_errors` hands it to the caller's ``report`` (count it, log it,
  raise the caller's own error) or drops it.
"""

from __future__ import annotations

import contextlib
import errno
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Final

import anyio
import zmq

from dcp._errors import BindFailed

__all__ = [
    "FULL",
    "GONE",
    "bind_errors",
    "endpoint_errors",
    "endpoint_problem",
    "refusal",
    "socket_errors",
]

#: Rule Z1: the peer's queue is full (as the broker core counts it: ``worker_unreachable_full``).
FULL: Final = "full"
#: Rule Z2: the peer has no connection (``worker_unreachable_gone``).
GONE: Final = "gone"

_EHOSTUNREACH = errno.EHOSTUNREACH


def refusal(exc: zmq.ZMQError) -> str:
    """What a send's error says of the peer: :data:`FULL` (Rule Z1) or :data:`GONE` (Rule
    Z2); any other error is raised as :exc:`anyio.BrokenResourceError` (Rule Z2). Called in the
    ``except`` clause of a send (:meth:`~dcp._io.sockets.AsyncSocket.try_send`)."""
    if isinstance(exc, zmq.Again):
        return FULL
    if exc.errno == _EHOSTUNREACH:
        return GONE
    raise anyio.BrokenResourceError(f"the socket failed: {exc}") from exc


# pyzmq appends " (addr='...')" to the message of a failed bind or connect.
_ADDR = re.compile(r"(?P<reason>.*) \(addr='(?P<addr>.*)'\)")


def endpoint_problem(exc: zmq.ZMQError, verb: str, endpoints: Sequence[str]) -> str:
    """Rule Z3: one line for a failed bind or connect, ``cannot bind tcp://...: Address
    already in use``. ``endpoints`` name the attempt when zmq did not.

    :param verb: what was attempted (``"bind"``, ``"connect to"``)
    """
    text = str(exc)
    match = _ADDR.fullmatch(text)
    if match is not None:
        return f"cannot {verb} {match['addr']}: {match['reason']}"
    return f"cannot {verb} {', '.join(endpoints)}: {text}"


@contextlib.contextmanager
def endpoint_errors(
    verb: str, endpoints: Sequence[str], error: Callable[[str], BaseException]
) -> Iterator[None]:
    """Rule Z3: a zmq error raised in the block is raised again as ``error(line)`` (the line
    of :func:`endpoint_problem`), without the zmq error as its cause."""
    try:
        yield
    except zmq.ZMQError as exc:
        raise error(endpoint_problem(exc, verb, endpoints)) from None


@contextlib.contextmanager
def bind_errors(endpoint: str) -> Iterator[None]:
    """Rule Z3: a zmq error of a bind of ``endpoint`` in the block is raised again as
    :exc:`~dcp.BindFailed` (the line of :func:`endpoint_problem`, zmq's errno), without the zmq
    error as its cause."""
    try:
        yield
    except zmq.ZMQError as exc:
        line = endpoint_problem(exc, "bind", [endpoint])
        raise BindFailed(line, endpoint, exc.errno) from None


@contextlib.contextmanager
def socket_errors(report: Callable[[zmq.ZMQError], object] | None = None) -> Iterator[None]:
    """Rule Z4: a zmq error raised in the block (a socket closed under us) goes to
    ``report``, or nowhere, instead of on. ``report`` is called in the ``except`` clause:
    an error it raises has the zmq error as its context."""
    try:
        yield
    except zmq.ZMQError as exc:
        if report is not None:
            report(exc)
