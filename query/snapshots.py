"""Older snapshots: what answers ``snapshot=V`` reads and page tokens pinned to a snapshot that is
no longer the current one, for stores and streams alike.

DuckDB reads the Parquet files of ``DeltaTable(path, version=V)`` — for a store, the key's bucket
only, pruned further with the add actions' min/max ``key`` statistics, with the read rule in SQL
(``QUALIFY row_number() ... ORDER BY run DESC``). The caller passes its DuckDB connection (one per
thread). One LRU cache keeps the file lists (and ``StoreState``) of the ``SNAPSHOT_CACHE_SIZE``
most recently used older snapshots of every store and stream.

Errors: a snapshot above the table's latest version is ``SnapshotNotFound``; one whose log or
files are gone (vacuumed) is ``SnapshotGone``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import duckdb
import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from versiq import layout, storage
from versiq.query import reads
from versiq.query.api import SnapshotGone, SnapshotNotFound
from versiq.query.files import arrow, latest_version_on_disk
from versiq.query.index import DataFile, KeyChunk, StoreView, files_by_bucket, resolve_sql
from versiq.query.index_files import key_runs, rows_from_table
from versiq.query.streams import StreamSnapshot, stream_files

SNAPSHOT_CACHE_SIZE = 8

T = TypeVar("T")


@dataclass(frozen=True)
class FilesSnapshot(StoreView):
    """An older (or not yet loaded) snapshot: file lists per bucket, read with DuckDB per key."""

    path: str = ""
    files: dict[int, list[DataFile]] = field(default_factory=dict)

    def rows(self, con: duckdb.DuckDBPyConnection, key: str) -> reads.KeyRows | None:
        files = [
            f.path
            for f in self.files.get(layout.bucket_of(key, self.settings.buckets), [])
            if f.may_contain(key)
        ]
        if not files:
            return None
        try:
            tbl = arrow(con, resolve_sql(self.settings.kind, "one"), {"files": files, "key": key})
        except duckdb.IOException as exc:
            raise SnapshotGone(f"snapshot {self.snapshot} of store {self.name!r} is gone: "
                               f"{storage.error_line(exc)}") from exc
        if tbl.num_rows == 0:
            return None
        vf, vt, tomb, values, part = rows_from_table(tbl)
        return reads.KeyRows(vf, vt, tomb, values, 0, tbl.num_rows, int(part[0]))

    def segments(self, con: duckdb.DuckDBPyConnection, keys: list[str]) -> list[tuple[np.ndarray, reads.KeySegments]]:
        """A group per bucket: one DuckDB query for all of the bucket's keys (files pruned by
        their key statistics), not one per key."""
        of_bucket = np.array([layout.bucket_of(key, self.settings.buckets) for key in keys], dtype=np.int64)
        groups = []
        for b in np.unique(of_bucket).tolist():
            positions = np.flatnonzero(of_bucket == b)
            wanted = [keys[p] for p in positions]
            files = [f.path for f in self.files.get(b, []) if any(f.may_contain(key) for key in wanted)]
            if not files:
                groups.append((positions, reads.KeySegments.absent(len(positions))))
                continue
            try:
                tbl = arrow(con, resolve_sql(self.settings.kind, "many"), {"files": files, "keys": wanted})
            except duckdb.IOException as exc:
                raise SnapshotGone(f"snapshot {self.snapshot} of store {self.name!r} is gone: "
                                   f"{storage.error_line(exc)}") from exc
            vf, vt, tomb, values, part = rows_from_table(tbl)
            column = tbl.column("key").combine_chunks()
            starts, ends = key_runs(column)
            run_of = {key: i for i, key in enumerate(column.take(pa.array(starts)).to_pylist())}
            at = np.array([run_of.get(key, -1) for key in wanted], dtype=np.int64)
            found = at >= 0
            pick = np.where(found, at, 0)
            start = np.where(found, starts[pick], 0) if len(starts) else np.zeros(len(wanted), dtype=np.int64)
            end = np.where(found, ends[pick], 0) if len(starts) else np.zeros(len(wanted), dtype=np.int64)
            partition = part[np.minimum(start, max(0, len(part) - 1))].astype(np.int64) if len(part) else start
            groups.append((positions, reads.KeySegments(vf, vt, tomb, values, start, end, partition)))
        return groups

    def key_chunks(self, con: duckdb.DuckDBPyConnection, lo: str | None, hi: str | None, after: str | None,
                   want: int) -> list[KeyChunk]:
        """One chunk from one DuckDB query over every file of the snapshot: the first ``want``
        keys of the range (``ORDER BY key``: byte order), then their resolved rows."""
        files = [f.path for fs in self.files.values() for f in fs
                 if hi is None or f.min_key is None or f.min_key < hi]
        if not files:
            return []
        bounds, params = [], {"files": files, "limit": want}
        for name, op, value in (("lo", ">=", lo), ("hi", "<", hi), ("after", ">", after)):
            if value is not None:
                bounds.append(f"key {op} ${name}")
                params[name] = value
        where = " AND ".join(bounds) or "true"
        source = "read_parquet($files, hive_partitioning = false)"
        sql = (
            "SELECT key, valid_from, valid_to, value, tombstone, \"partition\" "
            f"FROM {source} WHERE key IN (SELECT DISTINCT key FROM {source} WHERE {where} "
            "ORDER BY key LIMIT $limit) "
            f"{layout.read_rule_sql(self.settings.kind)} ORDER BY key, valid_from"
        )
        try:
            tbl = arrow(con, sql, params)
        except duckdb.IOException as exc:
            raise SnapshotGone(f"snapshot {self.snapshot} of store {self.name!r} is gone: "
                               f"{storage.error_line(exc)}") from exc
        if tbl.num_rows == 0:
            return []
        vf, vt, tomb, values, part = rows_from_table(tbl)
        column = tbl.column("key").combine_chunks()
        starts, ends = key_runs(column)
        keys = column.take(pa.array(starts)).to_pylist()
        segments = reads.KeySegments(vf, vt, tomb, values, starts, ends, part[starts].astype(np.int64))
        return [KeyChunk(keys, segments, exhausted=len(keys) < want)]


class SnapshotCache:
    """The older snapshots opened lately, for stores and streams: one LRU of ``size`` entries
    keyed by (kind, name, snapshot); thread-safe."""

    def __init__(self, size: int = SNAPSHOT_CACHE_SIZE) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str, int], Any] = OrderedDict()

    def get(self, kind: str, name: str, path: str, newest_known: int, snapshot: int,
            open_snapshot: Callable[[DeltaTable], T]) -> T:
        """Snapshot ``snapshot`` of the ``kind`` table ``name`` at ``path``, opened with
        ``open_snapshot(DeltaTable at that version)`` unless cached. ``newest_known`` is the
        newest version the caller has seen (the log on disk may be newer)."""
        if isinstance(snapshot, bool) or not isinstance(snapshot, int) or snapshot < 0:
            raise SnapshotNotFound(f"invalid snapshot {snapshot!r}")
        key = (kind, name, snapshot)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                return cached  # type: ignore[no-any-return]
        latest = max(latest_version_on_disk(path), newest_known)
        if snapshot > latest:
            raise SnapshotNotFound(f"{kind} {name!r} has no snapshot {snapshot} (latest is {latest})")
        try:
            view = open_snapshot(storage.delta_table(path, version=snapshot))
        except Exception as exc:
            raise SnapshotGone(f"snapshot {snapshot} of {kind} {name!r} is no longer readable: "
                               f"{storage.error_line(exc)}") from exc
        with self._lock:
            self._entries[key] = view
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return view

    def retain(self, names: set[str]) -> None:
        """Forget the snapshots of tables that are no longer in the warehouse."""
        with self._lock:
            for key in [k for k in self._entries if k[1] not in names]:
                del self._entries[key]


def store_snapshot(name: str, path: str, settings: layout.StoreSettings, snapshot: int,
                   dt: DeltaTable) -> FilesSnapshot:
    """An older snapshot of a store: its file lists per bucket and its state."""
    files = files_by_bucket(dt, path)
    return FilesSnapshot(
        name=name,
        snapshot=snapshot,
        settings=settings,
        state=layout.read_state(path, snapshot),
        file_count=sum(len(v) for v in files.values()),
        physical_rows=sum(f.num_records for v in files.values() for f in v),
        path=path,
        files=files,
    )


def stream_snapshot(name: str, path: str, settings: layout.StoreSettings, snapshot: int,
                    dt: DeltaTable) -> StreamSnapshot:
    """An older snapshot of a stream: its file list and state."""
    return StreamSnapshot(name=name, snapshot=snapshot, settings=settings,
                          state=layout.read_state(path, snapshot), files=stream_files(dt, path))
