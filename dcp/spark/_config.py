"""Where the executors find the broker, or brokers: an argument, Spark, or the environment."""

from __future__ import annotations

import os
from collections.abc import Sequence

from pyspark.sql import SparkSession

__all__ = ["BROKER_ENV", "BROKER_KEY", "Brokers", "resolve_broker", "split_brokers"]

#: The Spark key: a local property (``sc.setLocalProperty``) or a conf entry
#: (``spark.conf.set``, ``--conf``, the session builder).
BROKER_KEY = "spark.dcp.broker"
#: The environment variable, read on the driver.
BROKER_ENV = "DCP_BROKER"

#: One broker's endpoint, or several (each task's client uses them all).
Brokers = str | tuple[str, ...]


def split_brokers(value: str) -> Brokers:
    """A conf or environment value as endpoints: split on commas, blanks around each
    stripped, empty pieces dropped; one endpoint is returned as a ``str``, several as a
    tuple (``"tcp://a:5555, tcp://b:5555"``)."""
    endpoints = tuple(part.strip() for part in value.split(",") if part.strip())
    return endpoints[0] if len(endpoints) == 1 else endpoints


def resolve_broker(broker: str | Sequence[str] | None, spark: SparkSession | None) -> Brokers:
    """The broker endpoint (or endpoints), from the first of these that is set:

    1. ``broker``, the argument: one endpoint (a ``str``, taken as it is) or a sequence of
       them;
    2. the local property :data:`BROKER_KEY` of the calling thread (classic Spark only: Spark
       Connect has no local properties), then the session conf entry :data:`BROKER_KEY`;
    3. the environment variable :data:`BROKER_ENV`.

    The values of 2 and 3 are split on commas (blanks around each endpoint ignored), so
    ``DCP_BROKER=tcp://a:5555,tcp://b:5555`` gives both brokers.

    It is read on the driver when the plan is built (``map_service`` or ``service_column``
    is called), and shipped to the executors inside the tasks, so they need no configuration
    of their own.

    :returns: one endpoint as a ``str``, several as a tuple
    :raises ValueError: none of them is set
    """
    if isinstance(broker, str):
        if broker:
            return broker
    elif broker is not None and len(broker):
        return tuple(broker)
    if spark is not None:
        # Spark Connect raises an AttributeError for ``sparkContext``.
        context = getattr(spark, "sparkContext", None)
        value = context.getLocalProperty(BROKER_KEY) if context is not None else None
        if not value:
            value = spark.conf.get(BROKER_KEY, None)
        if value and (found := split_brokers(value)):
            return found
    value = os.environ.get(BROKER_ENV)
    if value and (found := split_brokers(value)):
        return found
    raise ValueError(
        "no dcp broker: pass broker=..., or set the Spark local property or conf entry "
        f"{BROKER_KEY!r}, or the environment variable {BROKER_ENV}"
    )
