"""Majordomo frames: MDP/0.1 (ZeroMQ RFC 7), MDP/0.2 (RFC 18) and majortomo's variant. Pure.

Frames here are the DEALER-side view, as in :mod:`dcp.wire.dcp1`: a ROUTER's routing id is
not part of them.

The three forms on the wire (``E`` is the empty envelope delimiter a REQ socket adds; it is
optional on input for every form, and each peer is answered with it if it used it):

=============  ===========================================  ================================
form           client -> broker, broker -> client            worker commands (both ways)
=============  ===========================================  ================================
MDP/0.1        ``E MDPC01 service body...`` both ways        ``E MDPW01 cmd ...``: READY 1,
                                                             REQUEST 2, REPLY 3, HEARTBEAT 4,
                                                             DISCONNECT 5
MDP/0.2        ``MDPC02 0x01 service body...``; answers      ``MDPW02 cmd ...``: READY 1,
               ``MDPC02 0x02|0x03 service body...``          REQUEST 2, PARTIAL 3, FINAL 4,
               (PARTIAL, FINAL)                              HEARTBEAT 5, DISCONNECT 6
majortomo      ``E MDPC02 0x02 service body...``; answers    as MDP/0.2, with ``E``
0.2.0          ``E MDPC02 0x03|0x04 body...`` (its one
               command table; no service frame)
=============  ===========================================  ================================

Worker REQUEST, REPLY, PARTIAL and FINAL carry ``client-address E body...`` after the command.
A majortomo client is told apart from an MDP/0.2 one by its REQUEST command (0x02, not 0x01);
majortomo workers speak MDP/0.2 with the envelope.

A body has at least one frame in what a broker writes (:meth:`MdpPeer.client_answer`,
:meth:`MdpPeer.worker_request`): no data is one empty frame. RFC 7 and RFC 18 give a REQUEST,
REPLY, PARTIAL or FINAL "Frames 3+" (client) or "Frames 5+" (worker) of body, and peers rely
on it (the zguide's ``mdcliapi2.c`` asserts 4 frames; majortomo's worker drops a shorter
REQUEST). On input a missing body is read as no data.
"""

from __future__ import annotations

import enum
import typing

import attrs

from dcp import _errors

if typing.TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "C01",
    "C02",
    "CLIENT_HEADERS",
    "HEADERS",
    "W01",
    "W02",
    "WORKER_HEADERS",
    "ClientRequest",
    "Event",
    "Form",
    "MdpPeer",
    "WorkerAnswer",
    "WorkerDisconnect",
    "WorkerHeartbeat",
    "WorkerReady",
    "all_peers",
    "parse",
    "peer",
]

#: The protocol frames: MDP/0.1 and MDP/0.2, client and worker.
C01 = b"MDPC01"
W01 = b"MDPW01"
C02 = b"MDPC02"
W02 = b"MDPW02"
CLIENT_HEADERS = frozenset({C01, C02})
WORKER_HEADERS = frozenset({W01, W02})
HEADERS = CLIENT_HEADERS | WORKER_HEADERS


class Form(enum.Enum):
    """Which Majordomo a peer speaks."""

    #: MDP/0.1, ZeroMQ RFC 7 (no partial replies).
    V01 = "MDP/0.1"
    #: MDP/0.2, ZeroMQ RFC 18 (partial replies).
    V02 = "MDP/0.2"
    #: majortomo 0.2.0's MDP/0.2 client: one command table for both sides, no service frame
    #: in answers.
    MAJORTOMO = "majortomo"


# Worker commands: READY, REQUEST, REPLY/FINAL, HEARTBEAT, DISCONNECT, PARTIAL per version.
_READY = b"\x01"
_REQUEST = b"\x02"
_W01_REPLY, _W01_HEARTBEAT, _W01_DISCONNECT = b"\x03", b"\x04", b"\x05"
_W02_PARTIAL, _W02_FINAL, _W02_HEARTBEAT, _W02_DISCONNECT = b"\x03", b"\x04", b"\x05", b"\x06"
# Client commands (MDP/0.2 and majortomo's table).
_C02_REQUEST, _C02_PARTIAL, _C02_FINAL = b"\x01", b"\x02", b"\x03"
_MT_REQUEST, _MT_PARTIAL, _MT_FINAL = b"\x02", b"\x03", b"\x04"
# The body a broker writes for no data (RFC 7 and 18: at least one body frame).
_NO_DATA = (b"",)


@attrs.frozen
class ClientRequest:
    """A client's request for ``service``."""

    service: bytes
    body: tuple[bytes, ...]


@attrs.frozen
class WorkerReady:
    """A worker registers for ``service`` (MDP: one service per connection)."""

    service: bytes


@attrs.frozen
class WorkerAnswer:
    """A worker's answer to ``client``: REPLY (MDP/0.1) or FINAL, or a PARTIAL."""

    client: bytes
    body: tuple[bytes, ...]
    final: bool = True


@attrs.frozen
class WorkerHeartbeat:
    """A worker's heartbeat (asks for no work)."""


@attrs.frozen
class WorkerDisconnect:
    """A worker leaves."""


Event = ClientRequest | WorkerReady | WorkerAnswer | WorkerHeartbeat | WorkerDisconnect


@attrs.frozen(cache_hash=True)
class MdpPeer:
    """How one MDP peer frames its messages, so that it is answered in kind."""

    form: Form
    #: Whether it sends (and so expects) the empty envelope delimiter first.
    envelope: bool
    #: A worker (``MDPW0x``) rather than a client.
    worker: bool

    @property
    def partials(self) -> bool:
        """Whether this peer's protocol has partial replies (MDP/0.1 has not)."""
        return self.form is not Form.V01

    # -------------------------------------------------- broker -> peer (what a broker writes)

    def client_answer(self, service: bytes, body: Sequence[bytes], *, final: bool) -> list[bytes]:
        """A reply (``final``) or partial reply to this client; MDP/0.1 has no partials
        (:attr:`partials`). No data is one empty body frame."""
        form = self.form
        if not body:
            body = _NO_DATA
        if form is Form.V01:
            frames = [C01, service, *body]
        elif form is Form.V02:
            frames = [C02, _C02_FINAL if final else _C02_PARTIAL, service, *body]
        else:
            frames = [C02, _MT_FINAL if final else _MT_PARTIAL, *body]
        return [b"", *frames] if self.envelope else frames

    def worker_request(self, client: bytes, body: Sequence[bytes]) -> list[bytes]:
        """A request given to this worker, answered to ``client`` (no data: one empty body
        frame)."""
        return self._worker(_REQUEST, client, b"", *(body or _NO_DATA))

    def worker_heartbeat(self) -> list[bytes]:
        return self._worker(_W01_HEARTBEAT if self.form is Form.V01 else _W02_HEARTBEAT)

    def worker_disconnect(self) -> list[bytes]:
        return self._worker(_W01_DISCONNECT if self.form is Form.V01 else _W02_DISCONNECT)

    # ------------------------------------------------- peer -> broker (what a peer writes)

    def client_request(self, service: bytes, body: Sequence[bytes]) -> list[bytes]:
        form = self.form
        if form is Form.V01:
            frames = [C01, service, *body]
        else:
            frames = [C02, _C02_REQUEST if form is Form.V02 else _MT_REQUEST, service, *body]
        return [b"", *frames] if self.envelope else frames

    def worker_ready(self, service: bytes) -> list[bytes]:
        return self._worker(_READY, service)

    def worker_answer(self, client: bytes, body: Sequence[bytes], *, final: bool) -> list[bytes]:
        if self.form is Form.V01:
            if not final:
                raise ValueError("MDP/0.1 has no partial replies")
            return self._worker(_W01_REPLY, client, b"", *body)
        return self._worker(_W02_FINAL if final else _W02_PARTIAL, client, b"", *body)

    def _worker(self, command: bytes, *rest: bytes) -> list[bytes]:
        header = W01 if self.form is Form.V01 else W02
        if self.envelope:
            return [b"", header, command, *rest]
        return [header, command, *rest]


_PEERS = {
    (form, envelope, worker): MdpPeer(form, envelope, worker)
    for form in Form
    for envelope in (False, True)
    for worker in (False, True)
}


def all_peers() -> tuple[MdpPeer, ...]:
    """Every form a peer can have (for tables keyed by it)."""
    return tuple(_PEERS.values())


def peer(form: Form, *, envelope: bool, worker: bool) -> MdpPeer:
    """The (shared, immutable) :class:`MdpPeer` for these settings."""
    return _PEERS[form, envelope, worker]


def parse(frames: Sequence[bytes]) -> tuple[Event, MdpPeer]:
    """Parse one message an MDP client or worker sent to a broker.

    :param frames: DEALER-side frames (the routing id removed)
    :returns: the event, and how its sender frames messages
    :raises RemoteProtocolError: a subclass naming what is wrong
    """
    envelope = len(frames) > 0 and not frames[0]
    i = 1 if envelope else 0
    n = len(frames)
    if n - i < 2:
        raise _errors.TooFewFrames(f"{n} frame(s); an MDP message needs a header and a command")
    header = frames[i]
    if header == C01:
        ev = ClientRequest(_small(frames[i + 1]), tuple(frames[i + 2 :]))
        return ev, _PEERS[Form.V01, envelope, False]
    command = frames[i + 1]
    if header == C02:
        if command == _C02_REQUEST:
            form = Form.V02
        elif command == _MT_REQUEST:
            form = Form.MAJORTOMO
        else:
            raise _errors.UnknownMessageType(f"MDP/0.2 client command {bytes(command)[:8]!r}")
        if n - i < 3:
            raise _errors.MissingServiceName("MDP/0.2 request without a service frame")
        ev = ClientRequest(_small(frames[i + 2]), tuple(frames[i + 3 :]))
        return ev, _PEERS[form, envelope, False]
    if header == W01:
        form = Form.V01
        answer, heartbeat, disconnect, partial = (
            _W01_REPLY,
            _W01_HEARTBEAT,
            _W01_DISCONNECT,
            None,
        )
    elif header == W02:
        form = Form.V02
        answer, heartbeat, disconnect, partial = (
            _W02_FINAL,
            _W02_HEARTBEAT,
            _W02_DISCONNECT,
            _W02_PARTIAL,
        )
    else:
        raise _errors.UnknownMessageType(f"MDP header {bytes(header)[:8]!r}")
    sender = _PEERS[form, envelope, True]
    rest = n - i - 2
    if command == answer or (partial is not None and command == partial):
        if rest < 1 or not frames[i + 2]:
            raise _errors.MissingClientDelimiter("MDP worker reply without a client address")
        if rest < 2 or frames[i + 3]:
            raise _errors.MissingClientDelimiter(
                "MDP client address not followed by an empty frame"
            )
        event: Event = WorkerAnswer(
            _small(frames[i + 2]), tuple(frames[i + 4 :]), final=command == answer
        )
        return event, sender
    if command == _READY:
        if rest < 1:
            raise _errors.MissingServiceName("MDP READY without a service frame")
        if rest > 1:
            raise _errors.UnexpectedFrames(f"MDP READY has {rest - 1} frame(s) after the service")
        return WorkerReady(_small(frames[i + 2])), sender
    if command in (heartbeat, disconnect):
        if rest:
            raise _errors.UnexpectedFrames(f"MDP worker command has {rest} unexpected frame(s)")
        return (WorkerHeartbeat() if command == heartbeat else WorkerDisconnect()), sender
    raise _errors.UnknownMessageType(f"{form.value} worker command {bytes(command)[:8]!r}")


def _small(frame: bytes) -> bytes:
    return frame if frame.__class__ is bytes else bytes(frame)
