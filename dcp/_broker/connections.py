"""Dropping the connections a broker accepted, so that every peer handshakes again.

zmq has no call that closes one connection of a ROUTER socket, and no way to learn which connection
a CURVE key came in on. When a security reload revokes a key (Rule S5 in
:mod:`dcp._core.broker.guard`), the broker therefore drops every connection it accepted on its tcp
and ipc endpoints *from the addresses that key connected from* (the ZAP handler remembers them: the
peer's IP for tcp; ipc has none, so every ipc connection goes): zmq sees each one end, its peer
reconnects (zmq's own reconnect, 0.1 s by default) and handshakes again, and the ZAP handler, which
already has the new lists, refuses the revoked keys. A dcp client or worker whose key was revoked
learns it from its handshake (:exc:`dcp.AuthenticationFailed`); every other peer carries on (a
worker registers again on its new connection; a client resends what an attempt lost). The cost
falls on the peers that share an address with a revoked key (on one host, all of them): their
connections drop too, and a request a worker of theirs held is given again (it may run twice, as
after any lost connection).

The connections are found the way ``ss`` finds them: the process's open descriptors
(``/proc/self/fd``, or ``/dev/fd``) that are connected stream sockets whose *local*
address is one of the broker's bound endpoints (its listening sockets are not connected;
connections this process opened to the broker have another local port). Each is shut down
through a duplicate of its descriptor (``shutdown(2)`` acts on the socket, not on the
descriptor), so libzmq, which owns the descriptor, sees an ordinary end of connection and
closes it itself. inproc connections have no descriptor and are not dropped.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dcp._io.security import CurveServer

__all__ = ["TELL_BEFORE_CUT", "cut_accepted", "revokes"]

#: Seconds a broker waits, after telling the workers a reload removed why, before it drops
#: connections: zmq writes messages on its own I/O thread, and a connection dropped first
#: loses what was not written yet (the worker would then learn of its revoked key from its
#: next handshake, as :exc:`dcp.AuthenticationFailed`, instead of being told).
TELL_BEFORE_CUT = 0.5


def revokes(old: CurveServer, new: CurveServer) -> bool:
    """Whether going from ``old`` to ``new`` takes the right to connect away from some key."""
    if new.clients is None:
        return False  # any key may connect
    if old.clients is None:
        return True
    return any(not new.may_connect(key) for key in old.connect_keys)


def _ip(host: str) -> str:
    """An IPv4 address seen through an IPv6 socket (``::ffff:a.b.c.d``) as zmq names it."""
    return host[7:] if host.startswith("::ffff:") else host


def _descriptors() -> list[int]:
    for folder in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return [int(name) for name in os.listdir(folder) if name.isdigit()]
    return []  # pragma: no cover - every POSIX system has one of the two


def _local_addresses(endpoints: Sequence[str]) -> tuple[set[int], set[str]]:
    ports: set[int] = set()
    paths: set[str] = set()
    for endpoint in endpoints:
        scheme, _, rest = endpoint.partition("://")
        if scheme == "tcp":
            with contextlib.suppress(ValueError):
                ports.add(int(rest.rsplit(":", 1)[1]))
        elif scheme == "ipc":
            paths.add(rest)
    return ports, paths


def cut_accepted(endpoints: Sequence[str], peers: set[str] | None = None) -> int:
    """Shut down every connection accepted on the bound ``endpoints`` (``tcp://HOST:PORT``,
    ``ipc://PATH``, as :attr:`dcp.Broker.endpoints` gives them) from a peer at one of the IP
    addresses ``peers`` (``None``: any; ipc connections have no address: any ``peers`` but
    the empty set takes them all); returns how many."""
    ports, paths = _local_addresses(endpoints)
    if (not ports and not paths) or peers == set():
        return 0
    cut = 0
    for fd in _descriptors():
        try:
            dup = os.dup(fd)
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, for one)
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)  # not a socket
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM:
                    continue
                local = sock.getsockname()
                remote = sock.getpeername()  # a listening socket is not connected: OSError
            except OSError:
                continue
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                ours = local[1] in ports and (peers is None or _ip(remote[0]) in peers)
            else:
                name = local.decode(errors="replace") if isinstance(local, bytes) else local
                ours = name in paths
            if ours:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                    cut += 1
    return cut
