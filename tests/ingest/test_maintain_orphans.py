"""``versiq maintain`` removes data files no commit references once they are older than the
vacuum retention, in every Delta table of a store, and never a file a writer may still commit
(issue 10 item 7; ``ingest.maintain``)."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable

import versiq.ingest.maintain as maintain
from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec
from tests.support.ingest import store_versions, write_jsonl
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.store import SIDE_TABLES, LockTimeout, writer_lock
from versiq.layout import STREAM_KIND, StoreSettings, has_table

THREE_HOURS_AGO = time.time() - 3 * 3600  # older than the default 1-hour retention


def _tables(path: str) -> list[str]:
    """Every Delta table of a store: the store itself and its side tables."""
    return [path, *(os.path.join(path, side) for side in SIDE_TABLES if has_table(os.path.join(path, side)))]


def _what_readers_see(table: str) -> Any:
    """A store's versions (compaction may rewrite its files), or an append-only table's rows."""
    if os.path.basename(table) not in SIDE_TABLES and \
            StoreSettings.from_description(DeltaTable(table).metadata().description).kind != STREAM_KIND:
        return store_versions(table)
    files = DeltaTable(table).file_uris()
    return sorted(map(repr, duckdb.sql("SELECT * FROM read_parquet($f)", params={"f": files}).fetchall()))


def _plant(folder: str, name: str, old: bool) -> str:
    target = os.path.join(folder, name)
    with open(target, "wb") as handle:
        handle.write(b"PAR1 written, never committed")
    if old:
        os.utime(target, (THREE_HOURS_AGO, THREE_HOURS_AGO))
    return target


def test_maintain_removes_old_orphans_from_every_table_of_stores_streams_and_derived_tables(spark, tmp_path):
    """A source store (with ``_rejected`` and ``_changelog``), a source stream, a derived table
    (with ``_emitted``) and a stream output: in each of their Delta tables an old orphan goes and
    a young one stays, and every table reads the same afterwards. One run makes every one of
    these tables (the stream's records come after the store's, so the join finds them); a
    compaction between runs is test_delta_interop.py's and test_derived_pipeline.py's."""
    real = RealPipeline(spark, str(tmp_path))
    real.add("", [InputDef("A", "versioned"), InputDef("S", "stream")],
             [{"name": "f", "from": "A", "filter": "value.n > 1"},
              {"name": "sa", "stream_join": {"stream": "S", "table": "A", "type": "left"}}],
             [{"A": [Rec("k1", '{"n":1}', 10), Rec("k2", '{"n":2}', 11), Rec("k1", '{"n":3}', 12),
                     Rec("k2", '{"n":4}', 20)], "S": [Rec("k1", '"e"', 21), Rec("k2", '"f"', 22)]}])
    for name in ("A", "S"):  # a rejected record in each source: _rejected tables exist
        write_jsonl(os.path.join(real.root, "sources", name), "bad.jsonl", ["not json"])
    real.run_all()
    names = ("A", "S", "f", "sa")
    tables = {name: _tables(os.path.join(real.warehouse, name)) for name in names}
    expected_sides = {"A": {"_rejected", "_changelog"}, "S": {"_rejected"}, "f": {"_emitted"},
                      "sa": {"_emitted"}}
    for name in names:
        assert {os.path.basename(t) for t in tables[name][1:]} >= expected_sides[name], name
    before = {t: _what_readers_see(t) for ts in tables.values() for t in ts}
    planted: dict[str, tuple[str, str]] = {}
    for table in before:
        folder = os.path.join(table, "bucket=0") if os.path.isdir(os.path.join(table, "bucket=0")) else table
        planted[table] = (_plant(folder, "orphan-old.parquet", old=True),
                          _plant(folder, "orphan-young.parquet", old=False))

    for name in names:
        result = maintain.maintain_store(real.warehouse, name)
        assert result["vacuumed_files"] >= 1 and result["vacuumed_side_files"] >= len(tables[name]) - 1, result

    for table, (old, young) in planted.items():
        assert not os.path.exists(old), old
        assert os.path.exists(young), young
        assert _what_readers_see(table) == before[table], table
        # every table was created with versiq's retention: its first vacuum made no commit to set it
        assert "SET TBLPROPERTIES" not in [c["operation"] for c in DeltaTable(table).history()], table


@pytest.mark.timeout(300)
def test_a_file_a_writer_is_about_to_commit_is_never_vacuumed(spark, tmp_path, monkeypatch):
    """The window between a writer writing a data file and committing it can be long (a big run;
    a compaction), and the file is unreferenced all along. With a retention of 0, only the store's
    writer lock protects it: maintain waits for the lock (here: gives up after its lock timeout)
    instead of removing the file; once the lock is free, an uncommitted file is an orphan like
    any other."""
    monkeypatch.setattr(maintain, "VACUUM_RETENTION_HOURS", 0)
    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":1}', '{"key":"b","value":2,"timestamp":2}'])
    wh = str(tmp_path / "wh")
    assert run_ingest(spark, wh, [StoreSpec("w", str(src), buckets=1)]).stores["w"].error is None
    path = os.path.join(wh, "w")
    before = store_versions(path)
    [written] = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()

    with writer_lock(path, 5):  # the writer, as ingest and compaction hold it: write ... commit
        rel = "bucket=0/pending-rewrite.parquet"
        pending = os.path.join(path, rel)
        shutil.copyfile(os.path.join(path, written["path"]), pending)
        os.utime(pending, (THREE_HOURS_AGO, THREE_HOURS_AGO))  # old: the retention does not protect it
        with pytest.raises(LockTimeout):
            maintain.maintain_store(wh, "w", lock_timeout_s=0.5)
        assert os.path.exists(pending)

    # the writer gave up without committing it: now an orphan, older than the retention
    result = maintain.maintain_store(wh, "w")
    assert not os.path.exists(pending)
    assert os.path.exists(os.path.join(path, written["path"]))
    assert result["vacuumed_files"] == 1
    assert store_versions(path) == before
