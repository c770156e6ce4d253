"""What the worker core (:mod:`dcp._core.worker.core`) tells its driver besides the messages
to send: its state, and the events it puts in its ``events`` list."""

from __future__ import annotations

import enum
from typing import TypeAlias

import attrs

from dcp.wire.messages import Request

__all__ = [
    "BrokerLost",
    "Event",
    "Malformed",
    "Refused",
    "Replays",
    "Run",
    "State",
    "backoff_delay",
]


def backoff_delay(failures: int, low: float, high: float, rand: float) -> float:
    """Reconnect delay after ``failures`` consecutive failed connections.

    The ceiling doubles from ``low`` up to ``high``; the delay is drawn from the upper half
    below the ceiling (``rand`` in ``[0, 1)``) and is never below ``low``.
    """
    ceiling = min(high, low * 2.0 ** min(failures, 60))
    return max(low, ceiling * (0.5 + rand / 2))


class State(enum.Enum):
    """Where the worker stands with its broker."""

    #: No connection; :meth:`~dcp._core.worker.core.WorkerCore.connect` starts one.
    DISCONNECTED = "disconnected"
    #: REGISTER sent; waiting for the broker's echo.
    REGISTERING = "registering"
    #: Registered: the broker may dispatch requests.
    READY = "ready"
    #: Left for good after :meth:`~dcp._core.worker.core.WorkerCore.leave`.
    CLOSED = "closed"


@attrs.frozen
class Run:
    """Event: start the handler for :attr:`request`; pass :attr:`generation` back to
    :meth:`~dcp._core.worker.core.WorkerCore.finish`."""

    request: Request
    #: The registration the request came under (worker core Rule W2: only answers to requests of
    #: the current registration earn credit; the broker cannot match older ones).
    generation: int = attrs.field(default=0, eq=False)
    #: For a request started from the backlog (worker core Rule W4): when its caller gives up
    #: (its expires-in option counted from its arrival at the worker; ``math.inf``: never),
    #: for a driver that makes it wait again (one pool for several brokers). ``None``: it
    #: arrived now (count from now).
    deadline: float | None = attrs.field(default=None, eq=False)


@attrs.frozen
class BrokerLost:
    """Event: the broker is gone; close the socket, wait :attr:`delay` s, reconnect."""

    delay: float


@attrs.frozen
class Refused:
    """Event: the broker refused our registration (worker core Rule W10); stop serving."""

    #: The broker's explanation.
    message: str
    #: The service refused (not compared: one worker core refuses at most once).
    service: bytes = attrs.field(default=b"", eq=False)


@attrs.frozen
class Malformed:
    """Event: a message from the broker did not parse (counted as ``malformed``); the
    driver logs it."""

    #: The error's reason code (:attr:`dcp.RemoteProtocolError.reason`).
    reason: str
    #: What was wrong, for the log.
    message: str


@attrs.frozen
class Replays:
    """Event: send these answers again, best effort (worker core Rule W13): after the outbox
    (the fresh messages and HELD notices go first), only while the socket's send queue has
    room; the rest are dropped (counted: ``replays_dropped``). Newest first, so that what
    is dropped is the oldest (the least likely to have been lost)."""

    #: The messages, each ready for the socket.
    messages: tuple[list[bytes], ...]


#: What the core asks the driver to do besides sending (the items of
#: :attr:`~dcp._core.worker.core.WorkerCore.events`).
Event: TypeAlias = Run | BrokerLost | Refused | Malformed | Replays
