"""CSV (RFC 4180) with a mandatory header naming ``key``, ``value``, ``timestamp`` and optionally
``partition``, ``offset``; ``value`` is JSON text (an empty cell is a tombstone)."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

import pyarrow as pa

from versiq.ingest.records.batch import Batcher
from versiq.ingest.records.fields import (
    MAX_INT64,
    Reject,
    has_surrogate,
    value_from_json_text,
)
from versiq.ingest.records.schema import BATCH_ROWS, MAX_RECORD_BYTES
from versiq.timestamps import TimestampError, parse_timestamp


@dataclass(frozen=True)
class TooLarge:
    """A record whose text (without its line end) is over the record limit: ``size`` bytes."""

    size: int


class _PastLimit(Exception):
    """Raised to the csv reader by ``_Lines`` when the record it is reading passes the limit."""


def _quoted_at_end(line: str, quoted: bool) -> bool:
    """Whether a record is inside a quoted field at the end of ``line``, one of its physical
    lines, given whether it was at the line's start (a record's first line starts outside).

    The csv module's grammar, as its lenient mode reads it: a quote opens a quoted field only at
    a field's start; inside, a doubled quote is one quote and a single one closes the field (text
    after it up to the next comma stays in the field). Only where quoting ends matters here, so
    the line is searched for quotes, not read character by character."""
    i = 0
    if not quoted and line.startswith('"'):
        quoted, i = True, 1
    while True:
        if quoted:
            j = line.find('"', i)
            if j < 0:
                return True
            if line.startswith('"', j + 1):
                i = j + 2
            else:
                quoted, i = False, j + 1
        else:
            j = line.find(',"', i)
            if j < 0:
                return False
            quoted, i = True, j + 2


def _line_end(line: str) -> int:
    """Characters of ``line``'s line end (none, ``\\n``, ``\\r`` or ``\\r\\n``)."""
    if line.endswith("\n"):
        return 2 if line.endswith("\r\n") else 1
    return 1 if line.endswith("\r") else 0


class _Lines:
    """A file's physical lines for ``csv.reader``, numbered, with the text of the record being
    read: all of it while it is within ``limit`` bytes, then only up to the line that passes
    them (memory stays bounded whatever a quoted value holds)."""

    def __init__(self, handle: TextIO, limit: int) -> None:
        self._lines = iter(handle)
        self._limit = limit
        self.number = 0
        self.text: list[str] = []
        self._size = 0  # bytes of the lines read of the record, line ends included
        self._last = ""

    def next_record(self) -> None:
        self.text.clear()
        self._size = 0
        self._last = ""

    def record_bytes(self) -> int:
        """Bytes of the record's text so far without its line end: a lower bound of its size,
        exact once the record is read to its end."""
        return self._size - _line_end(self._last)

    def over(self) -> bool:
        """Whether the record read so far is over the limit (then so is the whole record)."""
        return self._size > self._limit and self.record_bytes() > self._limit

    def _take(self) -> str:
        line = next(self._lines)
        self.number += 1
        if not self.over():
            self.text.append(line)
        self._size += len(line.encode("utf-8", "surrogateescape"))
        self._last = line
        return line

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        line = self._take()
        if self.over():
            raise _PastLimit
        return line

    def finish_record(self) -> None:
        """Read the rest of a record the csv reader gave up on (it passed the limit, or it is
        invalid CSV), up to the first line end outside a quoted field. Left to itself, the csv
        reader goes on at the next physical line, which may be inside a quoted value: text in a
        value would be read as records. The csv reader never reads past the kept text: ``__next__``
        stops it at the line that passes the limit."""
        quoted = False
        for line in self.text:
            quoted = _quoted_at_end(line, quoted)
        while quoted:
            try:
                line = self._take()
            except StopIteration:
                return
            quoted = _quoted_at_end(line, True)


def csv_records(path: str, limit: int = MAX_RECORD_BYTES,
                ) -> Iterator[tuple[int, list[str] | csv.Error | TooLarge, str]]:
    """(line where the record starts, its cells or the CSV error or ``TooLarge``, its original
    text) for every CSV record of the file, blank ones included (a UTF-8 byte order mark at the
    start of the file is not part of the header).

    A record whose text (without its line end) is over ``limit`` bytes is not parsed; its text
    is its beginning, up to the line that passes the limit. A record that is too large or
    invalid CSV still ends where its quoted fields end: the next record starts where a correct
    CSV reader starts it, whatever the refused record's values hold."""
    # The csv module refuses fields over 128 KiB by default, and a record within the limit may
    # have one; it never sees a record past the limit (``_Lines``).
    if csv.field_size_limit() <= limit:
        csv.field_size_limit(limit + 1)
    with open(path, encoding="utf-8-sig", newline="", errors="surrogateescape") as handle:
        lines = _Lines(handle, limit)
        reader = csv.reader(lines, strict=True)
        while True:
            lines.next_record()
            start = lines.number + 1
            try:
                row: list[str] | csv.Error | TooLarge = next(reader)
            except StopIteration:
                return
            except _PastLimit:
                lines.finish_record()
                row = TooLarge(lines.record_bytes())
            except csv.Error as exc:
                lines.finish_record()
                row = TooLarge(lines.record_bytes()) if lines.over() else exc
            yield start, row, "".join(lines.text).rstrip("\r\n")


def parse_csv(path: str, source: str, limit: int = MAX_RECORD_BYTES) -> Iterator[pa.RecordBatch]:
    """RFC 4180 CSV with a mandatory header; ``line`` is the 1-based line where a record starts.
    ``limit``: the record size limit in bytes (smaller ones for tests)."""
    out = Batcher(source)
    header: list[str] | None = None
    header_line = 0
    for start, row, raw in csv_records(path, limit):
        if isinstance(row, TooLarge):
            out.reject(start, "too_large", f"record is {row.size} bytes (limit {_limit_text(limit)})", raw)
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


def _limit_text(limit: int) -> str:
    return "1 MiB" if limit == MAX_RECORD_BYTES else f"{limit} bytes"


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

