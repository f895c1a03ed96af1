"""A derived pass as one Spark job: one task per partition of the pass, writes from the tasks.

The job (``run_job``):

1. **Reads** the pass's source records with Spark: each input's ``_changelog`` rows (stores) or
   stream rows of the runs the pass consumes, and, for a store a table is added over, the
   versions its snapshot holds (``bootstrap``). Every record keeps the partition it was
   ingested in (the store's stream-time partition) and gets its *task*: its partition when the
   pass has several (``PassWork.partitions``), a stream record its key's default partition by
   the stores' partitioner (where a producer with Kafka's default partitioner puts it), and 0
   when the pass has one.
2. **Processes** each task's records in a Spark task (``mapInArrow`` after a repartition
   that gives each task a Spark partition of its own, ``_slot``): sorted into the merge order
   of rule 23 (``MERGE_ORDER``), each task's records are fed to a ``tasks.PartitionRun``
   ``CHUNK_RECORDS`` at a time, and what each chunk emitted leaves the task before the next.
   A Spark partition may hold several tasks, one after the other; no task's records are ever
   split.
3. **Writes** each writer's changed rows, ``_emitted`` rows and late results straight from the
   tasks' output (kept on the executors' local disks for the writes: ``RESULTS_KEPT``; a
   task hands its results over in batches of ``RESULT_BATCH_BYTES``); only small statistics
   (counts, emission counts, stream times per task) reach the driver, which makes the
   emission sequences one per run (task order, then local order) and commits each table
   once, side tables first (``versiq.ingest.delta``).

A pass with repartitions (``tasks.stages``) runs step 2 once per stage: the first stage's tasks
also output their group updates, which Spark repartitions by the partition of their group,
together with the records of the aggregate's own inputs, and sorts into merge order for the
aggregate's stage (``STAGE_SCHEMA``; the updates bring their merge key); the stages' results
are one frame.

The driver never holds the records or the results, so its memory does not grow with the pass.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute
from deltalake import DeltaTable
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from versiq import layout, storage
from versiq.ingest.derived.tasks import (
    PartitionResult,
    PartitionRun,
    PassWork,
    Readers,
    merge_inputs,
    stages,
    whole_inputs,
)
from versiq.ingest.derived.topology import TableCounts, whole_name
from versiq.ingest.frames import local_frame
from versiq.ingest.rules import SPARK
from versiq.layout import (
    CHANGELOG_DIR,
    EMITTED_SCHEMA,
    REJECTED_SCHEMA,
    STORE_SCHEMA,
    STREAM_SCHEMA,
    SUBSCRIPTIONS_SCHEMA,
    answerable_sql,
    has_table,
    read_rule_sql,
    read_rule_window,
)

#: The records of a pass as the tasks read them: ``input`` is the index in ``PassWork.inputs``;
#: ``o1``-``o4`` the input's own order (bootstrap versions by (valid_from, key) first, then
#: changelog or stream rows by (run, seq)).
RECORDS_SCHEMA = pa.schema([
    pa.field("task", pa.int32()), pa.field("input", pa.int32()), pa.field("key", pa.string()),
    pa.field("value", pa.string()), pa.field("timestamp", pa.int64()), pa.field("partition", pa.int32()),
    pa.field("o1", pa.int32()), pa.field("o2", pa.int64()), pa.field("o3", pa.int64()), pa.field("o4", pa.string()),
])

#: A group update crossing a repartition (``Aggregate.shipped``: its old and new values, or their
#: amounts, as text), ``seq`` its order in the input partition that made it.
UPDATE_SCHEMA = pa.schema([
    pa.field("seq", pa.int64()), pa.field("group", pa.string()), pa.field("key", pa.string()),
    pa.field("old", pa.string()), pa.field("new", pa.string()), pa.field("timestamp", pa.int64()),
    pa.field("mkey", pa.int64()),
])

#: What a stage after a repartition reads: the records of its own inputs (``RECORDS_SCHEMA``) and
#: its aggregate's group updates as one more input after the pass's inputs (``input`` their
#: count), ``key`` the group, ``value`` the new value, ``partition`` and ``o1`` the input
#: partition that made them, ``o2`` their order there; ``old``, ``input_key`` and ``mkey`` (their
#: merge key, computed where they were made: ``PartitionResult.updates``) theirs alone.
STAGE_SCHEMA = RECORDS_SCHEMA.append(pa.field("old", pa.string())).append(pa.field("input_key", pa.string())) \
    .append(pa.field("mkey", pa.int64()))

#: How a group update of the tasks' output (``out`` "update") becomes a ``STAGE_SCHEMA`` row:
#: each stage column from an output column (``task`` is the input partition that made it); the
#: others are ``input`` (the count of the pass's input names), ``o3`` 0, ``o4`` "" and ``task``,
#: the group's partition.
SHIPPED = {"key": "g_group", "value": "g_new", "timestamp": "g_timestamp", "partition": "task", "o1": "task",
           "o2": "g_seq", "old": "g_old", "input_key": "g_key", "mkey": "g_mkey"}

#: Each output of the tasks and the columns it fills (prefixed, so that one row schema holds
#: them all): a store's rows, a stream output's records, ``_emitted`` rows, late results, a
#: foreign-key join's subscriptions, group updates for the next stage.
OUTPUTS: dict[str, tuple[str, pa.Schema]] = {
    "store": ("s_", STORE_SCHEMA), "stream": ("t_", STREAM_SCHEMA),
    "emitted": ("e_", EMITTED_SCHEMA), "late": ("j_", REJECTED_SCHEMA), "subscriptions": ("u_", SUBSCRIPTIONS_SCHEMA),
    "update": ("g_", UPDATE_SCHEMA),
}
OUTPUT_SCHEMA = pa.schema([
    pa.field("out", pa.string()), pa.field("table", pa.string()), pa.field("task", pa.int32()),
    pa.field("info", pa.string()),
    *(pa.field(prefix + f.name, f.type) for prefix, schema in OUTPUTS.values() for f in schema),
])


@dataclass(frozen=True)
class InputRead:
    """What the job reads of one source input: runs (after, upto] of its changelog or stream
    table, after the versions of snapshot ``bootstrap`` when a table is added over the store."""

    name: str
    path: str
    is_stream: bool
    after: int
    upto: int
    kind: str = "versioned"
    bootstrap: int | None = None
    #: The bootstrap snapshot's stream time and the store's retention (what a query could return).
    stream_time: dict[int, int] = field(default_factory=dict)
    history_retention_ms: int = 0


@dataclass
class TableTotals:
    """One writer's statistics over every task."""

    counts: TableCounts = field(default_factory=TableCounts)
    #: Emissions per task (for the run's sequence: task order, then local order).
    emitted: dict[int, int] = field(default_factory=dict)
    stream_time: dict[int, int] = field(default_factory=dict)
    rows: int = 0
    late: int = 0
    subscriptions: int = 0


@dataclass
class JobOutput:
    """The tasks' results, kept on the executors until ``release``."""

    frame: DataFrame
    totals: dict[str, TableTotals]
    #: Frames cached on the way (a first stage's results), released with ``frame``.
    held: list[DataFrame] = field(default_factory=list)

    def offsets(self, name: str) -> dict[int, int]:
        """Task -> how many emissions of the run come before the task's first."""
        out, seen = {}, 0
        for task, count in sorted(self.totals[name].emitted.items()):
            out[task] = seen
            seen += count
        return out

    def output(self, kind: str, name: str) -> DataFrame:
        """One output of one writer with its table's columns; sequences made run-wide."""
        prefix, schema = OUTPUTS[kind]
        rows = self.frame.where((F.col("out") == kind) & (F.col("table") == name))
        offsets = self.offsets(name)
        shift = F.lit(0).cast("long")
        if offsets:
            pairs = [F.lit(x) for task, offset in sorted(offsets.items()) for x in (task, offset)]
            shift = F.coalesce(F.element_at(F.create_map(*pairs), F.col("task")).cast("long"), F.lit(0).cast("long"))
        sequenced = {"emitted": "sequence", "stream": "seq", "late": "row"}.get(kind)
        columns = [(F.col(prefix + f.name) + shift if f.name == sequenced else F.col(prefix + f.name)).alias(f.name)
                   for f in schema]
        return rows.select(*columns)

    def release(self) -> None:
        self.frame.unpersist()
        for frame in self.held:
            frame.unpersist()


def records_frame(spark: SparkSession, work: PassWork, reads: list[InputRead], partitioner: str) -> DataFrame:
    """The records of ``reads`` (inputs of the pass), with their task (module docstring, step 1);
    ``input`` is the index in ``work.inputs``."""
    empty = spark.createDataFrame(pa.Table.from_pylist([], schema=RECORDS_SCHEMA)).drop("task")
    index = {name: i for i, (name, _) in enumerate(work.inputs)}
    frames = []
    for read in reads:
        frames += _input_frames(spark, read, index[read.name])
    frame = empty
    for part in frames:
        frame = frame.unionByName(part)
    if work.partitions == 1:
        return frame.withColumn("task", F.lit(0).cast("int"))
    streamed = F.expr(SPARK.default_partition(work.partitions, partitioner))
    stream_inputs = [index[r.name] for r in reads if r.is_stream]
    if not stream_inputs:
        return frame.withColumn("task", F.col("partition"))
    return frame.withColumn("task", F.when(F.col("input").isin(stream_inputs), streamed)
                            .otherwise(F.col("partition")).cast("int"))


def _input_frames(spark: SparkSession, read: InputRead, index: int) -> list[DataFrame]:
    columns = ["input", "key", "value", "timestamp", "partition", "o1", "o2", "o3", "o4"]
    frames = []
    if read.bootstrap is not None:
        versions = spark.read.format("delta").option("versionAsOf", read.bootstrap).load(read.path)
        latest = versions.withColumn("_rn", F.expr(f"row_number() OVER ({read_rule_window(read.kind)})")) \
            .where("_rn = 1").where(_observable(read, "`"))
        frames.append(latest.select(
            F.lit(index).cast("int").alias("input"), "key", "value", F.col("valid_from").alias("timestamp"),
            F.col("partition").cast("int").alias("partition"), F.lit(0).cast("int").alias("o1"),
            F.col("valid_from").alias("o2"), F.lit(0).cast("long").alias("o3"), F.col("key").alias("o4")))
    table_path = read.path if read.is_stream else storage.join(read.path, CHANGELOG_DIR)
    if read.upto > read.after and has_table(table_path):
        runs = (F.col("run") > read.after) & (F.col("run") <= read.upto)
        rows = spark.read.format("delta").load(table_path).where(runs)
        partition = F.lit(0).cast("int") if read.is_stream else F.col("partition").cast("int")
        frames.append(rows.select(
            F.lit(index).cast("int").alias("input"), "key", "value", "timestamp", partition.alias("partition"),
            F.lit(1).cast("int").alias("o1"), F.col("run").alias("o2"), F.col("seq").cast("long").alias("o3"),
            F.lit("").alias("o4")))
    return [f.select(*columns) for f in frames]


def pass_records(reads: list[InputRead]) -> int:
    """How many records the pass reads at most, from the Delta log's file statistics alone
    (a file whose runs straddle the pass's counts whole)."""
    total = 0
    for read in reads:
        if read.bootstrap is not None:
            total += _file_records(storage.delta_table(read.path, version=read.bootstrap), None)
        table_path = read.path if read.is_stream else storage.join(read.path, CHANGELOG_DIR)
        if read.upto > read.after and has_table(table_path):
            total += _file_records(storage.delta_table(table_path), (read.after, read.upto))
    return total


def _file_records(table: DeltaTable, runs: tuple[int, int] | None) -> int:
    actions = pa.table(table.get_add_actions(flatten=True))
    counts = actions.column("num_records").to_pylist()
    if runs is None or "min.run" not in actions.column_names:
        return sum(c or 0 for c in counts)
    after, upto = runs
    low, high = actions.column("min.run").to_pylist(), actions.column("max.run").to_pylist()
    return sum(c or 0 for c, lo, hi in zip(counts, low, high, strict=True)
               if lo is None or hi is None or (hi > after and lo <= upto))


def _observable(read: InputRead, quote: str) -> str:
    """The versions of a bootstrapped store a query could still return (SQL of both engines)."""
    if read.kind == "versioned":
        return answerable_sql(read.stream_time, read.history_retention_ms, quote)
    return "NOT tombstone"


def records_here(work: PassWork, reads: list[InputRead], partitioner: str) -> pa.Table:
    """``records_frame`` read by DuckDB in this process (``run_here``); one connection for the
    pass (its tables are all in one warehouse)."""
    index = {name: i for i, (name, _) in enumerate(work.inputs)}
    parts: list[pa.Table] = []
    if reads:
        con = storage.duckdb_connect(reads[0].path)
        try:
            for read in reads:
                parts += _read_here(con, read, index[read.name])
        finally:
            con.close()
    schema = RECORDS_SCHEMA.remove(0)
    table = pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()
    streams = {index[r.name] for r in reads if r.is_stream}
    if work.partitions == 1:
        tasks = [0] * table.num_rows
    else:
        tasks = [layout.default_partition_of(k, work.partitions, partitioner) if i in streams else p
                 for i, k, p in zip(table["input"].to_pylist(), table["key"].to_pylist(),
                                    table["partition"].to_pylist(), strict=True)]
    return table.add_column(0, "task", pa.array(tasks, pa.int32()))


def _read_here(con: duckdb.DuckDBPyConnection, read: InputRead, i: int) -> list[pa.Table]:
    parts = []
    if read.bootstrap is not None:
        files = list(storage.delta_table(read.path, version=read.bootstrap).file_uris())
        if files:
            parts.append(con.sql(
                f"SELECT {i}::INT AS input, key, value, valid_from AS timestamp, "
                '"partition"::INT AS "partition", 0::INT AS o1, valid_from AS o2, 0::BIGINT AS o3, '
                "key AS o4 FROM (SELECT * FROM "
                f"read_parquet($files) {read_rule_sql(read.kind)}) WHERE {_observable(read, chr(34))}",
                params={"files": files}).to_arrow_table())
    table_path = read.path if read.is_stream else storage.join(read.path, CHANGELOG_DIR)
    if read.upto > read.after and has_table(table_path):
        files = list(storage.delta_table(table_path).file_uris())
        part = "0" if read.is_stream else '"partition"'
        if files:
            parts.append(con.sql(
                f'SELECT {i}::INT AS input, key, value, timestamp, {part}::INT AS "partition", 1::INT AS o1, '
                "run AS o2, seq::BIGINT AS o3, '' AS o4 FROM read_parquet($files) "
                "WHERE run > $after AND run <= $upto",
                params={"files": files, "after": read.after, "upto": read.upto}).to_arrow_table())
    return parts


#: Where a job keeps its tasks' results until the writes have read them: on the executors'
#: local disks, not in their heap. A partition's results grow with the partition (a row and an
#: emission per record), and in the heap, beside the sort and the Arrow transfer, they can
#: exhaust it (docs/benchmarks.md).
RESULTS_KEPT = StorageLevel.DISK_ONLY


def run_job(spark: SparkSession, work: PassWork, reads: list[InputRead], partitioner: str) -> JobOutput:
    """Process the pass in Spark tasks (module docstring, step 2); the results stay on the
    executors (``JobOutput.output`` reads them for the writes)."""
    first, *later = stages(work)

    def records(stage: PassWork) -> DataFrame:
        names = {name for name, _ in stage.inputs}
        return records_frame(spark, work, [r for r in reads if r.name in names], partitioner)

    names = input_names(work)
    slot = _slot(spark, work.partitions) if work.partitions > 1 else None
    if slot is not None:
        first_records = records(first)
        tasks = spark.range(work.partitions).select(F.col("id").cast("int").alias("task"))
        for j, name in enumerate(whole_inputs(work)):  # every task reads these stores whole
            read = next(r for r in reads if r.name == name)
            for part in _input_frames(spark, read, len(work.inputs) + j):
                first_records = first_records.unionByName(part.crossJoin(tasks))
        ordered = _merged(first_records, first, names, slot)
    else:
        ordered = _merged(records(first), first, names, None)
    results = ordered.mapInArrow(partition_runner(first), from_arrow_schema(OUTPUT_SCHEMA))
    held = []
    if later:  # a pass with repartitions has several partitions (tasks.stages)
        assert slot is not None
        results = results.persist(RESULTS_KEPT)
        held.append(results)
        routed = dict.fromkeys(first.repartitioned, results)  # aggregate -> the output its updates are in
        parts = [results.where(F.col("out") != "update")]
        for stage in later:
            source = routed[stage.regrouped]
            updates = source.where((F.col("out") == "update") & (F.col("table") == stage.regrouped)).select(
                F.lit(len(names)).cast("int").alias("input"), *(F.col(c).alias(n) for n, c in SHIPPED.items()),
                F.lit(0).cast("long").alias("o3"), F.lit("").alias("o4"))
            updates = updates.withColumn("task", F.expr(SPARK.default_partition(work.partitions, partitioner)))
            own = records(stage).withColumn("old", F.lit(None).cast("string")) \
                .withColumn("input_key", F.lit(None).cast("string")).withColumn("mkey", F.lit(None).cast("long"))
            grouped = _merged(updates.unionByName(own), stage, names, slot)
            part = grouped.mapInArrow(regroup_runner(stage), from_arrow_schema(OUTPUT_SCHEMA))
            if stage.repartitioned:  # a group-by after this one: its updates come from here
                part = part.persist(RESULTS_KEPT)
                held.append(part)
                routed.update(dict.fromkeys(stage.repartitioned, part))
                part = part.where(F.col("out") != "update")
            parts.append(part)
        results = parts[0]
        for part in parts[1:]:
            results = results.unionByName(part)
    results = results.persist(RESULTS_KEPT)
    stats = results.where(F.col("out") == "stats").select("table", "task", "info").collect()
    return _output(results, work, [(r["table"], r["task"], r["info"]) for r in stats], held)


def _merged(records: DataFrame, stage: PassWork, names: list[str], slot: Column | None) -> DataFrame:
    """``records`` placed, each task's whole in one Spark partition (by ``slot``, ``_slot``'s
    column; all in one when the pass has one partition: None), and sorted there by
    ``MERGE_ORDER``. A merge key that needs a window (``merge_key``) is partitioned by the slot
    too, so that it needs no shuffle of its own."""
    if slot is None:
        placed, window = records.coalesce(1), ""
    else:
        placed, window = records.withColumn("_slot", slot).repartition(stage.partitions, "_slot"), "_slot, "
    ranked = placed.withColumn("rank", F.expr(merge_rank_sql(stage, names, "`")))
    return ranked.withColumn("mkey", F.expr(merge_key(stage, "`", window))).sortWithinPartitions(*MERGE_ORDER)


def _slot(spark: SparkSession, partitions: int) -> Column:
    """A column that puts task t's records, alone, in Spark partition t of a hash repartition
    into ``partitions``: for each t an integer whose ``pmod(hash(.), partitions)`` (the hash a
    repartition by column uses) is t. A range repartition by task would place them by sampled
    bounds, which can put two tasks in one partition and leave another empty."""
    found: dict[int, int] = {}
    candidates = spark.range(0, 64 * partitions).select(
        F.col("id").cast("int").alias("id"), F.pmod(F.hash(F.col("id").cast("int")), F.lit(partitions)).alias("slot"))
    for row in candidates.collect():
        found.setdefault(row["slot"], row["id"])
    if len(found) < partitions:  # 64 candidates per partition leave none out in practice
        raise RuntimeError(f"no hash slot for every one of {partitions} partitions")
    pairs = [F.lit(x) for task in range(partitions) for x in (task, found[task])]
    return F.element_at(F.create_map(*pairs), F.col("task"))


def run_here(spark: SparkSession, work: PassWork, reads: list[InputRead], partitioner: str) -> JobOutput:
    """Process a small pass in this process, partition after partition, with the same code as
    the tasks (``process_here``): its records and results are held here, as Arrow tables, and
    written by Spark from a local relation."""
    table = process_here(work, records_here(work, reads, partitioner), partitioner)
    stats = table.filter(pa.compute.equal(table["out"], "stats")).select(["table", "task", "info"]).to_pylist()
    return _output(local_frame(spark, table), work, [(r["table"], r["task"], r["info"]) for r in stats])


def process_here(work: PassWork, records: pa.Table, partitioner: str) -> pa.Table:
    """The pass's results (``OUTPUT_SCHEMA``) from its records (``records_here``'s), every stage
    in this process with the tasks' code (``partition_runner``, ``regroup_runner``): each task
    gets a copy of the records of the stores it reads whole, and a stage after a repartition
    reads its group updates and own records, as Spark arranges them for it."""
    first, *later = stages(work)
    names = input_names(work)
    whole = whole_inputs(work)
    if whole:  # every task reads these stores whole: one copy of their records per task
        copies = [records]
        for j, name in enumerate(whole):
            rows = records.filter(pa.compute.equal(records["input"], names.index(name)))
            rows = rows.set_column(1, "input", pa.array([len(work.inputs) + j] * rows.num_rows, pa.int32()))
            copies += [rows.set_column(0, "task", pa.array([p] * rows.num_rows, pa.int32()))
                       for p in range(work.partitions)]
        records = pa.concat_tables(copies)

    def own(stage: PassWork) -> pa.Table:
        """The stage's records: its inputs' (and, for the first, the whole stores' copies)."""
        indices = [names.index(name) for name, _ in stage.inputs]
        if stage is first:
            indices += range(len(work.inputs), len(names))
        return records.filter(pa.compute.is_in(records["input"], value_set=pa.array(indices, pa.int32())))

    runner = partition_runner(first)
    table = pa.Table.from_batches(list(runner(iter(merged_here(own(first), first, names).to_batches()))),
                                  schema=OUTPUT_SCHEMA)
    if not later:
        return table
    routed = dict.fromkeys(first.repartitioned, table)  # aggregate -> the output its updates are in
    parts = [table.filter(pa.compute.not_equal(table["out"], "update"))]
    for stage in later:
        source = routed[stage.regrouped]
        rows = source.filter(pa.compute.and_(pa.compute.equal(source["out"], "update"),
                                             pa.compute.equal(source["table"], stage.regrouped)))
        groups = layout.Partitioning(work.partitions, partitioner).of_keys(rows["g_group"].combine_chunks())
        n = rows.num_rows
        columns = {"task": pa.array(groups, pa.int32()), "input": pa.array([len(names)] * n, pa.int32()),
                   **{name: rows[column] for name, column in SHIPPED.items()},
                   "o3": pa.array([0] * n, pa.int64()), "o4": pa.array([""] * n, pa.string())}
        shipped = pa.table({name: columns[name] for name in STAGE_SCHEMA.names}, schema=STAGE_SCHEMA)
        mine = own(stage)
        mine = mine.append_column("old", pa.nulls(mine.num_rows, pa.string())) \
            .append_column("input_key", pa.nulls(mine.num_rows, pa.string())) \
            .append_column("mkey", pa.nulls(mine.num_rows, pa.int64()))
        grouped = pa.concat_tables([shipped, mine.select(STAGE_SCHEMA.names).cast(STAGE_SCHEMA)])
        grouped = merged_here(grouped, stage, names)
        part = pa.Table.from_batches(list(regroup_runner(stage)(iter(grouped.to_batches()))), schema=OUTPUT_SCHEMA)
        routed.update(dict.fromkeys(stage.repartitioned, part))
        parts.append(part.filter(pa.compute.not_equal(part["out"], "update")))
    return pa.concat_tables(parts)


def input_names(work: PassWork) -> list[str]:
    """What the ``input`` column of the records means: the pass's inputs, then the copies of the
    stores every task reads whole (``tasks.whole_inputs``), by their ``whole_name``."""
    return [name for name, _ in work.inputs] + [whole_name(name) for name in whole_inputs(work)]


#: The order a task reads its records in, the merge of rule 23 (``tasks.PartitionRun``): by task,
#: then merge key (``merge_key_sql``), input rank (``merge_rank_sql``), then the input's own order.
MERGE_ORDER = ("task", "mkey", "rank", "o1", "o2", "o3", "o4")


def merge_rank_sql(stage: PassWork, names: list[str], quote: str) -> str:
    """SQL (Spark's or DuckDB's, by ``quote``) of a record's rank among the inputs its task
    merges (``tasks.merge_inputs``), from its ``input`` (an index in ``names``); a group
    update's (``input`` past ``names``) is after them, by the input partition that made it."""
    merged = [name for name, _ in merge_inputs(stage)]
    updates = f"{len(merged)} + {quote}partition{quote}"
    if not merged:  # a stage that reads its group updates alone
        return updates
    cases = " ".join(f"WHEN {names.index(name)} THEN {rank}" for rank, name in enumerate(merged))
    return f"CASE input {cases} ELSE {updates} END"


def merge_key(stage: PassWork, quote: str, slot: str = "") -> str:
    """SQL of the merge key of ``stage``'s records: none (0) where a task reads one input (its
    own order is the merge), the group updates' own (``mkey``, computed where they were made)
    where a stage after a repartition reads nothing else, else ``merge_key_sql``'s window."""
    inputs = merge_inputs(stage)
    if not stage.regrouped and len(inputs) == 1:
        return "0"
    if stage.regrouped and not inputs:
        return "mkey"
    return merge_key_sql(quote, slot)


def merge_key_sql(quote: str, slot: str = "") -> str:
    """SQL of a record's merge key: the largest timestamp of its input in its task up to it, in
    the input's own order. Sorted by it, then rank, then that order, a task's records come in
    the order of the head merge (``tasks.PartitionRun``). ``slot``: leading columns of the
    window's partitioning (the repartition's, so that it needs no shuffle of its own)."""
    ts = f"{quote}timestamp{quote}"
    return (f"max({ts}) OVER (PARTITION BY {slot}task, rank ORDER BY o1, o2, o3, o4 "
            "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)")


def merged_here(records: pa.Table, stage: PassWork, names: list[str]) -> pa.Table:
    """``records`` sorted by ``MERGE_ORDER`` by DuckDB in this process (``process_here``)."""
    con = storage.duckdb_connect()
    try:
        con.register("records", records)
        key = merge_key(stage, chr(34))
        return con.sql(f"SELECT *, {key} AS mkey FROM (SELECT *, "
                       f"{merge_rank_sql(stage, names, chr(34))} AS rank FROM records) "
                       f"ORDER BY {', '.join(MERGE_ORDER)}").to_arrow_table()
    finally:
        con.close()


def _output(frame: DataFrame, work: PassWork, stats: list[tuple[str, int, str]],
            held: list[DataFrame] | None = None) -> JobOutput:
    totals = {name: TableTotals() for name in work.writers}
    for table, task, text in stats:
        info = json.loads(text)
        total = totals[table]
        for name, value in info["counts"].items():
            setattr(total.counts, name, getattr(total.counts, name) + value)
        total.emitted[task] = info["counts"]["emitted"]
        if info["stream_time"] is not None:
            total.stream_time[task] = info["stream_time"]
        total.rows += info["rows"]
        total.late += info["late"]
        total.subscriptions += info["subscriptions"]
    return JobOutput(frame, totals, held or [])


#: How many records a task applies at a time (``tasks.PartitionRun.feed``): the records of a
#: chunk are the most a task holds, and the state they touch is loaded for a chunk at once (a
#: query per table that has a snapshot), so the chunk is large enough that a pass over millions
#: of records makes few of those.
CHUNK_RECORDS = 250_000


def _by_task(work: PassWork,
             columns: tuple[str, ...]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: rows sorted by ``MERGE_ORDER`` in (their ``columns``, the task
    first), each task's fed to a ``PartitionRun`` ``CHUNK_RECORDS`` at a time, its results out
    as ``OUTPUT_SCHEMA`` rows as they are made. One set of snapshot readers serves the tasks of
    a Spark partition."""
    # the tasks read the tables as this process does: S3 endpoint, region and credentials come
    # from these variables, which a cluster's executors do not inherit
    environment = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "VERSIQ_"))}

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for name, value in environment.items():
            os.environ.setdefault(name, value)
        def finished(task: PartitionRun, chunk: list[tuple[Any, ...]]) -> Iterator[pa.RecordBatch]:
            """The task's last chunk fed, then everything it has left handed out."""
            task.feed(chunk)
            for part in task.finish():
                yield from result_batches(part)

        readers = Readers(work)
        try:
            current: PartitionRun | None = None
            chunk: list[tuple[Any, ...]] = []
            for batch in batches:
                for row in zip(*(batch.column(n).to_pylist() for n in columns), strict=True):
                    if current is None or row[0] != current.partition:
                        if current is not None:
                            yield from finished(current, chunk)
                        current, chunk = PartitionRun(work, row[0], readers), []
                    chunk.append(row[1:])
                    if len(chunk) >= CHUNK_RECORDS:
                        current.feed(chunk)
                        chunk = []
                        yield from result_batches(current.drain())
            if current is not None:
                yield from finished(current, chunk)
        finally:
            readers.close()

    return run


def partition_runner(work: PassWork) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of a pass's (first) stage: its records in merge order in,
    results out."""
    return _by_task(work, ("task", "rank", "key", "value", "timestamp", "partition"))


def regroup_runner(work: PassWork) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of an aggregate's stage: its own records and group updates
    (``STAGE_SCHEMA``) in merge order in, results out."""
    return _by_task(work, ("task", "rank", "key", "value", "timestamp", "partition", "old", "input_key"))


def result_batches(result: PartitionResult) -> Iterator[pa.RecordBatch]:
    """Results of a partition (all, or the part a ``PartitionRun`` handed out) as rows of
    ``OUTPUT_SCHEMA``."""
    for name, updates in result.updates.items():
        if updates:
            group, key, old, new, timestamp, mkey = zip(*updates, strict=True)
            first = result.shipped_before.get(name, 0)
            table = pa.table({
                "seq": pa.array(range(first, first + len(updates)), pa.int64()), "group": group, "key": key,
                "old": old, "new": new, "timestamp": pa.array(timestamp, pa.int64()),
                "mkey": pa.array(mkey, pa.int64()),
            }, schema=UPDATE_SCHEMA)
            for part in _slices(table):
                yield _batch("update", name, result.partition, [None] * part.num_rows, part)
    for name, outcome in result.tables.items():
        if outcome.stats is not None:
            yield _batch("stats", name, result.partition, [json.dumps(outcome.stats)], None)
        rows = outcome.rows
        rows_kind = "store" if rows is not None and "valid_from" in rows.schema.names else "stream"
        for kind, table in ((rows_kind, rows), ("emitted", outcome.emitted), ("late", outcome.late),
                            ("subscriptions", outcome.subscriptions)):
            if table is not None and table.num_rows:
                for part in _slices(table):
                    yield _batch(kind, name, result.partition, [None] * part.num_rows, part)


#: The most bytes of results in one Arrow batch a task hands to Spark. The JVM reads each batch
#: whole into its direct memory (as large as the heap): a partition's results in one batch grow
#: with the partition and can exhaust it.
RESULT_BATCH_BYTES = 32 << 20


def _slices(table: pa.Table) -> Iterator[pa.Table]:
    """``table`` in consecutive slices of about ``RESULT_BATCH_BYTES`` each."""
    rows = max(1, RESULT_BATCH_BYTES * table.num_rows // max(1, table.nbytes))
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def _batch(kind: str, name: str, task: int, info: list[str | None], table: pa.Table | None) -> pa.RecordBatch:
    n = len(info)
    columns: dict[str, pa.Array] = {
        "out": pa.array([kind] * n, pa.string()), "table": pa.array([name] * n, pa.string()),
        "task": pa.array([task] * n, pa.int32()), "info": pa.array(info, pa.string()),
    }
    for out_kind, (prefix, schema) in OUTPUTS.items():
        for f in schema:
            if table is not None and out_kind == kind:
                columns[prefix + f.name] = table.column(f.name).combine_chunks()
            else:
                columns[prefix + f.name] = pa.nulls(n, f.type)
    return pa.RecordBatch.from_arrays([columns[f.name] for f in OUTPUT_SCHEMA], schema=OUTPUT_SCHEMA)
