"""Workers that go away, and what they held: redelivery (Rule 5), work timeouts (Rule 7)
and workers removed by a security reload (Security Rule S5). Sans-IO; the functions are
methods of :class:`~.routing.Routing` (the rule numbers are routing's).

Rule 5 - Redelivery. A worker that leaves, or is removed (liveness, unreachable, Rule 7),
  gives back what it held: to the *front* of its service's queue (the DCP spec allows losing
  it; we do not), at most ``max_redeliveries`` times, after which the client gets a
  ``redelivery_limit`` error reply (its message says how often it was redelivered: one worker
  that keeps going away, or several, look the same to the broker). A request whose caller's
  deadline passed while it was held is not put back (queues Rule Q3).
Rule 7 - Work timeouts. A request may carry a work timeout (a metadata option, see
  :func:`~dcp.wire.messages.work_timeout_option`; else the broker's ``work_timeout``, if any).
  A worker that holds it longer than that is treated as lost, as in Rule 5: it is expelled
  and removed, and what it held is redelivered. The same peer may register again at once but
  gets no work for ``liveness x heartbeat_interval`` (quarantine, peers Rule L4), so a worker
  that hangs on every request cannot take the redelivered request straight back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dcp._core.broker import directory
from dcp._core.broker.peers import Session
from dcp._core.broker.queues import Pending
from dcp._util import Joined, PeerId

if TYPE_CHECKING:
    from dcp._core.broker.routing import Routing

__all__ = ["deadline_live", "next_work_deadline", "remove_worker", "revoke", "time_out_work"]


def deadline_live(pending: Pending, token: int) -> bool:
    """Whether a work-timeout deadline still stands: the request is held, by the same hold."""
    return pending.holder is not None and token == pending.token


def revoke(routing: Routing, now: float) -> int:
    """Security Rule S5 (:mod:`dcp._core.broker.guard`), after the allow-lists were replaced:
    remove every worker whose key may no longer serve one of its services (each such
    registration refused and told, counted as ``revoked``; held requests redelivered).
    Returns how many workers were removed."""
    guard = routing.guard
    if guard is None:
        return 0
    routing._now = now
    removed = 0
    for worker in list(routing.sessions.workers.values()):
        ident = worker.ident
        denied = [s.name for s in worker.services if not guard.may_serve(ident, s.name)]
        if not denied:
            continue
        for name in denied:
            detail = f"key {guard.owner(ident)} may no longer register {name[:64]!r}"
            routing._refuse_registration(ident, worker.dialect, name, "revoked", detail)
        routing.remove_worker(worker, "revoked")
        removed += 1
    return removed


def remove_worker(routing: Routing, worker: Session, why: str = "left") -> None:
    """Rule 5: forget the worker; its held requests go back to the front of the queue.
    Logged at INFO: the worker, ``why`` (``left``, ``expired``, ...), its services and
    what became of the requests it held."""
    ident = worker.ident
    _log_removal(routing, worker, why)
    routing.sessions.remove(worker)
    held, worker.held = worker.held, []
    routing.directory.forget(ident, [s.name for s in worker.services])
    for service in worker.services:
        service.workers -= 1
        service.idle.pop(ident, None)
        if not service.workers and not service.queue and not held:
            # Nobody provides it and nothing waits for it: forget it (bounds memory).
            del routing._services[service.name]
    worker.services = []
    limit = routing.limits.max_redeliveries
    now = routing._now
    for pending in reversed(held):
        pending.redeliveries += 1
        if pending.redeliveries > limit:
            routing._finish(pending)
            routing.counters.count("redelivery_limit")
            routing.error_reply(
                pending,
                "redelivery_limit",
                f"redelivered {limit} times (the limit); "
                "each time, the worker holding it went away",
            )
            continue
        routing._unhold(pending)
        expiry = pending.expiry
        if expiry is not None and expiry.when <= now:
            routing._queues.drop(pending)  # queues Rule Q3: its caller gave up
            continue
        routing.counters.redeliveries += 1
        pending.service.redeliveries += 1
        pending.since = now
        pending.service.queue.appendleft(pending)
        pending.load.queued += 1
        if expiry is not None:
            routing._queues.queued(pending)
    for pending in held:
        service = pending.service
        while service.idle and service.queue:
            queued = routing._queues.take(service, now)
            if queued is not None:
                routing._dispatch(next(iter(service.idle.values())), queued)


def _log_removal(routing: Routing, worker: Session, why: str) -> None:
    held = worker.held
    limit = routing.limits.max_redeliveries
    failed = sum(1 for p in held if p.redeliveries >= limit) if held else 0
    routing.note(
        logging.INFO,
        "worker %s %s: served %s; %d held request(s) redelivered, %d failed (redelivery_limit)",
        PeerId(worker.ident),
        why,
        Joined([directory.Name(s.name) for s in worker.services]),
        len(held) - failed,
        failed,
    )


def time_out_work(routing: Routing, now: float) -> None:
    """Rule 7: expel and remove every worker holding a request past its work timeout."""
    deadlines = routing._deadlines
    quarantine = routing.sessions.quarantine
    while (pending := deadlines.pop(now)) is not None:
        worker = pending.holder
        assert worker is not None
        routing.note(
            logging.WARNING,
            "worker %s held a request for %r past its work timeout (%.3f s): removing it",
            PeerId(worker.ident),
            pending.service.name[:64],
            pending.work_timeout,
        )
        routing.counters.work_timeouts += 1
        quarantine[worker.ident] = now + routing._quarantine_for
        routing.outbox.append(worker.dialect.expel(worker.ident))
        routing.remove_worker(worker, "timed out")
    if quarantine:
        workers = routing.sessions.workers
        for ident, until in list(quarantine.items()):
            if until <= now:
                del quarantine[ident]
                released = workers.get(ident)
                if released is not None and released.credit:
                    routing._use_credit(released)


def next_work_deadline(routing: Routing) -> float | None:
    """The earliest work-timeout deadline, quarantine end, or expiry of a queued request
    (``None``: none)."""
    when = routing._deadlines.next_due()
    expiry = routing._queues.next_due()
    if expiry is not None and (when is None or expiry < when):
        when = expiry
    quarantine = routing.sessions.quarantine
    if quarantine:
        top = min(quarantine.values())
        when = top if when is None or top < when else when
    return when
