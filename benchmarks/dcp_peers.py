"""dcp's own peers under the same measurement as the common load generator.

``python -m benchmarks.dcp_peers client --mode async|sync [--backend trio|asyncio] ...``
drives :class:`dcp.Client` (``map_unordered`` with ``window`` in flight, or ``request`` one
at a time for window 1) or :class:`dcp.SyncClient` the same way, and prints the common
result record.

``python -m benchmarks.dcp_peers workers --endpoint ... --count 4`` runs ``count``
:class:`dcp.Worker` echo workers in one process and prints ``READY`` once all registered.

``--keys FILE --server-key FILE`` (before the command) turns CURVE on for either.
``client --trace`` gives the client ``tracing=`` an OpenTelemetry SDK provider whose spans
go through a batch processor to an exporter that drops them (the cost of tracing in the
client, without any network export; :mod:`benchmarks.tracing`).

Requests are sent with no retries and a per-attempt timeout longer than the whole run, so a
reply the broker loses shows up as lost, not as a silent retry.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence
from typing import Any

import anyio

import dcp

from .common import (
    LoadSettings,
    Probe,
    Result,
    add_load_arguments,
    emit,
    raise_fd_limit,
    ready,
    settings_from_args,
)

__all__ = ["main"]

_clock = time.perf_counter_ns


class _Phase:
    """Payload source that stops after ``count`` items or ``duration`` seconds and
    remembers when each request was handed to the client."""

    def __init__(self, payload: bytes, count: int, duration: float) -> None:
        self.payload = payload
        self.count = count
        self.duration = duration
        self.starts: list[int] = []

    def __iter__(self) -> Iterator[bytes]:
        end = _clock() + int(self.duration * 1e9)
        starts = self.starts
        for _ in range(self.count):
            t = _clock()
            if t >= end:
                return
            starts.append(t)
            yield self.payload


async def _async_phase(
    client: dcp.Client, s: LoadSettings, count: int, duration: float, attempt_timeout: float
) -> tuple[list[int], int, int]:
    """Returns latencies (ns), lost and error counts."""
    payload = b"x" * s.payload
    latencies: list[int] = []
    errors = 0
    if s.window == 1:
        end = _clock() + int(duration * 1e9)
        for _ in range(count):
            t0 = _clock()
            if t0 >= end:
                break
            try:
                await client.request(s.service, payload, timeout=attempt_timeout)
            except dcp.RequestTimeout:
                return latencies, 1, errors
            except dcp.RemoteError:
                errors += 1
            latencies.append(_clock() - t0)
        return latencies, 0, errors
    phase = _Phase(payload, count, duration)
    starts = phase.starts
    try:
        async for i, _ in client.map_unordered(
            s.service, phase, window=s.window, timeout=attempt_timeout
        ):
            latencies.append(_clock() - starts[i])
    except dcp.RequestTimeout:
        return latencies, len(starts) - len(latencies), errors
    return latencies, 0, errors


def _provider() -> Any:
    """An SDK tracer provider that records every span and drops it when exported."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    return provider


async def _run_async(
    s: LoadSettings, security: dcp.CurveClient | None = None, trace: bool = False
) -> Result:
    probe = Probe(s.broker_pid, s.worker_pids)
    async with dcp.Client(
        s.endpoint,
        timeout=s.warmup_timeout,
        retries=0,
        security=security,
        tracing=_provider() if trace else False,
    ) as client:
        _, lost, _ = await _async_phase(client, s, s.warmup, s.warmup_timeout, s.warmup_timeout)
        if lost:
            raise SystemExit("dcp client: warm-up requests lost")
        probe.start()
        latencies, lost, errors = await _async_phase(
            client, s, s.count, s.duration, s.duration + s.drain_timeout
        )
        probe.stop()
        extra = {"retries": client.statistics().retries}
    return Result.build(latencies, probe, lost=lost, errors=errors, extra=extra)


def _sync_phase(
    client: dcp.SyncClient, s: LoadSettings, count: int, duration: float, timeout: float
) -> tuple[list[int], int, int]:
    payload = b"x" * s.payload
    latencies: list[int] = []
    errors = 0
    if s.window == 1:
        end = _clock() + int(duration * 1e9)
        for _ in range(count):
            t0 = _clock()
            if t0 >= end:
                break
            try:
                client.request(s.service, payload, timeout=timeout)
            except dcp.RequestTimeout:
                return latencies, 1, errors
            except dcp.RemoteError:
                errors += 1
            latencies.append(_clock() - t0)
        return latencies, 0, errors
    phase = _Phase(payload, count, duration)
    starts = phase.starts
    try:
        for i, _ in client.map_unordered(s.service, phase, window=s.window, timeout=timeout):
            latencies.append(_clock() - starts[i])
    except dcp.RequestTimeout:
        return latencies, len(starts) - len(latencies), errors
    return latencies, 0, errors


def _run_sync(s: LoadSettings, trace: bool = False) -> Result:
    probe = Probe(s.broker_pid, s.worker_pids)
    tracing = _provider() if trace else False
    with dcp.SyncClient(
        s.endpoint, timeout=s.warmup_timeout, retries=0, tracing=tracing
    ) as client:
        _, lost, _ = _sync_phase(client, s, s.warmup, s.warmup_timeout, s.warmup_timeout)
        if lost:
            raise SystemExit("dcp sync client: warm-up requests lost")
        probe.start()
        latencies, lost, errors = _sync_phase(
            client, s, s.count, s.duration, s.duration + s.drain_timeout
        )
        probe.stop()
        extra = {"retries": client.statistics().retries}
    return Result.build(latencies, probe, lost=lost, errors=errors, extra=extra)


async def _echo(request: dcp.HandlerRequest) -> Sequence[bytes]:
    return request.data


async def _run_workers(
    endpoint: str,
    service: str,
    count: int,
    concurrency: int,
    security: dcp.CurveClient | None = None,
    prefetch: int = 0,
) -> None:
    async with anyio.create_task_group() as tg:
        for _ in range(count):
            worker = dcp.Worker(
                endpoint,
                service,
                _echo,
                concurrency=concurrency,
                security=security,
                prefetch=prefetch,
            )
            await tg.start(worker.serve)
        ready(str(count))
        await anyio.sleep_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dcp_peers", description=__doc__)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--uvloop", action="store_true", help="asyncio on uvloop")
    parser.add_argument("--keys", help="CURVE: this peer's NAME.key_secret file")
    parser.add_argument("--server-key", help="CURVE: the broker's NAME.key file")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("client")
    p.add_argument("--mode", choices=["async", "sync"], default="async")
    p.add_argument("--trace", action="store_true", help="tracing on (OpenTelemetry SDK)")
    add_load_arguments(p)
    p = sub.add_parser("workers")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--service", default="echo")
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--prefetch", type=int, default=0, help="each worker's (dcp.Worker)")
    args = parser.parse_args(argv)
    raise_fd_limit()
    options = {"use_uvloop": True} if args.uvloop and args.backend == "asyncio" else {}
    security = None
    if args.keys is not None:
        security = dcp.CurveClient.from_files(args.keys, server=args.server_key)
    if args.command == "workers":
        anyio.run(
            _run_workers,
            args.endpoint,
            args.service,
            args.count,
            args.concurrency,
            security,
            args.prefetch,
            backend=args.backend,
            backend_options=options,
        )
        return
    settings = settings_from_args(args)
    if settings.clients != 1:
        raise SystemExit("dcp_peers client: one client per process")
    if args.mode == "sync":
        if security is not None:
            raise SystemExit("dcp_peers client: --keys with --mode async only")
        result = _run_sync(settings, args.trace)
    else:
        result = anyio.run(
            _run_async,
            settings,
            security,
            args.trace,
            backend=args.backend,
            backend_options=options,
        )
    result.extra["mode"] = f"{args.mode}/{args.backend}" if args.mode == "async" else "sync"
    emit(result)


if __name__ == "__main__":
    main()
