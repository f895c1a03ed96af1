"""Whole buckets per Spark task, spread evenly: bucket ``b`` goes to task ``b mod tasks``.

The writer needs every row of a bucket in one task (one file per bucket and run). A plain
``repartition(tasks, "bucket")`` does that, but Spark places rows by a Murmur3 hash of the
bucket number, and 16 bucket numbers hashed into 16 tasks leave 6 tasks empty and 6 with two
buckets: on two cores that costs little, on a cluster it halves the parallelism of the key
window and the write. So rows are hash-partitioned by a ``slot`` number chosen per task such
that Spark's own hash sends it to that task (``tests/ingest/test_bucketing.py`` checks this against
Spark). Were Spark's hash ever to change, buckets would still never be split, only spread
less evenly.
"""

from __future__ import annotations

from functools import lru_cache

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

#: Spark's hash partitioning: Murmur3 x86 32-bit with this seed, then pmod by the task count.
SPARK_HASH_SEED = 42
_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``Murmur3Hash`` of one INT column (``Murmur3_x86_32.hashInt``), as a signed int."""
    k1 = _rotl((value & _MASK) * 0xCC9E2D51 & _MASK, 15) * 0x1B873593 & _MASK
    h1 = (_rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # fmix with the input length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


#: Records per write task (whole buckets per task, at most one task per bucket).
RECORDS_PER_TASK = 250_000


def write_tasks(buckets: int, records: int, cores: int = 1) -> int:
    """Spark tasks that write (and, for stores, decide) a run of ``records`` records: one per
    ``RECORDS_PER_TASK``, rounded up to a multiple of the session's ``cores`` so that the last
    wave of tasks keeps every core busy (1M records on two cores: 5 tasks of 3-4 buckets ran
    as waves of 2, 2 and 1, one core doing 10 of the 16 buckets; 6 tasks share them 8 and 8),
    and at most one per bucket."""
    tasks = records // RECORDS_PER_TASK + 1
    if tasks > 1:
        tasks = -(-tasks // cores) * cores
    return max(1, min(buckets, tasks))


@lru_cache(maxsize=64)
def task_slots(tasks: int) -> tuple[int, ...]:
    """``slots[t]``: the smallest non-negative INT that Spark's hash partitioning into ``tasks``
    partitions sends to partition ``t``."""
    slots: dict[int, int] = {}
    value = 0
    while len(slots) < tasks:
        slots.setdefault(spark_hash_int(value) % tasks, value)
        value += 1
    return tuple(slots[t] for t in range(tasks))


def slot_sql(bucket: str, tasks: int) -> str:
    """The ``slot`` of a row whose bucket is the SQL expression ``bucket`` (``by_bucket``)."""
    slots = ", ".join(str(v) for v in task_slots(tasks))
    return f"element_at(array({slots}), pmod({bucket}, {int(tasks)}) + 1)"


def by_bucket(frame: DataFrame, tasks: int) -> DataFrame:
    """``frame`` (with an int ``bucket`` column) in ``tasks`` partitions, bucket ``b`` in
    partition ``b mod tasks``, with the ``slot`` column it is hash-partitioned by (operators
    that must keep this partitioning, like a window, list ``slot`` among their keys)."""
    return by_slot(frame.withColumn("slot", F.expr(slot_sql("bucket", tasks))), tasks)


def by_slot(frame: DataFrame, tasks: int) -> DataFrame:
    """``frame`` (with the ``slot`` column of ``slot_sql``) in ``tasks`` partitions, as ``by_bucket``."""
    return frame.repartition(tasks, "slot")
