"""DBP peers (the Distributive Broker Protocol draft, :mod:`dcp.wire.dbp`) on the routing
part. Sans-IO: one of the broker core's dialect handlers (:class:`~.core.Handler`).

Rule DB1 - Info. ``u_U name`` is answered ``o_O json``: the service's info and live figures
  (``mmi.info`` and ``mmi.stats`` merged), or for an empty name the first page of the list
  ``mmi.services`` gives, ended by a ``truncated`` marker entry if there is more (directory
  Rule D6: DBP cannot page); a service the broker does not know gets ``{"name": ...,
  "status": "inactive"}``. Any peer may ask, registered or not; an answer over the peer's
  share of the directory budget is not sent (directory Rule D7, counted as
  ``memory_budget``).
Rule DB2 - Registration. ``UwU json`` with a ``name`` registers the peer for that service,
  with the JSON's ``version``, ``description``, ``metadata`` and schemas as the service's
  info (directory Rule D3; its other fields, such as the draft's address, port and
  heartbeat timing, are not used). It goes through every registration rule (reserved names,
  allow-lists, approval): APPROVED is ``OwO``, a refusal is ``(O_O) reason``. Info that
  does not validate is refused the same way, and so is a registration that does not parse:
  its JSON is checked for size, depth and element count before it is parsed
  (:data:`dcp.wire.dbp.MAX_DOCUMENT`; ``json_too_large``). A registered DBP service holds
  one request at a time (``REQ``; it answers with ``REP``, which asks for the next), like an
  MDP worker.
Rule DB3 - ``UoU json`` from a registered service replaces its info (answered ``u.u``);
  ``<3`` keeps it alive (peers Rule L1; the broker beats DBP services itself, as MDP ones);
  ``</3`` removes it (its request is redelivered). Any of these from a peer that is not a
  registered DBP service gets ``</3`` (DBP: "respond to any valid but unexpected command by
  sending DISCONNECT"); ``u.u`` is ignored.

What this module does NOT do: the draft's UDP heartbeats (the beacon is dcp's own,
:mod:`dcp._io.beacon`), network bridging, last-value caching, logging aggregation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dcp._core.broker import directory
from dcp._core.broker.dialects import DbpDialect
from dcp._core.broker.directory import Directory, Mmi
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.records import Session
from dcp._core.broker.redelivery import Redelivery
from dcp._core.broker.routing import Routing
from dcp._errors import RemoteProtocolError
from dcp._json import encode_json
from dcp.wire import dbp

__all__ = ["DbpPeers"]


class DbpPeers:
    """The DBP dialect handler: services and info requests (the module's rules).

    :param outputs: where messages, counts and refusals go
    :param sessions: the registered workers, and other peers' dialects
    :param routing: queues, credit, held requests, registrations
    :param directory: a service's info (Rules DB2, DB3)
    :param mmi: the service listing (Rule DB1)
    :param redelivery: a service that disconnects
    :param clock: epoch seconds, for the time frame in every DBP command
        (:class:`~.dialects.DbpDialect`)
    """

    def __init__(
        self,
        *,
        outputs: Outputs,
        sessions: Sessions,
        routing: Routing,
        directory: Directory,
        mmi: Mmi,
        redelivery: Redelivery,
        clock: Callable[[], float],
    ) -> None:
        #: How the broker writes to DBP peers.
        self.dialect = DbpDialect(clock)
        self._out = outputs
        self._outbox = outputs.outbox
        self._sessions = sessions
        self._routing = routing
        self._directory = directory
        self._mmi = mmi
        self._redelivery = redelivery

    def receive(
        self,
        peer: bytes,
        body: Sequence[bytes],
        worker: Session | None,
        now: float,
        principal: str | None,
    ) -> None:
        """One DBP command (``body``: after the routing id) from ``peer`` (``worker``: its
        session, if it is a registered worker)."""
        try:
            event = dbp.parse(body)
        except RemoteProtocolError as exc:
            self._out.reject(peer, exc.reason, str(exc))
            if len(body) > 1 and body[1] == dbp.REGISTER:  # Rule DB2: told why
                self._outbox.append(
                    self.dialect.refused(peer, b"", exc.reason, f"{exc.reason}: {exc}")
                )
            return
        outbox = self._outbox
        dialect = self.dialect
        if isinstance(event, dbp.InfoRequest):
            found = (self._info(event.name, now),)
            if self._mmi.charge(peer, found, now):  # directory Rule D7
                outbox.append(dialect.reply(peer, b"", (), found))
            return
        if isinstance(event, dbp.Ack):
            return
        if isinstance(event, dbp.Registration):
            self._register(peer, worker, event, now, principal)
            return
        if worker is None or worker.dialect is not dialect:
            if worker is not None:
                self._out.reject(
                    peer, "dialect_mismatch", "DBP from a %s worker", worker.dialect.name
                )
                return
            self._out.counters.reconnects_sent += 1
            outbox.append(dialect.expel(peer))
            return
        self._sessions.heard(worker, now)
        routing = self._routing
        if isinstance(event, dbp.ServiceReply):
            answered = routing.answered(peer, worker, event.client, None, now)
            if answered is None:
                return
            client, pending = answered
            self._out.counters.replies += 1
            if pending is not None:
                origin = pending.origin
                name, metadata = pending.service.name, pending.metadata
            else:
                origin, name, metadata = self._sessions.dialect_of(client), b"", ()
            outbox.append(origin.reply(client, name, metadata, event.body))
            routing.credit(worker, now, released=pending is not None)
        elif isinstance(event, dbp.Update):
            try:
                info = directory.parse_info(encode_json(event.document))
            except ValueError as exc:
                self._out.reject(peer, "bad_service_info", str(exc))
                return
            for service in worker.services:
                self._directory.describe(peer, service.name, info, registered=True)
            outbox.append([peer, b"", dbp.ACK, b"%.3f" % dialect.clock()])
        elif isinstance(event, dbp.Heartbeat):
            if worker.held:
                worker.beats_busy = True
        else:  # Disconnect
            self._redelivery.remove_worker(worker, now)

    def _register(
        self,
        peer: bytes,
        worker: Session | None,
        event: dbp.Registration,
        now: float,
        principal: str | None,
    ) -> None:
        """Rule DB2."""
        dialect = self.dialect
        if worker is not None and worker.dialect is not dialect:
            self._out.reject(peer, "dialect_mismatch", "DBP from a %s worker", worker.dialect.name)
            return
        name = event.name
        try:
            info = directory.parse_info(encode_json(event.document))
        except ValueError as exc:
            self._out.reject(peer, "bad_service_info", str(exc))
            self._outbox.append(dialect.refused(peer, name, "bad_service_info", str(exc)))
            return
        self._directory.describe(peer, name, info, registered=False)
        self._routing.register(peer, worker, name, dialect, now, principal)

    def _info(self, name: bytes, now: float) -> bytes:
        """Rule DB1: the JSON answering an info request."""
        if not name:
            return self._mmi.capped()  # directory Rule D6
        service = self._routing.services.get(name)
        if service is None:
            return encode_json({"name": directory.text(name), "status": "inactive"})
        info = self._directory.info_entry(service, now)
        stats = directory.stats_entry(service, now)
        merged = {**stats, **info, "status": "active" if service.workers else "inactive"}
        merged["type"] = "io.dcp.v1.dbp_info"
        return encode_json(merged)
