"""The status page's screenshot in the docs (``docs/img/status-page.png``).

``python -m benchmarks.screenshot [--out docs/img/status-page.png] [--seconds 4]``

A broker with its HTTP endpoint, a few services (some slow, one that fails now and then,
one with a backlog), clients sending traffic, and Debian's headless Chromium
(``/usr/bin/chromium``, driven by playwright) taking the picture once the rates settle.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import anyio.to_thread

import dcp

from .procs import ROOT

__all__ = ["main"]

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: service: (workers, seconds per request, share of failures)
SERVICES = {
    "images.resize": (3, 0.004, 0.0),
    "images.thumbnail": (2, 0.002, 0.0),
    "ocr.extract": (2, 0.05, 0.02),
    "search.query": (4, 0.001, 0.0),
    "billing.charge": (1, 0.02, 0.1),
    "reports.render": (1, 0.3, 0.0),
}


def _handler(
    delay: float, failures: float
) -> Callable[[dcp.HandlerRequest], Awaitable[list[bytes]]]:
    async def handle(request: dcp.HandlerRequest) -> list[bytes]:
        await anyio.sleep(delay * random.uniform(0.5, 1.5))
        if random.random() < failures:
            raise RuntimeError("upstream refused")
        return [b"ok"]

    return handle


async def _load(client: dcp.Client, service: str, pause: float) -> None:
    while True:
        with contextlib.suppress(dcp.DCPError):
            await client.request(service, b"x", timeout=5)
        await anyio.sleep(pause)


def _shoot(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1100, "height": 620},
        )
        try:
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector('tr[data-service="search.query"]')
            page.wait_for_timeout(2500)  # two refreshes: the rates are filled in
            page.screenshot(path=str(out), full_page=True)
        finally:
            context.close()


async def _run(out: Path, seconds: float) -> None:
    async with dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0") as broker:
        endpoint = broker.endpoints[0]
        async with anyio.create_task_group() as tg:
            for name, (workers, delay, failures) in SERVICES.items():
                for _ in range(workers):
                    tg.start_soon(dcp.Worker(endpoint, name, _handler(delay, failures)).serve)
            async with dcp.Client(endpoint) as client:
                for name in SERVICES:
                    for _ in range(3 if name == "reports.render" else 2):
                        tg.start_soon(_load, client, name, 0.002 if "search" in name else 0.01)
                await anyio.sleep(seconds)
                url = f"http://{broker.http_address}/"
                await anyio.to_thread.run_sync(_shoot, url, out)
                tg.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.screenshot", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "status-page.png")
    parser.add_argument("--seconds", type=float, default=4.0, help="traffic before the shot")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in ("dcp.worker", "dcp.broker"):  # failures on purpose; workers stopped at the end
        logging.getLogger(name).setLevel(logging.CRITICAL)
    anyio.run(_run, args.out, args.seconds, backend="trio")
    print(args.out)


if __name__ == "__main__":
    main()
