"""Approval of registrations (``Broker(approve=...)``). Sans-IO: the core never calls the
user's function (it may be ``async``, or slow); it asks the driver (an event), which runs it
and feeds the answer back (``BrokerCore.decide``, :meth:`~.routing.Routing.decide`).

Rule AP1 - With an approver, a registration that passes the other checks (name length,
  reserved names, the CURVE allow-list, per-worker limits) is not confirmed at once: the
  core puts an :class:`ApprovalRequest` in its events (the service, the info the worker gave
  beforehand with ``mmi.describe``, its routing id, its CURVE key) and the worker waits,
  unregistered. A registration for a service the worker already provides is
  not asked again; a repeat while one is pending is ignored.
Rule AP2 - The answer (``BrokerCore.decide``) is an :class:`Approval`. Approved: the
  registration goes on as if just received (confirmed, the worker gets work). Denied: counted
  (``registration_refused``), logged, and refused in the worker's dialect with the reason
  (DCP: the ``registration_refused`` reply; MDP: DISCONNECT).
Rule AP3 - At most ``max_pending`` registrations wait at once; one more is refused at once
  (``too many registrations await approval``). An answer for a token that is not pending
  (answered already) is ignored.
Rule AP4 - An approver that raises, or returns something that is not an answer, denies (the
  driver logs it); the reason says so, not what it raised.

What this module does NOT do: run the approver, time it out (a worker that waits longer than
its liveness reconnects and registers again, which asks again), or remember answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from dcp._core.broker.dialects import Dialect

__all__ = ["Approval", "ApprovalRequest", "Approvals", "to_approval"]


@attrs.frozen
class ApprovalRequest:
    """What an approver sees: a worker asks to provide :attr:`service`."""

    #: Matches the answer to the question (pass it back to the core).
    token: int
    #: The service name.
    service: bytes
    #: The info the worker gave (version, description, metadata, schemas), or ``None``.
    info: Mapping[str, Any] | None
    #: The worker's routing id.
    routing_id: bytes
    #: The worker's CURVE public key (Z85 text), or ``None`` without CURVE.
    key: str | None


@attrs.frozen
class Approval:
    """An approver's answer: approved, or denied with a reason (told to the worker)."""

    approved: bool
    reason: str = ""

    @classmethod
    def deny(cls, reason: str) -> Approval:
        """A denial with ``reason``."""
        return cls(False, reason)


def to_approval(result: object) -> Approval:
    """Rule AP4: an approver's result as an :class:`Approval`: an ``Approval``, a ``bool``,
    or ``(bool, reason)``.

    :raises TypeError: anything else
    """
    if isinstance(result, Approval):
        return result
    if isinstance(result, bool):
        return Approval(result, "" if result else "denied by the broker's approver")
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], bool)
        and isinstance(result[1], str)
    ):
        return Approval(result[0], result[1])
    raise TypeError(
        f"an approver must return a bool, (bool, reason) or dcp.Approval, not {result!r:.80}"
    )


class Approvals:
    """Registrations waiting for the approver (Rules AP1, AP3).

    :param tell: hands a question to the driver (appends it to the broker core's events)
    :param max_pending: questions waiting at once (Rule AP3)
    """

    def __init__(self, tell: Callable[[ApprovalRequest], None], max_pending: int = 1024) -> None:
        self.max_pending = max_pending
        self._tell = tell
        self._pending: dict[int, tuple[ApprovalRequest, Dialect, str | None]] = {}
        self._keys: set[tuple[bytes, bytes]] = set()
        self._next = 0

    def __len__(self) -> int:
        return len(self._pending)

    def ask(
        self,
        peer: bytes,
        name: bytes,
        dialect: Dialect,
        principal: str | None,
        info: Mapping[str, Any] | None,
    ) -> bool:
        """Rule AP1: ask about ``peer`` providing ``name``; ``False`` if too many wait (Rule
        A3). A repeat of a pending question asks nothing (and returns ``True``)."""
        if (peer, name) in self._keys:
            return True
        if len(self._pending) >= self.max_pending:
            return False
        self._next += 1
        request = ApprovalRequest(self._next, name, info, peer, principal)
        self._pending[request.token] = (request, dialect, principal)
        self._keys.add((peer, name))
        self._tell(request)
        return True

    def take(self, token: int) -> tuple[ApprovalRequest, Dialect, str | None] | None:
        """The pending question ``token``, no longer pending; ``None`` if it is not one."""
        entry = self._pending.pop(token, None)
        if entry is not None:
            self._keys.discard((entry[0].routing_id, entry[0].service))
        return entry
