"""Handshake failures, read from a socket's zmq monitor, so that a peer the broker will
never talk to learns it within about a second instead of timing out.

zmq hides a failed handshake from the socket's user: messages just queue. The monitor sees
it. Rules (:class:`HandshakeWatch`, pure: monitor events in, a verdict out):

Rule H1 - Refused key. ``HANDSHAKE_FAILED_AUTH``: the broker's ZAP handler refused our key
  (its status code is the event's value). libzmq does not reconnect after it. Fail at once.
Rule H2 - Mismatch. ``HANDSHAKE_FAILED_PROTOCOL``: the two sides disagree on the security
  mechanism (a plaintext peer and a CURVE broker, or the reverse) or the handshake broke
  the protocol. libzmq does not reconnect after it either. Fail at once.
Rule H3 - Wrong broker key. ``HANDSHAKE_FAILED_NO_DETAIL``: the broker hung up during the
  handshake; with CURVE that is what a broker does with a HELLO it cannot decrypt (we were
  given the wrong server key); without, what a CURVE broker may do (if it sees the
  mismatch before we do). libzmq reconnects (every ``RECONNECT_IVL``, 0.1 s by
  default), so one such failure may be a broker going down at a bad moment: fail after
  :data:`NO_DETAIL_LIMIT` in a row with no successful handshake between them.
Rule H4 - ``HANDSHAKE_SUCCEEDED`` clears the count of H3.
Rule H5 - Unheard reconnections (CURVE only). A secure broker does not let a new connection
  take over a routing id (no ``ROUTER_HANDOVER``, see ``docs/security.md``), and zmq
  checks the id once, when the connection attaches: a client whose reconnection beats the
  broker's teardown of its old connection is ignored for as long as the new connection
  lasts. So a secure client counts successful handshakes (:attr:`HandshakeWatch.handshakes`)
  and notes the count whenever it hears the broker; when an attempt times out and it has
  heard nothing on a connection that is not its first (:meth:`HandshakeWatch.unheard`), it
  drops the connection and connects again before resending. By then the broker has torn
  down the old one (zmq heartbeats, within its ``liveness x heartbeat_interval``), so the
  new connection is heard.
Rule H6 - Refused connections (the monitor of a client with ``wait_for_broker=False``:
  :data:`CLIENT_EVENTS`; other clients do not watch them, :func:`connect_dealer`).
  ``CONNECT_RETRIED`` follows every connection attempt that failed at once (a TCP port with
  no listener: refused; an ``ipc://`` path with no listener: no such file, or refused), and
  libzmq tries again after ``RECONNECT_IVL`` and a random part of it (0.1-0.2 s by
  default). ``CONNECTED`` clears the count of refusals in a row
  (:attr:`HandshakeWatch.refused`). :meth:`HandshakeWatch.unreachable` is true while no
  handshake ever succeeded and :data:`REFUSED_LIMIT` attempts in a row were refused (0.2-0.4
  s after connecting: the first attempt is refused at once, then two reconnection
  intervals); what follows is the client's choice (``wait_for_broker``, tracker Rule RT9).
  Counted, not timed: the watch stays pure, and a monitor read late (the sync client's)
  counts the same. ``inproc`` and a TCP peer that never answers (packets dropped) give no
  such event: they just wait.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence

import anyio
import zmq

from dcp._errors import AuthenticationFailed
from dcp._io.context import get_context
from dcp._io.errors import socket_errors
from dcp._io.lifecycle import ki_protected
from dcp._io.security import CurveClient, configure_client_socket
from dcp._io.sockets import AsyncSocket

__all__ = [
    "ATTEMPT_EVENTS",
    "CLIENT_EVENTS",
    "EVENTS",
    "NO_DETAIL_LIMIT",
    "REFUSED_LIMIT",
    "HandshakeWatch",
    "all_unreachable",
    "close_monitor",
    "connect_dealer",
    "monitor",
    "read_events",
    "watch_handshakes",
]

#: The monitor events the rules use, and ``DISCONNECTED`` (the worker's Rule W12).
EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
#: :data:`EVENTS` and a failed connection attempt: libzmq closes the attempt's descriptor
#: (``CLOSED``) and schedules the next (``CONNECT_RETRIED``, which also follows a
#: ``DISCONNECTED``: a retry alone is no failure). A tcp port or ipc path where nothing
#: listens gives ``CLOSED`` then ``CONNECT_RETRIED`` at every attempt; ``inproc`` gives none.
ATTEMPT_EVENTS = EVENTS | zmq.EVENT_CLOSED | zmq.EVENT_CONNECT_RETRIED
#: :data:`EVENTS` and what Rule H6 counts (``CONNECT_RETRIED``, ``CONNECTED``): the socket of
#: a client that does not wait for its broker (:func:`connect_dealer`).
CLIENT_EVENTS = EVENTS | zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED
#: Rule H3: failed handshakes in a row, without detail, that end the peer.
NO_DETAIL_LIMIT = 3
#: Rule H6: connection attempts refused in a row, with no handshake ever, that make the
#: broker unreachable (the 3rd comes 0.2-0.4 s after connecting, with zmq's default
#: ``RECONNECT_IVL``).
REFUSED_LIMIT = 3

#: How to give a peer its keys, in Python and on the command line.
_KEYS_HINT = "security=dcp.CurveClient(...) in Python, --keys and --server-key for dcp commands"
_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
#: Numbers the monitors' inproc addresses (with the process id: forks do not share them).
_MONITORS = (f"{os.getpid()}-{n}" for n in itertools.count())


class HandshakeWatch:
    """Rules H1-H6 for one socket connected to ``endpoint``.

    :param endpoint: the broker's endpoint, named in the error
    :param secure: whether this side uses CURVE (it shapes the explanation)
    :param role: ``"client"`` or ``"worker"``, named in the error
    """

    __slots__ = ("endpoint", "handshakes", "heard", "no_detail", "refused", "role", "secure")

    def __init__(self, endpoint: str, *, secure: bool, role: str) -> None:
        self.endpoint = endpoint
        self.secure = secure
        self.role = role
        #: Rule H3: failures without detail since the last successful handshake.
        self.no_detail = 0
        #: Rule H5: successful handshakes so far, and their count when the broker was last
        #: heard (the client sets :attr:`heard` as messages arrive).
        self.handshakes = 0
        self.heard = 0
        #: Rule H6: connection attempts refused since the last ``CONNECTED``.
        self.refused = 0

    def unreachable(self) -> bool:
        """Rule H6: whether no handshake ever succeeded and the last :data:`REFUSED_LIMIT`
        connection attempts (or more) were refused."""
        return self.handshakes == 0 and self.refused >= REFUSED_LIMIT

    def unheard(self) -> bool:
        """Rule H5: whether the current connection is a reconnection (CURVE) on which the
        broker was never heard."""
        return self.secure and self.handshakes > 1 and self.heard < self.handshakes

    def event(self, event: int, value: int) -> AuthenticationFailed | None:
        """One monitor event; the error to raise if the rules say the peer is done for."""
        if event == zmq.EVENT_CONNECT_RETRIED:
            self.refused += 1
            return None
        if event == zmq.EVENT_CONNECTED:
            self.refused = 0
            return None
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.no_detail = 0
            self.handshakes += 1
            if self.handshakes == 1:
                self.heard = 1  # the first connection is attached like any new one
            return None
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return self._fail(
                f"the broker refused this {self.role}'s CURVE key (ZAP status {value})"
                if self.secure
                else f"the broker refused this {self.role} (ZAP status {value})"
            )
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if value == _MISMATCH:
                return self._fail(
                    f"this {self.role} uses CURVE and the broker does not"
                    if self.secure
                    else f"the broker requires CURVE security and this {self.role} has none "
                    f"({_KEYS_HINT})"
                )
            return self._fail(f"the security handshake broke the protocol (zmq code {value:#x})")
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self.no_detail += 1
            if self.no_detail >= NO_DETAIL_LIMIT:
                return self._fail(
                    f"the broker hung up during {self.no_detail} handshakes in a row: is the "
                    "server key this client was given the broker's public key?"
                    if self.secure
                    else f"the peer hung up during {self.no_detail} handshakes in a row: "
                    f"does the broker require CURVE ({_KEYS_HINT})?"
                )
        return None

    def _fail(self, reason: str) -> AuthenticationFailed:
        return AuthenticationFailed(self.endpoint, reason)


def all_unreachable(watches: Sequence[HandshakeWatch]) -> bool:
    """Rule H6 for a client of several brokers: every one of them is unreachable (so none
    was ever connected)."""
    return all(watch.unreachable() for watch in watches)


def connect_dealer(
    context: zmq.Context[zmq.Socket[bytes]] | None,
    routing_id: bytes,
    security: CurveClient | None,
    endpoint: str,
    *,
    heartbeat: float | None = None,
    events: int = EVENTS,
    refusals: bool = False,
) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """A client's or worker's DEALER socket (linger 0, ``routing_id``, CURVE keys if
    ``security``) connected to the broker at ``endpoint``, and the monitor that watches its
    ``events`` from the start (:func:`monitor`; with ``refusals``, a client's connection
    attempts too: :data:`CLIENT_EVENTS`, Rule H6); nothing is left open if a step fails.

    Refusals only when asked: a broker that is down gives one every 0.1-0.2 s, and a monitor
    nobody reads (a :class:`dcp.SyncClient` between calls) is full after 2,000 events, when
    zmq's I/O thread blocks on it: every socket of the context stalls, the client's own close
    with them. (A worker's monitor, :data:`ATTEMPT_EVENTS`, is read by a task of its own.)

    :param context: zmq context (default: one shared per process)
    :param heartbeat: seconds between zmq heartbeats (``ZMQ_HEARTBEAT_IVL``; a silent
        connection is closed after three, ``DISCONNECTED``), and messages queued only on a
        connected pipe (``ZMQ_IMMEDIATE``): a client of several brokers (``None``: neither)
    :param events: the monitor's events (a worker's: :data:`ATTEMPT_EVENTS`, its failed
        connection attempts too)
    :param refusals: a client's: :data:`CLIENT_EVENTS` instead of ``events`` (a client with
        ``wait_for_broker=False``, Rule H6)
    """
    ctx = context if context is not None else get_context()
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    mon: zmq.Socket[bytes] | None = None
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
        configure_client_socket(sock, security)
        if heartbeat is not None:
            sock.setsockopt(zmq.HEARTBEAT_IVL, round(heartbeat * 1000))
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, round(3 * heartbeat * 1000))
            sock.setsockopt(zmq.IMMEDIATE, 1)
        # Handshake failures raise AuthenticationFailed.
        mon = monitor(sock, CLIENT_EVENTS if refusals else events)
        sock.connect(endpoint)
    except BaseException:
        sock.close(0)
        if mon is not None:
            mon.close(0)
        raise
    return sock, mon


def monitor(sock: zmq.Socket[bytes], events: int = EVENTS) -> zmq.Socket[bytes]:
    """A PAIR socket that receives ``sock``'s ``events`` (default: its handshake events; call
    before ``connect``).

    Close it with :func:`close_monitor`.
    """
    # A unique address: pyzmq's default names it after the socket's file descriptor, which
    # a new socket reuses while libzmq may still be tearing down the old monitor (seen as
    # clients whose monitor never connected, in a long test run).
    return sock.get_monitor_socket(events, addr=f"inproc://dcp-monitor-{next(_MONITORS)}")


def close_monitor(sock: zmq.Socket[bytes], mon: zmq.Socket[bytes]) -> None:
    """Stop ``sock``'s monitor (if ``sock`` is still open) and close ``mon``."""
    if not sock.closed:
        with socket_errors():  # Rule Z4 of dcp._io.errors
            sock.disable_monitor()
    mon.close(0)


def read_events(mon: zmq.Socket[bytes]) -> list[tuple[int, int]]:
    """Every event waiting on a monitor socket, as ``(event, value)``; never blocks."""
    # Here, not at the top: zmq.utils.monitor imports asyncio (and ssl) on every backend.
    from zmq.utils.monitor import parse_monitor_message

    events: list[tuple[int, int]] = []
    while True:
        try:
            frames = mon.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return events
        parsed = parse_monitor_message(frames)
        events.append((int(parsed["event"]), int(parsed["value"])))


@ki_protected  # a part's own task (dcp._io.lifecycle Rule E6)
async def watch_handshakes(
    sock: zmq.Socket[bytes],
    mon: zmq.Socket[bytes],
    watch: HandshakeWatch,
    on_failure: Callable[[AuthenticationFailed], object],
    on_event: Callable[[int], object] | None = None,
    on_unreachable: Callable[[], object] | None = None,
) -> None:
    """Apply the rules to ``mon``'s events until one says the peer is done for (then call
    ``on_failure`` with the error and return), the monitor is closed, or cancellation.
    Closes the monitor on the way out. ``on_event`` is given each event first;
    ``on_unreachable`` is called after each read of events that leaves the peer unreachable
    (Rule H6)."""
    amon = AsyncSocket(mon)
    try:
        while True:
            await amon.wait_readable()
            for event, value in read_events(mon):
                if on_event is not None:
                    on_event(event)
                failure = watch.event(event, value)
                if failure is not None:
                    on_failure(failure)
                    return
            if on_unreachable is not None and watch.unreachable():
                on_unreachable()
    except anyio.ClosedResourceError:
        pass
    finally:
        if not sock.closed:
            with socket_errors():  # Rule Z4 of dcp._io.errors
                sock.disable_monitor()
        amon.close(0)
