"""Issue 26, finding 6 end to end on real sockets and both backends: a client that queues
requests to made-up names and leaves cannot lock others out (admission Rule AD5, queues
Rule Q5).

Every test is bounded with ``fail_after``.
"""

from __future__ import annotations

import anyio
import pytest

import dcp
from dcp.wire import Request
from tests.helpers import Peers
from tests.integration.test_end_to_end import HB, eventually, fast_worker

pytestmark = pytest.mark.anyio


async def echo(request: dcp.HandlerRequest) -> bytes:
    return b"echo:" + b"".join(request.data)


async def test_made_up_services_of_a_departed_client_lock_nobody_out() -> None:
    """One peer queues a request (no expiry) to each of ``max_services`` made-up names and
    disconnects; a call to ``echo`` made before echo's worker starts is then answered, and
    once ``max_queue_wait`` is over the made-up services are gone."""
    with anyio.fail_after(20):
        async with (
            dcp.Broker(
                "tcp://127.0.0.1:0",
                heartbeat_interval=HB,
                max_services=100,
                max_queue_wait=1.0,
            ) as broker,
            anyio.create_task_group() as tg,
        ):
            endpoint = broker.endpoints[0]
            with Peers(endpoint) as peers:
                attacker = peers(b"attacker")
                for i in range(100):
                    attacker.send(Request(b"made-up-%d" % i, None, (b"m",), (b"x",)))
                # Its share (a tenth of max_services) is made; the rest refused.
                await eventually(
                    lambda: broker.statistics().rejections.get("too_many_services", 0) == 90
                )
                attacker.close()
            # (fewer once their wait is over, on a slow machine)
            assert len(broker.statistics().services) <= 10
            async with dcp.Client(endpoint, timeout=10, retries=0) as client:
                async with anyio.create_task_group() as calls:
                    answers: list[dcp.Response] = []

                    async def call() -> None:
                        answers.append(await client.request("echo", b"hi", wait_for_worker=True))

                    calls.start_soon(call)
                    await eventually(lambda: b"echo" in broker.statistics().services)
                    await tg.start(fast_worker(endpoint, "echo", echo).serve)
                assert answers[0].data == (b"echo:hi",)
            # Queues Rule Q5: the departed peer's requests leave, and their services.
            await eventually(lambda: set(broker.statistics().services) == {b"echo"})
            stats = broker.statistics()
            assert stats.rejections["queue_timeout"] == 10
            tg.cancel_scope.cancel()
