"""The broker beacon: a UDP datagram, every second, that tells peers where the broker is.

Datagram (7 or 47 bytes): the signature ``DCPB``, the version byte ``0x01``, the broker's
TCP port (2 bytes, big-endian), and, with CURVE, the broker's public key (40 bytes of Z85
text). The broker's host is the datagram's source address. Anything else on the port
(another program's datagrams, a bad length, a version we do not know) is ignored.

A beacon is a hint, not a credential: anyone on the network can send one. Without CURVE, a
forged beacon can steer a peer to a rogue broker. With CURVE, a client or worker still
checks the broker key it was configured with (the handshake fails against any other), and
:func:`find_broker` given ``key`` ignores beacons announcing another key.

Several brokers: :func:`find_brokers` listens for the whole of its timeout and returns every
broker heard, in the order first heard (give the list to a client or worker to use them all).
A ``beacon://`` endpoint stands for one broker: the first heard, as :func:`find_broker`; in
a list of endpoints each ``beacon://`` entry is resolved so. It is listened to for
:data:`BEACON_WAIT` seconds, or for a client's own ``timeout`` if that is shorter
(:func:`beacon_wait`): a ``Client(..., timeout=1)`` that hears nothing gives up after 1 s.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from typing import NamedTuple

import anyio
import anyio.abc

__all__ = [
    "BEACON_SCHEME",
    "BEACON_WAIT",
    "SIGNATURE",
    "BeaconHeard",
    "beacon_port",
    "beacon_wait",
    "decode",
    "encode",
    "find_broker",
    "find_brokers",
    "listen",
    "resolve",
    "resolve_blocking",
    "send_beacons",
]

logger = logging.getLogger("dcp.beacon")

#: The first bytes of every beacon: signature and version.
SIGNATURE = b"DCPB\x01"
#: ``beacon://[HOST]:PORT`` given instead of an endpoint: listen there for the broker.
BEACON_SCHEME = "beacon://"
_KEY = 40
#: How long a ``beacon://`` endpoint is listened to for a broker (seconds), at most.
BEACON_WAIT = 5.0


class BeaconHeard(NamedTuple):
    """A beacon heard: the broker's endpoint and its CURVE public key (``None``: none)."""

    endpoint: str
    key: bytes | None


def encode(port: int, key: bytes | None = None) -> bytes:
    """The datagram announcing a broker on TCP ``port`` (with CURVE public ``key``, Z85).

    :raises ValueError: a port out of range, or a key that is not 40 bytes
    """
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not 1-65535")
    if key is not None and len(key) != _KEY:
        raise ValueError("a CURVE public key is 40 bytes of Z85 text")
    return SIGNATURE + port.to_bytes(2, "big") + (key or b"")


def decode(datagram: bytes, host: str) -> BeaconHeard | None:
    """A datagram from ``host`` as a beacon; ``None`` if it is not one."""
    if len(datagram) not in (7, 7 + _KEY) or datagram[:5] != SIGNATURE:
        return None
    port = int.from_bytes(datagram[5:7], "big")
    if not port:
        return None
    key = datagram[7:] or None
    shown = f"[{host}]" if ":" in host else host
    return BeaconHeard(f"tcp://{shown}:{port}", key)


def _udp(broadcast: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if broadcast:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.setblocking(False)
    return sock


async def send_beacons(
    port: int,
    broker_port: int,
    *,
    address: str = "255.255.255.255",
    key: bytes | None = None,
    interval: float = 1.0,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Announce a broker on TCP ``broker_port`` to UDP ``address``:``port`` every
    ``interval`` seconds, until cancelled. A send that fails is logged (once per error) and
    retried at the next beat.

    :raises OSError: the UDP socket cannot be made
    """
    datagram = encode(broker_port, key)
    with _udp(broadcast=True) as sock:
        task_status.started()
        logged: set[str] = set()
        while True:
            try:
                sock.sendto(datagram, (address, port))
            except OSError as exc:
                if str(exc) not in logged:
                    logged.add(str(exc))
                    logger.warning("beacon to %s:%d failed: %s", address, port, exc)
            await anyio.sleep(interval)


def _check_timeout(timeout: float) -> None:
    if not timeout > 0 or math.isnan(timeout):
        raise ValueError("timeout must be positive")


async def _udp_listener(port: int, host: str) -> anyio.abc.UDPSocket:
    """A UDP socket bound to ``host``:``port`` (``""``: every interface), shared with other
    listeners on the same port."""
    return await anyio.create_udp_socket(
        family=socket.AF_INET, local_host=host or "0.0.0.0", local_port=port, reuse_port=True
    )


def _wanted(key: bytes | str | None) -> bytes | None:
    return key.encode("ascii") if isinstance(key, str) else key


async def listen(
    port: int,
    *,
    host: str = "",
    timeout: float = 5.0,  # noqa: ASYNC109 (how long to listen)
    key: bytes | None = None,
) -> BeaconHeard:
    """The first beacon heard on UDP ``host``:``port`` (``""``: every interface).

    :param key: only a beacon announcing this CURVE public key (Z85) counts
    :raises TimeoutError: none within ``timeout`` seconds
    """
    _check_timeout(timeout)
    async with await _udp_listener(port, host) as udp:
        with anyio.move_on_after(timeout):
            while True:
                datagram, (sender, _) = await udp.receive()
                heard = decode(datagram, sender)
                if heard is None or (key is not None and heard.key != key):
                    continue
                return heard
    raise TimeoutError(f"no broker beacon on UDP port {port} within {timeout:g} s")


async def find_broker(
    port: int,
    *,
    host: str = "",
    timeout: float = 5.0,  # noqa: ASYNC109 (how long to listen)
    key: bytes | str | None = None,
) -> str:
    """The endpoint of the first broker heard announcing itself on UDP ``port``
    (``dcp broker --beacon PORT``); see ``docs/services.md``.

    A beacon is a hint (anyone can send one): with CURVE, give the broker's ``key`` (Z85) to
    ignore beacons announcing another, and configure clients with it as usual.

    :param host: the address to listen on (``""``: every interface)
    :raises TimeoutError: no beacon within ``timeout`` seconds
    """
    return (await listen(port, host=host, timeout=timeout, key=_wanted(key))).endpoint


async def find_brokers(
    port: int,
    *,
    host: str = "",
    timeout: float = 3.0,  # noqa: ASYNC109 (how long to listen)
    key: bytes | str | None = None,
) -> list[str]:
    """The endpoints of every broker heard announcing itself on UDP ``port`` within
    ``timeout`` seconds, in the order first heard, each once (``docs/scaling.md``): give
    them to :class:`dcp.Client`, :class:`dcp.SyncClient` or :class:`dcp.Worker` to use
    them all.

    It listens for the whole ``timeout``: a broker beacons once per second (``dcp broker
    --beacon``), so the default of 3 s hears every broker that is up, unless datagrams are
    lost. A broker that starts later is not in the list.

    :param host: the address to listen on (``""``: every interface)
    :param key: only brokers announcing this CURVE public key (Z85) count
    :raises TimeoutError: no beacon within ``timeout`` seconds
    :raises ValueError: ``timeout`` is not positive
    """
    _check_timeout(timeout)
    wanted = _wanted(key)
    heard: dict[str, None] = {}  # in the order first heard
    async with await _udp_listener(port, host) as udp:
        with anyio.move_on_after(timeout):
            while True:
                datagram, (sender, _) = await udp.receive()
                beacon = decode(datagram, sender)
                if beacon is not None and (wanted is None or beacon.key == wanted):
                    heard.setdefault(beacon.endpoint)
    if not heard:
        raise TimeoutError(f"no broker beacon on UDP port {port} within {timeout:g} s")
    return list(heard)


def beacon_port(endpoint: str) -> tuple[str, int]:
    """The host and UDP port of a ``beacon://[HOST]:PORT`` address.

    :raises ValueError: a malformed ``beacon://`` address
    """
    host, sep, port = endpoint[len(BEACON_SCHEME) :].rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad beacon address {endpoint!r}: expected beacon://[HOST]:PORT")
    return host, int(port)


def beacon_wait(timeout: float | None) -> float:
    """How long a caller whose own time limit is ``timeout`` seconds (``None``: none) listens
    at a ``beacon://`` endpoint: the smaller of it and :data:`BEACON_WAIT`."""
    if timeout is None or not timeout < BEACON_WAIT:
        return BEACON_WAIT
    return timeout


def resolve_blocking(
    endpoint: str, *, timeout: float = BEACON_WAIT, key: bytes | None = None
) -> str:
    """:func:`resolve` for blocking code (:class:`dcp.SyncClient`): waits in the calling
    thread.

    :raises ValueError: a malformed ``beacon://`` address
    :raises TimeoutError: no beacon within ``timeout`` seconds
    """
    if not endpoint.startswith(BEACON_SCHEME):
        return endpoint
    host, port = beacon_port(endpoint)
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        udp.bind((host or "0.0.0.0", port))
        while (left := deadline - time.monotonic()) > 0:
            udp.settimeout(left)
            try:
                datagram, (sender, _) = udp.recvfrom(2048)
            except TimeoutError:
                break
            heard = decode(datagram, sender)
            if heard is not None and (key is None or heard.key == key):
                return heard.endpoint
    raise TimeoutError(f"no broker beacon on UDP port {port} within {timeout:g} s")


async def resolve(
    endpoint: str,
    *,
    timeout: float = BEACON_WAIT,  # noqa: ASYNC109 (how long to listen)
    key: bytes | None = None,
) -> str:
    """``endpoint``, or for ``beacon://[HOST]:PORT`` the broker endpoint heard there.

    :raises ValueError: a malformed ``beacon://`` address
    :raises TimeoutError: no beacon within ``timeout`` seconds
    """
    if not endpoint.startswith(BEACON_SCHEME):
        return endpoint
    host, port = beacon_port(endpoint)
    return (await listen(port, host=host, timeout=timeout, key=key)).endpoint
