"""Endpoint strings, checked before zmq sees them.

zmq accepts some endpoints it cannot mean (``tcp://127.0.0.1:99999`` binds some other port,
``tcp://:5555`` connects nowhere, for ever) and answers others with a bare ``EINVAL``
(``tcp://*:5555`` given to ``connect``). :func:`check_endpoint` turns each such mistake into
a :class:`ValueError` that says what is wrong. It checks the form only: it does not resolve
host names (a broker's name may appear in DNS after its workers start) or touch files.

zmq binds an ``ipc://`` path another process listens on without an error (it unlinks the
socket file), taking the endpoint from it: :func:`ipc_in_use` tells, before a bind, whether
someone listens there (the broker and ``dcp broker`` refuse it as an address in use).
"""

from __future__ import annotations

import ipaddress
import re
import socket

__all__ = ["SCHEMES", "check_endpoint", "check_peer_endpoint", "ipc_in_use", "is_loopback_host"]

#: The transports dcp's peers use.
SCHEMES = ("tcp", "ipc", "inproc")

# A host name, an IPv4 address or (for bind) a network interface name.
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_PORT = re.compile(r"[0-9]+")
_DOTTED = re.compile(r"[0-9.]+")


def check_endpoint(endpoint: str, *, bind: bool) -> str:
    """Return ``endpoint`` if it is a well-formed zmq endpoint for binding (``bind=True``)
    or connecting; raise :class:`ValueError` naming the mistake otherwise.

    Accepted: ``tcp://HOST:PORT`` (an IPv6 address in brackets or bare; port 0-65535),
    ``ipc://PATH`` and ``inproc://NAME``. ``*`` as a tcp host (every interface) or port
    (any free port), port 0 and ``ipc://*`` are for binding only.

    :raises ValueError: the scheme, host or port is not one of the above
    """
    scheme, sep, address = endpoint.partition("://")
    if not sep:
        raise ValueError(
            f"bad endpoint {endpoint!r}: expected tcp://HOST:PORT, ipc://PATH or inproc://NAME"
        )
    if scheme not in SCHEMES:
        raise ValueError(f"bad endpoint {endpoint!r}: scheme must be tcp, ipc or inproc")
    if not address:
        raise ValueError(f"bad endpoint {endpoint!r}: nothing after {scheme}://")
    if scheme == "tcp":
        reason = _tcp_problem(address, bind)
    elif address == "*" and not bind:
        reason = f"{scheme}://* is for binding only; connect to a real name"
    else:
        reason = None
    if reason is not None:
        raise ValueError(f"bad endpoint {endpoint!r}: {reason}")
    return endpoint


def check_peer_endpoint(endpoint: str) -> str:
    """Return ``endpoint`` if a client or worker can connect to it: a well-formed endpoint
    (:func:`check_endpoint` with ``bind=False``) or a broker's beacon (``beacon://[HOST]:PORT``,
    ``docs/services.md``); raise :class:`ValueError` naming the mistake otherwise, before any
    socket exists.

    :raises ValueError: not such an endpoint (``TypeError`` if it is not a ``str``)
    """
    if not isinstance(endpoint, str):
        raise TypeError(f"endpoint must be a str such as 'tcp://127.0.0.1:5555', not {endpoint!r}")
    from dcp._io.beacon import BEACON_SCHEME, beacon_port  # (beacon imports anyio and socket)

    if endpoint.startswith(BEACON_SCHEME):
        beacon_port(endpoint)
        return endpoint
    return check_endpoint(endpoint, bind=False)


def _tcp_problem(address: str, bind: bool) -> str | None:
    host, colon, port = address.rpartition(":")
    if not colon or not port:
        return "no port (expected tcp://HOST:PORT)"
    if port == "*":
        if not bind:
            return "port '*' (any free port) is for binding only; connect to a port number"
    elif not _PORT.fullmatch(port):
        return f"port {port!r} is not a number from 0 to 65535"
    elif int(port) > 65535:
        return f"port {int(port)} is out of range (0 to 65535)"
    elif int(port) == 0 and not bind:
        return "port 0 (any free port) is for binding only; connect to the broker's port"
    if not host:
        return "no host (expected tcp://HOST:PORT)"
    if host == "*":
        if not bind:
            return (
                "host '*' (every interface) is for binding only; connect to a host name or "
                "address, e.g. tcp://127.0.0.1:5555"
            )
        return None
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed or ":" in host:
        try:
            ipaddress.IPv6Address(host[1:-1] if bracketed else host)
        except ValueError:
            return f"host {host!r} is not an IPv6 address"
        return None
    if not _HOST.fullmatch(host):
        return f"host {host!r} is not a host name or address"
    if _DOTTED.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"host {host!r} is not an IPv4 address"
    return None


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an IP literal, without brackets) is this machine's loopback:
    ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ipc_in_use(endpoint: str) -> bool:
    """Whether a process listens on the ``ipc://`` endpoint (``False`` for any other scheme):
    zmq would unlink its socket file and bind again, taking the endpoint from it without an
    error. A stale file, nobody listening, is not in use (zmq replaces it)."""
    if not endpoint.startswith("ipc://") or not hasattr(socket, "AF_UNIX"):
        return False  # no Unix sockets: nothing to probe
    path = endpoint.removeprefix("ipc://")
    if path == "*":  # zmq picks a fresh path
        return False
    if path.startswith("@"):  # Linux's abstract namespace
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True
