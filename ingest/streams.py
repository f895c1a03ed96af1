"""Source streams: append-only event logs ingested from files, never versioned.

A stream run parses the new files with the same strict parsers as a store, appends every
well-formed record (null values included: they are events too; joins skip them) to the stream
table in stream order, and keeps every malformed one in the stream's ``_rejected``. There is no
grace period and no stream time: a stream is not a store. Stream order inside a run is
(relative path, line/row); ``partition`` and ``offset`` fields are accepted and ignored.
The stream table is its own changelog: derived tables read it by (run, seq).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from versiq import layout, storage
from versiq.ingest.bucketing import by_bucket, write_tasks
from versiq.ingest.errors import UsageError
from versiq.ingest.frames import spread_frame
from versiq.ingest.future import DEFAULT_MAX_FUTURE_MS, future_bound
from versiq.ingest.kafka import KafkaSource, check_position, plan_run, read_errors, read_records, read_report
from versiq.ingest.parse import parse_run
from versiq.ingest.plan import choose_plan
from versiq.ingest.records.kafka_rows import SKIPPED
from versiq.ingest.rejections import write_rejected, write_source_rejected
from versiq.ingest.reports import StreamReport
from versiq.ingest.side_by_side import large_run_turn
from versiq.ingest.sources import check_readable, list_sources, log_ignored
from versiq.ingest.spark import plans_for_input, small_run
from versiq.ingest.sqltext import crc32_mod_sql
from versiq.ingest.store import StoreHandle, commit_store, open_store, writer_lock
from versiq.layout import DEFAULT_BUCKETS, STREAM_KIND, StoreSettings, StoreState
from versiq.logs import counted
from versiq.names import check_store_name

log = logging.getLogger("versiq.ingest")


@dataclass(frozen=True)
class StreamSpec:
    """One source stream: ``name``, ``source`` (file or directory), optional ``format``, ``buckets``,
    and the run's ``max_future`` guard (``versiq.ingest.future``; None: no limit)."""

    name: str
    source: str
    format: str | None = None
    buckets: int | None = None
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS
    #: A Kafka topic instead of files (``source`` is then its name); stream order is partition
    #: by partition, each in offset order.
    kafka: KafkaSource | None = None

    def settings(self) -> StoreSettings:
        return StoreSettings(kind=STREAM_KIND, history_retention_ms=0, partitions=1,
                             buckets=DEFAULT_BUCKETS if self.buckets is None else self.buckets)

    def validate(self) -> None:
        check_store_name(self.name)
        if self.format is not None and self.format not in ("jsonl", "csv", "parquet"):
            raise UsageError(f"stream {self.name!r}: format must be jsonl, csv or parquet")
        if self.buckets is not None and not 1 <= self.buckets <= 4096:
            raise UsageError(f"stream {self.name!r}: buckets must be in [1, 4096]")
        if self.kafka is not None:
            self.kafka.validate(f"stream {self.name!r}")
            if self.format is not None:
                raise UsageError(f"stream {self.name!r}: a Kafka source has value_format, not format")
            return
        if not storage.exists(self.source):
            raise UsageError(f"stream {self.name!r}: source {self.source!r} does not exist")


def open_stream(warehouse: str, spec: StreamSpec) -> StoreHandle:
    """The stream of ``spec`` as its newest snapshot has it (or as it would be created); a
    ``UsageError`` when it refuses the spec (another kind or bucket count, a topic switch). No
    Spark: continuous mode calls it before its SparkSession starts (``commands.ingest_command``)."""
    handle = open_store(layout.table_path(warehouse, spec.name), spec.settings(),
                        {"kind", "buckets"} if spec.buckets else {"kind"})
    if spec.kafka is not None:
        check_position(f"stream {spec.name!r}", handle.table is not None, handle.state.kafka, spec.kafka)
    return handle


def ingest_stream(spark: SparkSession, warehouse: str, spec: StreamSpec, lock_timeout_s: float) -> StreamReport:
    path = layout.table_path(warehouse, spec.name)
    with writer_lock(path, lock_timeout_s):
        handle = open_stream(warehouse, spec)
        bound = future_bound(spec.max_future_ms)
        if spec.kafka is not None:
            source = spec.kafka
            position = handle.state.kafka
            read = plan_run(spark, f"stream {spec.name!r}", handle.table is not None, position, source)
            report = StreamReport(kafka=read_report(source, read))
            if not read.advances and handle.table is not None:
                report.snapshot = handle.version
                return report
            run = handle.state.run + 1
            with large_run_turn(small_run(read.input_bytes)), read_errors(source):
                _append_run(handle, spec, run, report, read_records(spark, source, read, bound),
                            StoreState(run=run, kafka=read.position(position, source.topic, run)),
                            lambda parsed, state, total: write_source_rejected(spark, parsed, None, handle.path,
                                                                               state, source.name, total=total))
            return report
        done = set(handle.state.done_files)
        listing = list_sources(spec.source)
        new = {rel: full for rel, full in listing.files.items() if rel not in done}
        report = StreamReport(ignored=log_ignored("stream", spec.name, listing.ignored))
        input_bytes = check_readable(new)
        if not new and handle.table is not None:
            report.snapshot = handle.version
            return report
        run = handle.state.run + 1
        report.files = len(new)
        plan = choose_plan(spark, new, spec.format, input_bytes)
        log.info("stream %s: run %d over %s: %s", spec.name, run, counted(len(new), "new file"), plan.describe())
        with large_run_turn(plan.small):  # a large run waits for the large runs beside it
            parsed, plan = parse_run(spark, plan, new, spec.format, None, bound)
            with plans_for_input(spark, plan.small):
                frame = spread_frame(spark, parsed) if isinstance(parsed, pa.Table) else parsed
                _append_run(handle, spec, run, report, frame,
                            StoreState(run=run, done_files=sorted(done | set(new))),
                            lambda parsed, state, total: write_rejected(spark, parsed, None, handle.path, state,
                                                                        new, spec.format, total=total))
        return report


def _append_run(handle: StoreHandle, spec: StreamSpec, run: int, report: StreamReport, parsed: DataFrame,
                state: StoreState, rejections: Callable[[DataFrame, StoreState, int], None]) -> None:
    """Append one run's well-formed records (``parsed``: ``order.RUN_SCHEMA``) in stream order;
    ``rejections(parsed, state, total)`` writes the rest to ``_rejected`` first."""
    report.run = run
    parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        for row in parsed.groupBy("reason").count().collect():
            report.read += row["count"]
            if row["reason"] is None:
                report.appended = row["count"]
            elif row["reason"] == SKIPPED:
                report.skipped[SKIPPED] = row["count"]
            else:
                report.rejected[row["reason"]] = report.rejected.get(row["reason"], 0) + row["count"]
        kept = parsed.filter(F.col("reason").isNull() | (F.col("reason") != SKIPPED)) if report.skipped else parsed
        good = kept.filter(F.col("reason").isNull())
        rows = good.select(
            F.expr(crc32_mod_sql("key", handle.settings.buckets)).alias("bucket"),
            "key", "value", F.col("ts").alias("timestamp"), F.lit(run).cast("bigint").alias("run"),
            F.row_number().over(Window.orderBy("seq")).cast("bigint").alias("seq"),
        )
        rejections(kept, state, sum(report.rejected.values()))
        tasks = write_tasks(handle.settings.buckets, report.read, rows.sparkSession.sparkContext.defaultParallelism)
        report.snapshot = commit_store(handle, by_bucket(rows, tasks), state)
    finally:
        parsed.unpersist()
    log.info("stream %s: run %d appended %s", spec.name, run, counted(report.appended, "record"))
