"""Parsing one file whatever its format (the entry point Spark tasks call), the ``max_future``
guard, re-reading the text of records rejected after parsing, and in-memory parsing for tests."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from versiq import storage
from versiq.ingest.records.csv_rows import csv_records, parse_csv
from versiq.ingest.records.jsonl import jsonl_lines, parse_jsonl
from versiq.ingest.records.parquet_rows import parquet_row_text, parse_parquet, timestamp_ticks, timestamp_type
from versiq.ingest.records.schema import BATCH_ROWS, FORMAT_BY_EXTENSION, PARSED_SCHEMA
from versiq.timestamps import format_timestamp

PARSERS: dict[str, Callable[[str, str], Iterator[pa.RecordBatch]]] = {
    "jsonl": parse_jsonl, "csv": parse_csv, "parquet": parse_parquet}


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
    with storage.local_copy(path) as local:
        for batch in PARSERS[fmt](local, source):
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
    with storage.local_copy(path) as local:  # an S3 source is read from a local copy
        yield from _raw_texts(local, fmt, positions)


def _raw_texts(path: str, fmt: str, positions: Sequence[int]) -> Iterator[tuple[int, str]]:
    i, n = 0, len(positions)
    if n and any(positions[k] >= positions[k + 1] for k in range(n - 1)):
        raise ValueError("positions must be strictly ascending")
    if fmt == "jsonl":
        with open(path, "rb") as handle:
            for number, line in jsonl_lines(handle):
                if i == n:
                    break
                if number == positions[i]:  # such a record's line is valid UTF-8 (else it is malformed)
                    yield number, line.decode("utf-8").rstrip("\r\n")
                    i += 1
    elif fmt == "csv":
        for start, _row, raw in csv_records(path):
            if i == n:
                break
            if start == positions[i]:
                yield start, raw
                i += 1
    elif n:
        pfile = pq.ParquetFile(path)
        ts_type = timestamp_type(pfile)
        is_ts = ts_type is not None and pa.types.is_timestamp(ts_type)
        first = 0
        for batch in pfile.iter_batches(batch_size=BATCH_ROWS):
            end = first + batch.num_rows
            if positions[i] < end:
                batch, unit = timestamp_ticks(batch) if is_ts else (batch, None)
                while i < n and positions[i] < end:
                    yield positions[i], parquet_row_text(batch.slice(positions[i] - first, 1).to_pylist()[0], unit)
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

