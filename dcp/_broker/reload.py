"""A broker's CURVE security while it lives: the settings in force, the ZAP handler that
applies them to handshakes while the broker serves, and their reload
(:meth:`dcp.Broker.reload_security`): the new allow-lists go to the ZAP handler and, where
the core runs, to its guard; the connections a revoked key came from are cut
(:mod:`dcp._broker.connections`).

Rules:

Rule SR1 - Only the allow-lists change: a reload with another key pair (or on a broker without
   security) is refused before anything changes.
Rule SR2 - New handshakes follow the new lists at once (the ZAP handler's first); the core then
   refuses every message of a revoked key and removes the workers that may no longer
   register (Rule S5 in :mod:`dcp._core.broker.guard`), in the I/O thread
   (:mod:`dcp._broker.thread`).
Rule SR3 - Connections are cut only when a key lost the right to connect (not when it only lost a
   service), and only those accepted from the addresses revoked keys connected from; when
   workers were removed, only :data:`~dcp._broker.connections.TELL_BEFORE_CUT` seconds after they
   were told (zmq writes on its own thread: a connection cut first loses the refusal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
import zmq

from dcp._broker.connections import TELL_BEFORE_CUT, cut_accepted, revokes
from dcp._broker.thread import CoreCalls
from dcp._broker.zap import ZapHandler
from dcp._core.broker.core import BrokerCore
from dcp._io.security import CurveServer

__all__ = ["SecurityReload"]

logger = logging.getLogger("dcp.broker")


class SecurityReload:
    """A broker's security settings, its ZAP handler, and their reload (Rules SR1 to SR3).

    :param security: the settings the broker was made with (``None``: no security, and a
        reload is refused)
    :param core: the broker's core (its guard takes the new lists)
    :param calls: where the core runs
    """

    def __init__(self, security: CurveServer | None, core: BrokerCore, calls: CoreCalls) -> None:
        #: The settings in force (the last reload's).
        self.security = security
        #: The ZAP handler of the broker's current (or last) serve, if it has security.
        self.zap: ZapHandler | None = None
        self._core = core
        self._calls = calls

    def open_zap(self, context: zmq.Context[zmq.Socket[bytes]]) -> ZapHandler | None:
        """A bound ZAP handler for a serve in ``context`` (``None`` without security); the
        serve closes it.

        :raises zmq.ZMQError: another ZAP handler is bound in ``context``
        """
        zap = None
        if self.security is not None:
            zap = ZapHandler(context, self.security.may_connect)
            zap.bind()
        self.zap = zap
        return zap

    async def reload(self, security: CurveServer, endpoints: Callable[[], Sequence[str]]) -> int:
        """Rules SR1 to SR3; how many workers were removed.

        :param endpoints: the broker's bound endpoints, when the connections are cut
        """
        old = self.security
        if old is None:
            raise ValueError("this broker was made without security=: nothing to reload")
        if (security.public_key, security.secret_key) != (old.public_key, old.secret_key):
            raise ValueError(
                "reload_security changes the allow-lists, not the broker's key pair: restart "
                "the broker to change its keys"
            )
        self.security = security
        if self.zap is not None:
            self.zap.allow = security.may_connect
        core = self._core

        def apply(now: float) -> int:
            assert core.guard is not None
            core.guard.reload(security.may_connect, security.may_register)
            return core.revoke(now)

        removed = await self._calls.run(apply)
        cut = 0
        if revokes(old, security):
            if removed:
                await anyio.sleep(TELL_BEFORE_CUT)  # let zmq write what they were told
            zap = self.zap
            peers = (
                None if zap is None else zap.peers_of(lambda key: not security.may_connect(key))
            )
            cut = cut_accepted(endpoints(), peers)
        logger.info(
            "security reloaded: %d worker(s) removed, %d connection(s) dropped", removed, cut
        )
        return removed
