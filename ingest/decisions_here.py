"""The DuckDB executor of the rule book (``ingest.rules``): a run parsed in this process
(``parse.parse_here``) is decided here, over its Arrow table, before the JVM is needed.

The rules are ``ingest.rules``'; this module only arranges them: each column one step of a chain
of CTEs, stream time always the rule's one window (DuckDB computes it in a single pass, where
Spark needs the per-file maxima of the parse to avoid sorting every record on one core). The
result is the classified table of ``semantics.classify`` and the rows of
``semantics.rows_to_write`` as Arrow tables; Spark only writes them (``task_frame``).
``tests/ingest/test_decisions_here.py`` runs both executors on random runs, column for column.

Why a second executor: a run parsed here already holds its records in this process, and a JVM
started for the run takes seconds to be ready. Deciding here overlaps the decisions with that
start, where in Spark they were its longest stage (docs/benchmarks.md, "A run parsed in the
driver is decided there")."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import reduce
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from versiq import layout, storage
from versiq.ingest import rules
from versiq.ingest.bucketing import by_bucket
from versiq.ingest.frames import spread_frame
from versiq.ingest.semantics import RunContext
from versiq.ingest.spark import local_relation_bytes
from versiq.layout import StoreSettings

#: The classified records (``semantics.classify``'s columns).
CLASSIFIED_SCHEMA = pa.schema([
    ("seq", pa.int64()), ("key", pa.string()), ("value", pa.string()), ("ts", pa.int64()),
    ("part", pa.int64()), ("offset", pa.int64()), ("p", pa.int32()), ("ord0", pa.int64()),
    ("bucket", pa.int32()), ("outcome", pa.string()), ("detail", pa.string()), ("st_before", pa.int64()),
    ("latest", pa.bool_()), ("replaced", pa.bool_()), ("final", pa.bool_()), ("valid_to", pa.int64()),
])


def with_key_crc(table: pa.Table, murmur2: bool = False) -> pa.Table:
    """``table`` with ``crc``: the zlib CRC-32 of each key's UTF-8 bytes (``layout.bucket_of``,
    ``layout.default_partition_of`` of a ``crc32`` store), and with ``murmur2`` also ``murmur2``:
    Kafka's positive murmur2 of them (``layout.murmur2_positive``), each computed once per
    distinct key."""
    encoded = pc.dictionary_encode(table.column("key")).combine_chunks()
    keys = encoded.dictionary.cast(pa.binary())
    crcs = np.fromiter((zlib.crc32(key) for key in keys.to_pylist()), dtype=np.int64, count=len(keys))
    table = table.append_column("crc", pa.array(crcs, pa.int64()).take(encoded.indices))
    if murmur2:
        hashes = layout.murmur2_positive(keys).astype(np.int64)
        table = table.append_column("murmur2", pa.array(hashes, pa.int64()).take(encoded.indices))
    return table


def _connect() -> duckdb.DuckDBPyConnection:
    return storage.duckdb_connect(config={"preserve_insertion_order": False})


def classify_here(parsed: pa.Table, existing: pa.Table, ctx: RunContext) -> pa.Table:
    """``semantics.classify`` of the valid records of ``parsed`` (``order.RUN_SCHEMA``) against
    ``existing`` (``store.existing_versions``), as a ``CLASSIFIED_SCHEMA`` table: the columns of
    ``ingest.rules``, one step of a chain of DuckDB CTEs each. Of ``ctx`` only the settings, the
    state before the run and the flags say which windows are needed."""
    settings, state = ctx.settings, ctx.state
    P, B = int(settings.partitions), int(settings.buckets)
    d = rules.DUCKDB
    good = parsed.filter(pc.is_null(parsed.column("reason"))).select(["seq", "key", "value", "ts", "part", "offset"])
    seq = good.column("seq").to_numpy()
    if not (np.diff(seq) > 0).all():  # a parse yields records in processing order; if not, sort
        good = good.sort_by("seq")
    parts = sorted(set(state.stream_time) | set(state.max_offset))
    prior = pa.table({"p": pa.array(parts, pa.int32()),
                      "prev_st": pa.array([state.stream_time.get(p) for p in parts], pa.int64()),
                      "prev_off": pa.array([state.max_offset.get(p) for p in parts], pa.int64())})
    stored = existing.num_rows > 0
    home = rules.home(stored)
    latest, replaced, final, valid_to = rules.put_decisions(settings.kind, "PARTITION BY key, accepted")
    if ctx.any_offsets:
        ord0, dup = rules.offset_order(d), rules.duplicate_offset(d)
    else:
        ord0, dup = "CAST(NULL AS BIGINT)", "false"
    joins = "LEFT JOIN homes USING (key) LEFT JOIN stored_ts USING (key, ts)" if stored else ""
    stored_cols = "" if stored else ", CAST(NULL AS BIGINT) AS stored_max, CAST(NULL AS BOOLEAN) AS stored_hit"
    sql = f"""
    WITH r0 AS (
      SELECT *, {rules.partition(d, P, settings.partitioner)} AS p, {d.key_mod(B)} AS bucket {stored_cols}
      FROM good {joins}
    ), r1 AS (
      SELECT *, {rules.home_run(d, P, ctx.explicit_partitions)} AS home_run FROM r0 LEFT JOIN prior USING (p)
    ), r2 AS (
      SELECT *, {rules.outcome0(P, home)} AS outcome0, {rules.detail0(d, P, home)} AS detail0 FROM r1
    ), r3 AS (
      SELECT *, {rules.valid0()} AS valid0 FROM r2
    ), r4 AS (
      SELECT *, {ord0} AS ord0 FROM r3
    ), r5 AS (
      SELECT *, {dup} AS dup FROM r4
    ), r6 AS (
      SELECT *, {rules.valid1()} AS valid1 FROM r5
    ), r7 AS (
      SELECT *, {rules.stream_time_before()} AS st_before FROM r6
    ), r8 AS (
      SELECT *, {rules.late(settings.kind, settings.history_retention_ms)} AS late, {rules.KEY_ORDER} AS ord FROM r7
    ), r9 AS (
      SELECT *, {rules.accepted()} AS accepted FROM r8
    )
    SELECT seq AS decided_seq, p, ord0, bucket,
           {rules.OUTCOME} AS outcome,
           {rules.detail(d, settings.history_retention_ms)} AS detail,
           CASE WHEN late THEN st_before END AS st_before,
           CASE WHEN accepted THEN {latest} END AS latest,
           CASE WHEN accepted THEN {replaced} END AS replaced,
           accepted AND {final} AS final,
           CASE WHEN accepted AND {final} THEN {valid_to} END AS valid_to
    FROM r9 ORDER BY seq"""
    con = _connect()
    try:
        # the values (most of the bytes) stay out of DuckDB's windows: its result, in the order
        # of ``seq``, gets them (and the other columns of the records) back from ``good``, which
        # halved the query's memory (1M records: about 740 MB)
        murmur2 = P > 1 and settings.partitioner == layout.MURMUR2
        con.register("good", with_key_crc(good.drop_columns(["value"]), murmur2))
        con.register("prior", prior)
        if stored:
            con.register("homes", existing.group_by("key").aggregate([("partition", "min"), ("valid_from", "max")])
                         .rename_columns(["key", "home_stored", "stored_max"]))
            con.register("stored_ts", existing.select(["key", "valid_from"]).rename_columns(["key", "ts"])
                         .append_column("stored_hit", pa.repeat(pa.scalar(True), existing.num_rows)))
        decided = con.sql(sql).to_arrow_table()
    finally:
        con.close()
    if not decided.column("decided_seq").equals(good.column("seq")):  # one row per record, as in ``good``
        raise RuntimeError("the run's decisions do not match its records one to one (duplicate stored versions?)")
    decided = decided.drop_columns(["decided_seq"])
    columns = {name: good.column(name) for name in good.column_names}
    columns.update({name: decided.column(name) for name in decided.column_names})
    return pa.table(columns).select(CLASSIFIED_SCHEMA.names).cast(CLASSIFIED_SCHEMA)


def outcome_rows(classified: pa.Table) -> list[dict[str, Any]]:
    """``pipeline.next_state``'s aggregation of a classified table: a row per (outcome, partition)."""
    con = _connect()
    try:
        con.register("classified", classified)
        result = con.sql(
            'SELECT outcome, p, count(*) AS n, sum(CAST(latest AS INTEGER)) AS latest, '
            'sum(CAST(replaced AS INTEGER)) AS replaced, sum(CAST(value IS NULL AS INTEGER)) AS tombstones, '
            'max(ts) AS st, max("offset") AS off FROM classified GROUP BY outcome, p')
        names = result.columns
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    finally:
        con.close()


def rows_to_write_here(classified: pa.Table, existing: pa.Table, settings: StoreSettings, run: int) -> pa.Table:
    """``semantics.rows_to_write`` of a table of ``classify_here``: the store rows the run
    appends (``layout.STORE_SCHEMA``'s columns), in the order the writer sorts each file
    (``store.table_sort``): Spark's sort of sorted rows costs less, and DuckDB sorts before the
    JVM is needed (docs/benchmarks.md)."""
    B = int(settings.buckets)
    con = _connect()
    try:
        con.register("classified", classified)
        run_col = f"CAST({int(run)} AS BIGINT) AS run"
        if settings.kind == "timestamped" or existing.num_rows == 0:
            valid_to = "CAST(NULL AS BIGINT)" if settings.kind == "timestamped" else "valid_to"
            sql = (f"SELECT bucket, key, ts AS valid_from, {valid_to} AS valid_to, value, value IS NULL AS tombstone, "
                   f"p AS \"partition\", {run_col} FROM classified WHERE final ORDER BY bucket, key, valid_from")
        else:
            con.register("existing", with_key_crc(existing))
            sql = f"""
            WITH merged AS (
              SELECT key, ts AS valid_from, value, value IS NULL AS tombstone, p AS "partition", bucket, 1 AS src,
                     CAST(NULL AS BIGINT) AS old_valid_to FROM classified WHERE final
              UNION ALL
              SELECT key, valid_from, value, tombstone, CAST("partition" AS INTEGER), {rules.DUCKDB.key_mod(B)},
                     0, valid_to FROM existing
            ), kept AS (
              SELECT * FROM merged QUALIFY {rules.kept_version("PARTITION BY key")}
            ), ends AS (
              SELECT *, {rules.merged_valid_to("PARTITION BY key")} AS valid_to FROM kept
            )
            SELECT bucket, key, valid_from, valid_to, value, tombstone, "partition", {run_col}
            FROM ends WHERE {rules.WRITTEN} ORDER BY bucket, key, valid_from"""
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()


def task_frame(spark: SparkSession, rows: pa.Table, tasks: int) -> DataFrame:
    """``rows`` (with ``bucket``) as a DataFrame of ``tasks`` partitions holding whole buckets,
    bucket ``b`` in partition ``b mod tasks`` (as ``bucketing.by_bucket``, without its shuffle):
    the writer's input, one file per bucket.

    Spark makes a partition of each Arrow batch of a table it is handed (``createDataFrame``,
    batches of at most ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows), so each task's
    rows go as one batch, and the frames of the tasks are concatenated (a union; not of
    ``coalesce(1)`` frames, which Spark 4 unites into one partition,
    ``spark.sql.unionOutputPartitioning``). A task's rows of at most the session's
    ``spark.sql.execution.arrow.localRelationThreshold`` (``spark.LOCAL_RELATION_BYTES``)
    would become a local relation, which Spark spreads over several partitions: with such
    a task (a run of few keys per task) the rows are shuffled into place instead."""
    if tasks <= 1:
        return spark.createDataFrame(rows).coalesce(1)
    task_of = rows.column("bucket").to_numpy(zero_copy_only=False) % tasks
    parts = [rows.filter(pa.array(task_of == task)).combine_chunks() for task in range(tasks)]
    local_relation = local_relation_bytes(spark)
    if any(part.nbytes <= local_relation for part in parts):
        return by_bucket(spread_frame(spark, rows), tasks).drop("slot")
    with _arrow_batch_rows(spark, max(part.num_rows for part in parts)):
        frames = [spark.createDataFrame(part) for part in parts]
    return reduce(DataFrame.union, frames)


_BATCH_ROWS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"


@contextmanager
def _arrow_batch_rows(spark: SparkSession, rows: int) -> Iterator[None]:
    """Arrow batches of up to ``rows`` rows for ``createDataFrame`` calls inside (read when
    called; a call elsewhere meanwhile gets other partitions, never other rows)."""
    before = spark.conf.get(_BATCH_ROWS_CONF)
    spark.conf.set(_BATCH_ROWS_CONF, str(max(rows, 1)))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_BATCH_ROWS_CONF)
        else:
            spark.conf.set(_BATCH_ROWS_CONF, before)
