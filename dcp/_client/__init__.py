"""The clients' drivers: :class:`~dcp.Client` and :class:`~dcp.SyncClient` around the
request tracker."""

from __future__ import annotations

from dcp._client.client import Client as Client
from dcp._client.sync_client import SyncClient as SyncClient

__all__ = ["Client", "SyncClient"]
