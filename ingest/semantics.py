"""Kafka Streams versioned-store semantics (docs/semantics.md, rules 1-12 and 19-22), computed set-wise in Spark.

Record-at-a-time semantics without a record-at-a-time loop:

- A record's stream time is the running maximum of the timestamps of the valid records before
  it in its partition's processing order (plus the persisted stream time of earlier runs). A
  late record can never raise that maximum (it is below it), so including late records in the
  running maximum gives exactly the record-at-a-time answer: one window function.
- A put is *latest* when its timestamp is >= every version of its key that exists when it is
  processed: the key's stored versions and the accepted records of the key processed before
  it in this run.
- Final versions: per (key, timestamp) the last accepted record in processing order wins
  (same-timestamp replacement); ``valid_to`` is the next timestamp of the key.
  Only rows whose content changed are written (append layout, ``versiq.layout``).

The per-key decisions are one window over one sort: a key's accepted records ordered by
(timestamp desc, processing order desc). In that order the rows before a record are exactly
the records with a greater timestamp plus the same-timestamp records processed *after* it, so

- *latest*: no row before it was processed earlier (the running minimum of processing order
  over the rows before it is greater than its own);
- *replaced*: the next row has the same timestamp (an earlier record of that timestamp exists);
- *final*: the previous row has a greater timestamp (or there is none), and that timestamp is
  its ``valid_to``.

(A timestamped store keeps one value per key: its window is simply in processing order.)

Every decision is a column of one DataFrame (no filter-then-union branches, which made Spark
recompute the upstream windows per branch). The key window runs after one shuffle by write
bucket (``crc32(key) mod buckets``), so the cached result is already laid out for the writer:
a first build shuffles its records once. Processing order is carried as BIGINTs (``ord0``, the
offset when a partition is ordered by offsets, and ``seq``, see ``ingest.order``) rather than
the (source, pos) strings they encode.

Stream time on a first build without offsets or explicit partitions (the common bulk load)
needs no shuffle either: each record carries the running maximum of its file (``fst``,
computed while parsing) and the driver combines the per-file maxima of the earlier files
(``RunContext.file_max``, from the parse statistics) into ``files_before``.

Check order for a record: parse rules (ingest.records) -> ``bad_partition`` ->
``partition_conflict`` -> ``duplicate_offset`` -> ``late`` (versioned stores only).

A key's home partition is the partition of its stored versions, else that of its first record
(by source path, line/row) in the run with a valid partition. This is what a user expects
when every key keeps one partition; if a key's first record is rejected later (late or a
duplicate offset) and a later one names another partition, a split between runs could decide
differently: a documented limitation of explicit ``partition`` fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from versiq.durations import format_duration
from versiq.ingest.bucketing import by_bucket
from versiq.ingest.order import POS_BITS
from versiq.layout import StoreSettings, StoreState


@dataclass(frozen=True)
class RunContext:
    settings: StoreSettings
    state: StoreState
    run: int
    #: Whether any record of this run names a partition / carries an offset. When none does,
    #: the windows that only those fields need are skipped (the common case, and much cheaper).
    explicit_partitions: bool = True
    any_offsets: bool = True
    #: Largest valid timestamp per (default partition, file index) of this run, from the parse
    #: statistics; with ``fst`` it gives stream time without a shuffle (module docstring).
    #: None: not collected (too many files x partitions), Spark computes it.
    file_max: dict[tuple[int, int], int] | None = None
    #: Spark tasks of the key window and of the writer (each holds whole buckets).
    tasks: int = 1


def bucket_of(key: Column, buckets: int) -> Column:
    """``versiq.layout.bucket_of`` in Spark: CRC-32 of the key's UTF-8 bytes modulo buckets."""
    return _crc32_mod(key, buckets)


def default_partition_of(key: Column, partitions: int) -> Column:
    """``versiq.layout.default_partition_of`` in Spark (a record that names no partition)."""
    return _crc32_mod(key, partitions)


def _crc32_mod(key: Column, n: int) -> Column:
    return F.pmod(F.crc32(F.encode(key, "UTF-8")), F.lit(n)).cast("int")


def _with_prior_state(spark: SparkSession, frame: DataFrame, state: StoreState) -> DataFrame:
    """Add ``prev_st`` / ``prev_off``: the partition's stream time / highest offset from earlier
    runs. A broadcast join, not a map literal: Spark looks a map up by a linear scan, which
    costs rows x partitions (thousands of partitions made a run several times slower)."""
    parts = sorted(set(state.stream_time) | set(state.max_offset))
    if not parts:
        return frame.withColumn("prev_st", F.lit(None).cast("bigint")).withColumn(
            "prev_off", F.lit(None).cast("bigint"))
    prior = spark.createDataFrame(
        [(p, state.stream_time.get(p), state.max_offset.get(p)) for p in parts],
        "p int, prev_st bigint, prev_off bigint")
    return frame.join(F.broadcast(prior), "p", "left")


def file_of(seq: Column) -> Column:
    """The file index of a ``seq`` (``ingest.order``): files are processed in index order."""
    return F.shiftright(seq, POS_BITS).cast("int")


def files_before(file_max: dict[tuple[int, int], int]) -> list[tuple[int, int, int]]:
    """(partition, file index, largest valid timestamp of the partition in the earlier files
    of the run), for every file that has earlier ones."""
    out: list[tuple[int, int, int]] = []
    running: dict[int, int] = {}
    for (p, file), ts in sorted(file_max.items()):
        if p in running:
            out.append((p, file, running[p]))
            running[p] = max(running[p], ts)
        else:
            running[p] = ts
    return out


def _null(kind: str) -> Column:
    return F.lit(None).cast(kind)


def classify(spark: SparkSession, records: DataFrame, existing: DataFrame, ctx: RunContext,
             existing_empty: bool = False) -> DataFrame:
    """Every record of the run with its ``outcome`` and, for accepted ones, the put decisions;
    partitioned by write bucket into ``ctx.tasks`` partitions."""
    s = ctx.settings
    P = s.partitions
    bad_part = F.col("part").isNotNull() & (F.col("part") >= P)
    # A bad partition (any int64) must not reach the int cast: ANSI mode raises on overflow.
    df = records.withColumn(
        "p",
        F.when(bad_part, F.lit(None).cast("int"))
        .when(F.col("part").isNotNull(), F.col("part").cast("int")).otherwise(default_partition_of(F.col("key"), P)),
    )
    if existing_empty:
        df = df.withColumn("home_stored", _null("int"))
    else:
        homes = existing.groupBy("key").agg(F.first("partition").alias("home_stored"))
        df = df.join(homes, "key", "left")
    if ctx.explicit_partitions:
        w_first = Window.partitionBy("key").orderBy("seq").rowsBetween(
            Window.unboundedPreceding, Window.unboundedFollowing)
        df = df.withColumn("home_run", F.first(F.when(~bad_part, F.col("p")), ignorenulls=True).over(w_first))
    else:  # every partition is crc32(key) mod P: a key's records all agree
        df = df.withColumn("home_run", F.col("p"))
    home = F.coalesce(F.col("home_stored"), F.col("home_run"))
    conflict = ~bad_part & (F.col("p") != home)
    df = df.withColumn(
        "outcome0", F.when(bad_part, F.lit("bad_partition")).when(conflict, F.lit("partition_conflict"))
    ).withColumn(
        "detail0",
        F.when(bad_part, F.format_string("partition %d is not in [0, %d)", F.col("part"), F.lit(P)))
        .when(conflict, F.format_string("key belongs to partition %d, record names partition %d",
                                        home, F.col("p"))),
    ).withColumn("valid0", F.col("outcome0").isNull())
    df = _with_prior_state(spark, df, ctx.state)

    # Processing order inside a partition: by offset when every (valid) record of it has one.
    if ctx.any_offsets:
        w_p = Window.partitionBy("p")
        by_offset = F.count(F.when(F.col("valid0"), F.lit(1))).over(w_p) == \
            F.count(F.when(F.col("valid0"), F.col("offset"))).over(w_p)
        df = df.withColumn("ord0", F.when(by_offset, F.col("offset")))
    else:
        df = df.withColumn("ord0", _null("bigint"))
    order = [F.col("ord0").asc_nulls_first(), F.col("seq")]

    if ctx.any_offsets:
        prev_max_off = F.col("prev_off")
        w_off = Window.partitionBy("p", "offset", "valid0").orderBy(*order)
        dup = F.col("valid0") & F.col("offset").isNotNull() & (
            (prev_max_off.isNotNull() & (F.col("offset") <= prev_max_off)) | (F.row_number().over(w_off) > 1)
        )
        df = df.withColumn("dup", dup)
    else:
        df = df.withColumn("dup", F.lit(False))
    df = df.withColumn("valid1", F.col("valid0") & ~F.col("dup"))
    df = _with_stream_time(spark, df, ctx, order, existing_empty)
    if s.kind == "versioned":
        late = F.col("valid1") & F.col("st_before").isNotNull() & \
            (F.col("ts") < F.col("st_before") - F.lit(s.history_retention_ms))
    else:
        late = F.lit(False)
    df = df.withColumn("late", late).withColumn("accepted", F.col("valid1") & ~F.col("late"))

    # Put outcomes of accepted records against the key's stored versions and earlier records.
    if existing_empty:
        df = df.withColumn("stored_max", _null("bigint")).withColumn("stored_hit", _null("boolean"))
    else:
        stored = existing.groupBy("key").agg(F.max("valid_from").alias("stored_max"))
        stored_ts = existing.select("key", F.col("valid_from").alias("ts"), F.lit(True).alias("stored_hit"))
        df = df.join(stored, "key", "left").join(stored_ts, ["key", "ts"], "left")
    # A key's accepted records share one partition (conflicts are rejected), so inside a key
    # processing order is the offset when the partition is ordered by offsets, else ``seq``.
    df = by_bucket(df.withColumn("ord", F.coalesce(F.col("ord0"), F.col("seq"))).withColumn(
        "bucket", bucket_of(F.col("key"), s.buckets)), ctx.tasks)
    # ``slot`` (a function of the key) keeps the bucket partitioning for the window. ``key``
    # first: Spark sorts by a prefix of the first sort column, and a task holds one bucket, so
    # a leading ``slot`` would make every comparison a full row comparison.
    by_key = Window.partitionBy("key", "slot", "accepted")
    if s.kind == "timestamped":
        w = by_key.orderBy("ord")
        prev_ts = F.coalesce(F.lag("ts").over(w), F.col("stored_max"))
        latest = prev_ts.isNull() | (F.col("ts") >= prev_ts)
        replaced = F.lit(False)
        final = F.lead("ord").over(w).isNull()
        valid_to = _null("bigint")
    else:
        w = by_key.orderBy(F.col("ts").desc(), F.col("ord").desc())
        processed_before = F.min("ord").over(w.rowsBetween(Window.unboundedPreceding, -1))
        latest = (F.col("stored_max").isNull() | (F.col("ts") >= F.col("stored_max"))) & \
            (processed_before.isNull() | (processed_before > F.col("ord")))
        replaced = F.col("stored_hit").isNotNull() | F.coalesce(F.lead("ts").over(w) == F.col("ts"), F.lit(False))
        newer = F.lag("ts").over(w)
        final = newer.isNull() | (newer != F.col("ts"))
        valid_to = newer
    df = df.withColumn("latest", F.when(F.col("accepted"), latest)).withColumn(
        "replaced", F.when(F.col("accepted"), replaced)).withColumn(
        "final", F.col("accepted") & final).withColumn("valid_to", F.when(F.col("final"), valid_to))

    outcome = F.coalesce(
        F.col("outcome0"),
        F.when(F.col("dup"), F.lit("duplicate_offset")),
        F.when(F.col("late"), F.lit("late")),
        F.lit("accepted"),
    )
    detail = F.coalesce(
        F.col("detail0"),
        F.when(F.col("dup"), F.format_string(
            "offset %d of partition %d was already processed", F.col("offset"), F.col("p"))),
        F.when(F.col("late"), F.format_string(
            "timestamp %s (%d) is older than stream time %s minus history retention %s (horizon %s)",
            _rfc3339(F.col("ts")), F.col("ts"), _rfc3339(F.col("st_before")),
            F.lit(format_duration(s.history_retention_ms)),
            _rfc3339(F.col("st_before") - F.lit(s.history_retention_ms)))),
    )
    return df.select("seq", "key", "value", "ts", "part", "offset", "p", "ord0", "bucket",
                     outcome.alias("outcome"), detail.alias("detail"),
                     F.when(F.col("late"), F.col("st_before")).alias("st_before"), "latest", "replaced",
                     "final", "valid_to")


def _rfc3339(millis: Column) -> Column:
    """Epoch ms as the RFC 3339 UTC text of ``versiq.timestamps.format_timestamp`` (the session's
    time zone is UTC), for details people read."""
    return F.date_format(F.timestamp_millis(millis), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")


def _with_stream_time(spark: SparkSession, df: DataFrame, ctx: RunContext, order: list[Column],
                      existing_empty: bool) -> DataFrame:
    """Add ``st_before``: stream time before each valid record, the running max of the earlier
    valid timestamps of its partition in processing order and of the partition's stream time
    of earlier runs (``prev_st``)."""
    valid_ts = F.when(F.col("valid1"), F.col("ts"))
    if ctx.any_offsets or not existing_empty:
        w_part = Window.partitionBy("p").orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
        st_before = F.greatest(F.col("prev_st"), F.max(valid_ts).over(w_part))
    elif not ctx.explicit_partitions and ctx.file_max is not None:
        # Every record's partition is its default one and order is (source, pos): the parser's
        # running max of the file (``fst``) and the earlier files' maxima, joined from the driver.
        # Not for runs touching stored keys: a stored key's home may be another partition, so
        # the parser's idea of which records are valid could be wrong.
        before = files_before(ctx.file_max)
        if before:
            earlier = spark.createDataFrame(before, "p int, file int, files_before bigint")
            df = df.withColumn("file", file_of(F.col("seq"))).join(F.broadcast(earlier), ["p", "file"], "left")
        else:
            df = df.withColumn("files_before", _null("bigint"))
        st_before = F.greatest(F.col("prev_st"), F.col("files_before"), F.col("fst"))
    else:
        # A first build with explicit partitions (or too many files to collect their maxima)
        # and no offsets: processing order is (source, pos), and the prefix maximum is split in
        # two so that one stream-time partition is not one Spark task (a single core sorting
        # every record): within the file (a window per partition and file) and over the earlier
        # files of the partition (a window over one row per partition and file).
        df = df.withColumn("file", file_of(F.col("seq")))
        w_file = Window.partitionBy("p", "file").orderBy("seq").rowsBetween(Window.unboundedPreceding, -1)
        w_files = Window.partitionBy("p").orderBy("file").rowsBetween(Window.unboundedPreceding, -1)
        earlier_files = df.groupBy("p", "file").agg(F.max(valid_ts).alias("file_max")).withColumn(
            "files_before", F.max("file_max").over(w_files)).select("p", "file", "files_before")
        df = df.join(earlier_files, ["p", "file"], "left")
        st_before = F.greatest(F.col("prev_st"), F.col("files_before"), F.max(valid_ts).over(w_file))
    return df.withColumn("st_before", F.when(F.col("valid1"), st_before))


def rows_to_write(classified: DataFrame, existing: DataFrame, ctx: RunContext,
                  existing_empty: bool = False) -> DataFrame:
    """The store rows this run appends, changed versions (versioned) or keys (timestamped),
    partitioned by bucket into ``ctx.tasks`` partitions (whole buckets per task, the writer's
    input)."""
    s = ctx.settings
    final = classified.filter(F.col("final"))
    if s.kind == "timestamped":
        return _finish(final.select(
            "key", F.col("ts").alias("valid_from"), _null("bigint").alias("valid_to"), "value",
            F.col("value").isNull().alias("tombstone"), F.col("p").alias("partition"), "bucket"), ctx)
    if existing_empty:  # a first build: the classified rows are the versions, already in place
        return _finish(final.select(
            "key", F.col("ts").alias("valid_from"), "valid_to", "value", F.col("value").isNull().alias("tombstone"),
            F.col("p").alias("partition"), "bucket"), ctx)
    new = final.select(
        "key", F.col("ts").alias("valid_from"), "value", F.col("value").isNull().alias("tombstone"),
        F.col("p").alias("partition"), "bucket", F.lit(1).alias("src"), _null("bigint").alias("old_valid_to"))
    old = existing.select("key", "valid_from", "value", "tombstone", "partition",
                          bucket_of(F.col("key"), s.buckets).alias("bucket"), F.lit(0).alias("src"),
                          F.col("valid_to").alias("old_valid_to"))
    merged = by_bucket(new.unionByName(old), ctx.tasks)
    # a new version replaces the stored one at the same (key, valid_from): it sorts first
    w_dedupe = Window.partitionBy("key", "slot").orderBy("valid_from", F.col("src").desc())
    merged = merged.withColumn("prev_from", F.lag("valid_from").over(w_dedupe)).filter(
        F.col("prev_from").isNull() | (F.col("prev_from") != F.col("valid_from")))
    merged = merged.withColumn(
        "valid_to", F.lead("valid_from").over(Window.partitionBy("key", "slot").orderBy("valid_from")))
    changed = (F.col("src") == 1) | ~F.col("valid_to").eqNullSafe(F.col("old_valid_to"))
    return _finish(merged.filter(changed).select("key", "valid_from", "valid_to", "value", "tombstone",
                                                 F.col("partition").cast("int"), "bucket"), ctx)


def _finish(rows: DataFrame, ctx: RunContext) -> DataFrame:
    return rows.withColumn("partition", F.col("partition").cast("int")).withColumn(
        "run", F.lit(ctx.run).cast("bigint"))
