"""The broker core's own cost: microseconds of process CPU per request/reply cycle through
``BrokerCore.receive`` in memory (DCP, 16 B, window 64 from one client, 4 workers).

Run as a script (``python benchmarks/core_cycle.py``) so that ``PYTHONPATH`` picks the
``dcp`` tree to measure: ``python -m benchmarks.ab --core`` runs it for two revisions. It uses
only API every revision of the core has, in either layout (``dcp._core.broker.core``, or
``dcp._broker_core`` before the layer-first tree): ``receive``, the message classes, and the
outputs taken with ``drain()`` where the core has it (else from the ``outbox`` list). Prints
the best of ``--repeat`` runs of ``--count`` cycles.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

try:
    from dcp._core.broker.core import BrokerCore
except ImportError:  # the layout before the layer-first tree
    from dcp._broker_core import BrokerCore  # type: ignore[import-not-found,no-redef]
try:
    from dcp.wire import Register, Reply, Request, serialize
except ImportError:  # the wire names were public in dcp before they moved to dcp.wire
    from dcp import Register, Reply, Request, serialize  # type: ignore[attr-defined,no-redef]


def _taker(core: Any) -> Callable[[], list[list[bytes]]]:
    """How to take the core's messages to send (and its other outputs, discarded)."""
    drain = getattr(core, "drain", None)
    if drain is not None:

        def take() -> list[list[bytes]]:
            out: list[list[bytes]] = drain()[0]
            return out

        return take

    def take_outbox() -> list[list[bytes]]:
        out: list[list[bytes]] = core.outbox
        core.outbox = []
        return out

    return take_outbox


def cycle_us(count: int) -> float:
    core = BrokerCore()
    take = _taker(core)
    workers = [b"W%d" % i for i in range(4)]
    for worker in workers:
        core.receive([worker, *serialize(Register(b"echo"))], 0.0)
    take()
    requests = [
        [b"C1", *serialize(Request(b"echo", None, (b"rid%05d" % i,), (b"x" * 16,)))]
        for i in range(64)
    ]
    reply_data = (b"y" * 16,)
    done = i = 0
    start = time.process_time()
    while done < count:
        core.receive(requests[i & 63], 1.0)
        i += 1
        for frames in take():
            if frames[0] in workers:  # a request given to a worker: it answers
                # frames: worker, "", DGBX, type, service, client, "", rid, "", data
                reply = serialize(Reply(frames[5], (frames[7],), reply_data))
                core.receive([frames[0], *reply], 1.0)
                take()
                done += 1
    return (time.process_time() - start) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{min(cycle_us(args.count) for _ in range(args.repeat)):.3f}")


if __name__ == "__main__":
    main()
