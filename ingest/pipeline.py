"""One ingest run over one or more stores: list new files, parse, decide, write, commit.

``run_ingest(spark, warehouse, specs)`` is the in-process entry point (same semantics as the
CLI); it returns a ``RunReport`` whose JSON form is the ``--report`` file (CONTRACT.md).
Each store's run is one atomic, idempotent Delta commit of data + state, followed by the
``_rejected`` commit under the same transaction id.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from versiq.durations import DEFAULT_HISTORY_RETENTION_MS, parse_duration_ms
from versiq.ingest.bucketing import write_tasks
from versiq.ingest.order import MAX_FILES, MAX_POS, RUN_SCHEMA, file_seq_base, split_seq, with_order
from versiq.ingest.records import BATCH_ROWS, format_of, parse_file, raw_texts
from versiq.ingest.semantics import RunContext, classify, default_partition_of, file_of, rows_to_write
from versiq.ingest.sources import SourceError, check_readable, list_sources
from versiq.ingest.store import (
    StoreHandle,
    UsageError,
    commit_rejected,
    commit_side,
    commit_store,
    existing_versions,
    finish_pending_sides,
    open_store,
    rejected_path,
    writer_lock,
)
from versiq.ingest.writer import FILE_INFO_DDL, collect_adds, make_plain_writer, make_store_writer, write_local
from versiq.layout import (
    CHANGELOG_DIR,
    CHANGELOG_SCHEMA,
    DEFAULT_BUCKETS,
    KINDS,
    REJECT_REASONS,
    REJECTED_SCHEMA,
    STORE_FILE_SCHEMA,
    STORE_SCHEMA,
    StoreSettings,
    StoreState,
)
from versiq.names import check_store_name

log = logging.getLogger("versiq.ingest")

#: Largest files x partitions of a run whose per-file stream-time maxima are collected to the
#: driver (``_parse_stats``); above it stream time is computed by Spark windows instead.
FILE_STATS_LIMIT = 100_000
#: Up to this many rejections in a run, ``_rejected`` is written on the driver (``_write_rejected``).
DRIVER_REJECTIONS = 20_000
#: Default ``max_future``: a record more than 1 hour after the wall clock of its run is refused.
DEFAULT_MAX_FUTURE_MS = 3_600_000


def parse_max_future(text: str) -> int | None:
    """``max_future`` as given on the command line or in a pipeline file: a duration, or
    ``none`` for no limit. Raises DurationError."""
    return None if text.strip().lower() == "none" else parse_duration_ms(text)


def future_bound(max_future_ms: int | None, now_ms: int | None = None) -> int | None:
    """The latest timestamp a run accepts: its wall clock (taken once, on the driver, when the
    run starts) plus ``max_future_ms``; None when there is no limit.

    Why per run and not a store setting: like a Kafka broker's
    ``log.message.timestamp.after.max.ms`` (KIP-937) it guards the input against broken clocks
    and poison records; it is not part of the store's semantics. A record refused today can be
    ingested once its time has come (from a new file; a file is never read twice)."""
    if max_future_ms is None:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return min(now + max_future_ms, 2**63 - 1)


def report_json(report: Any) -> dict[str, Any]:
    """A run report dataclass's JSON form (``--report``, CONTRACT.md): every field in order,
    ``seconds`` rounded to the millisecond, ``error`` only when there is one."""
    out: dict[str, Any] = {}
    for item in fields(report):
        value = getattr(report, item.name)
        if item.name == "error" and value is None:
            continue
        if item.name == "seconds":
            value = round(value, 3)
        elif isinstance(value, dict):
            value = dict(value)
        out[item.name] = value
    return out


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
    #: Keep a ``_changelog`` of accepted records (set when derived tables read this store).
    changelog: bool = False
    #: Records stamped later than the run's wall clock plus this are rejected ``bad_timestamp``
    #: (None: no limit). An input guard of each run, not a store setting (``future_bound``).
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS

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
        if not os.path.exists(self.source):
            raise UsageError(f"store {self.name!r}: source {self.source!r} does not exist")


@dataclass
class StoreReport:
    read: int = 0
    accepted_latest: int = 0
    accepted_out_of_order: int = 0
    replaced_same_timestamp: int = 0
    tombstones: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    snapshot: int | None = None
    seconds: float = 0.0
    files: int = 0
    run: int | None = None
    #: Source entries that are not regular files, never opened (``ingest.sources``).
    ignored: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return report_json(self)


@dataclass
class StreamReport:
    """A source stream's run: records read, appended and rejected (no grace: never late)."""

    read: int = 0
    appended: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    snapshot: int | None = None
    seconds: float = 0.0
    files: int = 0
    run: int | None = None
    #: Source entries that are not regular files, never opened (``ingest.sources``).
    ignored: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return report_json(self)


@dataclass
class RunReport:
    stores: dict[str, StoreReport] = field(default_factory=dict)
    streams: dict[str, StreamReport] = field(default_factory=dict)
    #: Derived tables and stream outputs (``ingest.derived.report.TableReport``).
    tables: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        entries = [*self.stores.values(), *self.streams.values(), *self.tables.values()]
        return any(r.error is not None for r in entries)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stores": {name: r.to_json() for name, r in self.stores.items()}}
        if self.streams:
            out["streams"] = {name: r.to_json() for name, r in self.streams.items()}
        if self.tables:
            out["tables"] = {name: r.to_json() for name, r in self.tables.items()}
        return out


def log_ignored(what: str, name: str, ignored: list[dict[str, str]]) -> list[dict[str, str]]:
    """Name every ignored source entry in the log (a warning: it may be a mistake), once per run."""
    for entry in ignored:
        log.warning("%s %s: ignored %s (a %s, not a regular file)", what, name, entry["path"], entry["type"])
    return ignored


def run_ingest(spark: SparkSession, warehouse: str, specs: list[StoreSpec], *,
               lock_timeout_s: float = 60.0) -> RunReport:
    """Ingest every store; a failing store is reported (``error``) and the others go on."""
    for spec in specs:
        spec.validate()
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise UsageError("a store name appears twice")
    os.makedirs(warehouse, exist_ok=True)
    report = RunReport()
    report.stores.update(ingest_each(specs, lambda spec: ingest_store(spark, warehouse, spec, lock_timeout_s),
                                     lambda error: StoreReport(error=error), "store"))
    return report


def ingest_each(specs: list[Any], ingest_one: Any, failed: Any, what: str) -> dict[str, Any]:
    """Run ``ingest_one(spec)`` for every spec, timing each; a failure becomes ``failed(error)``
    (its report with ``error``) and the others go on. Usage errors stop everything."""
    reports: dict[str, Any] = {}
    for spec in specs:
        started = time.monotonic()
        try:
            reports[spec.name] = ingest_one(spec)
        except UsageError:
            raise
        except SourceError as exc:  # the environment, not a bug: one line, no traceback
            log.error("%s %s failed: %s", what, spec.name, exc)
            reports[spec.name] = failed(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - one failed store never stops the others
            log.exception("%s %s failed", what, spec.name)
            reports[spec.name] = failed(f"{type(exc).__name__}: {exc}")
        reports[spec.name].seconds = time.monotonic() - started
    return reports


def ingest_store(spark: SparkSession, warehouse: str, spec: StoreSpec, lock_timeout_s: float) -> StoreReport:
    path = os.path.join(os.path.abspath(warehouse), spec.name)
    settings, explicit = spec.settings()
    with writer_lock(path, lock_timeout_s):
        handle = open_store(path, settings, explicit)
        if finish_pending_sides(handle):
            log.info("store %s: completed the side-table commits of run %d", spec.name, handle.state.run)
        listing = list_sources(spec.source)
        done = set(handle.state.done_files)
        new = {rel: full for rel, full in listing.files.items() if rel not in done}
        report = StoreReport(ignored=log_ignored("store", spec.name, listing.ignored))
        check_readable(new)
        if not new and handle.table is not None:
            report.snapshot = handle.version
            log.info("store %s: no new files (snapshot %s)", spec.name, handle.version)
            return report
        run = handle.state.run + 1
        report.run = run
        report.files = len(new)
        log.info("store %s: run %d over %d new file(s)", spec.name, run, len(new))
        _run_once(spark, handle, spec, new, run, report)
        return report


def _parse(spark: SparkSession, files: dict[str, str], fmt: str | None, partitions: int | None,
           max_timestamp: int | None = None) -> DataFrame:
    """Every file parsed (``ingest.records``) by a Spark task, with the processing-order
    columns of ``ingest.order`` (``partitions``: the store's, None for a stream)."""
    if len(files) > MAX_FILES:
        raise ValueError(f"{len(files)} new files in one run; at most {MAX_FILES} (ingest them in parts)")
    if list(files) != sorted(files):  # file indexes are processing order (ingest.order)
        raise ValueError("source files must be given in (relative path) order")
    rows = [(full, rel, format_of(rel, fmt), index) for index, (rel, full) in enumerate(files.items())]
    frame = spark.createDataFrame(rows, "path string, source string, fmt string, file_index int")
    frame = frame.repartition(max(1, min(len(rows), spark.sparkContext.defaultParallelism * 4)))

    def parse(batches):  # type: ignore[no-untyped-def]
        for batch in batches:
            for full, rel, file_fmt, index in zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True):
                yield from with_order(parse_file(full, rel, file_fmt, max_timestamp), index, partitions)

    return frame.mapInArrow(parse, from_arrow_schema(RUN_SCHEMA))


def _run_once(spark: SparkSession, handle: StoreHandle, spec: StoreSpec, new: dict[str, str], run: int,
              report: StoreReport) -> None:
    settings = handle.settings
    parsed = _parse(spark, new, spec.format, settings.partitions, future_bound(spec.max_future_ms)).persist(
        StorageLevel.MEMORY_AND_DISK)
    try:
        good = parsed.filter(F.col("reason").isNull()).select("seq", "fst", "key", "value", "ts", "part", "offset")
        # per-file maxima for stream time without a shuffle, unless that is too many rows to collect
        per_file = len(new) * settings.partitions <= FILE_STATS_LIMIT
        flags, file_max = _parse_stats(parsed, report, settings.partitions if per_file else None)
        log.info("store %s: parsed %d record(s) from %d file(s)", spec.name, report.read, len(new))
        keys = pa.table({"key": pa.array([], pa.string())})
        if handle.table is not None and handle.data_files():
            keys = good.select("key").distinct().toArrow()
        existing_arrow = existing_versions(handle, keys)
        existing = spark.createDataFrame(existing_arrow) if existing_arrow.num_rows else \
            spark.createDataFrame([], _existing_ddl())
        ctx = RunContext(settings, handle.state, run, explicit_partitions=flags["part"] > 0,
                         any_offsets=flags["offset"] > 0, file_max=file_max,
                         tasks=write_tasks(settings.buckets, report.read))
        empty = existing_arrow.num_rows == 0
        classified = classify(spark, good, existing, ctx, existing_empty=empty).persist(
            StorageLevel.MEMORY_AND_DISK)
        try:
            parse_rejections = sum(report.rejected.values())
            state = _next_state(classified, handle.state, run, new, report)
            log.info("store %s: %d accepted, %d rejected; writing", spec.name,
                     report.accepted_latest + report.accepted_out_of_order, sum(report.rejected.values()))
            rows = rows_to_write(classified, existing, ctx, existing_empty=empty)
            store_adds = collect_adds(
                rows.mapInArrow(make_store_writer(handle.path, run, STORE_FILE_SCHEMA), FILE_INFO_DDL))
            rejected = sum(report.rejected.values())
            rejected_adds = _write_rejected(parsed, classified, handle.path, run, new, spec.format,
                                            decided=rejected - parse_rejections, total=rejected)
            state.rejected_adds = rejected_adds
            if spec.changelog:
                if state.changelog_since is None:
                    state.changelog_since = run
                state.changelog_adds = _write_changelog(classified, handle.path, run, ctx)
            log.info("store %s: committing %d data file(s), %d rejected file(s)", spec.name, len(store_adds),
                     len(rejected_adds))
            version = commit_store(handle, store_adds, state)
            if rejected_adds:
                commit_rejected(handle.path, run, rejected_adds)
            if state.changelog_adds:
                commit_side(handle.path, CHANGELOG_DIR, run, state.changelog_adds)
            report.snapshot = version
        finally:
            classified.unpersist()
    finally:
        parsed.unpersist()


def _existing_ddl() -> str:
    names = {"string": "string", "int64": "bigint", "int32": "int", "bool": "boolean"}
    return ", ".join(f"`{f.name}` {names[str(f.type)]}" for f in STORE_SCHEMA if f.name != "bucket")


def _parse_stats(parsed: DataFrame, report: StoreReport,
                 partitions: int | None) -> tuple[dict[str, int], dict[tuple[int, int], int] | None]:
    """Fill ``read`` and the parse-stage rejections; count records naming partitions/offsets;
    and the largest valid timestamp per (default partition, file index), for
    ``RunContext.file_max``.
    One aggregation, the run's first action (it parses and caches every file); its result has
    a row per reason, file and partition (the caller bounds files x partitions; with
    ``partitions`` None only a row per reason, and no maxima)."""
    flags = {"part": 0, "offset": 0}
    file_max: dict[tuple[int, int], int] | None = None if partitions is None else {}
    if partitions is None:
        file, default_p = F.lit(None).cast("int"), F.lit(None).cast("int")
    else:
        file = file_of(F.col("seq"))
        default_p = F.when(F.col("reason").isNull(), default_partition_of(F.col("key"), partitions))
    rows = parsed.groupBy("reason", file.alias("file"), default_p.alias("p")).agg(
        F.count(F.lit(1)).alias("n"), F.count("part").alias("part"), F.count("offset").alias("offset"),
        F.max("ts").alias("max_ts"),
    ).collect()
    for row in rows:
        report.read += row["n"]
        if row["reason"] is not None:
            report.rejected[row["reason"]] = report.rejected.get(row["reason"], 0) + row["n"]
        else:
            flags["part"] += row["part"]
            flags["offset"] += row["offset"]
            if file_max is not None:
                file_max[(row["p"], row["file"])] = row["max_ts"]
    return flags, file_max


def _next_state(classified: DataFrame, state: StoreState, run: int,
                new: dict[str, str], report: StoreReport) -> StoreState:
    """Outcome counts for the report and the store state after this run."""
    rows = classified.groupBy("outcome", "p").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.col("latest").cast("int")).alias("latest"),
        F.sum(F.col("replaced").cast("int")).alias("replaced"),
        F.sum(F.col("value").isNull().cast("int")).alias("tombstones"),
        F.max("ts").alias("st"), F.max("offset").alias("off"),
    ).collect()
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
    return StoreState(run=run, stream_time=stream_time, max_offset=max_offset,
                      done_files=sorted(set(state.done_files) | set(new)), changelog_since=state.changelog_since)


def _write_changelog(classified: DataFrame, store_path: str, run: int, ctx: RunContext) -> list[dict[str, Any]]:
    """The run's accepted records in processing order (``seq`` 1, 2, ...) into ``_changelog``.

    Across partitions the order is (path, line/row); inside a partition ordered by offset, the
    k-th record of the partition takes the k-th (path, line/row) slot of that partition, which
    keeps every partition's own order (SEMANTICS.md §1) in one sequence.
    """
    acc = classified.filter(F.col("outcome") == "accepted").select("key", "value", "ts", "p", "ord0", "seq")
    if ctx.any_offsets:
        by_order = Window.partitionBy("p").orderBy(F.col("ord0").asc_nulls_first(), "seq")
        records = acc.withColumn("k", F.row_number().over(by_order)).drop("seq")
        slots = acc.select("p", "seq").withColumn("k", F.row_number().over(Window.partitionBy("p").orderBy("seq")))
        acc = records.join(slots, ["p", "k"])
    out = acc.select(
        F.lit(run).cast("bigint").alias("run"),
        F.row_number().over(Window.orderBy("seq")).cast("bigint").alias("seq"),
        "key", "value", F.col("ts").alias("timestamp"), F.col("p").cast("int").alias("partition"),
    )
    root = os.path.join(store_path, CHANGELOG_DIR)
    return collect_adds(out.repartition(1).sortWithinPartitions("seq").mapInArrow(
        make_plain_writer(root, run, CHANGELOG_SCHEMA), FILE_INFO_DDL))


def _write_rejected(parsed: DataFrame, classified: DataFrame | None, store_path: str, run: int,
                    new: dict[str, str], fmt: str | None, decided: int = 0,
                    total: int | None = None) -> list[dict[str, Any]]:
    """The run's rejected records: the parser's (with their text), and, when ``classified`` is
    given and ``decided`` > 0, those rejected by the decisions, whose text is read again from
    their files (``ingest.order``: the run does not carry the text of parsed records).

    With ``total`` (all rejections of the run) up to ``DRIVER_REJECTIONS`` the rows are
    collected and the file written on the driver: the same file, without about five Spark
    jobs (an incremental batch's usual case); else Spark assembles and writes it."""
    if total == 0:
        return []
    files = [(full, format_of(rel, fmt)) for rel, full in new.items()]
    sources = list(new)
    rejected = parsed.filter(F.col("reason").isNotNull()).select("seq", "part", "offset", "reason", "detail", "raw")
    later = None
    if classified is not None and decided:
        later = classified.filter(F.col("outcome") != "accepted").select(
            "seq", "part", "offset", F.col("outcome").alias("reason"), "detail")
    root = rejected_path(store_path)
    ingested_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if total is not None and total <= DRIVER_REJECTIONS:
        parts = [rejected.toArrow()]
        if later is not None:
            decided_rows = later.toArrow()
            texts = pa.Table.from_batches(list(_read_texts(files, decided_rows.column("seq").to_numpy())),
                                          schema=_TEXT_SCHEMA)
            parts.append(decided_rows.join(texts, "seq").select(parts[0].column_names))
        table = pa.concat_tables([t.cast(parts[0].schema) for t in parts]).sort_by("seq")
        seq = table.column("seq").to_numpy()
        file_index, pos = split_seq(seq)
        is_row = np.array([files[i][1] == "parquet" for i in file_index], dtype=bool)
        out = pa.table({
            "run": pa.array(np.full(len(seq), run), pa.int64()),
            "source": pa.array([sources[i] for i in file_index], pa.string()),
            "line": pa.array(pos, pa.int64(), mask=is_row),
            "row": pa.array(pos, pa.int64(), mask=~is_row),
            "partition": table.column("part"),
            "offset": table.column("offset"),
            "reason": table.column("reason"),
            "raw": table.column("raw"),
            "detail": table.column("detail"),
            "ingested_at": pa.array([ingested_at] * len(seq), pa.string()),
        })
        return write_local(make_plain_writer(root, run, REJECTED_SCHEMA), out)
    spark = parsed.sparkSession
    names = spark.createDataFrame([(index, rel, files[index][1] == "parquet") for index, rel in enumerate(sources)],
                                  "file int, source string, is_row boolean")
    if later is not None:
        texts = later.select("seq", file_of(F.col("seq")).alias("file")).repartition("file").mapInArrow(
            _text_reader(files), "seq bigint, raw string")
        rejected = rejected.unionByName(later.join(texts, "seq"))
    pos_col = F.col("seq").bitwiseAND(F.lit(MAX_POS))
    frame = rejected.withColumn("file", file_of(F.col("seq"))).join(F.broadcast(names), "file").select(
        "seq",
        F.lit(run).cast("bigint").alias("run"),
        "source",
        F.when(~F.col("is_row"), pos_col).alias("line"),
        F.when(F.col("is_row"), pos_col).alias("row"),
        F.col("part").alias("partition"),
        "offset",
        "reason",
        "raw",
        "detail",
        F.lit(ingested_at).alias("ingested_at"),
    )
    return collect_adds(
        frame.repartition(1).sortWithinPartitions("seq")
        .mapInArrow(make_plain_writer(root, run, REJECTED_SCHEMA), FILE_INFO_DDL)
    )


_TEXT_SCHEMA = pa.schema([pa.field("seq", pa.int64()), pa.field("raw", pa.string())])


def _read_texts(files: list[tuple[str, str]], seqs: Any) -> Iterator[pa.RecordBatch]:
    """(seq, raw) batches of at most ``BATCH_ROWS`` for the records ``seqs`` (a numpy array),
    read from their files (``files[i]``: path and format of file index i)."""
    seqs = np.unique(seqs)  # sorted: each file's positions ascending; 8 bytes per record
    files_of, _ = split_seq(seqs)
    for file in np.unique(files_of):
        base = file_seq_base(int(file))
        full, file_fmt = files[int(file)]
        out_seq: list[int] = []
        out_raw: list[str] = []
        for pos, text in raw_texts(full, file_fmt, (seqs[files_of == file] - base).tolist()):
            out_seq.append(base + pos)
            out_raw.append(text)
            if len(out_seq) == BATCH_ROWS:
                yield pa.RecordBatch.from_pydict({"seq": out_seq, "raw": out_raw}, schema=_TEXT_SCHEMA)
                out_seq, out_raw = [], []
        if out_seq:
            yield pa.RecordBatch.from_pydict({"seq": out_seq, "raw": out_raw}, schema=_TEXT_SCHEMA)


def _text_reader(files: list[tuple[str, str]]):  # type: ignore[no-untyped-def]
    """mapInArrow function: (seq, file) rows -> (seq, raw), ``_read_texts`` on an executor."""

    def read(batches):  # type: ignore[no-untyped-def]
        columns = [batch.column(0) for batch in batches]
        if columns:
            yield from _read_texts(files, pa.concat_arrays(columns).to_numpy())

    return read
