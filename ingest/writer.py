"""Executor-side Parquet writing: Spark tasks write files and return their Delta add actions.

``write_files`` runs ``mapInArrow`` over rows already partitioned and sorted by the caller;
each task writes one file per bucket it holds (or one file for the unpartitioned
``_rejected`` table) and yields one small row per file describing it (path, size, full stats).
The driver collects those rows and commits them in one delta-rs transaction.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

FILE_INFO_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string()),
        pa.field("size", pa.int64()),
        pa.field("bucket", pa.int32()),
        pa.field("bucket_min", pa.int32()),
        pa.field("bucket_max", pa.int32()),
        pa.field("modification_time", pa.int64()),
        pa.field("stats", pa.string()),
    ]
)
FILE_INFO_DDL = (
    "path string, size long, bucket int, bucket_min int, bucket_max int, "
    "modification_time long, stats string"
)
ROW_GROUP_ROWS = 4096


def _json_scalar(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def file_stats(table: pa.Table) -> str:
    """Delta add-action stats: numRecords, minValues, maxValues, nullCount for every column."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in table.column_names:
        column = table.column(name)
        nulls[name] = column.null_count
        if pa.types.is_boolean(column.type) or column.null_count == len(column):
            continue
        if pa.types.is_string(column.type):
            # Delta truncates long string stats; keep them exact but bounded (32 chars prefix is
            # only valid for min; skip long max values rather than store a wrong bound).
            lo, hi = pc.min_max(column).values()
            lo_s, hi_s = lo.as_py(), hi.as_py()
            if len(lo_s) <= 256:
                mins[name] = lo_s
            if len(hi_s) <= 256:
                maxs[name] = hi_s
            continue
        lo, hi = pc.min_max(column).values()
        mins[name] = _json_scalar(lo.as_py())
        maxs[name] = _json_scalar(hi.as_py())
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


def _write_one(table: pa.Table, root: str, rel_dir: str, run: int) -> tuple[str, int, int, str]:
    name = f"run-{run:08d}-{uuid.uuid4().hex}.parquet"
    rel = f"{rel_dir}/{name}" if rel_dir else name
    full = os.path.join(root, rel)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    tmp = full + ".tmp"
    pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS, compression="zstd",
                   write_statistics=True)
    os.replace(tmp, full)
    return rel, os.path.getsize(full), int(time.time() * 1000), file_stats(table)


STORE_SORT = ("key", "valid_from", "run")
STREAM_SORT = ("key", "timestamp", "run", "seq")


def make_store_writer(root: str, run: int, file_schema: pa.Schema,  # type: ignore[no-untyped-def]
                      sort: tuple[str, ...] = STORE_SORT):
    """mapInArrow function writing store rows (with a ``bucket`` column) one file per bucket,
    each file sorted by ``sort`` (a key's rows together)."""
    file_columns = file_schema.names
    sort_keys = [(name, "ascending") for name in sort]

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending: dict[int, list[pa.RecordBatch]] = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            buckets = batch.column(batch.schema.get_field_index("bucket"))
            for bucket in pc.unique(buckets).to_pylist():
                mask = pc.equal(buckets, pa.scalar(bucket, pa.int32()))
                pending.setdefault(bucket, []).append(batch.filter(mask))
        infos: dict[str, list[Any]] = {name: [] for name in FILE_INFO_SCHEMA.names}
        for bucket, parts in sorted(pending.items()):
            table = pa.Table.from_batches(parts)
            bucket_col = table.column("bucket")
            lo, hi = pc.min_max(bucket_col).values()
            data = table.select(file_columns).cast(file_schema)
            data = data.sort_by(sort_keys)
            rel, size, mtime, stats = _write_one(data, root, f"bucket={bucket}", run)
            for name, value in (("path", rel), ("size", size), ("bucket", bucket),
                                ("bucket_min", lo.as_py()), ("bucket_max", hi.as_py()),
                                ("modification_time", mtime), ("stats", stats)):
                infos[name].append(value)
        yield pa.RecordBatch.from_pydict(infos, schema=FILE_INFO_SCHEMA)

    return write


def make_plain_writer(root: str, run: int, schema: pa.Schema):  # type: ignore[no-untyped-def]
    """mapInArrow function writing all rows of a task into one unpartitioned file."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = [b for b in batches if b.num_rows]
        infos: dict[str, list[Any]] = {name: [] for name in FILE_INFO_SCHEMA.names}
        if parts:
            table = pa.Table.from_batches(parts).select(schema.names).cast(schema)
            rel, size, mtime, stats = _write_one(table, root, "", run)
            for name, value in (("path", rel), ("size", size), ("bucket", None), ("bucket_min", None),
                                ("bucket_max", None), ("modification_time", mtime), ("stats", stats)):
                infos[name].append(value)
        yield pa.RecordBatch.from_pydict(infos, schema=FILE_INFO_SCHEMA)

    return write


def collect_adds(infos: DataFrame) -> list[dict[str, Any]]:
    """Run the write job and turn its file descriptions into add-action dicts."""
    return adds_from_rows(infos.collect())


def write_local(writer: Any, table: pa.Table) -> list[dict[str, Any]]:
    """Run a writer made by ``make_store_writer``/``make_plain_writer`` in this process (the
    driver-side derived-table writes): same files, same stats, same add actions."""
    if table.num_rows == 0:
        return []
    infos = pa.Table.from_batches(list(writer(iter(table.to_batches()))), schema=FILE_INFO_SCHEMA)
    return adds_from_rows(infos.to_pylist())


def adds_from_rows(rows: Any) -> list[dict[str, Any]]:
    adds = []
    for row in rows:
        partition_values = {} if row["bucket"] is None else {"bucket": str(row["bucket"])}
        adds.append(
            {
                "path": row["path"],
                "size": row["size"],
                "partition_values": partition_values,
                "modification_time": row["modification_time"],
                "stats": row["stats"],
                "bucket_min": row["bucket_min"],
                "bucket_max": row["bucket_max"],
            }
        )
    return adds
