"""A foreign-key join keeps its subscriptions (right key -> left keys) in ``_subscriptions``, so a
right-side change finds the left rows it re-joins without loading the left table
(ingest/derived/subscriptions.py); a table without the side table builds it once."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec
from tests.support.derived_reference import run_pipeline as model_pipeline
from versiq.ingest import delta
from versiq.ingest.derived.state import SnapshotReader
from versiq.ingest.frames import local_frame
from versiq.ingest.store import commit_side
from versiq.layout import EMITTED_DIR, EMITTED_SCHEMA, SUBSCRIPTIONS_DIR, SUBSCRIPTIONS_SCHEMA, StoreState, read_state

INPUTS = [InputDef("L", "versioned", history_retention_ms=1000), InputDef("R", "versioned", history_retention_ms=1000)]
TABLES: list[dict[str, Any]] = [
    {"name": "j", "fk_join": {"left": "L", "right": "R", "foreign_key": "value.f", "type": "left"}},
]


def _v(**fields: Any) -> str:
    return json.dumps(fields, separators=(",", ":"))


RUNS = [
    {"L": [Rec(f"l{i}", _v(f=f"r{i % 4}", n=i), 10 + i) for i in range(40)],
     "R": [Rec(f"r{i}", _v(name=f"right {i}"), 5) for i in range(4)]},
    {"L": [Rec("l1", _v(f="r2", n=100), 60), Rec("l2", _v(n=200), 61), Rec("l3", None, 62)]},
    {"R": [Rec("r1", _v(name="right 1, renamed"), 70), Rec("r2", None, 71)]},
    {"R": [Rec("r3", _v(name="right 3, renamed"), 80)], "L": [Rec("l7", _v(f="r0", n=7), 81)]},
]


class WholeTableLoads:
    """Counts ``SnapshotReader.load`` calls that read every key of a table, by table."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tables: list[str] = []
        original = SnapshotReader.load

        def load(reader: SnapshotReader, keys: Any, latest_only: bool = False) -> Any:
            if keys is None and reader.files:
                self.tables.append(os.path.basename(reader.path))
            return original(reader, keys, latest_only)

        monkeypatch.setattr(SnapshotReader, "load", load)


def _run(real: RealPipeline, steps: range) -> None:
    pipeline = real.pipeline()
    for step in steps:
        real.write_step(step)
        report = real.run_once(pipeline)
        assert not report.failed, report.to_json()


def _check(real: RealPipeline) -> None:
    want = model_pipeline(INPUTS, TABLES, RUNS)["j"]
    got = real.observed("", "j")
    assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions]
    assert got.versions == want.versions


@pytest.fixture(scope="module")
def ran(spark: Any, tmp_path_factory: Any) -> tuple[dict[int, RealPipeline], list[str]]:
    """The runs of ``RUNS`` made once for the tests of this module: the pipeline after its first,
    its second and its last run (each test goes on from a copy of one: ``RealPipeline.copy_to``),
    and the tables loaded whole during them."""
    root = tmp_path_factory.mktemp("subscriptions")
    real = RealPipeline(spark, str(root / "runs"))
    real.add("", INPUTS, TABLES, RUNS)
    after = {}
    with pytest.MonkeyPatch.context() as patch:
        loads = WholeTableLoads(patch)
        for step in range(len(RUNS)):
            _run(real, range(step, step + 1))
            if step + 1 in (1, 2, len(RUNS)):
                after[step + 1] = real.copy_to(str(root / f"after-{step + 1}"))
    return after, loads.tables


@pytest.mark.rule(16)
def test_a_right_side_change_reads_the_subscriptions_not_the_left_table(
        ran: tuple[dict[int, RealPipeline], list[str]], tmp_path: Any) -> None:
    after, loads = ran
    real = after[len(RUNS)].copy_to(str(tmp_path))
    assert loads == []
    _check(real)
    rows = DeltaTable(os.path.join(real.warehouse, "j", "_subscriptions")).to_pyarrow_table().to_pylist()
    latest: dict[str, tuple[int, str | None]] = {}
    for row in rows:
        if row["key"] not in latest or row["run"] > latest[row["key"]][0]:
            latest[row["key"]] = (row["run"], row["foreign_key"])
    assert latest["l1"][1] == "r2" and latest["l2"][1] is None and latest["l3"][1] is None
    assert latest["l7"][1] == "r0" and latest["l4"][1] == "r0"


@pytest.mark.rule(16)
def test_a_join_built_before_the_side_table_builds_it_once(
        ran: tuple[dict[int, RealPipeline], list[str]], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ran[0][2].copy_to(str(tmp_path))  # runs 0 and 1 made
    shutil.rmtree(os.path.join(real.warehouse, "j", "_subscriptions"))  # as a table built before it existed
    loads = WholeTableLoads(monkeypatch)
    _run(real, range(2, 3))
    assert loads.tables == ["L"]
    assert os.path.isdir(os.path.join(real.warehouse, "j", "_subscriptions", "_delta_log"))
    _run(real, range(3, len(RUNS)))
    assert loads.tables == ["L"]
    _check(real)


def _side_rows(real: RealPipeline, side: str, run: int) -> list[dict[str, Any]]:
    rows = DeltaTable(os.path.join(real.warehouse, "j", side)).to_pyarrow_table().to_pylist()
    return sorted((r for r in rows if r["run"] == run), key=lambda r: json.dumps(r, sort_keys=True))


def test_a_failed_side_commit_fails_the_run_and_the_rerun_replaces_what_the_others_committed(
        ran: tuple[dict[int, RealPipeline], list[str]], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's side tables are committed at once (``delta.replace_runs``): when ``_emitted``'s
    commit fails, ``_subscriptions``' still commits, the table's does not (the run fails), and
    the rerun replaces the side rows of that run instead of adding to them."""
    real = ran[0][1].copy_to(str(tmp_path))  # run 0 made
    real.write_step(1)
    real_writer = delta._side_writer

    class FailingWriter:
        def save(self, path: str) -> None:
            raise OSError("disk full (simulated) while committing _emitted")

    def side_writer(side: delta.SideRun, run: int) -> Any:
        writer = real_writer(side, run)
        return FailingWriter() if side.path.endswith("_emitted") and writer is not None else writer

    monkeypatch.setattr(delta, "_side_writer", side_writer)
    report = real.run_once()
    error = report.tables["j"].error
    assert error is not None and "disk full" in error
    attempt = _side_rows(real, "_subscriptions", 2)
    assert attempt, "the other side table committed the attempt's rows"
    assert _side_rows(real, "_emitted", 2) == []
    monkeypatch.setattr(delta, "_side_writer", real_writer)
    report = real.run_once()  # no new files: run 2 again
    assert not report.failed, report.to_json()
    assert report.tables["j"].run == 2
    assert _side_rows(real, "_subscriptions", 2) == attempt
    _run(real, range(2, len(RUNS)))
    real.reports = [r for r in real.reports if not r.failed]
    _check(real)


def test_side_rows_of_an_unfinished_attempt_go_when_the_rerun_has_none(
        spark: Any, ran: tuple[dict[int, RealPipeline], list[str]], tmp_path: Any) -> None:
    """Side rows an unfinished attempt of a run left (committed before a crash of the table's
    commit) are removed by the run that commits, even when it has no rows for that side table:
    a side commit is skipped only when the run has nothing for it and the table holds nothing of
    the run (``delta._has_run``)."""
    runs = [*RUNS, {"R": [Rec("r9", _v(name="no left row has it"), 90)]}]  # no emission, no subscription
    real = ran[0][len(RUNS)].copy_to(str(tmp_path))  # every run of RUNS made
    real.runs = [("", runs)]
    path = os.path.join(real.warehouse, "j")
    run = read_state(path, DeltaTable(path).version()).run + 1
    attempt = StoreState(run=run)
    commit_side(path, EMITTED_DIR, attempt, local_frame(spark, pa.Table.from_pylist(
        [{"run": run, "sequence": 1, "key": "l1", "value": None, "timestamp": 99, "cause": "L"}], EMITTED_SCHEMA)))
    commit_side(path, SUBSCRIPTIONS_DIR, attempt, local_frame(spark, pa.Table.from_pylist(
        [{"foreign_key": "r9", "key": "l1", "run": run}], SUBSCRIPTIONS_SCHEMA)))
    versions = {side: DeltaTable(os.path.join(path, side)).version() for side in (EMITTED_DIR, SUBSCRIPTIONS_DIR)}
    _run(real, range(len(RUNS), len(runs)))
    assert real.reports[-1].tables["j"].run == run and real.reports[-1].tables["j"].emitted == 0
    for side in (EMITTED_DIR, SUBSCRIPTIONS_DIR):
        assert _side_rows(real, side, run) == [], side
        assert DeltaTable(os.path.join(path, side)).version() == versions[side] + 1, side  # one commit: the removal
    want = model_pipeline(INPUTS, TABLES, runs)["j"]
    got = real.observed("", "j")
    assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions]
    assert got.versions == want.versions
    assert ("r9", "l1") not in {(r["foreign_key"], r["key"]) for r in DeltaTable(
        os.path.join(path, SUBSCRIPTIONS_DIR)).to_pyarrow_table().to_pylist()}
