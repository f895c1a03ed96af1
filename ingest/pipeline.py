"""One ingest run over one or more stores: list new files, parse, decide, write, commit.

``run_ingest(spark, warehouse, specs)`` is the in-process entry point (same semantics as the
CLI); it returns a ``RunReport`` whose JSON form is the ``--report`` file (docs/contract.md).
Each store's run writes its side tables (``_rejected``, ``_changelog``) and then makes one
atomic, idempotent Delta commit of data + state (``versiq.ingest.delta``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from versiq import layout, storage
from versiq.durations import DEFAULT_HISTORY_RETENTION_MS
from versiq.ingest import rules
from versiq.ingest.bucketing import write_tasks
from versiq.ingest.decisions_here import classify_here, outcome_rows, rows_to_write_here, task_frame
from versiq.ingest.errors import WRITER_FAILURES, UsageError, storage_error_in
from versiq.ingest.frames import local_frame, spread_frame
from versiq.ingest.future import DEFAULT_MAX_FUTURE_MS, future_bound
from versiq.ingest.kafka import (
    KafkaSource,
    check_position,
    describe_read,
    plan_run,
    read_errors,
    read_here,
    read_records,
    read_report,
)
from versiq.ingest.parse import parse_run
from versiq.ingest.plan import RunPlan, choose_plan
from versiq.ingest.records.kafka_rows import SKIPPED
from versiq.ingest.rejections import write_rejected, write_source_rejected
from versiq.ingest.reports import RunReport, StoreReport
from versiq.ingest.semantics import RunContext, classify, rows_to_write, stored_homes
from versiq.ingest.side_by_side import large_run_turn, run_side_by_side
from versiq.ingest.sources import SourceError, check_readable, list_sources, log_ignored, source_error_in
from versiq.ingest.spark import plans_for_input, start_soon
from versiq.ingest.sqltext import file_of_sql
from versiq.ingest.store import (
    RUN,
    StoreHandle,
    commit_side,
    commit_store,
    existing_versions,
    grow_partitions,
    open_store,
    writer_lock,
)
from versiq.layout import (
    CHANGELOG_DIR,
    DEFAULT_BUCKETS,
    KINDS,
    STORE_SCHEMA,
    Partitioning,
    StoreSettings,
    StoreState,
)
from versiq.logs import counted
from versiq.names import check_store_name

log = logging.getLogger("versiq.ingest")

#: Largest files x partitions of a run whose per-file stream-time maxima are collected to the
#: driver (``_parse_stats``); above it stream time is computed by Spark windows instead.
FILE_STATS_LIMIT = 100_000


@dataclass(frozen=True)
class StoreSpec:
    """One store to ingest. None settings mean: the store's own, or the default for a new one."""

    name: str
    source: str
    format: str | None = None
    kind: str | None = None
    history_retention_ms: int | None = None
    partitions: int | None = None
    buckets: int | None = None
    #: Keep a ``_changelog`` of accepted records (set when derived tables read this store). A
    #: store that kept one keeps it on every later run whatever this says
    #: (``keeps_changelog``): a run missing from it would be lost to its derived tables.
    changelog: bool = False
    #: Records stamped later than the run's wall clock plus this are rejected ``bad_timestamp``
    #: (None: no limit). An input guard of each run, not a store setting (``future_bound``).
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS
    #: A Kafka topic instead of files (``source`` is then its name, ``kafka:<topic>``).
    kafka: KafkaSource | None = None

    def settings(self) -> tuple[StoreSettings, set[str]]:
        explicit = {name for name, value in (("kind", self.kind),
                                              ("history_retention", self.history_retention_ms),
                                              ("partitions", self.partitions),
                                              ("buckets", self.buckets)) if value is not None}
        settings = StoreSettings(
            kind=self.kind or "versioned",
            history_retention_ms=DEFAULT_HISTORY_RETENTION_MS if self.history_retention_ms is None
            else self.history_retention_ms,
            partitions=1 if self.partitions is None else self.partitions,
            buckets=DEFAULT_BUCKETS if self.buckets is None else self.buckets,
        )
        return settings, explicit

    def validate(self) -> None:
        check_store_name(self.name)
        if self.kind is not None and self.kind not in KINDS:
            raise UsageError(f"store {self.name!r}: kind must be one of {', '.join(KINDS)}")
        if self.format is not None and self.format not in ("jsonl", "csv", "parquet"):
            raise UsageError(f"store {self.name!r}: format must be jsonl, csv or parquet")
        if self.history_retention_ms is not None and not 0 <= self.history_retention_ms <= 2**63 - 1:
            raise UsageError(f"store {self.name!r}: history_retention must be in [0, 2^63-1] ms")
        if self.partitions is not None and not 1 <= self.partitions <= 10_000:
            raise UsageError(f"store {self.name!r}: partitions must be in [1, 10000]")
        if self.buckets is not None and not 1 <= self.buckets <= 4096:
            raise UsageError(f"store {self.name!r}: buckets must be in [1, 4096]")
        if self.max_future_ms is not None and not 0 <= self.max_future_ms <= 2**63 - 1:
            raise UsageError(f"store {self.name!r}: max_future must be in [0, 2^63-1] ms or none")
        if self.kafka is not None:
            self.kafka.validate(f"store {self.name!r}")
            if self.partitions is not None:
                raise UsageError(f"store {self.name!r}: the partitions of a store fed by Kafka are the topic's "
                                 "(do not give partitions)")
            if self.format is not None:
                raise UsageError(f"store {self.name!r}: a Kafka source has value_format, not format")
            return
        if not storage.exists(self.source):
            raise UsageError(f"store {self.name!r}: source {self.source!r} does not exist")




def run_ingest(spark: SparkSession, warehouse: str, specs: list[StoreSpec], *,
               lock_timeout_s: float = 60.0) -> RunReport:
    """Ingest every store; a failing store is reported (``error``) and the others go on."""
    for spec in specs:
        spec.validate()
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise UsageError("a store name appears twice")
    storage.ensure_dir(storage.normalize(warehouse))
    report = RunReport()
    report.stores.update(ingest_each(spark, specs,
                                     lambda session, spec: ingest_store(session, warehouse, spec, lock_timeout_s),
                                     lambda error: StoreReport(error=error), "store"))
    return report


#: Failures of a run explained in one line, without a traceback: a source that cannot be read,
#: another writer holding the store, a lost lease, S3 failing (anything else is logged with its
#: traceback: a defect).
EXPLAINED_FAILURES: tuple[type[Exception], ...] = (SourceError, *WRITER_FAILURES)


def ingest_each(spark: Any, specs: list[Any], ingest_one: Any, failed: Any, what: str) -> dict[str, Any]:
    """Run ``ingest_one(session, spec)`` for every spec, side by side (``side_by_side``: each on
    a session of its own), timing each; a failure becomes ``failed(error)`` (its report with
    ``error``) and the others go on. A usage error is raised once every run has ended."""

    def timed(session: Any, spec: Any) -> Any:
        started = time.monotonic()
        report = _reported(ingest_one, session, spec, failed, what)
        report.seconds = time.monotonic() - started
        return report

    reports: dict[str, Any] = {}
    usage: UsageError | None = None
    for spec, outcome in zip(specs, run_side_by_side(spark, specs, timed, what=(what, what + "s")), strict=True):
        if isinstance(outcome, UsageError):
            usage = usage or outcome
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            reports[spec.name] = outcome
    if usage is not None:
        raise usage
    return reports


def _reported(ingest_one: Any, session: Any, spec: Any, failed: Any, what: str) -> Any:
    """``ingest_one(session, spec)``'s report, or ``failed(error)``'s for an error of the run."""
    try:
        return ingest_one(session, spec)
    except UsageError:
        raise
    except EXPLAINED_FAILURES as exc:  # the environment or another writer, not a bug: one line
        log.error("%s %s failed: %s", what, spec.name, exc)
        return failed(f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - one failed store never stops the others
        # a parse task could not read a file; S3 failed a write or read of Spark's
        explained = source_error_in(exc) or storage_error_in(exc)
        if explained is not None:
            log.error("%s %s failed: %s", what, spec.name, explained)
            return failed(f"{type(explained).__name__}: {explained}")
        log.exception("%s %s failed", what, spec.name)
        return failed(f"{type(exc).__name__}: {exc}")


def open_for(warehouse: str, spec: StoreSpec) -> StoreHandle:
    """The store of ``spec`` as its newest snapshot has it (or as it would be created); a
    ``UsageError`` when the store refuses the spec: a setting it was created with given
    otherwise, a file source for a store that reads a Kafka topic, or a topic for a store built
    from files or from another topic (``kafka.check_position``). No Spark: continuous mode calls
    it for every store before its SparkSession starts (``commands.ingest_command``; streams:
    ``streams.open_stream``)."""
    settings, explicit = spec.settings()
    handle = open_store(layout.table_path(warehouse, spec.name), settings, explicit)
    if spec.kafka is not None:
        check_position(f"store {spec.name!r}", handle.table is not None, handle.state.kafka, spec.kafka)
    elif handle.state.kafka is not None:
        raise UsageError(f"store {spec.name!r} reads Kafka topic {handle.state.kafka.topic}; it cannot switch to "
                         "a file source (create a new store instead)")
    return handle


def ingest_store(spark: SparkSession, warehouse: str, spec: StoreSpec, lock_timeout_s: float) -> StoreReport:
    path = layout.table_path(warehouse, spec.name)
    with writer_lock(path, lock_timeout_s, RUN):
        handle = open_for(warehouse, spec)
        if spec.kafka is not None:
            return _ingest_topic(spark, handle, spec, spec.kafka)
        listing = list_sources(spec.source)
        done = set(handle.state.done_files)
        new = {rel: full for rel, full in listing.files.items() if rel not in done}
        report = StoreReport(ignored=log_ignored("store", spec.name, listing.ignored))
        input_bytes = check_readable(new)
        if not new and handle.table is not None:
            return _nothing_new(spark, handle, spec, report, "no new files")
        run = handle.state.run + 1
        report.run = run
        report.files = len(new)
        plan = choose_plan(spark, new, spec.format, input_bytes)
        log.info("store %s: run %d over %s: %s", spec.name, run, counted(len(new), "new file"), plan.describe())
        with large_run_turn(plan.small):  # a large run waits for the large runs beside it
            per_file = len(new) * handle.settings.partitions <= FILE_STATS_LIMIT

            parsed, plan = parse_run(spark, plan, new, spec.format, handle.settings.partitioning,
                                     future_bound(spec.max_future_ms))
            parsed_here = plan.parse == "driver"

            def rejections(parsed: DataFrame | pa.Table, classified: DataFrame | pa.Table, state: StoreState,
                           decided: int, total: int) -> None:
                write_rejected(spark, parsed, classified, handle.path, state, new, spec.format, decided=decided,
                               total=total, parsed_here=parsed_here)
            _run_once(spark, handle, spec, run, report, parsed, per_file, rejections,
                      lambda state: replace(state, done_files=sorted(done | set(new))), plan)
            return report


def _nothing_new(spark: SparkSession, handle: StoreHandle, spec: StoreSpec, report: StoreReport,
                 why: str) -> StoreReport:
    if spec.changelog and handle.state.changelog_since is None:
        _start_changelog(spark, handle)
    report.snapshot = handle.version
    log.info("store %s: %s (snapshot %s)", spec.name, why, handle.version)
    return report


def _ingest_topic(spark: SparkSession, handle: StoreHandle, spec: StoreSpec, source: KafkaSource) -> StoreReport:
    """A store's run over the records of its Kafka topic it has not read (``ingest.kafka``)."""
    position = handle.state.kafka
    read = plan_run(spark, f"store {spec.name!r}", handle.table is not None, position, source)
    handle = grow_partitions(spark, handle, read.partitions)
    report = StoreReport(kafka=read_report(source, read))
    if not read.advances and handle.table is not None:
        return _nothing_new(spark, handle, spec, report, f"no new records in {source.name}")
    run = handle.state.run + 1
    report.run = run
    plan = choose_plan(spark, None, None, read.input_bytes, kafka=source, store=f"store {spec.name}")
    log.info("store %s: run %d over %s: %s", spec.name, run, describe_read(source, read), plan.describe())
    with large_run_turn(plan.small):  # a large run waits for the large runs beside it
        if plan.parse == "driver":  # the metadata needed no JVM: it starts while the run reads and decides
            start_soon(spark)

        def rejections(parsed: DataFrame | pa.Table, classified: DataFrame | pa.Table, state: StoreState,
                       decided: int, total: int) -> None:
            write_source_rejected(spark, parsed, classified, handle.path, state, source.name, decided=decided,
                                  total=total)

        with read_errors(source):
            parsed: DataFrame | pa.Table
            if plan.parse == "driver":  # read and parsed here, decided by DuckDB (``kafka.read_here``)
                parsed = read_here(source, read, future_bound(spec.max_future_ms))
                log.debug("%s read and parsed in this process", counted(parsed.num_rows, "record"))
            else:
                parsed = read_records(spark, source, read, future_bound(spec.max_future_ms))
            _run_once(spark, handle, spec, run, report, parsed, False, rejections,
                      lambda state: replace(state, kafka=read.position(position, source.topic, run)), plan)
    return report


#: A run's parse statistics: counts of records naming partitions / offsets, the largest valid
#: timestamp per (default partition, file index) (None: not collected), the valid records' keys
#: with the smallest timestamp of each (``RUN_KEYS``; None: not collected).
ParseStats = tuple[dict[str, int], dict[tuple[int, int], int] | None, pa.Table | None]


#: Writes a run's ``_rejected`` rows: (parsed, classified, state, rejected by the decisions, all
#: rejected); both tables are Arrow tables in a run decided here (``_decide_here_and_commit``).
WriteRejections = Callable[[DataFrame | pa.Table, DataFrame | pa.Table, StoreState, int, int], None]


def _run_once(spark: SparkSession, handle: StoreHandle, spec: StoreSpec, run: int, report: StoreReport,
              parsed: DataFrame | pa.Table, per_file: bool, rejections: WriteRejections,
              advance: Callable[[StoreState], StoreState], plan: RunPlan) -> None:
    """Decide and commit one run over ``parsed`` (``order.RUN_SCHEMA`` rows of the new input:
    a Spark DataFrame, or the Arrow table of a run parsed in this process,
    ``parse.parse_here``) as its ``plan`` says: ``per_file`` collects per-file stream-time maxima
    (file sources of few files, for Spark's decisions), ``rejections(parsed, classified, state,
    decided, total)`` writes ``_rejected``, and ``advance(state)`` adds what the run read to the
    store's state (files done, offsets). A small run's keys come back with the parse statistics
    instead of in a Spark job of their own.

    A run parsed here is decided here too (``_decide_here_and_commit``, DuckDB): its statistics,
    its keys' stored versions and its decisions need no Spark, so all of them overlap the JVM's
    start (``spark.start_soon``), and Spark only writes."""
    has_versions = handle.table is not None and bool(handle.data_files())
    if plan.decide == "duckdb":
        assert isinstance(parsed, pa.Table)  # parsed in this process (``parse.parse_run``)
        _decide_here_and_commit(spark, handle, spec, run, report, parsed, rejections, advance, has_versions,
                                plan.small)
        return
    with plans_for_input(spark, plan.small):
        parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)  # parsed by Spark tasks: not parsed again
        try:
            _decide_and_commit(spark, handle, spec, run, report, parsed, per_file, rejections, advance,
                               plan.small, has_versions)
        finally:
            parsed.unpersist()


def _decide_here_and_commit(spark: SparkSession, handle: StoreHandle, spec: StoreSpec, run: int,
                            report: StoreReport, parsed: pa.Table, rejections: WriteRejections,
                            advance: Callable[[StoreState], StoreState], has_versions: bool,
                            small: bool) -> None:
    """``_run_once`` of a run parsed in this process, decided here too (``ingest.decisions_here``):
    the session is first needed for the writes, so everything before them overlaps its start.
    (Computing the store's rows on a thread while Spark writes ``_rejected`` saved nothing on
    two cores: each took twice as long.)"""
    settings = handle.settings
    flags, new_keys = _parse_stats_here(parsed, report, keys=has_versions)
    if report.skipped:  # counted, neither records nor rejections (as in ``_decide_and_commit``)
        parsed = parsed.filter(pc.fill_null(pc.not_equal(parsed.column("reason"), SKIPPED), True))
    log.info("store %s: parsed %s", spec.name, counted(report.read, "record"))
    existing = existing_versions(handle, _key_table(new_keys))
    ctx = RunContext(settings, handle.state, run, explicit_partitions=flags["part"] > 0,
                     any_offsets=flags["offset"] > 0)
    classified = classify_here(parsed, existing, ctx)
    parse_rejections = sum(report.rejected.values())
    state = advance(_next_state(outcome_rows(classified), handle.state, run, report))
    rows = rows_to_write_here(classified, existing, settings, run)
    rejected = sum(report.rejected.values())
    log.info("store %s: %d accepted, %d rejected; writing", spec.name,
             report.accepted_latest + report.accepted_out_of_order, rejected)
    with plans_for_input(spark, small):
        # side tables first, the store commit (data + state) last: docs in versiq.ingest.delta
        rejections(parsed, classified, state, rejected - parse_rejections, rejected)
        if keeps_changelog(spec, handle.state):
            if state.changelog_since is None:
                state.changelog_since = run
            _write_changelog(spread_frame(spark, classified), handle.path, state, ctx)
        log.info("store %s: committing run %d", spec.name, run)
        tasks = write_tasks(settings.buckets, report.read, spark.sparkContext.defaultParallelism)
        report.snapshot = commit_store(handle, task_frame(spark, rows, tasks), state)


def _decide_and_commit(spark: SparkSession, handle: StoreHandle, spec: StoreSpec, run: int, report: StoreReport,
                       parsed: DataFrame, per_file: bool, rejections: WriteRejections,
                       advance: Callable[[StoreState], StoreState], small: bool, has_versions: bool) -> None:
    """``_run_once`` of a run parsed by Spark tasks, from its cached DataFrame on: Spark decides."""
    settings = handle.settings
    flags, file_max, new_keys = _parse_stats(parsed, report, settings.partitioning if per_file else None,
                                             keys=small and has_versions)
    if report.skipped:  # counted, neither records nor rejections (records.kafka_rows.SKIPPED)
        parsed = parsed.filter(F.col("reason").isNull() | (F.col("reason") != SKIPPED))
    good = parsed.filter(F.col("reason").isNull()).select("seq", "fst", "key", "value", "ts", "part", "offset")
    log.info("store %s: parsed %s", spec.name, counted(report.read, "record"))
    keys = _key_table(new_keys)
    if has_versions and new_keys is None:
        keys = good.groupBy("key").agg(F.expr("min(ts) AS from_ts")).toArrow()
    existing_arrow = existing_versions(handle, keys)
    existing = spark.createDataFrame(existing_arrow)
    ctx = RunContext(settings, handle.state, run, explicit_partitions=flags["part"] > 0,
                     any_offsets=flags["offset"] > 0, file_max=file_max,
                     tasks=write_tasks(settings.buckets, report.read, spark.sparkContext.defaultParallelism))
    empty = existing_arrow.num_rows == 0
    homes = None if empty else spark.createDataFrame(stored_homes(existing_arrow))
    if homes is not None and existing_arrow.nbytes <= BROADCAST_STORED_BYTES:
        existing, homes = F.broadcast(existing), F.broadcast(homes)
    classified = classify(spark, good, existing, ctx, homes).persist(
        StorageLevel.MEMORY_AND_DISK)
    try:
        parse_rejections = sum(report.rejected.values())
        state = advance(_next_state(_outcome_rows(classified), handle.state, run, report))
        log.info("store %s: %d accepted, %d rejected; writing", spec.name,
                 report.accepted_latest + report.accepted_out_of_order, sum(report.rejected.values()))
        # side tables first, the store commit (data + state) last: docs in versiq.ingest.delta
        rejected = sum(report.rejected.values())
        rejections(parsed, classified, state, rejected - parse_rejections, rejected)
        if keeps_changelog(spec, handle.state):
            if state.changelog_since is None:
                state.changelog_since = run
            _write_changelog(classified, handle.path, state, ctx)
        log.info("store %s: committing run %d", spec.name, run)
        version = commit_store(handle, rows_to_write(classified, existing, ctx, existing_empty=empty), state)
        report.snapshot = version
    finally:
        classified.unpersist()


def _key_table(keys: pa.Table | None) -> pa.Table:
    """The keys whose stored versions a run reads, with the smallest timestamp of each key's
    records (``RUN_KEYS``, ``store.existing_versions``); None: none."""
    return RUN_KEYS.empty_table() if keys is None else keys


#: Up to this size (Arrow bytes) the stored versions of a run's keys, and their homes, are
#: broadcast to ``classify``'s joins: Spark's own ``autoBroadcastJoinThreshold`` (10 MB), which
#: it cannot apply itself since these tables reach it as RDDs without size statistics
#: (``spark.LOCAL_RELATION_BYTES``); without the hint such a join shuffles all of the run's records.
BROADCAST_STORED_BYTES = 10 * 1024 * 1024

#: A run's keys (of its valid records) and the smallest timestamp of each key's records.
RUN_KEYS = pa.schema([pa.field("key", pa.string()), pa.field("from_ts", pa.int64())])


def _start_changelog(spark: SparkSession, handle: StoreHandle) -> None:
    """Commit that the store keeps a ``_changelog`` from its next run on (state only, no data).

    A table added over a store without one starts from what the store holds after its last run
    (docs/derived-tables.md); from then on it reads the changelog of every later run, so the store
    must keep one from the next run even when this run had nothing new to write it in."""
    state = replace(handle.state, changelog_since=handle.state.run + 1)
    commit_store(handle, local_frame(spark, STORE_SCHEMA.empty_table()), state, new_run=False)
    log.info("store %s: keeps a changelog from run %d on (derived tables read it)", storage.basename(handle.path),
             state.changelog_since)


def keeps_changelog(spec: StoreSpec, state: StoreState) -> bool:
    """Whether this run of the store writes its ``_changelog``: when derived tables read it
    (``spec.changelog``), and on every run after the first that wrote one, even one without
    the pipeline file (``versiq ingest --store``, ``versiq demo``). The derive phase reads the
    changelog of every run from ``changelog_since`` on; a run missing from it would silently
    drop that run's records from every derived table."""
    return spec.changelog or state.changelog_since is not None


def _parse_stats(parsed: DataFrame, report: StoreReport, partitioning: Partitioning | None, keys: bool = False
                 ) -> ParseStats:
    """Fill ``read`` and the parse-stage rejections; count records naming partitions/offsets;
    the largest valid timestamp per (default partition, file index), for
    ``RunContext.file_max``; and with ``keys`` (a small run) the keys of the valid records with
    the smallest timestamp of each (``RUN_KEYS``; else None).
    One aggregation, the run's first action (it parses and caches every file); its result has
    a row per reason, file and partition (the caller bounds files x partitions; with
    ``partitioning`` None only a row per reason, and no maxima)."""
    flags = {"part": 0, "offset": 0}
    file_max: dict[tuple[int, int], int] | None = None if partitioning is None else {}
    if partitioning is None:
        file, default_p = "CAST(NULL AS INT)", "CAST(NULL AS INT)"
    else:
        file = file_of_sql("seq")
        default_p = (f"CASE WHEN reason IS NULL THEN "
                     f"{rules.SPARK.default_partition(partitioning.count, partitioning.partitioner)} END")
    from_ts: dict[str, int] | None = {} if keys else None
    aggregates = ["count(1) AS n", "count(part) AS part", "count(`offset`) AS `offset`", "max(ts) AS max_ts"]
    if keys:  # the groups are per reason, file and partition: a key's smallest timestamp is taken below
        aggregates.append("collect_list(CASE WHEN reason IS NULL THEN struct(key, ts) END) AS keys")
    rows = parsed.groupBy("reason", F.expr(f"{file} AS file"), F.expr(f"{default_p} AS p")).agg(
        *(F.expr(a) for a in aggregates)).collect()
    for row in rows:
        if from_ts is not None:
            for key, ts in row["keys"]:
                from_ts[key] = min(ts, from_ts.get(key, ts))
        report.read += row["n"]
        if row["reason"] == SKIPPED:
            report.skipped[row["reason"]] = report.skipped.get(row["reason"], 0) + row["n"]
        elif row["reason"] is not None:
            report.rejected[row["reason"]] = report.rejected.get(row["reason"], 0) + row["n"]
        else:
            flags["part"] += row["part"]
            flags["offset"] += row["offset"]
            if file_max is not None:
                file_max[(row["p"], row["file"])] = row["max_ts"]
    keys_table = None if from_ts is None else pa.table(
        {"key": list(from_ts), "from_ts": list(from_ts.values())}, schema=RUN_KEYS)
    return flags, file_max, keys_table


def _parse_stats_here(parsed: pa.Table, report: StoreReport, keys: bool = False
                      ) -> tuple[dict[str, int], pa.Table | None]:
    """``_parse_stats`` of a run parsed in this process (``parse.parse_here``), from its Arrow
    table, without a Spark job (a test compares the two): the flags and the run's keys
    (with ``keys``), not the per-file maxima, which only Spark's decisions use."""
    report.read += parsed.num_rows
    reasons = parsed.column("reason")
    for entry in pc.value_counts(pc.drop_null(reasons)).to_pylist():
        counts = report.skipped if entry["values"] == SKIPPED else report.rejected
        counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
    valid = parsed.filter(pc.is_null(reasons))
    flags = {name: valid.num_rows - valid.column(name).null_count for name in ("part", "offset")}
    run_keys = None
    if keys:
        run_keys = valid.group_by("key").aggregate([("ts", "min")]).rename_columns({"ts_min": "from_ts"}).select(
            RUN_KEYS.names).cast(RUN_KEYS)
    return flags, run_keys


def _outcome_rows(classified: DataFrame) -> list[Any]:
    """The classified records counted per (outcome, partition), for ``_next_state`` (Spark's;
    ``decisions_here.outcome_rows`` is the same of a table decided here)."""
    return classified.groupBy("outcome", "p").agg(F.expr("count(1) AS n"), F.expr(
        "sum(CAST(latest AS INT)) AS latest"), F.expr("sum(CAST(replaced AS INT)) AS replaced"), F.expr(
        "sum(CAST(value IS NULL AS INT)) AS tombstones"), F.expr("max(ts) AS st"), F.expr("max(`offset`) AS off"),
    ).collect()


def _next_state(rows: list[Any], state: StoreState, run: int, report: StoreReport) -> StoreState:
    """Outcome counts for the report and the store state after this run (without what the run
    read: the caller's ``advance``), from ``_outcome_rows``."""
    stream_time = dict(state.stream_time)
    max_offset = dict(state.max_offset)
    for row in rows:
        if row["outcome"] == "accepted":
            latest = int(row["latest"] or 0)
            report.accepted_latest += latest
            report.accepted_out_of_order += int(row["n"]) - latest
            report.replaced_same_timestamp += int(row["replaced"] or 0)
            report.tombstones += int(row["tombstones"] or 0)
        else:
            report.rejected[row["outcome"]] = report.rejected.get(row["outcome"], 0) + int(row["n"])
        if row["outcome"] not in ("accepted", "late"):
            continue
        p = int(row["p"])
        if row["st"] is not None:
            stream_time[p] = max(stream_time.get(p, row["st"]), row["st"])
        if row["off"] is not None:
            max_offset[p] = max(max_offset.get(p, row["off"]), row["off"])
    return replace(state, run=run, stream_time=stream_time, max_offset=max_offset)


def _write_changelog(classified: DataFrame, store_path: str, state: StoreState, ctx: RunContext) -> None:
    """The run's accepted records in processing order (``seq`` 1, 2, ...) into ``_changelog``.

    Across partitions the order is (path, line/row); inside a partition ordered by offset, the
    k-th record of the partition takes the k-th (path, line/row) slot of that partition, which
    keeps every partition's own order (docs/semantics.md, rules 19-21) in one sequence.
    """
    acc = classified.filter("outcome = 'accepted'").select("key", "value", "ts", "p", "ord0", "seq")
    if ctx.any_offsets:
        records = acc.selectExpr("key", "value", "ts", "p", "ord0",
                                 "row_number() OVER (PARTITION BY p ORDER BY ord0 ASC NULLS FIRST, seq) AS k")
        slots = acc.selectExpr("p", "seq", "row_number() OVER (PARTITION BY p ORDER BY seq) AS k")
        acc = records.join(slots, ["p", "k"])
    out = acc.selectExpr(
        f"CAST({int(state.run)} AS BIGINT) AS run", "CAST(row_number() OVER (ORDER BY seq) AS BIGINT) AS seq",
        "key", "value", "ts AS timestamp", "CAST(p AS INT) AS `partition`",
    )
    commit_side(store_path, CHANGELOG_DIR, state, out.repartition(1).sortWithinPartitions("seq"))


