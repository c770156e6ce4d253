"""What :class:`~dcp.Client` and :class:`~dcp.SyncClient` share: their options, and what is
built from them (the request tracker, the request metadata and time limits, the
statistics). Their socket: :func:`dcp._io.handshake.connect_dealer`, shared with the worker.

Rules:

Rule CO1 - Every option is checked by ``__init__`` before the client makes a socket: a bad one
   raises (``ValueError``, or ``ImportError`` for tracing without OpenTelemetry) and nothing
   is left open. The order: the endpoint or endpoints (Rule BK1 of
   :mod:`dcp._core.client.brokers`; a malformed one is a ``ValueError`` naming the
   mistake, :func:`~dcp._io.endpoints.check_peer_endpoint`, never zmq's bare ``EINVAL``),
   ``failover_grace``, routing id, tracing, work timeout, the tracker's options; then
   the client's own :meth:`ClientOptions._setup` (the sync client connects there).
Rule CO2 - A request that sets no metadata, work timeout or ``wait_for_worker`` of its own gets
   the metadata built once per (``work_timeout``, ``wait_for_worker``) setting of the client
   (both are public attributes a caller may change between requests), not once per request.
Rule CO3 - The per-request path (``request``) calls the helpers here no more than it did when
   each client had its own copy: options of a whole ``map`` or ``stream`` are checked by one
   helper, once per call.
Rule CO4 - Fail fast by default (as NATS answers "no responders"): every request, map and
   stream carries the no-wait option (a dcp broker answers :exc:`~dcp.NoWorkers` at once when
   no worker serves the service) unless ``wait_for_worker`` is true, for the call or the
   client; then it is queued until a worker comes or its time is up. ``no_wait`` is the old,
   inverted spelling, still accepted: ``no_wait=True`` is ``wait_for_worker=False``; both
   given and disagreeing is a :exc:`ValueError`. The ``mmi.*`` questions never carry it.
Rule CO5 - A wrong argument names the class the user called: each client class gets its own
   copy of ``ClientOptions.__init__`` named after it (``Client.__init__() got an unexpected
   keyword argument 'nonsense'``, not ``ClientOptions.__init__()``; Python 3.10 names no
   class in that error at all).
"""

from __future__ import annotations

import random
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import zmq

from dcp._client.streams import stream_timing
from dcp._core.client.brokers import Brokers, check_grace, endpoint_list
from dcp._core.client.calls import (
    Part,
    Timing,
    check_window,
    checked_routing_id,
    data_parts,
    request_metadata,
    service_bytes,
)
from dcp._core.client.tracker import RequestTracker
from dcp._io.endpoints import check_peer_endpoint
from dcp._io.security import CurveClient
from dcp._stats import ClientStatistics
from dcp.wire.options import work_timeout_option

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["ClientOptions"]


def _init_of(cls: type, init: types.FunctionType) -> types.FunctionType:
    """Rule CO5: ``init`` as ``cls``'s own ``__init__`` (the same code, named after it)."""
    qualname = f"{cls.__qualname__}.__init__"
    code = init.__code__
    if sys.version_info >= (3, 11):  # what its argument errors name
        code = code.replace(co_qualname=qualname)
    copy = types.FunctionType(
        code, init.__globals__, init.__name__, init.__defaults__, init.__closure__
    )
    copy.__kwdefaults__ = init.__kwdefaults__
    copy.__annotations__ = init.__annotations__
    copy.__doc__ = init.__doc__
    copy.__module__ = init.__module__
    copy.__qualname__ = qualname
    return copy


class ClientOptions:
    """The options of a client (the parameters are :class:`dcp.Client`'s)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in vars(cls):  # Rule CO5
            init = ClientOptions.__dict__["__init__"]
            cls.__init__ = _init_of(cls, init)  # type: ignore[method-assign]

    def __init__(
        self,
        endpoint: str | Sequence[str],
        *,
        timeout: float = 30.0,
        attempt_timeout: float | None = None,
        retries: int = 2,
        wait_for_worker: bool = False,
        no_wait: bool | None = None,
        backoff: float = 0.1,
        backoff_factor: float = 2.0,
        backoff_max: float = 5.0,
        jitter: float = 0.5,
        routing_id: bytes | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        batch: int = 256,
        rng: random.Random | None = None,
        remember: int = 8192,
        work_timeout: float | None = None,
        security: CurveClient | None = None,
        type_width: int = 1,
        tracing: bool | TracerProvider = False,
        failover_grace: float = 0.2,
        wait_for_broker: bool = True,
    ) -> None:
        endpoints = endpoint_list(endpoint)
        for each in endpoints:
            check_peer_endpoint(each)
        check_grace(failover_grace)
        #: The brokers' choice and failover (``None``: one broker, the path of old).
        self._brokers = Brokers(endpoints, grace=failover_grace) if len(endpoints) > 1 else None
        self._endpoints = endpoints
        endpoint = endpoints[0]
        routing_id = checked_routing_id(routing_id)
        if tracing:  # docs/tracing.md: spans of the requests; off costs nothing
            self._trace(tracing, endpoint)
        if work_timeout is not None:
            work_timeout_option(work_timeout)  # check it now
        #: Default work timeout of requests (seconds; ``None``: the broker's).
        self.work_timeout = work_timeout
        wait = wait_for_option(wait_for_worker or None, no_wait)  # False: the default
        #: Default of :meth:`request`'s ``wait_for_worker`` (Rule CO4).
        self.wait_for_worker = bool(wait_for_worker if wait is None else wait)
        #: Whether requests wait for a broker that refuses connections (``False``: they
        #: fail with :exc:`~dcp.BrokerUnreachable`, tracker Rule RT9); read on entry.
        self.wait_for_broker = wait_for_broker
        self.endpoint = endpoint
        #: The socket's zmq routing id: the broker's address for this client.
        self.routing_id = routing_id
        self._tracker = RequestTracker(
            timeout=timeout,
            attempt_timeout=attempt_timeout,
            retries=retries,
            backoff=backoff,
            backoff_factor=backoff_factor,
            backoff_max=backoff_max,
            jitter=jitter,
            rng=rng,
            remember=remember,
            type_width=type_width,
            probe=type_width == 1,  # the DagBox broker (4-byte types) has no mmi.service
        )
        self._tracker.endpoint = endpoint  # named in timeout messages (tracker Rule RT7)
        self._tracker.endpoints = tuple(endpoints)
        self._batch = batch
        #: (work_timeout, no_wait) and the request metadata they give with no other option.
        self._plain_metadata: tuple[tuple[float | None, bool], tuple[bytes, ...]] | None = None
        self._setup(context, security)

    def _trace(self, tracing: bool | TracerProvider, endpoint: str) -> None:
        """Start tracing the requests (called only when ``tracing`` is set)."""
        raise NotImplementedError

    def _setup(
        self, context: zmq.Context[zmq.Socket[bytes]] | None, security: CurveClient | None
    ) -> None:
        """The client's own state, once every option is checked (Rule CO1)."""
        raise NotImplementedError

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every broker's endpoint, in the order given (``endpoint`` is the first; a
        ``beacon://`` one is the broker heard once entered)."""
        return self._endpoints if len(self._endpoints) > 1 else (self.endpoint,)

    def statistics(self) -> ClientStatistics:
        """Counters: requests, replies, retries, timeouts, duplicates, pending, ..."""
        stats = self._tracker.statistics()
        brokers = self._brokers
        if brokers is None:  # one broker: no failover
            return stats
        return attrs.evolve(
            stats,
            failovers=brokers.moved,
            held=brokers.held,
            held_dropped=brokers.held_dropped,
            brokers_lost=brokers.lost_count,
        )

    @property
    def no_wait(self) -> bool:
        """``not wait_for_worker``: the old spelling of the option (Rule CO4)."""
        return not self.wait_for_worker

    @no_wait.setter
    def no_wait(self, value: bool) -> None:
        self.wait_for_worker = not value

    def _metadata(
        self,
        metadata: Sequence[Part],
        work_timeout: float | None,
        wait_for_worker: bool | None,
        no_wait: bool | None = None,
    ) -> tuple[bytes, ...]:
        if metadata == () and work_timeout is None and wait_for_worker is None and no_wait is None:
            # Rule CO2: the client's own options only, built once per setting.
            key = (self.work_timeout, not self.wait_for_worker)
            plain = self._plain_metadata
            if plain is None or plain[0] != key:
                plain = self._plain_metadata = (
                    key,
                    request_metadata((), None, key[0], no_wait=key[1]),
                )
            return plain[1]
        wait = wait_for_option(wait_for_worker, no_wait)
        return request_metadata(
            metadata,
            work_timeout,
            self.work_timeout,
            no_wait=not (self.wait_for_worker if wait is None else wait),
        )

    def _map_options(
        self,
        window: int,
        service: str | bytes,
        metadata: Sequence[Part],
        timeout: float | None,
        attempt_timeout: float | None,
        retries: int | None,
        work_timeout: float | None,
        wait_for_worker: bool | None,
        no_wait: bool | None,
    ) -> tuple[bytes, tuple[bytes, ...], Timing]:
        """A ``map``'s service, metadata and time limits, checked before it starts."""
        check_window(window)
        checked = service_bytes(service)
        meta = self._metadata(metadata, work_timeout, wait_for_worker, no_wait)
        return checked, meta, self._tracker.timing(timeout, attempt_timeout, retries)

    def _stream_options(
        self,
        service: str | bytes,
        data: Sequence[Part],
        metadata: Sequence[Part],
        timeout: float | None,
        stall_timeout: float | None,
        work_timeout: float | None,
        wait_for_worker: bool | None,
    ) -> tuple[bytes, tuple[bytes, ...], tuple[bytes, ...], Timing]:
        """A ``stream``'s service, data, metadata and time limits (one attempt), checked."""
        if stall_timeout is not None and not stall_timeout > 0:
            raise ValueError("stall_timeout must be positive")
        checked = service_bytes(service)
        parts = tuple(data_parts(data))
        meta = self._metadata(metadata, work_timeout, wait_for_worker)
        return checked, parts, meta, stream_timing(self._tracker.timing(timeout, None, 0))


def wait_for_option(wait_for_worker: bool | None, no_wait: bool | None) -> bool | None:
    """``wait_for_worker`` from it or its old, inverted spelling ``no_wait`` (Rule CO4);
    ``None``: neither given.

    :raises ValueError: both given, and they disagree
    """
    if no_wait is None:
        return wait_for_worker
    if wait_for_worker is not None and wait_for_worker == no_wait:
        raise ValueError(
            f"wait_for_worker={wait_for_worker} and no_wait={no_wait} disagree "
            "(no_wait is the old spelling of wait_for_worker=False)"
        )
    return not no_wait
