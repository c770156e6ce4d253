"""majortomo 0.2.0 (an MDP 0.2 broker on PyPI) with its own peers.

- ``python -m benchmarks.mdp broker --bind tcp://127.0.0.1:0``: :class:`majortomo.Broker`
  with its default heartbeat settings and logging left unconfigured (the cheapest way to run
  it: its per-message ``log.info`` calls are filtered out); prints ``READY <endpoint>``.
- ``python -m benchmarks.mdp workers --endpoint ... --count 4``: ``count``
  :class:`majortomo.Worker` echo workers, one thread each (its worker API blocks on one
  socket), in one process.
- ``python -m benchmarks.mdp client ...``: :class:`majortomo.Client`, which allows one
  request in flight per client; a window of ``W`` is ``W`` clients in one process, each
  sending its next request when its reply arrived.

majortomo imports ``six`` without declaring it; the ``bench`` extra installs it.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence

import zmq
from majortomo import Client, Worker
from majortomo.broker import Broker

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


class _AnnouncingBroker(Broker):
    def bind(self) -> None:
        super().bind()  # type: ignore[no-untyped-call]
        ready(self._socket.getsockopt_string(zmq.LAST_ENDPOINT))


def _work(endpoint: str, service: str, started: threading.Barrier) -> None:
    worker = Worker(endpoint, service, zmq_linger=0)
    worker.connect()
    started.wait()
    while True:
        client, request = worker.wait_for_request()
        worker.send_reply_final(client, request)


def _run_workers(endpoint: str, service: str, count: int) -> None:
    started = threading.Barrier(count + 1)
    for _ in range(count):
        threading.Thread(target=_work, args=(endpoint, service, started), daemon=True).start()
    started.wait(timeout=30)
    ready(str(count))
    threading.Event().wait()


def _phase(
    clients: list[Client], s: LoadSettings, count: int, duration: float, drain: float
) -> tuple[list[int], int]:
    """``len(clients)`` requests in flight, one per client. Returns latencies and lost."""
    payload = b"x" * s.payload
    service = s.service
    poller = zmq.Poller()
    by_socket = {}
    for c in clients:
        poller.register(c._socket, zmq.POLLIN)
        by_socket[c._socket] = c
    t0: dict[Client, int] = {}
    latencies: list[int] = []
    sent = 0
    end = _clock() + int(duration * 1e9)
    for c in clients:
        if sent >= count:
            break
        t0[c] = _clock()
        c.send(service, payload)
        sent += 1
    drain_end: int | None = None
    while t0:
        events = poller.poll(100)
        now = _clock()
        for sock, _ in events:
            c = by_socket[sock]
            c.recv_all_as_list(timeout=1.0)
            latencies.append(now - t0.pop(c))
            if sent < count and now < end:
                t0[c] = _clock()
                c.send(service, payload)
                sent += 1
        if drain_end is None and (sent >= count or now >= end):
            drain_end = now + int(drain * 1e9)
        if drain_end is not None and now >= drain_end:
            break
    return latencies, len(t0)


def _run_client(s: LoadSettings) -> Result:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    clients = [Client(s.endpoint, zmq_context=ctx, zmq_linger=0) for _ in range(s.window)]
    try:
        for c in clients:
            c.connect()
        _, lost = _phase(clients, s, s.warmup, s.warmup_timeout, s.warmup_timeout)
        if lost:
            raise SystemExit("majortomo client: warm-up requests lost")
        probe = Probe(s.broker_pid, s.worker_pids)
        probe.start()
        latencies, lost = _phase(clients, s, s.count, s.duration, s.drain_timeout)
        probe.stop()
    finally:
        for c in clients:
            c.close()  # type: ignore[no-untyped-call]
        ctx.term()
    return Result.build(latencies, probe, lost=lost)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mdp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("broker")
    p.add_argument("--bind", default="tcp://127.0.0.1:0")
    p = sub.add_parser("workers")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--service", default="echo")
    p.add_argument("--count", type=int, default=4)
    p = sub.add_parser("client")
    add_load_arguments(p)
    args = parser.parse_args(argv)
    raise_fd_limit()
    if args.command == "broker":
        _AnnouncingBroker(bind=args.bind).run()  # type: ignore[no-untyped-call]
    elif args.command == "workers":
        _run_workers(args.endpoint, args.service, args.count)
    else:
        emit(_run_client(settings_from_args(args)))


if __name__ == "__main__":
    main()
