"""``versiq maintain``: compaction and vacuum of one store, written through delta-spark.

- **Compaction** rewrites each bucket that has more than one file (or superseded rows) as one
  file with exactly the rows the read rule selects (``versiq.layout``), sorted by
  (key, valid_from), and drops history that no query can return any more: versions whose
  ``valid_to`` is at or before the horizon of their partition (docs/semantics.md, Retention edges:
  such history is never returned, and no later record can touch it, since any record at or
  before it is late). DuckDB resolves the buckets' rows; the rewrite replaces the buckets
  (``replaceWhere`` on ``bucket``) in a commit marked as changing no data (``dataChange=false``):
  what a query returns is the same before and after, and old snapshots stay readable until
  vacuum. ``versiq maintain``'s commits (vacuum's too) carry the store's
  state, unchanged: it holds the store alone, and the newest commit keeps the state readable
  after Delta's log cleanup removed older commits. Continuous mode's carry none, since a run
  may commit between their plan and their commit: the state of a snapshot is the newest one
  committed at or before it (``layout.read_state``), the run's just before.
- **Continuous mode compacts the recent files only** (``compact_if_due``), so that its cost
  follows the data that arrived, not the store: once a store holds more than
  ``COMPACT_FILES_PER_BUCKET`` files per bucket, each bucket of several files has its files
  after its oldest one (the runs since a whole rewrite, or since its first run, wrote that
  file) merged into one by Delta's OPTIMIZE (files smaller than the oldest one, every row
  kept: exact whatever the files hold), and is only rewritten whole, with the horizon applied
  and superseded rows dropped, when those hold at least ``REWRITE_SHARE`` of the oldest file's
  rows. (Rewriting every bucket whole at every compaction made a steady flow into a large store
  rewrite the store every few runs; docs/benchmarks.md.)
- **Continuous mode compacts beside the runs** (``Compactor``), never between a record and its
  visibility. Delta commits a write that changes no data with snapshot isolation: a run's
  append that commits while a compaction is under way is kept by it, and a compaction never
  fails a run (a run only appends and reads the store through DuckDB, so its Delta write
  depends on no file a compaction removes). Inside the process a run and a compaction of the
  same store hold its writer lock together (``store.writer_lock``, ``RUN`` and ``COMPACTION``);
  any other writer (``versiq erase``, ``versiq drop``, another process) still waits for both,
  since an erase beside a rewrite would make one of them fail. A whole rewrite replaces its
  buckets as its own transaction sees them, which may hold files of runs that committed after
  the plan: it writes those runs' rows too, read by the write itself (``run`` after the planned
  state's, which Delta's file statistics prune to the new files), and the read rule over them
  and the planned rows is the read rule over the buckets. A compaction that
  meets a concurrent change of the table's settings gives way (Delta refuses it) and the next
  run tries again.
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
  ingest of the store is between writing its files and committing them but a small run of
  continuous mode beside its compaction (a large one waits for it: ``Compactor``), and the
  retention spares anything written in the last hour whatever its origin.

What to do is decided before any SparkSession starts (delta-rs lists the files, DuckDB resolves
the buckets to rewrite, delta-rs's dry-run vacuum lists what a vacuum would delete): a store
with nothing to compact or vacuum costs no JVM.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from versiq import layout, storage
from versiq import settings as registry
from versiq.ingest.delta import (
    DELETED_FILE_RETENTION,
    USER_METADATA_CONF,
    commit_metadata,
    deleted_file_retention,
)
from versiq.ingest.frames import local_frame
from versiq.ingest.side_by_side import WorkerSession, large_run_turn
from versiq.ingest.spark import plans_for_input, session_settings, small_run
from versiq.ingest.store import (
    COMPACTION,
    EXCLUSIVE,
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
#: The trade: a run reads every file of the buckets its keys are in (``store.existing_versions``,
#: about 0.1 ms a file), and a compaction, beside the runs, takes CPU from them for seconds
#: whatever it merges (its Spark jobs and Delta commits). A steady flow writes a file into every
#: bucket each run, so this is about how many runs pass between two compactions
#: (docs/benchmarks.md, "Continuous compaction every 16 files per bucket").
COMPACT_FILES_PER_BUCKET = 16
#: Continuous mode rewrites a bucket whole only when its recent files hold at least this share
#: of its oldest file's rows (module docstring): a bucket is rewritten whole about once per
#: quarter of its size that arrives, and its recent rows once per compaction until then.
REWRITE_SHARE = 0.25

#: Where maintain gets a SparkSession when it has work: the running job's, or a new one.
SparkFactory = Callable[[], SparkSession]
#: Delta's setting of the files OPTIMIZE merges: those smaller than it.
OPTIMIZE_MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"
#: Delta's check that the rows a ``replaceWhere`` writes match it: a whole rewrite writes rows
#: read from exactly those buckets, so the check (a scan of them) proves nothing.
REPLACE_WHERE_CHECK = "spark.databricks.delta.replaceWhere.constraintCheck.enabled"


def _new_spark() -> SparkSession:
    from versiq.ingest.spark import get_spark

    return get_spark(app_name="versiq-maintain", short_lived=True)  # `versiq maintain`: one process, one run


def maintain_store(warehouse: str, store: str, lock_timeout_s: float = 60.0,
                   spark: SparkFactory = _new_spark, recent_only: bool = False,
                   rewrite_share: float = REWRITE_SHARE) -> dict[str, Any]:
    """Compact and vacuum ``store``: every bucket (``versiq maintain``), or with ``recent_only``
    only buckets of several files, merging their recent files (``plan_compaction``).

    ``recent_only`` (continuous mode) holds the writer lock as a ``COMPACTION``: a run of the
    store in this process goes on beside it (module docstring); it leaves the table's
    properties as they are (a change of them would fail the run beside it), so its vacuum keeps
    files no commit references for Delta's default retention until ``versiq maintain`` sets
    versiq's."""
    path = existing_store_path(warehouse, store)
    with writer_lock(path, lock_timeout_s, COMPACTION if recent_only else EXCLUSIVE):
        table = storage.delta_table(path)
        handle = open_store(path, StoreSettings.from_description(table.metadata().description), set())
        started = time.monotonic()
        plan = plan_compaction(handle, recent_only=recent_only, rewrite_share=rewrite_share)
        tables = [path] + [storage.join(path, side) for side in SIDE_TABLES if has_table(storage.join(path, side))]
        to_vacuum = {t: len(_vacuum_candidates(t)) for t in tables}
        planned = time.monotonic()
        result: dict[str, Any] = {"store": store, "buckets_rewritten": len(plan.whole),
                                  "buckets_merged": len(plan.after_run),
                                  "rows_before": plan.rows_before, "rows_after": plan.rows_after}
        if plan.stream:
            result.update(rows_before=None, rows_after=None, stream=True)
        if plan.buckets or any(to_vacuum.values()):
            session = spark()
            # alone with the store, its commits carry the store's state (module docstring)
            with contextlib.nullcontext() if recent_only else commit_metadata(session, handle.state):
                if plan.buckets:
                    check_still_writer(path)
                    with plans_for_input(session, small_run(plan.input_bytes)):
                        _rewrite(session, path, plan, handle)
                for target, count in to_vacuum.items():
                    if count:
                        check_still_writer(path)
                        to_vacuum[target] = _vacuum(session, target, set_retention=not recent_only)
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


def _vacuum(spark: SparkSession, path: str, set_retention: bool = True) -> int:
    """Delta's VACUUM of one table with versiq's retention; returns the files it deleted.

    Delta keeps files no commit references (a killed writer's) for the table's
    ``delta.deletedFileRetentionDuration`` (7 days by default) whatever retention VACUUM is
    given, so the table's setting is made versiq's retention first when it differs (a
    metadata-only commit: a table created before versiq set it at creation, or under another
    retention). Without ``set_retention`` such a table is not vacuumed (0): continuous mode's
    compaction changes no property beside the runs, and the vacuum would delete little."""
    wanted = deleted_file_retention(VACUUM_RETENTION_HOURS)
    name = f"delta.`{path}`"
    if storage.delta_table(path).metadata().configuration.get(DELETED_FILE_RETENTION) != wanted:
        if not set_retention:
            return 0
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


#: Delta's refusals of a commit that conflicts with one made since its transaction began.
_GAVE_WAY = re.compile(r"\b(Concurrent\w+Exception|MetadataChangedException|ProtocolChangedException"
                       r"|DELTA_CONCURRENT_\w+|DELTA_METADATA_CHANGED|DELTA_PROTOCOL_CHANGED)\b")


class Compactor:
    """Continuous mode's compactions, on a thread beside the runs (module docstring).

    After a run, ``request(names)`` starts a pass over those stores and tables
    (``compact_if_due`` each) unless a pass is still under way (the next run asks
    again). The pass uses a Spark session of its own (``WorkerSession``, without the state a
    run's commits carry) and its own job group; it waits for the large runs of the process
    (``large_run_turn``), so only small runs share the cores with it. A failure is logged in
    one line by ``log_failure`` and the runs go on; one that comes from Spark stopping under it
    (``_spark_stopped``) is said in an INFO line and ends the pass. ``close`` cancels a pass
    under way and waits for it: a compaction cut short commits nothing, and a later vacuum
    removes its files."""

    JOB_GROUP = "versiq-compaction"

    def __init__(self, spark: Any, warehouse: str, lock_timeout_s: float,
                 log_failure: Callable[[str, Exception], None]) -> None:
        self._session = WorkerSession(spark)
        self._warehouse, self._lock_timeout_s, self._log_failure = warehouse, lock_timeout_s, log_failure
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def request(self, names: Iterable[str]) -> None:
        if self._closing.is_set() or (self._thread is not None and self._thread.is_alive()):
            return
        # a plain thread: nothing of the run that asks (its SQL execution, its job
        # group) is the compaction's; it sets its own job group
        self._thread = threading.Thread(target=self._pass, args=(list(names),), name="versiq-compaction",
                                        daemon=True)
        self._thread.start()

    def _pass(self, names: list[str]) -> None:
        session: SparkSession | None = None

        def spark() -> SparkSession:
            nonlocal session
            if session is None:
                session = self._session()
                session.conf.unset(USER_METADATA_CONF)  # made from a session a run may be committing with
                session.sparkContext.setJobGroup(self.JOB_GROUP, "continuous mode's compaction", True)
            return session

        for name in names:
            if self._closing.is_set():
                return
            try:
                with large_run_turn(small=False):
                    compact_if_due(self._warehouse, name, self._lock_timeout_s, spark)
            except Exception as exc:  # noqa: BLE001 - a compaction never stops the runs
                conflict = _GAVE_WAY.search(str(exc))
                if self._closing.is_set():
                    log.info("store %s: the compaction under way was cancelled: continuous mode is stopping", name)
                elif _spark_stopped():
                    log.info("store %s: the compaction under way ended with Spark, which is stopping (a compaction "
                             "cut short commits nothing)", name)
                    return
                elif conflict is not None:
                    log.info("store %s: the compaction gave way to a concurrent change of the table (%s); "
                             "the next run tries again", name, conflict.group(0))
                else:
                    self._log_failure(f"maintenance of {name} failed", exc)

    def close(self, timeout_s: float = 60.0) -> None:
        self._closing.set()
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is not None:
            try:
                context.cancelJobGroup(self.JOB_GROUP)
            except Exception:  # noqa: BLE001 - the JVM may be stopping with us
                log.debug("cancelling the compaction failed", exc_info=True)
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("the compaction under way did not end within %g s; stopping without it (a compaction "
                        "cut short commits nothing)", timeout_s)


def _spark_stopped() -> bool:
    """Whether this process's SparkContext is stopped (or its JVM gone). A signal to the whole
    process group (``kill`` of the group, systemd's stop) reaches the driver JVM too, whose
    shutdown hook stops Spark under a compaction in flight before continuous mode's own stop
    (``Compactor.close``) begins: that compaction's failure is the stop, not a fault."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return True
    try:
        return bool(context._jsc.sc().isStopped())  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - the JVM is gone
        return True


@dataclass
class CompactionPlan:
    """The buckets to compact (``plan_compaction``): ``after_run[b] = r``: bucket ``b``'s files
    of runs after ``r`` (its recent files) are merged, its oldest file staying as it is; the
    others (``whole``) are rewritten whole. Row counts as the planned snapshot holds them."""

    stream: bool = False
    buckets: list[int] = field(default_factory=list)
    #: The rows of the buckets rewritten whole (with ``bucket``), resolved by DuckDB.
    rows: list[pa.Table] = field(default_factory=list)
    rows_before: int = 0
    rows_after: int = 0
    after_run: dict[int, int] = field(default_factory=dict)
    #: The smallest oldest file of the buckets merged: only files smaller than it are merged.
    merge_below: int = 0
    #: The Parquet bytes of the files rewritten: a small compaction plans as a small run does.
    input_bytes: int = 0

    @property
    def whole(self) -> list[int]:
        return [b for b in self.buckets if b not in self.after_run]


def recent_files(files: list[dict[str, Any]], rewrite_share: float) -> tuple[int, list[dict[str, Any]]] | None:
    """For one bucket's add actions (with statistics): ``(r, recent)`` when only its ``recent``
    files need merging, all of whose rows have runs after ``r``, the greatest run of its oldest
    file (the one a whole rewrite wrote, or its first run's); None when the bucket is rewritten
    whole (module docstring, ``REWRITE_SHARE``)."""
    if any(f.get("min.run") is None or f.get("max.run") is None for f in files):
        return None  # no statistics: which file is the oldest cannot be told
    oldest = min(files, key=lambda f: (int(f["max.run"]), int(f["min.run"])))
    recent = [f for f in files if f is not oldest]
    last = int(oldest["max.run"])
    if any(int(f["min.run"]) <= last for f in recent):
        return None  # runs interleaved: no file is the bucket's base
    if sum(int(f["num_records"]) for f in recent) >= rewrite_share * int(oldest["num_records"]):
        return None
    return last, recent


def plan_compaction(handle: StoreHandle, recent_only: bool = False,
                    rewrite_share: float = REWRITE_SHARE) -> CompactionPlan:
    """Every bucket with superseded or expired rows or several files, and its row count after,
    in the snapshot ``handle`` opened; ``recent_only`` (continuous mode): only buckets of several
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
    merge_below: list[int] = []
    try:
        for bucket, files in sorted(by_bucket.items()):
            merge = recent_files(files, rewrite_share) if recent_only else None
            if merge is not None:
                last_run, recent = merge
                if len(recent) < 2:
                    continue  # one recent file: nothing to merge
                plan.after_run[bucket] = last_run
                merge_below.append(min(int(f["size_bytes"]) for f in files if not any(f is r for r in recent)))
                files = recent
                count = after = sum(int(f["num_records"]) for f in recent)  # OPTIMIZE keeps every row
            else:
                count = sum(int(f["num_records"]) for f in files)
                sql = f"SELECT {columns} FROM read_parquet($files, hive_partitioning = false) " \
                    + read_rule_sql(settings.kind)
                if settings.kind == "versioned":
                    sql = f"SELECT * FROM ({sql}) WHERE {answerable}"
                resolved = con.sql(f"SELECT {bucket}::INTEGER AS bucket, * FROM ({sql}) ORDER BY key, valid_from",
                                   params={"files": [f["file"] for f in files]}).to_arrow_table()
                after = resolved.num_rows
                if len(files) == 1 and after == count:
                    continue
                plan.rows.append(resolved)
            plan.buckets.append(bucket)
            plan.rows_before += count
            plan.rows_after += after
            plan.input_bytes += sum(int(f["size_bytes"]) for f in files)
    finally:
        con.close()
    plan.merge_below = min(merge_below, default=0)
    return plan


def _rewrite(spark: SparkSession, path: str, plan: CompactionPlan, handle: StoreHandle) -> None:
    """Compact the planned buckets, in commits that change no data (``dataChange=false``), which
    Delta makes beside the runs' appends (module docstring):

    - the merged buckets: Delta's OPTIMIZE of their files smaller than ``plan.merge_below``
      (their recent files; each bucket's oldest file is at least that large), every row kept;
    - the others: replaced (``replaceWhere`` on ``bucket``) by their rows as planned (read rule
      and retention horizon applied) and the rows of every run committed since the plan, read
      by this very write: the write replaces the buckets as its own transaction sees them, which
      holds those runs' files too. Runs that commit after its transaction began keep theirs."""
    from delta.tables import DeltaTable

    if plan.after_run:
        merged = ", ".join(str(b) for b in sorted(plan.after_run))
        with session_settings(spark, {OPTIMIZE_MIN_FILE_SIZE: str(plan.merge_below)}):
            DeltaTable.forPath(spark, path).optimize().where(f"bucket IN ({merged})").executeCompaction()
    if plan.whole:
        where = f"bucket IN ({', '.join(str(b) for b in plan.whole)})"
        planned = local_frame(spark, pa.concat_tables([t.cast(STORE_SCHEMA) for t in plan.rows]))
        since = spark.read.format("delta").load(path).where(f"({where}) AND run > {handle.state.run}")
        rows = planned.unionByName(since).sortWithinPartitions(*STORE_PARTITION_COLUMNS, *STORE_SORT)
        with session_settings(spark, {REPLACE_WHERE_CHECK: "false"}):
            rows.write.format("delta").mode("overwrite").option("replaceWhere", where) \
                .option("dataChange", "false").save(path)
