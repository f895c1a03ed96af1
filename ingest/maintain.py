"""``versiq maintain``: compaction and vacuum of one store, written through delta-spark.

- **Compaction** rewrites each bucket that has more than one file (or superseded rows) as one
  file with exactly the rows the read rule selects (``versiq.layout``), sorted by
  (key, valid_from), and drops history that no query can return any more: versions whose
  ``valid_to`` is at or before the horizon of their partition (docs/semantics.md, Retention edges:
  such history is never returned, and no later record can touch it, since any record at or
  before it is late). The rewrite is one Delta commit replacing the rewritten buckets
  (``replaceWhere`` on ``bucket``) and carrying the unchanged store state, so readers and
  later runs see the same store; old snapshots stay readable until vacuum.
- **Checkpoints** are Delta's: the connector writes one every 50 commits
  (``layout.TABLE_PROPERTIES``), so readers load the log quickly without a separate step.
- **Vacuum** deletes files removed longer ago than ``VACUUM_RETENTION_HOURS`` (1 hour = the
  default page-token lifetime of the service, so a token's pinned snapshot stays readable for
  its whole life; set ``VERSIQ_VACUUM_RETENTION_HOURS`` to keep old snapshots longer), and
  files no commit ever referenced (left by a killed ingest or maintain, or a failed write) once
  they are older than the same retention: Delta's VACUUM, in the store table and in each side
  table (``_rejected``, ``_changelog``, ``_emitted``), with the table's
  ``delta.deletedFileRetentionDuration`` set to the same retention (Delta spares unreferenced
  files younger than that setting). This never touches a file a writer may
  still commit: maintain holds the store's writer lock, so no ingest of the store is between
  writing its files and committing them, and the retention spares anything written in the last
  hour whatever its origin.

What to do is decided before any SparkSession starts (delta-rs lists the files, DuckDB resolves
the buckets to rewrite, delta-rs's dry-run vacuum lists what a vacuum would delete): a store
with nothing to compact or vacuum costs no JVM.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from versiq import layout, storage
from versiq.ingest.delta import commit_metadata, local_frame
from versiq.ingest.store import (
    SIDE_TABLES,
    StoreHandle,
    check_still_writer,
    existing_store_path,
    open_store,
    writer_lock,
)
from versiq.layout import (
    STORE_PARTITION_COLUMNS,
    STORE_SCHEMA,
    STORE_SORT,
    STREAM_KIND,
    StoreSettings,
    has_table,
    read_rule_sql,
)

log = logging.getLogger("versiq.maintain")

VACUUM_RETENTION_HOURS = float(os.environ.get("VERSIQ_VACUUM_RETENTION_HOURS", "1"))
COMPACT_FILES_PER_BUCKET = 4

#: Where maintain gets a SparkSession when it has work: the running job's, or a new one.
SparkFactory = Callable[[], SparkSession]


def _new_spark() -> SparkSession:
    from versiq.ingest.spark import get_spark

    return get_spark(app_name="versiq-maintain", short_lived=True)  # `versiq maintain`: one process, one run


def maintain_store(warehouse: str, store: str, lock_timeout_s: float = 60.0,
                   spark: SparkFactory = _new_spark) -> dict[str, Any]:
    path = existing_store_path(warehouse, store)
    with writer_lock(path, lock_timeout_s):
        table = storage.delta_table(path)
        handle = open_store(path, StoreSettings.from_description(table.metadata().description), set())
        plan = plan_compaction(handle)
        tables = [path] + [storage.join(path, side) for side in SIDE_TABLES if has_table(storage.join(path, side))]
        to_vacuum = {t: len(_vacuum_candidates(t)) for t in tables}
        result: dict[str, Any] = {"store": store, "buckets_rewritten": len(plan.buckets),
                                  "rows_before": plan.rows_before, "rows_after": plan.rows_after}
        if plan.stream:
            result.update(rows_before=None, rows_after=None, stream=True)
        if plan.buckets or any(to_vacuum.values()):
            session = spark()
            with commit_metadata(session, handle.state):
                if plan.buckets:
                    check_still_writer(path)
                    _rewrite(session, path, plan)
                for target, count in to_vacuum.items():
                    if count:
                        check_still_writer(path)
                        to_vacuum[target] = _vacuum(session, target)
        result.update(snapshot=storage.delta_table(path).version(), vacuumed_files=to_vacuum[path],
                      vacuumed_side_files=sum(n for t, n in to_vacuum.items() if t != path))
        log.info("store %s: compacted %d bucket(s) (%s rows -> %s), vacuumed %d file(s)", store, len(plan.buckets),
                 plan.rows_before, plan.rows_after, sum(to_vacuum.values()))
        return result


def _vacuum_candidates(path: str) -> list[str]:
    """The files a vacuum of the table at ``path`` would delete now (delta-rs, dry run)."""
    return list(storage.delta_table(path).vacuum(retention_hours=int(VACUUM_RETENTION_HOURS), dry_run=True,
                                        enforce_retention_duration=False, full=True))


def _vacuum(spark: SparkSession, path: str) -> int:
    """Delta's VACUUM of one table with versiq's retention; returns the files it deleted.

    Delta keeps files no commit references (a killed writer's) for the table's
    ``delta.deletedFileRetentionDuration`` (7 days by default) whatever retention VACUUM is
    given, so the table's setting is made versiq's retention first (a metadata-only commit,
    only when it differs)."""
    seconds = int(VACUUM_RETENTION_HOURS * 3600)
    wanted = f"interval {seconds} seconds"
    name = f"delta.`{path}`"
    if storage.delta_table(path).metadata().configuration.get("delta.deletedFileRetentionDuration") != wanted:
        spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.deletedFileRetentionDuration' = '{wanted}')")
    before = storage.files_under(path)
    spark.sql(f"VACUUM {name} RETAIN {VACUUM_RETENTION_HOURS} HOURS")
    return len(before - storage.files_under(path))


def compact_if_due(warehouse: str, store: str, lock_timeout_s: float, spark: SparkFactory = _new_spark
                   ) -> dict[str, Any] | None:
    """Compact when the store has accumulated several files per bucket (continuous mode)."""
    path = layout.table_path(warehouse, store)
    if not has_table(path):
        return None
    table = storage.delta_table(path)
    settings = StoreSettings.from_description(table.metadata().description)
    if len(table.file_uris()) <= COMPACT_FILES_PER_BUCKET * settings.buckets:
        return None
    return maintain_store(warehouse, store, lock_timeout_s, spark)


@dataclass
class CompactionPlan:
    """The buckets to rewrite and their new rows (with ``bucket``), resolved by DuckDB."""

    stream: bool = False
    buckets: list[int] = field(default_factory=list)
    rows: list[pa.Table] = field(default_factory=list)
    rows_before: int = 0
    rows_after: int = 0


def plan_compaction(handle: StoreHandle) -> CompactionPlan:
    """Every bucket with superseded or expired rows or several files, and its rows after, in
    the snapshot ``handle`` opened."""
    path, settings, state = handle.path, handle.settings, handle.state
    if settings.kind == STREAM_KIND:  # append-only: every record stays; vacuum only
        return CompactionPlan(stream=True)
    assert handle.table is not None  # an existing store (existing_store_path)
    plan = CompactionPlan()
    actions = pa.table(handle.table.get_add_actions(flatten=True)).to_pylist()
    by_bucket: dict[int, list[dict[str, Any]]] = {}
    for action in actions:
        by_bucket.setdefault(int(action["partition.bucket"]), []).append(action)
    horizon_sql = "NULL"
    if settings.kind == "versioned" and state.stream_time:
        cases = " ".join(f"WHEN {p} THEN {t - settings.history_retention_ms}"
                         for p, t in sorted(state.stream_time.items()))
        horizon_sql = f"CASE \"partition\" {cases} END"
    columns = ", ".join(f'"{f.name}"' for f in STORE_SCHEMA if f.name != "bucket")
    con = storage.duckdb_connect(path)
    try:
        for bucket, files in sorted(by_bucket.items()):
            full = [storage.data_file(path, f["path"]) for f in files]
            count = sum(int(f["num_records"]) for f in files)
            sql = (f"SELECT {columns} FROM read_parquet($files, hive_partitioning = false) "
                   + read_rule_sql(settings.kind))
            if settings.kind == "versioned":
                sql = (f"SELECT * FROM ({sql}) WHERE valid_to IS NULL OR {horizon_sql} IS NULL "
                       f"OR valid_to > {horizon_sql}")
            resolved = con.sql(f"SELECT {bucket}::INTEGER AS bucket, * FROM ({sql}) ORDER BY key, valid_from",
                               params={"files": full}).to_arrow_table()
            if len(files) == 1 and resolved.num_rows == count:
                continue
            plan.buckets.append(bucket)
            plan.rows.append(resolved)
            plan.rows_before += count
            plan.rows_after += resolved.num_rows
    finally:
        con.close()
    return plan


def _rewrite(spark: SparkSession, path: str, plan: CompactionPlan) -> None:
    """One commit replacing the planned buckets with their resolved rows."""
    rows = pa.concat_tables([t.cast(STORE_SCHEMA) for t in plan.rows])
    buckets = ", ".join(str(b) for b in plan.buckets)
    local_frame(spark, rows).sortWithinPartitions(*STORE_PARTITION_COLUMNS, *STORE_SORT).write.format("delta") \
        .mode("overwrite").option("replaceWhere", f"bucket IN ({buckets})").save(path)
