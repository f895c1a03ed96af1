"""Point-in-time lookups: many ``(key, asOf)`` pairs answered from one snapshot,
each exactly as the single-key read (latest when ``asOf`` is null, else as of it) answers it.
This is a feature store's point-in-time-correct join: a training row stamped T sees the value
the store held at T, never a later one.

The pairs come as a table (``pairs_from_table``: an uploaded Arrow IPC stream or Parquet file
read by ``read_pairs`` within bounds checked before anything is decoded, or ``versiq lookup
--input``) or as JSON; the answers go out as an Arrow table
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
#: Bytes an uploaded table may decode to (the Arrow IPC stream: all of it; Parquet: its key
#: and asOf columns): twice the largest JSON body, far more than 100,000 keys of usual length.
#: A few KiB of compressed repetition can otherwise decode to gigabytes.
MAX_DECODED_BYTES = 64 * 1024 * 1024
#: Rows of a Parquet file decoded at once.
_PARQUET_BATCH_ROWS = 8192

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
    try:
        keys_column.validate(full=True)  # Arrow does not check UTF-8 when it reads a table
    except pa.ArrowInvalid as exc:
        raise LookupInputError(f"column 'key' is not valid UTF-8 strings: {exc}") from None
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
    """The pairs of an uploaded table: an Arrow IPC stream or a Parquet file. Its row count
    (at most ``MAX_LOOKUPS``) and decoded size (at most ``MAX_DECODED_BYTES``) are checked from
    its metadata before it is decoded, so a small compressed body cannot decode to gigabytes;
    the memory the decoding took is handed back to the allocator's pool afterwards."""
    try:
        if media_type == "application/vnd.apache.parquet":
            table = _parquet_table(data)
        else:
            table = _ipc_table(data)
        return pairs_from_table(table)
    except (pa.ArrowInvalid, OSError) as exc:
        raise LookupInputError(f"the body is not a readable {media_type} table: {exc}") from None
    finally:
        table = None
        pa.default_memory_pool().release_unused()


def _check_rows(rows: int) -> None:
    if rows > MAX_LOOKUPS:
        raise LookupInputError(f"{rows} pairs; at most {MAX_LOOKUPS} per lookup")


def _check_decoded(size: int, what: str) -> None:
    if size > MAX_DECODED_BYTES:
        raise LookupInputError(f"{what} would decode to {size} bytes or more; at most {MAX_DECODED_BYTES} per lookup")


def _pair_columns(schema: pa.Schema) -> list[str]:
    """The columns a lookup reads (``key``, ``asOf``/``as_of``), their types checked from the
    schema alone (a column of the wrong type is never decoded)."""
    if "key" not in schema.names:
        raise LookupInputError(f"the table needs a 'key' column (it has {', '.join(schema.names) or 'none'})")
    key_type = schema.field("key").type
    if not (pa.types.is_string(key_type) or pa.types.is_large_string(key_type)):
        raise LookupInputError(f"column 'key' must be strings, not {key_type}")
    columns = ["key"]
    for name in ("asOf", "as_of"):
        if name in schema.names:
            kind = schema.field(name).type
            if not (pa.types.is_timestamp(kind) or pa.types.is_integer(kind) or pa.types.is_null(kind)):
                raise LookupInputError(f"column {name!r} must hold epoch milliseconds (integers) or timestamps, "
                                       f"not {kind}")
            columns.append(name)
            break
    return columns


def _parquet_table(data: bytes) -> pa.Table:
    """The pair columns of a Parquet file: rows and page sizes checked from the footer, keys
    read dictionary-encoded and expanded only once their decoded size is known to fit."""
    footer = pq.ParquetFile(io.BytesIO(data))
    metadata = footer.metadata
    _check_rows(metadata.num_rows)
    schema = footer.schema_arrow
    columns = _pair_columns(schema)
    source = pq.ParquetFile(io.BytesIO(data), read_dictionary=["key"])
    pages = sum(group.column(i).total_uncompressed_size
                for group in (metadata.row_group(g) for g in range(metadata.num_row_groups))
                for i in range(group.num_columns) if group.column(i).path_in_schema in columns)
    _check_decoded(pages, "the key and asOf columns")
    batches: list[pa.RecordBatch] = []
    decoded = 0
    for batch in source.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=columns):
        keys = batch.column(0)
        if pa.types.is_dictionary(keys.type):
            lengths = pc.take(pc.binary_length(keys.dictionary), keys.indices)
            decoded += (pc.sum(lengths).as_py() or 0) + 8 * len(batch) * batch.num_columns
            _check_decoded(decoded, "the key and asOf columns")
            keys = keys.dictionary_decode()
            batch = pa.record_batch([keys, *batch.columns[1:]], names=batch.schema.names)
        else:
            decoded += batch.nbytes
            _check_decoded(decoded, "the key and asOf columns")
        batches.append(batch)
    if not batches:
        return pa.schema([schema.field(c) for c in columns]).empty_table()
    return pa.Table.from_batches(batches)


def _ipc_table(data: bytes) -> pa.Table:
    """An Arrow IPC stream, read once its messages' metadata show at most ``MAX_LOOKUPS`` rows
    and at most ``MAX_DECODED_BYTES`` of buffers once decompressed."""
    rows = decoded = 0
    for message in pa.ipc.MessageReader.open_stream(pa.BufferReader(data)):
        if message.type not in ("record batch", "dictionary"):
            continue
        batch_rows, size = _batch_extent(bytes(message.metadata), message.body)
        if message.type == "record batch":
            rows += batch_rows
            _check_rows(rows)
        decoded += size
        _check_decoded(decoded, "the table")
    with pa.ipc.open_stream(data) as reader:
        return reader.read_all()


# Arrow IPC messages are flatbuffers (format/Message.fs, Schema.fs): a table starts with the
# signed offset back to its vtable, a vtable lists the offsets of the table's fields.
def _uint(buf: bytes, at: int, size: int, signed: bool = False) -> int:
    if at < 0 or at + size > len(buf):
        raise pa.ArrowInvalid("truncated IPC message metadata")
    return int.from_bytes(buf[at:at + size], "little", signed=signed)


def _field(buf: bytes, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` is, None when absent."""
    vtable = table - _uint(buf, table, 4, signed=True)
    slot = 4 + 2 * index
    if slot + 2 > _uint(buf, vtable, 2):
        return None
    offset = _uint(buf, vtable + slot, 2)
    return table + offset if offset else None


def _table_at(buf: bytes, field: int | None) -> int:
    if field is None:
        raise pa.ArrowInvalid("IPC message metadata without a record batch")
    return field + _uint(buf, field, 4)


def _batch_extent(metadata: bytes, body: pa.Buffer | None) -> tuple[int, int]:
    """The row count and decompressed buffer bytes of a record batch or dictionary message
    (``Message.header`` is field 2; a ``DictionaryBatch`` holds its ``RecordBatch`` in field 1;
    a ``RecordBatch`` has ``length`` (0), ``buffers`` (2) and ``compression`` (3), and each
    compressed buffer begins with its decompressed length, -1 when it was left uncompressed)."""
    header = _table_at(metadata, _field(metadata, _uint(metadata, 0, 4), 2))
    header_type = _field(metadata, _uint(metadata, 0, 4), 1)
    if header_type is not None and _uint(metadata, header_type, 1) == 2:  # DictionaryBatch
        header = _table_at(metadata, _field(metadata, header, 1))
    length_at = _field(metadata, header, 0)
    rows = 0 if length_at is None else _uint(metadata, length_at, 8, signed=True)
    buffers_at = _field(metadata, header, 2)
    compressed = _field(metadata, header, 3) is not None
    size = 0
    if buffers_at is not None:
        vector = buffers_at + _uint(metadata, buffers_at, 4)
        for i in range(_uint(metadata, vector, 4)):
            offset = _uint(metadata, vector + 4 + 16 * i, 8, signed=True)
            length = _uint(metadata, vector + 12 + 16 * i, 8, signed=True)
            if compressed and length >= 8:
                if body is None or offset < 0 or offset + 8 > body.size:
                    raise pa.ArrowInvalid("IPC buffer outside the message body")
                unpacked = _uint(body.slice(offset, 8).to_pybytes(), 0, 8, signed=True)
                size += length - 8 if unpacked == -1 else unpacked
            else:
                size += length
    return rows, size


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
