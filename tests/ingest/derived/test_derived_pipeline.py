"""Derived tables as a product: crash between commits, tables added later, maintenance of the
inputs between runs, inputs without a changelog, and the report (real Spark, real Delta).
Each result is compared with the record-at-a-time reference model."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import pytest

import versiq.ingest.derived.derive as derived_run
from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec
from tests.support.derived_reference import run_pipeline as model_pipeline
from versiq.ingest import maintain
from versiq.ingest.pipeline import run_ingest
from versiq.ingest.run import run_pipeline
from versiq.ingest.store import writer_lock

INPUTS = [InputDef("A", "versioned", history_retention_ms=50), InputDef("B", "versioned")]
TABLES: list[dict[str, Any]] = [
    {"name": "j", "join": {"left": "A", "right": "B", "type": "outer"}},
    {"name": "f", "from": "j", "filter": "value.left.n > 2"},
    {"name": "g", "from": "A", "group_by": "value.g", "aggregate": {"count": True, "sum": "value.n"}},
]


def _v(n: int, g: str = "x") -> str:
    return f'{{"g":"{g}","n":{n}}}'


RUNS: list[dict[str, list[Rec]]] = [
    {"A": [Rec("k1", _v(1), 10), Rec("k2", _v(5, "y"), 12), Rec("k1", _v(3), 20)],
     "B": [Rec("k1", '"b1"', 15)]},
    {"A": [Rec("k1", _v(7, "y"), 30), Rec("k2", None, 31), Rec("k1", _v(4), 25)],
     "B": [Rec("k2", '"b2"', 29), Rec("k1", None, 40)]},
    {"A": [Rec("k3", _v(9), 41), Rec("k1", _v(2), 5)], "B": [Rec("k3", '"b3"', 41)]},
]


def _assert_matches_model(real: RealPipeline, tables: list[dict[str, Any]], runs: list[dict[str, list[Rec]]],
                          prefix: str = "") -> None:
    model = model_pipeline(INPUTS, tables, runs)
    for table in tables:
        got, want = real.observed(prefix, table["name"]), model[table["name"]]
        assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions], table["name"]
        assert got.versions == want.versions, table["name"]


@pytest.fixture(scope="module")
def first_run(spark: Any, tmp_path_factory: Any) -> RealPipeline:
    """``TABLES`` over ``INPUTS`` after the first of ``RUNS``, made once for the tests that start
    with it (each goes on from a copy: ``RealPipeline.copy_to``)."""
    real = RealPipeline(spark, str(tmp_path_factory.mktemp("first-run")))
    real.add("", INPUTS, TABLES, RUNS)
    real.write_step(0)
    assert not real.run_once().failed
    return real


def test_crash_between_derived_commits_is_completed_by_the_next_run(
        first_run: RealPipeline, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = first_run.copy_to(str(tmp_path))
    real.write_step(1)
    real_commit = derived_run.commit_store
    calls = {"f": 0}

    def crash_on_f(handle: Any, adds: Any, state: Any, **options: Any) -> int:
        if os.path.basename(handle.path) == "f" and calls["f"] == 0:
            calls["f"] += 1
            raise OSError("disk full (simulated) while committing f")
        return int(real_commit(handle, adds, state, **options))

    monkeypatch.setattr(derived_run, "commit_store", crash_on_f)
    report = real.run_once()
    assert report.tables["f"].error and "disk full" in report.tables["f"].error
    j_state = report.tables["j"]
    monkeypatch.setattr(derived_run, "commit_store", real_commit)
    # j committed run 2 before the crash; f did not. The next run (no new files) recomputes f from
    # j's snapshot as of run 1 (j is not written again) and brings f up to date.
    report = real.run_once()
    assert not report.failed, report.to_json()
    assert report.tables["f"].run == 2 and report.tables["f"].emitted > 0
    assert report.tables["j"].run is None and report.tables["j"].snapshot == j_state.snapshot
    real.write_step(2)
    assert not real.run_once().failed
    real.reports = [r for r in real.reports if not r.failed]
    _assert_matches_model(real, TABLES, RUNS)


def test_a_table_added_later_is_built_from_the_whole_changelog(spark: Any, tmp_path: Any) -> None:
    real = RealPipeline(spark, str(tmp_path))
    real.add("", INPUTS, TABLES[:1], RUNS)
    real.write_step(0)
    real.write_step(1)
    assert not real.run_once().failed
    # add a table over a derived table and one over the sources; nothing new in the sources
    real.tables = [("", t) for t in TABLES]
    report = real.run_once()
    assert not report.failed, report.to_json()
    assert report.tables["j"].run is None  # unchanged: only recomputed in memory for f
    assert report.tables["f"].run == 1 and report.tables["g"].run == 1
    real.write_step(2)
    assert not real.run_once().failed
    # f and g were built late, in fewer runs: their versions equal the model's; their emissions
    # are the same results (the runs only group them differently)
    model = model_pipeline(INPUTS, TABLES, RUNS)
    for name in ("j", "f", "g"):
        got = real.observed("", name)
        assert got.versions == model[name].versions, name
        assert [e[:3] for e in got.emissions] == [(e.key, e.value, e.timestamp) for e in model[name].emissions]


def test_inputs_compacted_and_vacuumed_between_runs(first_run: RealPipeline, tmp_path: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The derive phase reads each input as its last consumed run left it; compaction and vacuum
    of the input in between must not break it (the newest compacted copy of that run is used)."""
    monkeypatch.setattr(maintain, "VACUUM_RETENTION_HOURS", 0)
    real = first_run.copy_to(str(tmp_path))  # the first run made; maintenance after each run
    last = real.steps() - 1
    for step in range(real.steps()):
        if step:
            real.write_step(step)
            assert not real.run_once().failed
        # after the last run no derive phase reads the inputs again: only j's maintenance is
        # read back then (by the model's check); the inputs' was exercised after each earlier run
        for name in ("A", "B", "j") if step < last else ("j",):
            maintain.maintain_store(real.warehouse, name)
    _assert_matches_model(real, TABLES, RUNS)


def test_a_table_added_over_an_existing_store_starts_from_what_it_holds(spark: Any, tmp_path: Any) -> None:
    """Issue 10 item 12: a store ingested before any table read it (e.g. the one ``make demo``
    creates) can feed tables added later: a filter over it, and an aggregate and a join over
    that filter. They start from the history it holds, replayed in (timestamp, key) order
    (docs/derived-tables.md, "Tables added over an existing store"), then follow its changelog,
    which the store keeps from then on even in runs without the pipeline file (the CLI's
    ``versiq ingest --store``): such a run's records must reach the tables in the next run."""
    real = RealPipeline(spark, str(tmp_path))
    retention = 50
    inputs = [InputDef("A", "versioned", history_retention_ms=retention)]
    first = [Rec("k1", _v(1), 10), Rec("k2", _v(5, "y"), 12), Rec("k1", _v(3), 30), Rec("k1", _v(4), 20),
             Rec("k3", _v(9), 40), Rec("k2", None, 45), Rec("k1", _v(6), 70)]
    later = [Rec("k1", _v(7, "y"), 80), Rec("k4", _v(2), 75), Rec("k3", None, 90)]
    # without the pipeline file: an out-of-order record, a late one (90 - 50 > 30), a tombstone
    plain = [Rec("k5", _v(8, "y"), 95), Rec("k1", _v(5), 85), Rec("k4", _v(1), 30), Rec("k2", _v(6), 100),
             Rec("k1", None, 101)]
    last = [Rec("k5", _v(3, "y"), 110), Rec("k2", _v(7, "y"), 99), Rec("k6", _v(4), 120)]
    tables = [{"name": "f", "from": "A", "filter": "value.n > 2"},
              {"name": "g", "from": "A", "group_by": "value.g", "aggregate": {"count": True, "sum": "value.n"}},
              {"name": "gf", "from": "f", "group_by": "value.g", "aggregate": {"count": True, "sum": "value.n"}},
              {"name": "jf", "join": {"left": "f", "right": "A", "type": "left"},
               "select": {"n": "value.right.n"}}]
    real.add("", inputs, tables, [{"A": first}, {"A": later}, {"A": plain}, {"A": last}])

    def store_only_run() -> None:
        stores = [replace(s, changelog=False) for s in real.pipeline().stores]  # as `versiq ingest --store`
        assert run_ingest(spark, real.warehouse, stores).stores["A"].error is None

    real.write_step(0)
    store_only_run()  # no tables yet
    real.write_step(1)
    report = real.run_once()
    assert not report.failed, report.to_json()
    real.write_step(2)
    store_only_run()
    real.write_step(3)
    report = real.run_once()
    assert not report.failed, report.to_json()

    # What the store held after run 1, as the model replays it: versions still observable at the
    # horizon (stream time 70 - 50 = 20: k1@10 ended at 20 and is gone), by (timestamp, key).
    held = sorted([Rec("k2", _v(5, "y"), 12), Rec("k1", _v(4), 20), Rec("k1", _v(3), 30), Rec("k3", _v(9), 40),
                   Rec("k2", None, 45), Rec("k1", _v(6), 70)], key=lambda r: (r.timestamp, r.key))
    model = model_pipeline(inputs, tables, [{"A": held}, {"A": later}, {"A": plain}, {"A": last}])
    for name in ("f", "g", "gf", "jf"):
        got = real.observed("", name)
        assert got.versions == model[name].versions, name
        assert [e[:3] for e in got.emissions] == [(e.key, e.value, e.timestamp) for e in model[name].emissions], name
    assert real.observed("", "f").versions["k5"]  # the store-only run's records did arrive


@pytest.mark.rule(15)
def test_mixed_versioned_and_timestamped_join_follows_rule_15(spark: Any, tmp_path: Any) -> None:
    """Rule 15 with one versioned side (A) and one timestamped side (C): an out-of-order A record
    updates A but emits nothing; an out-of-order C record emits (offset semantics), and the
    per-key timestamp floor keeps the result timestamps monotone."""
    inputs = [InputDef("A", "versioned"), InputDef("C", "timestamped")]
    tables = [{"name": "ac", "join": {"left": "A", "right": "C", "type": "inner"}}]
    runs = [
        {"A": [Rec("k", '"a10"', 10)]},
        {"C": [Rec("k", '"c20"', 20)]},
        {"A": [Rec("k", '"a5"', 5)]},          # out of order on the versioned side: nothing
        {"C": [Rec("k", '"c15"', 15)]},        # out of order on the timestamped side: emits
        {"A": [Rec("k", '"a30"', 30)]},
    ]
    real = RealPipeline(spark, str(tmp_path))
    real.add("", inputs, tables, runs)
    real.run_all()
    got = real.observed("", "ac")
    assert [e[:3] for e in got.emissions] == [
        ("k", '{"left":"a10","right":"c20"}', 20),
        ("k", '{"left":"a10","right":"c15"}', 20),
        ("k", '{"left":"a30","right":"c15"}', 30),
    ]
    assert got.versions == {"k": [(20, 30, '{"left":"a10","right":"c15"}'), (30, None, '{"left":"a30","right":"c15"}')]}
    model = model_pipeline(inputs, tables, runs)["ac"]
    assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in model.emissions]


@pytest.mark.rule(30)
def test_null_group_keys_are_dropped_and_an_emptied_group_keeps_zero(spark: Any, tmp_path: Any) -> None:
    """Rules 17 and 30, aggregation through the real pipeline: a record whose group key is null (member
    missing or null) belongs to no group, and a group whose last member leaves keeps its
    aggregate at zero (``{"count":0,"sum":0}``), never a tombstone."""
    inputs = [InputDef("A", "versioned")]
    tables: list[dict[str, Any]] = [
        {"name": "g", "from": "A", "group_by": "value.g", "aggregate": {"count": True, "sum": "value.n"}}]
    runs: list[dict[str, list[Rec]]] = [
        {"A": [Rec("k1", _v(1, "x"), 10), Rec("k2", '{"n":5}', 11), Rec("k3", '{"g":null,"n":2}', 12)]},
        {"A": [Rec("k1", _v(3, "y"), 20), Rec("k2", _v(4, "x"), 21)]},  # k1 moves to y; k2 now has a group
        {"A": [Rec("k2", None, 30), Rec("k3", _v(6, "y"), 31)]},  # x loses its last member
    ]
    real = RealPipeline(spark, str(tmp_path))
    real.add("", inputs, tables, runs)
    real.run_all()
    model = model_pipeline(inputs, tables, runs)["g"]
    got = real.observed("", "g")
    assert got.versions == model.versions
    assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in model.emissions]
    assert set(got.versions) == {"x", "y"}  # no group for the null keys
    final = {key: json.loads(versions[-1][2]) for key, versions in got.versions.items()}
    assert final == {"x": {"count": 0, "sum": 0}, "y": {"count": 2, "sum": 9}}
    assert all(value is not None for versions in got.versions.values() for _, _, value in versions)


@pytest.mark.rule(27)
def test_no_result_no_emission(spark: Any, tmp_path: Any) -> None:
    """Rule 27 (issue 13's 24 differences with Kafka's own processor tests): deleting a left row
    that never joined or never existed, or a right row no left row joined, emits nothing in
    primary-key left/outer joins and in both foreign-key joins; a key that had a result is
    retracted with a tombstone."""
    inputs = [InputDef("L", "versioned"), InputDef("R", "versioned")]
    tables = [{"name": "pi", "join": {"left": "L", "right": "R", "type": "inner"}},
              {"name": "pl", "join": {"left": "L", "right": "R", "type": "left"}},
              {"name": "po", "join": {"left": "L", "right": "R", "type": "outer"}},
              {"name": "fi", "fk_join": {"left": "L", "right": "R", "foreign_key": "value.f", "type": "inner"}},
              {"name": "fl", "fk_join": {"left": "L", "right": "R", "foreign_key": "value.f", "type": "left"}}]
    runs = [{"L": [Rec("k1", '{"f":"x"}', 10), Rec("gone", None, 11), Rec("r1", None, 13)],
             "R": [Rec("r1", '"1"', 12)]},
            {"L": [Rec("k1", None, 20)], "R": [Rec("r1", None, 21), Rec("r2", None, 22)]}]
    real = RealPipeline(spark, str(tmp_path))
    real.add("", inputs, tables, runs)
    real.run_all()
    model = model_pipeline(inputs, tables, runs)
    left_only = '{"left":{"f":"x"},"right":null}'
    expected = {
        "pi": [("r1", None, 13)],
        "pl": [("k1", left_only, 10), ("r1", None, 13), ("k1", None, 20)],
        "po": [("k1", left_only, 10), ("r1", '{"left":null,"right":"1"}', 12), ("r1", '{"left":null,"right":"1"}', 13),
               ("k1", None, 20), ("r1", None, 21)],
        "fi": [("k1", None, 20)],
        "fl": [("k1", left_only, 10), ("k1", None, 20)],
    }
    for name, want in expected.items():
        got = real.observed("", name)
        assert [e[:3] for e in got.emissions] == want, name
        assert [(e.key, e.value, e.timestamp) for e in model[name].emissions] == want, name


def test_a_locked_derived_table_fails_in_one_line(spark: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 10 item 12: errors of the derive phase are one clear line, never a traceback. A
    derived table held by another writer fails the run's tables (report ``error``, exit 1 from
    the CLI) instead of escaping as an exception; the next run brings them up to date."""
    real = RealPipeline(spark, str(tmp_path))
    runs = [{"A": RUNS[0]["A"]}, {"A": RUNS[1]["A"]}]
    real.add("", INPUTS[:1], [{"name": "f", "from": "A", "filter": "value.n > 2"}], runs)
    real.write_step(0)
    pipeline = real.pipeline()
    with writer_lock(os.path.join(real.warehouse, "f"), 60):
        report = run_pipeline(spark, real.warehouse, pipeline, lock_timeout_s=0.3)
    error = report.tables["f"].error
    assert report.failed and error is not None and "locked by another writer" in error and "\n" not in error
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert report.stores["A"].error is None  # the store's own run stands
    real.write_step(1)
    assert not real.run_once(pipeline).failed
    model = model_pipeline(INPUTS[:1], [{"name": "f", "from": "A", "filter": "value.n > 2"}], runs)["f"]
    got = real.observed("", "f")
    assert got.versions == model.versions
    assert [e[:3] for e in got.emissions] == [(e.key, e.value, e.timestamp) for e in model.emissions]
