"""Collecting one file's records and rejections into Arrow batches of ``PARSED_SCHEMA``; every
accepted record passes here, so the rules that hold for every format whatever its path (the key
size limit, valid Unicode) are checked here once."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from versiq.ingest.records.fields import has_surrogate, safe_text
from versiq.ingest.records.schema import MAX_RECORD_BYTES, PARSED_SCHEMA
from versiq.layout import MAX_KEY_BYTES


class Batcher:
    def __init__(self, source: str) -> None:
        self.source = source
        self._reset()

    def _reset(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in PARSED_SCHEMA.names}
        (self._source, self._pos, self._key, self._value, self._ts, self._part, self._offset, self._reason,
         self._detail, self._raw) = (self.columns[name] for name in PARSED_SCHEMA.names)

    def record(self, pos: int, key: str, value: str | None, ts: int, part: int | None,
               offset: int | None, raw: str) -> None:
        if key_too_long(key):
            self.reject(pos, "bad_key", key_too_long_detail(key), raw, part, offset)
        elif has_surrogate(key):
            self.reject(pos, "bad_key", "'key' is not valid Unicode (lone surrogate)", raw, part, offset)
        elif value is not None and has_surrogate(value):
            self.reject(pos, "bad_value", "'value' is not valid Unicode (lone surrogate)", raw, part,
                        offset)
        else:
            self._row(pos, key, value, ts, part, offset, None, None, raw)

    def fast_row(self, pos: int, key: str, value: str | None, ts: int, part: int | None,
                 offset: int | None, raw: str) -> None:
        """A record already known to be valid UTF-8 throughout (no surrogates to check)."""
        if key_too_long(key):
            self.reject(pos, "bad_key", key_too_long_detail(key), raw, part, offset)
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
        c["detail"].append(safe_text(detail))
        c["raw"].append(safe_text(raw))

    def __len__(self) -> int:
        return len(self.columns["pos"])

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.columns, schema=PARSED_SCHEMA)
        self._reset()
        return batch


def key_too_long(key: str) -> bool:
    """Every format's accepted records pass the batcher, so the key limit is checked once here.
    A key of at most MAX_KEY_BYTES // 4 characters cannot exceed the limit (UTF-8 takes at most
    4 bytes per character): only longer keys are encoded to count."""
    return len(key) > MAX_KEY_BYTES // 4 and len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES


def key_too_long_detail(key: str) -> str:
    size = len(key.encode("utf-8", "surrogatepass"))
    return f"'key' is {size} bytes of UTF-8; the limit is {MAX_KEY_BYTES} bytes (4 KiB)"


def too_large(raw_bytes: int) -> bool:
    return raw_bytes > MAX_RECORD_BYTES


UTF8_BOM = b"\xef\xbb\xbf"

