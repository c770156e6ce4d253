"""Majordomo peers (MDP/0.1, MDP/0.2, majortomo) on the routing part. Sans-IO: one of the
broker core's dialect handlers (:class:`~.core.Handler`).

Rule M1 - Clients. An MDP request is a request with no metadata; the client is answered in
  the form it used (:mod:`dcp.wire.mdp`), always with a body frame (an empty one where there
  is no data: a handler that returned nothing, the end of a stream). A refusal (queue full,
  client limit, too many services, redelivery limit, a broken stream, ...) is counted and
  logged like any (core Rule R6), and the MDP client is told nothing: RFC 7 and RFC 18 have
  no error command and a body is the service's data, so any answer would read as a reply;
  their clients treat silence as failure (retry, then give up). An error reply a dcp worker
  sends is its answer, and reaches the client as its body.
Rule M2 - Workers. READY registers the worker for one service (a second READY, or a command
  MDP does not know, gets DISCONNECT and the worker is removed). Any command but READY from a
  peer that is not a registered worker gets DISCONNECT (RFC 7), except DISCONNECT itself.
  Registered MDP workers hold one request at a time: READY and each FINAL (REPLY in MDP/0.1)
  give one credit; HEARTBEAT asks for no work. A REQUEST always has a body frame (an empty
  one for a request with no data). An answer is matched by client address alone.
Rule M3 - Partials. A PARTIAL is a part of a stream (:mod:`.streams`): it goes to the client
  of the request the worker holds for that address if the client's dialect has partials
  (MDP/0.2 and majortomo clients) or it asked for a stream (a dcp client); otherwise it is
  dropped and counted (``partial_dropped``): other clients get the FINAL only.
Rule M4 - Heartbeats. The broker sends HEARTBEAT to every MDP worker each
  ``heartbeat_interval`` (the first a tick, ``heartbeat_interval / 4``, after the first such
  worker registered); an MDP worker's own heartbeats keep it alive (peers Rule L1).
Rule M5 - Work timeouts. An MDP worker cannot answer a request with an error, so one that
  drops a request (majortomo's drops one it cannot parse) and keeps heartbeating would hold
  it for ever: a request with no work timeout of its own and none from the broker's
  ``work_timeout`` gets ``mdp_work_timeout`` (60 s, as ``busy_timeout``) while an MDP worker
  holds it, past which the worker is removed and the request redelivered (routing Rule R7).
  Each PARTIAL the worker sends for it starts that timeout again (a stream may last).
  The zguide's and majortomo's workers do not beat while they work, so a silent busy one was
  already removed after ``busy_timeout`` (peers Rule L3).

What this module does NOT do: credit or cancel towards MDP workers (MDP has neither, streams
Rule ST4), or carry metadata (MDP has none: a DCP client's stays in the broker and comes back
in the reply).
"""

from __future__ import annotations

from collections.abc import Sequence

from dcp._core.broker.dialects import MdpDialect, mdp_dialect
from dcp._core.broker.directory import Mmi
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.records import Session
from dcp._core.broker.redelivery import Redelivery
from dcp._core.broker.routing import Routing
from dcp._core.broker.streams import Streams, mdp_metadata
from dcp._errors import RemoteProtocolError, UnknownMessageType
from dcp.wire import mdp

__all__ = ["MdpPeers"]


class MdpPeers:
    """The Majordomo dialect handler (the module's rules).

    :param outputs: where messages, counts and refusals go
    :param sessions: the registered workers, and other peers' dialects
    :param routing: queues, credit, held requests, registrations
    :param streams: partial replies (Rules M3, ST3)
    :param mmi: requests to ``mmi.*`` names
    :param redelivery: a worker that leaves or is expelled
    :param heartbeat_interval: seconds between the broker's heartbeats (Rule M4)
    """

    def __init__(
        self,
        *,
        outputs: Outputs,
        sessions: Sessions,
        routing: Routing,
        streams: Streams,
        mmi: Mmi,
        redelivery: Redelivery,
        heartbeat_interval: float,
    ) -> None:
        self._out = outputs
        self._outbox = outputs.outbox
        self._counters = outputs.counters
        self._sessions = sessions
        self._routing = routing
        self._streams = streams
        self._mmi = mmi
        self._redelivery = redelivery
        self._interval = heartbeat_interval
        self._next_beat = 0.0

    def receive(
        self,
        peer: bytes,
        body: Sequence[bytes],
        worker: Session | None,
        now: float,
        principal: str | None,
    ) -> None:
        """One Majordomo message (``body``: after the routing id) from ``peer``
        (``worker``: its session, if it is a registered worker)."""
        try:
            event, form = mdp.parse(body)
        except RemoteProtocolError as exc:
            self._out.reject(peer, exc.reason, str(exc))
            if (
                worker is not None
                and isinstance(worker.dialect, MdpDialect)
                and isinstance(exc, UnknownMessageType)
            ):
                self._expel(worker, now)  # Rule M2: a command MDP does not know
            return
        dialect = mdp_dialect(form)
        if isinstance(event, mdp.ClientRequest):
            if worker is not None:
                self._out.reject(
                    peer, "dialect_mismatch", "a registered worker sent a client request"
                )
                return
            self._sessions.remember(peer, dialect)
            name = event.service
            if name[:4] == b"mmi.":
                self._mmi.answer(peer, dialect, name, (), event.body, now)
                return
            metadata = mdp_metadata(dialect)  # streams Rule ST3
            refused = self._routing.submit(
                peer, dialect, name, metadata, event.body, now, forward=False
            )
            if refused is not None:
                self._out.refuse(peer, dialect, name, (), *refused)  # Rule M1: told nothing
            return
        if worker is None:
            if isinstance(event, mdp.WorkerReady):
                self._routing.register(peer, None, event.service, dialect, now, principal)
            elif not isinstance(event, mdp.WorkerDisconnect):
                self._counters.reconnects_sent += 1
                self._outbox.append(dialect.expel(peer))
            return
        if not isinstance(worker.dialect, MdpDialect):
            self._out.reject(
                peer, "dialect_mismatch", "an MDP command from a %s worker", worker.dialect.name
            )
            return
        worker.dialect = dialect
        self._sessions.heard(worker, now)
        if isinstance(event, mdp.WorkerAnswer):
            self._on_answer(peer, worker, event, now)
        elif isinstance(event, mdp.WorkerHeartbeat):
            if worker.held:
                worker.beats_busy = True
        elif isinstance(event, mdp.WorkerDisconnect):
            self._redelivery.remove_worker(worker, now)
        else:  # a second READY
            self._out.reject(peer, "unexpected_ready", "READY from a registered MDP worker")
            self._expel(worker, now)

    def _on_answer(
        self, peer: bytes, worker: Session, event: mdp.WorkerAnswer, now: float
    ) -> None:
        routing = self._routing
        if not event.final:
            client = routing.unsealed(peer, event.client)
            if client is not None:
                held = worker.held_for(client)
                if held is not None:
                    routing.progress(held, now)  # Rule M5: it is working on it
                self._streams.mdp_partial(worker, client, event.body)  # streams Rules ST1, ST4
            return
        answered = routing.answered(peer, worker, event.client, None, now)
        if answered is None:
            return
        client, pending = answered
        self._counters.replies += 1
        if pending is not None:
            self._streams.answer(  # after what is held for the client (streams Rule ST3)
                client,
                pending.origin.reply(client, pending.service.name, pending.metadata, event.body),
            )
        else:
            origin = self._sessions.dialect_of(client)
            self._streams.answer(client, origin.reply(client, b"", (), event.body))
        routing.credit(worker, now, released=pending is not None)

    def _expel(self, worker: Session, now: float) -> None:
        self._outbox.append(worker.dialect.expel(worker.ident))
        self._redelivery.remove_worker(worker, now)

    def next_beat(self) -> float | None:
        """Rule M4: when the next heartbeats are due (``None``: no worker to beat)."""
        sessions = self._sessions
        if not sessions.beating:
            return None
        first = sessions.beating_since + self._interval / 4
        return first if first > self._next_beat else self._next_beat

    def beat(self, now: float) -> None:
        """Rule M4: heartbeat every worker the broker beats itself, if due at ``now``."""
        due = self.next_beat()
        if due is None or now < due:
            return
        outbox = self._outbox
        for session in self._sessions.beating.values():
            outbox.append(session.dialect.beat(session.ident))
        self._next_beat = now + self._interval
