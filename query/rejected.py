"""A store's rejected input records as a read (``GET /v1/stores/{store}/rejected``): the rows of
one snapshot (``versiq.rejected``: the runs it committed, in a stable order), filtered by reason
and paged by ordinal, with the counts per reason that the console's overview shows.

The rows of a committed run never change, so the table of a (store, run) is cached: paging
through a listing reads the ``_rejected`` table once, not once per page.

A record's raw text is whatever the input held (a 10 MB line stays 10 MB), so a listing shows
the first ``RAW_PREVIEW_CHARS`` characters of it with its full length and whether it was cut,
and ``rejected_record`` gives one record whole. A record's ``id`` is its position in the
snapshot's listing without a filter: the rows of runs up to R never change once R is committed
and later runs sort after them, so the id names the same record in every later snapshot too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from versiq.query.api import InvalidQuery, RecordNotFound, RejectedPage
from versiq.rejected import UnknownReason, committed_rejected, counts_by_reason, record_dict, with_reason

#: How many (store, run) tables stay cached: a console pages through one or two stores at once.
CACHED_TABLES = 4
#: The characters of a record's raw text a listing shows (``rejected_record``: all of them).
RAW_PREVIEW_CHARS = 4096


class RejectedTables:
    """The committed rejected rows of recently listed (store path, run) pairs."""

    def __init__(self, size: int = CACHED_TABLES) -> None:
        self._size = size
        self._tables: OrderedDict[tuple[str, int], tuple[pa.Table, dict[str, int]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store_path: str, run: int) -> tuple[pa.Table, dict[str, int]]:
        """The rows (with their ``id``) and the counts per reason of the runs ``<= run`` of the
        store at ``store_path``."""
        with self._lock:
            found = self._tables.get((store_path, run))
            if found is not None:
                self._tables.move_to_end((store_path, run))
                return found
        table = committed_rejected(store_path, run)
        table = table.append_column("id", pa.array(range(table.num_rows), pa.int64()))
        entry = (table, counts_by_reason(table))
        with self._lock:
            self._tables[(store_path, run)] = entry
            while len(self._tables) > self._size:
                self._tables.popitem(last=False)
        return entry


def rejected_page(table: pa.Table, counts: dict[str, int], snapshot: int, reason: str | None,
                  resume_after: int | None, limit: int) -> RejectedPage:
    """Up to ``limit`` records of ``table`` with ``reason`` (None: any) after ordinal
    ``resume_after`` (None: from the first); ordinals count the filtered records from 0."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidQuery(f"invalid page size {limit!r}")
    try:
        table = with_reason(table, reason)
    except UnknownReason as exc:
        raise InvalidQuery(str(exc)) from None
    start = 0 if resume_after is None else resume_after + 1
    page = table.slice(start, limit)
    end = start + page.num_rows
    return RejectedPage(records=_records(page, RAW_PREVIEW_CHARS), snapshot=snapshot,
                        counts=counts, total=table.num_rows,
                        resume_after=end - 1 if end < table.num_rows else None)


def rejected_record(table: pa.Table, record_id: int) -> dict[str, Any]:
    """The record of ``table`` (``RejectedTables.get``) with ``id`` ``record_id``, its raw
    text whole; RecordNotFound when the snapshot has no such record."""
    if isinstance(record_id, bool) or not isinstance(record_id, int) or not 0 <= record_id < table.num_rows:
        raise RecordNotFound(f"no rejected record {record_id!r} (this snapshot has {table.num_rows}: ids "
                             f"0 to {table.num_rows - 1})" if table.num_rows else
                             f"no rejected record {record_id!r}: this snapshot has none")
    return _records(table.slice(record_id, 1), None)[0]


def _records(rows: pa.Table, preview_chars: int | None) -> list[dict[str, Any]]:
    """``rows`` as ``record_dict``s with their ``id``, ``raw_length`` (characters) and
    ``raw_truncated``; the raw text cut to ``preview_chars`` characters (None: whole) in Arrow,
    so a long text never becomes a Python string whole."""
    raw = rows.column("raw")
    lengths = pc.utf8_length(raw)
    if preview_chars is not None:
        rows = rows.set_column(rows.schema.get_field_index("raw"), "raw",
                               pc.utf8_slice_codeunits(raw, 0, preview_chars))
    out = []
    for row, length in zip(rows.to_pylist(), lengths.to_pylist(), strict=True):
        record = record_dict(row)
        record.update(id=row["id"], raw_length=length,
                      raw_truncated=preview_chars is not None and length is not None and length > preview_chars)
        out.append(record)
    return out
