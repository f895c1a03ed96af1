"""JSON Lines: a fast path (orjson, for lines already in canonical compact form) and the strict
general path for anything unusual; both give the same outcome for every line."""

from __future__ import annotations

from collections.abc import Iterator
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import orjson
import pyarrow as pa

from versiq.ingest.records.batch import UTF8_BOM, Batcher, too_large
from versiq.ingest.records.fields import (
    MAX_INT64,
    Reject,
    key_from_json,
    optional_int,
    timestamp_from_json,
)
from versiq.ingest.records.jsonvalue import (
    _DECODER,
    compact,
    strict_loads,
)
from versiq.ingest.records.schema import BATCH_ROWS, MAX_RECORD_BYTES
from versiq.timestamps import MAX_TIMESTAMP, TimestampError, parse_timestamp

# Bound once: the per-record hot loops avoid an attribute lookup.
_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError


def jsonl_lines(handle: Any) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line bytes) of a binary file; a UTF-8 byte order mark at the very
    start of the file is not part of the first line (editors on Windows write one)."""
    for number, line_bytes in enumerate(handle, start=1):
        if number == 1 and line_bytes.startswith(UTF8_BOM):
            line_bytes = line_bytes[len(UTF8_BOM):]
        yield number, line_bytes


def parse_jsonl(path: str, source: str, fast: bool = True) -> Iterator[pa.RecordBatch]:
    """``fast``: try ``_fast_json_line`` on each line first (tests turn it off to compare)."""
    out = Batcher(source)
    with open(path, "rb") as handle:
        for number, line_bytes in jsonl_lines(handle):
            body = line_bytes.rstrip(b"\r\n")
            if not (fast and len(body) <= MAX_RECORD_BYTES and _fast_json_line(out, number, body)):
                _slow_jsonl_line(out, number, line_bytes)
            if len(out._pos) >= BATCH_ROWS:
                yield out.flush()
    if len(out):
        yield out.flush()


def _slow_jsonl_line(out: Batcher, number: int, line_bytes: bytes) -> None:
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
    if too_large(size):
        out.reject(number, "too_large", f"record is {size} bytes (limit 1 MiB)", raw)
    else:
        _parse_json_line(out, number, raw)




def _fast_json_line(out: Batcher, number: int, body: bytes) -> bool:
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


def compact_members(raw: str) -> dict[str, tuple[Any, str]] | None:
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


def _parse_json_line(out: Batcher, number: int, raw: str) -> None:
    fast = compact_members(raw)
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

