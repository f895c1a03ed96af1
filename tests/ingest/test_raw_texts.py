"""The original text of records rejected after parsing (late, duplicate offsets) is read again
from their files (``ingest.records.raw_texts``, ``ingest.order``): it must be exactly the text
the parser gives them, in every format, and it must reach ``_rejected``."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.ingest.test_records_fastpath import TRICKY_LINES, VALUES
from tests.support.ingest import rejected_rows
from versiq.ingest import rejections
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.records import PARSED_SCHEMA, parse_file, raw_texts

CSV_TEXT = (
    'key,value,timestamp,partition,offset\r\n'
    'k1,"{""p"": 1.50}",10,,\r\n'
    'k1,,20,,\n'
    'k2,notjson,10,,\n'
    '\n'
    'k7,"[1,\r\n2]",30,,\n'
    'k8,"é ""€""",2024-01-01T00:00:00Z,1,7\n'
    'k9,2,40,,'
)


def _parsed(path: str, fmt: str) -> list[dict]:
    return pa.Table.from_batches(list(parse_file(path, os.path.basename(path), fmt)), schema=PARSED_SCHEMA).to_pylist()


def _assert_texts_agree(path: str, fmt: str) -> int:
    rows = [r for r in _parsed(path, fmt) if r["reason"] is None]
    assert rows, "the fixture must have records the parser accepts"
    texts = list(raw_texts(path, fmt, [r["pos"] for r in rows]))
    assert [(r["pos"], r["raw"]) for r in rows] == texts
    if len(rows) > 1:  # any subset
        assert list(raw_texts(path, fmt, [rows[0]["pos"], rows[-1]["pos"]])) == [
            (rows[0]["pos"], rows[0]["raw"]), (rows[-1]["pos"], rows[-1]["raw"])]
    return len(rows)


def test_jsonl_texts_are_the_parsers(tmp_path):
    path = str(tmp_path / "a.jsonl")
    with open(path, "wb") as handle:
        handle.write(("\n".join(TRICKY_LINES) + "\n\n  \r\n").encode("utf-8"))
        handle.write(b'{"key":"\xff","value":1,"timestamp":1}\r\n{"key":"z","value":[1, 2],"timestamp":3}\r\n')
    assert _assert_texts_agree(path, "jsonl") > 10


def test_csv_texts_are_the_parsers(tmp_path):
    path = str(tmp_path / "a.csv")
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(CSV_TEXT)
    assert _assert_texts_agree(path, "csv") == 4


@pytest.mark.parametrize("timestamps", [
    pa.array([1709251200000 + i for i in range(len(VALUES))], pa.int64()),
    pa.array([1709251200123456 + i for i in range(len(VALUES))], pa.int64()).cast(pa.timestamp("us", "UTC")),
    pa.array([1709251200 + i for i in range(len(VALUES))], pa.int64()).cast(pa.timestamp("s", "+01:00")),
    pa.array(["2024-01-01T00:00:00Z"] * len(VALUES), pa.string()),
])
def test_parquet_texts_are_the_parsers(tmp_path, timestamps):
    n = len(VALUES)
    table = pa.table({"key": [f"k{i}" for i in range(n)], "value": pa.array(VALUES, pa.string()),
                      "timestamp": timestamps, "extra": pa.array([i if i % 2 else None for i in range(n)], pa.int32())})
    path = str(tmp_path / "a.parquet")
    pq.write_table(table, path, row_group_size=4)  # rows spread over several row groups
    assert _assert_texts_agree(path, "parquet") > 5


def test_a_record_no_longer_in_the_file_is_an_error(tmp_path):
    path = str(tmp_path / "a.jsonl")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"key":"a","value":1,"timestamp":1}\n')
    with pytest.raises(ValueError, match="no longer in the file"):
        list(raw_texts(path, "jsonl", [1, 2]))
    with pytest.raises(ValueError, match="ascending"):
        list(raw_texts(path, "jsonl", [1, 1]))


@pytest.mark.parametrize("with_parquet", [True, False], ids=["spark-parsed", "parsed-here"])
@pytest.mark.parametrize("driver_limit", [None, 0], ids=["driver", "spark"])
def test_late_and_duplicate_records_keep_their_text_in_every_format(spark, tmp_path, monkeypatch, driver_limit,
                                                                    with_parquet):
    """One run over a JSONL, a CSV and a Parquet file: its late records and duplicate offsets
    are rejected after parsing, and ``_rejected`` holds their exact original text, whether the
    driver or Spark writes it (``DRIVER_REJECTIONS``, ``PARSED_HERE_REJECTIONS``), next to the
    parser's own rejections. Without the Parquet file the run is parsed and decided in the
    driver (``ingest.decisions_here``), whose Arrow tables Spark then assembles."""
    if driver_limit is not None:
        monkeypatch.setattr(rejections, "DRIVER_REJECTIONS", driver_limit)
        monkeypatch.setattr(rejections, "PARSED_HERE_REJECTIONS", driver_limit)
    src = tmp_path / "src"
    src.mkdir()
    jsonl = ['{"key":"a","value":1,"timestamp":1000}', '{"key":"b","value": 2,"timestamp":5}',
             '{"key":"c","value":3,"timestamp":990}']
    (src / "1.jsonl").write_text("\n".join(jsonl) + "\n", encoding="utf-8")
    (src / "2.csv").write_text('key,value,timestamp\nd,"[1,\n2]",7\ne,4,1001\n', encoding="utf-8")
    table = pa.table({"key": ["f", "g"], "value": ['{"x": 1}', "5"],
                      "timestamp": pa.array([1_000_000, 5], pa.int64()).cast(pa.timestamp("ms", "UTC"))})
    if with_parquet:
        pq.write_table(table, str(src / "3.parquet"))
    (src / "0.jsonl").write_text('not json\n{"key":"z","value":1,"timestamp":1}\n', encoding="utf-8")
    (src / "4.jsonl").write_text('{"key":"h","value":1,"timestamp":3,"partition":0,"offset":1}\n'
                                 '{"key":"h","value":2,"timestamp":2000000,"partition":0,"offset":1}\n',
                                 encoding="utf-8")
    wh = str(tmp_path / "wh")
    entry = run_ingest(spark, wh, [StoreSpec("t", str(src), history_retention_ms=100)]).stores["t"]
    assert entry.error is None, entry.error
    rows = rejected_rows(os.path.join(wh, "t"))
    assert [(r["source"], r["line"], r["row"]) for r in rows] == sorted(
        (r["source"], r["line"], r["row"]) for r in rows)  # in processing order
    assert all(r["run"] == 1 and r["ingested_at"] for r in rows)
    assert next(r for r in rows if r["reason"] == "duplicate_offset")["offset"] == 1
    got = {(r["source"], r["line"], r["row"]): (r["reason"], r["raw"]) for r in rows}
    assert got == {
        ("0.jsonl", 1, None): ("malformed", "not json"),
        ("1.jsonl", 2, None): ("late", jsonl[1]),
        ("2.csv", 2, None): ("late", 'd,"[1,\n2]",7'),
        ("4.jsonl", 1, None): ("late", '{"key":"h","value":1,"timestamp":3,"partition":0,"offset":1}'),
        ("4.jsonl", 2, None): ("duplicate_offset",
                               '{"key":"h","value":2,"timestamp":2000000,"partition":0,"offset":1}'),
    } | ({("3.parquet", None, 1): ("late", json.dumps({"key": "g", "value": "5", "timestamp": 5}))}
         if with_parquet else {})


def test_a_byte_order_mark_is_not_part_of_the_first_record(tmp_path):
    jsonl = str(tmp_path / "a.jsonl")
    with open(jsonl, "wb") as handle:
        handle.write(b'\xef\xbb\xbf{"key":"a","value":1,"timestamp":1}\n{"key":"b","value":2,"timestamp":2}\n')
    rows = _parsed(jsonl, "jsonl")
    assert [(r["key"], r["reason"], r["raw"]) for r in rows] == [
        ("a", None, '{"key":"a","value":1,"timestamp":1}'), ("b", None, '{"key":"b","value":2,"timestamp":2}')]
    assert _assert_texts_agree(jsonl, "jsonl") == 2
    csv_path = str(tmp_path / "a.csv")
    with open(csv_path, "wb") as handle:
        handle.write("\ufeffkey,value,timestamp\r\na,1,1\r\n".encode())
    assert [(r["key"], r["reason"], r["raw"]) for r in _parsed(csv_path, "csv")] == [("a", None, "a,1,1")]
    assert _assert_texts_agree(csv_path, "csv") == 1


def test_a_csv_file_without_header_says_so(tmp_path):
    path = str(tmp_path / "a.csv")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("a,1,1\nb,2,2\n\nc,3,3\n")
    rows = _parsed(path, "csv")
    assert [(r["pos"], r["reason"]) for r in rows] == [(2, "missing_field"), (4, "missing_field")]
    assert rows[0]["detail"] == ("missing field 'key': the CSV header (line 1) has no 'key' column; "
                                 "it reads: a,1,1")
