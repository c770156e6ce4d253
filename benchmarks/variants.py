"""The variants compared: which broker, which workers and which load generator.

Each variant starts as separate processes: the broker, one process with the echo workers
(``WORKERS`` workers; many sockets or tasks or threads in it) and, per measured load, one
load-generating process. All over ``tcp://127.0.0.1`` on ports picked by the kernel.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from .common import pid_list
from .procs import Procs

__all__ = ["CLIENT_KINDS", "VARIANTS", "WORKERS", "Load", "Running", "Variant", "start"]

#: Echo workers per variant.
WORKERS = 4
#: Seconds a process may take to come up.
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class Variant:
    name: str
    #: ``dcp`` (trio), ``dcp-asyncio``, ``majortomo``, ``majortomo-cli``, ``minimal``, ``proxy``
    broker: str
    #: ``common`` (common load generator and echo workers), ``dcp`` or ``majortomo``
    peers: str
    description: str
    #: Wire protocol of the common peers (``dcp``, ``mdp`` or ``proxy``); empty: the one
    #: the broker speaks (``mdp`` for majortomo, ``proxy`` for zmq.proxy, else ``dcp``).
    proto: str = ""

    @property
    def common_proto(self) -> str:
        """What the common load generator and echo workers speak in this variant."""
        return self.proto or _PROTO.get(self.broker, "dcp")


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant(
            "dcp",
            "dcp",
            "common",
            "`dcp broker` (trio), common load generator and echo workers",
        ),
        Variant(
            "dcp-asyncio",
            "dcp-asyncio",
            "common",
            "`dcp --backend asyncio broker`, common load generator and echo workers",
        ),
        Variant(
            "dcp-own",
            "dcp",
            "dcp",
            "`dcp broker` (trio), dcp.Client (trio; map_unordered / request) and 4 dcp.Worker",
        ),
        Variant(
            "majortomo",
            "majortomo",
            "common",
            "majortomo 0.2.0 broker, common load generator and echo workers in MDP 0.2 mode",
        ),
        Variant(
            "majortomo-cli",
            "majortomo-cli",
            "common",
            "`python -m majortomo.broker` as shipped (INFO logging of every message to stderr, "
            "here a file), common load generator and echo workers in MDP 0.2 mode",
        ),
        Variant(
            "majortomo-own",
            "majortomo",
            "majortomo",
            "majortomo 0.2.0 broker, its Client (one per request in flight) and Worker "
            "(one thread each)",
        ),
        Variant(
            "dcp-mdp",
            "dcp",
            "common",
            "`dcp broker` (trio), common load generator and echo workers in MDP 0.2 mode "
            "(majortomo's variant, as in *majortomo*)",
            proto="mdp",
        ),
        Variant(
            "dcp-majortomo-own",
            "dcp",
            "majortomo",
            "`dcp broker` (trio), majortomo's Client (one per request in flight) and Worker "
            "(one thread each), as in *majortomo-own*",
        ),
        Variant(
            "minimal",
            "minimal",
            "common",
            "minimal synchronous pyzmq DCP broker, common load generator and echo workers",
        ),
        Variant(
            "zmq.proxy",
            "proxy",
            "common",
            "zmq.proxy (ROUTER/DEALER in C), common load generator, echo workers returning "
            "the envelope",
        ),
    ]
}

#: Load generators of the client-CPU comparison (against the dcp broker).
CLIENT_KINDS: dict[str, list[str]] = {
    "plain pyzmq loop": ["benchmarks.loadgen", "--proto", "dcp"],
    "dcp.Client (trio)": ["benchmarks.dcp_peers", "--backend", "trio", "client"],
    "dcp.Client (asyncio)": ["benchmarks.dcp_peers", "--backend", "asyncio", "client"],
    "dcp.SyncClient": ["benchmarks.dcp_peers", "client", "--mode", "sync"],
}


#: Protocol of the common load generator and echo workers, per broker (default: dcp).
_PROTO = {"majortomo": "mdp", "majortomo-cli": "mdp", "proxy": "proxy"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for brokers that need one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Load:
    payload: int
    window: int
    warmup: int
    count: int
    duration: float
    clients: int = 1

    def argv(self) -> list[str]:
        return [
            "--payload",
            str(self.payload),
            "--window",
            str(self.window),
            "--clients",
            str(self.clients),
            "--warmup",
            str(self.warmup),
            "--count",
            str(self.count),
            "--duration",
            str(self.duration),
        ]


@dataclass
class Running:
    """A started variant: where clients connect, what to probe, how to load it."""

    variant: Variant
    endpoint: str
    broker_pid: int
    worker_pids: list[int] = field(default_factory=list)

    def client_argv(self, load: Load, kind: list[str] | None = None) -> list[str]:
        if kind is None:
            peers = self.variant.peers
            if peers == "dcp":
                kind = ["benchmarks.dcp_peers", "--backend", "trio", "client"]
            elif peers == "majortomo":
                kind = ["benchmarks.mdp", "client"]
            else:
                kind = ["benchmarks.loadgen", "--proto", self.variant.common_proto]
        return [
            *kind,
            "--endpoint",
            self.endpoint,
            *load.argv(),
            "--broker-pid",
            str(self.broker_pid),
            "--worker-pids",
            pid_list(self.worker_pids),
        ]

    def run(self, procs: Procs, load: Load, kind: list[str] | None = None) -> dict[str, object]:
        """Run one load in a fresh client process and return its result record."""
        proc = procs.start("client", *self.client_argv(load, kind))
        timeout = 30.0 + load.duration + 15.0 + 30.0
        return proc.result(timeout)


def start_broker(procs: Procs, kind: str) -> tuple[str, str, int]:
    """Start a broker; returns (client endpoint, worker endpoint, pid)."""
    bind = "tcp://127.0.0.1:0"
    if kind in ("dcp", "dcp-asyncio"):
        backend = "asyncio" if kind == "dcp-asyncio" else "trio"
        proc = procs.start("dcp-broker", "dcp", "--backend", backend, "broker", "--bind", bind)
        [endpoint] = proc.wait_ready(START_TIMEOUT)
        return endpoint, endpoint, proc.pid
    if kind == "majortomo":
        proc = procs.start("majortomo-broker", "benchmarks.mdp", "broker", "--bind", bind)
        [endpoint] = proc.wait_ready(START_TIMEOUT)
        return endpoint, endpoint, proc.pid
    if kind == "majortomo-cli":
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        proc = procs.start("majortomo-cli", "majortomo.broker", "--bind-url", endpoint)
        # It prints nothing on stdout; peers connect whenever it is up, and the warm-up
        # waits for them.
        return endpoint, endpoint, proc.pid
    if kind == "minimal":
        proc = procs.start("minimal-broker", "benchmarks.minimal_broker", "--bind", bind)
        [endpoint] = proc.wait_ready(START_TIMEOUT)
        return endpoint, endpoint, proc.pid
    if kind == "proxy":
        proc = procs.start("proxy", "benchmarks.proxy")
        front, back = proc.wait_ready(START_TIMEOUT)
        return front, back, proc.pid
    raise ValueError(f"unknown broker {kind!r}")


def start_echo_workers(
    procs: Procs,
    endpoint: str,
    proto: str,
    sockets: int,
    *options: str,
) -> int:
    proc = procs.start(
        "echo-workers",
        "benchmarks.echo_worker",
        "--proto",
        proto,
        "--endpoint",
        endpoint,
        "--sockets",
        str(sockets),
        *options,
    )
    proc.wait_ready(START_TIMEOUT)
    return proc.pid


def start(procs: Procs, variant: Variant, workers: int = WORKERS) -> Running:
    """Start the broker and the workers of ``variant`` (ready when this returns)."""
    client_ep, worker_ep, pid = start_broker(procs, variant.broker)
    if variant.peers == "dcp":
        proc = procs.start(
            "dcp-workers",
            "benchmarks.dcp_peers",
            "workers",
            "--endpoint",
            worker_ep,
            "--count",
            str(workers),
        )
        proc.wait_ready(START_TIMEOUT)
        wpid = proc.pid
    elif variant.peers == "majortomo":
        proc = procs.start(
            "majortomo-workers",
            "benchmarks.mdp",
            "workers",
            "--endpoint",
            worker_ep,
            "--count",
            str(workers),
        )
        proc.wait_ready(START_TIMEOUT)
        wpid = proc.pid
    else:
        wpid = start_echo_workers(procs, worker_ep, variant.common_proto, workers)
    return Running(variant, client_ep, pid, [wpid])
