"""Parquet: ``key`` string or integer; ``timestamp`` int64 epoch ms, a UTC-adjusted TIMESTAMP or a
string of the timestamp grammar; a string ``value`` column holds JSON text. A column-wise fast
path takes plain rows; every other row goes through the general path; ``raw`` is the row
rendered as a JSON object."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from versiq.ingest.records.batch import Batcher, too_large
from versiq.ingest.records.fields import (
    MAX_INT64,
    Reject,
    value_from_json_text,
)
from versiq.ingest.records.jsonvalue import (
    RawFloat,
    RawInt,
    _no_constants,
    compact,
)
from versiq.ingest.records.schema import BATCH_ROWS, MAX_RECORD_BYTES
from versiq.timestamps import MAX_TIMESTAMP, TimestampError, parse_timestamp

# Bound once: the per-record hot loops avoid an attribute lookup.
_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError


def parquet_cell_json(value: Any) -> str:
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


def _os_refused(exc: Exception) -> bool:
    """The OS refused a read (an ``OSError`` with an errno: EIO, a vanished network file): the
    environment's error, which fails the run so the file is not marked done (``ingest.sources``).
    pyarrow reports corrupt Parquet content as ``OSError`` too, but without an errno: that is
    the file's content, one ``malformed`` rejection."""
    return isinstance(exc, OSError) and exc.errno is not None


def _parse_parquet_file(handle: Any, source: str, fast: bool) -> Iterator[pa.RecordBatch]:
    out = Batcher(source)
    try:
        pfile = pq.ParquetFile(handle)
    except Exception as exc:  # noqa: BLE001 - content that is not Parquet is one malformed record
        if _os_refused(exc):
            raise
        out.reject(0, "malformed", f"not a readable Parquet file: {exc}", "")
        yield out.flush()
        return
    ts_type = timestamp_type(pfile)
    is_ts = ts_type is not None and pa.types.is_timestamp(ts_type)
    row_number = 0
    batches = pfile.iter_batches(batch_size=BATCH_ROWS)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - unreadable rows end the file as one rejection
            if _os_refused(exc):
                raise
            out.reject(row_number, "malformed", f"cannot read Parquet rows from row {row_number} on: {exc}",
                       "")
            break
        batch, unit = timestamp_ticks(batch) if is_ts else (batch, None)
        try:
            # both paths convert the whole batch to Python before recording any row of it
            if fast and _fast_parquet_ok(batch.schema, ts_type):
                _fast_parquet_rows(out, row_number, batch, unit, ts_type)
            else:
                rows = batch.to_pylist()
                for i, row in enumerate(rows):
                    _parse_parquet_row(out, row_number + i, row, parquet_row_text(row, unit), ts_type)
        except UnicodeDecodeError as exc:
            # a string column holding bytes that are not UTF-8: each row of the batch is kept as
            # a rejection (never a crash that would fail every run of the store)
            for i in range(batch.num_rows):
                out.reject(row_number + i, "malformed",
                           f"Parquet rows {row_number}-{row_number + batch.num_rows - 1}: a string column "
                           f"holds bytes that are not valid UTF-8 ({exc})", "")
        row_number += batch.num_rows
        if len(out) >= BATCH_ROWS:
            yield out.flush()
    if len(out):
        yield out.flush()


def timestamp_type(pfile: pq.ParquetFile) -> pa.DataType | None:
    """The type of the file's ``timestamp`` column, None without one."""
    schema = pfile.schema_arrow
    return schema.field("timestamp").type if "timestamp" in schema.names else None


def epoch_ms(ticks: int, unit: str) -> int:
    """TIMESTAMP ticks of ``unit`` as epoch ms, sub-millisecond digits truncated (floor: an
    instant before the epoch stays negative; Arrow's own cast refuses to drop digits)."""
    return ticks * 1000 if unit == "s" else ticks // _TICKS_PER_MS[unit]


def timestamp_ticks(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, str]:
    """A batch whose ``timestamp`` column is a TIMESTAMP, with that column as its int64 ticks,
    and the ticks' unit."""
    idx = batch.schema.get_field_index("timestamp")
    unit = batch.schema.field(idx).type.unit
    return batch.set_column(idx, "timestamp", batch.column(idx).cast(pa.int64())), unit


def parquet_row_text(row: dict[str, Any], unit: str | None) -> str:
    """A row's ``raw`` text; ``row`` (from a ``timestamp_ticks`` batch when ``unit``) gets its
    timestamp as epoch ms (``epoch_ms``)."""
    ticks = row.get("timestamp")
    if unit is not None and ticks is not None:
        row["timestamp"] = epoch_ms(ticks, unit)
    return parquet_cell_json(row)


_encode_string = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) uses


def _fast_parquet_ok(schema: pa.Schema, ts_type: pa.DataType | None) -> bool:
    """Columns whose cells ``parquet_cell_json`` renders as plain JSON strings or integers,
    with distinct names (a row is a dict), and a timestamp column that is not a zone-less
    TIMESTAMP (those rows are all rejected by the general path)."""
    if schema.names == [] or len(set(schema.names)) != len(schema.names):
        return False
    if ts_type is not None and pa.types.is_timestamp(ts_type) and ts_type.tz is None:
        return False
    return all(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
               for t in schema.types)


def _fast_parquet_rows(out: Batcher, first: int, batch: pa.RecordBatch, unit: str | None,
                       ts_type: pa.DataType | None) -> None:
    """Column-wise conversion: each row is rendered exactly as ``parquet_cell_json`` would
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
            cells = [None if t is None else epoch_ms(t, unit) for t in cells]
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
            _parse_parquet_row(out, first + i, row, parquet_cell_json(row), ts_type)


_TICKS_PER_MS = {"ms": 1, "us": 1000, "ns": 1_000_000}


def _parse_parquet_row(out: Batcher, number: int, row: dict[str, Any], raw: str,
                       ts_type: pa.DataType | None) -> None:
    if too_large(len(raw.encode("utf-8"))):
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
                value_text = compact(json.loads(parquet_cell_json(value), parse_int=RawInt,
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

