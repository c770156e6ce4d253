"""The broker's driver: :class:`~dcp.Broker` around the broker core."""

from __future__ import annotations

from dcp._broker.broker import Broker as Broker

__all__ = ["Broker"]
