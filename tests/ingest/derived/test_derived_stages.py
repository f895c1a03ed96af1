"""How a derived pass is cut at its repartitions (``tasks.repartitionable``, ``tasks.stages``;
docs/semantics.md, rule 23, "Partitions"): which topologies run in their stores' partitions,
and what each stage computes, reads and writes; and a whole pass through its stages in this
process against the reference model. No Spark, no Delta."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from tests.support.derived_reference import InputDef, Rec, run_repartitioned
from versiq.ingest.derived.job import RECORDS_SCHEMA, process_here
from versiq.ingest.derived.spec import parse_tables
from versiq.ingest.derived.tasks import PassWork, TableRead, repartitionable, stages
from versiq.layout import MURMUR2, default_partition_of

KINDS = {"orders": "versioned", "customers": "versioned", "regions": "versioned", "clicks": "stream"}
COUNT = {"aggregate": {"count": True}}


def _tables(entries: list[dict[str, Any]]) -> list[Any]:
    return parse_tables(entries, KINDS)


def _work(entries: list[dict[str, Any]], writers: list[str], partitions: int = 3) -> PassWork:
    tables = _tables(entries)
    reads = tuple(TableRead(name, f"/w/{name}", None, "versioned", 0, 4)
                  for name in ["orders", "customers", *(t.name for t in tables if not t.is_stream)])
    return PassWork(tables=tuple(tables), writers=tuple(writers), reads=reads,
                    inputs=(("orders", False), ("customers", False)),
                    runs=tuple((w, 1) for w in writers), partitions=partitions)


@pytest.mark.rule(23)
@pytest.mark.parametrize(("entries", "expected"), [
    ([{"name": "f", "from": "orders", "filter": "value.n > 1"}], True),
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "busy", "from": "g", "filter": "value.count > 2"}], True),
    ([{"name": "f", "from": "orders", "filter": "value.n > 1"},
      {"name": "g", "from": "f", "group_by": "value.c", **COUNT},
      {"name": "h", "from": "orders", "group_by": "value.d", "reduce": {"add": "agg + value.n",
                                                                          "subtract": "agg - value.n"}}], True),
    # a foreign-key join: each partition reads its right store whole
    ([{"name": "j", "fk_join": {"left": "orders", "right": "customers", "foreign_key": "value.c"}}], True),
    # ... not a derived table (a partition holds its own part of it only)
    ([{"name": "f", "from": "customers", "filter": "value.n > 1"},
      {"name": "j", "fk_join": {"left": "orders", "right": "f", "foreign_key": "value.c"}}], False),
    # ... nor after a repartition
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "j", "fk_join": {"left": "g", "right": "customers", "foreign_key": "value.c"}}], False),
    # a table that reads an aggregate and a source input of its own
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "j", "join": {"left": "g", "right": "customers"}}], True),
    # ... that is also read before the repartition
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "f", "from": "customers", "filter": "value.n > 1"},
      {"name": "j", "join": {"left": "g", "right": "customers"}}], False),
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "j", "join": {"left": "g", "right": "orders"}}], False),
    # a table that reads an aggregate and a derived table computed before the repartition
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "f", "from": "customers", "filter": "value.n > 1"},
      {"name": "j", "join": {"left": "g", "right": "f"}}], False),
    # a group-by after a group-by: a repartition of its own
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "gg", "from": "g", "group_by": "value.count", **COUNT}], True),
    # ... not with a table that reads both sides of its repartition
    ([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
      {"name": "gg", "from": "g", "group_by": "value.count", **COUNT},
      {"name": "j", "join": {"left": "gg", "right": "g"}}], False),
])
def test_which_topologies_cross_a_repartition(entries: list[dict[str, Any]], expected: bool) -> None:
    assert repartitionable(_tables(entries)) is expected


@pytest.mark.rule(23)
def test_a_pass_is_cut_into_a_first_stage_and_one_stage_per_aggregate() -> None:
    entries = [
        {"name": "f", "from": "orders", "filter": "value.n > 1"},
        {"name": "g", "from": "f", "group_by": "value.c", **COUNT},
        {"name": "busy", "from": "g", "filter": "value.count > 2"},
        {"name": "h", "from": "orders", "group_by": "value.d", **COUNT},
    ]
    work = _work(entries, ["f", "g", "busy", "h"])
    first, *later = stages(work)
    # the first stage runs everything up to the aggregates, which only route their updates
    assert [t.name for t in first.tables] == ["f", "g", "h"]
    assert first.repartitioned == ("g", "h") and first.regrouped == ""
    assert first.writers == ("f",) and [r.name for r in first.reads] == ["orders", "customers", "f"]
    assert first.inputs == work.inputs and dict(first.runs) == {"f": 1}
    # each aggregate's stage: the aggregate first, then the tables that read it; no source input
    assert [(s.regrouped, [t.name for t in s.tables], s.writers, [r.name for r in s.reads], s.inputs)
            for s in later] == [("g", ["g", "busy"], ("g", "busy"), ["g", "busy"], ()),
                                ("h", ["h"], ("h",), ["h"], ())]
    assert all(s.partitions == 3 and s.repartitioned == () for s in later)


@pytest.mark.rule(23)
def test_an_aggregates_stage_reads_the_records_of_its_own_inputs() -> None:
    entries = [
        {"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
        {"name": "j", "join": {"left": "g", "right": "customers", "type": "left"}},
        {"name": "s", "stream_join": {"stream": "clicks", "table": "j"}},
        {"name": "f", "from": "regions", "filter": "value.n > 1"},
    ]
    tables = _tables(entries)
    reads = tuple(TableRead(name, f"/w/{name}", None, "versioned", 0, 4)
                  for name in ["orders", "customers", "regions", "g", "j", "f"])
    inputs = (("orders", False), ("customers", False), ("regions", False), ("clicks", True))
    work = PassWork(tables=tuple(tables), writers=("g", "j", "s", "f"), reads=reads, inputs=inputs,
                    runs=tuple((w, 1) for w in ("g", "j", "s", "f")), partitions=2)
    first, later = stages(work)
    assert first.inputs == (("orders", False), ("regions", False))
    assert [r.name for r in first.reads] == ["orders", "regions", "f"] and first.writers == ("f",)
    assert later.inputs == (("customers", False), ("clicks", True))
    assert [t.name for t in later.tables] == ["g", "j", "s"] and later.writers == ("g", "j", "s")
    assert [r.name for r in later.reads] == ["customers", "g", "j"]


@pytest.mark.rule(23)
def test_a_group_by_after_a_group_by_has_a_stage_after_its_own() -> None:
    entries = [
        {"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
        {"name": "f", "from": "g", "filter": "value.count > 1"},
        {"name": "gg", "from": "f", "group_by": "value.count", **COUNT},
        {"name": "top", "from": "gg", "filter": "value.count > 2"},
    ]
    first, g, gg = stages(_work(entries, ["g", "f", "gg", "top"]))
    assert [t.name for t in first.tables] == ["g"] and first.repartitioned == ("g",)
    # g's stage routes f's changes to gg's groups
    assert (g.regrouped, [t.name for t in g.tables], g.writers, g.repartitioned) == ("g", ["g", "f", "gg"],
                                                                                      ("g", "f"), ("gg",))
    assert (gg.regrouped, [t.name for t in gg.tables], gg.writers, gg.repartitioned) == ("gg", ["gg", "top"],
                                                                                          ("gg", "top"), ())


@pytest.mark.rule(23)
def test_an_up_to_date_aggregate_is_recomputed_for_its_readers_but_not_written() -> None:
    entries = [{"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
               {"name": "busy", "from": "g", "filter": "value.count > 2"}]
    first, later = stages(_work(entries, ["busy"]))
    assert first.writers == () and later.writers == ("busy",)
    assert [r.name for r in later.reads] == ["g", "busy"]


def test_one_partition_is_one_stage() -> None:
    work = _work([{"name": "g", "from": "orders", "group_by": "value.c", **COUNT}], ["g"], partitions=1)
    assert stages(work) == [work]


# -- a whole pass through its stages in this process (no Spark, no snapshot) against the model --

PARTITIONS = 3
MODEL_INPUTS = [InputDef("orders", "versioned", history_retention_ms=8, partitions=PARTITIONS),
                InputDef("customers", "timestamped", partitions=PARTITIONS),
                InputDef("regions", "versioned", history_retention_ms=6, partitions=PARTITIONS),
                InputDef("clicks", "stream")]
SOURCES = tuple((d.name, d.kind == "stream") for d in MODEL_INPUTS)
STAGED = [
    {"name": "f", "from": "orders", "filter": "value.n > 0", "history_retention_ms": 4},
    {"name": "g", "from": "f", "group_by": "concat('g', value.n % 4)", "aggregate": {"count": True, "sum": "value.n"},
     "history_retention_ms": 5},
    {"name": "busy", "from": "g", "filter": "value.count > 1", "history_retention_ms": 3},
    # a group-by after a group-by: how many groups have each count, and a filter after it
    {"name": "counts", "from": "g", "group_by": "concat('c', value.count)",
     "aggregate": {"count": True, "sum": "value.sum"}, "history_retention_ms": 4},
    {"name": "common", "from": "counts", "filter": "value.count > 1"},
    {"name": "trail", "from": "orders", "group_by": "concat('t', value.n % 3)",
     "aggregate": {"init": "''", "add": "concat(agg, key, '+', value.n, ';')", "subtract": "concat(agg, key, '-')"}},
    {"name": "r", "from": "customers", "group_by": "concat('r', value.n % 5)",
     "reduce": {"add": "agg + value.n", "subtract": "agg - value.n"}, "history_retention_ms": 2},
    # a foreign-key join: every partition reads customers whole, answers its own left keys
    {"name": "fk", "fk_join": {"left": "f", "right": "customers", "foreign_key": "concat('k', value.n)",
                               "type": "left"}, "history_retention_ms": 7},
    {"name": "fk_inner", "fk_join": {"left": "orders", "right": "customers", "foreign_key": "concat('k', value.n % 5)",
                                     "type": "inner"}},
    {"name": "fk_big", "from": "fk", "filter": "value.right.n > 3"},
    # tables after a repartition that read source inputs of their own (keys in the groups' space)
    {"name": "gr", "join": {"left": "g", "right": "regions", "type": "outer"}, "history_retention_ms": 6},
    {"name": "seen", "stream_join": {"stream": "clicks", "table": "trail", "type": "left"}},
]


def _home(key: str) -> int:
    return default_partition_of(key, PARTITIONS, MURMUR2)


def _staged_work() -> PassWork:
    entries = [{**{k: v for k, v in t.items() if k != "history_retention_ms"},
                **({"history_retention": f"{t['history_retention_ms']}ms"} if "history_retention_ms" in t else {})}
               for t in STAGED]
    tables = parse_tables(entries, KINDS)
    reads = [TableRead("orders", "/nonexistent/orders", None, "versioned", 8, 4, PARTITIONS),
             TableRead("customers", "/nonexistent/customers", None, "timestamped", 0, 4, PARTITIONS),
             TableRead("regions", "/nonexistent/regions", None, "versioned", 6, 4, PARTITIONS)]
    reads += [TableRead(t.name, f"/nonexistent/{t.name}", None, t.kind, t.history_retention_ms, t.buckets)
              for t in tables]
    names = tuple(t.name for t in tables)
    return PassWork(tables=tuple(tables), writers=names, reads=tuple(reads),
                    inputs=SOURCES, runs=tuple((n, 1) for n in names), partitions=PARTITIONS)


@pytest.mark.rule(23)
@pytest.mark.parametrize("seed", range(25))
def test_a_pass_through_its_stages_is_the_models(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random records of one run through every stage in this process (``job.process_here``,
    the tasks' code) give the emissions (in partition order), late results and counts of the
    reference model with a repartition (``run_repartitioned``). Odd seeds feed each partition 4
    records at a time (``job.CHUNK_RECORDS``) and hand out their store rows 2 keys at a time,
    even ones all at once."""
    from versiq.ingest.derived import job, tasks

    if seed % 2:
        monkeypatch.setattr(job, "CHUNK_RECORDS", 4)
        monkeypatch.setattr(tasks, "STORE_KEYS_PER_PART", 2)
    rng = random.Random(seed)
    run: dict[str, list[Rec]] = {}
    for name, is_stream in SOURCES:
        recs = []
        for _ in range(rng.randint(0, 30)):
            key = rng.choice(["g0", "g1", "g2", "g3", "t0", "t1", "t2"]) if name in ("regions", "clicks") \
                else f"k{rng.randint(1, 9)}"
            value = None if rng.random() < 0.15 else json.dumps({"n": rng.randint(-2, 9)})
            recs.append(Rec(key, value, rng.randint(0, 25) + 20 * _home(key), 0 if is_stream else _home(key)))
        run[name] = recs
    rows = [{"task": _home(r.key), "input": i, "key": r.key, "value": r.value, "timestamp": r.timestamp,
             "partition": r.partition, "o1": 1, "o2": 1, "o3": position, "o4": ""}
            for i, (name, _) in enumerate(SOURCES) for position, r in enumerate(run[name])]
    records = pa.Table.from_pylist(rows, schema=RECORDS_SCHEMA)
    out = process_here(_staged_work(), records, MURMUR2)
    model = run_repartitioned(MODEL_INPUTS, STAGED, [run], PARTITIONS, _home, _home)
    stats = {(r["table"], r["task"]): json.loads(r["info"]) for r in out.to_pylist() if r["out"] == "stats"}
    for table in STAGED:
        name = table["name"]
        emitted = sorted((r["task"], r["e_sequence"], r["e_key"], r["e_value"], r["e_timestamp"], r["e_cause"])
                         for r in out.to_pylist() if r["out"] == "emitted" and r["table"] == name)
        want = model[name]
        assert [e[2:] for e in emitted] == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions], name
        assert sum(s["counts"]["late"] for (t, _), s in stats.items() if t == name) == want.counts["late"], name


def test_a_tasks_results_leave_it_in_batches_of_bounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task hands its results to Spark in Arrow batches of about ``RESULT_BATCH_BYTES``
    (the JVM reads each batch whole into its direct memory), in order: the pass's output, group
    updates crossing the repartition included, is the same whatever the size."""
    from versiq.ingest.derived import job

    rng = random.Random(7)
    rows = [{"task": _home(key), "input": 0, "key": key, "value": json.dumps({"n": rng.randint(-2, 9)}),
             "timestamp": 20 * _home(key) + t, "partition": _home(key), "o1": 1, "o2": 1, "o3": t, "o4": ""}
            for t in range(60) for key in (f"k{rng.randint(1, 40)}",)]
    records = pa.Table.from_pylist(rows, schema=RECORDS_SCHEMA)
    whole = process_here(_staged_work(), records, MURMUR2)
    sizes: list[int] = []
    original = job._slices

    def slices(table: pa.Table) -> Any:
        for part in original(table):
            sizes.append(part.nbytes)
            yield part

    monkeypatch.setattr(job, "RESULT_BATCH_BYTES", 300)
    monkeypatch.setattr(job, "_slices", slices)
    sliced = process_here(_staged_work(), records, MURMUR2)
    assert sliced.to_pylist() == whole.to_pylist()
    assert len(sizes) > 3 * len({(r["out"], r["table"], r["task"]) for r in whole.to_pylist()})
    assert max(sizes) <= 2 * 300


@pytest.mark.rule(30)
def test_an_aggregates_own_state_loads_its_groups_newest_versions_only() -> None:
    """An aggregate's results are stamped at or after its group's last one (rule 30), so a batch
    reads and writes only after each group's newest version: its state loads that one
    (``TableState.latest_only``), unless a stream-table join reads the aggregate as of a time.
    A filter's results keep their records' timestamps (one may land before the newest): it
    loads its keys' history. Source stores hold their newest versions only too (an older record
    is forwarded as an out-of-order change), unless a stream-table join reads them as of a time."""
    from versiq.ingest.derived.state import Change, TableState
    from versiq.ingest.derived.tasks import latest_only

    tables = _tables([
        {"name": "g", "from": "orders", "group_by": "value.c", **COUNT},
        {"name": "busy", "from": "g", "filter": "value.count > 2"},
        {"name": "gg", "from": "g", "group_by": "value.count", **COUNT},
        {"name": "t", "from": "orders", "group_by": "value.d", **COUNT},
        {"name": "seen", "stream_join": {"stream": "clicks", "table": "t"}},
    ])
    work = PassWork(tables=tuple(tables), writers=(), reads=(), inputs=(("orders", False), ("clicks", True)), runs=())
    assert latest_only(work) == {"g", "gg", "orders"}
    joined = _tables([{"name": "seen", "stream_join": {"stream": "clicks", "table": "orders"}}])
    assert latest_only(replace(work, tables=tuple(joined))) == set()
    state = TableState("g", "versioned", 10, 1, None, latest_only=True)
    state.put("x", '{"count":1}', 5)
    state.put("x", '{"count":2}', 5)  # at the newest: replaces it
    state.put("x", '{"count":3}', 7)
    assert state.versions["x"] == [(5, '{"count":2}'), (7, '{"count":3}')]
    assert [r.num_rows for r in state.changed_rows(1, 4, 10)] == [2]
    older = state.put("x", '{"count":4}', 6)  # before the newest: forwarded as out of order, not kept
    assert older.change == Change("x", '{"count":4}', '{"count":3}', 6, False)
    assert state.versions["x"] == [(5, '{"count":2}'), (7, '{"count":3}')]
    with pytest.raises(AssertionError):  # a table that lost a version cannot be written
        list(state.changed_rows(1, 4, 10))
    with pytest.raises(AssertionError):
        state.as_of("x", 6)
