"""How a run commits (``ingest.delta.run_txn_needed``): on local disk a run is a plain append
without Delta's transaction id (the writer lock makes it commit once, and delta-spark would
check the id with a Spark job over the whole log), also when it has no rows to append (the
session records empty commits, so the run's state is committed all the same); on S3 every run
carries it.
``/history`` (and so the change feed) tells runs from maintenance either way."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.ingest import store_versions, write_jsonl
from versiq import layout, storage
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
    rerun treats it as no table (ingest.delta.replace_runs), writes it and equals a clean run."""
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


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    stat = handle.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _is_java(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").endswith("/java")
    except OSError:
        return False


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that can still do something (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _until(predicate: Any, timeout: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def _data_files(path: str) -> set[str]:
    """The store table's own data files (not its side tables')."""
    return {os.path.join(folder, name) for folder, dirs, names in os.walk(path)
            for name in names if name.endswith(".parquet") and "/_" not in folder[len(path):]}


def test_a_runs_jvm_that_outlives_its_killed_python_process_does_not_commit_the_run_again(spark, tmp_path):
    """The deterministic reproduction of a JVM that commits after its Python process died: the
    CLI's Python process is killed while its JVM writes the run's files, the JVM is paused
    (SIGSTOP) and its standard input kept open (PySpark's gateway exits when it closes, but lets
    a commit under way finish first), the run is made again to completion, then the JVM resumes.
    The store has exactly one commit of that run and the same versions as an uninterrupted run."""
    src, wh, ref = str(tmp_path / "src"), str(tmp_path / "wh"), str(tmp_path / "ref")
    write_jsonl(src, "a.jsonl", [_record(f"k{i}", 1_000) for i in range(10)])
    assert not run_ingest(spark, wh, [StoreSpec("s", src)]).failed
    # enough rows that the JVM writes files for a while before it commits
    write_jsonl(src, "b.jsonl", [_record(f"k{i}", 2_000 + i) for i in range(60_000)])
    path = layout.table_path(wh, "s")
    before = _data_files(path)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "VERSIQ_SHUFFLE_PARTITIONS": "2",
           "VERSIQ_DRIVER_SOCKET": "off"}
    env.pop("SPARK_MASTER", None)
    cli = [sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", wh, "--store", "s", "--source", src]
    first = subprocess.Popen(cli, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    jvm, stdin = 0, -1
    try:
        def jvm_started() -> bool:
            nonlocal jvm
            java = [p for p in _children(first.pid) if _is_java(p)]
            jvm = java[0] if java else 0
            return bool(jvm) or first.poll() is not None
        _until(jvm_started, 120, "the first run's JVM", every=0.05)
        assert jvm, f"the first run ended (status {first.returncode}) before its JVM was seen"
        stdin = os.open(f"/proc/{jvm}/fd/0", os.O_WRONLY)  # the gateway's pipe stays open
        _until(lambda: _data_files(path) - before or first.poll() is not None, 120, "the run's files", every=0.005)
        os.kill(jvm, signal.SIGSTOP)
        first.kill()
        first.wait(timeout=30)
        assert first.returncode == -signal.SIGKILL
        assert not os.path.exists(layout.log_file(path, 1)), "the JVM was paused after its commit"

        rerun = subprocess.run(cli, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        if _running(jvm):  # give the old JVM every chance to commit the run once more
            os.kill(jvm, signal.SIGCONT)
            with contextlib.suppress(AssertionError):
                _until(lambda: os.path.exists(layout.log_file(path, 2)), 60, "a late commit")
    finally:
        if stdin >= 0:
            os.close(stdin)
        if jvm and _running(jvm):
            os.kill(jvm, signal.SIGKILL)
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    _until(lambda: not _running(jvm), 60, "the old JVM to end")

    history = commits(path, storage.delta_table(path).version())
    assert [(c.operation, c.run) for c in history] == [(INGEST, 2), (INGEST, 1)]
    assert run_ingest(spark, ref, [StoreSpec("s", src)]).stores["s"].error is None
    assert store_versions(path) == store_versions(layout.table_path(ref, "s"))
