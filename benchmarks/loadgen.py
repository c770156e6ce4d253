"""The common load generator: a plain synchronous pyzmq pipelined loop.

``python -m benchmarks.loadgen --proto dcp|mdp|proxy --endpoint ... --window 64 ...``

It keeps ``window`` requests in flight on each of ``clients`` DEALER sockets, matches replies
by an 8-byte request id, and records each request's round trip. Request frames per mode:

- ``dcp``: ``"" DGBX\\x01 0x04 service "" rid "" payload`` (the id is the metadata part);
  the reply is ``"" DGBX\\x01 0x05 client "" rid "" payload``.
- ``mdp`` (MDP 0.2 client, for majortomo): ``"" MDPC02 0x02 service rid payload``; the
  reply is ``"" MDPC02 0x04 rid payload``.
- ``proxy``: the ``dcp`` request; the echo workers behind ``zmq.proxy`` return it unchanged.

It is also the baseline of the client-CPU comparison (its own CPU per request is measured).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import zmq

from .common import (
    DCP,
    MDPC,
    LoadSettings,
    Probe,
    Result,
    add_load_arguments,
    emit,
    raise_fd_limit,
    settings_from_args,
)

__all__ = ["LoadGenerator", "main"]

_NOBLOCK = zmq.NOBLOCK
_ERROR_MARKER = b"\xffDCP-ERROR"


class LoadGenerator:
    """Keeps requests in flight on ``clients`` sockets; counts and times their replies."""

    def __init__(self, settings: LoadSettings, proto: str) -> None:
        self.s = settings
        self.proto = proto
        payload = b"x" * settings.payload
        if proto == "mdp":
            self.head: list[bytes] = [b"", MDPC, b"\x02", settings.service]
            self.tail: list[bytes] = [payload]
            self.rid_index = 3
            self.reply_type = (2, b"\x04")
        elif proto in ("dcp", "proxy"):
            self.head = [b"", DCP, b"\x04", settings.service, b""]
            self.tail = [b"", payload]
            self.rid_index = 5
            self.reply_type = (2, b"\x05" if proto == "dcp" else b"\x04")
        else:
            raise ValueError(f"unknown protocol {proto!r}")
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sockets: list[zmq.Socket[bytes]] = []
        self.poller = zmq.Poller()
        for _ in range(settings.clients):
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(settings.endpoint)
            self.sockets.append(sock)
            self.poller.register(sock, zmq.POLLIN)
        self.index = {sock: i for i, sock in enumerate(self.sockets)}
        self.inflight = [0] * settings.clients
        self.pending: dict[bytes, int] = {}
        self.seq = 0
        self.errors = 0
        self.unexpected = 0

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(0)
        self.ctx.term()

    def run_phase(
        self, count: int, duration: float, drain_timeout: float, latencies: list[int] | None
    ) -> int:
        """Send up to ``count`` requests for up to ``duration`` s, then wait up to
        ``drain_timeout`` s for the outstanding replies. Returns how many never came."""
        now = time.perf_counter_ns()
        send_until = now + int(duration * 1e9)
        sent = 0
        head, tail = self.head, self.tail
        pending = self.pending
        inflight = self.inflight
        window = self.s.window
        rid_index = self.rid_index
        type_index, type_frame = self.reply_type
        index = self.index
        poll = self.poller.poll
        clock = time.perf_counter_ns
        record = latencies.append if latencies is not None else None
        drain_deadline: int | None = None
        while True:
            sending = sent < count and now < send_until
            if sending:
                for i, sock in enumerate(self.sockets):
                    room = window - inflight[i]
                    while room > 0 and sent < count:
                        self.seq += 1
                        rid = self.seq.to_bytes(8, "little")
                        try:
                            sock.send_multipart([*head, rid, *tail], _NOBLOCK)
                        except zmq.Again:
                            break
                        pending[rid] = clock()
                        inflight[i] += 1
                        room -= 1
                        sent += 1
            elif not pending:
                return 0
            elif drain_deadline is None:
                drain_deadline = now + int(drain_timeout * 1e9)
            elif now >= drain_deadline:
                lost = len(pending)
                pending.clear()
                for i in range(len(inflight)):
                    inflight[i] = 0
                return lost
            events = poll(100)
            now = clock()
            for sock, _ in events:
                i = index[sock]
                while True:
                    try:
                        frames = sock.recv_multipart(_NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        ok = frames[type_index] == type_frame
                        t0 = pending.pop(frames[rid_index]) if ok else None
                    except (IndexError, KeyError):
                        t0 = None
                    if t0 is None:
                        self.unexpected += 1
                        continue
                    inflight[i] -= 1
                    if record is not None:
                        record(now - t0)
                    if len(frames) > rid_index + 2 and frames[rid_index + 2] == _ERROR_MARKER:
                        self.errors += 1
            now = clock()

    def run(self) -> Result:
        s = self.s
        probe = Probe(s.broker_pid, s.worker_pids)
        warm_lost = self.run_phase(s.warmup, s.warmup_timeout, s.warmup_timeout, None)
        if warm_lost:
            raise SystemExit(f"loadgen: {warm_lost} warm-up replies never came")
        latencies: list[int] = []
        probe.start()
        lost = self.run_phase(s.count, s.duration, s.drain_timeout, latencies)
        probe.stop()
        return Result.build(
            latencies, probe, lost=lost, errors=self.errors, unexpected=self.unexpected
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loadgen", description=__doc__)
    parser.add_argument("--proto", choices=["dcp", "mdp", "proxy"], default="dcp")
    add_load_arguments(parser)
    args = parser.parse_args(argv)
    raise_fd_limit()
    gen = LoadGenerator(settings_from_args(args), args.proto)
    try:
        result = gen.run()
    finally:
        gen.close()
    emit(result)


if __name__ == "__main__":
    main()
