"""What the HTTP endpoint may bind, checked when the broker is made (no I/O, no extra needed).

Rule HB1 - Off by default. With an address, the endpoint binds ``HOST:PORT`` (``[V6]:PORT``
  for IPv6; port 0 picks a free one, reported as ``Broker.http_address``).
Rule HB2 - Loopback only, unless told. The endpoint shows every service, worker and client of
  the broker: a host that is not a loopback address (``127.0.0.0/8``, ``::1``,
  ``localhost``) is refused unless ``public`` is set (``dcp broker --http-public``).
Rule HB3 - The token. With a token, every path needs ``Authorization: Bearer TOKEN``
  (compared in constant time, :mod:`.app`); an empty token is refused, not taken as none.
"""

from __future__ import annotations

import ipaddress

import attrs

__all__ = ["EXTRA_HINT", "HttpOptions", "http_options", "require"]

#: How to get what the endpoint needs.
EXTRA_HINT = "pip install 'dagbox-dcp[http]'"


@attrs.frozen
class HttpOptions:
    """Where and how the broker serves HTTP (see the module's rules)."""

    host: str
    port: int
    token: str | None = attrs.field(default=None, repr=False)


def http_options(address: str, *, token: str | None = None, public: bool = False) -> HttpOptions:
    """Rules HB1-HB3: check ``address`` (``HOST:PORT``) and ``token``.

    :raises ValueError: a malformed address, a public host without ``public``, an empty token
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"HTTP address {address!r} is not HOST:PORT (e.g. 127.0.0.1:8222)")
    if int(port_text) > 65535:
        raise ValueError(f"HTTP address {address!r}: port {port_text} is out of range (0-65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not public and not _is_loopback(host):
        raise ValueError(
            f"HTTP host {host!r} is not a loopback address: the endpoint shows every service, "
            "worker and client of the broker; allow it explicitly (http_public=True, "
            "dcp broker --http-public) to serve it there"
        )
    if token is not None and not token.strip():
        raise ValueError("the HTTP token is empty")
    return HttpOptions(host, int(port_text), token.strip() if token is not None else None)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require() -> None:
    """Check that the ``http`` extra is installed.

    :raises ModuleNotFoundError: it is not (the message says how to install it)
    """
    try:
        import hypercorn  # noqa: F401
        import prometheus_client  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"the broker's HTTP endpoint needs {exc.name}: {EXTRA_HINT}", name=exc.name
        ) from None
