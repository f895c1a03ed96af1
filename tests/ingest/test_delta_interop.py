"""Every kind of table versiq writes (issue 12) reads back identically through Delta's own Spark
connector (Spark SQL ``VERSION AS OF``), delta-rs and DuckDB over the files delta-rs lists, at
every snapshot, before and after maintenance; and uses no table feature delta-rs cannot read.

The tables come from one real pipeline run by the real ingest (Spark + delta-spark): a versioned
and a timestamped source store (with ``_rejected`` and ``_changelog``), a source stream (with
``_rejected``), a derived table and a stream-table join output (with ``_emitted``), and a
compaction rewrite by ``versiq maintain``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

import versiq.ingest.maintain as maintain
from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec
from tests.support.ingest import write_jsonl
from versiq.ingest.store import SIDE_TABLES
from versiq.layout import TABLE_PROPERTIES, StoreSettings, has_table, read_state


def _canonical(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def _through_spark(spark: Any, path: str, version: int, columns: list[str]) -> list[str]:
    frame = spark.sql(f"SELECT * FROM delta.`{path}` VERSION AS OF {version}")
    return _canonical([{c: row[c] for c in columns} for row in frame.collect()])


def _through_delta_rs(path: str, version: int, columns: list[str]) -> list[str]:
    return _canonical(DeltaTable(path, version=version).to_pyarrow_table().select(columns).to_pylist())


def _through_duckdb(path: str, version: int, columns: list[str]) -> list[str]:
    table = DeltaTable(path, version=version)
    files = table.file_uris()
    if not files:
        return []
    partitioned = bool(table.metadata().partition_columns)
    rows = duckdb.sql(f"SELECT * FROM read_parquet($files, hive_partitioning = {str(partitioned).lower()})",
                      params={"files": files}).to_arrow_table()
    if partitioned:  # hive partition values come back as the column's type only when asked
        rows = rows.set_column(rows.column_names.index("bucket"), "bucket", rows.column("bucket").cast(pa.int32()))
    return _canonical(rows.select(columns).to_pylist())


def _tables(warehouse: str) -> list[str]:
    out = []
    for name in sorted(os.listdir(warehouse)):
        path = os.path.join(warehouse, name)
        if has_table(path):
            out.append(path)
            out += [os.path.join(path, side) for side in SIDE_TABLES if has_table(os.path.join(path, side))]
    return out


def _snapshots(spark: Any, warehouse: str) -> dict[tuple[str, int], list[str]]:
    """Every snapshot of every table, read three ways; they must agree."""
    seen = {}
    for path in _tables(warehouse):
        table = DeltaTable(path)
        protocol = table.protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), (path, protocol)
        assert not protocol.reader_features and not protocol.writer_features, path
        config = table.metadata().configuration
        assert all(config.get(name) == value for name, value in TABLE_PROPERTIES.items()), (path, config)
        columns = [f.name for f in table.schema().fields]
        for version in range(table.version() + 1):
            spark_rows = _through_spark(spark, path, version, columns)
            assert _through_delta_rs(path, version, columns) == spark_rows, (path, version)
            assert _through_duckdb(path, version, columns) == spark_rows, (path, version)
            seen[(path, version)] = spark_rows
    return seen


def test_every_table_reads_the_same_through_delta_spark_delta_rs_and_duckdb(spark, tmp_path):
    real = RealPipeline(spark, str(tmp_path))
    real.add("", [InputDef("A", "versioned", history_retention_ms=5), InputDef("T", "timestamped"),
                  InputDef("S", "stream")],
             [{"name": "f", "from": "A", "filter": "value.n > 1"},
              {"name": "sa", "stream_join": {"stream": "S", "table": "A", "type": "left"}}],
             [{"A": [Rec("k1", '{"n":1}', 10), Rec("k2", '{"n":2}', 11), Rec("k1", '{"n":3}', 12)],
               "T": [Rec("t1", '"x"', 10), Rec("t2", '"y"', 11)]},
              {"A": [Rec("k2", '{"n":4}', 20), Rec("k1", None, 21)], "S": [Rec("k1", '"e"', 21)],
               "T": [Rec("t1", None, 20)]},
              {"A": [Rec("k3", '{"n":5}', 30), Rec("k2", '{"n":6}', 31)], "S": [Rec("k2", '"f"', 32)],
               "T": [Rec("t2", '"z"', 30)]}])
    for name in ("A", "S"):
        write_jsonl(os.path.join(real.root, "sources", name), "bad.jsonl", ["not json"])
    real.run_all()
    expected = {"A": {"_rejected", "_changelog"}, "S": {"_rejected"}, "f": {"_emitted"}, "sa": {"_emitted"}}
    for name, sides in expected.items():
        present = {side for side in SIDE_TABLES if has_table(os.path.join(real.warehouse, name, side))}
        assert present >= sides, name

    before = _snapshots(spark, real.warehouse)
    assert max(v for (_path, v) in before) >= 2  # several snapshots of the stores

    for name in ("A", "T", "f"):  # a compaction rewrite of each store (expired history dropped in A)
        result = maintain.maintain_store(real.warehouse, name)
        assert result["buckets_rewritten"] >= 1, result
    after = _snapshots(spark, real.warehouse)
    assert {k: v for k, v in after.items() if k in before} == before  # older snapshots unchanged
    for name in ("A", "T", "f"):
        path = os.path.join(real.warehouse, name)
        newest = DeltaTable(path).version()
        assert (path, newest) not in before
        assert read_state(path, newest) == read_state(path, newest - 1)  # the rewrite keeps the state
        assert StoreSettings.from_description(DeltaTable(path).metadata().description).kind in (
            "versioned", "timestamped")
