"""The driver side: build the Spark plan (``mapInArrow``, an iterator Arrow UDF) around the
per-task code in :mod:`dcp.spark._calls`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.types import BinaryType, DataType, StringType, StructField, StructType

from dcp.spark._calls import OnError, OutputType, ServiceCall, call_batches, call_column
from dcp.spark._config import resolve_broker

__all__ = ["column_function", "map_service", "service_column"]


def _spark_type(output_type: OutputType) -> DataType:
    return StringType() if output_type == "string" else BinaryType()


def map_service(
    df: DataFrame,
    service: str | bytes,
    *,
    input_col: str,
    output_col: str,
    broker: str | Sequence[str] | None = None,
    window: int = 64,
    timeout: float = 10.0,
    retries: int = 3,
    work_timeout: float | None = None,
    on_error: OnError = "raise",
    output_type: OutputType = "binary",
    error_col: str | None = None,
) -> DataFrame:
    """``df`` with ``output_col`` set to ``service``'s reply to each row's ``input_col``.

    Built on ``DataFrame.mapInArrow`` (so it also runs over Spark Connect). Each task opens
    one socket to the broker (one per broker, given several) and keeps up to ``window``
    requests in flight across its Arrow batches; rows keep their order and partitioning.
    The other columns pass through; ``output_col`` (and ``error_col``) replace columns of
    the same name, else are appended.

    Delivery is at least once: a retried or speculative Spark task, a retried request, and
    an action that recomputes an uncached result all call the service again for the same
    rows. Cache or write the result if it is used more than once.

    :param input_col: a string or binary column; each non-null value is one request's
        single data part (strings as UTF-8); null rows are not sent and give null
    :param output_col: the reply's single data part, as ``output_type``
    :param broker: the broker's endpoint, or a sequence of several brokers' endpoints (each
        task's client spreads its rows over them and fails over between them); default:
        the Spark local property or conf entry ``spark.dcp.broker``, else the driver's
        ``DCP_BROKER`` environment variable (both split on commas)
    :param window: requests in flight per task; a task holds about ``window`` x reply size
        of replies (rows are handed on to Spark once their replies hold
        :data:`~dcp.spark.BATCH_BYTES`), so lower it for replies of megabytes
    :param timeout: seconds per attempt
    :param retries: resends of a timed-out request, with the same request id
    :param work_timeout: seconds a worker may hold one row's request before the broker
        treats it as lost and gives the row to another worker (see docs/reliability.md)
    :param on_error: a failed row (error reply, timeout, reply that is not one part) fails
        the task (``"raise"``), gives null (``"null"``), or gives null and its error text
        (``"code: message"``) in ``error_col`` (``"column"``)
    :param output_type: ``"binary"`` or ``"string"`` (UTF-8; other replies are errors)
    :param error_col: the error column for ``on_error="column"``; default
        ``<output_col>_error``
    :raises ValueError: a bad option, no broker configured, or an unknown ``input_col``
    :raises TypeError: ``input_col`` is not a string or binary column
    """
    call = ServiceCall(
        resolve_broker(broker, df.sparkSession),
        service,
        window=window,
        timeout=timeout,
        retries=retries,
        work_timeout=work_timeout,
        on_error=on_error,
        output_type=output_type,
    )
    if on_error == "column":
        error_col = error_col or f"{output_col}_error"
    elif error_col is not None:
        raise ValueError("error_col is only for on_error='column'")
    schema = df.schema
    if input_col not in schema.names:
        raise ValueError(f"no column {input_col!r} in {schema.simpleString()}")
    _check_input(input_col, schema[input_col].dataType)
    fields = list(schema.fields)
    _put(fields, StructField(output_col, _spark_type(output_type), True))
    if error_col is not None:
        _put(fields, StructField(error_col, StringType(), True))
    func = functools.partial(
        call_batches, call, input_col=input_col, output_col=output_col, error_col=error_col
    )
    return df.mapInArrow(func, StructType(fields))


def service_column(
    col: Column | str,
    service: str | bytes,
    *,
    broker: str | Sequence[str] | None = None,
    window: int = 64,
    timeout: float = 10.0,
    retries: int = 3,
    work_timeout: float | None = None,
    on_error: OnError = "raise",
    output_type: OutputType = "binary",
) -> Column:
    """A column of ``service``'s replies to ``col``, for ``select`` and ``withColumn``::

        df.withColumn("score", service_column("text", "score", output_type="string"))

    An iterator Arrow UDF: per task, the same socket, window, order and options as
    :func:`map_service`. With ``on_error="column"`` the column is a struct of ``value``
    and ``error`` (``df.select(c.value, c.error)``). The broker is resolved now, from the
    argument, the active session's local property or conf ``spark.dcp.broker``, or
    ``DCP_BROKER``.

    :param col: a string or binary column (checked by Spark when the plan is analysed)
    """
    call = ServiceCall(
        resolve_broker(broker, SparkSession.getActiveSession()),
        service,
        window=window,
        timeout=timeout,
        retries=retries,
        work_timeout=work_timeout,
        on_error=on_error,
        output_type=output_type,
    )
    value_type = _spark_type(output_type)
    return_type: DataType = value_type
    if on_error == "column":
        return_type = StructType(
            [StructField("value", value_type, True), StructField("error", StringType(), True)]
        )

    udf = arrow_udf(column_function(call), return_type)  # type: ignore[call-overload]
    column: Column = udf(col)
    return column


def column_function(call: ServiceCall) -> Callable[[Iterator[pa.Array]], Iterator[pa.Array]]:
    """The function of :func:`service_column`'s UDF, named after the service.

    A plain function with type hints: Spark infers the iterator Arrow UDF kind from them
    (giving the kind explicitly makes pyspark warn; its stubs want it all the same, hence
    the ``type: ignore`` above).
    """

    def udf(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
        return call_column(call, arrays)

    udf.__name__ = udf.__qualname__ = call.service.decode(errors="replace")
    return udf


def _check_input(name: str, kind: DataType) -> None:
    if not isinstance(kind, (StringType, BinaryType)):
        raise TypeError(
            f"column {name!r} is {kind.simpleString()}; dcp.spark sends string or binary "
            "values (cast it, or serialise it first, e.g. with to_json)"
        )


def _put(fields: list[StructField], field: StructField) -> None:
    for i, old in enumerate(fields):
        if old.name == field.name:
            fields[i] = field
            return
    fields.append(field)
