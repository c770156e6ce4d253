"""CURVE: encrypted traffic, and a broker that lets in only the keys it knows.

The keys are zmq certificate files, made here with pyzmq's ``zmq.auth.create_certificates``
(``dcp keys NAME`` writes the same format, with the secret file readable by its owner only).
Alice's key may connect; the worker's key may connect and serve ``upper``; Mallory's key is
on no list. See docs/security.md.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import zmq.auth

import dcp


async def upper(request: dcp.HandlerRequest) -> bytes:
    return request.data[0].upper()


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp)
        for name in ("broker", "alice", "worker", "mallory"):
            zmq.auth.create_certificates(keys, name)
        security = dcp.CurveServer.from_files(
            keys / "broker.key_secret",
            clients=[keys / "alice.key"],
            workers={"upper": [keys / "worker.key"]},
        )

        def peer(name: str) -> dcp.CurveClient:
            return dcp.CurveClient.from_files(
                keys / f"{name}.key_secret", server=keys / "broker.key"
            )

        async with dcp.Broker("tcp://127.0.0.1:0", security=security) as broker:
            endpoint = broker.endpoints[0]
            async with dcp.Worker(endpoint, "upper", upper, security=peer("worker")):
                async with dcp.Client(endpoint, security=peer("alice")) as alice:
                    reply = await alice.request("upper", b"hello")
                    print("alice got", reply.data[0].decode())
                async with dcp.Client(endpoint, security=peer("mallory")) as mallory:
                    try:
                        await mallory.request("upper", b"hello")
                    except dcp.AuthenticationFailed as exc:
                        # At once, not after a timeout: the handshake said no.
                        print("mallory was turned away:", exc.reason)
            try:
                async with dcp.Worker(endpoint, "payroll", upper, security=peer("worker")):
                    pass
            except dcp.RegistrationRefused:
                print("the worker may not serve payroll")
            print("broker refused:", ", ".join(sorted(broker.statistics().rejections)))


if __name__ == "__main__":
    anyio.run(main)
