"""CSV record boundaries (``ingest.records.csv_rows``): a record ends where RFC 4180 says, even
when the record is refused. A quoted value is text someone else may control: whatever it holds
(lines that look like records included) must never become records of its own, neither when the
record is over the size limit nor when it is invalid CSV."""

from __future__ import annotations

import csv
import io
import json
import os

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from versiq.ingest.records import MAX_RECORD_BYTES, PARSED_SCHEMA, parse_file, raw_texts
from versiq.ingest.records.csv_rows import TooLarge, csv_records, parse_csv

SMUGGLED = "another,1,1700000000001"


def _write(tmp_path, text: str, name: str = "a.csv") -> str:
    path = str(tmp_path / name)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
    return path


def _rows(path: str) -> list[dict]:
    batches = list(parse_file(path, os.path.basename(path), "csv"))
    return pa.Table.from_batches(batches, schema=PARSED_SCHEMA).to_pylist()


def test_an_oversized_quoted_value_is_one_rejection_and_smuggles_nothing(tmp_path):
    filler = "x" * 200 + "\n"
    value = filler * (MAX_RECORD_BYTES // len(filler) + 10) + f"{SMUGGLED}\n" + filler * 3 + SMUGGLED
    text = "key,value,timestamp\n" + "k," + '"' + value + '"' + ",5\nafter,1,6\n"
    path = _write(tmp_path, text)
    rows = _rows(path)
    after_line = 2 + value.count("\n") + 1
    assert [(r["pos"], r["key"], r["reason"]) for r in rows] == [(2, None, "too_large"), (after_line, "after", None)]
    assert text.split("\n", 1)[1].startswith(rows[0]["raw"])
    assert len(rows[0]["raw"].encode()) <= MAX_RECORD_BYTES + len(filler)  # its beginning, not the whole text
    assert list(raw_texts(path, "csv", [after_line])) == [(after_line, "after,1,6")]


def test_invalid_csv_in_a_quoted_field_ends_where_the_quoted_field_ends(tmp_path):
    # strict RFC 4180: a quote inside a quoted field must be doubled; the csv module stops at
    # 'b' but the record goes on: its next field is quoted and spans two more lines
    text = f'key,value,timestamp\nk,"a"b,"x\n{SMUGGLED}\ny",5\nafter,1,6\n'
    rows = _rows(_write(tmp_path, text))
    assert [(r["pos"], r["key"], r["reason"]) for r in rows] == [(2, None, "malformed"), (5, "after", None)]
    assert rows[0]["raw"] == f'k,"a"b,"x\n{SMUGGLED}\ny",5'


def test_an_unterminated_quote_is_one_rejection_to_the_end_of_the_file(tmp_path):
    rows = _rows(_write(tmp_path, f'key,value,timestamp\nk,"x\n{SMUGGLED}\n'))
    assert [(r["pos"], r["reason"]) for r in rows] == [(2, "malformed")]


def test_limit_is_on_the_text_without_its_line_end(tmp_path):
    limit = 20
    for size in (limit - 1, limit, limit + 1):
        line = "k,1," + "9" * (size - 4)
        path = _write(tmp_path, f"key,value,timestamp\r\n{line}\r\nz,1,5\r\n")
        got = [(start, isinstance(row, TooLarge), raw) for start, row, raw in csv_records(path, limit)]
        assert got == [(1, False, "key,value,timestamp"), (2, size > limit, line), (3, False, "z,1,5")]


# ------------------------------------------------------------------ property: an oracle CSV reader
def _oracle(text: str, limit: int) -> list[tuple[int, list[str] | None, str]]:
    """(start line, cells or None when over ``limit``, text) of every record, by the csv module
    reading the whole text with no size limit in play (the limits here are far below its own)."""
    lines = io.StringIO(text, newline="").readlines()
    reader = csv.reader(lines, strict=True)
    out: list[tuple[int, list[str] | None, str]] = []
    done = 0
    for row in reader:
        raw = "".join(lines[done:reader.line_num]).rstrip("\r\n")
        out.append((done + 1, None if len(raw.encode()) > limit else row, raw))
        done = reader.line_num
    return out


_LINE_ENDS = st.sampled_from(["\n", "\r\n", "\r"])
_PIECES = st.sampled_from([SMUGGLED, "k2,2,3", '"q",1,2', "", ",", '""', "é", "x" * 7, "[1,", "2]"])


@st.composite
def _csv_files(draw) -> tuple[str, int]:
    limit = draw(st.integers(32, 64))  # over the header's size
    rows = [["key", "value", "timestamp"]]
    for i in range(draw(st.integers(1, 6))):
        lines = draw(st.lists(_PIECES, min_size=1, max_size=4))
        ends = [draw(_LINE_ENDS) for _ in lines]
        value = "".join(p + e for p, e in zip(lines, ends, strict=True))
        if draw(st.booleans()):
            value = json.dumps(value)[:-1] + "\n" + '"'  # JSON text spanning lines, a valid value
        record = [f"k{i}", value, str(1700000000000 + i)]
        # every size around the limit: pad the value so the record's text lands near it
        bare = len(",".join(record).encode()) + 2 + 2 * value.count('"')
        record[1] = value + " " * max(0, limit - bare + draw(st.integers(-3, 3)))
        rows.append(record)
    buffer = io.StringIO(newline="")
    quoting = draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]))
    csv.writer(buffer, quoting=quoting, lineterminator=draw(st.sampled_from(["\n", "\r\n"]))).writerows(rows)
    return buffer.getvalue(), limit


@settings(max_examples=300)
@given(_csv_files())
@example(('key,value,timestamp\nk,"' + "x" * 30 + f'\n{SMUGGLED}\n",1\n', 32))
def test_records_are_the_oracles(tmp_path_factory, case):
    text, limit = case
    path = _write(tmp_path_factory.mktemp("csv"), text)
    expected = _oracle(text, limit)
    got = list(csv_records(path, limit))
    assert [(s, None if isinstance(r, TooLarge) else r) for s, r, _ in got] == [(s, r) for s, r, _ in expected]
    for (_, row, raw), (_, _, whole) in zip(got, expected, strict=True):
        if isinstance(row, TooLarge):
            assert whole.startswith(raw) and len(raw.encode()) > limit and row.size == len(whole.encode())
        else:
            assert raw == whole
    parsed = pa.Table.from_batches(list(parse_csv(path, "a.csv", limit)), schema=PARSED_SCHEMA).to_pylist()
    records = [(s, r) for s, r, _ in expected[1:]]
    assert [r["pos"] for r in parsed] == [s for s, _ in records]
    assert [r["reason"] == "too_large" for r in parsed] == [r is None for _, r in records]
    for row, (_, cells) in zip(parsed, records, strict=True):
        assert row["key"] is None or cells is not None and row["key"] == cells[0]
