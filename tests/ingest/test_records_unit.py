"""Unit tests of the pure parsing rules: strict JSON, the compact fast path, timestamps,
durations and store names (no Spark)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from versiq.durations import DurationError, parse_duration_ms
from versiq.ingest.records import compact, parse_bytes_for_tests, strict_loads
from versiq.ingest.records.jsonl import compact_members as _compact_members
from versiq.names import is_valid_store_name
from versiq.timestamps import TimestampError, parse_timestamp

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300)
@given(JSON, st.sampled_from([(",", ":"), (", ", ": ")]), st.booleans())
def test_fast_path_gives_exactly_the_general_compact_text(value, separators, ascii_only):
    line = json.dumps({"key": "k", "value": value, "timestamp": 1}, separators=separators,
                      ensure_ascii=ascii_only)
    fast = _compact_members(line)
    general = compact(strict_loads(line)["value"])
    if fast is not None:
        assert fast["value"][1] == general
    table = parse_bytes_for_tests(line + "\n")
    expected = None if value is None else general
    assert table.column("value").to_pylist() == [expected]


@pytest.mark.parametrize("line, reason", [
    ('{"key":"a","key":"b","timestamp":1}', "malformed"),
    ('{"key":"a","value":{"x":1,"x":2},"timestamp":1}', "malformed"),
    ('{"key":"a","value":NaN,"timestamp":1}', "malformed"),
    ('{"key":"a","value":1,"timestamp":1}x', "malformed"),
    ('{"key":"a","value":1,"timestamp":1,}', "malformed"),
    ('{"key":"a","value":01,"timestamp":1}', "malformed"),
])
def test_fast_path_never_accepts_what_the_strict_parser_refuses(line, reason):
    assert parse_bytes_for_tests(line + "\n").column("reason").to_pylist() == [reason]


@pytest.mark.parametrize("text, millis", [
    ("0", 0),
    ("1704067200000", 1704067200000),
    ("2024-01-01T00:00:00Z", 1704067200000),
    ("2024-01-01T01:00:00+01:00", 1704067200000),
    ("2023-12-31T23:00:00-01:00", 1704067200000),
    ("2024-01-01T00:00:00.1239Z", 1704067200123),
    ("2024-02-29T00:00:00z", 1709164800000),
])
def test_timestamp_grammar(text, millis):
    assert parse_timestamp(text) == millis


@pytest.mark.parametrize("text", ["", "-1", "1.5", "2024-01-01T00:00:00", "2024-01-01", "2023-02-29T00:00:00Z",
                                  "2024-01-01T24:00:00Z", "9223372036854775808", "1e3", " 5", "yesterday"])
def test_timestamp_errors_quote_the_text(text):
    with pytest.raises(TimestampError) as info:
        parse_timestamp(text)
    assert repr(text) in str(info.value)


def test_query_string_space_reads_as_plus():
    assert parse_timestamp("2024-01-01T01:00:00 01:00", query_string=True) == 1704067200000
    with pytest.raises(TimestampError):
        parse_timestamp("2024-01-01T01:00:00 01:00")


@pytest.mark.parametrize("text, ms", [("604800000", 604800000), ("7d", 604800000), ("P7D", 604800000),
                                      ("PT12H", 43200000), ("5m", 300000), ("500ms", 500), ("P1DT2H30M", 95400000),
                                      ("PT0.5S", 500), ("2w", 1209600000)])
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["7 days", "P1M", "P1Y", "-5m", "PT", "P", "1.5h"])
def test_bad_durations(text):
    with pytest.raises(DurationError):
        parse_duration_ms(text)


@pytest.mark.parametrize("name, ok", [("prices", True), ("a.b-c_d", True), ("9", True), ("", False),
                                      ("..", False), ("a..b", False), ("../x", False), ("_hidden", False),
                                      (".x", False), ("a/b", False), ("x" * 100, True), ("x" * 101, False)])
def test_store_names(name, ok):
    assert is_valid_store_name(name) is ok


@settings(max_examples=200)
@given(JSON, st.sampled_from([(",", ":"), (", ", ": ")]), st.booleans())
def test_json_text_columns_store_the_compact_form(value, separators, ascii_only):
    from versiq.ingest.records import value_from_json_text

    text = json.dumps(value, separators=separators, ensure_ascii=ascii_only)
    assert value_from_json_text(text) == compact(strict_loads(text))
