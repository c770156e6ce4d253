"""Services for the ``dcp.spark`` tests: a real broker and workers on an event loop in a
background thread of the test process, and handlers that record what they saw.

The handler of ``svc`` answers by the payload:

- ``bad...``: raises (an error reply ``handler_error``);
- ``two``: two data parts; ``none``: no data part;
- ``slow...``: sleeps 2 ms, then upper-cases;
- ``big:N:...``: sleeps 2 ms, then replies with N bytes: the payload, repeated;
- anything else: upper-cased (bytes that are not UTF-8 come back as they are).

:func:`slow_echo` is for ``dcp worker`` subprocesses (``tests.spark.services:slow_echo``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator

import anyio
import anyio.from_thread
import attrs

import dcp
from dcp._models import HandlerRequest
from dcp.wire.options import OPTION_PREFIX, REQUEST_ID_PREFIX

__all__ = ["Recorder", "Services", "services", "slow_echo"]

_EXPIRES_IN = OPTION_PREFIX + b"expires-in="


@attrs.define
class Recorder:
    """What the ``svc`` handler saw (the handler runs in the services' thread)."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
    #: Every request id (first metadata part) seen, in arrival order.
    ids: list[bytes] = attrs.field(factory=list)
    #: The metadata parts after the request id, per request.
    options: list[tuple[bytes, ...]] = attrs.field(factory=list)
    payloads: list[bytes] = attrs.field(factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    #: Per client (the request ids' 8-byte prefix: one per SyncClient, so one per Spark
    #: task): requests in the handler, and their most at once.
    client_in_flight: dict[bytes, int] = attrs.field(factory=dict)
    client_max_in_flight: dict[bytes, int] = attrs.field(factory=dict)

    def clear(self) -> None:
        with self.lock:
            self.ids.clear()
            self.options.clear()
            self.payloads.clear()
            self.in_flight = self.max_in_flight = 0
            self.client_in_flight.clear()
            self.client_max_in_flight.clear()


@attrs.frozen
class Services:
    endpoint: str
    broker: dcp.Broker
    recorder: Recorder
    portal: anyio.from_thread.BlockingPortal

    def statistics(self) -> dcp.BrokerStatistics:
        """The broker's counters, read in the broker's own thread."""
        return self.portal.call(_statistics, self.broker)


async def _statistics(broker: dcp.Broker) -> dcp.BrokerStatistics:
    return broker.statistics()


def _handler(recorder: Recorder) -> Callable[[HandlerRequest], Awaitable[bytes | list[bytes]]]:
    async def svc(request: HandlerRequest) -> bytes | list[bytes]:
        data = request.data[0] if request.data else b""
        # The 8 random bytes after REQUEST_ID_PREFIX: one prefix per SyncClient.
        client = request.dcp_metadata[0][len(REQUEST_ID_PREFIX) :][:8]
        with recorder.lock:
            # The request id (dcp's, in dcp_metadata), then the rest as sent but the
            # deadline (expires-in), which changes from attempt to attempt.
            own, ours = request.metadata, request.dcp_metadata
            recorder.ids.append(ours[0])
            recorder.options.append(
                tuple(m for m in (*ours[1:], *own) if not m.startswith(_EXPIRES_IN))
            )
            recorder.payloads.append(data)
            recorder.in_flight += 1
            recorder.max_in_flight = max(recorder.max_in_flight, recorder.in_flight)
            now = recorder.client_in_flight[client] = recorder.client_in_flight.get(client, 0) + 1
            top = recorder.client_max_in_flight.get(client, 0)
            recorder.client_max_in_flight[client] = max(top, now)
        try:
            if data.startswith((b"slow", b"big:")):
                await anyio.sleep(0.002)
            if data.startswith(b"big:"):
                size = int(data.split(b":")[1])
                return (data * (size // len(data) + 1))[:size]
            if data.startswith(b"bad"):
                raise ValueError(f"refused {data!r}")
            if data == b"two":
                return [b"a", b"b"]
            if data == b"none":
                return []
            return data.upper()
        finally:
            with recorder.lock:
                recorder.in_flight -= 1
                recorder.client_in_flight[client] -= 1

    return svc


@contextlib.contextmanager
def services(*, concurrency: int = 64, **broker_options: float) -> Iterator[Services]:
    """A broker on 127.0.0.1 and one ``svc`` worker (none for ``concurrency=0``), both in
    a background thread."""
    recorder = Recorder()
    broker = dcp.Broker("tcp://127.0.0.1:0", **broker_options)  # type: ignore[arg-type]
    with anyio.from_thread.start_blocking_portal() as portal:
        _, endpoints = portal.start_task(broker.serve)
        if concurrency:
            worker = dcp.Worker(endpoints[0], b"svc", _handler(recorder), concurrency=concurrency)
            portal.start_task(worker.serve)
        try:
            yield Services(endpoints[0], broker, recorder, portal)
        finally:
            portal.call(portal.stop, True)


async def slow_echo(request: dcp.HandlerRequest) -> bytes:
    """Sleep 5 ms, then reply with the request's first data part, upper-cased."""
    await anyio.sleep(0.005)
    return request.data[0].upper()
