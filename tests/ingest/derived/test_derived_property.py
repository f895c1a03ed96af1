"""Property test: random multi-input changelogs, split at random into runs, through the real
pipeline (Spark ingest, Delta, the derived phase) must equal the record-at-a-time reference
model (tests/support/derived_reference.py) for every operator: emissions (with causes), versions,
stream records and report counts.

One hypothesis example bundles several random pipelines (prefixed names) into one set of Spark
runs, so each Spark run checks many changelogs at once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec, run_repartitioned
from tests.support.derived_reference import run_pipeline as model_pipeline
from versiq.layout import MURMUR2, default_partition_of

KEYS = ["k1", "k2", "k3"]
HOME = {"k1": 0, "k2": 1, "k3": 0}  # A has two stream-time partitions

INPUTS = [
    InputDef("A", "versioned", history_retention_ms=6, partitions=2),
    InputDef("B", "versioned", history_retention_ms=1000),
    InputDef("C", "timestamped"),
    InputDef("S", "stream"),
]
TABLES: list[dict[str, Any]] = [
    {"name": "a_big", "from": "A", "filter": "value.n > 3"},
    {"name": "c_small", "from": "C", "filter": "value.n < 5"},
    {"name": "ab_outer", "join": {"left": "A", "right": "B", "type": "outer"}, "history_retention_ms": 4},
    {"name": "ab_inner", "join": {"left": "A", "right": "B", "type": "inner"}},
    {"name": "ac_left", "join": {"left": "A", "right": "C", "type": "left"},
     "select": {"a": "value.left.n", "c": "value.right.n"}},
    {"name": "afk_inner", "fk_join": {"left": "A", "right": "B", "foreign_key": "value.f", "type": "inner"}},
    {"name": "cfk_left", "fk_join": {"left": "C", "right": "B", "foreign_key": "value.f", "type": "left"}},
    {"name": "a_by_g", "from": "A", "group_by": "value.g", "aggregate": {"count": True, "sum": "value.n"}},
    {"name": "c_by_g", "from": "C", "group_by": "value.g", "aggregate": {"count": True}, "kind": "timestamped"},
    {"name": "sa", "stream_join": {"stream": "S", "table": "A", "type": "left"}},
    {"name": "sc", "stream_join": {"stream": "S", "table": "C", "type": "inner"}},
    {"name": "sa_table", "from": "sa", "history_retention_ms": 5},
    {"name": "big_by_g", "from": "a_big", "group_by": "value.g", "aggregate": {"sum": "value.n"}},
    {"name": "a_trail", "from": "A", "group_by": "value.g",
     "aggregate": {"init": "'0'", "add": "concat(agg, '+', value.n)", "subtract": "concat(agg, '-', value.n)"}},
    {"name": "c_last", "from": "C", "group_by": "value.g", "reduce": {"add": "value", "subtract": "agg"}},
]
#: The topologies whose only store is A (besides a foreign-key join's right store, which each
#: partition reads whole) run in its two partitions (docs/semantics.md, rule 23): stream records
#: and groups in their key's partition by Kafka's partitioner; the others in one.
OVER_A = {"a_big", "big_by_g", "a_by_g", "a_trail", "sa", "sa_table", "afk_inner"}


def _partition(key: str) -> int:
    return default_partition_of(key, 2, MURMUR2)


def _model(runs: list[dict[str, list[Rec]]]) -> dict[str, Any]:
    model = model_pipeline(INPUTS, [t for t in TABLES if t["name"] not in OVER_A], runs)
    model.update(run_repartitioned(INPUTS, [t for t in TABLES if t["name"] in OVER_A], runs, 2, _partition,
                                   _partition))
    return model


def _value() -> st.SearchStrategy[str | None]:
    number = st.one_of(st.integers(-3, 12).map(str), st.sampled_from(["1.5", "2.25", "0.10"]))
    obj = st.builds(
        lambda f, g, n: json.dumps({"f": f, "g": g}, separators=(",", ":"))[:-1] + f',"n":{n}}}',
        st.sampled_from(["k1", "k2", "k3", None]), st.sampled_from(["x", "y"]), number)
    return st.one_of(st.none(), obj, obj)


@st.composite
def _example(draw: st.DrawFn) -> list[dict[str, list[Rec]]]:
    arrivals = []
    for spec in INPUTS:
        count = draw(st.integers(0, 8))
        for _ in range(count):
            key = draw(st.sampled_from(KEYS))
            rec = Rec(key, draw(_value()), draw(st.integers(0, 25)), HOME[key] if spec.partitions > 1 else 0)
            arrivals.append((spec.name, rec))
    order = draw(st.permutations(range(len(arrivals)))) if arrivals else []
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(arrivals) - 1)), max_size=2))))
    runs: list[dict[str, list[Rec]]] = []
    start = 0
    for end in [*cuts, len(arrivals)]:
        run: dict[str, list[Rec]] = {}
        for i in order[start:end]:
            name, rec = arrivals[i]
            run.setdefault(name, []).append(rec)
        if run:
            runs.append(run)
        start = end
    return runs or [{}]


@pytest.mark.rule(13, 14, 15, 16, 17, 23, 24, 25, 26, 27, 28, 29, 30)
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(examples=st.lists(_example(), min_size=3, max_size=3))
def test_pipeline_matches_reference_model(spark: Any, tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch,
                                          examples: list[list[dict[str, list[Rec]]]]) -> None:
    """The passes run in this process, each partition fed 2 records at a time
    (``job.CHUNK_RECORDS``; every other test feeds small passes at once), and their store rows
    handed out 2 keys at a time (``tasks.STORE_KEYS_PER_PART``)."""
    from versiq.ingest.derived import job, tasks

    # Hypothesis tries the simplest example first (no records at all: 20 s of empty commits)
    assume(any(run for runs in examples for run in runs))
    monkeypatch.setattr(job, "CHUNK_RECORDS", 2)
    monkeypatch.setattr(tasks, "STORE_KEYS_PER_PART", 2)
    real = RealPipeline(spark, str(tmp_path_factory.mktemp("derived-prop")))
    for i, runs in enumerate(examples):
        real.add(f"p{i}_", INPUTS, TABLES, runs)
    real.run_all()
    for i, runs in enumerate(examples):
        model = _model(runs)
        for table in TABLES:
            name = table["name"]
            got, want = real.observed(f"p{i}_", name), model[name]
            context = (i, name, runs)
            assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions], context
            assert got.versions == want.versions, context
            assert got.records == want.records, context
            assert got.counts == want.counts, context
