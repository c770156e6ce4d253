"""The live status page (``dcp/_http/page.html``) in a real headless Chromium: Debian's
``/usr/bin/chromium`` driven by playwright (its own browser downloads are never used;
``scripts/bootstrap dev`` installs the package when it can). The page renders, shows a
registered service and its request count, and updates without a reload."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest

import dcp

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.anyio

CHROMIUM = "/usr/bin/chromium"
#: Quiet, offline, throw-away: no sandbox (we may be root), no GPU, no QUIC, no first-run
#: pages, no background traffic, no component updates, no sync.
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


def chromium_missing() -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"Debian's chromium is not installed ({CHROMIUM}): apt-get install chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ModuleNotFoundError:  # pragma: no cover - a dev install has it
        return "playwright is not installed: pip install 'dagbox-dcp[dev]'"
    return None


@contextmanager
def chromium_page(user_data: Path) -> Iterator[Page]:
    """A page of a headless Chromium with a temporary profile (blocking API: call from a
    thread)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(user_data),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def wait_for_count(page: Page, service: str, count: int) -> None:
    cell = f'tr[data-service="{service}"] td.requests'
    page.wait_for_function(
        f"() => document.querySelector('{cell}')?.textContent === '{count}'", timeout=15_000
    )


async def echo(request: dcp.HandlerRequest) -> list[bytes]:
    return [b"echo"]


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
async def test_status_page_renders_and_updates(tmp_path: Path) -> None:
    token = "page-token"
    async with (
        dcp.Broker("tcp://127.0.0.1:0", http="127.0.0.1:0", http_token=token) as broker,
        anyio.create_task_group() as tg,
    ):
        endpoint = broker.endpoints[0]
        tg.start_soon(dcp.Worker(endpoint, "echo", echo).serve)
        async with dcp.Client(endpoint) as client:

            async def traffic(count: int) -> None:
                for _ in range(count):
                    # The worker registers in the background: wait for it.
                    await client.request("echo", b"x", wait_for_worker=True)

            await traffic(3)
            url = f"http://{broker.http_address}/?token={token}"

            def browse(more: Callable[[int], None]) -> tuple[str, str, object, str]:
                with chromium_page(tmp_path / "profile") as page:
                    page.goto(url)
                    wait_for_count(page, "echo", 3)
                    title = page.title()
                    page.evaluate("window.notReloaded = true")
                    more(4)
                    wait_for_count(page, "echo", 7)
                    workers = page.locator('tr[data-service="echo"] td.workers').inner_text()
                    limit = page.locator("#account-queued td.limit").inner_text()
                    state = page.evaluate("[window.notReloaded, location.search]")
                    # A reload works without ?token=: the tab keeps it (sessionStorage).
                    page.reload()
                    wait_for_count(page, "echo", 7)
                    return title, workers, state, limit

            def more(count: int) -> None:
                anyio.from_thread.run(traffic, count)

            title, workers, state, limit = await anyio.to_thread.run_sync(browse, more)
        tg.cancel_scope.cancel()
    assert title == "dcp broker"
    assert workers == "1"
    assert limit == "179.2 MiB"  # the byte budget's queued account: 35% of 512 MiB
    # Updated in place (no reload); the token left the URL for sessionStorage.
    assert state == [True, ""]
