"""Derived tables over co-partitioned stores run one topology per partition (docs/semantics.md,
rule 23), in this process for a small pass and as Spark tasks for a large one: both must equal
the reference model run once per partition (``run_partitioned``), as Kafka Streams runs one task
per partition. Group-by aggregates cross a repartition to the partition of their group
(``run_repartitioned``); a foreign-key join's right store is read whole by every partition.
"""

from __future__ import annotations

import json
import logging
import os
import random
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec, run_partitioned, run_repartitioned
from tests.support.derived_reference import run_pipeline as model_pipeline
from versiq.layout import MURMUR2, StoreSettings, default_partition_of, read_state

PARTITIONS = 3
KEYS = ["k1", "k2", "k3", "k4", "k5", "k6"]


def home(key: str) -> int:
    """Where a producer with Kafka's default partitioner puts the key (stores and streams alike)."""
    return default_partition_of(key, PARTITIONS, MURMUR2)


assert len({home(k) for k in KEYS}) == PARTITIONS  # every partition has keys

INPUTS = [
    InputDef("A", "versioned", history_retention_ms=6, partitions=PARTITIONS),
    InputDef("B", "timestamped", partitions=PARTITIONS),
    InputDef("S", "stream"),
    # keyed like the groups of ``g``: read only after its repartition, in the groups' partitions
    InputDef("C", "versioned", history_retention_ms=5, partitions=PARTITIONS),
]
GROUP_KEYS = ["g0", "g1", "g2", "g3"]
TABLES: list[dict[str, Any]] = [
    {"name": "a_big", "from": "A", "filter": "value.n > 3", "history_retention_ms": 3},
    {"name": "ab_outer", "join": {"left": "A", "right": "B", "type": "outer"}, "history_retention_ms": 4},
    {"name": "ab_inner", "join": {"left": "A", "right": "B", "type": "inner"}},
    {"name": "big_b_left", "join": {"left": "a_big", "right": "B", "type": "left"},
     "select": {"a": "value.left.n", "b": "value.right.n"}},
    {"name": "sa", "stream_join": {"stream": "S", "table": "A", "type": "left"}},
    {"name": "sb", "stream_join": {"stream": "S", "table": "B", "type": "inner"}},
    {"name": "sa_table", "from": "sa", "history_retention_ms": 5},
    # every partition reads B whole and answers its own left keys (pointers persisted across runs)
    {"name": "a_fk_b", "fk_join": {"left": "A", "right": "B", "foreign_key": "concat('k', value.n % 7)",
                                   "type": "left"}, "history_retention_ms": 4},
    # group-by aggregates: their groups' updates cross a repartition (run_repartitioned)
    {"name": "g", "from": "a_big", "group_by": "concat('g', value.n % 4)",
     "aggregate": {"count": True, "sum": "value.n"},
     "history_retention_ms": 6},
    {"name": "g_many", "from": "g", "filter": "value.count > 1", "history_retention_ms": 3},
    {"name": "g_c", "join": {"left": "g_many", "right": "C", "type": "outer"}, "history_retention_ms": 4},
    # a group-by after a group-by: g's stage routes its changes to a repartition of their own
    {"name": "g_counts", "from": "g", "group_by": "concat('c', value.count)", "aggregate": {"count": True}},
    {"name": "r", "from": "B", "group_by": "concat('r', value.n % 5)",
     "reduce": {"add": "agg + value.n", "subtract": "agg - value.n"}, "history_retention_ms": 2},
]
GROUPED = ("g", "g_many", "g_c", "g_counts", "r")
#: The pipeline with the aggregates too, in Spark tasks (each table costs commits; the stages in
#: this process are the property test's and the Kafka Streams differential test's).
AGGREGATING = ("tasks0_",)


def _example(seed: int) -> list[dict[str, list[Rec]]]:
    """Random runs (seeded): every input gets up to 12 records per run on random keys, values
    and times, out of order, with tombstones; each partition's times lie in a band of their own,
    so that one stream time for all partitions would make the lower bands' results late in the
    tables with a short retention (the test fails if partitions were merged)."""
    rng = random.Random(seed)
    runs = []
    for _ in range(rng.randint(1, 3)):
        run: dict[str, list[Rec]] = {}
        for spec in INPUTS:
            recs = []
            for _ in range(rng.randint(0, 12)):
                key = rng.choice(GROUP_KEYS if spec.name == "C" else KEYS)
                value = None if rng.random() < 0.2 else json.dumps({"n": rng.randint(-3, 12)}, separators=(",", ":"))
                timestamp = rng.randint(0, 25) + 100 * home(key)
                recs.append(Rec(key, value, timestamp, home(key) if spec.kind != "stream" else 0))
            run[spec.name] = recs
        runs.append(run)
    return runs


def _right_changes() -> dict[str, list[Rec]]:
    """A run of B alone, a value for every key, late in each partition's band: the foreign-key
    join re-joins the left keys that pointed at them in earlier runs (pointers persisted in
    ``_subscriptions``), each in its own partition only."""
    return {"B": [Rec(key, json.dumps({"n": i}, separators=(",", ":")), 30 + i + 100 * home(key), home(key))
                  for i, key in enumerate(KEYS)]}


def _tables(prefix: str) -> list[dict[str, Any]]:
    return TABLES if prefix in AGGREGATING else [t for t in TABLES if t["name"] not in GROUPED]


def _check(real: RealPipeline, prefix: str, runs: list[dict[str, list[Rec]]]) -> int:
    """Compare every table with the model; how many of the aggregates' results were late."""
    tables = _tables(prefix)
    model = run_repartitioned(INPUTS, tables, runs, PARTITIONS, home, home)
    for table in tables:
        name = table["name"]
        got, want = real.observed(prefix, name), model[name]
        context = (prefix, name, runs)
        assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions], context
        assert got.versions == want.versions, context
        assert got.records == want.records, context
        assert got.counts == want.counts, context
    return sum(model[name].counts["late"] for name in GROUPED if name in model)


@pytest.mark.rule(23)
def test_each_partition_is_its_own_topology(spark: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """The same example twice in one set of runs: the topologies of pipelines ``here*`` run in
    this process, those of ``tasks*`` as Spark tasks (``VERSIQ_DERIVE_HERE_RECORDS`` set for each
    topology's pass). ``here<i>`` and ``tasks<i>`` read the same input stores and stream
    (``e<i>_*``, ingested once per run): tables that share only source inputs are topologies of
    their own, each run where its prefix says. The group-by aggregates of one of them (a filter
    before one, a filter and a join with a store of its own after it, a group-by after it, a
    reduce) cross a
    repartition to their group's partition, which merges the updates of every input partition
    (and that partition's records of the joined store); the stores' partitions hold
    times in bands of their own, so some results are late by their group partition's stream
    time. The ``here*`` partitions are fed 3 records at a time (``job.CHUNK_RECORDS``): their
    state is loaded, from the snapshots of the runs before, a chunk at a time, and what they
    emit (group updates included) leaves them chunk by chunk, their store rows 2 keys at a time."""
    from versiq.ingest.derived import derive, job, tasks

    monkeypatch.setattr(job, "CHUNK_RECORDS", 3)
    monkeypatch.setattr(tasks, "STORE_KEYS_PER_PART", 2)
    # each pass sets the process's environment for itself: passes one after the other
    monkeypatch.setenv("VERSIQ_PARALLEL_RUNS", "1")

    run_topology = derive._run_topology

    def where_its_prefix_says(spark: Any, pipeline: Any, tables: list[Any], *rest: Any) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("VERSIQ_DERIVE_HERE_RECORDS", "0" if tables[0].name.startswith("tasks") else "100000")
            run_topology(spark, pipeline, tables, *rest)

    monkeypatch.setattr(derive, "_run_topology", where_its_prefix_says)
    real = RealPipeline(spark, str(tmp_path))
    # many more random examples: test_derived_stages.py, without Spark
    examples = [_example(1) + [_right_changes()]]
    for i, runs in enumerate(examples):
        real.add(f"e{i}_", INPUTS, [], runs)
    prefixes = [f"{where}{i}_" for where in ("here", "tasks") for i in range(len(examples))]
    for prefix in prefixes:
        real.add(prefix, [], _tables(prefix), [],
                 inputs_as={spec.name: f"e{prefix[-2]}_{spec.name}" for spec in INPUTS})
    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        real.run_all()
    passes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("derived pass over ")]
    for prefix in prefixes:
        mine = [m for m in passes if m.startswith(f"derived pass over {prefix}")]
        assert mine and all(m.endswith("in Spark tasks" if prefix.startswith("tasks") else "in this process")
                            for m in mine), (prefix, mine)
        assert all(f"{PARTITIONS} partition(s)" in m for m in mine), mine
        late = _check(real, prefix, examples[int(prefix[-2])])
        if prefix in AGGREGATING:
            assert late, "no aggregate's result was late: the example tests too little"
            path = os.path.join(real.warehouse, prefix + "g")
            assert StoreSettings.from_description(DeltaTable(path).metadata().description).partitions == PARTITIONS


@pytest.mark.rule(23)
def test_tables_keep_their_partitions_and_stream_times(spark: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                       ) -> None:
    """A table over co-partitioned stores is built with their partitions, a stream time per
    partition. An aggregate built with one partition (by an earlier versiq, whose topologies
    with a group-by had one) keeps it, its merge global."""
    from versiq.ingest.derived import derive

    monkeypatch.setenv("VERSIQ_DERIVE_HERE_RECORDS", "0")
    def value(n: int, g: str) -> str:
        return json.dumps({"n": n, "g": g}, separators=(",", ":"))

    runs = [{"A": [Rec(k, value(i, "x"), 10 * i + 10, home(k)) for i, k in enumerate(KEYS)]},
            {"A": [Rec(k, value(i, "y"), 5 * i, home(k)) for i, k in enumerate(KEYS)]}]
    tables = [{"name": "f", "from": "A", "filter": "value.n >= 0", "history_retention_ms": 30},
              {"name": "g", "from": "A", "group_by": "value.g", "aggregate": {"count": True}}]
    inputs = [InputDef("A", "versioned", history_retention_ms=1000, partitions=PARTITIONS)]
    real = RealPipeline(spark, str(tmp_path))
    real.add("", inputs, tables[:1], runs)
    real.add("q_", inputs, tables[1:], runs)
    pass_partitions = derive.pass_partitions
    built_as_before = lambda tables, sources: (1, "murmur2") if tables[0].name == "q_g" else (  # noqa: E731
        pass_partitions(tables, sources))
    monkeypatch.setattr(derive, "pass_partitions", built_as_before)
    for step in range(real.steps()):
        real.write_step(step)
        assert not real.run_once().failed
        monkeypatch.setattr(derive, "pass_partitions", pass_partitions)
    path = os.path.join(real.warehouse, "f")
    table = DeltaTable(path)
    assert StoreSettings.from_description(table.metadata().description).partitions == PARTITIONS
    state = read_state(path, table.version())
    want = {p: max(ts for run in runs for r in run["A"] if r.partition == p for ts in [r.timestamp])
            for p in range(PARTITIONS)}
    assert state.stream_time == want
    _assert_equal(real.observed("", "f"), run_partitioned(inputs, tables[:1], runs, PARTITIONS, home)["f"])
    grouped = os.path.join(real.warehouse, "q_g")
    assert StoreSettings.from_description(DeltaTable(grouped).metadata().description).partitions == 1
    _assert_equal(real.observed("q_", "g"), model_pipeline(inputs, tables[1:], runs)["g"])


def _assert_equal(got: Any, want: Any) -> None:
    assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions]
    assert got.versions == want.versions
    assert got.counts == want.counts


@pytest.mark.parametrize("partitions", [2, 3, 7, 16])
def test_each_task_gets_a_spark_partition_of_its_own(spark: Any, partitions: int) -> None:
    """The job's repartition puts every task's records, alone, in one Spark partition: tasks
    run in parallel and none is split."""
    from pyspark.sql import functions as F

    from versiq.ingest.derived.job import _slot

    tasks = spark.range(5000).select((F.col("id") % partitions).cast("int").alias("task"))
    placed = tasks.repartition(partitions, _slot(spark, partitions)) \
        .select(F.spark_partition_id().alias("slice"), "task").distinct().collect()
    assert sorted(r["task"] for r in placed) == list(range(partitions))
    assert len({r["slice"] for r in placed}) == partitions


def _head_merge(inputs: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """Rule 23's merge, as written: among the inputs with records left, the head record with the
    smallest timestamp next, ties to the lower rank. ``inputs[rank]``: (timestamp, position) in
    the input's own order; returns (rank, position)."""
    heads = [0] * len(inputs)
    out = []
    while True:
        ready = [(inputs[rank][heads[rank]][0], rank) for rank in range(len(inputs)) if heads[rank] < len(inputs[rank])]
        if not ready:
            return out
        _, rank = min(ready)
        out.append((rank, inputs[rank][heads[rank]][1]))
        heads[rank] += 1


@pytest.mark.rule(23)
@pytest.mark.parametrize("stage", ["first", "regrouped"])
def test_the_engines_sort_each_task_into_the_head_merge(spark: Any, stage: str) -> None:
    """Spark's and DuckDB's sort of a task's records (by their input's running maximum of
    timestamps, rank, own order: ``job.MERGE_ORDER``) is rule 23's head merge, for a first stage
    (a store read whole ranked right after its own records) and a stage after a repartition
    (group updates after the stage's records, by input partition); Spark keeps each task's
    records in one partition of its own, in order."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from versiq.ingest.derived.job import RECORDS_SCHEMA, _merged, _slot, merged_here
    from versiq.ingest.derived.spec import parse_tables
    from versiq.ingest.derived.tasks import PassWork, merge_inputs

    if stage == "first":
        kinds = {"A": "versioned", "B": "timestamped", "S": "stream"}
        tables = parse_tables([{"name": "f", "fk_join": {"left": "A", "right": "B", "foreign_key": "value.f"}}], kinds)
        work = PassWork(tables=tuple(tables), writers=("f",), reads=(),
                        inputs=(("A", False), ("B", False), ("S", True)), runs=(("f", 1),), partitions=2)
        names = ["A", "B", "S", "B*"]  # the ``input`` column: the pass's inputs, then the stores read whole
        assert merge_inputs(work) == [("A", False), ("B", False), ("B*", False), ("S", True)]
        sources = {(0, 0): 0, (1, 0): 1, (3, 0): 2, (2, 0): 3}  # (input, partition) -> rank
    else:
        work = PassWork(tables=(), writers=(), reads=(), inputs=(("C", False),), runs=(), partitions=2, regrouped="g")
        names = ["A", "C", "S"]
        sources = {(1, 0): 0, **{(3, p): 1 + p for p in range(3)}}  # group updates: input 3, by input partition
    rng = random.Random(11)
    rows = [{"task": task, "input": i, "key": f"k{position}", "value": None, "timestamp": rng.randint(0, 9),
             "partition": part, "o1": part, "o2": position, "o3": 0, "o4": ""}
            for task in range(2) for (i, part) in sources for position in range(rng.randint(0, 12))]
    want = {}
    for task in range(2):
        inputs = [[] for _ in sources]
        for row in rows:
            if row["task"] == task:
                inputs[sources[(row["input"], row["partition"])]].append((row["timestamp"], row["o2"]))
        want[task] = _head_merge(inputs)
    assert len(rows) > 40
    rng.shuffle(rows)
    table = pa.Table.from_pylist(rows, schema=RECORDS_SCHEMA)

    here = merged_here(table, work, names).to_pylist()
    for task in range(2):
        assert [(r["rank"], r["o2"]) for r in here if r["task"] == task] == want[task]
    frame = spark.createDataFrame(table.to_pandas())
    ordered = _merged(frame, work, names, _slot(spark, 2))
    got = ordered.select(F.spark_partition_id().alias("slice"), "task", "rank", "o2").collect()
    assert len({(r["slice"], r["task"]) for r in got}) == 2  # each task alone in a partition of its own
    for task in range(2):
        assert [(r["rank"], r["o2"]) for r in got if r["task"] == task] == want[task]


@pytest.mark.rule(23, 25)
@pytest.mark.parametrize("where", ["here", "tasks"])
def test_a_stream_record_never_sees_a_key_of_another_partition_of_the_table(
        spark: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A stream record is joined in its key's partition by Kafka's partitioner; a key the table
    holds in another of its partitions is that partition's (another task's, as in Kafka
    Streams), in the run that wrote it and in every later run, whose task reads the table's
    snapshot: there it has no versions either."""
    monkeypatch.setenv("VERSIQ_DERIVE_HERE_RECORDS", "100000" if where == "here" else "0")

    def value(n: int) -> str:
        return json.dumps({"n": n}, separators=(",", ":"))

    away = next(k for k in KEYS if home(k) != 0)  # a stream record with this key goes to its partition
    inputs = [InputDef("A", "versioned", history_retention_ms=1000, partitions=PARTITIONS), InputDef("S", "stream")]
    runs = [{"A": [Rec(away, value(1), 10, 0), Rec("k0", value(2), 10, home("k0"))],
             "S": [Rec(away, value(3), 12, 0)]},
            {"S": [Rec(away, value(4), 20, 0), Rec("k0", value(5), 21, 0)]}]
    tables = [{"name": "sa", "stream_join": {"stream": "S", "table": "A", "type": "left"}}]
    real = RealPipeline(spark, str(tmp_path))
    real.add("", inputs, tables, runs)
    real.run_all()
    want = run_partitioned(inputs, tables, runs, PARTITIONS, home)["sa"]
    assert [e.value for e in want.emissions if e.key == away] == ['{"left":{"n":3},"right":null}',
                                                                   '{"left":{"n":4},"right":null}']
    assert real.observed("", "sa").emissions == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions]
