"""Reading a store's ``_rejected`` table for ``versiq rejected`` (docs/contract.md; the rows and
their order are ``versiq.rejected``'s, shared with the HTTP listing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from versiq import storage
from versiq.ingest.errors import UsageError
from versiq.ingest.store import existing_store_path
from versiq.layout import read_state
from versiq.rejected import UnknownReason, committed_rejected, record_dict, with_reason


def iter_rejected(warehouse: str, store: str, reason: str | None = None) -> Iterator[dict[str, Any]]:
    """Rejected records ordered by (run, source, line/row), as the CLI prints them."""
    store_path = existing_store_path(warehouse, store)
    committed = read_state(store_path, storage.delta_table(store_path).version()).run
    try:
        table = with_reason(committed_rejected(store_path, committed), reason)
    except UnknownReason as exc:
        raise UsageError(str(exc)) from None
    for row in table.to_pylist():
        yield record_dict(row)
