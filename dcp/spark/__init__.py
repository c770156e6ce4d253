"""Push a Spark DataFrame through dcp services from the executors.

::

    from dcp.spark import map_service, service_column

    scored = map_service(df, "score", input_col="text", output_col="score",
                         broker="tcp://broker-host:5555", window=64, on_error="column")
    df.withColumn("score", service_column("text", "score", output_type="string"))

Needs the ``spark`` extra (``pip install 'dagbox-dcp[spark]'``: pyspark, pyarrow, pandas).
See ``docs/spark.md`` for the configuration order, delivery semantics and performance.
"""

from __future__ import annotations

try:
    import pyarrow as _pyarrow  # noqa: F401
    import pyspark as _pyspark  # noqa: F401
except ImportError as _exc:
    raise ImportError(
        f"dcp.spark needs pyspark and pyarrow ({_exc}); install them with: "
        "pip install 'dagbox-dcp[spark]'"
    ) from _exc

from dcp.spark._calls import BATCH_BYTES as BATCH_BYTES
from dcp.spark._calls import BadReply as BadReply
from dcp.spark._calls import OnError as OnError
from dcp.spark._calls import OutputType as OutputType
from dcp.spark._calls import ServiceCall as ServiceCall
from dcp.spark._calls import call_arrays as call_arrays
from dcp.spark._calls import call_batches as call_batches
from dcp.spark._calls import describe_error as describe_error
from dcp.spark._config import BROKER_ENV as BROKER_ENV
from dcp.spark._config import BROKER_KEY as BROKER_KEY
from dcp.spark._config import resolve_broker as resolve_broker
from dcp.spark._dataframe import map_service as map_service
from dcp.spark._dataframe import service_column as service_column

__all__ = [
    "BATCH_BYTES",
    "BROKER_ENV",
    "BROKER_KEY",
    "BadReply",
    "OnError",
    "OutputType",
    "ServiceCall",
    "call_arrays",
    "call_batches",
    "describe_error",
    "map_service",
    "resolve_broker",
    "service_column",
]
