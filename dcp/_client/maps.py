"""The windowed maps of both clients: ``map`` (replies in input order), ``map_unordered``
(as they arrive) and the sync client's ``map_outcomes``, as generators over one client.

Rules:

1. At most ``window`` requests are outstanding: sent, their outcome not yet yielded. A new
   payload is checked and sent only when that leaves room (so at most ``window`` outcomes
   are buffered).
2. The first failure is raised (``map``, ``map_unordered``); ``map_outcomes`` yields it.
3. However the generator ends (exhausted, failed, closed early, cancelled), the requests it
   still has outstanding are forgotten: the tracker stops resending them, and a late reply
   is counted and dropped.
4. These loops are the clients' per-request path for maps: each request costs the same
   calls here as it did as a method (``client._start``, ``client._send``, the result).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from dcp._client.waiters import Sink
from dcp._core.client.calls import Payload, Timing, payload_parts
from dcp._models import Outcome, Response

if TYPE_CHECKING:
    from dcp._client.client import Client
    from dcp._client.sync_client import SyncClient
    from dcp._client.tracing import Start

__all__ = [
    "map_async",
    "map_sync",
    "map_unordered_async",
    "map_unordered_sync",
    "outcome_of",
    "response_of",
]

_T = TypeVar("_T")


def _sink(client: Client) -> tuple[Sink, Start]:
    """Where a map's outcomes arrive, and how it starts requests (traced or not)."""
    start: Start = client._start
    if client._tracing is None:
        return Sink(), start
    return client._tracing.sink(start)


async def map_async(
    client: Client,
    service: bytes,
    payloads: Iterable[Payload],
    window: int,
    metadata: Sequence[bytes],
    timing: Timing,
) -> AsyncGenerator[Response, None]:
    sink, start = _sink(client)
    order: deque[bytes] = deque()
    done = sink.done
    try:
        for index, payload in enumerate(payloads):
            if len(order) >= window:
                while order[0] not in done:
                    await sink.wait()
                yield client._result(done.pop(order.popleft()))
            parts = payload_parts(payload, index)
            rid, frames = start(service, parts, metadata, timing, sink)
            order.append(rid)
            await client._send(rid, frames)
        while order:
            while order[0] not in done:
                await sink.wait()
            yield client._result(done.pop(order.popleft()))
    finally:
        client._forget(order)
        sink.forget()


async def map_unordered_async(
    client: Client,
    service: bytes,
    payloads: Iterable[Payload],
    window: int,
    metadata: Sequence[bytes],
    timing: Timing,
) -> AsyncGenerator[tuple[int, Response], None]:
    sink, start = _sink(client)
    inflight: dict[bytes, int] = {}
    done = sink.done
    try:
        for index, payload in enumerate(payloads):
            if len(inflight) >= window:
                while not done:
                    await sink.wait()
                rid = next(iter(done))
                yield inflight.pop(rid), client._result(done.pop(rid))
            parts = payload_parts(payload, index)
            rid, frames = start(service, parts, metadata, timing, sink)
            inflight[rid] = index
            await client._send(rid, frames)
        while inflight:
            while not done:
                await sink.wait()
            rid = next(iter(done))
            yield inflight.pop(rid), client._result(done.pop(rid))
    finally:
        client._forget(inflight)
        sink.forget()


def map_sync(
    client: SyncClient,
    service: bytes,
    payloads: Iterable[Payload],
    window: int,
    metadata: Sequence[bytes],
    timing: Timing,
    take: Callable[[Outcome], _T],
) -> Generator[_T, None, None]:
    order: deque[bytes] = deque()
    done = client._done
    pump = client._pump
    try:
        for index, payload in enumerate(payloads):
            if len(order) >= window:
                while order[0] not in done:
                    pump()
                yield take(done.pop(order.popleft()))
            rid = client._start(service, payload_parts(payload, index), metadata, timing)
            order.append(rid)
        while order:
            while order[0] not in done:
                pump()
            yield take(done.pop(order.popleft()))
    finally:
        for rid in order:
            client._forget(rid)


def map_unordered_sync(
    client: SyncClient,
    service: bytes,
    payloads: Iterable[Payload],
    window: int,
    metadata: Sequence[bytes],
    timing: Timing,
) -> Generator[tuple[int, Response], None, None]:
    inflight: dict[bytes, int] = {}
    try:
        for index, payload in enumerate(payloads):
            if len(inflight) >= window:
                yield _take_any(client, inflight)
            rid = client._start(service, payload_parts(payload, index), metadata, timing)
            inflight[rid] = index
        while inflight:
            yield _take_any(client, inflight)
    finally:
        for rid in inflight:
            client._forget(rid)


def _take_any(client: SyncClient, inflight: dict[bytes, int]) -> tuple[int, Response]:
    done = client._done
    while True:
        # ``done`` holds only outcomes nobody took yet: usually just this map's.
        for rid in done:
            if rid in inflight:
                return inflight.pop(rid), response_of(done.pop(rid))
        client._pump()


def response_of(outcome: Outcome) -> Response:
    """The response, or the failure raised (the sync client's ``map``, ``request``)."""
    if isinstance(outcome, Response):
        return outcome
    raise outcome


def outcome_of(outcome: Outcome) -> Outcome:
    """The outcome itself, failures included (``map_outcomes``)."""
    return outcome
