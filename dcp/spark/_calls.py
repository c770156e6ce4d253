"""What runs inside a Spark task: Arrow arrays in, service replies out. No pyspark here, so
the same code is tested directly, with a real broker and workers, outside Spark.

Per task (one call of :func:`call_batches` or :func:`call_column`): one
:class:`~dcp.SyncClient`, so one DEALER socket on the process's zmq context (re-created
after a fork) and the client's sans-IO request tracker with its synchronous driver. The
requests of all the task's batches form one stream with up to ``window`` in flight: the
next batch is read while the previous one's last requests are still out. Replies are put
back in input order and a batch is handed on as soon as its last row is answered. The socket
is closed (linger 0) when the task's iterator ends, fails or is closed early (e.g. by
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
from collections.abc import Generator, Iterable, Iterator
from typing import Literal, get_args

import attrs
import pyarrow as pa

from .._calls import service_bytes
from .._errors import DCPError, NoWorkers, RemoteError, RequestTimeout
from .._sync_client import SyncClient
from .._tracker import Outcome, Response

__all__ = [
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


def _endpoint(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or "://" not in value:
        raise ValueError(f"broker must be a zmq endpoint such as tcp://host:5555, not {value!r}")


@attrs.frozen
class ServiceCall:
    """Everything a Spark task needs to call a service; pickled into the task.

    :param broker: the broker's zmq endpoint, as the executors reach it
    :param service: the service name (``str`` is sent as UTF-8)
    :param window: requests in flight per task
    :param timeout: seconds per attempt (``math.inf``: no timeout)
    :param retries: resends after a timed-out attempt (same request id)
    :param work_timeout: seconds a worker may hold one row's request before the broker
        gives it to another worker (``None``: the broker's default)
    :param on_error: what a failed row does (see the module docstring)
    :param output_type: ``"binary"`` (the reply's bytes) or ``"string"`` (UTF-8)
    """

    broker: str = attrs.field(validator=_endpoint)
    service: bytes = attrs.field(converter=service_bytes)
    window: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    timeout: float = attrs.field(default=10.0, validator=_positive)
    retries: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    work_timeout: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(_positive)
    )
    on_error: OnError = attrs.field(default="raise", validator=_one_of)
    output_type: OutputType = attrs.field(default="binary", validator=_one_of)

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type of the output values."""
        return pa.string() if self.output_type == "string" else pa.binary()


class _Batch:
    """The outputs of one input array, filled in input order as replies come."""

    __slots__ = ("errors", "filled", "targets", "values")

    def __init__(self, length: int, targets: list[int] | None) -> None:
        self.values: list[bytes | str | None] = [None] * length
        self.errors: list[str | None] | None = None
        #: Rows that were sent, in order (``None``: every row).
        self.targets = targets
        self.filled = 0

    def complete(self) -> bool:
        """True once every row that was sent has its outcome."""
        wanted = len(self.values) if self.targets is None else len(self.targets)
        return self.filled == wanted

    def put(self, value: bytes | str | None, error: str | None) -> None:
        row = self.filled if self.targets is None else self.targets[self.filled]
        self.filled += 1
        self.values[row] = value
        if error is not None:
            if self.errors is None:
                self.errors = [None] * len(self.values)
            self.errors[row] = error


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

    :returns: per input array, in order: the outputs (``call.arrow_type``) and, when
        ``call.on_error == "column"``, the error texts (string; null where the row succeeded)
    :raises DCPError: the first failed row when ``call.on_error == "raise"``
    """
    batches: deque[_Batch] = deque()

    def payloads() -> Iterator[bytes]:
        for array in arrays:
            values = _payloads(array)
            if array.null_count:
                batches.append(
                    _Batch(len(values), [i for i, v in enumerate(values) if v is not None])
                )
                yield from (v for v in values if v is not None)
            else:
                batches.append(_Batch(len(values), None))
                yield from values  # type: ignore[misc]  # no nulls here

    def result(batch: _Batch) -> tuple[pa.Array, pa.Array | None]:
        values = pa.array(batch.values, type=out_type)
        if not column:
            return values, None
        errors = batch.errors if batch.errors is not None else [None] * len(batch.values)
        return values, pa.array(errors, type=pa.string())

    out_type = call.arrow_type
    as_text = call.output_type == "string"
    raising = call.on_error == "raise"
    column = call.on_error == "column"
    with (
        SyncClient(
            call.broker,
            # ServiceCall.timeout is per attempt; the attempts bound the call.
            timeout=math.inf,
            attempt_timeout=call.timeout,
            retries=call.retries,
            work_timeout=call.work_timeout,
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
            value, error = _value(outcome, as_text)
            if error is None:
                batch.put(value, None)
            elif raising:
                raise error
            else:
                batch.put(None, describe_error(error) if column else None)
            if batch.complete():
                yield result(batches.popleft())
    while batches:  # trailing arrays whose rows are all null
        yield result(batches.popleft())


def _value(outcome: Outcome, as_text: bool) -> tuple[bytes | str | None, DCPError | None]:
    if not isinstance(outcome, Response):
        return None, outcome
    data = outcome.data
    if len(data) != 1:
        return None, BadReply(f"the reply has {len(data)} data parts, not 1")
    if not as_text:
        return data[0], None
    try:
        return data[0].decode(), None
    except UnicodeDecodeError as exc:
        return None, BadReply(f"the reply is not UTF-8 ({exc.reason} at byte {exc.start})")


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

    def inputs() -> Iterator[pa.Array]:
        for batch in batches:
            held.append(batch)
            yield batch.column(input_col)

    for values, errors in call_arrays(call, inputs()):
        batch = held.popleft()
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
