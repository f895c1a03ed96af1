"""Query-engine test helper (owned by the query tests): materialise a ``tests.support.reference``
``ReferenceStore`` as a layout-conforming versiq store (``versiq.layout``) with delta-rs.

Each :meth:`StoreBuilder.commit` is one ingest "run": it appends one complete row (tagged with
the run number) for every (key, valid_from) — or, for a timestamped store, every key — whose
content changed since the previous commit, exactly like the append design of the layout, so
readers must apply the max-``run`` read rule. The commit carries ``StoreState`` in its
commitInfo and the Delta transaction ``(versiq.ingest, run)``.

:class:`StreamBuilder` writes a stream table (``layout.STREAM_SCHEMA``, settings kind
``stream``) the same way: each :meth:`StreamBuilder.append` is one run appending its records
with ``seq`` 1, 2, ... in stream order. Derived tables' provenance (``StoreState.inputs`` /
``.sources``) can be given to any commit of either builder.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from tests.support.reference import InRecord, ReferenceStore
from versiq import layout

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
        partitioner: str = layout.DEFAULT_PARTITIONER,
    ) -> None:
        self.path = os.path.join(warehouse, name)
        self.settings = layout.StoreSettings(kind, history_retention_ms, partitions, buckets, partitioner=partitioner)
        self.ref = ReferenceStore(kind, history_retention_ms, partitions, partitioner)
        self.run_no = 0
        self._rows: dict[Any, Any] = {}
        #: ReferenceStore copy per Delta version written (snapshot -> model at that snapshot).
        self.at: dict[int, ReferenceStore] = {}
        self.version = -1

    # ------------------------------------------------------------------ driving the model
    def apply(
        self,
        records: list[tuple[str, str | None, int]] | list[InRecord],
        *,
        inputs: dict[str, int] | None = None,
        sources: dict[str, dict[str, int]] | None = None,
    ) -> int:
        """Run ``records`` ((key, value, ts) or InRecord) through the model, then commit."""
        recs = [
            r if isinstance(r, InRecord) else InRecord("in.jsonl", i, r[0], r[1], r[2])
            for i, r in enumerate(records)
        ]
        self.ref.run(recs)
        return self.commit(inputs=inputs, sources=sources)

    def commit(
        self,
        extra_rows: list[dict[str, Any]] | None = None,
        *,
        inputs: dict[str, int] | None = None,
        sources: dict[str, dict[str, int]] | None = None,
    ) -> int:
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
            run=run, stream_time=dict(self.ref.stream_time), max_offset=dict(self.ref.max_offset),
            inputs=dict(inputs or {}), sources={k: dict(v) for k, v in (sources or {}).items()},
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


@dataclass(frozen=True)
class StreamRow:
    """One record of a stream as written: its bucket and stream position (run, seq)."""

    key: str
    value: str | None
    timestamp: int
    run: int
    seq: int
    bucket: int


class StreamBuilder:
    """Writes a stream table at ``warehouse/name``; ``records`` holds every record written, in
    stream order, and ``at[v]`` the records of snapshot ``v``."""

    def __init__(self, warehouse: str, name: str, *, buckets: int = 4) -> None:
        self.path = os.path.join(warehouse, name)
        self.settings = layout.StoreSettings(layout.STREAM_KIND, 0, 1, buckets)
        self.run_no = 0
        self.records: list[StreamRow] = []
        self.at: dict[int, list[StreamRow]] = {}
        self.version = -1

    def append(
        self,
        records: list[tuple[str, str | None, int]],
        *,
        inputs: dict[str, int] | None = None,
        sources: dict[str, dict[str, int]] | None = None,
    ) -> int:
        """One run: append ``records`` (key, value JSON text or None, timestamp) in this order."""
        self.run_no += 1
        run = self.run_no
        new = [
            StreamRow(k, v, ts, run, seq, layout.bucket_of(k, self.settings.buckets))
            for seq, (k, v, ts) in enumerate(records, start=1)
        ]
        # Like ingest's stream writer: one file per bucket, rows sorted by (key, timestamp, run, seq).
        rows = [
            {"bucket": r.bucket, "key": r.key, "value": r.value, "timestamp": r.timestamp, "run": r.run,
             "seq": r.seq}
            for r in sorted(new, key=lambda r: (r.bucket, r.key, r.timestamp, r.run, r.seq))
        ]
        state = layout.StoreState(
            run=run, inputs=dict(inputs or {}), sources={k: dict(v) for k, v in (sources or {}).items()}
        )
        table = pa.Table.from_pylist(rows, schema=layout.STREAM_SCHEMA)
        exists = os.path.isdir(os.path.join(self.path, "_delta_log"))
        write_deltalake(
            self.path,
            table,
            mode="append",
            partition_by=layout.STORE_PARTITION_COLUMNS,
            description=None if exists else self.settings.to_description(),
            commit_properties=CommitProperties(
                custom_metadata={layout.STATE_KEY: state.to_json()},
                app_transactions=[Transaction(app_id=layout.APP_ID, version=run)],
            ),
        )
        self.records.extend(new)
        self.version = layout_version(self.path)
        self.at[self.version] = list(self.records)
        return self.version


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
