"""One worker serving two described services, a broker that approves them and announces
itself with a beacon, and a client that finds the broker and asks what it serves.

Run it: ``python examples/services.py`` (everything in-process, on 127.0.0.1). See
``docs/services.md``.
"""

from __future__ import annotations

import socket

import anyio

import dcp


async def upper(request: dcp.HandlerRequest) -> bytes:
    return request.data[0].upper()


def reverse(request: dcp.HandlerRequest) -> bytes:  # a plain def: runs in a thread
    return request.data[0][::-1]


SERVICES = {
    "upper": dcp.Service(
        upper,
        concurrency=4,
        version="1.2.0",
        description="Upper-cases UTF-8 text",
        metadata={"owner": "text-team"},
        request_schema={"type": "string"},
        response_schema={"type": "string"},
    ),
    "reverse": dcp.Service(reverse, version="0.3.1", description="Reverses bytes"),
}


async def approve(request: dcp.ApprovalRequest) -> dcp.Approval:
    """Only services described with a version."""
    if request.info is None or "version" not in request.info:
        return dcp.Approval.deny("describe your service (version) first")
    return dcp.Approval(True)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def main() -> None:
    port = free_udp_port()
    broker = dcp.Broker(
        "tcp://127.0.0.1:0", approve=approve, beacon=port, beacon_address="127.0.0.1"
    )
    async with broker, anyio.create_task_group() as tg:
        # Anyone on the network may send a beacon: it is a hint (docs/services.md).
        endpoint = await dcp.find_broker(port, host="127.0.0.1", timeout=5)
        print("found the broker:", endpoint == broker.endpoints[0])
        await tg.start(dcp.Worker(endpoint, services=SERVICES).serve)
        async with dcp.Client(endpoint) as client:
            print((await client.request("upper", "hello")).text)
            print((await client.request("reverse", "hello")).text)
            for s in await client.services():
                print(f"{s.name} {s.version} workers={s.workers}: {s.description}")
            info = await client.service_info("upper")
            assert info is not None
            print("upper metadata:", dict(info.metadata), "schema:", info.request_schema)
            stats = await client.service_stats("upper")
            assert stats is not None
            print("upper requests:", stats.num_requests, "queued:", stats.queued)
        # An undescribed worker is denied, and told why.
        try:
            async with dcp.Worker(endpoint, "anonymous", upper):
                pass
        except dcp.RegistrationRefused as exc:
            print("refused:", exc.message)
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
