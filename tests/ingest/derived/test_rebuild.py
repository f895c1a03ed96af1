"""``versiq rebuild``: a derived table recomputed from its inputs' current history equals the
same table built from scratch over the same inputs, in a fresh warehouse (real Spark, real
Delta); a table other derived tables read is rebuilt only with them (--cascade)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.ingest.derived.test_derived_pipeline import INPUTS, RUNS, TABLES
from tests.support.derived import RealPipeline
from tests.support.ingest import store_versions
from versiq import storage
from versiq.ingest.errors import UsageError
from versiq.ingest.lifecycle import rebuild
from versiq.layout import read_state


def _versions(warehouse: str, name: str) -> Any:
    return store_versions(os.path.join(warehouse, name))


def test_rebuild_equals_a_fresh_build_of_the_same_inputs(spark: Any, tmp_path: Any) -> None:
    real = RealPipeline(spark, str(tmp_path / "incremental"))
    real.add("", INPUTS, TABLES, RUNS)
    real.run_all()  # three runs: the tables follow the sources' changelogs run by run
    pipeline = real.pipeline()
    before = {name: _versions(real.warehouse, name) for name in ("j", "f", "g")}

    with pytest.raises(UsageError, match="read by derived table.*f.*--cascade"):
        rebuild(lambda: spark, real.warehouse, pipeline, "j")
    dropped, reports = rebuild(lambda: spark, real.warehouse, pipeline, "g")
    assert dropped.dropped == ["g"]
    assert set(reports) == {"g"} and reports["g"].error is None and reports["g"].run == 1
    dropped, reports = rebuild(lambda: spark, real.warehouse, pipeline, "j", cascade=True)
    assert dropped.dropped == ["f", "j"]
    assert {name: r.run for name, r in reports.items()} == {"j": 1, "f": 1}

    fresh = RealPipeline(spark, str(tmp_path / "fresh"))
    fresh.add("", INPUTS, TABLES, RUNS)
    for step in range(fresh.steps()):
        fresh.write_step(step)
    report = fresh.run_once()  # every input file in one run of a new warehouse
    assert not report.failed, report.to_json()
    for name in ("j", "f", "g"):
        rebuilt = _versions(real.warehouse, name)
        assert rebuilt == _versions(fresh.warehouse, name), name
        assert rebuilt == before[name], name  # these sources kept a changelog from their first run
        path = os.path.join(real.warehouse, name)
        state = read_state(path, storage.delta_table(path).version())
        assert state.run == 1 and {s["run"] for s in state.sources.values()} == {3}, name
