"""How a run commits (``ingest.delta.run_txn_needed``): on local disk a run is a plain append
without Delta's transaction id (the writer lock makes it commit once, and delta-spark would
check the id with a Spark job over the whole log), also when it has no rows to append (the
session records empty commits, so the run's state is committed all the same); on S3 every run
carries it.
``/history`` (and so the change feed) tells runs from maintenance either way."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.support.ingest import store_versions, write_jsonl
from versiq import layout
from versiq.ingest.delta import run_txn_needed
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.layout import read_state
from versiq.query.history import INGEST, MAINTAIN, commits


def _record(key: str, ts: int) -> str:
    return json.dumps({"key": key, "value": {"n": ts}, "timestamp": ts})


def _app_ids(path: str, version: int) -> set[str]:
    with open(layout.log_file(path, version), encoding="utf-8") as handle:
        actions = [json.loads(line) for line in handle if line.strip()]
    return {a["txn"]["appId"] for a in actions if "txn" in a}


def test_which_runs_carry_a_transaction_id() -> None:
    assert run_txn_needed("s3://bucket/wh/s") and run_txn_needed("s3a://bucket/wh/s")
    assert not run_txn_needed("/data/wh/s")


def test_local_runs_append_without_a_transaction_id_and_a_run_of_no_rows_still_commits(
        spark: Any, tmp_path: Any) -> None:
    source, warehouse = str(tmp_path / "src"), str(tmp_path / "wh")
    spec = StoreSpec(name="s", source=source, history_retention_ms=1000)
    path = layout.table_path(warehouse, "s")
    write_jsonl(source, "a.jsonl", [_record("k1", 10_000), _record("k2", 20_000)])
    first = run_ingest(spark, warehouse, [spec]).stores["s"]
    write_jsonl(source, "b.jsonl", [_record("k1", 30_000)])
    second = run_ingest(spark, warehouse, [spec]).stores["s"]
    # only a late record: nothing to append, but the run (its file done, its rejection) commits
    write_jsonl(source, "c.jsonl", [_record("k2", 1_000)])
    third = run_ingest(spark, warehouse, [spec]).stores["s"]
    again = run_ingest(spark, warehouse, [spec]).stores["s"]

    assert first.snapshot == 0 and second.snapshot == 1 and third.snapshot == 2
    assert third.rejected["late"] == 1 and third.accepted_latest == 0
    assert again.snapshot == 2 and again.run is None  # nothing new: no commit
    assert _app_ids(path, 0) == {layout.APP_ID}  # the table's creation
    assert _app_ids(path, 1) == set()  # a run with rows: a plain append
    assert _app_ids(path, 2) == set()  # a run of no rows: an empty append, recorded all the same
    state = read_state(path, 2)
    assert state.run == 3 and set(state.done_files) == {"a.jsonl", "b.jsonl", "c.jsonl"}
    assert [v.timestamp for v in store_versions(path)["k1"]] == [10_000, 30_000]
    history = commits(path, 2)
    assert [(c.snapshot, c.operation, c.run) for c in history] == [(2, INGEST, 3), (1, INGEST, 2), (0, INGEST, 1)]
    assert history[1].files == ("b.jsonl",)
    assert not os.path.exists(layout.log_file(path, 3))
    assert MAINTAIN not in {c.operation for c in history}


def _delta_operations(spark: Any, path: str) -> dict[int, tuple[str, str | None]]:
    """Each version's operation and write mode, as Spark's ``DESCRIBE HISTORY`` shows them."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation", "operationParameters")
    return {row.version: (row.operation, (row.operationParameters or {}).get("mode")) for row in history.collect()}


def test_the_first_commit_creates_the_table_and_later_runs_append_as_the_docs_say(spark: Any, tmp_path: Any) -> None:
    """A store's first run creates its table (partitioned, with its properties: ``CREATE OR
    REPLACE TABLE AS SELECT``, version 0); the next run is a plain append (``WRITE``, ``Append``).
    The layout's description and the contract say exactly that."""
    source, warehouse = str(tmp_path / "src"), str(tmp_path / "wh")
    spec = StoreSpec(name="s", source=source, history_retention_ms=1000)
    write_jsonl(source, "a.jsonl", [_record("k1", 10_000)])
    run_ingest(spark, warehouse, [spec])
    write_jsonl(source, "b.jsonl", [_record("k1", 20_000)])
    run_ingest(spark, warehouse, [spec])

    operations = _delta_operations(spark, layout.table_path(warehouse, "s"))
    assert operations == {0: ("CREATE OR REPLACE TABLE AS SELECT", None), 1: ("WRITE", "Append")}
    contract = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text(encoding="utf-8")
    for text in (layout.__doc__ or "", contract):
        doc = " ".join(text.replace("`", "").split())
        assert "first run's commit creates the table" in doc
        assert "CREATE OR REPLACE TABLE AS SELECT" in doc and "version 0" in doc
        assert "every later run's commit is a plain append (" in doc.lower() and "WRITE, mode Append" in doc


def test_a_side_table_whose_first_commit_was_killed_is_created_by_the_rerun(spark, tmp_path):
    """A kill inside a side table's first commit leaves its ``_delta_log`` without a commit: the
    rerun treats it as no table (ingest.delta.replace_run), writes it and equals a clean run."""
    src, wh = str(tmp_path / "src"), str(tmp_path / "wh")
    write_jsonl(src, "a.jsonl", [_record("a", 1), "not json"])
    for side in (layout.REJECTED_DIR, layout.CHANGELOG_DIR):
        os.makedirs(os.path.join(wh, "s", side, "_delta_log"))
    report = run_ingest(spark, wh, [StoreSpec("s", src, changelog=True)])
    assert not report.failed, report.to_json()
    assert sum(report.stores["s"].rejected.values()) == 1
    assert set(store_versions(os.path.join(wh, "s"))) == {"a"}


def _layout_of(path: str) -> tuple[list[str], dict[str, str], str]:
    """A table's partition columns, the table properties versiq sets (``ingest.delta``) and its
    description (the store's settings)."""
    from deltalake import DeltaTable

    meta = DeltaTable(path).metadata()
    return list(meta.partition_columns), dict(meta.configuration), meta.description


def test_a_store_and_a_derived_table_whose_first_commit_was_killed_are_created_by_the_rerun(spark, tmp_path):
    """The same for the store's own table and a derived table: a ``_delta_log`` without a commit
    is no table (``layout.has_table``). The rerun creates each as a clean run does, partitioned
    by bucket with its properties and settings (an append would have created it without them),
    and the pipeline file's check of an existing derived table does not trip over it."""
    from versiq.ingest.config import load_config
    from versiq.ingest.run import run_pipeline

    src = str(tmp_path / "src")
    write_jsonl(src, "a.jsonl", [_record("a", 1), _record("b", 2)])
    layouts: list[list[Any]] = []
    for name, killed in (("clean", False), ("killed", True)):
        wh = str(tmp_path / name)
        config = tmp_path / f"{name}.yaml"
        config.write_text(f"stores:\n  - {{name: s, source: {src}, buckets: 4}}\n"
                          "tables:\n  - {name: t, from: s, filter: 'value.n > 1'}\n")
        if killed:
            for table in ("s", "t"):
                os.makedirs(os.path.join(wh, table, "_delta_log"))
        report = run_pipeline(spark, wh, load_config(str(config), wh))
        assert not report.failed, report.to_json()
        assert (report.stores["s"].snapshot, report.tables["t"].snapshot) == (0, 0)
        layouts.append([(_layout_of(os.path.join(wh, table)), store_versions(os.path.join(wh, table)))
                        for table in ("s", "t")])
    (store_layout, store_data), (_, table_data) = layouts[0]
    assert store_layout[0] == ["bucket"] and "delta.dataSkippingStatsColumns" in store_layout[1]
    assert set(store_data) == {"a", "b"}
    assert table_data["b"][-1].value is not None
    assert layouts[1] == layouts[0]
