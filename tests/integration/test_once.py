"""Issue 25, findings 1 and 3, on real tcp sockets and both anyio backends: a request runs at
most once while its worker lives, whatever the client's retries (routing Rule R8), and a
forward chain fails fast and names where it failed (routing Rule R9).

Handlers wait for conditions (the client's retry reached the broker), never for a speed.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

import dcp
from tests.integration.test_end_to_end import Result, eventually, fast_broker, fast_worker
from tests.integration.test_end_to_end import run_scoped as run_scoped

pytestmark = pytest.mark.anyio


def retried_at(broker: dcp.Broker, retries: int) -> Callable[[], bool]:
    """Whether ``retries`` attempts after the first of one request reached ``broker`` (joined
    to the request in flight, or, before routing Rule R8, accepted as new requests)."""

    def check() -> bool:
        stats = broker.statistics()
        return stats.replaced + stats.requests - stats.forwards >= retries + 1

    return check


# ------------------------------------------------------------ finding 1: at most once


async def test_a_slow_request_runs_once_with_the_default_retries() -> None:
    """The issue's reproduction: a handler slower than an attempt (1 s of a 3 s call), with
    the default retries: it runs once, and the call succeeds."""
    calls = 0

    async def charge(request: dcp.HandlerRequest) -> Result:
        nonlocal calls
        calls += 1
        await eventually(retried_at(broker, 1))  # an attempt timed out and was sent again
        return b"charged " + request.data[0]

    with anyio.fail_after(20):
        async with (
            dcp.Broker("tcp://127.0.0.1:0") as broker,
            dcp.Worker(broker.endpoints[0], "charge", charge) as worker,
            dcp.Client(broker.endpoints[0]) as client,
        ):
            response = await client.request("charge", "card-1", timeout=3)
            await eventually(lambda: broker.statistics().clients == 0)
            cstats, wstats, bstats = client.statistics(), worker.statistics(), broker.statistics()
    assert response.data == (b"charged card-1",)
    assert cstats.retries >= 1
    assert calls == 1
    assert wstats.received == 1
    assert (bstats.requests, bstats.dispatched, bstats.replies) == (1, 1, 1)
    assert bstats.replaced == cstats.retries


async def test_a_request_is_redelivered_once_across_a_worker_death_whatever_the_retries() -> None:
    holding = anyio.Event()
    good_calls = 0

    async def stuck(request: dcp.HandlerRequest) -> Result:
        holding.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def good(request: dcp.HandlerRequest) -> Result:
        nonlocal good_calls
        good_calls += 1
        return b"good:" + request.data[0]

    scope = anyio.CancelScope()
    response: list[dcp.Response] = []
    # Heartbeats of 0.25 s: a death is noticed in 0.75 s, and a loaded machine's stall does
    # not pass for one.
    with anyio.fail_after(20):
        async with fast_broker(heartbeat=0.25) as broker, anyio.create_task_group() as tg:
            ep = broker.endpoints[0]
            dying = fast_worker(ep, "svc", stuck, heartbeat=0.25)
            await tg.start(run_scoped, dying.serve, scope)
            survivor = fast_worker(ep, "svc", good, heartbeat=0.25)
            async with (
                dcp.Client(
                    ep, timeout=30, attempt_timeout=0.3, retries=50, backoff=0.05, backoff_max=0.1
                ) as client,
                anyio.create_task_group() as inner,
            ):

                async def call() -> None:
                    response.append(await client.request("svc", b"job"))

                inner.start_soon(call)
                await holding.wait()
                await tg.start(survivor.serve)  # idle while its peer holds the request
                await eventually(lambda: bool(response) or retried_at(broker, 2)())
                scope.cancel()  # the stuck worker dies without a word to the broker
            await eventually(lambda: broker.statistics().clients == 0)
            stats = broker.statistics()
            await survivor.aclose(grace=1)
    assert [r.data for r in response] == [(b"good:job",)]
    assert good_calls == 1
    assert survivor.statistics().received == 1
    assert (stats.requests, stats.redeliveries, stats.dispatched) == (1, 1, 2)
    assert stats.replaced >= 2


# ------------------------------------------------------------ finding 3: forward chains


@pytest.mark.parametrize("no_wait", [False, True])
async def test_a_forward_to_a_service_nobody_serves_fails_at_once_naming_it(
    no_wait: bool,
) -> None:
    calls = 0

    async def nf(request: dcp.HandlerRequest) -> Result:
        nonlocal calls
        calls += 1
        return dcp.Forward("nobody", request.data[0])

    with anyio.fail_after(20):
        async with (
            dcp.Broker("tcp://127.0.0.1:0") as broker,
            dcp.Worker(broker.endpoints[0], "nf", nf) as worker,
            dcp.Client(broker.endpoints[0]) as client,
        ):
            with pytest.raises(dcp.NoWorkers) as info:
                await client.request("nf", "x", timeout=3, no_wait=no_wait)
            cstats, wstats = client.statistics(), worker.statistics()
    assert str(info.value) == "no worker serves 'nobody' (nf -> nobody)"
    assert (info.value.service, info.value.chain) == (b"nobody", ("nf", "nobody"))
    assert cstats.retries == 0  # answered within the first attempt
    assert calls == 1
    assert (wstats.received, wstats.forwards) == (1, 1)


async def test_a_retry_does_not_run_an_upstream_handler_whose_forward_is_in_flight() -> None:
    calls = {"nf": 0, "slow": 0}

    async def nf(request: dcp.HandlerRequest) -> Result:
        calls["nf"] += 1
        return dcp.Forward("slow", request.data[0] + b">nf")

    async def slow(request: dcp.HandlerRequest) -> Result:
        calls["slow"] += 1
        await eventually(retried_at(broker, 1))
        return request.data[0] + b">slow"

    with anyio.fail_after(20):
        async with dcp.Broker("tcp://127.0.0.1:0") as broker:
            ep = broker.endpoints[0]
            async with (
                dcp.Worker(ep, "nf", nf, concurrency=2),
                dcp.Worker(ep, "slow", slow, concurrency=2),
                dcp.Client(ep) as client,
            ):
                response = await client.request("nf", "x", timeout=3)
                await eventually(lambda: broker.statistics().clients == 0)
            stats = broker.statistics()
    assert response.data == (b"x>nf>slow",)
    assert calls == {"nf": 1, "slow": 1}
    assert (stats.requests, stats.forwards, stats.replies) == (2, 1, 1)


async def test_an_error_down_a_chain_names_the_service_and_the_chain() -> None:
    async def a(request: dcp.HandlerRequest) -> Result:
        return dcp.Forward("b", request.data[0])

    async def b(request: dcp.HandlerRequest) -> Result:
        raise ValueError(f"cannot take {request.text}")

    with anyio.fail_after(20):
        async with dcp.Broker("tcp://127.0.0.1:0") as broker:
            ep = broker.endpoints[0]
            async with (
                dcp.Worker(ep, "a", a),
                dcp.Worker(ep, "b", b),
                dcp.Client(ep) as client,
            ):
                with pytest.raises(dcp.RemoteError) as info:
                    await client.request("a", "x", timeout=5)
    error = info.value
    assert (error.code, error.message, error.chain) == (
        "handler_error",
        "ValueError: cannot take x",
        ("a", "b"),
    )
    assert str(error) == "handler_error: ValueError: cannot take x (at 'b', via a -> b)"
