"""Majordomo peers (MDP/0.1, MDP/0.2, majortomo) on the routing core. Sans-IO.

Rule M1 - Clients. An MDP request is a request with no metadata; the client is answered in
  the form it used (:mod:`dcp.wire.mdp`). A refusal (queue full, client limit, ...) is a
  FINAL whose body is a dcp error reply's three parts (MDP has no error command).
Rule M2 - Workers. READY registers the worker for one service (a second READY, or a command
  MDP does not know, gets DISCONNECT and the worker is removed). Any command but READY from a
  peer that is not a registered worker gets DISCONNECT (RFC 7), except DISCONNECT itself.
  Registered MDP workers hold one request at a time: READY and each FINAL (REPLY in MDP/0.1)
  give one credit; HEARTBEAT asks for no work. An answer is matched by client address alone.
Rule M3 - Partials. A PARTIAL is a part of a stream (:mod:`.streams`): it goes to the client
  of the request the worker holds for that address if the client's dialect has partials
  (MDP/0.2 and majortomo clients) or it asked for a stream (a dcp client); otherwise it is
  dropped and counted (``partial_dropped``): other clients get the FINAL only.
Rule M4 - Heartbeats. The broker sends HEARTBEAT to every MDP worker each
  ``heartbeat_interval``; an MDP worker's own heartbeats keep it alive (peers Rule L1).
"""

from __future__ import annotations

from collections.abc import Sequence

from dcp._core.broker.dialects import MdpDialect, mdp_dialect
from dcp._core.broker.peers import Session
from dcp._core.broker.streams import Streams
from dcp._errors import RemoteProtocolError, UnknownMessageType
from dcp.wire import mdp

__all__ = ["Majordomo"]


class Majordomo(Streams):
    """Routing plus the Majordomo dialects (the module's rules)."""

    def _on_mdp(
        self,
        peer: bytes,
        body: Sequence[bytes],
        worker: Session | None,
        now: float,
        principal: str | None,
    ) -> None:
        try:
            event, form = mdp.parse(body)
        except RemoteProtocolError as exc:
            self.reject(peer, exc.reason, str(exc))
            if (
                worker is not None
                and isinstance(worker.dialect, MdpDialect)
                and isinstance(exc, UnknownMessageType)
            ):
                self._expel(worker)  # Rule M2: a command MDP does not know
            return
        dialect = mdp_dialect(form)
        if isinstance(event, mdp.ClientRequest):
            if worker is not None:
                self.reject(peer, "dialect_mismatch", "a registered worker sent a client request")
                return
            self.sessions.remember(peer, dialect)
            name = event.service
            if name[:4] == b"mmi.":
                self.answer_directly(peer, dialect, name, (), event.body)
                return
            metadata = self.mdp_metadata(dialect)  # streams Rule T3
            refused = self.submit(peer, dialect, name, metadata, event.body, forward=False)
            if refused is not None:
                self.refuse(peer, dialect, name, (), *refused)
            return
        if worker is None:
            if isinstance(event, mdp.WorkerReady):
                self.register(peer, None, event.service, dialect, now, principal)
            elif not isinstance(event, mdp.WorkerDisconnect):
                self.counters.reconnects_sent += 1
                self.outbox.append(dialect.expel(peer))
            return
        if not isinstance(worker.dialect, MdpDialect):
            self.reject(
                peer, "dialect_mismatch", "an MDP command from a %s worker", worker.dialect.name
            )
            return
        worker.dialect = dialect
        self.sessions.heard(worker, now)
        if isinstance(event, mdp.WorkerAnswer):
            self._on_answer(peer, worker, event)
        elif isinstance(event, mdp.WorkerHeartbeat):
            if worker.held:
                worker.beats_busy = True
        elif isinstance(event, mdp.WorkerDisconnect):
            self.remove_worker(worker)
        else:  # a second READY
            self.reject(peer, "unexpected_ready", "READY from a registered MDP worker")
            self._expel(worker)

    def _on_answer(self, peer: bytes, worker: Session, event: mdp.WorkerAnswer) -> None:
        if not event.final:
            client = event.client
            if self.guard is not None:
                unsealed = self.unseal(peer, client)
                if unsealed is None:
                    return
                client = unsealed
            self.mdp_partial(worker, client, event.body)  # streams Rules T1, T4
            return
        answered = self.answered(peer, worker, event.client, None)
        if answered is None:
            return
        client, pending = answered
        self.counters.replies += 1
        if pending is not None:
            self.answer(  # after what is held for the client (streams Rule T3)
                client,
                pending.origin.reply(client, pending.service.name, pending.metadata, event.body),
            )
        else:
            origin = self.sessions.dialect_of(client)
            self.answer(client, origin.reply(client, b"", (), event.body))
        self.credit(worker, released=pending is not None)

    def _expel(self, worker: Session) -> None:
        self.outbox.append(worker.dialect.expel(worker.ident))
        self.remove_worker(worker)

    def _beat(self, now: float) -> None:
        """Rule M4: heartbeat every MDP worker."""
        outbox = self.outbox
        for session in self.sessions.beating.values():
            outbox.append(session.dialect.beat(session.ident))
