"""What the broker core hands its driver (the contract of :mod:`dcp._core`), and the
bookkeeping every part of the core shares. Sans-IO.

Every part of :class:`~dcp._core.broker.core.BrokerCore` is given the one :class:`Outputs`
and writes to it, never to another part: ``outbox`` (the messages to send, each a
``list[bytes]`` with the peer's routing id first, in order), ``events`` (what else the driver
must do, in order: write a :class:`LogLine`, ask the approver an
:class:`~dcp._core.broker.approval.ApprovalRequest`), the broker's counters, and refusals.
The driver takes both lists with :meth:`Outputs.drain` (through ``BrokerCore.drain``).

Refusals (Rule R6 of :mod:`.core`) are counted by reason and logged once per reason per
minute of the core's clock (:class:`~dcp._util.LogEvery`): the line names the peer, and how
many more were refused meanwhile. Log lines left unread are bounded: past 4,096 of them, the
oldest goes (approval questions are never dropped).

What this module does NOT do: write logs (the driver does, from the events), or read a
clock (``now`` is the time of the input being handled, which the core sets).
"""

from __future__ import annotations

import logging
from typing import TypeAlias

import attrs

from dcp._core.broker.approval import ApprovalRequest
from dcp._core.broker.dialects import Dialect
from dcp._stats import BrokerCounters
from dcp._util import LogEvery, PeerId

__all__ = ["MAX_LOG_LINES", "Event", "LogLine", "Outputs"]

#: Log lines kept unread before the oldest goes.
MAX_LOG_LINES = 4096


@attrs.frozen
class LogLine:
    """A line for the operators' log, which the driver writes on the ``dcp.broker`` logger
    (``args`` format themselves only if a record is emitted)."""

    #: A :mod:`logging` level.
    level: int
    msg: str
    args: tuple[object, ...]


#: What the broker core asks of its driver besides sending messages.
Event: TypeAlias = "LogLine | ApprovalRequest"


class Outputs:
    """The broker core's outputs (the module's rules), shared by its parts.

    :param counters: the broker's counters (refusals are counted in ``rejections``)
    """

    __slots__ = ("_lines", "_log_every", "counters", "events", "now", "outbox")

    def __init__(self, counters: BrokerCounters) -> None:
        #: Messages to send, ROUTER-side (routing id first), in order. The two lists are
        #: never replaced (parts may keep a reference): :meth:`drain` empties them.
        self.outbox: list[list[bytes]] = []
        #: What else the driver must do, in order.
        self.events: list[Event] = []
        self.counters = counters
        #: The time of the input being handled (the core sets it before calling any part).
        self.now = 0.0
        self._lines = 0
        self._log_every = LogEvery()

    def drain(self) -> tuple[list[list[bytes]], list[Event]]:
        """The messages to send and the events, in order, taken (both lists left empty)."""
        outbox = self.outbox
        out = outbox[:]
        outbox.clear()
        events = self.events
        if not events:
            return out, []
        taken = events[:]
        events.clear()
        self._lines = 0
        return out, taken

    def reject(self, peer: bytes, reason: str, detail: str, *args: object) -> None:
        """Count a refused message, and log it once per reason per minute (the line names
        the peer, and how many more were refused meanwhile). ``detail % args`` is formatted
        only if the line is written."""
        self.counters.count(reason)
        line = self._log_every(
            reason,
            self.now,
            "rejected message from peer %s: %s (%s)",
            PeerId(peer),
            reason,
            Detail(detail, args) if args else detail,
        )
        if line is not None:
            # no_workers answers a no-wait request as the protocol says ("no responders",
            # what `dcp call` asks by default): news, not a misbehaving peer.
            level = logging.INFO if reason == "no_workers" else logging.WARNING
            self.note(level, line[0], *line[1])

    def refuse(
        self,
        client: bytes,
        origin: Dialect,
        name: bytes,
        metadata: tuple[bytes, ...],
        code: str,
        message: str,
    ) -> None:
        """Refuse a request: count, log once, and tell its client with an error reply (if
        its dialect has one: an MDP client is told nothing, majordomo Rule M1)."""
        self.reject(client, code, message)
        frames = origin.error(client, name, metadata, code, message)
        if frames is not None:
            self.outbox.append(frames)

    def note(self, level: int, msg: str, *args: object) -> None:
        """A line for the operators' log (an event; the driver writes it)."""
        events = self.events
        if self._lines >= MAX_LOG_LINES:
            for i, event in enumerate(events):
                if isinstance(event, LogLine):
                    del events[i]
                    break
        else:
            self._lines += 1
        events.append(LogLine(level, msg, args))


class Detail:
    """``text % args``, formatted only if a log record is emitted."""

    __slots__ = ("args", "text")

    def __init__(self, text: str, args: tuple[object, ...]) -> None:
        self.text = text
        self.args = args

    def __str__(self) -> str:
        return self.text % self.args
