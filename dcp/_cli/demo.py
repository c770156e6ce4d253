"""``dcp demo``: an embedded broker, a two-hop DAG of workers, and clients pushing load.

The services do real (small) work on real text:

- ``normalize`` lower-cases a sentence, strips punctuation and splits it into words, then
  *forwards* the words to ``stats`` (the reply goes straight back to the client);
- ``stats`` counts words and characters and finds the longest word, and replies.

Several clients push a few thousand sentences through the DAG concurrently; a progress bar
runs meanwhile, and a summary (requests, errors, throughput, latency percentiles) is printed
at the end.
"""

from __future__ import annotations

import json
import random
import string
import sys
import time
from collections.abc import Sequence

import anyio
import attrs

from dcp._broker.broker import Broker
from dcp._client.client import Client
from dcp._errors import DCPError
from dcp._models import Forward, HandlerRequest
from dcp._worker.worker import Worker

__all__ = ["DemoSummary", "run_demo"]

_WORDS = [
    *("broker", "worker", "client", "request", "reply", "queue", "service", "heartbeat"),
    *("frame", "socket", "trio", "asyncio", "anyio", "zeromq", "router", "dealer"),
    *("metadata", "forward", "graph", "pipeline"),
]
_PUNCT = str.maketrans("", "", string.punctuation)


async def normalize(request: HandlerRequest) -> Forward:
    """Lower-case, strip punctuation, split; forward the words to ``stats``."""
    text = b" ".join(request.data).decode()
    words = text.translate(_PUNCT).lower().split()
    return Forward(b"stats", *(w.encode() for w in words))


async def stats(request: HandlerRequest) -> bytes:
    """Count words and characters of a normalised sentence; find the longest word."""
    words = [bytes(w).decode() for w in request.data]
    longest = max(words, key=len) if words else ""
    result = {"words": len(words), "chars": sum(map(len, words)), "longest": longest}
    return json.dumps(result, sort_keys=True).encode()


def _sentence(rng: random.Random) -> bytes:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
    words[0] = words[0].capitalize()
    return (" ".join(words) + rng.choice(".!?")).encode()


@attrs.frozen
class DemoSummary:
    """What ``dcp demo`` measured."""

    requests: int
    ok: int
    errors: int
    seconds: float
    latencies: tuple[float, ...]
    #: Requests the ``normalize`` workers forwarded to ``stats``, as the broker counted them.
    forwards: int = 0

    @property
    def throughput(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
        return ordered[k]

    def render(self) -> str:
        ms = 1000.0
        latency = (
            f"p50 {self.percentile(50) * ms:.2f} ms  "
            f"p90 {self.percentile(90) * ms:.2f} ms  "
            f"p99 {self.percentile(99) * ms:.2f} ms  "
            f"max {max(self.latencies) * ms:.2f} ms"
            if self.latencies
            else "- (no reply)"
        )
        return "\n".join(
            [
                "dcp demo summary",
                f"  requests     {self.requests}",
                f"  replies ok   {self.ok}",
                f"  errors       {self.errors}",
                f"  forwards     {self.forwards} (normalize -> stats, counted by the broker)",
                f"  elapsed      {self.seconds:.2f} s",
                f"  throughput   {self.throughput:,.0f} req/s",
                f"  latency      {latency}",
            ]
        )


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.start = time.perf_counter()

    def render(self, final: bool = False) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if final else ""
        sys.stderr.write(f"\r[{bar}] {self.done}/{self.total} {rate:8.0f} req/s{end}")
        sys.stderr.flush()

    async def run(self) -> None:
        while True:
            self.render()
            await anyio.sleep(0.1)


async def run_demo(
    *,
    requests: int = 4000,
    clients: int = 4,
    window: int = 32,
    normalizers: int = 2,
    statisticians: int = 2,
    progress: bool = True,
    seed: int = 1,
    type_width: int = 1,
) -> DemoSummary:
    """Run the demo and return its summary (the CLI prints it).

    :param type_width: type-frame width the clients and workers write (1 or 4); the
        embedded dcp broker reads both and answers each peer in kind
    """
    rng = random.Random(seed)
    sentences = [_sentence(rng) for _ in range(requests)]
    latencies: list[float] = []
    errors = 0
    bar = _Progress(requests, progress)
    # The DAG's final reply is checked against a local computation: real work, checked.
    expected = {}
    for s in set(sentences):
        words = s.decode().translate(_PUNCT).lower().split()
        expected[s] = {
            "words": len(words),
            "chars": sum(map(len, words)),
            "longest": max(words, key=len),
        }

    async with Broker("tcp://127.0.0.1:0") as broker:
        endpoint = broker.endpoints[0]
        workers = [
            *(
                Worker(endpoint, b"normalize", normalize, concurrency=4, type_width=type_width)
                for _ in range(normalizers)
            ),
            *(
                Worker(endpoint, b"stats", stats, concurrency=4, type_width=type_width)
                for _ in range(statisticians)
            ),
        ]
        async with anyio.create_task_group() as tg:
            for worker in workers:
                await tg.start(worker.serve)
            tg.start_soon(bar.run)
            start = time.perf_counter()

            async def one_client(chunk: Sequence[bytes]) -> None:
                nonlocal errors
                async with Client(
                    endpoint, timeout=10.0, retries=2, type_width=type_width
                ) as client:
                    queue = list(chunk)

                    async def lane() -> None:
                        nonlocal errors
                        while queue:
                            sentence = queue.pop()
                            t0 = time.perf_counter()
                            try:
                                reply = await client.request(b"normalize", sentence)
                            except DCPError:
                                errors += 1
                            else:
                                if json.loads(reply.data[0]) == expected[sentence]:
                                    latencies.append(time.perf_counter() - t0)
                                else:
                                    errors += 1
                            bar.done += 1

                    # No more lanes than requests: --window 100000 made 100,000 tasks per
                    # client that blocked the loop for seconds (the workers' heartbeats too).
                    async with anyio.create_task_group() as lanes:
                        for _ in range(min(window, len(chunk))):
                            lanes.start_soon(lane)

            async with anyio.create_task_group() as load:
                for i in range(clients):
                    load.start_soon(one_client, sentences[i::clients])
            elapsed = time.perf_counter() - start
            bar.render(final=True)
            forwards = broker.statistics().forwards
            tg.cancel_scope.cancel()
    return DemoSummary(
        requests=requests,
        ok=len(latencies),
        errors=errors,
        seconds=elapsed,
        latencies=tuple(latencies),
        forwards=forwards,
    )
