"""Rows the driver holds, handed to Spark as DataFrames that no Python worker has to read.

``SparkSession.createDataFrame`` of Python rows (a list, even an empty one) makes an RDD of
pickled rows, which Python workers unpickle when a job reads it: the first such job of a JVM
starts them (``pyspark.daemon`` and a worker per task). A run that parses in this process
(``parse.parse_here``) otherwise needs no Python worker at all, yet one empty frame of stored
versions started them in a cold run of 1M events: a 3.4 s job beside the run's first decode
(docs/benchmarks.md, "Larger runs parse in the driver"). An Arrow table reaches the JVM as
Arrow batches instead, read by the JVM alone (a ``LocalRelation`` up to
``spark.LOCAL_RELATION_BYTES``, else an RDD of the batches): every frame the ingest job makes of
the driver's rows is one, made here or by ``createDataFrame`` of an Arrow table.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession


def local_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A driver-side Arrow table as one Spark partition (a derived table's rows, computed on
    the driver, and ``_rejected`` rows assembled there): one task writes it, one file per bucket."""
    return spark.createDataFrame(table).coalesce(1)


def rows_frame(spark: SparkSession, rows: Sequence[Sequence[object]], schema: pa.Schema) -> DataFrame:
    """Python rows (in the order of ``schema``'s fields) as a DataFrame read by the JVM alone."""
    columns = [[row[i] for row in rows] for i in range(len(schema))]
    return spark.createDataFrame(pa.table(columns, schema=schema))


#: Rows of a driver-side table per Spark partition (``spread_frame``): a small run's table
#: (``spark.INTERPRETED_RUN_BYTES`` of input, tens of thousands of records) stays one partition.
SPREAD_ROWS = 100_000


def spread_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A driver-side Arrow table of any size (a run's records parsed in this process,
    ``parse.parse_here``) in a partition per ``SPREAD_ROWS`` rows, at most one per core, so
    that every core decodes its share of the batches."""
    partitions = min(spark.sparkContext.defaultParallelism, -(-table.num_rows // SPREAD_ROWS))
    return spark.createDataFrame(table).coalesce(max(1, partitions))
