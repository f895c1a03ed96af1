"""Reading a store's rejected input records (``_rejected``, ``versiq.layout``): one definition of
which rows a snapshot of the store has and in which order, for ``versiq rejected`` (ingest) and
``GET /v1/stores/{store}/rejected`` (query/service).

A snapshot of a store has the rejected rows of the runs it committed (``StoreState.run``): rows
of a later run are an unfinished attempt that its rerun replaces (``replaceWhere run >= R``), so
the rows of runs up to R never change once run R is committed, and a listing of one snapshot is
stable: the same rows in the same order on every read, which is what lets a page position be a
plain ordinal.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from versiq import storage
from versiq.layout import REJECT_REASONS, REJECTED_DIR, REJECTED_SCHEMA

#: The order rows are listed in: by run, then by where they were read (a file's line or a
#: table's row; a Kafka partition and offset). Every rejected record has one distinct place.
ORDER = ("run", "source", "line", "row", "partition", "offset")


def rejected_table_path(store_path: str) -> str:
    return storage.join(store_path, REJECTED_DIR)


def committed_rejected(store_path: str, committed_run: int) -> pa.Table:
    """The rejected rows of runs ``<= committed_run``, in ``ORDER`` (an empty table when the store
    has never rejected anything)."""
    path = rejected_table_path(store_path)
    if not storage.is_delta_table(path):
        return REJECTED_SCHEMA.empty_table()
    table = storage.delta_table(path).to_pyarrow_table()
    table = table.filter(pc.less_equal(table.column("run"), committed_run))
    return table.sort_by([(column, "ascending") for column in ORDER])


class UnknownReason(ValueError):
    """A reason filter that names no reason code; the message lists the codes."""


def with_reason(table: pa.Table, reason: str | None) -> pa.Table:
    """The rows of ``table`` rejected for ``reason`` (None: all of them); UnknownReason for a
    code that is not one of ``REJECT_REASONS``."""
    if reason is None:
        return table
    if reason not in REJECT_REASONS:
        raise UnknownReason(f"unknown reason {reason!r}; one of: {', '.join(REJECT_REASONS)}")
    return table.filter(pc.equal(table.column("reason"), reason))


def counts_by_reason(table: pa.Table) -> dict[str, int]:
    """How many rows of ``table`` each reason has (reasons with none left out)."""
    if table.num_rows == 0:
        return {}
    counts = table.group_by("reason").aggregate([("reason", "count")])
    return dict(sorted(zip(counts.column("reason").to_pylist(), counts.column("reason_count").to_pylist(),
                           strict=True)))


def record_dict(row: dict[str, Any]) -> dict[str, Any]:
    """One row as the CLI's JSON prints it: the place fields a record has, nothing null."""
    out: dict[str, Any] = {"reason": row["reason"], "source": row["source"]}
    for place in ("line", "row", "partition", "offset"):
        if row[place] is not None:
            out[place] = row[place]
    out.update(raw=row["raw"], detail=row["detail"], run=row["run"], ingested_at=row["ingested_at"])
    return out
