"""Reading a store's ``_rejected`` table for ``versiq rejected`` (docs/contract.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow.compute as pc

from versiq import storage
from versiq.ingest.errors import UsageError
from versiq.ingest.store import existing_store_path, is_store, rejected_path
from versiq.layout import REJECT_REASONS, read_state


def iter_rejected(warehouse: str, store: str, reason: str | None = None) -> Iterator[dict[str, Any]]:
    """Rejected records ordered by (run, source, line/row), as the CLI prints them."""
    store_path = existing_store_path(warehouse, store)
    if reason is not None and reason not in REJECT_REASONS:
        raise UsageError(f"unknown reason {reason!r}; one of: {', '.join(REJECT_REASONS)}")
    path = rejected_path(store_path)
    if not is_store(path):
        return
    table = storage.delta_table(path).to_pyarrow_table()
    # rows of a run the store has not committed are an unfinished attempt (versiq.layout)
    committed = read_state(store_path, storage.delta_table(store_path).version()).run
    table = table.filter(pc.less_equal(table.column("run"), committed))
    if reason is not None:
        table = table.filter(pc.equal(table.column("reason"), reason))
    table = table.sort_by([("run", "ascending"), ("source", "ascending"), ("line", "ascending"),
                           ("row", "ascending")])
    for row in table.to_pylist():
        out: dict[str, Any] = {"reason": row["reason"], "source": row["source"]}
        if row["line"] is not None:
            out["line"] = row["line"]
        if row["row"] is not None:
            out["row"] = row["row"]
        if row["partition"] is not None:
            out["partition"] = row["partition"]
        if row["offset"] is not None:
            out["offset"] = row["offset"]
        out.update(raw=row["raw"], detail=row["detail"], run=row["run"], ingested_at=row["ingested_at"])
        yield out
