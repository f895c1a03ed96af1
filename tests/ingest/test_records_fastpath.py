"""The orjson / column-wise fast paths of ``ingest.records`` agree exactly (every column of
every row) with the general strict per-record path, on ordinary and tricky input."""

from __future__ import annotations

import json
import os
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from versiq.ingest.records import PARSED_SCHEMA, parse_jsonl, parse_parquet

TRICKY_LINES = [
    '{"key":"a","value":{"v":1,"price":923.52},"timestamp":1709251200000}',
    '{"key":"a","value":{"v":1,"price":559.80},"timestamp":1709251200000}',
    '{"key":"a","value":1E5,"timestamp":1}',
    '{"key":"a","value":-0,"timestamp":1}',
    '{"key":"a","value":-0.0,"timestamp":1}',
    '{"key":-0,"value":1,"timestamp":1}',
    '{"key":12,"value":1,"timestamp":1}',
    '{"key":12.0,"value":1,"timestamp":1}',
    '{"key":"","value":1,"timestamp":1}',
    '{"key":true,"value":1,"timestamp":1}',
    '{"key":"a","value":1,"timestamp":true}',
    '{"key":"a","value":1,"timestamp":-1}',
    '{"key":"a","value":1,"timestamp":9223372036854775807}',
    '{"key":"a","value":1,"timestamp":9223372036854775808}',
    '{"key":"a","value":1,"timestamp":18446744073709551616}',
    '{"key":"a","value":1,"timestamp":1.5}',
    '{"key":"a","value":1,"timestamp":"2024-01-01T00:00:00Z"}',
    '{"key":"a","value":1,"timestamp":"2024-01-01T00:00:00"}',
    '{"key":"a","value":1,"timestamp":1,"partition":3,"offset":7}',
    '{"key":"a","value":1,"timestamp":1,"partition":-3}',
    '{"key":"a","value":1,"timestamp":1,"offset":9223372036854775808}',
    '{"key":"a","value":1,"timestamp":1,"partition":null,"offset":null}',
    '{"key":"a","value":null,"timestamp":1}',
    '{"key":"a","timestamp":1}',
    '{"value":1,"timestamp":1}',
    '{"key":"a","value":1}',
    '{"key":"a","key":"b","timestamp":1}',
    '{"key":"a","value":{"x":1,"x":2},"timestamp":1}',
    '{"key":"a","value":{"x":1,"x":1},"timestamp":1}',
    '{"key":"a","value":[{"x":[1,{"y":2,"y":2}]}],"timestamp":1}',
    '{"key":"a","value":NaN,"timestamp":1}',
    '{"key":"a","value":Infinity,"timestamp":1}',
    '{"key":"a","value":1,"timestamp":1}x',
    '{"key":"a","value":1,"timestamp":1} ',
    ' {"key":"a","value":1,"timestamp":1}',
    '{"key":"a","value":1,"timestamp":1,}',
    '{"key":"a","value":01,"timestamp":1}',
    '{"key":"a","value":1e400,"timestamp":1}',
    '{"key":"a","value":123456789012345678901234567890,"timestamp":1}',
    '{"key":"a","value":"\\ud800","timestamp":1}',
    '{"key":"\\ud800","value":1,"timestamp":1}',
    '{"key":"a\\"b","value":"x\\ny\\u0001\\/","timestamp":1}',
    '{"key":"é€😀","value":{"ü":"\u2028\u007f"},"timestamp":1}',
    '{"key" : "a", "value" : [1, 2], "timestamp" : 1}',
    '[1,2]',
    '"text"',
    '{}',
    '{"key":"a","value":' + '['*600 + ']'*600 + ',"timestamp":1}',
    '{"key":"a","value":' + '['*1100 + ']'*1100 + ',"timestamp":1}',
    '{"key":"a","value":"' + 'x' * (1024 * 1024) + '","timestamp":1}',
    '{"key":"a","value":"' + 'x' * (1024 * 1024 - 40) + '","timestamp":1}',
]


def _jsonl_both(data: bytes) -> tuple[pa.Table, pa.Table]:
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as tmp:
        tmp.write(data)
    try:
        fast = pa.Table.from_batches(list(parse_jsonl(tmp.name, "t.jsonl")), schema=PARSED_SCHEMA)
        slow = pa.Table.from_batches(list(parse_jsonl(tmp.name, "t.jsonl", fast=False)), schema=PARSED_SCHEMA)
        return fast, slow
    finally:
        os.unlink(tmp.name)


def test_jsonl_fast_path_agrees_on_tricky_lines():
    data = ("\n".join(TRICKY_LINES) + "\n\n  \r\n").encode("utf-8") + b'{"key":"\xff","value":1,"timestamp":1}\r\n'
    fast, slow = _jsonl_both(data)
    assert fast.num_rows == len(TRICKY_LINES) + 1
    assert fast.to_pylist() == slow.to_pylist()
    # the ordinary lines did take the fast path and were accepted
    assert fast.column("reason").to_pylist()[0] is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)
SCALAR = st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.text(max_size=6) | st.floats()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(SCALAR, JSON, SCALAR, st.sampled_from([(",", ":"), (", ", ": ")]), st.booleans()),
                min_size=1, max_size=6))
def test_jsonl_fast_path_agrees_on_generated_lines(rows):
    lines = [json.dumps({"key": k, "value": v, "timestamp": t}, separators=sep, ensure_ascii=asc)
             for k, v, t, sep, asc in rows]
    fast, slow = _jsonl_both(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
    assert fast.to_pylist() == slow.to_pylist()


def _parquet_both(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    with tempfile.NamedTemporaryFile("wb", suffix=".parquet", delete=False) as tmp:
        pass
    try:
        pq.write_table(table, tmp.name)
        fast = pa.Table.from_batches(list(parse_parquet(tmp.name, "t.parquet")), schema=PARSED_SCHEMA)
        slow = pa.Table.from_batches(list(parse_parquet(tmp.name, "t.parquet", fast=False)), schema=PARSED_SCHEMA)
        return fast, slow
    finally:
        os.unlink(tmp.name)


VALUES = ['{"v":1,"price":923.52}', '{"v":1,"price":559.80}', '{"a": 1}', '{"a":1,"a":2}', "NaN", "1 x", "",
          "null", '"\\ud800"', '"a\\"b"', '"é\u2028"', "[1,2]", "01", "1e400", None, '{"x":"{}"}', "-0"]
KEYS = ["a", "", None, "k{0}", 'q"uote', "é"]


@pytest.mark.parametrize("key_type", [pa.string(), pa.int64()])
def test_parquet_fast_path_agrees_on_tricky_rows(key_type):
    n = len(VALUES) * 3
    keys: list = [KEYS[i % len(KEYS)] for i in range(n)] if key_type == pa.string() else \
        [None if i % 7 == 0 else i - 5 for i in range(n)]
    stamps = [None if i % 11 == 0 else (-1 if i % 13 == 0 else 1709251200000 + i) for i in range(n)]
    table = pa.table({
        "key": pa.array(keys, key_type),
        "value": pa.array([VALUES[i % len(VALUES)] for i in range(n)], pa.string()),
        "timestamp": pa.array(stamps, pa.int64()),
        "partition": pa.array([None if i % 3 else i for i in range(n)], pa.int32()),
        "offset": pa.array([None if i % 4 else (2**64 - 1 if i % 8 == 0 else i) for i in range(n)], pa.uint64()),
        "extra {col}": pa.array([f"x{i}" for i in range(n)], pa.string()),
    })
    fast, slow = _parquet_both(table)
    assert fast.num_rows == n
    assert fast.to_pylist() == slow.to_pylist()


@pytest.mark.parametrize("unit, tz", [("ms", "UTC"), ("us", "UTC"), ("s", "+01:00"), ("ns", None)])
def test_parquet_fast_path_agrees_with_timestamp_columns(unit, tz):
    stamps = pa.array([1709251200123456 if unit == "us" else 1709251200, -1500, None], pa.int64())
    table = pa.table({
        "timestamp": stamps.cast(pa.timestamp(unit, tz)),
        "key": pa.array(["a", "b", "c"]),
        "value": pa.array(['{"x":1}', "2.50", None]),
    })
    fast, slow = _parquet_both(table)
    assert fast.to_pylist() == slow.to_pylist()


def test_parquet_fast_path_agrees_with_string_and_unsigned_columns():
    table = pa.table({
        "key": pa.array([1, 2, 3, 4], pa.uint8()),
        "value": ['{"x":1}', "2.50", None, "true"],
        "timestamp": ["2024-01-01T00:00:00Z", "1709251200000", "bad", "2024-01-01T00:00:00+01:00"],
        "partition": ["0", "", None, "1"],
        "offset": ["5", "x", None, "7"],
    })
    fast, slow = _parquet_both(table)
    assert fast.to_pylist() == slow.to_pylist()


def test_parquet_fast_path_agrees_on_generated_values():
    values = [json.dumps(v) for v in [1.5, 2.0, {"a": [1, 2.25, None, True]}, "s", [], {}]]
    table = pa.table({"key": ["k"] * len(values), "value": values, "timestamp": [5] * len(values)})
    fast, slow = _parquet_both(table)
    assert fast.to_pylist() == slow.to_pylist()
    assert fast.column("reason").null_count == len(values)


def test_fast_paths_take_ordinary_records(monkeypatch):
    from versiq.ingest.records import jsonl, parquet_rows

    def refuse(*args, **kwargs):
        raise AssertionError("general path used for an ordinary record")

    monkeypatch.setattr(jsonl, "_parse_json_line", refuse)
    monkeypatch.setattr(parquet_rows, "_parse_parquet_row", refuse)
    line = '{"key":"k1","value":{"v":1,"price":923.52,"tags":["a",null,true]},"timestamp":1709251200000}'
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
        tmp.write(line + "\n")
    try:
        got = pa.Table.from_batches(list(parse_jsonl(tmp.name, "t.jsonl")), schema=PARSED_SCHEMA)
    finally:
        os.unlink(tmp.name)
    assert got.column("value").to_pylist() == ['{"v":1,"price":923.52,"tags":["a",null,true]}']
    assert got.column("raw").to_pylist() == [line]
    with tempfile.NamedTemporaryFile("wb", suffix=".parquet", delete=False) as ptmp:
        pass
    try:
        pq.write_table(pa.table({"key": ["k1"], "value": ['{"v":1}'], "timestamp": [5]}), ptmp.name)
        got = pa.Table.from_batches(list(parse_parquet(ptmp.name, "t.parquet")), schema=PARSED_SCHEMA)
    finally:
        os.unlink(ptmp.name)
    assert got.column("value").to_pylist() == ['{"v":1}']
    assert got.column("raw").to_pylist() == ['{"key": "k1", "value": "{\\"v\\":1}", "timestamp": 5}']
