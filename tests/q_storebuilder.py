"""Query-engine test helper (owned by the query tests): materialise a ``tests.reference``
``ReferenceStore`` as a layout-conforming versiq store (``versiq.layout``) with delta-rs.

Each :meth:`StoreBuilder.commit` is one ingest "run": it appends one complete row (tagged with
the run number) for every (key, valid_from) — or, for a timestamped store, every key — whose
content changed since the previous commit, exactly like the append design of the layout, so
readers must apply the max-``run`` read rule. The commit carries ``StoreState`` in its
commitInfo and the Delta transaction ``(versiq.ingest, run)``.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from versiq import layout

try:
    from tests.reference import InRecord, ReferenceStore
except ImportError:  # tests/ itself on sys.path (pytest's default rootdir-less import)
    from reference import InRecord, ReferenceStore  # type: ignore[no-redef]

Row = tuple[int | None, str | None, bool, int]  # valid_to, value, tombstone, partition


def materialise(ref: ReferenceStore) -> dict[tuple[str, int], Row]:
    """The resolved rows of a versioned reference store: (key, valid_from) -> row content."""
    out: dict[tuple[str, int], Row] = {}
    for key in ref.versions:
        p = ref.partition_of_key(key)
        for v in ref.all_versions(key):
            out[(key, v.timestamp)] = (v.valid_to, v.value, v.value is None, p)
    return out


def _ts_rows(ref: ReferenceStore) -> dict[str, tuple[int, str | None, int]]:
    return {k: (ts, val, ref.partition_of_key(k)) for k, (val, ts) in ref.current.items()}


class StoreBuilder:
    """Writes a store at ``warehouse/name`` from successive states of a ReferenceStore."""

    def __init__(
        self,
        warehouse: str,
        name: str,
        *,
        kind: str = "versioned",
        history_retention_ms: int = 86_400_000,
        partitions: int = 1,
        buckets: int = 4,
    ) -> None:
        self.path = os.path.join(warehouse, name)
        self.settings = layout.StoreSettings(kind, history_retention_ms, partitions, buckets)
        self.ref = ReferenceStore(kind, history_retention_ms, partitions)
        self.run_no = 0
        self._rows: dict[Any, Any] = {}
        #: ReferenceStore copy per Delta version written (snapshot -> model at that snapshot).
        self.at: dict[int, ReferenceStore] = {}
        self.version = -1

    # ------------------------------------------------------------------ driving the model
    def apply(self, records: list[tuple[str, str | None, int]] | list[InRecord]) -> int:
        """Run ``records`` ((key, value, ts) or InRecord) through the model, then commit."""
        recs = [
            r if isinstance(r, InRecord) else InRecord("in.jsonl", i, r[0], r[1], r[2])
            for i, r in enumerate(records)
        ]
        self.ref.run(recs)
        return self.commit()

    def commit(self, extra_rows: list[dict[str, Any]] | None = None) -> int:
        """Append the rows changed since the previous commit (plus ``extra_rows``) as run N."""
        self.run_no += 1
        run = self.run_no
        rows: list[dict[str, Any]] = []
        if self.settings.kind == "versioned":
            now: dict[Any, Any] = materialise(self.ref)
            for (key, vf), (vt, value, tomb, p) in sorted(now.items()):
                if self._rows.get((key, vf)) != (vt, value, tomb, p):
                    rows.append(self._row(key, vf, vt, value, tomb, p, run))
        else:
            now = _ts_rows(self.ref)
            for key, (ts, value, p) in sorted(now.items()):
                if self._rows.get(key) != (ts, value, p):
                    rows.append(self._row(key, ts, None, value, value is None, p, run))
        rows.extend(extra_rows or [])
        self._rows = now
        state = layout.StoreState(
            run=run, stream_time=dict(self.ref.stream_time), max_offset=dict(self.ref.max_offset)
        )
        self.version = write_rows(self.path, self.settings, rows, state, run)
        self.at[self.version] = copy.deepcopy(self.ref)
        return self.version

    def _row(
        self, key: str, vf: int, vt: int | None, value: str | None, tomb: bool, p: int, run: int
    ) -> dict[str, Any]:
        return {
            "bucket": layout.bucket_of(key, self.settings.buckets),
            "key": key,
            "valid_from": vf,
            "valid_to": vt,
            "value": value,
            "tombstone": tomb,
            "partition": p,
            "run": run,
        }


def write_rows(
    path: str,
    settings: layout.StoreSettings,
    rows: list[dict[str, Any]],
    state: layout.StoreState,
    run: int,
    *,
    description: str | None = None,
) -> int:
    """Append ``rows`` (STORE_SCHEMA dicts) as one commit carrying ``state``; returns the version."""
    rows = sorted(rows, key=lambda r: (r["bucket"], r["key"], r["valid_from"], r["run"]))
    table = pa.Table.from_pylist(rows, schema=layout.STORE_SCHEMA)
    exists = os.path.isdir(os.path.join(path, "_delta_log"))
    props = CommitProperties(
        custom_metadata={layout.STATE_KEY: state.to_json()},
        app_transactions=[Transaction(app_id=layout.APP_ID, version=run)],
    )
    write_deltalake(
        path,
        table,
        mode="append",
        partition_by=layout.STORE_PARTITION_COLUMNS,
        description=None if exists else (description or settings.to_description()),
        commit_properties=props,
    )
    return layout_version(path)


def layout_version(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).version()
