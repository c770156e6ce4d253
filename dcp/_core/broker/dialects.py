"""How the broker writes to a peer in the dialect it speaks. Pure.

The routing part (:mod:`.routing`) and the dialect handlers decide *what* to send (give this
request to that worker, answer that client, probe or expel a worker); the peer's
:class:`Dialect` turns it into frames (routing id first), using the codecs in :mod:`dcp.wire`.
One instance per wire form, shared by every peer that speaks it, so remembering a peer's
dialect costs one reference (DBP: one per broker core, which gives it its clock).

Majordomo has no error reply (RFC 7 and RFC 18 have no error command, and a body is opaque
data): :meth:`MdpDialect.error` is ``None``, and :attr:`Dialect.errors` says so (majordomo
Rules M1 and M5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dcp.wire import dbp, mdp
from dcp.wire.dcp1 import PROTOCOL, TYPE_FRAMES
from dcp.wire.messages import MessageType, error_reply_data

__all__ = [
    "DCP1",
    "DCP4",
    "DbpDialect",
    "Dialect",
    "DcpDialect",
    "MdpDialect",
    "dcp_dialect",
    "mdp_dialect",
]


class Dialect:
    """What the broker can say to a peer (base class; one subclass per dialect family)."""

    __slots__ = ("beats", "errors", "name", "partials")

    def __init__(self, name: str, *, partials: bool, beats: bool, errors: bool = True) -> None:
        #: Shown in logs and ``docs/protocol.md``: ``DCP/1``, ``DCP/1 (4-byte types)``, ...
        self.name = name
        #: Whether a client of this dialect can be sent partial replies.
        self.partials = partials
        #: Whether the broker heartbeats this dialect's workers itself (MDP: both sides beat).
        self.beats = beats
        #: Whether this dialect has an error reply: a client can be told of a refusal, a
        #: worker can answer a request with an error (MDP: neither, majordomo Rules M1, M5).
        self.errors = errors

    def request(
        self,
        ident: bytes,
        service: bytes,
        client: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
    ) -> list[bytes]:
        """A request given to worker ``ident``, to be answered to ``client``."""
        raise NotImplementedError

    def reply(
        self,
        ident: bytes,
        service: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        *,
        final: bool = True,
    ) -> list[bytes]:
        """A reply (or, if not ``final`` and :attr:`partials`, a partial reply) to client
        ``ident`` for its request to ``service`` with ``metadata``."""
        raise NotImplementedError

    def error(
        self, ident: bytes, service: bytes, metadata: tuple[bytes, ...], code: str, message: str
    ) -> list[bytes] | None:
        """A dcp error reply to client ``ident`` (an ordinary reply whose data is the error:
        marker, code, message); ``None`` if the dialect has none (:attr:`errors`): the
        client is told nothing."""
        return self.reply(ident, service, metadata, error_reply_data(code, message))

    def registered(self, ident: bytes, service: bytes) -> list[bytes] | None:
        """What confirms a registration, if anything (DCP echoes it; MDP says nothing)."""
        return None

    def refused(self, ident: bytes, service: bytes, code: str, message: str) -> list[bytes]:
        """What tells a worker its registration was refused (MDP: DISCONNECT)."""
        return self.expel(ident)

    def beat(self, ident: bytes) -> list[bytes]:
        """A heartbeat to worker ``ident`` (DCP: a pong; MDP: HEARTBEAT)."""
        raise NotImplementedError

    def expel(self, ident: bytes) -> list[bytes]:
        """Tell ``ident`` the broker does not know it as a worker (DCP: reconnect; MDP:
        DISCONNECT)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<dialect {self.name}>"


class DcpDialect(Dialect):
    """DCP v1 in one type-frame width."""

    __slots__ = ("_pong", "_reconnect", "_register", "_reply", "_request", "width")

    def __init__(self, width: int) -> None:
        super().__init__(
            "DCP/1" if width == 1 else "DCP/1 (4-byte types)", partials=False, beats=False
        )
        self.width = width
        types = TYPE_FRAMES[width]
        self._request = types[MessageType.REQUEST]
        self._reply = types[MessageType.REPLY]
        self._register = types[MessageType.REGISTER]
        self._pong = types[MessageType.PONG]
        self._reconnect = types[MessageType.RECONNECT]

    def request(
        self,
        ident: bytes,
        service: bytes,
        client: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
    ) -> list[bytes]:
        return [ident, b"", PROTOCOL, self._request, service, client, b"", *metadata, b"", *data]

    def reply(
        self,
        ident: bytes,
        service: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        *,
        final: bool = True,
    ) -> list[bytes]:
        # The client address is kept in a reply (protocol.md #4).
        return [ident, b"", PROTOCOL, self._reply, ident, b"", *metadata, b"", *data]

    def error(
        self, ident: bytes, service: bytes, metadata: tuple[bytes, ...], code: str, message: str
    ) -> list[bytes]:
        """A dcp error reply (DCP always has one)."""
        return self.reply(ident, service, metadata, error_reply_data(code, message))

    def registered(self, ident: bytes, service: bytes) -> list[bytes] | None:
        """The echo that confirms a registration."""
        return [ident, b"", PROTOCOL, self._register, service]

    def refused(self, ident: bytes, service: bytes, code: str, message: str) -> list[bytes]:
        """A refused registration: a reply without client address, the service as its one
        metadata part (none for an empty name), and an error reply's data."""
        return [
            ident,
            b"",
            PROTOCOL,
            self._reply,
            b"",
            *((service,) if service else ()),
            b"",
            *error_reply_data(code, message),
        ]

    def beat(self, ident: bytes) -> list[bytes]:
        return [ident, b"", PROTOCOL, self._pong]

    def expel(self, ident: bytes) -> list[bytes]:
        return [ident, b"", PROTOCOL, self._reconnect]


class MdpDialect(Dialect):
    """One Majordomo form (:class:`dcp.wire.mdp.MdpPeer`). MDP has no metadata: a request
    from a DCP client keeps its metadata in the broker, which puts it back in the reply."""

    __slots__ = ("peer",)

    def __init__(self, peer: mdp.MdpPeer) -> None:
        name = peer.form.value + (" (majortomo)" if peer.envelope and not peer.worker else "")
        super().__init__(name, partials=peer.partials, beats=True, errors=False)
        self.peer = peer

    def request(
        self,
        ident: bytes,
        service: bytes,
        client: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
    ) -> list[bytes]:
        return [ident, *self.peer.worker_request(client, data)]

    def reply(
        self,
        ident: bytes,
        service: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        *,
        final: bool = True,
    ) -> list[bytes]:
        return [ident, *self.peer.client_answer(service, data, final=final)]

    def error(
        self, ident: bytes, service: bytes, metadata: tuple[bytes, ...], code: str, message: str
    ) -> None:
        """None: MDP has no error reply, and any body would read as data (majordomo Rule
        M1)."""
        return None

    def beat(self, ident: bytes) -> list[bytes]:
        return [ident, *self.peer.worker_heartbeat()]

    def expel(self, ident: bytes) -> list[bytes]:
        return [ident, *self.peer.worker_disconnect()]


class DbpDialect(Dialect):
    """DBP services (:mod:`dcp.wire.dbp`): approved/denied, ``REQ``, heartbeats. One per
    broker core (:mod:`.dbp`).

    :param clock: the time frame DBP puts in every command (epoch seconds, which the driver
        supplies; a formatting detail, not a rule: the core's own time is the ``now`` it is
        given, and it reads no clock)
    """

    __slots__ = ("clock",)

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__("DBP", partials=False, beats=True)
        self.clock = clock

    def request(
        self,
        ident: bytes,
        service: bytes,
        client: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
    ) -> list[bytes]:
        return [ident, *dbp.request(client, data, self.clock())]

    def reply(
        self,
        ident: bytes,
        service: bytes,
        metadata: tuple[bytes, ...],
        data: Sequence[bytes],
        *,
        final: bool = True,
    ) -> list[bytes]:
        """An answer to a DBP peer is an info reply (DBP has no requests to services)."""
        return [ident, *dbp.info_reply(data[0] if data else b"", self.clock())]

    def registered(self, ident: bytes, service: bytes) -> list[bytes] | None:
        return [ident, *dbp.approved(self.clock())]

    def refused(self, ident: bytes, service: bytes, code: str, message: str) -> list[bytes]:
        return [ident, *dbp.denied(message, self.clock())]

    def beat(self, ident: bytes) -> list[bytes]:
        return [ident, *dbp.beat(self.clock())]

    def expel(self, ident: bytes) -> list[bytes]:
        return [ident, *dbp.disconnect(self.clock())]


DCP1 = DcpDialect(1)
DCP4 = DcpDialect(4)
_DCP = {1: DCP1, 4: DCP4}
_MDP = {p: MdpDialect(p) for p in mdp.all_peers()}


def dcp_dialect(width: int) -> DcpDialect:
    """The DCP dialect of a type-frame width (1 or 4)."""
    return _DCP[width]


def mdp_dialect(peer: mdp.MdpPeer) -> MdpDialect:
    """The dialect of an MDP peer's form."""
    return _MDP[peer]
