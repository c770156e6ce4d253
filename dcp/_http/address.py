"""What the HTTP endpoint may bind, checked when the broker is made (no I/O, no extra needed).

Rule HB1 - Off by default. With an address, the endpoint binds ``HOST:PORT`` (``[V6]:PORT``
  for IPv6; port 0 picks a free one, reported as ``Broker.http_address``).
Rule HB2 - Loopback only, unless told. The endpoint shows every service, worker and client of
  the broker: a host that is not a loopback address (``127.0.0.0/8``, ``::1``,
  ``localhost``) is refused unless ``public`` is set (``dcp broker --http-public``).
Rule HB3 - The token. With a token, every path needs ``Authorization: Bearer TOKEN``
  (compared in constant time, :mod:`.app`); an empty token is refused, not taken as none.
Rule HB4 - The ``Host`` header names the endpoint (DNS rebinding: a web page whose own name
  was made to resolve to this host sends its name). Allowed (:class:`HostCheck`): the bound
  host as given, the IP bound, ``localhost`` when that IP is a loopback one (or a wildcard),
  any IP literal when it is a wildcard (``0.0.0.0``, ``::``), each with no port or the bound
  port; and every name of ``hosts`` (``http_hosts=``, ``dcp broker --http-host``), which
  matches with any port unless it gives one. A request without ``Host`` (HTTP/1.0) is
  allowed: a browser always sends one. Others are refused (:mod:`.app`, Rule HA3).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import attrs

from dcp._io.endpoints import is_loopback_host

__all__ = ["EXTRA_HINT", "HostCheck", "HttpOptions", "http_options", "require"]

#: How to get what the endpoint needs.
EXTRA_HINT = "pip install 'dagbox-dcp[http]'"


@attrs.frozen
class HttpOptions:
    """Where and how the broker serves HTTP (see the module's rules)."""

    host: str
    port: int
    token: str | None = attrs.field(default=None, repr=False)
    #: further names the ``Host`` header may give (Rule HB4), lower case
    hosts: tuple[str, ...] = ()


def http_options(
    address: str,
    *,
    token: str | None = None,
    public: bool = False,
    hosts: Iterable[str] = (),
) -> HttpOptions:
    """Rules HB1-HB4: check ``address`` (``HOST:PORT``), ``token`` and ``hosts``.

    :param hosts: further ``Host`` header values to accept (``NAME`` or ``NAME:PORT``)
    :raises ValueError: a malformed address, a public host without ``public``, an empty token,
        a malformed host name
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"HTTP address {address!r} is not HOST:PORT (e.g. 127.0.0.1:8222)")
    if int(port_text) > 65535:
        raise ValueError(f"HTTP address {address!r}: port {port_text} is out of range (0-65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not public and not is_loopback_host(host):
        raise ValueError(
            f"HTTP host {host!r} is not a loopback address: the endpoint shows every service, "
            "worker and client of the broker; allow it explicitly (http_public=True, "
            "dcp broker --http-public) to serve it there"
        )
    if token is not None and not token.strip():
        raise ValueError("the HTTP token is empty")
    names = tuple(_host_name(h) for h in ((hosts,) if isinstance(hosts, str) else hosts))
    return HttpOptions(
        host, int(port_text), token.strip() if token is not None else None, hosts=names
    )


def _host_name(value: str) -> str:
    name = value.strip().lower()
    if not name or any(c.isspace() or c in "/@?#" for c in name) or name.endswith(":"):
        raise ValueError(f"HTTP host {value!r} is not NAME or NAME:PORT")
    return name


def _split(value: str) -> tuple[str, str | None]:
    """``HOST[:PORT]`` (``[V6][:PORT]``) as ``(host, port)``, lower case, brackets dropped."""
    value = value.lower()
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep:
            return value, None
        return host, (rest[1:] if rest.startswith(":") else None)
    if value.count(":") == 1:
        host, _, port = value.partition(":")
        return host, port
    return value, None


class HostCheck:
    """Rule HB4: which ``Host`` header values name the endpoint bound at ``address``.

    :param options: the endpoint's options (the host as given, and ``hosts``)
    :param address: the bound address (``HOST:PORT``, ``[V6]:PORT``)
    """

    def __init__(self, options: HttpOptions, address: str) -> None:
        bound, port = _split(address)
        self.port = port or str(options.port)
        wildcard = False
        names = {options.host.lower(), bound}
        try:
            ip = ipaddress.ip_address(bound)
        except ValueError:
            ip = None
        if ip is not None:
            wildcard = ip.is_unspecified
            if ip.is_loopback or wildcard:
                names.add("localhost")
        #: any IP literal is allowed (a wildcard bind): a rebinding page sends a name
        self.any_ip = wildcard
        self.names = frozenset(names)
        self.any_port = frozenset(h for h in options.hosts if _split(h)[1] is None)
        self.exact = frozenset(h for h in options.hosts if _split(h)[1] is not None)

    def allows(self, value: bytes | None) -> bool:
        """Whether a request with this ``Host`` header (``None``: none) is allowed."""
        if value is None:
            return True
        try:
            text = value.decode("ascii").strip().lower()
        except UnicodeDecodeError:
            return False
        if text in self.exact:
            return True
        host, port = _split(text)
        if host in self.any_port:
            return True
        if port is not None and port != self.port:
            return False
        if host in self.names:
            return True
        if self.any_ip:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                return False
            return True
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
