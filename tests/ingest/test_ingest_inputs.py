"""Bad input of every kind, in every format: kept in `_rejected` with a reason, counted, never
crashing a run (docs/contract.md, Input edge cases and Record parsing)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.ingest import StoredVersion, rejected_rows, store_versions
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.records import parse_bytes_for_tests

JSONL_CASES = [
    ('{"key":"a","value":{"p":1.50},"timestamp":1}', None),
    ('{"key":7,"value":1,"timestamp":"1970-01-01T00:00:00.002+00:00"}', None),
    ('not json', "malformed"),
    ('{"key":"a","value":1,"timestamp":3} trailing', "malformed"),
    ('{"key":"a","key":"b","timestamp":3}', "malformed"),
    ('{"key":"a","value":NaN,"timestamp":3}', "malformed"),
    ('[1,2]', "malformed"),
    ('{"value":1,"timestamp":3}', "missing_field"),
    ('{"key":null,"timestamp":3}', "missing_field"),
    ('{"key":"","timestamp":3}', "missing_field"),
    ('{"key":"a","value":1}', "missing_field"),
    ('{"key":true,"timestamp":3}', "bad_key"),
    ('{"key":1.5,"timestamp":3}', "bad_key"),
    ('{"key":{"a":1},"timestamp":3}', "bad_key"),
    ('{"key":"a","timestamp":1.5}', "bad_timestamp"),
    ('{"key":"a","timestamp":"2024-01-01T00:00:00"}', "bad_timestamp"),
    ('{"key":"a","timestamp":"yesterday"}', "bad_timestamp"),
    ('{"key":"a","timestamp":-1}', "bad_timestamp"),
    ('{"key":"a","timestamp":true}', "bad_timestamp"),
    ('{"key":"a","timestamp":3,"partition":"0"}', "bad_partition"),
    ('{"key":"a","timestamp":3,"partition":5}', "bad_partition"),
    ('{"key":"a","timestamp":3,"offset":-2}', "bad_offset"),
    ('{"key":"a","timestamp":3,"value":"' + "x" * (1024 * 1024) + '"}', "too_large"),
    # issue 10: a year-0 instant once crashed every run of the store; keys must stay servable
    ('{"key":"a","timestamp":"0000-01-01T00:00:00Z"}', "bad_timestamp"),
    ('{"key":"a","timestamp":"2024-01-01T24:00:00Z","value":1}', "bad_timestamp"),
    ('{"key":"' + "k" * 4097 + '","timestamp":3}', "bad_key"),
]


def test_every_bad_jsonl_line_is_kept_with_its_reason(spark, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    text = "\n".join(line for line, _ in JSONL_CASES[:12]) + "\n\n   \n" + \
        "\n".join(line for line, _ in JSONL_CASES[12:]) + "\n"
    (src / "a.jsonl").write_text(text, encoding="utf-8")
    (src / "bin.jsonl").write_bytes(b'{"key":"\xff","timestamp":1}\n')
    (src / ".hidden.jsonl").write_text("ignored\n")
    (src / "_ignored.jsonl").write_text("ignored\n")
    wh = str(tmp_path / "wh")
    report = run_ingest(spark, wh, [StoreSpec("bad", str(src))])
    entry = report.stores["bad"]
    assert entry.error is None
    expected = {}
    for _, reason in JSONL_CASES:
        if reason:
            expected[reason] = expected.get(reason, 0) + 1
    expected["malformed"] += 1  # invalid UTF-8 file
    assert {k: v for k, v in entry.rejected.items() if v} == expected
    assert entry.read == len(JSONL_CASES) + 1  # blank lines are not records
    accepted = entry.accepted_latest + entry.accepted_out_of_order
    assert entry.read == accepted + sum(entry.rejected.values())
    assert store_versions(os.path.join(wh, "bad")) == {
        "a": [StoredVersion(1, '{"p":1.50}', None)],
        "7": [StoredVersion(2, "1", None)],
    }
    rows = rejected_rows(os.path.join(wh, "bad"))
    by_line = {(r["source"], r["line"]): r for r in rows}
    # blank lines are skipped but still counted in line numbers
    line_of_trailing = 4
    assert by_line[("a.jsonl", line_of_trailing)]["raw"] == JSONL_CASES[3][0]
    assert by_line[("a.jsonl", line_of_trailing)]["reason"] == "malformed"
    assert by_line[("a.jsonl", 17)]["reason"] == "bad_timestamp"  # case 15, after 2 blank lines
    assert all(r["detail"] and r["run"] == 1 and r["ingested_at"] for r in rows)


def test_csv_rules(spark, tmp_path):
    src = tmp_path / "csv"
    src.mkdir()
    (src / "a.csv").write_text(
        'key,value,timestamp,partition,offset\n'
        'k1,"{""p"": 1.50}",10,,\n'
        'k1,,20,,\n'                      # empty value = tombstone
        'k2,notjson,10,,\n'               # bad_value
        'k3,1,2024-01-01T00:00:00Z,,\n'
        ',1,10,,\n'                       # missing key
        'k4,1,,,\n'                       # missing timestamp
        'k5,1,10,x,\n'                    # bad partition
        'k6,1\n'                          # wrong field count
        'k7,"[1,\n2]",30,,\n'             # a record spanning two lines
        'k8,"""' + "x" * 200_000 + '""",40,,\n'   # a field over the csv module's default 128 KiB
        'k9,1,0000-01-01T00:00:00Z,,\n',   # year 0: bad_timestamp, never a crash
        encoding="utf-8")
    wh = str(tmp_path / "wh")
    entry = run_ingest(spark, wh, [StoreSpec("c", str(src), history_retention_ms=10**13)]).stores["c"]
    assert entry.error is None
    assert {k: v for k, v in entry.rejected.items() if v} == {
        "bad_value": 1, "missing_field": 2, "bad_partition": 1, "malformed": 1, "bad_timestamp": 1}
    versions = store_versions(os.path.join(wh, "c"))
    assert versions["k8"][0].value == '"' + "x" * 200_000 + '"'
    assert [(v.timestamp, v.value, v.valid_to) for v in versions["k1"]] == [(10, '{"p":1.50}', 20), (20, None, None)]
    assert versions["k7"][0].value == "[1,2]"
    assert versions["k3"][0].timestamp == 1704067200000
    lines = {r["line"]: r["reason"] for r in rejected_rows(os.path.join(wh, "c"))}
    assert lines == {4: "bad_value", 6: "missing_field", 7: "missing_field", 8: "bad_partition", 9: "malformed",
                     13: "bad_timestamp"}


def test_parquet_rules(spark, tmp_path):
    src = tmp_path / "pq"
    src.mkdir()
    table = pa.table({
        "key": pa.array(["a", "a", None, "b", "c"]),
        "value": pa.array(['{"p":1.50}', None, "1", "not json", '"x"']),
        "timestamp": pa.array([10, 20, 5, 5, -3], pa.int64()),
    })
    pq.write_table(table, src / "a.parquet")
    ts_table = pa.table({
        "key": pa.array([1, 2], pa.int64()),
        "value": pa.array(["1", "2"]),
        "timestamp": pa.array([1000, 2000], pa.timestamp("ms", tz="UTC")),
    })
    pq.write_table(ts_table, src / "b.parquet")
    (src / "c.parquet").write_bytes(b"not a parquet file")
    wh = str(tmp_path / "wh")
    entry = run_ingest(spark, wh, [StoreSpec("p", str(src))]).stores["p"]
    assert entry.error is None
    assert {k: v for k, v in entry.rejected.items() if v} == {
        "missing_field": 1, "bad_value": 1, "bad_timestamp": 1, "malformed": 1}
    versions = store_versions(os.path.join(wh, "p"))
    assert [(v.timestamp, v.value) for v in versions["a"]] == [(10, '{"p":1.50}'), (20, None)]
    assert versions["1"][0].timestamp == 1000 and versions["2"][0].value == "2"
    rows = rejected_rows(os.path.join(wh, "p"))
    by = {(r["source"], r["row"]): r for r in rows}
    assert by[("a.parquet", 2)]["reason"] == "missing_field"
    assert by[("a.parquet", 2)]["line"] is None
    assert '"key": null' in by[("a.parquet", 2)]["raw"]


def test_empty_source_is_not_an_error(spark, tmp_path):
    src = tmp_path / "empty"
    src.mkdir()
    entry = run_ingest(spark, str(tmp_path / "wh"), [StoreSpec("e", str(src))]).stores["e"]
    assert entry.error is None and entry.read == 0 and entry.snapshot == 0


def test_values_keep_member_order_and_number_text():
    table = parse_bytes_for_tests('{"key":"k","value":{"b":1.50,"a":[1e3,-0,"\\u00e9"]},"timestamp":1}\n')
    assert table.column("value").to_pylist() == ['{"b":1.50,"a":[1e3,-0,"é"]}']
