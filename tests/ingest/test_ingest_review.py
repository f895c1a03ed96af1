"""Regression tests from a review of ingest/: inputs that crashed a whole store's run (one bad
line must only ever be one rejected record), boundary rules of docs/contract.md, and Spark
expressions that overflowed under ANSI mode."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.ingest import StoredVersion, rejected_rows, store_versions
from versiq.ingest.errors import UsageError
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.records import PARSED_SCHEMA, parse_bytes_for_tests, parse_file

DEEP = 100_000
MIB = 1024 * 1024
_EXACT_PREFIX = '{"key":"big","timestamp":1,"value":"'
EXACT_1MIB = _EXACT_PREFIX + "x" * (MIB - len(_EXACT_PREFIX) - 2) + '"}'

# (line, expected reason or None); each of these crashed the parser (ValueError, OverflowError,
# UnicodeEncodeError, RecursionError) and with it the whole run, or was decided wrongly.
JSONL_CASES = [
    ('{"key":' + "1" * 5000 + ',"timestamp":1}', "bad_key"),           # int() 4300-digit limit; > 4 KiB key
    ('{"key":-0,"timestamp":1}', None),                                 # key "0"
    ('{"key":"a","timestamp":' + "1" * 5000 + "}", "bad_timestamp"),
    ('{"key":"a","timestamp":"' + "1" * 5000 + '"}', "bad_timestamp"),
    ('{"key":"a","timestamp":1,"offset":99999999999999999999}', "bad_offset"),   # > int64
    ('{"key":"a","timestamp":1,"partition":99999999999999999999}', "bad_partition"),
    ('{"key":"\\ud800","timestamp":1}', "bad_key"),                     # lone surrogate escape
    ('{"key":"a","value":"\\udc00","timestamp":1}', "bad_value"),
    ('{"key":"a","value":{"\\udc00":1},"timestamp":1}', "bad_value"),
    ('{"key":"a","partition":"\\ud800","timestamp":1}', "bad_partition"),  # detail quotes it
    ('{"key":"a","timestamp":1,"value":' + "[" * DEEP + "]" * DEEP + "}", "malformed"),
    ('{"key":"deep","timestamp":1,"value":' + "[ " * 600 + "]" * 600 + "}", None),
    ('{"key":"a","timestamp":"\u0662\u0660\u0662\u0664-01-01T00:00:00Z"}', "bad_timestamp"),
    (EXACT_1MIB, None),                       # exactly 1 MiB is not *over* 1 MiB
]


def test_jsonl_lines_never_crash_and_get_the_right_reason():
    table = parse_bytes_for_tests("\n".join(line for line, _ in JSONL_CASES) + "\n")
    assert table.column("reason").to_pylist() == [reason for _, reason in JSONL_CASES]
    rows = table.to_pylist()
    assert "5000 bytes" in rows[0]["detail"] and "4096" in rows[0]["detail"] and rows[1]["key"] == "0"
    assert rows[11]["value"] == "[" * 600 + "]" * 600
    assert rows[6]["raw"] == JSONL_CASES[6][0]


def test_csv_cells_never_crash():
    table = parse_bytes_for_tests(
        "key,value,timestamp,partition,offset\n"
        "a,1,5,\u00b2,\n"                          # a Unicode digit int() refuses
        "b,1,5,,99999999999999999999\n"            # above int64
        "c,1,5,,0000000000000000000000000007\n", "csv")
    assert table.column("reason").to_pylist() == ["bad_partition", "bad_offset", None]
    assert table.column("offset").to_pylist()[2] == 7


def _parse_parquet(path):
    return pa.Table.from_batches(list(parse_file(str(path), "x.parquet", "parquet")),
                                 schema=PARSED_SCHEMA).to_pylist()


def test_parquet_columns_of_unexpected_types(tmp_path):
    us = pa.table({"key": ["a", "b"], "timestamp": pa.array([1500, -500], pa.timestamp("us", tz="UTC"))})
    pq.write_table(us, tmp_path / "us.parquet")
    rows = _parse_parquet(tmp_path / "us.parquet")
    assert [(r["reason"], r["ts"]) for r in rows] == [(None, 1), ("bad_timestamp", None)]
    naive = pa.table({"key": ["a"], "timestamp": pa.array([1500], pa.timestamp("ms"))})
    pq.write_table(naive, tmp_path / "naive.parquet")
    assert [r["reason"] for r in _parse_parquet(tmp_path / "naive.parquet")] == ["bad_timestamp"]
    odd = pa.table({
        "key": ["a", "b", "c"],
        "timestamp": pa.array([1, 2**64 - 1, 3], pa.uint64()),
        "value": [float("nan"), 1.0, 2.5],
        "offset": pa.array([None, None, 2**64 - 1], pa.uint64()),
    })
    pq.write_table(odd, tmp_path / "odd.parquet")
    assert [r["reason"] for r in _parse_parquet(tmp_path / "odd.parquet")] == [
        "bad_value", "bad_timestamp", "bad_offset"]


def test_one_run_over_every_crashing_input(spark, tmp_path):
    """Through Spark: the run commits, every line is counted once and kept with its reason.
    ``partition`` 2^40 used to fail the run with CAST_OVERFLOW (ANSI mode)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("\n".join(line for line, _ in JSONL_CASES)
                                 + '\n{"key":"p","timestamp":1,"partition":1099511627776}\n', encoding="utf-8")
    (src / "b.csv").write_bytes(b"key,value,timestamp\nk\xff,1,5\nok,1,6\n")
    pq.write_table(pa.table({"key": ["u"], "timestamp": pa.array([7001], pa.timestamp("us", tz="UTC"))}),
                   src / "c.parquet")
    wh = str(tmp_path / "wh")
    entry = run_ingest(spark, wh, [StoreSpec("x", str(src))]).stores["x"]
    assert entry.error is None, entry.error
    assert entry.read == len(JSONL_CASES) + 1 + 2 + 1
    assert entry.read == entry.accepted_latest + entry.accepted_out_of_order + sum(entry.rejected.values())
    assert entry.rejected["bad_partition"] == 3 and entry.rejected["malformed"] == 2
    versions = store_versions(os.path.join(wh, "x"))
    assert versions["ok"] == [StoredVersion(6, "1", None)]
    assert versions["u"] == [StoredVersion(7, None, None)]
    rows = {(r["source"], r["line"]): r for r in rejected_rows(os.path.join(wh, "x"))}
    assert rows[("b.csv", 2)]["reason"] == "malformed" and rows[("b.csv", 2)]["raw"] == "k\ufffd,1,5"
    assert rows[("a.jsonl", len(JSONL_CASES) + 1)]["reason"] == "bad_partition"


def test_history_retention_beyond_int64_is_a_usage_error(tmp_path):
    """It used to fail inside Spark (``lit`` of a number above 2^63-1) as a store error."""
    src = tmp_path / "src"
    src.mkdir()
    with pytest.raises(UsageError):
        run_ingest(None, str(tmp_path / "wh"), [StoreSpec("r", str(src), history_retention_ms=2**64)])  # type: ignore[arg-type]


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "general path"])
def test_parquet_strings_that_are_not_utf8_are_rejected_not_a_crash(tmp_path, fast):
    """A Parquet string column with bytes that are not UTF-8 once raised UnicodeDecodeError in the
    parser and so failed every run of the store: each row of that batch is a malformed rejection."""
    values = pa.array([b'"ok"', b'"\xff\xfe"'], pa.binary()).view(pa.string())
    columns = {"key": pa.array(["a", "b"]), "value": values, "timestamp": pa.array([1, 2], pa.int64())}
    if not fast:
        columns["extra"] = pa.array([1.5, 2.5])  # a float column: the general path
    path = tmp_path / "bad-utf8.parquet"
    pq.write_table(pa.table(columns), path)
    table = pa.Table.from_batches(list(parse_file(str(path), "bad-utf8.parquet", "parquet")), schema=PARSED_SCHEMA)
    assert table.column("reason").to_pylist() == ["malformed", "malformed"]
    assert table.column("pos").to_pylist() == [0, 1]
    assert "not valid UTF-8" in table.column("detail")[0].as_py()
