"""A store's rejected input records as a read (``GET /v1/stores/{store}/rejected``): the rows of
one snapshot (``versiq.rejected``: the runs it committed, in a stable order), filtered by reason
and paged by ordinal, with the counts per reason that the console's overview shows.

The rows of a committed run never change, so the table of a (store, run) is cached: paging
through a listing reads the ``_rejected`` table once, not once per page.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa

from versiq.query.api import InvalidQuery, RejectedPage
from versiq.rejected import UnknownReason, committed_rejected, counts_by_reason, record_dict, with_reason

#: How many (store, run) tables stay cached: a console pages through one or two stores at once.
CACHED_TABLES = 4


class RejectedTables:
    """The committed rejected rows of recently listed (store path, run) pairs."""

    def __init__(self, size: int = CACHED_TABLES) -> None:
        self._size = size
        self._tables: OrderedDict[tuple[str, int], tuple[pa.Table, dict[str, int]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store_path: str, run: int) -> tuple[pa.Table, dict[str, int]]:
        """The rows and the counts per reason of the runs ``<= run`` of the store at ``store_path``."""
        with self._lock:
            found = self._tables.get((store_path, run))
            if found is not None:
                self._tables.move_to_end((store_path, run))
                return found
        table = committed_rejected(store_path, run)
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
    return RejectedPage(records=[record_dict(row) for row in page.to_pylist()], snapshot=snapshot,
                        counts=counts, total=table.num_rows,
                        resume_after=end - 1 if end < table.num_rows else None)
