"""Where the executors find the broker: an argument, Spark, or the environment."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

__all__ = ["BROKER_ENV", "BROKER_KEY", "resolve_broker"]

#: The Spark key: a local property (``sc.setLocalProperty``) or a conf entry
#: (``spark.conf.set``, ``--conf``, the session builder).
BROKER_KEY = "spark.dcp.broker"
#: The environment variable, read on the driver.
BROKER_ENV = "DCP_BROKER"


def resolve_broker(broker: str | None, spark: SparkSession | None) -> str:
    """The broker endpoint, from the first of these that is set:

    1. ``broker``, the argument;
    2. the local property :data:`BROKER_KEY` of the calling thread (classic Spark only: Spark
       Connect has no local properties), then the session conf entry :data:`BROKER_KEY`;
    3. the environment variable :data:`BROKER_ENV`.

    It is read on the driver when the plan is built (``map_service`` or ``service_column``
    is called), and shipped to the executors inside the tasks, so they need no configuration
    of their own.

    :raises ValueError: none of them is set
    """
    if broker:
        return broker
    if spark is not None:
        # Spark Connect raises an AttributeError for ``sparkContext``.
        context = getattr(spark, "sparkContext", None)
        value = context.getLocalProperty(BROKER_KEY) if context is not None else None
        if not value:
            value = spark.conf.get(BROKER_KEY, None)
        if value:
            return value
    value = os.environ.get(BROKER_ENV)
    if value:
        return value
    raise ValueError(
        "no dcp broker: pass broker=..., or set the Spark local property or conf entry "
        f"{BROKER_KEY!r}, or the environment variable {BROKER_ENV}"
    )
