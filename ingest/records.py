"""Parsing changelog files into records or rejections (runs on Spark executors).

One function per format turns a file into Arrow batches of ``PARSED_SCHEMA``: every non-blank
line/row becomes exactly one row, either a record (``reason`` null) or a rejection with its
reason code, a precise ``detail`` and the exact original text. Nothing is dropped here, so the
run report's ``read`` is simply the row count.

JSON is parsed strictly (CONTRACT.md, Record parsing): Spark's JSON reader accepts trailing
garbage and coerces types, so the standard library's strict parser is used with hooks that
reject duplicate member names and NaN/Infinity and keep every number's text verbatim.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from versiq.layout import MAX_KEY_BYTES
from versiq.timestamps import MAX_TIMESTAMP, TimestampError, format_timestamp, parse_timestamp

MAX_RECORD_BYTES = 1024 * 1024
BATCH_ROWS = 8192

PARSED_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string()),
        pa.field("pos", pa.int64()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("ts", pa.int64()),
        pa.field("part", pa.int64()),
        pa.field("offset", pa.int64()),
        pa.field("reason", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("raw", pa.string()),
    ]
)

FORMAT_BY_EXTENSION = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
                       ".parquet": "parquet"}


class Reject(Exception):
    """A record-level rejection: ``reason`` is a code of ``versiq.layout.REJECT_REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class RawInt(str):
    """A JSON integer, kept as its source text."""


class RawFloat(str):
    """A JSON number with a fraction or exponent, kept as its source text."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ValueError(f"duplicate member name {name!r}")
            seen.add(name)
    return result


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_int=RawInt, parse_float=RawFloat, parse_constant=_no_constants
)


def strict_loads(text: str) -> Any:
    """RFC 8259 parse: whitespace only after the value, no duplicates, no NaN; ValueError else."""
    return _DECODER.decode(text)


def _compact_scalar(value: Any) -> str:
    if isinstance(value, (RawInt, RawFloat)):
        return str.__str__(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):  # from Parquet values, not from JSON text
        return json.dumps(value)
    raise TypeError(f"unsupported value type {type(value).__name__}")


class _Text(str):
    """Already-rendered output text on ``compact``'s work stack."""


def compact(value: Any) -> str:
    """Compact JSON text keeping member order and each number's text verbatim.

    Iterative, so any value the (C) parser accepted renders, however deeply it is nested."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Text):
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = [_Text("{")]
            for i, (name, member) in enumerate(item.items()):
                parts += [_Text(("," if i else "") + json.dumps(name, ensure_ascii=False) + ":"), member]
            parts.append(_Text("}"))
            stack.extend(reversed(parts))
        elif isinstance(item, list):
            parts = [_Text("[")]
            for i, element in enumerate(item):
                if i:
                    parts.append(_Text(","))
                parts.append(element)
            parts.append(_Text("]"))
            stack.extend(reversed(parts))
        else:
            out.append(_compact_scalar(item))
    return "".join(out)


MAX_INT64 = 2**63 - 1


def _json_int(value: RawInt) -> int | None:
    """A JSON integer's value, or None when it is outside the signed 64-bit range (checked on
    the text first: ``int()`` refuses texts over 4300 digits)."""
    if len(value.lstrip("-")) > 19:
        return None
    number = int(value)
    return number if -MAX_INT64 - 1 <= number <= MAX_INT64 else None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _safe_text(text: str | None) -> str | None:
    """Text that can be stored as UTF-8: lone surrogates (JSON escapes like \\ud800, or
    undecodable bytes kept by ``surrogateescape``) become U+FFFD."""
    if text is None or not _has_surrogate(text):
        return text
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


# ------------------------------------------------------------------ field rules (all formats)
def key_from_json(value: Any, present: bool) -> str:
    if not present or value is None:
        raise Reject("missing_field", "missing field 'key'")
    if isinstance(value, RawInt):
        # JSON integer text is canonical (no leading zeros, no '+') except for "-0".
        return "0" if value == "-0" else str.__str__(value)
    if isinstance(value, RawFloat) or isinstance(value, (bool, dict, list)):
        raise Reject("bad_key", f"'key' must be a string or an integer, got {compact(value)}")
    if isinstance(value, str):
        if value == "":
            raise Reject("missing_field", "field 'key' is empty")
        return value
    raise Reject("bad_key", f"'key' has unsupported type {type(value).__name__}")


def timestamp_from_json(value: Any, present: bool) -> int:
    if not present or value is None:
        raise Reject("missing_field", "missing field 'timestamp'")
    if isinstance(value, RawInt):
        number = _json_int(value)
        if number is None or number < 0 or number > MAX_TIMESTAMP:
            raise Reject("bad_timestamp", f"timestamp {value} is outside [0, 2^63-1]")
        return number
    if isinstance(value, str) and not isinstance(value, RawFloat):
        try:
            return parse_timestamp(value)
        except TimestampError as exc:
            raise Reject("bad_timestamp", str(exc)) from None
    raise Reject("bad_timestamp", f"'timestamp' must be epoch ms or an ISO-8601 instant, got {compact(value)}")


def optional_int(value: Any, name: str, reason: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, RawInt):
        number = _json_int(value)
        if number is not None and number >= 0:
            return number
    raise Reject(reason, f"'{name}' must be a non-negative integer, got {compact(value)}")


def value_from_json_text(text: str) -> str:
    """A JSON-text value column (CSV, Parquet strings): parse strictly and re-render compactly.

    Text with no whitespace and no escapes is already its own compact form once it parses."""
    try:
        parsed = strict_loads(text)
        if " " not in text and "\\" not in text and "\t" not in text and "\n" not in text and "\r" not in text:
            return text
        return compact(parsed)
    except (ValueError, RecursionError) as exc:
        raise Reject("bad_value", f"'value' is not JSON text: {exc}") from None


# ------------------------------------------------------------------ batches
class _Batcher:
    def __init__(self, source: str) -> None:
        self.source = source
        self._reset()

    def _reset(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in PARSED_SCHEMA.names}
        (self._source, self._pos, self._key, self._value, self._ts, self._part, self._offset, self._reason,
         self._detail, self._raw) = (self.columns[name] for name in PARSED_SCHEMA.names)

    def record(self, pos: int, key: str, value: str | None, ts: int, part: int | None,
               offset: int | None, raw: str) -> None:
        if _key_too_long(key):
            self.reject(pos, "bad_key", _key_too_long_detail(key), raw, part, offset)
        elif _has_surrogate(key):
            self.reject(pos, "bad_key", "'key' is not valid Unicode (lone surrogate)", raw, part, offset)
        elif value is not None and _has_surrogate(value):
            self.reject(pos, "bad_value", "'value' is not valid Unicode (lone surrogate)", raw, part,
                        offset)
        else:
            self._row(pos, key, value, ts, part, offset, None, None, raw)

    def fast_row(self, pos: int, key: str, value: str | None, ts: int, part: int | None,
                 offset: int | None, raw: str) -> None:
        """A record already known to be valid UTF-8 throughout (no surrogates to check)."""
        if _key_too_long(key):
            self.reject(pos, "bad_key", _key_too_long_detail(key), raw, part, offset)
            return
        self._source.append(self.source)
        self._pos.append(pos)
        self._key.append(key)
        self._value.append(value)
        self._ts.append(ts)
        self._part.append(part)
        self._offset.append(offset)
        self._reason.append(None)
        self._detail.append(None)
        self._raw.append(raw)

    def reject(self, pos: int, reason: str, detail: str, raw: str, part: int | None = None,
               offset: int | None = None) -> None:
        self._row(pos, None, None, None, part, offset, reason, detail, raw)

    def _row(self, pos: int, key: str | None, value: str | None, ts: int | None, part: int | None,
             offset: int | None, reason: str | None, detail: str | None, raw: str) -> None:
        c = self.columns
        c["source"].append(self.source)
        c["pos"].append(pos)
        c["key"].append(key)
        c["value"].append(value)
        c["ts"].append(ts)
        c["part"].append(part)
        c["offset"].append(offset)
        c["reason"].append(reason)
        c["detail"].append(_safe_text(detail))
        c["raw"].append(_safe_text(raw))

    def __len__(self) -> int:
        return len(self.columns["pos"])

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.columns, schema=PARSED_SCHEMA)
        self._reset()
        return batch


def _key_too_long(key: str) -> bool:
    """Every format's accepted records pass the batcher, so the key limit is checked once here.
    A key of at most MAX_KEY_BYTES // 4 characters cannot exceed the limit (UTF-8 takes at most
    4 bytes per character): only longer keys are encoded to count."""
    return len(key) > MAX_KEY_BYTES // 4 and len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES


def _key_too_long_detail(key: str) -> str:
    size = len(key.encode("utf-8", "surrogatepass"))
    return f"'key' is {size} bytes of UTF-8; the limit is {MAX_KEY_BYTES} bytes (4 KiB)"


def _too_large(raw_bytes: int) -> bool:
    return raw_bytes > MAX_RECORD_BYTES


_UTF8_BOM = b"\xef\xbb\xbf"


def _jsonl_lines(handle: Any) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line bytes) of a binary file; a UTF-8 byte order mark at the very
    start of the file is not part of the first line (editors on Windows write one)."""
    for number, line_bytes in enumerate(handle, start=1):
        if number == 1 and line_bytes.startswith(_UTF8_BOM):
            line_bytes = line_bytes[len(_UTF8_BOM):]
        yield number, line_bytes


def parse_jsonl(path: str, source: str, fast: bool = True) -> Iterator[pa.RecordBatch]:
    """``fast``: try ``_fast_json_line`` on each line first (tests turn it off to compare)."""
    out = _Batcher(source)
    with open(path, "rb") as handle:
        for number, line_bytes in _jsonl_lines(handle):
            body = line_bytes.rstrip(b"\r\n")
            if not (fast and len(body) <= MAX_RECORD_BYTES and _fast_json_line(out, number, body)):
                _slow_jsonl_line(out, number, line_bytes)
            if len(out._pos) >= BATCH_ROWS:
                yield out.flush()
    if len(out):
        yield out.flush()


def _slow_jsonl_line(out: _Batcher, number: int, line_bytes: bytes) -> None:
    """The general (strict, per-record) path for one line: every rejection is worded here."""
    if not line_bytes.strip():
        return
    try:
        raw = line_bytes.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        out.reject(number, "malformed", f"line is not valid UTF-8: {exc}",
                   line_bytes.decode("utf-8", "replace").rstrip("\r\n"))
        return
    size = len(line_bytes.rstrip(b"\r\n"))
    if _too_large(size):
        out.reject(number, "too_large", f"record is {size} bytes (limit 1 MiB)", raw)
    else:
        _parse_json_line(out, number, raw)


_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError


def _fast_json_line(out: _Batcher, number: int, body: bytes) -> bool:
    """Fast path for a well-formed record in canonical compact form; False means: use the
    general path (which decides and words anything unusual).

    orjson is a strict RFC 8259 parser (no NaN/Infinity, no trailing content, valid UTF-8
    only) but keeps the last of duplicate member names and reads numbers as int/float. A
    line that re-serialises to exactly its own bytes therefore has no duplicate member at any
    depth, no whitespace, and every number's text is the one orjson writes (so "verbatim" and
    re-rendered text agree); with no backslash there are no escapes, so every string renders
    the same way under ``compact``. The value's compact text is then ``dumps(value)``."""
    if b"\\" in body:
        return False
    try:
        obj = _loads(body)
        if type(obj) is not dict or _dumps(obj) != body:
            return False
    except (_JSONDecodeError, TypeError):  # TypeError: orjson's dumps nests less deeply than loads
        return False
    key = obj.get("key")
    if type(key) is str:
        if not key:
            return False
    elif type(key) is int:
        key = str(key)
    else:
        return False
    ts = obj.get("timestamp")
    if type(ts) is int:
        if ts < 0 or ts > MAX_TIMESTAMP:
            return False
    elif type(ts) is str:
        try:
            ts = parse_timestamp(ts)
        except TimestampError:
            return False
    else:
        return False
    part = obj.get("partition")
    if part is not None and (type(part) is not int or part < 0 or part > MAX_INT64):
        return False
    offset = obj.get("offset")
    if offset is not None and (type(offset) is not int or offset < 0 or offset > MAX_INT64):
        return False
    value = obj.get("value")
    out.fast_row(number, key, None if value is None else _dumps(value).decode(), ts, part, offset,
                 body.decode())
    return True


def _compact_members(raw: str) -> dict[str, tuple[Any, str]] | None:
    """Fast path for a line with no whitespace and no escapes: the top-level members with each
    value's source text, which for such a line *is* its compact form (the same text
    ``compact`` would produce). None means: use the general path (which also words errors)."""
    if raw[:1] != "{" or " " in raw or "\t" in raw or "\\" in raw or "\r" in raw:
        return None
    members: dict[str, tuple[Any, str]] = {}
    if raw == "{}":
        return members
    idx, end = 1, len(raw)
    try:
        while True:
            if raw[idx] != '"':
                return None
            name, idx = scanstring(raw, idx + 1, True)
            if raw[idx] != ":" or name in members:
                return None
            value, stop = _DECODER.scan_once(raw, idx + 1)  # type: ignore[attr-defined]
            members[name] = (value, raw[idx + 1:stop])
            if stop == end - 1 and raw[stop] == "}":
                return members
            if raw[stop] != ",":
                return None
            idx = stop + 1
    except (StopIteration, ValueError, IndexError, RecursionError):
        return None


def _parse_json_line(out: _Batcher, number: int, raw: str) -> None:
    fast = _compact_members(raw)
    if fast is not None:
        obj: Any = {name: value for name, (value, _text) in fast.items()}
    else:
        try:
            obj = strict_loads(raw)
        except (ValueError, RecursionError) as exc:
            out.reject(number, "malformed", f"not one complete JSON object: {exc}", raw)
            return
        if not isinstance(obj, dict):
            out.reject(number, "malformed", "top level is not a JSON object", raw)
            return
    part = offset = None
    try:
        part = optional_int(obj.get("partition"), "partition", "bad_partition")
        offset = optional_int(obj.get("offset"), "offset", "bad_offset")
        key = key_from_json(obj.get("key"), "key" in obj)
        ts = timestamp_from_json(obj.get("timestamp"), "timestamp" in obj)
        value = obj.get("value")
        if value is None:
            value_text = None
        elif fast is not None:
            value_text = fast["value"][1]
        else:
            value_text = compact(value)
    except Reject as rej:
        out.reject(number, rej.reason, rej.detail, raw, part, offset)
        return
    out.record(number, key, value_text, ts, part, offset, raw)


def _csv_records(path: str) -> Iterator[tuple[int, list[str] | csv.Error, str]]:
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
    out = _Batcher(source)
    header: list[str] | None = None
    header_line = 0
    for start, row, raw in _csv_records(path):
        if header is not None and _too_large(len(raw.encode("utf-8", "surrogateescape"))):
            out.reject(start, "too_large", "record is larger than 1 MiB", raw)
            continue
        if isinstance(row, csv.Error):
            out.reject(start, "malformed", f"invalid CSV: {row}", raw)
            continue
        if header is not None and _has_surrogate(raw):
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


def _parse_csv_row(out: _Batcher, number: int, cells: dict[str, str], raw: str, header: list[str],
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


def _parquet_cell_json(value: Any) -> str:
    import datetime as dt
    import decimal

    def default(obj: Any) -> Any:
        if isinstance(obj, (dt.datetime, dt.date)):
            return obj.isoformat()
        if isinstance(obj, decimal.Decimal):
            return str(obj)
        if isinstance(obj, bytes):
            return obj.decode("utf-8", "replace")
        return str(obj)

    return json.dumps(value, ensure_ascii=False, default=default)


def parse_parquet(path: str, source: str, fast: bool = True) -> Iterator[pa.RecordBatch]:
    """Parquet rows (``row`` 0-based). ``raw`` is the row rendered as a JSON object.

    ``fast``: batches of plain columns (strings and integers) are read column-wise and every
    row that ``_fast_parquet_rows`` cannot take whole goes through the general path."""
    with open(path, "rb") as handle:  # an OSError here is the environment's: it fails the run
        yield from _parse_parquet_file(handle, source, fast)


def _parse_parquet_file(handle: Any, source: str, fast: bool) -> Iterator[pa.RecordBatch]:
    out = _Batcher(source)
    try:
        pfile = pq.ParquetFile(handle)
    except Exception as exc:  # noqa: BLE001 - content that is not Parquet is one malformed record
        out.reject(0, "malformed", f"not a readable Parquet file: {exc}", "")
        yield out.flush()
        return
    ts_type = _timestamp_type(pfile)
    is_ts = ts_type is not None and pa.types.is_timestamp(ts_type)
    row_number = 0
    batches = pfile.iter_batches(batch_size=BATCH_ROWS)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - unreadable rows end the file as one rejection
            out.reject(row_number, "malformed", f"cannot read Parquet rows from row {row_number} on: {exc}",
                       "")
            break
        batch, unit = _timestamp_ticks(batch) if is_ts else (batch, None)
        if fast and _fast_parquet_ok(batch.schema, ts_type):
            _fast_parquet_rows(out, row_number, batch, unit, ts_type)
            row_number += batch.num_rows
        else:
            for row in batch.to_pylist():
                raw = _parquet_row_text(row, unit)
                _parse_parquet_row(out, row_number, row, raw, ts_type)
                row_number += 1
        if len(out) >= BATCH_ROWS:
            yield out.flush()
    if len(out):
        yield out.flush()


def _timestamp_type(pfile: pq.ParquetFile) -> pa.DataType | None:
    """The type of the file's ``timestamp`` column, None without one."""
    schema = pfile.schema_arrow
    return schema.field("timestamp").type if "timestamp" in schema.names else None


def _epoch_ms(ticks: int, unit: str) -> int:
    """TIMESTAMP ticks of ``unit`` as epoch ms, sub-millisecond digits truncated (floor: an
    instant before the epoch stays negative; Arrow's own cast refuses to drop digits)."""
    return ticks * 1000 if unit == "s" else ticks // _TICKS_PER_MS[unit]


def _timestamp_ticks(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, str]:
    """A batch whose ``timestamp`` column is a TIMESTAMP, with that column as its int64 ticks,
    and the ticks' unit."""
    idx = batch.schema.get_field_index("timestamp")
    unit = batch.schema.field(idx).type.unit
    return batch.set_column(idx, "timestamp", batch.column(idx).cast(pa.int64())), unit


def _parquet_row_text(row: dict[str, Any], unit: str | None) -> str:
    """A row's ``raw`` text; ``row`` (from a ``_timestamp_ticks`` batch when ``unit``) gets its
    timestamp as epoch ms (``_epoch_ms``)."""
    ticks = row.get("timestamp")
    if unit is not None and ticks is not None:
        row["timestamp"] = _epoch_ms(ticks, unit)
    return _parquet_cell_json(row)


_encode_string = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) uses


def _fast_parquet_ok(schema: pa.Schema, ts_type: pa.DataType | None) -> bool:
    """Columns whose cells ``_parquet_cell_json`` renders as plain JSON strings or integers,
    with distinct names (a row is a dict), and a timestamp column that is not a zone-less
    TIMESTAMP (those rows are all rejected by the general path)."""
    if schema.names == [] or len(set(schema.names)) != len(schema.names):
        return False
    if ts_type is not None and pa.types.is_timestamp(ts_type) and ts_type.tz is None:
        return False
    return all(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
               for t in schema.types)


def _fast_parquet_rows(out: _Batcher, first: int, batch: pa.RecordBatch, unit: str | None,
                       ts_type: pa.DataType | None) -> None:
    """Column-wise conversion: each row is rendered exactly as ``_parquet_cell_json`` would
    (json.dumps of a dict of strings and integers) and taken here when it is a plain record
    (non-empty string or integer key, integer timestamp in range, value text that orjson
    re-serialises to exactly itself with no backslash, which is then its compact form as in
    ``value_from_json_text``); any other row goes through ``_parse_parquet_row``."""
    names = batch.schema.names
    columns: list[list[Any]] = []
    rendered: list[list[str]] = []
    for name, column in zip(names, batch.columns, strict=True):
        cells = column.to_pylist()
        if name == "timestamp" and unit is not None:
            cells = [None if t is None else _epoch_ms(t, unit) for t in cells]
        columns.append(cells)
        if pa.types.is_integer(column.type):
            rendered.append(["null" if v is None else int.__repr__(v) for v in cells])
        else:
            rendered.append(["null" if v is None else _encode_string(v) for v in cells])
    template = "{{" + ", ".join(_encode_string(n).replace("{", "{{").replace("}", "}}") + ": {}"
                                for n in names) + "}}"
    raws = list(map(template.format, *rendered))
    n = batch.num_rows
    missing: list[Any] = [None] * n
    by_name = dict(zip(names, columns, strict=True))
    keys = by_name.get("key", missing)
    values = by_name.get("value", missing)
    stamps = by_name.get("timestamp", missing)
    parts = by_name.get("partition", missing)
    offsets = by_name.get("offset", missing)
    limit = MAX_RECORD_BYTES // 4  # UTF-8 takes at most 4 bytes per character
    for i in range(n):
        raw = raws[i]
        key = keys[i]
        ts = stamps[i]
        value = values[i]
        part = parts[i]
        offset = offsets[i]
        # type checks first: a column may hold strings where integers are expected
        ok = len(raw) <= limit and type(ts) is int and 0 <= ts <= MAX_TIMESTAMP and (
            part is None or (type(part) is int and 0 <= part <= MAX_INT64)) and (
            offset is None or (type(offset) is int and 0 <= offset <= MAX_INT64))
        if ok and type(key) is str:
            ok = key != ""
        elif ok and type(key) is int:
            key = str(key)
        else:
            ok = False
        if ok and value is not None:
            if type(value) is not str:
                ok = False
            else:
                try:
                    text = value.encode()
                    canonical = "\\" not in value and _dumps(_loads(text)) == text
                except (_JSONDecodeError, TypeError, UnicodeEncodeError):
                    canonical = False
                if not canonical:  # e.g. "1.50": the general rule for the value alone
                    try:
                        value = value_from_json_text(value)
                    except Reject:
                        ok = False
                    else:
                        out.record(first + i, key, None if value == "null" else value, ts, part, offset, raw)
                        continue
                elif value == "null":
                    value = None
        if ok:
            out.fast_row(first + i, key, value, ts, part, offset, raw)
        else:
            row = {name: cells[i] for name, cells in zip(names, columns, strict=True)}
            _parse_parquet_row(out, first + i, row, _parquet_cell_json(row), ts_type)


_TICKS_PER_MS = {"ms": 1, "us": 1000, "ns": 1_000_000}


def _parse_parquet_row(out: _Batcher, number: int, row: dict[str, Any], raw: str,
                       ts_type: pa.DataType | None) -> None:
    if _too_large(len(raw.encode("utf-8"))):
        out.reject(number, "too_large", "record is larger than 1 MiB", raw)
        return
    part = offset = None
    try:
        part = _parquet_int(row.get("partition"), "partition", "bad_partition")
        offset = _parquet_int(row.get("offset"), "offset", "bad_offset")
        key = row.get("key")
        if key is None or key == "":
            raise Reject("missing_field", "missing field 'key'")
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise Reject("bad_key", f"'key' must be a string or an integer, got {key!r}")
        key = str(key)
        ts = row.get("timestamp")
        if ts is None:
            raise Reject("missing_field", "missing field 'timestamp'")
        if isinstance(ts, bool) or not isinstance(ts, (int, str)):
            raise Reject("bad_timestamp", f"'timestamp' has unsupported value {ts!r}")
        if ts_type is not None and pa.types.is_timestamp(ts_type) and ts_type.tz is None:
            raise Reject("bad_timestamp", "the 'timestamp' column is a TIMESTAMP that is not "
                                          "UTC-adjusted (no time zone): its instant is unknown")
        if isinstance(ts, str):
            try:
                ts = parse_timestamp(ts)
            except TimestampError as exc:
                raise Reject("bad_timestamp", str(exc)) from None
        elif ts < 0 or ts > MAX_TIMESTAMP:
            raise Reject("bad_timestamp", f"timestamp {ts} is outside [0, 2^63-1]")
        value = row.get("value")
        if value is None:
            value_text = None
        elif isinstance(value, str):
            value_text = value_from_json_text(value)
            if value_text == "null":
                value_text = None
        else:
            try:
                value_text = compact(json.loads(_parquet_cell_json(value), parse_int=RawInt,
                                                parse_float=RawFloat, parse_constant=_no_constants))
            except (ValueError, RecursionError) as exc:
                raise Reject("bad_value", f"'value' is not representable as JSON: {exc}") from None
    except Reject as rej:
        out.reject(number, rej.reason, rej.detail, raw, part, offset)
        return
    out.record(number, key, value_text, ts, part, offset, raw)


def _parquet_int(value: Any, name: str, reason: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT64:
        return value
    raise Reject(reason, f"'{name}' must be a non-negative 64-bit integer, got {value!r}")


PARSERS = {"jsonl": parse_jsonl, "csv": parse_csv, "parquet": parse_parquet}


def format_of(path: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    return FORMAT_BY_EXTENSION.get(os.path.splitext(path)[1].lower(), "jsonl")


def parse_file(path: str, source: str, fmt: str, max_timestamp: int | None = None) -> Iterator[pa.RecordBatch]:
    """Parse one file. Content that is not a record is a rejection; a file that cannot be
    *read* (an OSError) raises: that fails the run, which commits nothing, so the file is not
    marked done and the next run reads it (``ingest.sources``).

    ``max_timestamp``: records stamped later are rejected ``bad_timestamp`` (the store's
    ``max_future`` guard, ``future_bound``), so they never reach stream time."""
    for batch in PARSERS[fmt](path, source):
        yield batch if max_timestamp is None else refuse_future(batch, max_timestamp)


def refuse_future(batch: pa.RecordBatch, max_timestamp: int) -> pa.RecordBatch:
    """``batch`` with every accepted record stamped after ``max_timestamp`` turned into a
    ``bad_timestamp`` rejection (a broker's ``log.message.timestamp.after.max.ms``, KIP-937: one
    record at 2^63-1 would otherwise pin stream time and make every later record late)."""
    ts = batch.column(PARSED_SCHEMA.get_field_index("ts"))
    reason = batch.column(PARSED_SCHEMA.get_field_index("reason"))
    later = pc.fill_null(pc.greater(ts, pa.scalar(max_timestamp, pa.int64())), False)  # rejected rows: null ts
    future = pc.and_(reason.is_null(), later)
    if not pc.any(future).as_py():
        return batch
    columns = {name: batch.column(i) for i, name in enumerate(PARSED_SCHEMA.names)}
    details = [None if not f else
               f"timestamp {t} ({format_timestamp(t)}) is later than {max_timestamp} "
               f"({format_timestamp(max_timestamp)}), the ingest's wall clock plus the store's max_future: "
               "such a record would pin stream time (pass --max-future none to accept it)"
               for f, t in zip(future.to_pylist(), ts.to_pylist(), strict=True)]
    columns["reason"] = pc.if_else(future, pa.scalar("bad_timestamp"), reason)
    columns["detail"] = pc.if_else(future, pa.array(details, pa.string()), columns["detail"])
    for name in ("key", "value", "ts"):
        columns[name] = pc.if_else(future, pa.scalar(None, columns[name].type), columns[name])
    return pa.RecordBatch.from_arrays(list(columns.values()), schema=PARSED_SCHEMA)


def raw_texts(path: str, fmt: str, positions: Sequence[int]) -> Iterator[tuple[int, str]]:
    """(position, ``raw`` text) of the *accepted-by-the-parser* records at ``positions``
    (ascending JSONL/CSV lines or Parquet rows of a file), in that order, one at a time.

    A run carries the original text only for the records the parser rejects
    (``ingest.order``); those rejected later (late, duplicate offsets, partition errors) get
    theirs from here, read again from the file with the parser's own line splitting, CSV
    reader and row rendering. Source files must not change while a run reads them; a position
    the file no longer has is an error (the run fails and commits nothing)."""
    i, n = 0, len(positions)
    if n and any(positions[k] >= positions[k + 1] for k in range(n - 1)):
        raise ValueError("positions must be strictly ascending")
    if fmt == "jsonl":
        with open(path, "rb") as handle:
            for number, line in _jsonl_lines(handle):
                if i == n:
                    break
                if number == positions[i]:  # such a record's line is valid UTF-8 (else it is malformed)
                    yield number, line.decode("utf-8").rstrip("\r\n")
                    i += 1
    elif fmt == "csv":
        for start, _row, raw in _csv_records(path):
            if i == n:
                break
            if start == positions[i]:
                yield start, raw
                i += 1
    elif n:
        pfile = pq.ParquetFile(path)
        ts_type = _timestamp_type(pfile)
        is_ts = ts_type is not None and pa.types.is_timestamp(ts_type)
        first = 0
        for batch in pfile.iter_batches(batch_size=BATCH_ROWS):
            end = first + batch.num_rows
            if positions[i] < end:
                batch, unit = _timestamp_ticks(batch) if is_ts else (batch, None)
                while i < n and positions[i] < end:
                    yield positions[i], _parquet_row_text(batch.slice(positions[i] - first, 1).to_pylist()[0], unit)
                    i += 1
            if i == n:
                break
            first = end
    if i < n:
        raise ValueError(f"{path}: record at {positions[i]} is no longer in the file (was it changed during the run?)")


def parse_bytes_for_tests(text: str, fmt: str = "jsonl") -> pa.Table:
    """Parse in-memory text (used by unit tests of the parsing rules)."""
    import tempfile

    suffix = {"jsonl": ".jsonl", "csv": ".csv"}[fmt]
    with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False, encoding="utf-8") as tmp:
        tmp.write(text)
    try:
        return pa.Table.from_batches(list(parse_file(tmp.name, "t" + suffix, fmt)), schema=PARSED_SCHEMA)
    finally:
        os.unlink(tmp.name)

