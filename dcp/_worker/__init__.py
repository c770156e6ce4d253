"""The worker's driver: :class:`~dcp.Worker` around the worker core."""

from __future__ import annotations

from dcp._worker.worker import Worker as Worker

__all__ = ["Worker"]
