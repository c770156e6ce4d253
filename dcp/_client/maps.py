"""The windowed maps of both clients (``map``, ``map_unordered``, ``map_outcomes``): one
async and one blocking loop around the pure :class:`~dcp._core.client.window.Window`, which
decides what to send and what to yield (its Rules WN1 and WN5).

Rules:

Rule MP2 - The first failure is raised (``map``, ``map_unordered``); ``map_outcomes`` yields it.
Rule MP3 - However the generator ends (exhausted, failed, closed early, cancelled), the requests it
   still has outstanding are forgotten: the tracker stops resending them, and a late reply
   is counted and dropped.
Rule MP4 - These loops are the clients' per-request path for maps: besides the receiver's
   ``start`` and ``send`` and the result, a request costs a few calls of the window
   (``next_input``, ``sent``, ``next_result``) and makes no object of its own.

Rule MP5 - ``map_outcomes`` gives every input an outcome: an input whose request cannot start
   because no broker can be reached (:exc:`~dcp.BrokerUnreachable`, receive Rule RX7) has
   that error as its outcome, in its place, as the requests pending at the verdict do; what
   else starting a request raises (the client closed, metadata refused) is raised, as by
   ``map`` and ``map_unordered``, which raise that error too (Rule MP2).

The window keeps Rule WN1 (at most ``window`` outstanding).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Sequence
from typing import Any

from dcp._client.receive import Receiver, Start
from dcp._client.sync_receive import SyncReceiver
from dcp._client.waiters import Sink
from dcp._core.client.calls import Payload, Timing, payload_parts
from dcp._core.client.window import Window
from dcp._errors import BrokerUnreachable
from dcp._models import Outcome, Response

__all__ = ["map_async", "map_sync", "outcome_of", "response_of"]

#: Rule MP5: the id of an input that was never sent starts so (then its index).
_UNSENT = b"\0unsent"


async def map_async(
    receiver: Receiver,
    start: Start,
    sink: Sink,
    service: bytes,
    payloads: Iterable[Payload],
    size: int,
    metadata: Sequence[bytes],
    timing: Timing,
    *,
    ordered: bool,
    indexed: bool,
    take: Callable[[Outcome | None], object],
    outcomes: bool = False,
) -> AsyncGenerator[Any, None]:
    """Request ``service`` once per payload through ``receiver``, the outcomes arriving in
    ``sink``; yield ``take(outcome)`` as the window allows (Rules MP2-MP4), as ``(index,
    take(outcome))`` if ``indexed``; ``outcomes``: Rule MP5 (``map_outcomes``)."""
    window: Window[Payload, Outcome | None] = Window(
        payloads, size, ordered=ordered, arrived=sink.done
    )
    try:
        while True:
            item = window.next_input()
            if item is not None:
                index, payload = item
                try:
                    rid, frames = start(
                        service, payload_parts(payload, index), metadata, timing, sink
                    )
                except BrokerUnreachable as exc:
                    if not outcomes:
                        raise
                    unsent(window, index, exc)  # Rule MP5
                    continue
                window.sent(rid, index)
                await receiver.send(rid, frames)
                continue
            # Full, or no input left: the next outcome to yield, waiting for it.
            result = window.next_result()
            while result is None:
                if window.finished:
                    return
                await sink.wait(receiver.new_event)
                result = window.next_result()
            yield (result[0], take(result[1])) if indexed else take(result[1])
    finally:
        receiver.forget(window.outstanding())
        sink.forget()


def map_sync(
    receiver: SyncReceiver,
    service: bytes,
    payloads: Iterable[Payload],
    size: int,
    metadata: Sequence[bytes],
    timing: Timing,
    *,
    ordered: bool,
    indexed: bool,
    take: Callable[[Outcome], object],
    outcomes: bool = False,
) -> Generator[Any, None, None]:
    """:func:`map_async`, blocking: the outcomes arrive in the receiver's ``done`` while it
    pumps."""
    done = receiver.done
    window: Window[Payload, Outcome] = Window(payloads, size, ordered=ordered, arrived=done)
    try:
        while True:
            item = window.next_input()
            if item is not None:
                index, payload = item
                parts = payload_parts(payload, index)
                try:
                    rid = receiver.start(service, parts, metadata, timing)
                except BrokerUnreachable as exc:
                    if not outcomes:
                        raise
                    unsent(window, index, exc)  # Rule MP5
                    continue
                window.sent(rid, index)
                continue
            result = window.next_result()
            while result is None:
                if window.finished:
                    return
                receiver.pump()
                result = window.next_result()
            yield (result[0], take(result[1])) if indexed else take(result[1])
    finally:
        for rid in window.outstanding():
            receiver.forget(rid)


def unsent(window: Window[Payload, Any], index: int, error: BrokerUnreachable) -> None:
    """Rule MP5: input number ``index`` was not sent; ``error`` is its outcome."""
    rid = _UNSENT + index.to_bytes(8, "big")
    window.sent(rid, index)
    window.arrived[rid] = error


def response_of(outcome: Outcome) -> Response:
    """The response, or the failure raised (the sync client's ``map``, ``request``)."""
    if isinstance(outcome, Response):
        return outcome
    raise outcome


def outcome_of(outcome: Outcome) -> Outcome:
    """The outcome itself, failures included (``map_outcomes``)."""
    return outcome
