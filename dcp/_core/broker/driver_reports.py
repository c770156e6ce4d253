"""What the broker's driver reports to the core besides messages (sans-IO): a message it
cut at a frame or size limit, and a message it could not send. Methods of
:class:`~dcp._core.broker.core.BrokerCore` (its rule numbers).

Rules:

1. (Rule 6) A message cut at a limit is counted by reason and logged; if it is a DCP
   request whose metadata survived the cut, its caller gets a dcp error reply instead (an
   MDP one is dropped: its body is what was cut). A worker forwarding a request it holds
   is answered on behalf of the request's client, and gets its credit back.
2. A worker the driver cannot reach is treated as gone: what it holds is redelivered
   (routing Rule 5). A reply to a gone DCP client is kept to be sent again (Rule U1 of
   :mod:`.unreachable`); other replies are dropped and counted (``dropped_replies``), the
   rest (echoes, pongs, reconnects) counted as ``undeliverable``. Messages held for a full
   socket (streams Rule T3) and pub/sub ones are the streams' and pub/sub's to handle.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from dcp._core.broker.dialects import Dialect, dcp_dialect
from dcp._errors import MessageTooLarge, RemoteProtocolError, TooManyFrames
from dcp.wire import mdp
from dcp.wire.dcp1 import TYPE_FRAMES, parse
from dcp.wire.messages import MessageType, Request
from dcp.wire.sniff import Family, sniff

if TYPE_CHECKING:
    from dcp._core.broker.core import BrokerCore

__all__ = ["reject_too_large", "reject_too_many_frames", "undeliverable"]

_REPLY_TYPE_FRAMES = (TYPE_FRAMES[1][MessageType.REPLY], TYPE_FRAMES[4][MessageType.REPLY])


def reject_too_many_frames(
    core: BrokerCore, frames: list[bytes], dropped: int, now: float, principal: str | None = None
) -> None:
    """The driver cut a message at its frame limit, keeping ``frames`` (routing id
    first): count and log it, and answer it with an error reply if it is a request
    whose metadata was kept."""
    kept = len(frames) - 1
    exc = TooManyFrames(f"{kept + dropped} frames; the limit is {kept}")
    _reject_cut(core, frames, exc.reason, str(exc), now, principal)


def reject_too_large(
    core: BrokerCore,
    frames: list[bytes],
    nbytes: int,
    limit: int,
    now: float,
    principal: str | None = None,
) -> None:
    """The driver found a message over its size limit and kept only ``frames`` of it:
    as :meth:`reject_too_many_frames`."""
    exc = MessageTooLarge(f"{nbytes} bytes; the limit is {limit}")
    _reject_cut(core, frames, exc.reason, str(exc), now, principal)


def _reject_cut(
    core: BrokerCore,
    frames: list[bytes],
    reason: str,
    detail: str,
    now: float,
    principal: str | None,
) -> None:
    """A message cut at a limit: an error reply if it is a DCP request with its
    metadata (an MDP one is counted and dropped: its body is what was cut)."""
    core._now = now
    peer = frames[0]
    if core.guard is not None and not core._admitted(peer, principal):
        return
    body = frames[1:]
    msg: object = None
    width = 1
    if sniff(body) is Family.DCP:
        with contextlib.suppress(RemoteProtocolError):
            msg, width = parse(body)
    if not isinstance(msg, Request):
        core.reject(peer, reason, detail)
        return
    dialect = dcp_dialect(width)
    worker = core.sessions.workers.get(peer)
    if worker is None:
        core.sessions.remember(peer, dialect)
    client = msg.client
    origin: Dialect = dialect
    released = False
    if worker is not None and client is not None:
        # A worker forwarding a request it holds: its client is the one to tell.
        forwarded = core._forwarded(peer, worker, client, msg.metadata)
        if forwarded is None:
            return
        client, origin, released = forwarded
    elif client is None or (client != peer and not core.allow_foreign_address):
        client = peer
    core.refuse(client, origin, msg.service, msg.metadata, reason, detail)
    if worker is not None:
        core.credit(worker, released=released)


def undeliverable(core: BrokerCore, frames: list[bytes], why: str) -> None:
    """The driver could not send ``frames`` (its peer is gone, or its queue is full).

    A worker we cannot reach is treated as gone: what it holds is redelivered. Any other
    message is dropped and counted: replies in ``dropped_replies``, the rest (echoes,
    pongs, reconnects) in ``undeliverable``.
    """
    if core.undelivered(frames, why):
        return  # held for a full socket (streams Rule T3)
    if core.pubsub_undeliverable(frames, why):
        return
    peer = frames[0]
    worker = core.sessions.workers.get(peer)
    if worker is not None:
        core.counters.count(f"worker_unreachable_{why}")
        core.remove_worker(worker, f"unreachable ({why})")
    elif _is_reply(frames):
        # Rule U1 for DCP replies only: a DCP client keeps its address when it
        # reconnects; a Majordomo client without an id of its own gets a new one.
        if (
            why != "gone"
            or not _is_dcp_reply(frames)
            or not core.unreachable.refused(frames, core._now)
        ):
            core.counters.dropped_replies += 1
    else:
        core.counters.undeliverable += 1


def _is_dcp_reply(frames: list[bytes]) -> bool:
    return len(frames) > 3 and frames[3] in _REPLY_TYPE_FRAMES and frames[2][:4] == b"DGBX"


def _is_reply(frames: list[bytes]) -> bool:
    """Whether a message to a client is a reply (DCP REPLY, or an MDP client answer)."""
    if _is_dcp_reply(frames):
        return True
    return any(f in mdp.CLIENT_HEADERS for f in frames[1:3])
