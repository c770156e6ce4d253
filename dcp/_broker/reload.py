"""Reloading a running broker's security (:meth:`dcp.Broker.reload_security`): the new
allow-lists go to the ZAP handler and, where the core runs, to its guard; the connections
a revoked key came from are cut (:mod:`dcp._broker.connections`).

Rules:

1. Only the allow-lists change: a reload with another key pair (or on a broker without
   security) is refused before anything changes.
2. New handshakes follow the new lists at once (the ZAP handler's first); the core then
   refuses every message of a revoked key and removes the workers that may no longer
   register (Rule S5 in :mod:`dcp._core.broker.guard`), in the I/O thread
   (:mod:`dcp._broker.thread`).
3. Connections are cut only when a key lost the right to connect (not when it only lost a
   service), and only those accepted from the addresses revoked keys connected from; when
   workers were removed, only :data:`~dcp._broker.connections.TELL_BEFORE_CUT` seconds after they
   were told (zmq writes on its own thread: a connection cut first loses the refusal).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from dcp._broker.connections import TELL_BEFORE_CUT, cut_accepted, revokes
from dcp._broker.thread import in_core
from dcp._io.security import CurveServer

if TYPE_CHECKING:
    from dcp._broker.broker import Broker

__all__ = ["reload_broker_security"]

logger = logging.getLogger("dcp.broker")


async def reload_broker_security(broker: Broker, security: CurveServer) -> int:
    """Rules 1 to 3; how many workers were removed."""
    old = broker._security
    if old is None:
        raise ValueError("this broker was made without security=: nothing to reload")
    if (security.public_key, security.secret_key) != (old.public_key, old.secret_key):
        raise ValueError(
            "reload_security changes the allow-lists, not the broker's key pair: restart "
            "the broker to change its keys"
        )
    broker._security = security
    if broker._zap is not None:
        broker._zap.allow = security.may_connect
    core = broker._core

    def apply(now: float) -> int:
        assert core.guard is not None
        core.guard.reload(security.may_connect, security.may_register)
        return core.revoke(now)

    removed = await in_core(broker, apply)
    cut = 0
    if revokes(old, security):
        if removed:
            await anyio.sleep(TELL_BEFORE_CUT)  # let zmq write what they were told
        zap = broker._zap
        peers = None if zap is None else zap.peers_of(lambda key: not security.may_connect(key))
        cut = cut_accepted(broker.endpoints, peers)
    logger.info("security reloaded: %d worker(s) removed, %d connection(s) dropped", removed, cut)
    return removed
