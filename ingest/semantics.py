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


def _map_literal(values: dict[int, int]) -> Column:
    """A map literal partition -> value (kept for ingest.semantics_linear; a lookup in it is a
    linear scan, so ``classify`` joins ``_with_prior_state`` instead)."""
    if not values:
        return F.create_map().cast("map<int,bigint>")
    items: list[Column] = []
    for key, value in sorted(values.items()):
        items += [F.lit(key).cast("int"), F.lit(value).cast("bigint")]
    return F.create_map(*items)


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


def classify(spark: SparkSession, records: DataFrame, existing: DataFrame, ctx: RunContext) -> DataFrame:
    """Decide every well-formed record: ``outcome`` is 'accepted' or a rejection reason.

    ``records``: source, pos, key, value, ts, part, offset (parse-valid records only).
    ``existing``: the store's current rows of the batch's keys (read rule applied).
    Adds: p (partition), ord0 (offset when the partition orders by offset), outcome, detail,
    and for accepted records ``latest`` and ``replaced``.
    """
    s = ctx.settings
    P = s.partitions
    bad_part = F.col("part").isNotNull() & (F.col("part") >= P)
    # A bad partition (any int64) must not reach the int cast: ANSI mode raises on overflow.
    recs = records.withColumn(
        "p",
        F.when(bad_part, F.lit(None).cast("int"))
        .when(F.col("part").isNotNull(), F.col("part").cast("int")).otherwise(
            F.pmod(F.crc32(F.encode(F.col("key"), "UTF-8")), F.lit(P)).cast("int")
        ),
    )

    # Home partition: stored versions first, else the first record of the key in this run.
    homes = existing.groupBy("key").agg(F.first("partition").alias("home_stored"))
    if ctx.explicit_partitions:
        w_first = Window.partitionBy("key").orderBy("source", "pos")
        recs = recs.withColumn(
            "home_run", F.first(F.when(~bad_part, F.col("p")), ignorenulls=True).over(
                w_first.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing))
        )
    else:  # every partition is crc32(key) mod P: a key's records all agree
        recs = recs.withColumn("home_run", F.col("p"))
    recs = recs.join(homes, "key", "left")
    home = F.coalesce(F.col("home_stored"), F.col("home_run"))
    conflict = ~bad_part & (F.col("p") != home)
    recs = recs.withColumn(
        "outcome",
        F.when(bad_part, F.lit("bad_partition")).when(conflict, F.lit("partition_conflict")),
    ).withColumn(
        "detail",
        F.when(bad_part, F.format_string("partition %d is not in [0, %d)", F.col("part"), F.lit(P)))
        .when(conflict, F.format_string("key belongs to partition %d, record names partition %d",
                                        home, F.col("p"))),
    )

    # Processing order inside a partition: by offset when every record of it has one.
    valid = _with_prior_state(spark, recs.filter(F.col("outcome").isNull()), ctx.state)
    if ctx.any_offsets:
        all_offsets = valid.groupBy("p").agg(
            (F.count(F.lit(1)) == F.count("offset")).alias("by_offset")
        )
        valid = valid.join(F.broadcast(all_offsets), "p").withColumn(
            "ord0", F.when(F.col("by_offset"), F.col("offset"))
        )
    else:
        valid = valid.withColumn("ord0", F.lit(None).cast("bigint"))
    order = [F.col("ord0").asc_nulls_first(), F.col("source"), F.col("pos")]

    if ctx.any_offsets:
        prev_max_off = F.col("prev_off")
        w_off = Window.partitionBy("p", "offset").orderBy(*order)
        dup = F.col("offset").isNotNull() & (
            (prev_max_off.isNotNull() & (F.col("offset") <= prev_max_off))
            | (F.row_number().over(w_off) > 1)
        )
        valid = valid.withColumn("dup", F.when(F.col("offset").isNull(), F.lit(False)).otherwise(dup))
    else:
        valid = valid.withColumn("dup", F.lit(False))
    valid = valid.withColumn(
        "outcome", F.when(F.col("dup"), F.lit("duplicate_offset"))
    ).withColumn(
        "detail",
        F.when(F.col("dup"), F.format_string(
            "offset %d of partition %d was already processed", F.col("offset"), F.col("p"))),
    )

    # Grace (versioned stores): running max of earlier valid timestamps in the partition.
    nondup = valid.filter(~F.col("dup"))
    w_part = Window.partitionBy("p").orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    st_before = F.greatest(F.col("prev_st"), F.max("ts").over(w_part))
    nondup = nondup.withColumn("st_before", st_before)
    if s.kind == "versioned":
        late = F.col("st_before").isNotNull() & (F.col("ts") < F.col("st_before") - F.lit(s.history_retention_ms))
    else:
        late = F.lit(False)
    nondup = nondup.withColumn("late", late).withColumn(
        "outcome", F.when(F.col("late"), F.lit("late")).otherwise(F.lit("accepted"))
    ).withColumn(
        "detail",
        F.when(F.col("late"), F.format_string(
            "timestamp %d is older than stream time %d minus history retention %d ms (horizon %d)",
            F.col("ts"), F.col("st_before"), F.lit(s.history_retention_ms),
            F.col("st_before") - F.lit(s.history_retention_ms))),
    )

    # Put outcomes of accepted records.
    acc = nondup.filter(F.col("outcome") == "accepted")
    stored = existing.groupBy("key").agg(F.max("valid_from").alias("stored_max"))
    stored_ts = existing.select("key", F.col("valid_from").alias("ts"), F.lit(True).alias("stored_hit"))
    acc = acc.join(stored, "key", "left").join(stored_ts, ["key", "ts"], "left")
    w_key = Window.partitionBy("key").orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    prior = F.greatest(F.col("stored_max"), F.max("ts").over(w_key))
    w_kts = Window.partitionBy("key", "ts").orderBy(*order)
    if s.kind == "versioned":
        replaced = F.col("stored_hit").isNotNull() | (F.row_number().over(w_kts) > 1)
    else:
        replaced = F.lit(False)
    if s.kind == "timestamped":
        prev_ts = F.coalesce(F.lag("ts").over(Window.partitionBy("key").orderBy(*order)), F.col("stored_max"))
        latest = prev_ts.isNull() | (F.col("ts") >= prev_ts)
    else:
        latest = prior.isNull() | (F.col("ts") >= prior)
    acc = acc.withColumn("latest", latest).withColumn("replaced", replaced)

    keep = ["source", "pos", "key", "value", "ts", "part", "offset", "p", "ord0", "outcome", "detail",
            "st_before"]
    rejected_early = recs.filter(F.col("outcome").isNotNull()).select(
        "source", "pos", "key", "value", "ts", "part", "offset", "p",
        F.lit(None).cast("bigint").alias("ord0"), "outcome", "detail",
        F.lit(None).cast("bigint").alias("st_before"))
    dups = valid.filter(F.col("dup")).select(*keep[:-1], F.lit(None).cast("bigint").alias("st_before"))
    lates = nondup.filter(F.col("outcome") == "late").select(*keep)
    rejected = rejected_early.unionByName(dups).unionByName(lates).withColumn(
        "latest", F.lit(None).cast("boolean")).withColumn("replaced", F.lit(None).cast("boolean"))
    return acc.select(*keep, "latest", "replaced").unionByName(rejected)


def rows_to_write(classified: DataFrame, existing: DataFrame, ctx: RunContext) -> DataFrame:
    """The store rows this run appends: changed versions (versioned) or keys (timestamped)."""
    s = ctx.settings
    acc = classified.filter(F.col("outcome") == "accepted")
    order_desc = [F.col("ord0").desc_nulls_last(), F.col("source").desc(), F.col("pos").desc()]
    if s.kind == "timestamped":
        w = Window.partitionBy("key").orderBy(*order_desc)
        rows = acc.withColumn("rn", F.row_number().over(w)).filter(F.col("rn") == 1).select(
            "key", F.col("ts").alias("valid_from"), F.lit(None).cast("bigint").alias("valid_to"),
            "value", F.col("value").isNull().alias("tombstone"), F.col("p").alias("partition"))
        return _finish(rows, ctx)
    w = Window.partitionBy("key", "ts").orderBy(*order_desc)
    new = acc.withColumn("rn", F.row_number().over(w)).filter(F.col("rn") == 1).select(
        "key", F.col("ts").alias("valid_from"), F.col("value").alias("new_value"),
        F.col("p").alias("new_partition"), F.lit(True).alias("is_new"))
    old = existing.select("key", "valid_from", F.col("valid_to").alias("old_valid_to"),
                          F.col("value").alias("old_value"), F.col("tombstone").alias("old_tombstone"),
                          F.col("partition").alias("old_partition"))
    merged = old.join(new, ["key", "valid_from"], "full_outer")
    value = F.when(F.col("is_new").isNotNull(), F.col("new_value")).otherwise(F.col("old_value"))
    merged = merged.withColumn("value", value).withColumn(
        "tombstone", F.when(F.col("is_new").isNotNull(), F.col("new_value").isNull())
        .otherwise(F.col("old_tombstone"))
    ).withColumn("partition", F.coalesce(F.col("old_partition"), F.col("new_partition")))
    merged = merged.withColumn(
        "valid_to", F.lead("valid_from").over(Window.partitionBy("key").orderBy("valid_from")))
    changed = F.col("is_new").isNotNull() | ~F.col("valid_to").eqNullSafe(F.col("old_valid_to"))
    rows = merged.filter(changed).select("key", "valid_from", "valid_to", "value", "tombstone",
                                         F.col("partition").cast("int"))
    return _finish(rows, ctx)


def _finish(rows: DataFrame, ctx: RunContext) -> DataFrame:
    B = ctx.settings.buckets
    return rows.withColumn(
        "bucket", F.pmod(F.crc32(F.encode(F.col("key"), "UTF-8")), F.lit(B)).cast("int")
    ).withColumn("run", F.lit(ctx.run).cast("bigint"))
