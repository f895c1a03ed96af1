"""``ingest.frames``: the driver's rows reach Spark as Arrow batches, which the JVM reads alone.
A frame of Python rows would need Python workers to unpickle them: the first job of a JVM that
reads one starts them (3.4 s in a one-shot run of 1M events parsed in the driver)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame

from versiq.ingest.frames import SPREAD_ROWS, local_frame, rows_frame, spread_frame

SCHEMA = pa.schema([("p", pa.int32()), ("name", pa.string()), ("n", pa.int64())])


def _lineage(frame: DataFrame) -> str:
    """The RDD lineage of the frame's plan, as Spark prints it."""
    return str(frame._jdf.queryExecution().toRdd().toDebugString())


def test_a_frame_of_python_rows_is_read_by_python_workers(spark):
    """The check of the tests below can fail: Spark's own frame of Python rows, even of none."""
    assert "PythonRDD" in _lineage(spark.createDataFrame([], "p int, name string, n bigint"))


@pytest.mark.parametrize("rows", [[], [(1, "a", 5), (2, None, None)]], ids=["empty", "two rows"])
def test_rows_frame_needs_no_python_worker(spark, rows):
    frame = rows_frame(spark, rows, SCHEMA)
    assert "PythonRDD" not in _lineage(frame)
    assert frame.schema.simpleString() == "struct<p:int,name:string,n:bigint>"
    assert sorted(tuple(r) for r in frame.collect()) == sorted(rows)


@pytest.mark.parametrize("rows", [0, 3, 3 * SPREAD_ROWS + 1])
def test_driver_tables_need_no_python_worker(spark, rows):
    """``local_frame`` (one partition) and ``spread_frame`` (a partition per ``SPREAD_ROWS`` rows, at
    most one per core), of no rows, a few, and more than the session has cores for."""
    table = pa.table({"p": pa.array(range(rows), pa.int32()), "name": pa.array([str(i) for i in range(rows)]),
                      "n": pa.array(range(rows), pa.int64())}, schema=SCHEMA)
    one, spread = local_frame(spark, table), spread_frame(spark, table)
    cores = spark.sparkContext.defaultParallelism
    assert one.rdd.getNumPartitions() == 1
    assert spread.rdd.getNumPartitions() == max(1, min(cores, -(-rows // SPREAD_ROWS)))
    for frame in (one, spread):
        assert "PythonRDD" not in _lineage(frame)
        assert frame.count() == rows
    assert spread.agg({"n": "sum"}).collect()[0][0] == (sum(range(rows)) if rows else None)
