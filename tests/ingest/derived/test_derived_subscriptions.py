"""A foreign-key join keeps its subscriptions (right key -> left keys) in ``_subscriptions``, so a
right-side change finds the left rows it re-joins without loading the left table
(ingest/derived/subscriptions.py); a table without the side table builds it once."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec
from tests.support.derived_reference import run_pipeline as model_pipeline
from versiq.ingest.derived.state import SnapshotReader

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

        def load(reader: SnapshotReader, keys: Any) -> Any:
            if keys is None and reader.files:
                self.tables.append(os.path.basename(reader.path))
            return original(reader, keys)

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


@pytest.mark.rule(16)
def test_a_right_side_change_reads_the_subscriptions_not_the_left_table(
        spark: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loads = WholeTableLoads(monkeypatch)
    real = RealPipeline(spark, str(tmp_path))
    real.add("", INPUTS, TABLES, RUNS)
    _run(real, range(len(RUNS)))
    assert loads.tables == []
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
        spark: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = RealPipeline(spark, str(tmp_path))
    real.add("", INPUTS, TABLES, RUNS)
    _run(real, range(2))
    shutil.rmtree(os.path.join(real.warehouse, "j", "_subscriptions"))  # as a table built before it existed
    loads = WholeTableLoads(monkeypatch)
    _run(real, range(2, 3))
    assert loads.tables == ["L"]
    assert os.path.isdir(os.path.join(real.warehouse, "j", "_subscriptions", "_delta_log"))
    _run(real, range(3, len(RUNS)))
    assert loads.tables == ["L"]
    _check(real)
