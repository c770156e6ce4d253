"""DCP v1 peers (:mod:`dcp.wire.dcp1`, streams :mod:`dcp.wire.streams`, pub/sub
:mod:`.pubsub_peers`) on the routing part. Sans-IO: one of the broker core's dialect
handlers (:class:`~.core.Handler`).

Rule R3 - Addresses. A request without a client address gets the sender's address inserted.
  One that carries an address keeps it (a worker forwarding work), but only a registered
  worker may name an address other than its own, unless ``allow_foreign_address``.
  A reply is routed to its client address in the client's dialect (for a DCP client, the
  type-frame width, 1 or 4 bytes, it used). A reply for a peer that is not connected is
  kept and sent again for ``liveness x heartbeat_interval`` (:mod:`dcp._core.broker.unreachable`),
  then counted and dropped.
Rule R4 - Heartbeats. Every ping from a worker is answered with a pong and asks for work (Rule
  1); a pong from a worker is a keep-alive that asks for no work and is answered with a pong
  (dcp extension). A ping or pong from a peer that is not a registered worker is answered
  with reconnect (0x06). A worker that sends reconnect leaves at once (dcp extension).

A registered worker that sends another dialect's message is refused (``dialect_mismatch``,
Rule R6 of :mod:`.core`). A stream message (PARTIAL from a worker, CREDIT or CANCEL from a
reader) is parsed and its client address unsealed here, and handed to :mod:`.streams`.

What this module does NOT do: keep state of its own (the parts it is given do), or answer
``mmi.*`` itself (:class:`~.directory.Mmi` does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from dcp._core.broker.dialects import DCP1, DCP4, DcpDialect, Dialect, dcp_dialect
from dcp._core.broker.directory import Mmi
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.pubsub_peers import PUBSUB_PREFIX, PubSubPeers
from dcp._core.broker.records import Pending, Session
from dcp._core.broker.redelivery import Redelivery
from dcp._core.broker.routing import Routing, chain_of, with_chain
from dcp._core.broker.streams import Streams
from dcp._core.broker.unreachable import EarlyReplies
from dcp._errors import RemoteProtocolError
from dcp.wire.dcp1 import PROTOCOL, parse
from dcp.wire.messages import ERROR_MARKER, MessageType, Register, Reply, Request
from dcp.wire.sniff import Family, sniff
from dcp.wire.streams import TYPE_FRAMES as STREAM_TYPE_FRAMES
from dcp.wire.streams import StreamType, parse_stream

__all__ = ["DcpPeers"]

_REQUEST = MessageType.REQUEST
_REPLY = MessageType.REPLY
_PING = MessageType.PING
_PONG = MessageType.PONG
_REGISTER = MessageType.REGISTER


class DcpPeers:
    """The DCP v1 dialect handler (the module's rules).

    :param outputs: where messages, counts, refusals and log lines go
    :param sessions: the registered workers, and other peers' dialects
    :param routing: queues, credit, held requests, registrations
    :param streams: partial replies, credit and cancels
    :param pubsub: requests to the reserved pub/sub names
    :param mmi: requests to ``mmi.*`` names
    :param redelivery: a worker that leaves (reconnect)
    :param early: replies from peers not registered yet (unreachable Rules U4-U5)
    :param allow_foreign_address: let any peer send requests naming another client
    """

    def __init__(
        self,
        *,
        outputs: Outputs,
        sessions: Sessions,
        routing: Routing,
        streams: Streams,
        pubsub: PubSubPeers,
        mmi: Mmi,
        redelivery: Redelivery,
        early: EarlyReplies,
        allow_foreign_address: bool,
    ) -> None:
        self._out = outputs
        self._outbox = outputs.outbox
        self._counters = outputs.counters
        self._sessions = sessions
        self._routing = routing
        self._streams = streams
        self._pubsub = pubsub
        self._mmi = mmi
        self._redelivery = redelivery
        self._early = early
        self.allow_foreign_address = allow_foreign_address
        # Non-worker peers whose dialect other than 1-byte DCP is remembered (read on the
        # per-message path, to skip remembering a plain DCP client).
        self._remembered = sessions.dialects

    def receive(
        self,
        peer: bytes,
        body: Sequence[bytes],
        worker: Session | None,
        now: float,
        principal: str | None,
    ) -> None:
        """One DCP message (``body``: after the routing id) from ``peer`` (``worker``: its
        session, if it is a registered worker)."""
        if len(body) > 2 and body[2] in STREAM_TYPE_FRAMES and body[1] == PROTOCOL:
            self._on_stream(peer, body, worker, now)
            return
        try:
            msg, width = parse(body)
        except RemoteProtocolError as exc:
            self._out.reject(peer, exc.reason, str(exc))
            return
        dialect = DCP1 if width == 1 else DCP4
        if worker is not None:
            if worker.dialect.__class__ is not DcpDialect:
                self._out.reject(
                    peer, "dialect_mismatch", "DCP from a %s worker", worker.dialect.name
                )
                return
            # Answer in the type width it last used; peers Rule L1 (Sessions.heard, inlined).
            worker.dialect = dialect
            worker.heard = now
            worker.expiry = now + worker.timeout
            worker.order.move_to_end(peer)
        elif dialect is not DCP1 or peer in self._remembered:
            self._sessions.remember(peer, dialect)
        mtype = msg.type
        if mtype is _REQUEST:
            assert isinstance(msg, Request)
            if msg.service[:5] == PUBSUB_PREFIX:
                self._pubsub.receive(peer, msg, dialect, now, principal)
            else:
                self._on_request(peer, worker, msg, dialect, now)
        elif mtype is _REPLY:
            assert isinstance(msg, Reply)
            self._on_reply(peer, worker, msg, now)
        elif mtype is _PING or mtype is _PONG:
            if worker is None:
                self._outbox.append(dialect.expel(peer))
                self._counters.reconnects_sent += 1
            else:
                self._outbox.append(dialect.beat(peer))
                if mtype is _PING:
                    if worker.held:
                        worker.beats_busy = True
                    self._routing.credit(worker, now, released=False)
                else:
                    # A worker's pong is a dcp keep-alive: dcp workers beat while busy.
                    worker.beats_busy = True
        elif mtype is _REGISTER:
            assert isinstance(msg, Register)
            session = self._routing.register(peer, worker, msg.service, dialect, now, principal)
            early = self._early
            if session is not None and len(early):
                # Rule U4: its answers that came ahead of this registration.
                for reply in early.registered(peer):
                    assert isinstance(reply, Reply)
                    self._on_reply(peer, session, reply, now)
        elif worker is None:  # RECONNECT
            self._out.reject(peer, "unexpected_reconnect", "reconnect from a non-worker")
        else:
            self._redelivery.remove_worker(worker, now)

    def _on_request(
        self, peer: bytes, worker: Session | None, msg: Request, dialect: Dialect, now: float
    ) -> None:
        client = msg.client
        upstream = None
        origin = dialect
        if client is None:
            client = peer
        elif worker is not None:
            forwarded = self.forwarded(peer, worker, client, msg.metadata, now)
            if forwarded is None:
                return
            client, origin, upstream = forwarded
        elif client != peer:
            if not self.allow_foreign_address:
                self._out.refuse(
                    peer,
                    dialect,
                    msg.service,
                    msg.metadata,
                    "forbidden_address",
                    "only registered workers may send a request for another client's address",
                )
                return
            origin = self._sessions.dialect_of(client)
        name = msg.service
        routing = self._routing
        if name[:4] == b"mmi.":
            self._mmi.answer(client, origin, name, msg.metadata, msg.data, now)
        else:
            forward = msg.client is not None and worker is not None
            metadata = msg.metadata
            if forward:
                refused = routing.submit(
                    client,
                    origin,
                    name,
                    metadata,
                    msg.data,
                    now,
                    forward=True,
                    upstream=upstream,
                    sender=peer,
                )
            else:
                refused = routing.submit(
                    client, origin, name, metadata, msg.data, now, forward=False
                )
            if refused is not None:
                # The error reply goes to the request's client: for a forward, the original,
                # with the chain (routing Rule R9).
                if forward:
                    metadata = with_chain(metadata, chain_of(upstream, name))
                self._out.refuse(client, origin, name, metadata, *refused)
        if worker is not None:
            routing.credit(worker, now, released=upstream is not None)

    def forwarded(
        self,
        peer: bytes,
        worker: Session,
        client: bytes,
        metadata: tuple[bytes, ...],
        now: float,
    ) -> tuple[bytes, Dialect, Pending | None] | None:
        """A worker's forward names ``client``: the client's real address, its dialect, and
        the request the forward finished, which the worker held (matched as a reply is; a
        worker naming an address without holding its request releases nothing: ``None``);
        ``None`` if the address is not one the broker gave (security Rule S4)."""
        answered = self._routing.answered(peer, worker, client, metadata, now)
        if answered is None:
            return None
        client, finished = answered
        if finished is not None:
            return client, finished.origin, finished
        return client, self._sessions.dialect_of(client), None

    def _on_reply(self, peer: bytes, worker: Session | None, msg: Reply, now: float) -> None:
        if worker is None:
            # Rule U4 (dcp._core.broker.unreachable): it may register in a moment.
            if not self._early.keep(peer, msg, now):
                self._out.reject(
                    peer, "reply_from_non_worker", "only registered workers may reply"
                )
            return
        client = msg.client
        routing = self._routing
        if client is None:
            self._out.reject(peer, "reply_without_client", "reply has no client address")
            routing.credit(worker, now, released=False)
            return
        answered = routing.answered(peer, worker, client, msg.metadata, now)
        if answered is None:
            return
        client, pending = answered
        self._counters.replies += 1
        metadata = msg.metadata
        if pending is not None:
            origin, name = pending.origin, pending.service.name
            data = msg.data
            if data and data[0] == ERROR_MARKER:
                pending.service.errors += 1  # directory Rule D5
                if pending.chain:
                    # Routing Rule R9: where in the chain it failed.
                    metadata = with_chain(metadata, (*pending.chain, name))
        else:
            origin, name = self._sessions.dialect_of(client), b""
            routing.answered_elsewhere(client, metadata)  # routing Rule R11
        self._streams.answer(client, origin.reply(client, name, metadata, msg.data))
        routing.credit(worker, now, released=pending is not None)

    def _on_stream(
        self, peer: bytes, body: Sequence[bytes], worker: Session | None, now: float
    ) -> None:
        """A DCP stream message (streams Rules ST1-ST5)."""
        try:
            msg = parse_stream(body)
        except Exception as exc:  # a RemoteProtocolError: every defect has its reason
            self._out.reject(peer, getattr(exc, "reason", "bad_stream_message"), str(exc))
            return
        if worker is not None:
            self._sessions.heard(worker, now)
        if msg.type is not StreamType.PARTIAL:
            self._streams.reader(peer, msg)
            return
        if worker is None or not isinstance(worker.dialect, DcpDialect):
            self._out.reject(peer, "partial_from_non_worker", "only DCP workers send parts")
            return
        client = msg.client
        if client is None:
            self._out.reject(peer, "reply_without_client", "a part has no client address")
            return
        unsealed = self._routing.unsealed(peer, client)
        if unsealed is not None:
            self._streams.dcp_partial(peer, worker, unsealed, client, msg)

    def cut(
        self,
        peer: bytes,
        body: Sequence[bytes],
        worker: Session | None,
        reason: str,
        detail: str,
        now: float,
    ) -> None:
        """Rule R6: the driver cut a message from ``peer`` at a limit (``body``: what it
        kept). A DCP request whose metadata was kept gets an error reply instead (a worker
        forwarding a request it holds: on behalf of the request's client, and it gets its
        credit back); anything else is counted and logged."""
        msg: object = None
        width = 1
        if sniff(body) is Family.DCP:
            with contextlib.suppress(RemoteProtocolError):
                msg, width = parse(body)
        if not isinstance(msg, Request):
            self._out.reject(peer, reason, detail)
            return
        dialect = dcp_dialect(width)
        if worker is None:
            self._sessions.remember(peer, dialect)
        client = msg.client
        origin: Dialect = dialect
        upstream = None
        metadata = msg.metadata
        if worker is not None and client is not None:
            # A worker forwarding a request it holds: its client is the one to tell.
            forwarded = self.forwarded(peer, worker, client, metadata, now)
            if forwarded is None:
                return
            client, origin, upstream = forwarded
            metadata = with_chain(metadata, chain_of(upstream, msg.service))
        elif client is None or (client != peer and not self.allow_foreign_address):
            client = peer
        self._out.refuse(client, origin, msg.service, metadata, reason, detail)
        if worker is not None:
            self._routing.credit(worker, now, released=upstream is not None)
