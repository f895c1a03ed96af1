"""The stored versions a run reads (``store.existing_versions``): with each key's smallest
timestamp of the run (``from_ts``), only the suffix of its history the run can change or needs
(versions valid at or after it); without it, every version. A run into keys with a long history
decides and writes exactly as if it had read all of it: the reference-model property tests
(tests/conformance, test_ingest_property) run every run through this path; the run below puts
records before, inside, at and after the stored versions and checks the store's answers."""

from __future__ import annotations

import json
import random
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.ingest import store_versions, write_jsonl
from versiq import layout, settings
from versiq.ingest.pipeline import RUN_KEYS, StoreSpec, open_for, run_ingest
from versiq.ingest.store import existing_versions


def _record(key: str, ts: int, value: Any = 0) -> str:
    return json.dumps({"key": key, "value": value, "timestamp": ts})


def _stored_from(handle: Any, keys: dict[str, int] | None) -> dict[str, list[int]]:
    if keys is None:
        table = existing_versions(handle, pa.table({"key": ["a", "b"]}))
    else:
        table = existing_versions(handle, pa.table({"key": list(keys), "from_ts": list(keys.values())},
                                                   schema=RUN_KEYS))
    out: dict[str, list[int]] = {}
    for row in table.sort_by([("key", "ascending"), ("valid_from", "ascending")]).to_pylist():
        out.setdefault(row["key"], []).append(row["valid_from"])
    return out


def test_a_run_reads_the_versions_valid_at_or_after_its_first_record_of_each_key(spark: Any, tmp_path: Any) -> None:
    source, warehouse = str(tmp_path / "src"), str(tmp_path / "wh")
    spec = StoreSpec(name="s", source=source, history_retention_ms=10**9)
    write_jsonl(source, "a.jsonl", [_record("a", ts) for ts in (10, 20, 30, 40)] + [_record("b", 5)])
    run_ingest(spark, warehouse, [spec])
    handle = open_for(warehouse, spec)

    assert _stored_from(handle, None) == {"a": [10, 20, 30, 40], "b": [5]}
    assert _stored_from(handle, {"a": 1, "b": 1}) == {"a": [10, 20, 30, 40], "b": [5]}
    assert _stored_from(handle, {"a": 25}) == {"a": [20, 30, 40]}  # 25 lands inside [20, 30)
    assert _stored_from(handle, {"a": 30}) == {"a": [30, 40]}  # 30 replaces the version at 30
    assert _stored_from(handle, {"a": 99, "b": 6}) == {"a": [40], "b": [5]}  # the newest version always
    assert _stored_from(handle, {"c": 1}) == {}

    # a run whose records fall before, inside, at and after the stored versions
    write_jsonl(source, "b.jsonl", [_record("a", 25, "x"), _record("a", 30, "y"), _record("a", 50, "z"),
                                    _record("b", 1, "w")])
    report = run_ingest(spark, warehouse, [spec]).stores["s"]
    assert report.replaced_same_timestamp == 1
    versions = store_versions(layout.table_path(warehouse, "s"))
    assert [(v.timestamp, v.valid_to) for v in versions["a"]] == \
        [(10, 20), (20, 25), (25, 30), (30, 40), (40, 50), (50, None)]
    assert [v.value for v in versions["a"]][2:4] == ['"x"', '"y"']  # compact JSON text
    assert [(v.timestamp, v.valid_to) for v in versions["b"]] == [(1, 5), (5, None)]
    # the suffix is taken after the read rule: run 1's row [20, 30) was replaced by run 2's [20, 25)
    handle = open_for(warehouse, spec)
    assert _stored_from(handle, {"a": 27}) == {"a": [25, 30, 40, 50]}
    assert _stored_from(handle, {"a": 22}) == {"a": [20, 25, 30, 40, 50]}


def test_each_bucket_is_read_for_its_own_keys_and_finds_every_version(spark: Any, tmp_path: Any,
                                                                      monkeypatch: Any) -> None:
    """Files of many small row groups (a key's versions straddle their bounds), several files per
    bucket: the per-bucket reads, which let DuckDB skip row groups by each key, find exactly the
    versions one scan of every file finds, for any set of keys."""
    source, warehouse = str(tmp_path / "src"), str(tmp_path / "wh")
    spec = StoreSpec(name="s", source=source, buckets=4, history_retention_ms=10**9)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    block = hadoop.get("parquet.block.size")
    hadoop.set("parquet.block.size", "2048")  # row groups of about 100 rows (parquet-mr's least check)
    try:
        write_jsonl(source, "a.jsonl", [_record(f"k{k:04d}", ts, ts) for k in range(2000) for ts in (10, 20, 30)])
        run_ingest(spark, warehouse, [spec])
        write_jsonl(source, "b.jsonl", [_record(f"k{k:04d}", 25, "x") for k in range(0, 2000, 7)])
        run_ingest(spark, warehouse, [spec])
    finally:
        hadoop.set("parquet.block.size", block)
    handle = open_for(warehouse, spec)
    files = handle.data_files()
    assert len(files) == 8  # two per bucket
    assert max(pq.read_metadata(f).num_row_groups for f in files) > 10

    rng = random.Random(5)
    for size in (1, 2, 5, 40, 2000):
        chosen = rng.sample(range(2000), size)
        keys = pa.table({"key": [f"k{k:04d}" for k in chosen] + ["absent"],
                         "from_ts": [rng.choice([None, 1, 22, 25, 31]) for _ in chosen] + [None]}, schema=RUN_KEYS)
        per_bucket = existing_versions(handle, keys)
        monkeypatch.setenv(settings.BUCKET_SCANS_LIMIT.name, "0")  # one scan of every file of the keys' buckets
        one_scan = existing_versions(handle, keys)
        monkeypatch.undo()
        order = [("key", "ascending"), ("valid_from", "ascending")]
        assert per_bucket.sort_by(order).equals(one_scan.sort_by(order))
        assert set(per_bucket.column("key").to_pylist()) == {f"k{k:04d}" for k in chosen}
