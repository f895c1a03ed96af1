"""The parsed records of a run as Spark holds them (``RUN_SCHEMA``), made on the executor that
parsed them from ``ingest.records.PARSED_SCHEMA`` batches:

- ``seq`` replaces ``source`` and ``pos``: the record's place in the run's processing order
  when no offsets are involved, ``(file index << 40) | pos`` with files indexed in (source
  path) order. One BIGINT sorts and compares much faster than the (source, pos) pair it
  encodes, and a path string per record no longer travels through Spark.
- ``raw`` (the original text) is kept only for the records the parser rejects: a bulk load
  rejects few, and the text was about half the bytes of every record. The records rejected
  later get theirs back from the files (``ingest.records.raw_texts``).
- ``fst`` (file stream time): the largest timestamp of the valid records before this one in the
  *same file* and the same default stream-time partition (``layout.default_partition_of``),
  null when there is none. A file is parsed in order by one task, so this running maximum costs
  one pass here, where in Spark it needed a shuffle and a sort of every record. It is used only
  when every partition of the run is the default one and no record carries an offset (then
  processing order is (source, pos) and a record's stream time is this value combined with the
  earlier files' maxima, ``ingest.semantics``); otherwise it is ignored. A run parsed in the
  driver is decided there (``ingest.decisions_here``), which never reads it: null there.

Valid here means: accepted by the parser (``reason`` null). On the run shapes where ``fst`` is
used no later check can reject a record before the grace check (no partitions to conflict, no
offsets to repeat), so the parser's verdict is the one that counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from versiq.ingest.records import PARSED_SCHEMA
from versiq.layout import Partitioning

POS_BITS = 40
MAX_POS = (1 << POS_BITS) - 1
#: Files one run can take: ``seq`` is a signed BIGINT.
MAX_FILES = 1 << (63 - POS_BITS)

_KEPT = ["key", "value", "ts", "part", "offset", "reason", "detail", "raw"]
RUN_SCHEMA = pa.schema([pa.field("seq", pa.int64()), *(PARSED_SCHEMA.field(name) for name in _KEPT),
                        pa.field("fst", pa.int64())])


def file_seq_base(file_index: int) -> int:
    return file_index << POS_BITS


def split_seq(seq: Any) -> tuple[Any, Any]:
    """(file index, pos) of a ``seq`` (an int or a numpy array of them)."""
    return seq >> POS_BITS, seq & MAX_POS


def with_order(batches: Iterator[pa.RecordBatch], file_index: int,
               partitioning: Partitioning | None) -> Iterator[pa.RecordBatch]:
    """``batches`` of one file, in file order, extended with ``seq`` and ``fst`` (all null when
    ``partitioning`` is None: streams have no stream time)."""
    base = file_seq_base(file_index)
    running: dict[int, int] = {}  # partition -> max valid timestamp so far in this file
    for batch in batches:
        pos = batch.column(PARSED_SCHEMA.get_field_index("pos"))
        if len(pos) and pc.max(pos).as_py() > MAX_POS:
            raise ValueError(f"position beyond {MAX_POS} in one file")
        seq = pc.add(pos, pa.scalar(base, pa.int64()))
        fst = (pa.nulls(batch.num_rows, pa.int64()) if partitioning is None
               else _file_stream_time(batch, partitioning, running))
        columns = [batch.column(PARSED_SCHEMA.get_field_index(name)) for name in _KEPT[:-1]]
        yield pa.RecordBatch.from_arrays([seq, *columns, rejected_raw(batch), fst], schema=RUN_SCHEMA)


def rejected_raw(batch: pa.RecordBatch) -> pa.Array:
    """The ``raw`` column of a ``PARSED_SCHEMA`` batch with the text of its rejections only."""
    reason = batch.column(PARSED_SCHEMA.get_field_index("reason"))
    raw = batch.column(PARSED_SCHEMA.get_field_index("raw"))
    if reason.null_count == batch.num_rows:  # every record valid: no text to keep
        return pa.nulls(batch.num_rows, pa.string())
    if reason.null_count:
        return pc.if_else(reason.is_null(), pa.scalar(None, pa.string()), raw)
    return raw


def _file_stream_time(batch: pa.RecordBatch, partitioning: Partitioning, running: dict[int, int]) -> pa.Array:
    n = batch.num_rows
    valid = batch.column(PARSED_SCHEMA.get_field_index("reason")).is_null().to_numpy(zero_copy_only=False)
    ts = batch.column(PARSED_SCHEMA.get_field_index("ts")).fill_null(0).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(valid)
    out = np.zeros(n, dtype=np.int64)
    has = np.zeros(n, dtype=bool)
    if len(rows) == 0:
        return pa.array(out, mask=~has)
    if partitioning.count == 1:
        groups = [(0, rows)]
    else:
        parts = partitioning.of_keys(batch.column(PARSED_SCHEMA.get_field_index("key")).take(pa.array(rows)))
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        starts = np.flatnonzero(np.r_[True, sorted_parts[1:] != sorted_parts[:-1]])
        ends = np.r_[starts[1:], len(order)]
        groups = [(int(sorted_parts[a]), rows[order[a:b]]) for a, b in zip(starts, ends, strict=True)]
    for part, idx in groups:
        values = ts[idx]
        prefix = np.maximum.accumulate(values)
        before = np.empty_like(values)
        before[1:] = prefix[:-1]
        known = np.ones(len(idx), dtype=bool)
        carry = running.get(part)
        if carry is None:
            known[0] = False
            before[0] = 0
        else:
            before[0] = carry
            before[1:] = np.maximum(before[1:], carry)
        out[idx] = before
        has[idx] = known
        running[part] = int(prefix[-1]) if carry is None else max(carry, int(prefix[-1]))
    return pa.array(out, mask=~has)
