"""``versiq maintain``: compaction and vacuum of one store, written through delta-spark.

- **Compaction** rewrites each bucket that has more than one file (or superseded rows) as one
  file with exactly the rows the read rule selects (``versiq.layout``), sorted by
  (key, valid_from), and drops history that no query can return any more: versions whose
  ``valid_to`` is at or before the horizon of their partition (docs/semantics.md, Retention edges:
  such history is never returned, and no later record can touch it, since any record at or
  before it is late). The rewrite is one Delta commit replacing the rewritten buckets
  (``replaceWhere`` on ``bucket``) and carrying the unchanged store state, so readers and
  later runs see the same store; old snapshots stay readable until vacuum.
- **Continuous mode compacts the recent files only** (``compact_if_due``), so that its cost
  follows the data that arrived, not the store: once a store holds more than
  ``COMPACT_FILES_PER_BUCKET`` files per bucket, each bucket of several files has its files
  after its oldest one (the runs since a whole rewrite, or since its first run, wrote that
  file) merged into one, and is only rewritten whole, with the horizon applied, when those
  hold at least ``REWRITE_SHARE`` of the oldest file's rows. (Before, every compaction resolved
  every bucket of the store with DuckDB and rewrote each bucket of several files whole: a steady
  flow into a large store rewrote the store every few micro-batches; measured at 10M versions,
  10.3 s against 2.0 s for the merge, docs/benchmarks.md.) A merge is exact because the read
  rule picks the greatest ``run`` per (key, valid_from) (per key for timestamped stores), and
  every row of the merged files has a greater run than any row of the oldest file (checked on
  Delta's file statistics; else the bucket is rewritten whole): the rows the merge drops are
  superseded by rows it keeps. It keeps expired history, though: such a row may be what hides
  an older row of the oldest file from the read rule. The commit replaces exactly those rows
  (``replaceWhere "bucket = b AND run > r"``, which Delta carries out as a delete of the
  matching rows: the oldest file, none of whose rows match, is not rewritten; measured, the
  commit's ``numCopiedRows`` is 0). One commit may merge some buckets and rewrite others whole.
  A merge still grows with the recent rows of its bucket, up to a quarter of the oldest file; a
  compaction in tiers would bound it further, at the price of more files between compactions.
- **Checkpoints** are Delta's: the connector writes one every 50 commits
  (``layout.TABLE_PROPERTIES``), so readers load the log quickly without a separate step.
- **Vacuum** deletes files removed longer ago than ``VACUUM_RETENTION_HOURS`` (1 hour = the
  default page-token lifetime of the service, so a token's pinned snapshot stays readable for
  its whole life; set ``VERSIQ_VACUUM_RETENTION_HOURS`` to keep old snapshots longer), and
  files no commit ever referenced (left by a killed ingest or maintain, or a failed write) once
  they are older than the same retention: Delta's VACUUM, in the store table and in each side
  table (``_rejected``, ``_changelog``, ``_emitted``), with the table's
  ``delta.deletedFileRetentionDuration`` the same retention (Delta spares unreferenced files
  younger than that setting; a table gets it when it is created, ``delta._properties``). This
  never touches a file a writer may still commit: maintain holds the store's writer lock, so no
  ingest of the store is between writing its files and committing them, and the retention
  spares anything written in the last hour whatever its origin.

What to do is decided before any SparkSession starts (delta-rs lists the files, DuckDB resolves
the buckets to rewrite, delta-rs's dry-run vacuum lists what a vacuum would delete): a store
with nothing to compact or vacuum costs no JVM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from versiq import layout, storage
from versiq import settings as registry
from versiq.ingest.delta import DELETED_FILE_RETENTION, commit_metadata, deleted_file_retention
from versiq.ingest.frames import local_frame
from versiq.ingest.spark import plans_for_input, small_run
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
    answerable_sql,
    has_table,
    read_rule_sql,
)

log = logging.getLogger("versiq.maintain")

VACUUM_RETENTION_HOURS = registry.VACUUM_RETENTION_HOURS.value()
#: Continuous mode compacts a table holding more than this many files per bucket on average.
#: Measured with a Kafka topic at 1,000 records/s (every run writes into every bucket): at 4 it
#: compacted every ~5 micro-batches (7 of 36 commits in 90 s) and records were visible after
#: p50 4.0 s; at 8, 4 of 38 commits and p50 3.3-3.9 s (docs/benchmarks.md, 2026-11-26 midday).
COMPACT_FILES_PER_BUCKET = 8
#: Continuous mode rewrites a bucket whole only when its recent files hold at least this share
#: of its oldest file's rows (module docstring): a bucket is rewritten whole about once per
#: quarter of its size that arrives, and its recent rows once per compaction until then.
REWRITE_SHARE = 0.25

#: Where maintain gets a SparkSession when it has work: the running job's, or a new one.
SparkFactory = Callable[[], SparkSession]


def _new_spark() -> SparkSession:
    from versiq.ingest.spark import get_spark

    return get_spark(app_name="versiq-maintain", short_lived=True)  # `versiq maintain`: one process, one run


def maintain_store(warehouse: str, store: str, lock_timeout_s: float = 60.0,
                   spark: SparkFactory = _new_spark, recent_only: bool = False,
                   rewrite_share: float = REWRITE_SHARE) -> dict[str, Any]:
    """Compact and vacuum ``store``: every bucket (``versiq maintain``), or with ``recent_only``
    only buckets of several files, merging their recent files (``plan_compaction``)."""
    path = existing_store_path(warehouse, store)
    with writer_lock(path, lock_timeout_s):
        table = storage.delta_table(path)
        handle = open_store(path, StoreSettings.from_description(table.metadata().description), set())
        started = time.monotonic()
        plan = plan_compaction(handle, recent_only=recent_only, rewrite_share=rewrite_share)
        tables = [path] + [storage.join(path, side) for side in SIDE_TABLES if has_table(storage.join(path, side))]
        to_vacuum = {t: len(_vacuum_candidates(t)) for t in tables}
        planned = time.monotonic()
        result: dict[str, Any] = {"store": store, "buckets_rewritten": len(plan.buckets) - len(plan.after_run),
                                  "buckets_merged": len(plan.after_run),
                                  "rows_before": plan.rows_before, "rows_after": plan.rows_after}
        if plan.stream:
            result.update(rows_before=None, rows_after=None, stream=True)
        if plan.buckets or any(to_vacuum.values()):
            session = spark()
            with commit_metadata(session, handle.state):
                if plan.buckets:
                    check_still_writer(path)
                    with plans_for_input(session, small_run(plan.input_bytes)):
                        _rewrite(session, path, plan)
                for target, count in to_vacuum.items():
                    if count:
                        check_still_writer(path)
                        to_vacuum[target] = _vacuum(session, target)
        result.update(snapshot=storage.delta_table(path).version(), vacuumed_files=to_vacuum[path],
                      vacuumed_side_files=sum(n for t, n in to_vacuum.items() if t != path))
        log.info("store %s: compacted %d bucket(s) (%d whole; %s rows -> %s), vacuumed %d file(s) "
                 "(planned in %.2f s, written in %.2f s)", store, len(plan.buckets), result["buckets_rewritten"],
                 plan.rows_before, plan.rows_after, sum(to_vacuum.values()), planned - started,
                 time.monotonic() - planned)
        return result


def _vacuum_candidates(path: str) -> list[str]:
    """The files a vacuum of the table at ``path`` would delete now (delta-rs, dry run)."""
    return list(storage.delta_table(path).vacuum(retention_hours=int(VACUUM_RETENTION_HOURS), dry_run=True,
                                        enforce_retention_duration=False, full=True))


def _vacuum(spark: SparkSession, path: str) -> int:
    """Delta's VACUUM of one table with versiq's retention; returns the files it deleted.

    Delta keeps files no commit references (a killed writer's) for the table's
    ``delta.deletedFileRetentionDuration`` (7 days by default) whatever retention VACUUM is
    given, so the table's setting is made versiq's retention first when it differs (a
    metadata-only commit: a table created before versiq set it at creation, or under another
    retention)."""
    wanted = deleted_file_retention(VACUUM_RETENTION_HOURS)
    name = f"delta.`{path}`"
    if storage.delta_table(path).metadata().configuration.get(DELETED_FILE_RETENTION) != wanted:
        spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('{DELETED_FILE_RETENTION}' = '{wanted}')")
    before = storage.files_under(path)
    spark.sql(f"VACUUM {name} RETAIN {VACUUM_RETENTION_HOURS} HOURS")
    return len(before - storage.files_under(path))


def compact_if_due(warehouse: str, store: str, lock_timeout_s: float, spark: SparkFactory = _new_spark
                   ) -> dict[str, Any] | None:
    """Compact the recent files of each bucket when the store has accumulated more than
    ``COMPACT_FILES_PER_BUCKET`` files per bucket (continuous mode; module docstring)."""
    path = layout.table_path(warehouse, store)
    if not has_table(path):
        return None
    table = storage.delta_table(path)
    settings = StoreSettings.from_description(table.metadata().description)
    if len(table.file_uris()) <= COMPACT_FILES_PER_BUCKET * settings.buckets:
        return None
    return maintain_store(warehouse, store, lock_timeout_s, spark, recent_only=True)


@dataclass
class CompactionPlan:
    """The buckets to rewrite and their new rows (with ``bucket``), resolved by DuckDB;
    ``after_run[b] = r``: bucket ``b`` replaces only its rows of runs after ``r`` (a merge of its
    recent files), the others are replaced whole."""

    stream: bool = False
    buckets: list[int] = field(default_factory=list)
    rows: list[pa.Table] = field(default_factory=list)
    rows_before: int = 0
    rows_after: int = 0
    after_run: dict[int, int] = field(default_factory=dict)
    #: The Parquet bytes of the files rewritten: a small compaction plans as a small run does.
    input_bytes: int = 0

    def replace_where(self) -> str:
        """The rows the rewrite replaces (Delta's ``replaceWhere``)."""
        whole = [b for b in self.buckets if b not in self.after_run]
        terms = [f"bucket IN ({', '.join(str(b) for b in whole)})"] if whole else []
        terms += [f"(bucket = {b} AND run > {r})" for b, r in sorted(self.after_run.items())]
        return " OR ".join(terms)


def recent_files(files: list[dict[str, Any]], rewrite_share: float) -> tuple[int, list[dict[str, Any]]] | None:
    """For one bucket's add actions (with statistics): ``(r, recent)`` when only its ``recent``
    files need merging, all of whose rows have runs after ``r``, the greatest run of its oldest
    file (the one a whole rewrite wrote, or its first run's); None when the bucket is rewritten
    whole (module docstring, ``REWRITE_SHARE``)."""
    if any(f.get("min.run") is None or f.get("max.run") is None for f in files):
        return None  # no statistics: whether a merge is exact cannot be told
    oldest = min(files, key=lambda f: (int(f["max.run"]), int(f["min.run"])))
    recent = [f for f in files if f is not oldest]
    last = int(oldest["max.run"])
    if any(int(f["min.run"]) <= last for f in recent):
        return None  # runs interleaved: a merge might not be exact
    if sum(int(f["num_records"]) for f in recent) >= rewrite_share * int(oldest["num_records"]):
        return None
    return last, recent


def plan_compaction(handle: StoreHandle, recent_only: bool = False,
                    rewrite_share: float = REWRITE_SHARE) -> CompactionPlan:
    """Every bucket with superseded or expired rows or several files, and its rows after, in
    the snapshot ``handle`` opened; ``recent_only`` (continuous mode): only buckets of several
    files, most of them by a merge of their recent files (``recent_files``)."""
    path, settings, state = handle.path, handle.settings, handle.state
    if settings.kind == STREAM_KIND:  # append-only: every record stays; vacuum only
        return CompactionPlan(stream=True)
    assert handle.table is not None  # an existing store (existing_store_path)
    plan = CompactionPlan()
    by_bucket = layout.bucket_files(handle.table, path, ("num_records", "size_bytes", "min.run", "max.run"))
    if recent_only:
        by_bucket = {b: files for b, files in by_bucket.items() if len(files) > 1}
    answerable = answerable_sql(state.stream_time, settings.history_retention_ms)
    columns = ", ".join(f'"{f.name}"' for f in STORE_SCHEMA if f.name != "bucket")
    con = storage.duckdb_connect(path)
    try:
        for bucket, files in sorted(by_bucket.items()):
            merge = recent_files(files, rewrite_share) if recent_only else None
            if merge is not None:
                files = merge[1]
                if len(files) < 2:
                    continue  # one recent file: nothing to merge
            full = [f["file"] for f in files]
            count = sum(int(f["num_records"]) for f in files)
            sql = (f"SELECT {columns} FROM read_parquet($files, hive_partitioning = false) "
                   + read_rule_sql(settings.kind))
            if settings.kind == "versioned" and merge is None:
                sql = f"SELECT * FROM ({sql}) WHERE {answerable}"
            resolved = con.sql(f"SELECT {bucket}::INTEGER AS bucket, * FROM ({sql}) ORDER BY key, valid_from",
                               params={"files": full}).to_arrow_table()
            if len(files) == 1 and resolved.num_rows == count:
                continue
            if merge is not None:
                plan.after_run[bucket] = merge[0]
            plan.buckets.append(bucket)
            plan.rows.append(resolved)
            plan.rows_before += count
            plan.input_bytes += sum(int(f["size_bytes"]) for f in files)
            plan.rows_after += resolved.num_rows
    finally:
        con.close()
    return plan


def _rewrite(spark: SparkSession, path: str, plan: CompactionPlan) -> None:
    """One commit replacing the planned buckets (or their recent rows) with their resolved rows."""
    rows = pa.concat_tables([t.cast(STORE_SCHEMA) for t in plan.rows])
    local_frame(spark, rows).sortWithinPartitions(*STORE_PARTITION_COLUMNS, *STORE_SORT).write.format("delta") \
        .mode("overwrite").option("replaceWhere", plan.replace_where()).save(path)
