"""The broker core: a pure state machine (sans-IO) serving every wire dialect on one socket.

It takes whole messages as the broker's ROUTER sees them (routing id first) together with the
current time, and leaves the messages to send and the driver's other work in two lists,
taken with :meth:`BrokerCore.drain` (the contract of :mod:`dcp._core`: ``outbox`` of
frames, ``events`` of :class:`~.outputs.LogLine` and
:class:`~.approval.ApprovalRequest`; time is :meth:`BrokerCore.expire` /
:meth:`BrokerCore.next_deadline`). It knows nothing of sockets, anyio or clocks;
:class:`dcp.Broker` is the thin driver that feeds it.

Layout: :class:`BrokerCore` holds its parts, each given its collaborators, none reading
another's state:

- one handler per dialect behind one interface (:class:`Handler`), chosen by the sniffed
  family (:mod:`dcp.wire.sniff`): DCP v1 (:mod:`.dcp1`: Rules R3, R4), Majordomo
  (:mod:`.majordomo`: Rules M1-M5), DBP (:mod:`.dbp`: Rules DB1-DB3), mc0 (:mod:`.mc0`: Rules
  C1-C4); each parses with its codec (:mod:`dcp.wire`);
- the protocol-blind routing (:mod:`.routing`: Rules R1, R2; it admits requests,
  :mod:`.admission`, reads their options and keeps its queues' deadlines, :mod:`.queues`:
  Rules Q1-Q4), over per-peer sessions (:mod:`.peers`: liveness Rules L1-L4) and the records
  they share (:mod:`.records`);
- redelivery and work timeouts (:mod:`.redelivery`: Rules R5, R7), streams (:mod:`.streams`:
  Rules ST1-ST7), pub/sub (:mod:`.pubsub_peers`, :mod:`.pubsub`), the directory and ``mmi.*``
  (:mod:`.directory`), approvals (:mod:`.approval`), the guard (:mod:`.guard`), replies that
  cannot be handled yet (:mod:`.unreachable`), and the outputs they all write to
  (:mod:`.outputs`); each peer is written to in its dialect (:mod:`.dialects`).

Rule R6 - Bounds and bad input. A message in no known dialect (``unknown_protocol``), a
  malformed one, or one that breaks a limit, is counted by reason, logged once per peer, and
  dropped; when its sender can be told (a request, even one cut short at a size or frame
  limit, if its metadata survived), it gets a dcp error reply instead. A registered worker
  that sends another dialect's message is refused (``dialect_mismatch``). Nothing raises out
  of :meth:`BrokerCore.receive`. (Messages the driver cut at a limit, or could not send:
  below.)
Rule S - Security (only with a :class:`~dcp._core.broker.guard.Guard`, i.e. CURVE on; its rules
  S1-S4 are in :mod:`dcp._core.broker.guard`). Each message comes with its sender's key
  (*principal*); one the guard does not admit is counted and dropped. A registration the guard does
  not permit is counted (``registration_refused``), logged, and refused in the worker's dialect
  (DCP: a reply with no client address, the service as its one metadata part, and the data of a
  ``registration_refused`` error reply; MDP: DISCONNECT). Client addresses in requests given to
  workers are sealed; a worker's answer or forward must carry a sealed one (else
  ``bad_client_address``).

What the broker's driver reports to the core besides messages:

1. (Rule R6) A message cut at a limit is counted by reason and logged; if it is a DCP
   request whose metadata survived the cut, its caller gets a dcp error reply instead (an
   MDP one is dropped: its body is what was cut). A worker forwarding a request it holds
   is answered on behalf of the request's client, and gets its credit back.
2. A worker the driver cannot reach is treated as gone: what it holds is redelivered
   (routing Rule R5). A reply to a gone DCP client is kept to be sent again (Rule U1 of
   :mod:`.unreachable`); other replies are dropped and counted (``dropped_replies``), the
   rest (echoes, pongs, reconnects) counted as ``undeliverable``. Messages held for a full
   socket (streams Rule ST3) and pub/sub ones are the streams' and pub/sub's to handle.

Time: :meth:`BrokerCore.expire` does what is due (work timeouts, expiries of queued
requests, replies kept for unreachable clients, sent again every ``heartbeat_interval / 4``,
liveness, heartbeats to the workers the broker beats, pub/sub expiries and mc0 TTLs, and
messages held for full sockets, retried every 2 ms); :meth:`BrokerCore.next_deadline` says
when that is.

What the core does NOT do: socket options, message-size limits (zmq's MAXMSGSIZE in the
driver), timers (the driver calls :meth:`BrokerCore.expire`), logging (the driver writes the
log lines it is given), persistence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dcp._core.broker.admission import Limits
from dcp._core.broker.approval import Approval, ApprovalRequest, Approvals
from dcp._core.broker.budget import DEFAULT_MAX_MEMORY, Memory
from dcp._core.broker.dbp import DbpPeers
from dcp._core.broker.dcp1 import DcpPeers
from dcp._core.broker.directory import Directory, Mmi, broker_entry, text
from dcp._core.broker.guard import Guard
from dcp._core.broker.majordomo import MdpPeers
from dcp._core.broker.mc0 import Mc0Peers
from dcp._core.broker.outputs import LogLine, Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.pubsub import PubSub
from dcp._core.broker.pubsub_peers import PubSubOptions, PubSubPeers
from dcp._core.broker.records import Session
from dcp._core.broker.redelivery import Redelivery
from dcp._core.broker.routing import Routing
from dcp._core.broker.streams import Streams
from dcp._core.broker.unreachable import EarlyReplies, Unreachable
from dcp._errors import MessageTooLarge, TooManyFrames
from dcp._stats import (
    BrokerCounters,
    BrokerSnapshot,
    BrokerStatistics,
    ClientFigures,
    QueueStatistics,
    ServiceFigures,
    WorkerFigures,
)
from dcp.wire import mdp
from dcp.wire.dcp1 import PROTOCOL, TYPE_FRAMES
from dcp.wire.messages import MessageType
from dcp.wire.sniff import Family, sniff

__all__ = ["BrokerCore", "Handler"]

_REPLY_TYPE_FRAMES = (TYPE_FRAMES[1][MessageType.REPLY], TYPE_FRAMES[4][MessageType.REPLY])


class Handler(Protocol):
    """What the core asks of a dialect handler (:mod:`dcp._core.broker.dcp1`,
    :mod:`dcp._core.broker.majordomo`, :mod:`dcp._core.broker.dbp`,
    :mod:`dcp._core.broker.mc0`)."""

    def receive(
        self,
        peer: bytes,
        body: Sequence[bytes],
        worker: Session | None,
        now: float,
        principal: str | None,
    ) -> None:
        """Handle one message in the handler's dialect.

        :param peer: the sender's routing id
        :param body: the message after the routing id
        :param worker: the sender's session, if it is a registered worker
        :param principal: the sender's key (Rule S; ``None``: no security)
        """


class BrokerCore:
    """The broker's state machine (see the module docstring for its rules and layout).

    :param heartbeat_interval: seconds between worker heartbeats (agreed with the workers)
    :param liveness: heartbeats a DCP worker may miss before it is considered gone
    :param allow_foreign_address: let any peer (not only registered workers) send requests
        carrying a client address other than its own
    :param max_queue: requests queued per service; more get a ``queue_full`` error reply
    :param max_services: distinct services known at once; a request for one more gets a
        ``too_many_services`` error reply (registrations are not refused for this)
    :param max_services_per_worker: services one worker may register; more are refused
    :param max_service_name: bytes in a service name; longer ones are refused
    :param max_redeliveries: times a request is put back after its worker died before the
        client gets a ``redelivery_limit`` error reply instead
    :param max_width_peers: non-worker peers whose dialect (a 4-byte DCP type width, or a
        Majordomo form) is remembered (LRU)
    :param max_held: requests tracked per worker for redelivery; past this (only a worker
        that changes metadata, so its answers match nothing, gets there) the oldest is
        no longer tracked (counted as ``held_overflow``)
    :param max_client_queued: requests of one client waiting in queues; more get a
        ``client_limit`` error reply
    :param max_client_inflight: requests of one client accepted and not yet answered
        (queued or held by a worker); more get a ``client_limit`` error reply
    :param max_client_services: services without a worker one client's requests may have
        made (``None``: a tenth of ``max_services``); a request for one more gets a
        ``too_many_services`` error reply (admission Rule AD5)
    :param max_queue_wait: seconds a request that carries no expiry of its caller's may wait
        in a queue; then it is dropped and its client gets a ``queue_timeout`` error reply
        (queues Rule Q5; ``None``: for ever)
    :param work_timeout: seconds a worker may hold a request that does not carry its own
        work timeout (``None``: no limit); past it the worker is treated as lost (Rule R7)
    :param mdp_work_timeout: seconds a Majordomo worker (MDP has no error reply) may hold a
        request that has no work timeout from the two above (``None``: no limit; majordomo
        Rule M5); the same as ``busy_timeout`` by default
    :param busy_timeout: seconds a busy worker that does not beat while busy may be silent
        (peers Rule L3); it is probed meanwhile, so a dead connection is noticed sooner
    :param reply_grace: seconds a reply whose client is not connected is kept and sent
        again, and a reply from a peer not registered is kept for it to register
        (:mod:`dcp._core.broker.unreachable`; ``None``: ``liveness x heartbeat_interval``)
    :param mdp_timeout: seconds an idle Majordomo worker may be silent (its libraries beat
        every 2.5 s by default)
    :param guard: the security rules for CURVE mode (``None``: off; see Rule S)
    :param pubsub: pub/sub settings (:mod:`dcp._core.broker.pubsub_peers`,
        :mod:`dcp._core.broker.mc0`)
    :param approve: registrations wait for an approver (:mod:`dcp._core.broker.approval`):
        the driver answers the questions in the events with :meth:`decide`
    :param dbp_clock: epoch seconds, for the time frame DBP puts in every command (the
        driver's ``time.time``; ``None``: the core's own ``now``, for a driver that has no
        wall clock to give)
    :param max_memory: bytes the broker may hold on its peers' behalf, split into accounts
        (:mod:`dcp._core.broker.budget`, Rules MB1-MB4; ``None``: no byte budget)
    """

    def __init__(
        self,
        *,
        heartbeat_interval: float = 1.0,
        liveness: int = 3,
        allow_foreign_address: bool = False,
        max_queue: int = 100_000,
        max_services: int = 10_000,
        max_service_name: int = 1024,
        max_redeliveries: int = 5,
        max_width_peers: int = 65_536,
        max_held: int = 10_000,
        max_services_per_worker: int = 256,
        max_client_queued: int = 10_000,
        max_client_inflight: int = 20_000,
        max_client_services: int | None = None,
        max_queue_wait: float | None = 300.0,
        work_timeout: float | None = None,
        mdp_work_timeout: float | None = 60.0,
        busy_timeout: float = 60.0,
        mdp_timeout: float = 10.0,
        reply_grace: float | None = None,
        guard: Guard | None = None,
        pubsub: PubSubOptions | None = None,
        approve: bool = False,
        dbp_clock: Callable[[], float] | None = None,
        max_memory: int | None = DEFAULT_MAX_MEMORY,
    ) -> None:
        if heartbeat_interval <= 0 or liveness < 1:
            raise ValueError("heartbeat_interval must be > 0 and liveness >= 1")
        for timeout_name, value in (
            ("work_timeout", work_timeout),
            ("mdp_work_timeout", mdp_work_timeout),
        ):
            if value is not None and not 0 < value < float("inf"):
                raise ValueError(f"{timeout_name} must be None or a positive finite number")
        if max_queue_wait is not None and not 0 < max_queue_wait < float("inf"):
            raise ValueError("max_queue_wait must be None or a positive finite number")
        if max_client_services is not None and max_client_services < 1:
            raise ValueError("max_client_services must be None or at least 1")
        if not 0 < busy_timeout < float("inf") or not 0 < mdp_timeout < float("inf"):
            raise ValueError("busy_timeout and mdp_timeout must be positive finite numbers")
        timeout = heartbeat_interval * liveness
        limits = Limits(
            max_queue=max_queue,
            max_services=max_services,
            max_service_name=max_service_name,
            max_redeliveries=max_redeliveries,
            max_held=max_held,
            max_services_per_worker=max_services_per_worker,
            max_client_queued=max_client_queued,
            max_client_inflight=max_client_inflight,
            max_client_services=max_client_services,
            max_queue_wait=max_queue_wait,
        )
        self.heartbeat_interval = heartbeat_interval
        self.liveness = liveness
        self.busy_timeout = busy_timeout
        #: The broker's counters.
        self.counters = BrokerCounters()
        #: The byte budget: one account per kind of thing kept for peers (Rules MB1-MB4).
        self.memory = Memory(max_memory)
        self._out = out = Outputs(self.counters)
        #: The registered workers and other peers' dialects.
        self.sessions = sessions = Sessions(
            timeout=timeout, mdp_timeout=mdp_timeout, max_remembered=max_width_peers
        )
        #: The security rules (``None``: off).
        self.guard = guard
        #: Registrations waiting for the approver (``None``: no approver).
        self.approvals = Approvals(out.events.append) if approve else None
        #: What workers said about their services.
        self.directory = directory = Directory(
            account=self.memory.account("directory"), outputs=out
        )
        #: dcp streams: partial replies, credit and cancels.
        self.streams = streams = Streams(out, self.memory.account("streams"))
        #: Queues, credit, held requests and registrations.
        self.routing = routing = Routing(
            limits=limits,
            sessions=sessions,
            outputs=out,
            streams=streams,
            directory=directory,
            guard=guard,
            approvals=self.approvals,
            work_timeout=work_timeout,
            mdp_work_timeout=mdp_work_timeout,
            memory=self.memory.account("queued"),
        )
        #: Workers removed, and what they held.
        self.redelivery = redelivery = Redelivery(
            routing=routing,
            sessions=sessions,
            streams=streams,
            directory=directory,
            outputs=out,
            limits=limits,
            guard=guard,
            quarantine=timeout,
        )
        pubsub_peers = PubSubPeers(out, pubsub, self.memory)
        #: The subscriptions (pub/sub for DCP and mc0 peers).
        self.pubsub: PubSub = pubsub_peers.pubsub
        self._pubsub_peers = pubsub_peers
        self._mmi = mmi = Mmi(
            out,
            directory,
            sessions,
            routing.services,
            self.overview,
            account=self.memory.account("directory"),
        )
        grace = liveness * heartbeat_interval if reply_grace is None else reply_grace
        #: Replies whose client is not connected yet, sent again for a while (Rules U1-U3).
        replies = self.memory.account("replies")
        self.unreachable = Unreachable(grace, memory=replies)
        #: Replies from peers that may be about to register (Rules U4-U6).
        self.early = EarlyReplies(grace, memory=replies)
        self._dcp = DcpPeers(
            outputs=out,
            sessions=sessions,
            routing=routing,
            streams=streams,
            pubsub=pubsub_peers,
            mmi=mmi,
            redelivery=redelivery,
            early=self.early,
            allow_foreign_address=allow_foreign_address,
        )
        self._mdp = MdpPeers(
            outputs=out,
            sessions=sessions,
            routing=routing,
            streams=streams,
            mmi=mmi,
            redelivery=redelivery,
            heartbeat_interval=heartbeat_interval,
        )
        self._mc0 = Mc0Peers(out, pubsub_peers)
        dbp = DbpPeers(
            outputs=out,
            sessions=sessions,
            routing=routing,
            directory=directory,
            mmi=mmi,
            redelivery=redelivery,
            clock=(lambda: out.now) if dbp_clock is None else dbp_clock,
        )
        self._handlers: dict[Family, Handler] = {
            Family.DCP: self._dcp,
            Family.MDP: self._mdp,
            Family.MC0: self._mc0,
            Family.DBP: dbp,
        }
        self._workers = sessions.workers
        # Rule U2: kept replies are sent again every tick (the driver's timer period).
        self._resend_every = heartbeat_interval / 4
        self._next_resend = 0.0
        #: When the driver started serving (its clock; ``None``: not yet), for the uptime.
        self.started: float | None = None

    # ---------------------------------------------------------------- output

    @property
    def outbox(self) -> list[list[bytes]]:
        """The messages to send, ROUTER-side (routing id first), in order (taken with
        :meth:`drain`; never replaced)."""
        return self._out.outbox

    @property
    def events(self) -> list[LogLine | ApprovalRequest]:
        """What else the driver must do, in order: log lines and approval questions
        (taken with :meth:`drain`; never replaced)."""
        return self._out.events

    def drain(self) -> tuple[list[list[bytes]], list[LogLine | ApprovalRequest]]:
        """The messages to send and the events, in order, taken (both lists left empty)."""
        return self._out.drain()

    # ------------------------------------------------------------------ input

    def receive(self, frames: list[bytes], now: float, principal: str | None = None) -> None:
        """Handle one message as received by the ROUTER (routing id first).

        :param principal: the sender's key, which the guard checks (Rule S)
        """
        self._out.now = now
        peer = frames[0]
        if self.guard is not None and not self._admitted(peer, principal):
            return
        body = frames[1:]
        worker = self._workers.get(peer)
        # Most traffic is DCP v1: test for it before sniffing (the hot path).
        if len(body) > 2 and body[1] == PROTOCOL and not body[0]:
            self._dcp.receive(peer, body, worker, now, principal)
            return
        family = sniff(body)
        handler = None if family is None else self._handlers.get(family)
        if handler is None:
            self._out.reject(peer, "unknown_protocol", "no DCP, MDP or mc0 header")
            return
        handler.receive(peer, body, worker, now, principal)

    def _admitted(self, peer: bytes, principal: str | None) -> bool:
        """Rule S: whether the guard admits a message from ``peer`` under ``principal``
        (if not, it is counted and logged)."""
        assert self.guard is not None
        refused = self.guard.admit(peer, principal)
        if refused is not None:
            self._out.reject(peer, refused, "key %s", principal)
            return False
        return True

    def decide(self, token: int, answer: Approval, now: float) -> None:
        """The approver answered registration question ``token`` (approval Rule AP2)."""
        self._out.now = now
        self.routing.decide(token, answer, now)

    def revoke(self, now: float) -> int:
        """Security Rule S5, after the guard's allow-lists were replaced: remove every
        worker whose key may no longer serve one of its services (:mod:`.redelivery`).
        Returns how many workers were removed."""
        self._out.now = now
        return self.redelivery.revoke(now)

    # ---------------------------------------------------- what the driver reports

    def reject_too_many_frames(
        self, frames: list[bytes], dropped: int, now: float, principal: str | None = None
    ) -> None:
        """The driver cut a message at its frame limit, keeping ``frames`` (routing id
        first): count and log it, and answer it with an error reply if it is a request
        whose metadata was kept (item 1 above)."""
        kept = len(frames) - 1
        exc = TooManyFrames(f"{kept + dropped} frames; the limit is {kept}")
        self._cut(frames, exc.reason, str(exc), now, principal)

    def reject_too_large(
        self,
        frames: list[bytes],
        nbytes: int,
        limit: int,
        now: float,
        principal: str | None = None,
    ) -> None:
        """The driver found a message over its size limit and kept only ``frames`` of it:
        as :meth:`reject_too_many_frames`."""
        exc = MessageTooLarge(f"{nbytes} bytes; the limit is {limit}")
        self._cut(frames, exc.reason, str(exc), now, principal)

    def _cut(
        self, frames: list[bytes], reason: str, detail: str, now: float, principal: str | None
    ) -> None:
        self._out.now = now
        peer = frames[0]
        if self.guard is not None and not self._admitted(peer, principal):
            return
        self._dcp.cut(peer, frames[1:], self._workers.get(peer), reason, detail, now)

    def undeliverable(self, frames: list[bytes], why: str) -> None:
        """The driver could not send ``frames`` (``why``: its peer is ``gone``, or its
        queue is ``full``; item 2 above).

        A worker we cannot reach is treated as gone: what it holds is redelivered. Any other
        message is dropped and counted: replies in ``dropped_replies``, the rest (echoes,
        pongs, reconnects) in ``undeliverable``.
        """
        if self.streams.undelivered(frames, why):
            return  # held for a full socket (streams Rule ST3)
        if self._pubsub_peers.undeliverable(frames) or self._mc0.undeliverable(frames):
            return
        out = self._out
        worker = self._workers.get(frames[0])
        if worker is not None:
            self.counters.count(f"worker_unreachable_{why}")
            self.redelivery.remove_worker(worker, out.now, f"unreachable ({why})")
        elif _is_reply(frames):
            # Rule U1 for DCP replies only: a DCP client keeps its address when it
            # reconnects; a Majordomo client without an id of its own gets a new one.
            if (
                why == "gone"
                and _is_dcp_reply(frames)
                and self.unreachable.refused(frames, out.now)
            ):
                if self._next_resend <= out.now:
                    self._next_resend = out.now + self._resend_every
            else:
                self.counters.dropped_replies += 1
        else:
            self.counters.undeliverable += 1

    # ------------------------------------------------------------------ time

    def expire(self, now: float) -> None:
        """Do what is due at ``now``: work timeouts (Rule R7), expiries of queued requests
        (queues Rule Q3), replies kept for unreachable clients (Rule U2) and from peers not
        registered (Rule U4), liveness (peers Rules L2-L3: expire, or probe a busy worker),
        the broker's heartbeats to MDP and DBP workers (Rule M4), pub/sub expiries (pubsub
        Rule P5) and mc0 TTLs (Rule MC3), listing answers held and descriptions waiting too
        long (directory Rules D3, D7), and messages held for full sockets (streams Rule
        T3)."""
        out = self._out
        out.now = now
        redelivery = self.redelivery
        redelivery.time_out_work(now)
        self.routing.queues.expire(now)
        unreachable = self.unreachable
        if unreachable.kept and now >= self._next_resend:  # Rule U2
            again, expired = unreachable.due(now)
            out.outbox += again
            self.counters.dropped_replies += expired
            self._next_resend = now + self._resend_every
        early = self.early
        if len(early):  # Rule U4
            for peer in early.expire(now):
                out.reject(peer, "reply_from_non_worker", "only registered workers may reply")
        sessions = self.sessions
        for session in sessions.due(now):
            if session.ident not in sessions.workers:
                continue
            held = session.held
            if held and not session.beats_busy:
                limit = self.busy_timeout
                for pending in held:
                    if pending.work_timeout is not None and pending.work_timeout > limit:
                        limit = pending.work_timeout
                if now - session.heard < limit:
                    # Rule L3: a send to a dead connection fails, which removes it.
                    out.outbox.append(session.dialect.beat(session.ident))
                    sessions.probed(session, now)
                    continue
            self.counters.expired += 1
            redelivery.remove_worker(session, now, "expired")
        self._mdp.beat(now)
        self._pubsub_peers.expire(now)
        self._mc0.expire(now)
        self._mmi.expire(now)
        self.streams.retry(now)

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do, unless messages arrive first
        (``None``: nothing until more input)."""
        # The driver asks after every batch: one comparison per part, no list built.
        when = self.sessions.next_expiry()
        due = self.redelivery.next_deadline()
        if due is not None and (when is None or due < when):
            when = due
        due = self._mdp.next_beat()
        if due is not None and (when is None or due < when):
            when = due
        due = self.pubsub.next_expiry()
        if due is not None and (when is None or due < when):
            when = due
        due = self._mc0.next_deadline()
        if due is not None and (when is None or due < when):
            when = due
        due = self.early.next_due()
        if due is not None and (when is None or due < when):
            when = due
        due = self.streams.next_retry()
        if due is not None and (when is None or due < when):
            when = due
        due = self._mmi.next_deadline()
        if due is not None and (when is None or due < when):
            when = due
        if self.unreachable.kept and (when is None or self._next_resend < when):
            when = self._next_resend
        return when

    # --------------------------------------------------------- statistics

    def overview(self) -> dict[str, Any]:
        """Broker-wide figures for ``mmi.broker`` (:func:`~.directory.broker_entry`);
        the uptime counts from :attr:`started`, which the driver sets when it has bound."""
        services = self.routing.services
        errors = sum(s.errors for s in services.values())
        listed = sum(s.requests for s in services.values())
        busy = sum(1 for w in self.sessions.workers.values() if w.held)
        now = self._out.now
        started = now if self.started is None else self.started
        uptime = max(0.0, now - started)
        return broker_entry(self.statistics(), uptime, errors, busy, listed)

    def statistics(self) -> BrokerStatistics:
        """A snapshot of the counters and per-service gauges."""
        c = self.counters
        return BrokerStatistics(
            requests=c.requests,
            replies=c.replies,
            forwards=c.forwards,
            dispatched=c.dispatched,
            redeliveries=c.redeliveries,
            dropped_replies=c.dropped_replies,
            undeliverable=c.undeliverable,
            reconnects_sent=c.reconnects_sent,
            unmatched=c.unmatched,
            expired_workers=c.expired,
            work_timeouts=c.work_timeouts,
            rejections=dict(c.rejections),
            workers=len(self.sessions.workers),
            clients=len(self.routing.loads),
            services={
                name: QueueStatistics(s.workers, len(s.idle), s.queued())
                for name, s in self.routing.services.items()
            },
            partials=c.partials,
            expired_in_queue=c.expired_in_queue,
            replaced=c.replaced,
            answered_elsewhere=c.answered_elsewhere,
            streams=self.streams.statistics(),
            max_memory=self.memory.max_memory,
            memory=tuple(self.memory.figures()),
        )

    def snapshot(self, now: float, *, peers: bool = False) -> BrokerSnapshot:
        """Everything the HTTP endpoint shows, read where the core runs (nothing may change
        it meanwhile). Costs one pass over the services, workers and active clients; nothing
        on the per-message path.

        :param peers: also list every worker and client (``/status``; ``/metrics`` only
            counts)
        """
        services = []
        directory = self.directory
        for name, s in self.routing.services.items():
            idle = len(s.idle)
            queue = s.queue
            info = directory.info(name) or {}
            services.append(
                ServiceFigures(
                    name=text(name),
                    workers=s.workers,
                    idle=idle,
                    busy=s.workers - idle,
                    queued=s.queued(),
                    oldest_queued_age=max(0.0, now - queue[0].since) if queue else 0.0,
                    requests=s.requests,
                    replies=s.answered,
                    errors=s.errors,
                    redeliveries=s.redeliveries,
                    processing_time=s.busy_time,
                    durations=tuple(s.durations),
                    version=info.get("version", ""),
                    description=info.get("description", ""),
                )
            )
        sessions = self.sessions
        counts: dict[tuple[str, str], int] = {}
        workers = []
        for ident, w in sessions.workers.items():
            key = ("worker", w.dialect.name)
            counts[key] = counts.get(key, 0) + 1
            if peers:
                workers.append(
                    WorkerFigures(
                        id=ident.hex(),
                        dialect=w.dialect.name,
                        services=tuple(text(s.name) for s in w.services),
                        held=len(w.held),
                        credit=w.credit,
                        silent=max(0.0, now - w.heard),
                    )
                )
        clients = []
        for ident, load in self.routing.loads.items():
            dialect = sessions.dialect_of(ident).name
            key = ("client", dialect)
            counts[key] = counts.get(key, 0) + 1
            if peers:
                clients.append(ClientFigures(ident.hex(), dialect, load.inflight, load.queued))
        return BrokerSnapshot(
            statistics=self.statistics(),
            services=tuple(services),
            workers=tuple(workers),
            clients=tuple(clients),
            peers=counts,
        )


def _is_dcp_reply(frames: list[bytes]) -> bool:
    return len(frames) > 3 and frames[3] in _REPLY_TYPE_FRAMES and frames[2][:4] == b"DGBX"


def _is_reply(frames: list[bytes]) -> bool:
    """Whether a message to a client is a reply (DCP REPLY, or an MDP client answer)."""
    if _is_dcp_reply(frames):
        return True
    return any(f in mdp.CLIENT_HEADERS for f in frames[1:3])
