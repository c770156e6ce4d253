"""The clients' drivers: :class:`~dcp.Client` and :class:`~dcp.SyncClient` around the request
tracker. Each is composed of parts that own their state and are given what they need (never
the client itself): its socket and everything waiting on it (``receive``, ``sync_receive``,
with ``waiters``), the maps (``maps``, loops around :mod:`dcp._core.client.window`), streams
(``streams``), pub/sub (``pubsub``, ``subscriptions``), the service answers (``services``)
and tracing (``tracing``); ``options`` is what both clients share."""

from __future__ import annotations

from dcp._client.client import Client as Client
from dcp._client.sync_client import SyncClient as SyncClient

__all__ = ["Client", "SyncClient"]
