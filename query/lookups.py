"""Point-in-time lookups (issue 16 item 3): many ``(key, asOf)`` pairs answered from one snapshot,
each exactly as the single-key read (latest when ``asOf`` is null, else as of it) answers it.
This is a feature store's point-in-time-correct join: a training row stamped T sees the value
the store held at T, never a later one.

The pairs come as a table (``pairs_from_table``: an uploaded Arrow IPC stream or Parquet file,
or ``versiq lookup --input``) or as JSON; the answers go out as an Arrow table
(``answers_table``, also written as Parquet) with one row per pair, in input order. The HTTP
JSON and NDJSON shapes are ``service.render``'s.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from versiq import layout
from versiq.query.api import KeyResult

#: At most this many pairs per request or CLI input table (one snapshot answers them all).
MAX_LOOKUPS = 100_000

#: The answer table: the pair, then what the single-key read says. ``outcome`` is ``ok``,
#: ``not-found`` or ``expired``; ``value`` is the record's JSON text; ``deleted_at`` the tombstone
#: behind a not-found, when there is one.
ANSWER_SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("as_of", pa.int64()),
    pa.field("outcome", pa.string(), nullable=False),
    pa.field("value", pa.string()),
    pa.field("timestamp", pa.int64()),
    pa.field("valid_to", pa.int64()),
    pa.field("deleted_at", pa.int64()),
])


class LookupInputError(ValueError):
    """The pairs cannot be read (the message names the column or row)."""


def _as_of_column(table: pa.Table) -> pa.ChunkedArray | None:
    for name in ("asOf", "as_of"):
        if name in table.column_names:
            column = table.column(name)
            if pa.types.is_timestamp(column.type):
                return pc.cast(column, pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
            if pa.types.is_integer(column.type):
                return column.cast(pa.int64())
            if pa.types.is_null(column.type):
                return pa.chunked_array([pa.nulls(len(table), pa.int64())])
            raise LookupInputError(f"column {name!r} must hold epoch milliseconds (integers) or timestamps, "
                                   f"not {column.type}")
    return None


def pairs_from_table(table: pa.Table) -> list[tuple[str, int | None]]:
    """``(key, asOf)`` of every row: a string column ``key`` and an optional ``asOf`` (or
    ``as_of``) of epoch ms or timestamps (null = latest)."""
    if "key" not in table.column_names:
        raise LookupInputError(f"the table needs a 'key' column (it has {', '.join(table.column_names) or 'none'})")
    keys_column = table.column("key")
    if not (pa.types.is_string(keys_column.type) or pa.types.is_large_string(keys_column.type)):
        raise LookupInputError(f"column 'key' must be strings, not {keys_column.type}")
    if table.num_rows > MAX_LOOKUPS:
        raise LookupInputError(f"{table.num_rows} pairs; at most {MAX_LOOKUPS} per lookup")
    keys = keys_column.to_pylist()
    as_of_column = _as_of_column(table)
    as_ofs = as_of_column.to_pylist() if as_of_column is not None else [None] * len(keys)
    for i, (key, as_of) in enumerate(zip(keys, as_ofs, strict=True)):
        if not key:
            raise LookupInputError(f"row {i}: the key is empty or null")
        if len(key.encode("utf-8")) > layout.MAX_KEY_BYTES:
            raise LookupInputError(f"row {i}: the key is longer than {layout.MAX_KEY_BYTES} bytes")
        if as_of is not None and as_of < 0:
            raise LookupInputError(f"row {i}: asOf {as_of} is before the epoch")
    return list(zip(keys, as_ofs, strict=True))


def read_pairs(data: bytes, media_type: str) -> list[tuple[str, int | None]]:
    """The pairs of an uploaded table: an Arrow IPC stream or a Parquet file."""
    try:
        if media_type == "application/vnd.apache.parquet":
            table = pq.read_table(io.BytesIO(data))
        else:
            with pa.ipc.open_stream(data) as reader:
                table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise LookupInputError(f"the body is not a readable {media_type} table: {exc}") from None
    return pairs_from_table(table)


def answers_table(pairs: list[tuple[str, int | None]], results: list[KeyResult], snapshot: int) -> pa.Table:
    """One row per pair, in order (``ANSWER_SCHEMA``); the snapshot is in the schema metadata."""
    found = [r.record if r.outcome == "ok" else None for r in results]
    columns: dict[str, list[Any]] = {
        "key": [k for k, _ in pairs],
        "as_of": [t for _, t in pairs],
        "outcome": [r.outcome for r in results],
        "value": [None if f is None else f.value for f in found],
        "timestamp": [None if f is None else f.timestamp for f in found],
        "valid_to": [None if f is None else f.valid_to for f in found],
        "deleted_at": [r.deleted_at for r in results],
    }
    table = pa.table(columns, schema=ANSWER_SCHEMA)
    return table.replace_schema_metadata({b"versiq.snapshot": str(snapshot).encode()})


def arrow_stream_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())
