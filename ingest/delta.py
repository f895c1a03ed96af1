"""Every Delta commit the ingest job makes goes through Delta's own Spark connector (delta-spark).

Two kinds of write, each one Delta commit:

- ``commit_table``: a run of a store, stream or derived table. The rows are appended with the
  Delta transaction ``(txnAppId="versiq.ingest", txnVersion=run)``, so a rerun of a run that
  already committed is skipped by Delta itself, and with the table's ``StoreState`` as the
  commit's ``userMetadata``: data and state are one atomic commit. The first run creates the
  table (CREATE TABLE AS SELECT: its first commit holds the data, the settings ``description``
  and ``TABLE_PROPERTIES``).
- ``replace_runs``: a run's rows of its side tables (``_rejected``, ``_changelog``, ``_emitted``),
  written *before* the run's table commit as "replace every row of run >= R" (Delta's
  ``replaceWhere``). A crash between the two leaves side rows of a run the table never
  committed; readers ignore rows of runs after the table's committed run (``layout``), and the
  rerun, which is run R again, replaces them. No file is ever committed by hand. A run's
  side tables are committed at once (a thread each), the table's commit after all of them; a
  side table with nothing of the run and nothing of an unfinished attempt gets no commit.
- ``erase_matching``: ``versiq erase`` removing keys' rows from a table (Delta's MERGE with an
  unconditional delete, under the transaction ``versiq.erase``); ``append_rows``: its audit row.

Rows are laid out by Spark: the caller hands a DataFrame partitioned as it wants the files cut
(whole buckets per task); ``commit_table`` sorts each task's rows by the partition column and
the table's sort columns, which is also the order Delta's writer needs to write one file per
bucket per task. Delta collects the statistics (only of the columns readers prune with,
``layout.DELTA_STATS_COLUMNS``), enforces the table's schema on every append and writes checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark import InheritableThread
from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type

from versiq import settings as registry
from versiq import storage
from versiq.ingest.spark import active_on_this_thread
from versiq.ingest.sqltext import sql_string
from versiq.layout import (
    APP_ID,
    DELTA_STATS_COLUMNS,
    ERASE_APP_ID,
    STATE_APP_ID,
    STORE_PARTITION_COLUMNS,
    TABLE_PROPERTIES,
    StoreState,
    has_delta_log,
)

log = logging.getLogger("versiq.ingest")

#: Session setting Delta copies into the ``userMetadata`` of every commit made while it is set.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


#: Delta's setting that drops a commit without actions (``commit_metadata`` turns it off).
RECORD_EMPTY_COMMITS_CONF = "spark.databricks.delta.skipRecordingEmptyCommits"


@contextlib.contextmanager
def commit_metadata(spark: SparkSession, state: StoreState) -> Iterator[None]:
    """Every Delta commit made inside the block carries ``state`` (a run's, ``versiq maintain``'s:
    ``layout.read_state`` takes the newest one at or before a snapshot).

    Adaptive query execution is off inside the block: with it, Delta's write of a run (the
    run's decisions, already partitioned by bucket, then the write) re-plans around every
    stage and costs about 0.5 s more per commit, a third of a small run's commit (measured:
    ``bench/write_paths.py``); the partitioning is versiq's own (``bucketing``), so AQE has
    nothing to improve there.

    Empty commits are recorded inside the block (``skipRecordingEmptyCommits`` off): a run's
    append of no rows (every record late, a derived table its inputs did not change) is still a
    commit, carrying the run's state, and so needs no transaction id to count
    (``run_txn_needed``); Delta would drop it as empty otherwise."""
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set(USER_METADATA_CONF, state.to_json())
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    spark.conf.set(RECORD_EMPTY_COMMITS_CONF, "false")
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA_CONF)
        spark.conf.unset(RECORD_EMPTY_COMMITS_CONF)
        spark.conf.set("spark.sql.adaptive.enabled", adaptive or "true")


#: Delta's table property bounding how long it keeps a file no commit references, whatever
#: retention its VACUUM is given (7 days when unset).
DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"


def deleted_file_retention(hours: float) -> str:
    """``DELETED_FILE_RETENTION``'s value for a vacuum retention of ``hours``."""
    return f"interval {int(hours * 3600)} seconds"


def _properties(schema: pa.Schema) -> dict[str, str]:
    """A new table's properties: ``TABLE_PROPERTIES``, the statistics columns of its schema, and
    versiq's vacuum retention (``VERSIQ_VACUUM_RETENTION_HOURS``) as Delta's deleted-file
    retention, so that its first vacuum needs no commit to set it (``maintain._vacuum``)."""
    columns = [name for name in DELTA_STATS_COLUMNS if name in schema.names]
    return {**TABLE_PROPERTIES, "delta.dataSkippingStatsColumns": ",".join(columns),
            DELETED_FILE_RETENTION: deleted_file_retention(registry.VACUUM_RETENTION_HOURS.value())}


def _conform(frame: DataFrame, schema: pa.Schema) -> DataFrame:
    """``frame`` with exactly the table's columns, in order, cast to its types."""
    return frame.selectExpr(*(f"CAST(`{f.name}` AS {from_arrow_type(f.type).simpleString()}) AS `{f.name}`"
                              for f in schema))


def run_txn_needed(path: str) -> bool:
    """Whether a run's append to the table at ``path`` carries Delta's transaction id (app
    ``versiq.ingest``, version = run).

    A run commits at most once without it: the writer lock is held for the whole run, and the
    run starts from the state of the table's newest commit, so a rerun after a crash, or the
    next writer, starts after the committed run. On local disk that is the whole story:
    ``flock`` is released only when its process ends, and the next writer ends that process's
    JVM (which makes the commits, and can outlive it) before it reads the state
    (``versiq.ingest.holder``), so two writers never overlap. On S3 the
    lock is a lease, which a paused holder can lose without knowing (``versiq.ingest.lease``):
    there the id is the fence, Delta refusing a second commit of the run. An append of no rows
    needs none either: empty commits are recorded (``commit_metadata``), so the run's state is
    committed all the same.

    Not everywhere, because delta-spark (4.4) answers "did this id commit?" from the snapshot's
    computed state, a Spark job over the whole log (``Delta: Compute snapshot``) in every
    commit: about 0.4 s of a one-record run, and of every derived table's run with no change,
    which took 0.39 s against 0.20 s for one with rows (docs/benchmarks.md), for what the lock
    gives."""
    return storage.is_s3(path)


def commit_table(frame: DataFrame, path: str, schema: pa.Schema, *, run: int, state: StoreState,
                 description: str, sort: tuple[str, ...], create: bool, new_run: bool = True) -> None:
    """Append a run's rows to the table at ``path`` with its state, in one commit, at most once
    per run (``run_txn_needed``). ``create``: the run found no table there (``layout.has_table``:
    no ``_delta_log``, or one without a commit, which a process killed inside the table's first
    commit leaves), so this commit creates it, partitioned and with its properties; an append
    would create it too, but without either.
    ``new_run=False``: a state-only commit between runs, under the transaction id
    ``STATE_APP_ID``, which marks it as one (``query.history``: ``settings``, not a run);
    ``versiq.ingest`` would make Delta skip it as the run already committed."""
    spark = frame.sparkSession
    rows = _conform(frame, schema).sortWithinPartitions(*STORE_PARTITION_COLUMNS, *sort)
    with commit_metadata(spark, state):
        if create:
            writer = rows.writeTo(f"delta.`{path}`").using("delta").tableProperty("comment", description)
            for name, value in _properties(schema).items():
                writer = writer.tableProperty(name, value)
            writer = writer.partitionedBy(*(F.col(name) for name in STORE_PARTITION_COLUMNS))
            # "or replace" only because the directory is not empty (its side tables are
            # written first, and a killed first commit may have left a log without a commit);
            # there is no table to replace: the caller holds the writer lock and found none.
            writer.option("txnAppId", APP_ID).option("txnVersion", str(run)).createOrReplace()
        elif new_run:
            append = rows.write.format("delta").mode("append")
            if run_txn_needed(path):
                append = append.option("txnAppId", APP_ID).option("txnVersion", str(run))
            append.save(path)
        else:  # a state-only commit: its own transaction marks it (query.history: "settings")
            rows.write.format("delta").mode("append").option("txnAppId", STATE_APP_ID) \
                .option("txnVersion", str(storage.delta_table(path).version() + 1)).save(path)


class StateAhead:
    """Has Delta compute the state of tables' newest snapshots in the background, between
    runs, rather than in the next run's commit (continuous mode, tables on S3).

    A run on S3 commits with a Delta transaction id (``run_txn_needed``), and delta-spark (4.4)
    answers "which version of this id committed?" from the snapshot's computed state: a Spark
    job over the whole log (``Delta: Compute snapshot for version``), run once per table
    version, even when a ``.crc`` file holds the answer. In a small run that job and its
    setup were about a quarter of the run (``bench/freshness_bench.py``: a one-record run
    3.9-4.1 s -> 3.1-3.2 s on a slow day; docs/benchmarks.md). ``start`` is called after a
    run's commits and maintenance, when the data is already visible; the computation
    runs in a thread so that a file landing meanwhile starts its run at once. Delta computes a
    snapshot's state once (a lazy value): a commit that comes while it is still running waits
    for it instead of computing it twice. (Computed inside each run, beside its own jobs, it
    slowed them about as much on two cores.) Best effort: a failure is logged, and the next
    commit computes the state itself."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._thread: InheritableThread | None = None

    def start(self, paths: list[str]) -> None:
        """Compute the state of the tables at ``paths`` (the path strings their commits use)."""
        self.wait()
        if paths:
            self._thread = InheritableThread(target=self._compute, args=(paths,), name="versiq-delta-state",
                                             daemon=True)
            self._thread.start()

    def wait(self) -> None:
        """Until the computation started last has ended (before the session stops)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _compute(self, paths: list[str]) -> None:
        from delta.tables import DeltaTable

        # A group of its own: the thread would inherit the run's, whose cancellation (the
        # resident driver's) would fail it needlessly.
        self.spark.sparkContext.setJobGroup("versiq-delta-state", "Delta state ahead of the next commit")
        for path in paths:
            if not has_delta_log(path):
                continue
            try:
                DeltaTable.forPath(self.spark, path).detail().collect()
            except Exception:  # noqa: BLE001 - an optimisation only; the next commit does it again
                log.warning("computing the Delta state of %s ahead of its next commit failed", path, exc_info=True)


def set_description(spark: SparkSession, path: str, description: str, state: StoreState) -> None:
    """Change the table's settings (its Delta ``description``) in a commit of its own, which
    carries the unchanged ``state`` like every commit (``commit_metadata``)."""
    with commit_metadata(spark, state):
        spark.sql(f"COMMENT ON TABLE delta.`{path}` IS {sql_string(description)}")


def _has_run(path: str, run: int) -> bool:
    """Whether the side table at ``path`` holds rows of run ``run`` or later (from its files'
    statistics: an earlier attempt of this run that crashed before the table's commit); the
    caller has seen that the table exists."""
    adds = pa.table(storage.delta_table(path).get_add_actions(flatten=True))
    if adds.num_rows == 0 or "max.run" not in adds.column_names:
        return adds.num_rows > 0
    return any(v is None or v >= run for v in adds.column("max.run").to_pylist())


@dataclass(frozen=True)
class SideRun:
    """A run's rows of one side table (``replace_runs``): ``frame`` is one partition in the
    order its file keeps (the caller's processing order); ``empty``: whether it has no rows,
    when the caller knows (else Spark is asked)."""

    frame: DataFrame
    path: str
    schema: pa.Schema
    empty: bool | None = None


def replace_runs(sides: Sequence[SideRun], *, run: int, state: StoreState) -> None:
    """Make each side table hold exactly its ``frame`` as its rows of runs >= ``run``, for
    several side tables of one run at once: their commits (one each,
    none for a table with nothing to add or remove) are made by one thread per table, inside
    one ``commit_metadata`` block (a session's settings are shared: one block per thread would
    undo another's while it commits). Side tables are independent of one another: each commit
    replaces the table's rows of runs >= ``run``, so a crash that leaves any subset of them
    committed is completed by the rerun like one that left a single one. Returns once every
    commit has ended, raising the first failure: the caller's table commit, the run's last,
    comes after all of them or not at all."""
    writes = [(side.path, writer) for side in sides if (writer := _side_writer(side, run)) is not None]
    if not writes:
        return
    spark = sides[0].frame.sparkSession
    with commit_metadata(spark, state):
        if len(writes) == 1:
            path, writer = writes[0]
            writer.save(path)
            return
        failures: list[BaseException] = []

        def save(path: str, writer: DataFrameWriter) -> None:
            try:
                with active_on_this_thread(spark):  # the block's settings are read from the thread's session
                    writer.save(path)
            except BaseException as exc:  # noqa: BLE001 - raised by the calling thread
                failures.append(exc)

        started: list[InheritableThread] = []
        try:
            for write in writes:
                thread = InheritableThread(target=save, args=write, name="versiq-side-commit", daemon=True)
                thread.start()
                started.append(thread)
        finally:  # even when interrupted: the block's settings (the state) hold until every commit ends
            for thread in started:
                thread.join()
        if failures:
            raise failures[0]


def _side_writer(side: SideRun, run: int) -> DataFrameWriter | None:
    """The writer of one side table's commit of run ``run`` (``replace_runs``); None when there is
    nothing to add or remove."""
    rows = _conform(side.frame, side.schema)  # lazy: a plan, no job
    empty = rows.isEmpty() if side.empty is None else side.empty
    # a log without a commit (a first commit killed midway) is no table yet: the commit creates it
    exists = storage.is_delta_table(side.path)
    earlier_attempt = exists and _has_run(side.path, run)
    if empty and not earlier_attempt:
        return None
    if earlier_attempt:
        writer = rows.write.format("delta").mode("overwrite").option("replaceWhere", f"run >= {run}")
    else:  # the usual case: nothing to replace, a plain append (no scan of the table)
        writer = rows.write.format("delta").mode("append")
    if not exists:
        for name, value in _properties(side.schema).items():
            writer = writer.option(name, value)
    return writer


#: Session settings that give the Delta commits of DML commands (MERGE, DELETE) a transaction id.
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


def erase_matching(frame: DataFrame, path: str, condition: str, *, state: StoreState) -> None:
    """One commit removing every row of the table at ``path`` that matches a row of ``frame``
    (``condition`` relates the table, ``t``, to the frame, ``s``): a MERGE whose only clause is
    an unconditional delete, so Delta rewrites only the files holding matching rows, and a row
    matched by several of ``frame``'s is simply deleted. The predicate Delta records in the
    commit names columns only, never the erased keys (a DELETE's would quote them in the log).

    The commit carries ``state`` unchanged (``commit_metadata``: a derived table that finds its
    input by run finds this snapshot) and the transaction ``(versiq.erase, the version it
    creates)``, which marks it as an erase (``query.history``)."""
    from delta.tables import DeltaTable

    spark = frame.sparkSession
    version = storage.delta_table(path).version() + 1
    with commit_metadata(spark, state):
        spark.conf.set(TXN_APP_ID_CONF, ERASE_APP_ID)
        spark.conf.set(TXN_VERSION_CONF, str(version))
        try:
            DeltaTable.forPath(spark, path).alias("t").merge(frame.alias("s"), condition) \
                .whenMatchedDelete().execute()
        finally:
            spark.conf.unset(TXN_APP_ID_CONF)
            spark.conf.unset(TXN_VERSION_CONF)


def append_rows(frame: DataFrame, path: str, schema: pa.Schema) -> None:
    """Append ``frame`` to the table at ``path`` in one commit, creating it (with versiq's table
    properties) when there is none."""
    writer = _conform(frame, schema).write.format("delta").mode("append")
    if not storage.is_delta_table(path):
        for name, value in _properties(schema).items():
            writer = writer.option(name, value)
    writer.save(path)
