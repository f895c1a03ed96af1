"""In-memory state of one table (a source store or a derived table) during a derived batch.

Only the keys the batch touches are held: they are loaded from the table's Delta snapshot
(bulk ``prefetch`` where the batch knows its keys up front, one key at a time otherwise) and
then updated record by record exactly as the store would be (docs/semantics.md, rules 1-5 and 12), so every
operator sees the table as it stands at that point of the merge order. For a derived table the
final versions of the touched keys are diffed against what was loaded to produce the rows the
derived store appends (``versiq.layout`` append layout).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from versiq import storage
from versiq.layout import STORE_SCHEMA, StoreState, bucket_of, horizon_sql, read_rule_sql, read_state

#: One version: (timestamp, value JSON text or None for a tombstone).
Version = tuple[int, str | None]


@dataclass(frozen=True)
class Change:
    """What applying a record to a table forwards downstream (docs/derived-tables.md)."""

    key: str
    new: str | None
    old: str | None
    timestamp: int
    in_order: bool


@dataclass(frozen=True)
class PutResult:
    change: Change | None  # None: rejected as late
    latest: bool = False
    replaced: bool = False


class SnapshotReader:
    """Reads the versions of chosen keys (read rule applied) from one Delta snapshot."""

    def __init__(self, path: str, version: int | None, kind: str, buckets: int,
                 retention_ms: int | None = None) -> None:
        self.path = path
        self.retention_ms = retention_ms
        self.version = version
        self.kind = kind
        self.buckets = buckets
        self.files: list[str] = []
        self.state = StoreState()
        if version is not None:
            self.files = list(storage.delta_table(path, version=version).file_uris())
            self.state = read_state(path, version)
        self._con: duckdb.DuckDBPyConnection | None = None

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            self._con = storage.duckdb_connect(self.path)
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def _observable(self) -> str:
        """Skip history that ended at or before its partition's horizon (versioned stores): no
        read can return it and no accepted record can touch it (it would be late), so the
        batch never needs it, and a key's load stays bounded by the retention, not its age."""
        if self.kind != "versioned" or not self.state.stream_time or self.retention_ms is None:
            return ""
        bound = horizon_sql(self.state.stream_time, self.retention_ms)
        return f" AND (valid_to IS NULL OR valid_to > COALESCE({bound}, valid_to - 1))"

    def load(self, keys: Iterable[str] | None) -> dict[str, tuple[list[Version], int]]:
        """key -> (versions ascending, partition) for ``keys`` (every key when None)."""
        if not self.files:
            return {}
        con = self._connection()
        rule = read_rule_sql(self.kind) + self._observable()
        if keys is None:
            sql = f"SELECT key, valid_from, value, tombstone, \"partition\" FROM read_parquet($files) {rule}"
            table = con.sql(sql, params={"files": self.files}).to_arrow_table()
        else:
            wanted = sorted(set(keys))
            if not wanted:
                return {}
            files = self.files
            if len(wanted) <= 8:  # a few keys: open only their buckets' files
                buckets = {f"bucket={bucket_of(k, self.buckets)}{os.sep}" for k in wanted}
                files = [f for f in self.files if any(b in f for b in buckets)]
                if not files:
                    return {}
            con.register("wanted_keys", pa.table({"key": pa.array(wanted, pa.string())}))
            sql = ("SELECT key, valid_from, value, tombstone, \"partition\" FROM read_parquet($files) "
                   f"WHERE key IN (SELECT key FROM wanted_keys) {rule}")
            table = con.sql(sql, params={"files": files}).to_arrow_table()
            con.unregister("wanted_keys")
        out: dict[str, tuple[list[Version], int]] = {}
        columns = [table.column(n).to_pylist() for n in ("key", "valid_from", "value", "tombstone", "partition")]
        for key, ts, value, tomb, part in zip(*columns, strict=True):
            entry = out.setdefault(key, ([], int(part or 0)))
            entry[0].append((int(ts), None if tomb else value))
        for versions, _ in out.values():
            versions.sort()
        return out


class TableState:
    """One table's state for the keys this batch touches, versioned or timestamped."""

    def __init__(self, name: str, kind: str, history_retention_ms: int, partitions: int,
                 reader: SnapshotReader | None) -> None:
        self.name = name
        self.kind = kind
        self.history_retention_ms = history_retention_ms
        self.partitions = partitions
        self.reader = reader
        self.stream_time: dict[int, int] = dict(reader.state.stream_time) if reader else {}
        self.versions: dict[str, list[Version]] = {}
        self.partition: dict[str, int] = {}
        self.loaded: dict[str, list[Version]] = {}  # as read from the snapshot (for the diff)
        self.touched: set[str] = set()
        self.fully_loaded = reader is None or not reader.files

    @property
    def versioned(self) -> bool:
        return self.kind == "versioned"

    # -- loading ----------------------------------------------------------------------------
    def prefetch(self, keys: Iterable[str] | None) -> None:
        """Load ``keys`` (all keys when None) that are not held yet."""
        if self.fully_loaded:
            return
        missing = None if keys is None else [k for k in set(keys) if k not in self.versions]
        if missing is not None and not missing:
            return
        assert self.reader is not None
        found = self.reader.load(missing)
        for key in (missing if missing is not None else list(found)):
            if key in self.versions:
                continue
            versions, part = found.get(key, ([], -1))
            self.versions[key] = list(versions)
            self.loaded[key] = list(versions)
            if part >= 0:
                self.partition[key] = part
        if keys is None:
            self.fully_loaded = True

    def _get(self, key: str) -> list[Version]:
        if key not in self.versions:
            if self.fully_loaded:
                self.versions[key] = []
                self.loaded[key] = []
            else:
                self.prefetch([key])
        return self.versions[key]

    def keys(self) -> list[str]:
        """Every key with versions (the whole table: loads it first)."""
        self.prefetch(None)
        return sorted(k for k, v in self.versions.items() if v)

    # -- writes -----------------------------------------------------------------------------
    def put(self, key: str, value: str | None, timestamp: int, partition: int = 0) -> PutResult:
        """Apply one record exactly as the store does; the change to forward (None: late)."""
        versions = self._get(key)
        self.partition.setdefault(key, partition)
        old_latest = versions[-1] if versions else None
        old_value = old_latest[1] if old_latest else None
        if not self.versioned:
            latest = old_latest is None or timestamp >= old_latest[0]
            self.versions[key] = [(timestamp, value)]
            self.touched.add(key)
            return PutResult(Change(key, value, old_value, timestamp, True), latest=latest,
                             replaced=old_latest is not None and old_latest[0] == timestamp)
        p = self.partition[key]
        st = self.stream_time.get(p)
        if st is not None and timestamp < st - self.history_retention_ms:
            return PutResult(None)
        self.stream_time[p] = timestamp if st is None else max(st, timestamp)
        i = bisect.bisect_left(versions, timestamp, key=_timestamp)
        replaced = i < len(versions) and versions[i][0] == timestamp
        if replaced:
            versions[i] = (timestamp, value)
        else:
            versions.insert(i, (timestamp, value))
        self.touched.add(key)
        in_order = old_latest is None or timestamp >= old_latest[0]
        return PutResult(Change(key, value, old_value, timestamp, in_order), latest=in_order, replaced=replaced)

    # -- reads ------------------------------------------------------------------------------
    def latest(self, key: str) -> Version | None:
        """The key's newest version (a tombstone has value None), or None without versions."""
        versions = self._get(key)
        return versions[-1] if versions else None

    def latest_value(self, key: str) -> tuple[str, int] | None:
        """The key's current value and its timestamp; None when none or a tombstone."""
        newest = self.latest(key)
        if newest is None or newest[1] is None:
            return None
        return newest[1], newest[0]

    def as_of(self, key: str, t: int) -> tuple[str, int] | None:
        """docs/semantics.md rules 7-8 (a timestamped table answers its current value)."""
        versions = self._get(key)
        if not versions:
            return None
        if not self.versioned:
            return self.latest_value(key)
        st = self.stream_time.get(self.partition.get(key, 0))
        if st is not None and t < st - self.history_retention_ms:
            newest_ts, newest_value = versions[-1]
            if newest_value is None or newest_ts > t:
                return None
            return newest_value, newest_ts
        i = bisect.bisect_right(versions, t, key=_timestamp) - 1
        if i < 0:
            return None
        found_ts, found_value = versions[i]
        return None if found_value is None else (found_value, found_ts)

    # -- the diff to write ------------------------------------------------------------------
    def changed_rows(self, run: int, buckets: int) -> pa.Table:
        """Store rows (``versiq.layout.STORE_SCHEMA``) for every version whose content changed."""
        cols: dict[str, list[object]] = {n: [] for n in ("bucket", "key", "valid_from", "valid_to", "value",
                                                          "tombstone", "partition", "run")}

        def add(key: str, ts: int, valid_to: int | None, value: str | None) -> None:
            for name, item in (("bucket", bucket_of(key, buckets)), ("key", key), ("valid_from", ts),
                               ("valid_to", valid_to), ("value", value), ("tombstone", value is None),
                               ("partition", self.partition.get(key, 0)), ("run", run)):
                cols[name].append(item)

        for key in sorted(self.touched):
            final = self.versions[key]
            if not self.versioned:
                if final != self.loaded.get(key, []):
                    add(key, final[0][0], None, final[0][1])
                continue
            before = {ts: (valid_to, value) for ts, valid_to, value in versions_with_valid_to(self.loaded.get(key, []))}
            for ts, valid_to, value in versions_with_valid_to(final):
                if before.get(ts) != (valid_to, value):
                    add(key, ts, valid_to, value)
        return pa.table(cols, schema=STORE_SCHEMA)


def _timestamp(version: Version) -> int:
    return version[0]


def versions_with_valid_to(versions: list[Version]) -> list[tuple[int, int | None, str | None]]:
    """(valid_from, valid_to, value) for ascending versions."""
    return [(ts, versions[i + 1][0] if i + 1 < len(versions) else None, value)
            for i, (ts, value) in enumerate(versions)]

