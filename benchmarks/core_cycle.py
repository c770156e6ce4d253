"""The broker core's own cost: microseconds of process CPU per request/reply cycle through
``BrokerCore.receive`` in memory (DCP, 16 B, window 64 from one client, 4 workers).

Run as a script (``python benchmarks/core_cycle.py``) so that ``PYTHONPATH`` picks the
``dcp`` tree to measure: ``python -m benchmarks.ab --core`` runs it for two revisions. It uses
only API every revision of the core has (``receive``, ``outbox``, the message classes). Prints
the best of ``--repeat`` runs of ``--count`` cycles.
"""

from __future__ import annotations

import argparse
import time

from dcp._core.broker.core import BrokerCore
from dcp.wire import Register, Reply, Request, serialize


def cycle_us(count: int) -> float:
    core = BrokerCore()
    workers = [b"W%d" % i for i in range(4)]
    for worker in workers:
        core.receive([worker, *serialize(Register(b"echo"))], 0.0)
    core.outbox = []
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
        out, core.outbox = core.outbox, []
        for frames in out:
            if frames[0] in workers:  # a request given to a worker: it answers
                # frames: worker, "", DGBX, type, service, client, "", rid, "", data
                reply = serialize(Reply(frames[5], (frames[7],), reply_data))
                core.receive([frames[0], *reply], 1.0)
                core.outbox = []
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
