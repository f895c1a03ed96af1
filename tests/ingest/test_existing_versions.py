"""The stored versions a run reads (``store.existing_versions``): with each key's smallest
timestamp of the run (``from_ts``), only the suffix of its history the run can change or needs
(versions valid at or after it); without it, every version. A run into keys with a long history
decides and writes exactly as if it had read all of it: the reference-model property tests
(tests/conformance, test_ingest_property) run every run through this path; the run below puts
records before, inside, at and after the stored versions and checks the store's answers."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from tests.support.ingest import store_versions, write_jsonl
from versiq import layout
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
