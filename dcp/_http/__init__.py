"""The broker's HTTP endpoint (``Broker(http=...)``, ``dcp broker --http``): ``/metrics``
(Prometheus), ``/status`` (JSON) and ``/`` (a live status page). See ``docs/operations.md``.

Layout: :mod:`.address` (what may be bound), :mod:`.app` (the ASGI app: routing and the
bearer token), :mod:`.metrics` and :mod:`.status` (what each path shows, from one
:class:`~dcp._stats.BrokerSnapshot`), :mod:`.server` (hypercorn on the running backend).
Only :mod:`.address` is imported by the broker without the ``http`` extra.
"""

from __future__ import annotations

from dcp._http.address import HttpOptions, http_options, require

__all__ = ["HttpOptions", "http_options", "require"]
