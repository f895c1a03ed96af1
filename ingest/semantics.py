"""Kafka Streams versioned-store semantics (docs/semantics.md, rules 1-12 and 19-22), computed set-wise in Spark.

For the runs Spark parses (beyond ``plan.PARSE_HERE_BYTES`` or ``parse.PARSE_HERE_ROWS``,
Parquet, Kafka, S3 sources, all but small runs with a cluster's master, every run with
``VERSIQ_PARSE_HERE_BYTES=0``); a run parsed in the driver is decided there by
``ingest.decisions_here``, the same rules in DuckDB (``tests/ingest/test_decisions_here.py``
keeps the two equal, column for column).

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

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from versiq.ingest import rules
from versiq.ingest.bucketing import by_slot, slot_sql
from versiq.ingest.frames import rows_frame
from versiq.ingest.sqltext import crc32_mod_sql, file_of_sql
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


def _x(sql: str) -> Column:
    return F.expr(sql)


#: Up to this many partitions with prior state, it is a ``CASE`` expression rather than a join
#: (a broadcast join is a Spark job of its own; a ``CASE`` is a linear scan per row).
PRIOR_STATE_CASE_MAX = 16


def _with_prior_state(spark: SparkSession, frame: DataFrame, state: StoreState) -> DataFrame:
    """Add ``prev_st`` / ``prev_off``: the partition's stream time / highest offset from earlier
    runs. For many partitions a broadcast join, not a map literal or a ``CASE``: Spark looks a
    map up by a linear scan, which costs rows x partitions (thousands of partitions made a run
    several times slower)."""
    parts = sorted(set(state.stream_time) | set(state.max_offset))
    if len(parts) <= PRIOR_STATE_CASE_MAX:
        def by_partition(values: dict[int, int]) -> str:
            cases = " ".join(f"WHEN {int(p)} THEN {int(v)}" for p, v in sorted(values.items()))
            return f"CAST(CASE p {cases} END AS BIGINT)" if cases else "CAST(NULL AS BIGINT)"

        return frame.withColumns({"prev_st": _x(by_partition(state.stream_time)),
                                  "prev_off": _x(by_partition(state.max_offset))})
    prior = rows_frame(spark, [(p, state.stream_time.get(p), state.max_offset.get(p)) for p in parts],
                       pa.schema([("p", pa.int32()), ("prev_st", pa.int64()), ("prev_off", pa.int64())]))
    return frame.join(F.broadcast(prior), "p", "left")


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


def stored_homes(existing: pa.Table) -> pa.Table:
    """Per stored key of a run (``existing``: the current rows of the run's keys, on the driver,
    ``store.existing_versions``, which always holds a key's newest version): ``home_stored``,
    the partition of its versions (one per key: a record naming another is rejected), and
    ``stored_max``, its newest version's timestamp.
    Computed here rather than by a Spark aggregation, which cost a cold run a shuffle and a
    Spark job of its own (about 0.5 s of a CLI run of 10k events into a 2M-version store)."""
    homes = existing.group_by("key").aggregate([("partition", "min"), ("valid_from", "max")])
    return pa.table({"key": homes.column("key"), "home_stored": homes.column("partition_min"),
                     "stored_max": homes.column("valid_from_max")})


def classify(spark: SparkSession, records: DataFrame, existing: DataFrame, ctx: RunContext,
             homes: DataFrame | None = None) -> DataFrame:
    """Every record of the run with its ``outcome`` and, for accepted ones, the put decisions
    (``ingest.rules``); partitioned by write bucket into ``ctx.tasks`` partitions. ``existing``:
    the stored versions of the run's keys, or of each key at least the suffix of its history from
    the version valid at its earliest record of the run on (``store.existing_versions``:
    contiguous, and holding the newest version); ``homes``: their ``stored_homes``, None when no
    key of the run is stored.

    As few DataFrame steps as the window functions allow (a window's input cannot hold another
    window): a step costs a py4j round trip and a plan analysis, most of a small run's driver
    time, so columns used once are inlined as their rule's expression."""
    s = ctx.settings
    existing_empty = homes is None
    P = int(s.partitions)
    df = records.withColumn("p", _x(rules.partition(rules.SPARK, P, s.partitioner)))
    df = _with_prior_state(spark, df, ctx.state)
    if homes is not None:
        # the key's stored home partition, its newest stored version, and stored timestamps
        stored_ts = existing.selectExpr("key", "valid_from AS ts", "true AS stored_hit")
        df = df.join(homes, "key", "left").join(stored_ts, ["key", "ts"], "left")
    if ctx.explicit_partitions:
        df = df.withColumn("home_run", _x(rules.home_run(rules.SPARK, P, True)))
        home = rules.home(not existing_empty)
    else:
        home = rules.home(not existing_empty, rules.home_run(rules.SPARK, P, False))
    outcome0 = rules.outcome0(P, home)
    first = {"outcome0": _x(outcome0), "detail0": _x(rules.detail0(rules.SPARK, P, home)),
             "valid0": _x(rules.valid0(outcome0))}
    if ctx.any_offsets:
        df = df.withColumns(first).withColumn("ord0", _x(rules.offset_order(rules.SPARK)))
        dup = rules.duplicate_offset(rules.SPARK)
        df = df.withColumns({"dup": _x(dup), "valid1": _x(rules.valid1(dup=dup))})
    else:
        df = df.withColumns({**first, "ord0": _x("CAST(NULL AS BIGINT)"), "dup": _x("false"),
                             "valid1": _x("valid0")})
    df, running = _running_stream_time(spark, df, ctx, existing_empty)
    st_before = rules.stream_time_before(running)
    late = rules.late(s.kind, s.history_retention_ms, st_before=st_before)
    bucket = crc32_mod_sql("key", s.buckets)
    decided = {"st_before": _x(st_before), "late": _x(late), "accepted": _x(rules.accepted(late=late)),
               "ord": _x(rules.KEY_ORDER), "bucket": _x(bucket), "slot": _x(slot_sql(bucket, ctx.tasks))}
    if existing_empty:
        decided |= {"stored_max": _x("CAST(NULL AS BIGINT)"), "stored_hit": _x("CAST(NULL AS BOOLEAN)")}
    df = by_slot(df.withColumns(decided), ctx.tasks)
    # ``slot`` (a function of the key) keeps the bucket partitioning for the key window. ``key``
    # first: Spark sorts by a prefix of the first sort column, and a task holds one bucket, so
    # a leading ``slot`` would make every comparison a full row comparison.
    latest, replaced, final, valid_to = rules.put_decisions(s.kind, "PARTITION BY key, slot, accepted")
    return df.selectExpr("seq", "key", "value", "ts", "part", "`offset`", "p", "ord0", "bucket",
                         f"{rules.OUTCOME} AS outcome",
                         f"{rules.detail(rules.SPARK, s.history_retention_ms)} AS detail",
                         "CASE WHEN late THEN st_before END AS st_before",
                         f"CASE WHEN accepted THEN {latest} END AS latest",
                         f"CASE WHEN accepted THEN {replaced} END AS replaced",
                         f"accepted AND {final} AS `final`",
                         f"CASE WHEN accepted AND {final} THEN {valid_to} END AS valid_to")


def _running_stream_time(spark: SparkSession, df: DataFrame, ctx: RunContext,
                         existing_empty: bool) -> tuple[DataFrame, str]:
    """``df`` (with what it needs joined) and the SQL of ``rules.RUNNING_STREAM_TIME`` for this
    run: the rule's one window, or for a large first build the same value without sorting a
    whole partition on one core."""
    if ctx.any_offsets or not existing_empty:
        return df, rules.RUNNING_STREAM_TIME
    if not ctx.explicit_partitions and ctx.file_max is not None:
        # Every record's partition is its default one and order is (source, pos): the parser's
        # running max of the file (``fst``) and the earlier files' maxima, joined from the driver.
        # Not for runs touching stored keys: a stored key's home may be another partition, so
        # the parser's idea of which records are valid could be wrong.
        before = files_before(ctx.file_max)
        if not before:
            return df, "greatest(prev_st, fst)"
        earlier = rows_frame(spark, before, pa.schema([("p", pa.int32()), ("file", pa.int32()),
                                                       ("files_before", pa.int64())]))
        df = df.withColumn("file", _x(file_of_sql("seq"))).join(F.broadcast(earlier), ["p", "file"], "left")
        return df, "greatest(prev_st, files_before, fst)"
    # A first build with explicit partitions (or too many files to collect their maxima)
    # and no offsets: processing order is (source, pos), and the prefix maximum is split in
    # two so that one stream-time partition is not one Spark task (a single core sorting
    # every record): within the file (a window per partition and file) and over the earlier
    # files of the partition (a window over one row per partition and file).
    df = df.withColumn("file", _x(file_of_sql("seq")))
    earlier_files = df.groupBy("p", "file").agg(F.max(_x(rules.VALID_TS)).alias("file_max")).selectExpr(
        "p", "file", f"max(file_max) OVER (PARTITION BY p ORDER BY file {rules.BEFORE}) AS files_before")
    df = df.join(earlier_files, ["p", "file"], "left")
    return df, (f"greatest(prev_st, files_before, "
                f"max({rules.VALID_TS}) OVER (PARTITION BY p, file ORDER BY seq {rules.BEFORE}))")


def rows_to_write(classified: DataFrame, existing: DataFrame, ctx: RunContext,
                  existing_empty: bool = False) -> DataFrame:
    """The store rows this run appends, changed versions (versioned) or keys (timestamped),
    partitioned by bucket into ``ctx.tasks`` partitions (whole buckets per task, the writer's
    input). ``existing`` as in ``classify``: an earlier version left out ends before every
    record of the run, so its ``valid_to`` cannot change, and the suffix's own ``valid_to``s come
    out as stored."""
    s = ctx.settings
    final = classified.filter("`final`")
    run = f"CAST({int(ctx.run)} AS BIGINT) AS run"
    if s.kind == "timestamped":
        return final.selectExpr("key", "ts AS valid_from", "CAST(NULL AS BIGINT) AS valid_to", "value",
                                "value IS NULL AS tombstone", "p AS `partition`", "bucket", run)
    if existing_empty:  # a first build: the classified rows are the versions, already in place
        return final.selectExpr("key", "ts AS valid_from", "valid_to", "value", "value IS NULL AS tombstone",
                                "p AS `partition`", "bucket", run)
    bucket = crc32_mod_sql("key", s.buckets)
    new = final.selectExpr(
        "key", "ts AS valid_from", "value", "value IS NULL AS tombstone", "p AS `partition`", "bucket",
        f"{slot_sql('bucket', ctx.tasks)} AS slot", "1 AS src", "CAST(NULL AS BIGINT) AS old_valid_to")
    old = existing.selectExpr("key", "valid_from", "value", "tombstone", "CAST(`partition` AS INT) AS `partition`",
                              f"{bucket} AS bucket", f"{slot_sql(bucket, ctx.tasks)} AS slot", "0 AS src",
                              "valid_to AS old_valid_to")
    merged = by_slot(new.unionByName(old), ctx.tasks)
    by_key = "PARTITION BY key, slot"
    # (Spark evaluates no window function in a filter: each is a column first)
    merged = merged.withColumn("kept", _x(rules.kept_version(by_key))).filter("kept")
    merged = merged.withColumn("valid_to", _x(rules.merged_valid_to(by_key)))
    return merged.filter(rules.WRITTEN).selectExpr(
        "key", "valid_from", "valid_to", "value", "tombstone", "`partition`", "bucket", run)
