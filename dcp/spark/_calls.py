"""What runs inside a Spark task: Arrow arrays in, service replies out. No pyspark here, so
the same code is tested directly, with a real broker and workers, outside Spark.

Per task (one call of :func:`call_batches` or :func:`call_column`): one
:class:`~dcp.SyncClient`, so one DEALER socket on the process's zmq context (re-created
after a fork) and the client's sans-IO request tracker with its synchronous driver. The
requests of all the task's batches form one stream with up to ``window`` in flight: the
next batch is read while the previous one's last requests are still out. Replies are put
back in input order and a batch is handed on as soon as its last row is answered, or in
pieces, each as soon as the replies of its rows hold ``batch_bytes`` (so a task holds about
``window`` replies plus ``batch_bytes``, whatever the number of rows in Spark's batches). The
socket is closed (linger 0) when the task's iterator ends, fails or is closed early (e.g. by
``limit``); outstanding requests are then forgotten.

Rows: a null input is not sent and gives a null output. A reply must hold exactly one data
part (and valid UTF-8 for ``output_type="string"``), else the row fails with
:exc:`BadReply`. A row fails with :exc:`~dcp.RemoteError` (an error reply),
:exc:`~dcp.RequestTimeout` (no reply after the last retry) or :exc:`BadReply`; ``on_error``
says what then: ``"raise"`` fails the task, ``"null"`` gives a null output, ``"column"`` a
null output and the error's text (``"code: message"``) in the error column.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Literal, get_args

import attrs
import pyarrow as pa

from dcp._client.sync_client import SyncClient
from dcp._core.client.calls import service_bytes
from dcp._errors import DCPError, NoWorkers, RemoteError, RequestTimeout
from dcp._models import Outcome, Response

__all__ = [
    "BATCH_BYTES",
    "BadReply",
    "OnError",
    "OutputType",
    "ServiceCall",
    "call_arrays",
    "call_batches",
    "call_column",
    "describe_error",
]

#: What a failed row does: fail the task, give null, or give null and an error text.
OnError = Literal["raise", "null", "column"]
#: The output column's type: the reply's bytes as they are, or decoded as UTF-8.
OutputType = Literal["binary", "string"]
#: A batch's rows are handed on to Spark, without waiting for the rest of the batch, once
#: their replies hold this many bytes: a task then holds at most ``window`` replies (in
#: flight or waiting for an earlier one) plus about this much, however large Spark's batches.
BATCH_BYTES = 1 << 20


class BadReply(DCPError, ValueError):
    """A reply that does not fit in a column: not exactly one data part, or not UTF-8 for a
    string output."""

    code = "bad_reply"


def describe_error(exc: DCPError) -> str:
    """The text of a failed row in the error column: ``"code: message"``.

    The code is the error reply's (e.g. ``handler_error``, ``queue_full``),
    ``no_workers`` (no worker serves the service), ``timeout`` or ``bad_reply``.
    """
    if isinstance(exc, RemoteError):
        return f"{exc.code}: {exc.message}"
    if isinstance(exc, NoWorkers):
        return f"no_workers: {exc}"
    if isinstance(exc, RequestTimeout):
        return f"timeout: {exc}"
    return f"{getattr(exc, 'code', type(exc).__name__)}: {exc}"


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:  # also rejects NaN
        raise ValueError(f"{attribute.name} must be > 0, not {value!r}")


def _one_of(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    allowed = get_args(OnError) if attribute.name == "on_error" else get_args(OutputType)
    if value not in allowed:
        raise ValueError(f"{attribute.name} must be one of {', '.join(allowed)}; not {value!r}")


def _brokers(value: str | Sequence[str]) -> str | tuple[str, ...]:
    """The ``broker`` field: one endpoint as given, several as a tuple."""
    return value if isinstance(value, str) else tuple(value)


def _endpoint(
    instance: object,
    attribute: attrs.Attribute[str | tuple[str, ...]],
    value: str | tuple[str, ...],
) -> None:
    endpoints = (value,) if isinstance(value, str) else value
    if not endpoints:
        raise ValueError("broker must name at least one endpoint, not an empty list")
    for endpoint in endpoints:
        if not isinstance(endpoint, str) or "://" not in endpoint:
            raise ValueError(
                f"broker must be a zmq endpoint such as tcp://host:5555 (or a list of them), "
                f"not {endpoint!r}"
            )
    if len(set(endpoints)) != len(endpoints):
        twice = next(e for e in endpoints if endpoints.count(e) > 1)
        raise ValueError(f"broker {twice!r} is listed twice")


@attrs.frozen
class ServiceCall:
    """Everything a Spark task needs to call a service; pickled into the task.

    :param broker: the broker's zmq endpoint, as the executors reach it, or a sequence of
        several brokers' (kept as a tuple): each task's client spreads its requests over them
        and fails over between them (``docs/scaling.md``)
    :param service: the service name (``str`` is sent as UTF-8)
    :param window: requests in flight per task
    :param timeout: seconds per attempt (``math.inf``: no timeout)
    :param retries: resends after a timed-out attempt (same request id)
    :param work_timeout: seconds a worker may hold one row's request before the broker
        gives it to another worker (``None``: the broker's default)
    :param on_error: what a failed row does (see the module docstring)
    :param output_type: ``"binary"`` (the reply's bytes) or ``"string"`` (UTF-8)
    :param batch_bytes: hand a batch's answered rows on once their replies hold this many
        bytes, before the rest of the batch is answered
    """

    broker: str | tuple[str, ...] = attrs.field(converter=_brokers, validator=_endpoint)
    service: bytes = attrs.field(converter=service_bytes)
    window: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    timeout: float = attrs.field(default=10.0, validator=_positive)
    retries: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    work_timeout: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive)
    )
    on_error: OnError = attrs.field(default="raise", validator=_one_of)
    output_type: OutputType = attrs.field(default="binary", validator=_one_of)
    batch_bytes: int = attrs.field(default=BATCH_BYTES, validator=attrs.validators.ge(1))

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type of the output values."""
        return pa.string() if self.output_type == "string" else pa.binary()


class _Batch:
    """The outputs of one input array, filled in input order as replies come, and handed on
    in one piece or several (:meth:`take`)."""

    __slots__ = ("answered", "errors", "length", "size", "start", "targets", "values")

    def __init__(self, length: int, targets: list[int] | None, column: bool) -> None:
        self.length = length
        #: Rows that were sent, in order (``None``: every row).
        self.targets = targets
        #: Outcomes put so far.
        self.answered = 0
        #: The first row not yet handed on; ``values`` (and ``errors``) hold the rows from
        #: there on that have their outcome.
        self.start = 0
        self.values: list[bytes | str | None] = []
        self.errors: list[str | None] | None = [] if column else None
        #: Bytes of the replies in ``values``.
        self.size = 0

    def complete(self) -> bool:
        """True once every row that was sent has its outcome."""
        wanted = self.length if self.targets is None else len(self.targets)
        return self.answered == wanted

    def put(self, value: bytes | str | None, error: str | None, size: int) -> None:
        """The outcome of the next row that was sent (``size``: its reply's bytes)."""
        if self.targets is not None:
            self._pad(self.targets[self.answered])
        self.answered += 1
        self.values.append(value)
        if self.errors is not None:
            self.errors.append(error)
        self.size += size

    def take(self) -> tuple[list[bytes | str | None], list[str | None] | None]:
        """The rows from :attr:`start` that have their outcome (every row left, once
        :meth:`complete`); they are forgotten here."""
        if self.complete():
            self._pad(self.length)
        values, errors = self.values, self.errors
        self.start += len(values)
        self.values = []
        self.errors = None if errors is None else []
        self.size = 0
        return values, errors

    def _pad(self, row: int) -> None:
        """Null outcomes for the rows not sent, up to ``row`` (excluded)."""
        gap = row - self.start - len(self.values)
        if gap:
            self.values += [None] * gap
            if self.errors is not None:
                self.errors += [None] * gap


def _payloads(array: pa.Array) -> list[bytes | None]:
    """The rows of a string or binary array as request payloads (``None`` for null)."""
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_string_view(kind):
        array = array.cast(pa.binary())
    elif pa.types.is_large_string(kind):
        array = array.cast(pa.large_binary())
    elif not (
        pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)
    ):
        raise TypeError(f"the input column must be string or binary, not {kind}")
    values: list[bytes | None] = array.to_pylist()
    return values


def call_arrays(
    call: ServiceCall, arrays: Iterable[pa.Array]
) -> Generator[tuple[pa.Array, pa.Array | None], None, None]:
    """Call ``call.service`` once per non-null row of each array, in one windowed stream.

    :returns: per input array, in order, one or more pieces covering its rows in order
        (several once the replies of a piece hold ``call.batch_bytes``; an empty array gives
        one empty piece): the outputs (``call.arrow_type``) and, when
        ``call.on_error == "column"``, the error texts (string; null where the row succeeded)
    :raises DCPError: the first failed row when ``call.on_error == "raise"``
    """
    batches: deque[_Batch] = deque()

    def payloads() -> Iterator[bytes]:
        for array in arrays:
            values = _payloads(array)
            if array.null_count:
                targets = [i for i, v in enumerate(values) if v is not None]
                batches.append(_Batch(len(values), targets, column))
                yield from (v for v in values if v is not None)
            else:
                batches.append(_Batch(len(values), None, column))
                yield from values  # type: ignore[misc]  # no nulls here

    def result(batch: _Batch) -> tuple[pa.Array, pa.Array | None]:
        values, errors = batch.take()
        out = pa.array(values, type=out_type)
        return out, None if errors is None else pa.array(errors, type=pa.string())

    out_type = call.arrow_type
    as_text = call.output_type == "string"
    raising = call.on_error == "raise"
    column = call.on_error == "column"
    limit = call.batch_bytes
    with (
        SyncClient(
            call.broker,
            # ServiceCall.timeout is per attempt; the attempts bound the call.
            timeout=math.inf,
            attempt_timeout=call.timeout,
            retries=call.retries,
            work_timeout=call.work_timeout,
            # a batch job rides through a worker's restart: its rows wait for a worker
            # (within their attempts) instead of failing at once as interactive calls do
            wait_for_worker=True,
        ) as client,
        contextlib.closing(
            client.map_outcomes(call.service, payloads(), window=call.window)
        ) as outcomes,
    ):
        for outcome in outcomes:
            batch = batches[0]
            while batch.complete():  # arrays whose rows are all null, before this one
                yield result(batches.popleft())
                batch = batches[0]
            value, error, size = _value(outcome, as_text)
            if error is None:
                batch.put(value, None, size)
            elif raising:
                raise error
            else:
                batch.put(None, describe_error(error) if column else None, 0)
            if batch.complete():
                yield result(batches.popleft())
            elif batch.size >= limit:
                yield result(batch)  # the rows answered so far; the rest comes later
    while batches:  # trailing arrays whose rows are all null
        yield result(batches.popleft())


def _value(outcome: Outcome, as_text: bool) -> tuple[bytes | str | None, DCPError | None, int]:
    """A row's output, or its error, and the reply's size in bytes."""
    if not isinstance(outcome, Response):
        return None, outcome, 0
    data = outcome.data
    if len(data) != 1:
        return None, BadReply(f"the reply has {len(data)} data parts, not 1"), 0
    if not as_text:
        return data[0], None, len(data[0])
    try:
        return data[0].decode(), None, len(data[0])
    except UnicodeDecodeError as exc:
        error = BadReply(f"the reply is not UTF-8 ({exc.reason} at byte {exc.start})")
        return None, error, 0


def call_batches(
    call: ServiceCall,
    batches: Iterable[pa.RecordBatch],
    *,
    input_col: str,
    output_col: str,
    error_col: str | None = None,
) -> Generator[pa.RecordBatch, None, None]:
    """The ``mapInArrow`` function of :func:`dcp.spark.map_service`: each batch with
    ``output_col`` (and ``error_col`` when ``call.on_error == "column"``) set, replaced in
    place when the batch already has a column of that name, else appended."""
    held: deque[pa.RecordBatch] = deque()
    offset = 0  # rows of held[0] already handed on

    def inputs() -> Iterator[pa.Array]:
        for batch in batches:
            held.append(batch)
            yield batch.column(input_col)

    for values, errors in call_arrays(call, inputs()):
        batch = held[0]
        rows = len(values)
        if rows != batch.num_rows:  # a piece of it (large replies)
            batch = batch.slice(offset, rows)
        offset += rows
        if offset == held[0].num_rows:
            held.popleft()
            offset = 0
        names = list(batch.schema.names)
        columns = list(batch.columns)
        _set(names, columns, output_col, values)
        if errors is not None:
            _set(names, columns, error_col or f"{output_col}_error", errors)
        yield pa.RecordBatch.from_arrays(columns, names=names)


def _set(names: list[str], columns: list[pa.Array], name: str, column: pa.Array) -> None:
    if name in names:
        columns[names.index(name)] = column
    else:
        names.append(name)
        columns.append(column)


def call_column(call: ServiceCall, arrays: Iterable[pa.Array]) -> Generator[pa.Array, None, None]:
    """The iterator Arrow UDF of :func:`dcp.spark.service_column`: one output array per
    input array; with ``on_error == "column"`` a struct array of ``value`` and ``error``."""
    for values, errors in call_arrays(call, arrays):
        if errors is None:
            yield values
        else:
            yield pa.StructArray.from_arrays([values, errors], names=["value", "error"])
