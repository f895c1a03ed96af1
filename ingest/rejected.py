"""Reading a store's ``_rejected`` table for ``versiq rejected`` (docs/contract.md; the rows and
their order are ``versiq.rejected``'s, shared with the HTTP listing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow.compute as pc

from versiq import storage
from versiq.ingest.errors import UsageError
from versiq.ingest.store import existing_store_path
from versiq.layout import REJECT_REASONS, read_state
from versiq.rejected import committed_rejected, record_dict


def iter_rejected(warehouse: str, store: str, reason: str | None = None) -> Iterator[dict[str, Any]]:
    """Rejected records ordered by (run, source, line/row), as the CLI prints them."""
    store_path = existing_store_path(warehouse, store)
    if reason is not None and reason not in REJECT_REASONS:
        raise UsageError(f"unknown reason {reason!r}; one of: {', '.join(REJECT_REASONS)}")
    committed = read_state(store_path, storage.delta_table(store_path).version()).run
    table = committed_rejected(store_path, committed)
    if reason is not None:
        table = table.filter(pc.equal(table.column("reason"), reason))
    for row in table.to_pylist():
        yield record_dict(row)
