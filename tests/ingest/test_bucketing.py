"""``ingest.bucketing``: bucket b lands in Spark partition b mod tasks (checked against Spark's
own hash partitioning), so every task holds whole buckets and they are spread evenly."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from versiq.ingest.bucketing import by_bucket, spark_hash_int, task_slots, write_tasks


def test_python_hash_is_sparks(spark):
    values = [0, 1, 2, 15, 16, 255, 4096, 2**31 - 1, -1, -(2**31)]
    rows = spark.createDataFrame([(v,) for v in values], "v int").select("v", F.hash("v").alias("h")).collect()
    assert {r["v"]: r["h"] for r in rows} == {v: spark_hash_int(v) for v in values}


@pytest.mark.parametrize("tasks, buckets", [(1, 16), (5, 16), (16, 16), (7, 64), (64, 64)])
def test_each_bucket_lands_in_its_task(spark, tasks, buckets):
    assert len(set(task_slots(tasks))) == tasks
    frame = spark.range(buckets * 3).select((F.col("id") % buckets).cast("int").alias("bucket"))
    rows = by_bucket(frame, tasks).select("bucket", F.spark_partition_id().alias("task")).distinct().collect()
    assert sorted((r["bucket"], r["task"]) for r in rows) == [(b, b % tasks) for b in range(buckets)]


@pytest.mark.parametrize("buckets, records, cores, tasks", [
    (16, 0, 2, 1), (16, 249_999, 2, 1),  # a small run: one task
    (16, 250_000, 2, 2), (16, 1_000_000, 2, 6), (16, 1_000_000, 1, 5), (16, 1_000_000, 4, 8),
    (16, 10_000_000, 2, 16), (4, 1_000_000, 3, 4),  # at most one task per bucket
])
def test_write_tasks_fill_every_core_in_each_wave(buckets, records, cores, tasks):
    """A task per 250,000 records, rounded up to a multiple of the cores (1M records on two
    cores: 6 tasks, not 5 run as waves of 2, 2 and 1), at most one per bucket."""
    assert write_tasks(buckets, records, cores) == tasks
