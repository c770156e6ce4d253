"""Admission: the broker's limits on requests, turned into refusals. Pure.

Rule AD1 - A request for a service nobody has named yet creates it, unless its name is longer
  than ``max_service_name`` (``service_name_too_long``, naming the limit; so too a no-wait
  request or a forward, which would otherwise be told ``no_workers``) or ``max_services`` are
  known (``too_many_services``). Registrations are not bounded by ``max_services`` (requests for
  made-up names must not lock real workers out); they are bounded per worker.
Rule AD2 - A request that would wait (no idle worker) in a queue of ``max_queue`` is refused
  (``queue_full``).
Rule AD3 - Per client address, at most ``max_client_inflight`` requests are accepted and
  unanswered (queued or held by workers), and at most ``max_client_queued`` wait in queues;
  past either: ``client_limit``.
Rule AD4 - Reserved names (:func:`is_reserved`): ``mmi.*`` (the broker's own services,
  directory Rule D1), names starting ``\\xffDCP`` (dcp's verbs and options: pub/sub, error
  markers), and every dialect's own command words (DBP's, mc0's, the Majordomo headers) are
  never services. A registration of one is refused in the worker's dialect, with or without
  CURVE (``reserved_service``, routing); a request to one that no verb of the broker answers
  is refused before a service is made for it (``reserved_service``), so it never reaches a
  worker.
Rule AD5 - Per-client share of services. A client may have made at most
  ``max_client_services`` of the services that exist without a worker (by default a tenth of
  ``max_services``): a request that would make one more is refused (``too_many_services``),
  so a few clients cannot fill ``max_services`` with made-up names. A service counts for the
  client whose request made it until a worker provides it or it is forgotten (nobody
  provides it and nothing waits for it: routing, queues Rule Q5).
Rule AD6 - Bytes. A request accepted is charged, until it ends, to its client in the byte
  budget's ``queued`` account (:mod:`.budget`, Rules MB1-MB2; routing Rule R10); one the
  budget refuses gets ``memory_budget``.

Each refusal is a ``(code, message)`` pair; the caller counts it and tells the client with an
error reply.
"""

from __future__ import annotations

import attrs

from dcp.wire import dbp, mc0, mdp
from dcp.wire.options import OPTION_PREFIX

__all__ = ["RESERVED_NAMES", "Limits", "Load", "is_reserved", "refusal"]

#: Whole names reserved by Rule AD4: the command words of the dialects the broker speaks
#: (a service named like one could be taken for a command by a peer or a capture).
RESERVED_NAMES = frozenset(
    {
        *dbp.COMMANDS,
        dbp.INFO_REPLY,
        dbp.APPROVED,
        dbp.DENIED,
        dbp.DENIED_DRAFT,
        dbp.REQUEST,
        *mc0.VERBS,
        b"OK",
        b"ERROR",
        b"MESSAGE",
        mdp.C01,
        mdp.W01,
        mdp.C02,
        mdp.W02,
    }
)
#: Prefixes reserved by Rule AD4: the broker's ``mmi.*`` and dcp's own ``\xffDCP``.
RESERVED_PREFIXES = (b"mmi.", OPTION_PREFIX[:4])


def is_reserved(name: bytes) -> bool:
    """Rule AD4: whether ``name`` is the broker's or a dialect's own, never a service."""
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)


@attrs.frozen
class Limits:
    """The bounds the broker core enforces (see :class:`~dcp._core.broker.core.BrokerCore`)."""

    max_queue: int = 100_000
    max_services: int = 10_000
    max_service_name: int = 1024
    max_redeliveries: int = 5
    max_held: int = 10_000
    max_services_per_worker: int = 256
    max_client_queued: int = 10_000
    max_client_inflight: int = 20_000
    #: Rule AD5 (``None``: a tenth of ``max_services``, at least 1).
    max_client_services: int | None = None
    #: Queues Rule Q5: seconds a request without an expiry may wait in a queue (``None``:
    #: for ever).
    max_queue_wait: float | None = 300.0

    def client_services(self) -> int:
        """Rule AD5: services without a worker one client may have made."""
        if self.max_client_services is not None:
            return self.max_client_services
        return max(1, self.max_services // 10)


class Load:
    """What the broker holds for one client address (Rule AD3)."""

    __slots__ = ("inflight", "queued")

    def __init__(self) -> None:
        self.queued = 0
        self.inflight = 0


def refusal(
    limits: Limits, queued: int, idle: bool, load: Load, name: bytes
) -> tuple[str, str] | None:
    """Rules AD2 and AD3 for a request to a known service with ``queued`` requests waiting and
    an ``idle`` worker or not: a refusal, or ``None`` to accept."""
    if not idle and queued >= limits.max_queue:
        return "queue_full", f"queue for {name[:64]!r} is full"
    if load.inflight >= limits.max_client_inflight:
        return "client_limit", f"{load.inflight} requests of this client unanswered"
    if not idle and load.queued >= limits.max_client_queued:
        return "client_limit", f"{load.queued} requests of this client queued"
    return None


def name_too_long(limits: Limits, name: bytes) -> tuple[str, str]:
    """Rule AD1: the refusal of a request naming a service longer than ``max_service_name``,
    the limit named."""
    return (
        "service_name_too_long",
        f"service name of {len(name)} bytes (max_service_name is {limits.max_service_name})",
    )


def new_service_refusal(
    limits: Limits, known: int, name: bytes, made: int = 0
) -> tuple[str, str] | None:
    """Rules AD1, AD4 and AD5 for a request naming a service not known yet, from a client
    that has ``made`` services no worker provides."""
    if is_reserved(name):
        return "reserved_service", f"{name[:64]!r} is not a service name (reserved)"
    if len(name) > limits.max_service_name:
        return name_too_long(limits, name)
    if known >= limits.max_services:
        return "too_many_services", f"{known} services already known"
    if made >= limits.client_services():
        return "too_many_services", f"this client made {made} services no worker provides"
    return None
