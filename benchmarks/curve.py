"""What CURVE costs: the dcp broker, dcp.Worker and dcp.Client with and without security.

``python -m benchmarks.curve [--quick | --tiny] [--rounds N] [--json FILE]``, or
``--micro`` for the broker's own added cost alone, in process: a request/reply cycle
through the sans-IO core with and without the guard, and reading one message's sender key.

Per round and load, both modes run in a rotated order, each on fresh processes: ``dcp
broker`` (trio; with ``--keys``/``--allow-*`` for CURVE), one process with 4 echo
``dcp.Worker`` and one ``dcp.Client`` load process (:mod:`benchmarks.dcp_peers`). The table
shows medians over the rounds of throughput, median latency and the broker's CPU per
request, whole process (zmq's I/O thread does the encryption) and its Python thread alone
(the broker's own cost: sender keys, checks, sealing), and the CURVE / plain ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq

from dcp._core.broker.core import BrokerCore
from dcp._core.broker.guard import Guard
from dcp._io.security import write_key_pair
from dcp.wire import Register, Request, serialize

from .common import pid_list
from .procs import Procs
from .variants import START_TIMEOUT, Load

__all__ = ["main"]

MODES = ("plain", "curve")
FULL_LOADS = (
    Load(16, 64, 500, 30_000, 2.0),
    Load(16, 1, 200, 3_000, 2.0),
    Load(65_536, 16, 100, 3_000, 2.0),
)
QUICK_LOADS = (Load(16, 64, 200, 5_000, 1.0), Load(16, 1, 100, 1_000, 1.0))
TINY_LOADS = (Load(16, 64, 20, 200, 0.5),)
COLUMNS = ("rate", "p50_us", "broker_cpu_us", "broker_thread_cpu_us")


def _run_once(keys: Path, mode: str, load: Load) -> dict[str, Any]:
    broker_security: list[str] = []
    if mode == "curve":
        broker_security = [
            "--keys", str(keys / "broker.key_secret"),
            "--allow-client", str(keys / "client.key"),
            "--allow-worker", f"echo={keys / 'worker.key'}",
        ]  # fmt: skip

    def peer(name: str) -> list[str]:
        if mode != "curve":
            return []
        return [
            "--keys",
            str(keys / f"{name}.key_secret"),
            "--server-key",
            str(keys / "broker.key"),
        ]

    with Procs(keys) as procs:
        broker = procs.start(
            "broker", "dcp", "broker", "--bind", "tcp://127.0.0.1:0", *broker_security
        )
        [endpoint] = broker.wait_ready(START_TIMEOUT)
        workers = procs.start(
            "workers", "benchmarks.dcp_peers", *peer("worker"),
            "workers", "--endpoint", endpoint, "--count", "4",
        )  # fmt: skip
        workers.wait_ready(START_TIMEOUT)
        client = procs.start(
            "client", "benchmarks.dcp_peers", *peer("client"),
            "client", "--endpoint", endpoint, *load.argv(),
            "--broker-pid", str(broker.pid), "--worker-pids", pid_list([workers.pid]),
        )  # fmt: skip
        return client.result(30.0 + load.duration + 60.0)


def _label(load: Load) -> str:
    size = f"{load.payload // 1024} KiB" if load.payload >= 1024 else f"{load.payload} B"
    return f"{size}, window {load.window}"


def run(loads: Sequence[Load], rounds: int) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Raw results: ``{load label: {mode: [record per round]}}``."""
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="dcp-curve-") as tmp:
        keys = Path(tmp)
        for name in ("broker", "client", "worker"):
            write_key_pair(keys, name)
        for r in range(rounds):
            for load in loads:
                order = MODES[r % 2 :] + MODES[: r % 2]
                for mode in order:
                    record = _run_once(keys, mode, load)
                    if record["lost"] or record["errors"]:
                        raise SystemExit(f"{mode} {_label(load)}: lost or failed requests")
                    results.setdefault(_label(load), {}).setdefault(mode, []).append(record)
                    print(
                        f"round {r + 1} {_label(load):>17} {mode:>5}: "
                        f"{record['rate']:8.0f} req/s, broker {record['broker_cpu_us']:6.1f} us"
                        f"/req ({record['broker_thread_cpu_us']:5.1f} us Python thread)",
                        file=sys.stderr,
                    )
    return results


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """A Markdown table of medians and CURVE / plain ratios."""
    lines = [
        "| load | mode | req/s | p50 us | broker CPU us/req | broker Python thread us/req |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, modes in results.items():
        medians = {
            mode: {c: statistics.median(r[c] for r in records) for c in COLUMNS}
            for mode, records in modes.items()
        }
        for mode in MODES:
            m = medians[mode]
            lines.append(
                f"| {label} | {mode} | {m['rate']:.0f} | {m['p50_us']:.0f} | "
                f"{m['broker_cpu_us']:.1f} | {m['broker_thread_cpu_us']:.1f} |"
            )
        # A tiny run may measure 0 CPU (the kernel counts in clock ticks): no ratio then.
        ratio = {
            c: f"{medians['curve'][c] / medians['plain'][c]:.2f}" if medians["plain"][c] else "-"
            for c in COLUMNS
        }
        lines.append(
            f"| {label} | curve / plain | {ratio['rate']} | {ratio['p50_us']} | "
            f"{ratio['broker_cpu_us']} | {ratio['broker_thread_cpu_us']} |"
        )
    return "\n".join(lines)


def _core_cycle_us(secure: bool, n: int) -> float:
    """Microseconds per request/reply cycle through the broker core (one client, one
    worker, 16-byte request id and payload)."""
    worker, client = b"\x01" + b"w" * 15, b"\x01" + b"c" * 15
    wkey, ckey = "W" * 40, "C" * 40
    guard = Guard(lambda key, service: True, b"k" * 32) if secure else None
    core = BrokerCore(guard=guard)
    core.receive([worker, *serialize(Register(b"echo"))], 0.0, wkey)
    core.outbox.clear()
    request = [client, *serialize(Request(b"echo", None, (b"r" * 16,), (b"x" * 16,)))]
    receive = core.receive
    outbox = core.outbox
    start = time.perf_counter_ns()
    for _ in range(n):
        receive(request, 0.0, ckey)
        out = outbox[0]
        outbox.clear()
        receive([worker, b"", out[2], b"\x05", out[5], b"", out[7], b"", out[9]], 0.0, wkey)
        outbox.clear()
    return (time.perf_counter_ns() - start) / n / 1e3


def _user_id_us(n: int) -> float:
    """Microseconds to read a received frame's ``User-Id`` (CURVE over tcp)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    zap = ctx.socket(zmq.ROUTER)
    zap.bind("inproc://zeromq.zap.01")
    server_public, server_secret = zmq.curve_keypair()
    public, secret = zmq.curve_keypair()
    router = ctx.socket(zmq.ROUTER)
    router.curve_server = True
    router.curve_publickey, router.curve_secretkey = server_public, server_secret
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.curve_serverkey = server_public
    dealer.curve_publickey, dealer.curve_secretkey = public, secret
    dealer.connect(f"tcp://127.0.0.1:{port}")
    try:
        request = zap.recv_multipart()
        zap.send_multipart([*request[:2], b"1.0", request[3], b"200", b"OK", public, b""])
        dealer.send(b"x")
        frame = router.recv(copy=False)
        get = frame.get
        start = time.perf_counter_ns()
        for _ in range(n):
            get("User-Id")
        return (time.perf_counter_ns() - start) / n / 1e3
    finally:
        for sock in (dealer, router, zap):
            sock.close(0)
        ctx.term()


def _seal_us(n: int) -> float:
    """Microseconds to seal and unseal a fresh 16-byte address (the guard's cache off)."""
    guard = Guard(lambda key, service: True, b"k" * 32, cache=0)
    addresses = [os.urandom(16) for _ in range(1024)]
    seal, unseal = guard.seal, guard.unseal
    start = time.perf_counter_ns()
    for i in range(n):
        unseal(seal(addresses[i & 1023]))
    return (time.perf_counter_ns() - start) / n / 1e3


def micro(rounds: int) -> str:
    """Medians over ``rounds`` (interleaved) of the broker's own added costs."""
    plain: list[float] = []
    secure: list[float] = []
    user_id: list[float] = []
    seals: list[float] = []
    for r in range(rounds):
        pair = [(plain, False), (secure, True)]
        for values, on in pair if r % 2 == 0 else pair[::-1]:
            values.append(_core_cycle_us(on, 20_000))
        user_id.append(_user_id_us(100_000))
        seals.append(_seal_us(20_000))
    p, s, u, c = (statistics.median(v) for v in (plain, secure, user_id, seals))
    return "\n".join(
        [
            "| broker core, one request/reply cycle | us |",
            "|---|---:|",
            f"| without guard | {p:.2f} |",
            f"| with guard (principals, binding, sealing) | {s:.2f} ({s / p:.2f}x) |",
            f"| reading one message's User-Id | {u:.2f} |",
            f"| sealing and unsealing a fresh address (cache off) | {c:.2f} |",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.curve", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short loads")
    parser.add_argument("--tiny", action="store_true", help="one tiny load (a smoke test)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the raw records here")
    parser.add_argument("--micro", action="store_true", help="in-process costs only")
    args = parser.parse_args(argv)
    if args.micro:
        print(micro(args.rounds))
        return
    loads = TINY_LOADS if args.tiny else QUICK_LOADS if args.quick else FULL_LOADS
    results = run(loads, args.rounds)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
