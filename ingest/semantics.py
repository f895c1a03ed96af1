"""Kafka Streams versioned-store semantics (SEMANTICS.md §1-4), computed set-wise in Spark.

Record-at-a-time semantics without a record-at-a-time loop:

- A record's stream time is the running maximum of the timestamps of the valid records before
  it in its partition's processing order (plus the persisted stream time of earlier runs). A
  late record can never raise that maximum (it is below it), so including late records in the
  running maximum gives exactly the record-at-a-time answer: one window function.
- A put is *latest* when its timestamp is >= every version of its key that exists when it is
  processed: the key's stored versions and the accepted records of the key before it in this
  run (a running maximum per key).
- Final versions: per (key, timestamp) the last accepted record in processing order wins
  (same-timestamp replacement); ``valid_to`` is the next timestamp of the key (``lead``).
  Only rows whose content changed are written (append layout, ``versiq.layout``).

Every decision is a column of one DataFrame (no filter-then-union branches, which made Spark
recompute the upstream windows per branch): the run's records are shuffled once by stream-time
partition and once by key, and the merge with stored versions reuses the key partitioning of
the persisted result (a first build of a store shuffles nothing more).

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


def _null(kind: str) -> Column:
    return F.lit(None).cast(kind)


def classify(spark: SparkSession, records: DataFrame, existing: DataFrame, ctx: RunContext,
             existing_empty: bool = False) -> DataFrame:
    s = ctx.settings
    P = s.partitions
    bad_part = F.col("part").isNotNull() & (F.col("part") >= P)
    # A bad partition (any int64) must not reach the int cast: ANSI mode raises on overflow.
    df = records.withColumn(
        "p",
        F.when(bad_part, F.lit(None).cast("int"))
        .when(F.col("part").isNotNull(), F.col("part").cast("int")).otherwise(
            F.pmod(F.crc32(F.encode(F.col("key"), "UTF-8")), F.lit(P)).cast("int")
        ),
    )
    if existing_empty:
        df = df.withColumn("home_stored", _null("int"))
    else:
        homes = existing.groupBy("key").agg(F.first("partition").alias("home_stored"))
        df = df.join(homes, "key", "left")
    if ctx.explicit_partitions:
        w_first = Window.partitionBy("key").orderBy("source", "pos").rowsBetween(
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
    order = [F.col("ord0").asc_nulls_first(), F.col("source"), F.col("pos")]

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

    # Stream time before each record: running max of earlier valid timestamps in its partition.
    valid_ts = F.when(F.col("valid1"), F.col("ts"))
    if ctx.any_offsets or not existing_empty:
        w_part = Window.partitionBy("p").orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
        st_before = F.greatest(F.col("prev_st"), F.max(valid_ts).over(w_part))
    else:
        # A first build without offsets: processing order is (source, pos), and the prefix maximum
        # is split in two so that one stream-time partition is not one Spark task (a single core
        # sorting every record): within the file (a window per partition and file) and over the
        # earlier files of the partition (a window over one row per partition and file). Not
        # for later runs: their records would be read twice (the join with stored homes), for a
        # batch that is small anyway.
        w_file = Window.partitionBy("p", "source").orderBy("pos").rowsBetween(Window.unboundedPreceding, -1)
        w_files = Window.partitionBy("p").orderBy("source").rowsBetween(Window.unboundedPreceding, -1)
        earlier_files = df.groupBy("p", "source").agg(F.max(valid_ts).alias("file_max")).withColumn(
            "files_before", F.max("file_max").over(w_files)).select("p", "source", "files_before")
        df = df.join(earlier_files, ["p", "source"], "left")
        st_before = F.greatest(F.col("prev_st"), F.col("files_before"), F.max(valid_ts).over(w_file))
    df = df.withColumn("st_before", F.when(F.col("valid1"), st_before))
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
    w_key = Window.partitionBy("key").orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    accepted_ts = F.when(F.col("accepted"), F.col("ts"))
    if s.kind == "timestamped":
        prev_ts = F.coalesce(F.last(accepted_ts, ignorenulls=True).over(w_key), F.col("stored_max"))
        latest = prev_ts.isNull() | (F.col("ts") >= prev_ts)
        replaced = F.lit(False)
    else:
        prior = F.greatest(F.col("stored_max"), F.max(accepted_ts).over(w_key))
        latest = prior.isNull() | (F.col("ts") >= prior)
        w_kts = Window.partitionBy("key", "ts", "accepted").orderBy(*order)
        replaced = F.col("stored_hit").isNotNull() | (F.row_number().over(w_kts) > 1)
    df = df.withColumn("latest", F.when(F.col("accepted"), latest)).withColumn(
        "replaced", F.when(F.col("accepted"), replaced))

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
            "timestamp %d is older than stream time %d minus history retention %d ms (horizon %d)",
            F.col("ts"), F.col("st_before"), F.lit(s.history_retention_ms),
            F.col("st_before") - F.lit(s.history_retention_ms))),
    )
    return df.select("source", "pos", "key", "value", "ts", "part", "offset", "p", "ord0",
                     outcome.alias("outcome"), detail.alias("detail"),
                     F.when(F.col("late"), F.col("st_before")).alias("st_before"), "latest", "replaced")


def rows_to_write(classified: DataFrame, existing: DataFrame, ctx: RunContext,
                  existing_empty: bool = False) -> DataFrame:
    """The store rows this run appends: changed versions (versioned) or keys (timestamped)."""
    s = ctx.settings
    acc = classified.filter(F.col("outcome") == "accepted")
    order_desc = [F.col("ord0").desc_nulls_last(), F.col("source").desc(), F.col("pos").desc()]
    if s.kind == "timestamped":
        w = Window.partitionBy("key").orderBy(*order_desc)
        rows = acc.withColumn("rn", F.row_number().over(w)).filter(F.col("rn") == 1).select(
            "key", F.col("ts").alias("valid_from"), _null("bigint").alias("valid_to"),
            "value", F.col("value").isNull().alias("tombstone"), F.col("p").alias("partition"))
        return _finish(rows, ctx)
    w = Window.partitionBy("key", "ts").orderBy(*order_desc)
    new = acc.withColumn("rn", F.row_number().over(w)).filter(F.col("rn") == 1).select(
        "key", F.col("ts").alias("valid_from"), "value", F.col("value").isNull().alias("tombstone"),
        F.col("p").alias("partition"), F.lit(1).alias("src"), _null("bigint").alias("old_valid_to"))
    if existing_empty:
        merged = new
    else:
        old = existing.select("key", "valid_from", "value", "tombstone", "partition", F.lit(0).alias("src"),
                              F.col("valid_to").alias("old_valid_to"))
        merged = new.unionByName(old)
        # a new version replaces the stored one at the same (key, valid_from): it sorts first
        w_dedupe = Window.partitionBy("key").orderBy("valid_from", F.col("src").desc())
        merged = merged.withColumn("prev_from", F.lag("valid_from").over(w_dedupe)).filter(
            F.col("prev_from").isNull() | (F.col("prev_from") != F.col("valid_from")))
    merged = merged.withColumn(
        "valid_to", F.lead("valid_from").over(Window.partitionBy("key").orderBy("valid_from")))
    changed = (F.col("src") == 1) | ~F.col("valid_to").eqNullSafe(F.col("old_valid_to"))
    rows = merged.filter(changed).select("key", "valid_from", "valid_to", "value", "tombstone",
                                         F.col("partition").cast("int"))
    return _finish(rows, ctx)


def _finish(rows: DataFrame, ctx: RunContext) -> DataFrame:
    B = ctx.settings.buckets
    return rows.withColumn(
        "bucket", F.pmod(F.crc32(F.encode(F.col("key"), "UTF-8")), F.lit(B)).cast("int")
    ).withColumn("run", F.lit(ctx.run).cast("bigint"))
