"""Workers that go away, and what they held: redelivery (Rule R5), work timeouts (Rule R7)
and workers removed by a security reload (Security Rule S5). Sans-IO: the
:class:`Redelivery` part acts through routing's public methods (:mod:`.routing`; the rule
numbers are routing's), asking the streams first which held requests are not to be
redelivered (streams Rule ST6).

Rule R5 - Redelivery. A worker that leaves, or is removed (liveness, unreachable, Rule R7),
  gives back what it held: to the *front* of its service's queue (the DCP spec allows losing
  it; we do not), at most ``max_redeliveries`` times, after which the client gets a
  ``redelivery_limit`` error reply (its message says how often it was redelivered: one worker
  that keeps going away, or several, look the same to the broker). A request whose caller's
  deadline passed while it was held is not put back (queues Rule Q3).
Rule R7 - Work timeouts. A request may carry a work timeout (a metadata option, see
  :func:`~dcp.wire.messages.work_timeout_option`; else the broker's ``work_timeout``, if any;
  else, held by an MDP worker, the broker's ``mdp_work_timeout``: majordomo Rule M5).
  A worker that holds it longer than that is treated as lost, as in Rule R5: it is expelled
  and removed, and what it held is redelivered. The same peer may register again at once but
  gets no work for ``liveness x heartbeat_interval`` (quarantine, peers Rule L4), so a worker
  that hangs on every request cannot take the redelivered request straight back.

What this module does NOT do: decide that a worker is gone (its liveness is the sessions'
and the core's ``expire``, peers Rules L2-L3; a worker the driver cannot reach, the driver's
report), or keep the queues and held requests (:mod:`.routing` does).
"""

from __future__ import annotations

import logging

from dcp._core.broker.admission import Limits
from dcp._core.broker.directory import Directory, Name
from dcp._core.broker.guard import Guard
from dcp._core.broker.outputs import Outputs
from dcp._core.broker.peers import Sessions
from dcp._core.broker.records import Session
from dcp._core.broker.routing import Routing
from dcp._core.broker.streams import Streams
from dcp._util import Joined, PeerId

__all__ = ["Redelivery"]


class Redelivery:
    """Workers removed, and what they held (the module's rules).

    :param routing: the queues and held requests
    :param sessions: the registered workers (a removed one leaves them; Rule R7's
        quarantine is theirs, peers Rule L4)
    :param streams: asked which held requests a part was forwarded of (streams Rule ST6)
    :param directory: a removed worker's descriptions go with it (directory Rule D4)
    :param outputs: where messages, counts and log lines go
    :param limits: ``max_redeliveries``
    :param guard: the security rules (``None``: off), for
        :meth:`~dcp._core.broker.redelivery.Redelivery.revoke`
    :param quarantine: seconds a worker removed for a work timeout gets no work (Rule R7)
    """

    def __init__(
        self,
        *,
        routing: Routing,
        sessions: Sessions,
        streams: Streams,
        directory: Directory,
        outputs: Outputs,
        limits: Limits,
        guard: Guard | None,
        quarantine: float,
    ) -> None:
        self._routing = routing
        self._sessions = sessions
        self._streams = streams
        self._directory = directory
        self._out = outputs
        self._limits = limits
        self._guard = guard
        self._quarantine_for = quarantine

    def remove_worker(self, worker: Session, now: float, why: str = "left") -> None:
        """Rule R5: forget the worker; its held requests go back to the front of the queue
        (except those a part was forwarded of, streams Rule ST6). Logged at INFO: the worker,
        ``why`` (``left``, ``expired``, ...), its services and what became of the requests
        it held."""
        routing = self._routing
        streams = self._streams
        if streams.open and worker.held:
            kept = []
            for pending in worker.held:
                if streams.lost(pending):
                    routing.finish(pending)
                else:
                    kept.append(pending)
            worker.held = kept
        ident = worker.ident
        self._log_removal(worker, why)
        self._sessions.remove(worker)
        held, worker.held = worker.held, []
        self._directory.forget(ident, [s.name for s in worker.services])
        routing.withdraw(worker, holding=bool(held))
        limit = self._limits.max_redeliveries
        for pending in reversed(held):
            pending.redeliveries += 1
            if pending.redeliveries > limit:
                routing.finish(pending)
                self._out.counters.count("redelivery_limit")
                routing.error_reply(
                    pending,
                    "redelivery_limit",
                    f"redelivered {limit} times (the limit); "
                    "each time, the worker holding it went away",
                )
                continue
            routing.unhold(pending)
            expiry = pending.expiry
            if expiry is not None and expiry.when <= now:
                routing.queues.drop(pending)  # queues Rule Q3: its caller gave up
                continue
            routing.requeue(pending, now)  # queues Rule Q5: its wait starts anew
        for pending in held:
            service = pending.service
            routing.refill(service, now)
            routing.forget_if_unused(service)

    def _log_removal(self, worker: Session, why: str) -> None:
        held = worker.held
        limit = self._limits.max_redeliveries
        failed = sum(1 for p in held if p.redeliveries >= limit) if held else 0
        self._out.note(
            logging.INFO,
            "worker %s %s: served %s; %d held request(s) redelivered, %d failed "
            "(redelivery_limit)",
            PeerId(worker.ident),
            why,
            Joined([Name(s.name) for s in worker.services]),
            len(held) - failed,
            failed,
        )

    def revoke(self, now: float) -> int:
        """Security Rule S5 (:mod:`dcp._core.broker.guard`), after the allow-lists were
        replaced: remove every worker whose key may no longer serve one of its services (each
        such registration refused and told, counted as ``revoked``; held requests
        redelivered). Returns how many workers were removed."""
        guard = self._guard
        if guard is None:
            return 0
        removed = 0
        for worker in list(self._sessions.workers.values()):
            ident = worker.ident
            denied = [s.name for s in worker.services if not guard.may_serve(ident, s.name)]
            if not denied:
                continue
            for name in denied:
                detail = f"key {guard.owner(ident)} may no longer register {name[:64]!r}"
                self._routing.refuse_registration(ident, worker.dialect, name, "revoked", detail)
            self.remove_worker(worker, now, "revoked")
            removed += 1
        return removed

    def time_out_work(self, now: float) -> None:
        """Rule R7: expel and remove every worker holding a request past its work timeout;
        quarantines that are over let their workers use their credit."""
        routing = self._routing
        sessions = self._sessions
        quarantine = sessions.quarantine
        out = self._out
        while (pending := routing.overdue(now)) is not None:
            worker = pending.holder
            assert worker is not None
            out.note(
                logging.WARNING,
                "worker %s held a request for %r past its work timeout (%.3f s): removing it",
                PeerId(worker.ident),
                pending.service.name[:64],
                routing.held_timeout(pending),
            )
            out.counters.work_timeouts += 1
            quarantine[worker.ident] = now + self._quarantine_for
            out.outbox.append(worker.dialect.expel(worker.ident))
            self.remove_worker(worker, now, "timed out")
        if quarantine:
            workers = sessions.workers
            for ident, until in list(quarantine.items()):
                if until <= now:
                    del quarantine[ident]
                    released = workers.get(ident)
                    if released is not None and released.credit:
                        routing.use_credit(released, now)

    def next_deadline(self) -> float | None:
        """The earliest work-timeout deadline, quarantine end, or expiry of a queued request
        (``None``: none)."""
        when = self._routing.next_deadline()
        quarantine = self._sessions.quarantine
        if quarantine:
            top = min(quarantine.values())
            when = top if when is None or top < when else when
        return when
