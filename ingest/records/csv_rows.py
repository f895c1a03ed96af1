"""CSV (RFC 4180) with a mandatory header naming ``key``, ``value``, ``timestamp`` and optionally
``partition``, ``offset``; ``value`` is JSON text (an empty cell is a tombstone)."""

from __future__ import annotations

import csv
from collections.abc import Iterator

import pyarrow as pa

from versiq.ingest.records.batch import Batcher, too_large
from versiq.ingest.records.fields import (
    MAX_INT64,
    Reject,
    has_surrogate,
    value_from_json_text,
)
from versiq.ingest.records.schema import BATCH_ROWS, MAX_RECORD_BYTES
from versiq.timestamps import TimestampError, parse_timestamp


def csv_records(path: str) -> Iterator[tuple[int, list[str] | csv.Error, str]]:
    """(line where the record starts, its cells or the CSV error, its original text) for every
    CSV record of the file, blank ones included (a UTF-8 byte order mark at the start of the
    file is not part of the header)."""
    # The csv module refuses fields over 128 KiB by default; the record limit (1 MiB, checked on
    # each record's text by the caller) is the only size limit in every format. A field past it
    # still ends that record with a csv.Error, whose text is then too large as well.
    if csv.field_size_limit() < MAX_RECORD_BYTES + 1:
        csv.field_size_limit(MAX_RECORD_BYTES + 1)
    with open(path, encoding="utf-8-sig", newline="", errors="surrogateescape") as handle:
        consumed: list[str] = []
        line_no = 0

        def lines() -> Iterator[str]:
            nonlocal line_no
            for text in handle:
                line_no += 1
                consumed.append(text)
                yield text

        reader = csv.reader(lines(), strict=True)
        while True:
            consumed.clear()
            start = line_no + 1
            try:
                row: list[str] | csv.Error = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                row = exc
            yield start, row, "".join(consumed).rstrip("\r\n")


def parse_csv(path: str, source: str) -> Iterator[pa.RecordBatch]:
    """RFC 4180 CSV with a mandatory header; ``line`` is the 1-based line where a record starts."""
    out = Batcher(source)
    header: list[str] | None = None
    header_line = 0
    for start, row, raw in csv_records(path):
        if header is not None and too_large(len(raw.encode("utf-8", "surrogateescape"))):
            out.reject(start, "too_large", "record is larger than 1 MiB", raw)
            continue
        if isinstance(row, csv.Error):
            out.reject(start, "malformed", f"invalid CSV: {row}", raw)
            continue
        if header is not None and has_surrogate(raw):
            out.reject(start, "malformed", "line is not valid UTF-8", raw)
            continue
        if not row or (len(row) == 1 and row[0].strip() == "" and raw.strip() == ""):
            continue
        if header is None:
            header = [h.strip() for h in row]
            header_line = start
            continue
        if len(row) != len(header):
            out.reject(start, "malformed",
                       f"row has {len(row)} fields, header has {len(header)}", raw)
        else:
            _parse_csv_row(out, start, dict(zip(header, row, strict=True)), raw, header, header_line)
        if len(out) >= BATCH_ROWS:
            yield out.flush()
    if len(out):
        yield out.flush()


def _csv_int(cells: dict[str, str], name: str, reason: str) -> int | None:
    text = cells.get(name, "").strip()
    if text == "":
        return None
    digits = text.lstrip("0") or "0"
    if text.isascii() and text.isdigit() and len(digits) <= 19 and int(digits) <= MAX_INT64:
        return int(digits)
    raise Reject(reason, f"'{name}' must be a non-negative integer, got {text!r}")


def _missing_csv_field(name: str, header: list[str], header_line: int) -> Reject:
    """``missing_field`` for an empty cell, or, when the header has no such column (a file
    without a header line, a misspelt name), saying so: every row of the file gets it."""
    if name in header:
        return Reject("missing_field", f"missing field '{name}'")
    shown = ",".join(header)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return Reject("missing_field", f"missing field '{name}': the CSV header (line {header_line}) has no "
                                   f"'{name}' column; it reads: {shown}")


def _parse_csv_row(out: Batcher, number: int, cells: dict[str, str], raw: str, header: list[str],
                   header_line: int) -> None:
    """One CSV record of the header's width whose text is within the record limit (parse_csv)."""
    part = offset = None
    try:
        part = _csv_int(cells, "partition", "bad_partition")
        offset = _csv_int(cells, "offset", "bad_offset")
        key = cells.get("key")
        if key is None or key == "":
            raise _missing_csv_field("key", header, header_line)
        ts_text = cells.get("timestamp", "")
        if ts_text == "":
            raise _missing_csv_field("timestamp", header, header_line)
        try:
            ts = parse_timestamp(ts_text.strip())
        except TimestampError as exc:
            raise Reject("bad_timestamp", str(exc)) from None
        value_cell = cells.get("value", "")
        value = None if value_cell == "" else value_from_json_text(value_cell)
        if value == "null":
            value = None
    except Reject as rej:
        out.reject(number, rej.reason, rej.detail, raw, part, offset)
        return
    out.record(number, key, value, ts, part, offset, raw)

