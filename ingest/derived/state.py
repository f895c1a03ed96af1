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
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import duckdb
import pyarrow as pa

from versiq import storage
from versiq.layout import (
    STORE_SCHEMA,
    StoreState,
    bucket_of,
    horizon_sql,
    newest_row_order,
    read_rule_sql,
    read_state,
)

#: One version: (timestamp, value JSON text or None for a tombstone).
Version = tuple[int, str | None]


class Change(NamedTuple):
    """What applying a record to a table forwards downstream (docs/derived-tables.md)."""

    key: str
    new: str | None
    old: str | None
    timestamp: int
    in_order: bool


class PutResult(NamedTuple):
    change: Change | None  # None: rejected as late
    latest: bool = False
    replaced: bool = False


#: A put rejected as late.
_LATE = PutResult(None)


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

    def _newest_sql(self, where: str) -> str:
        """Each key's newest row, as the read rule has it, found by one aggregate per key
        (``layout.newest_row_order``) rather than the rule's window over every row."""
        return ("SELECT key, v.valid_from AS valid_from, v.value AS value, v.tombstone AS tombstone, "
                "v.\"partition\" AS \"partition\" FROM (SELECT key, arg_max(struct_pack(valid_from, value, "
                f"tombstone, \"partition\"), {newest_row_order(self.kind)}) AS v FROM read_parquet($files) {where} "
                "GROUP BY key)")

    def load(self, keys: Iterable[str] | None, latest_only: bool = False) -> dict[str, tuple[list[Version], int]]:
        """key -> (versions ascending, partition) for ``keys`` (every key when None);
        ``latest_only``: each key's newest version alone (``TableState.latest_only``)."""
        if not self.files:
            return {}
        con = self._connection()
        files, where = self.files, ""
        if keys is not None:
            wanted = sorted(set(keys))
            if not wanted:
                return {}
            if len(wanted) <= 8:  # a few keys: open only their buckets' files
                buckets = {f"bucket={bucket_of(k, self.buckets)}{os.sep}" for k in wanted}
                files = [f for f in self.files if any(b in f for b in buckets)]
                if not files:
                    return {}
            con.register("wanted_keys", pa.table({"key": pa.array(wanted, pa.string())}))
            where = "WHERE key IN (SELECT key FROM wanted_keys)"
        sql = (self._newest_sql(where) if latest_only else
               "SELECT key, valid_from, value, tombstone, \"partition\" FROM read_parquet($files) "
               f"{where} {read_rule_sql(self.kind)}{self._observable()}")
        table = con.sql(sql, params={"files": files}).to_arrow_table()
        if keys is not None:
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
                 reader: SnapshotReader | None, latest_only: bool = False, home: int | None = None) -> None:
        """``latest_only``: hold each key's newest version alone, for a table no stream-table join
        reads as of a time: a source store the pass only reads, and an aggregate's own table (its
        results are stamped at or after the group's last one, rule 30, so its older versions
        cannot change and the diff needs none of them: a group updated millions of times loads
        one version, not its retention's). A record older than the key's newest is forwarded
        as an out-of-order change and not kept; such a table's rows cannot be written then
        (``changed_rows``).
        ``home``: the partition of the pass this state belongs to, when the table is one of its
        co-partitioned stores: a key the snapshot holds in another partition is that partition's
        (another task's, as in Kafka Streams), so here it has no versions."""
        self.latest_only = latest_only
        self.older_dropped = False  # a latest-only table was given a record older than a newest
        self.home = home
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
        self._versioned = kind == "versioned"

    @property
    def versioned(self) -> bool:
        return self._versioned

    # -- loading ----------------------------------------------------------------------------
    def prefetch(self, keys: Iterable[str] | None) -> None:
        """Load ``keys`` (all keys when None) that are not held yet."""
        if self.fully_loaded:
            return
        missing = None if keys is None else [k for k in set(keys) if k not in self.versions]
        if missing is not None and not missing:
            return
        assert self.reader is not None
        found = self.reader.load(missing, self.latest_only)
        for key in (missing if missing is not None else list(found)):
            if key in self.versions:
                continue
            versions, part = found.get(key, ([], -1))
            if self.home is not None and part >= 0 and part != self.home:
                versions, part = [], -1
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
        """Apply one record exactly as the store does; the change to forward (None: late).

        A key's versions are ascending by timestamp, one per timestamp: a record newer than the
        key's newest version is appended, one at the newest's timestamp replaces it, and only an
        older one is placed by binary search."""
        versions = self.versions.get(key)
        if versions is None:
            versions = self._get(key)
        p = self.partition.setdefault(key, partition)
        old_ts: int | None = None
        old_value: str | None = None
        if versions:
            old_ts, old_value = versions[-1]
        if not self._versioned:
            self.versions[key] = [(timestamp, value)]
            self.touched.add(key)
            return PutResult(Change(key, value, old_value, timestamp, True),
                             old_ts is None or timestamp >= old_ts, old_ts is not None and old_ts == timestamp)
        st = self.stream_time.get(p)
        if st is not None and timestamp < st - self.history_retention_ms:
            return _LATE
        if st is None or timestamp > st:
            self.stream_time[p] = timestamp
        if old_ts is None or timestamp > old_ts:
            versions.append((timestamp, value))
            replaced = False
            in_order = True
        elif timestamp == old_ts:
            versions[-1] = (timestamp, value)
            replaced = in_order = True
        else:
            if self.latest_only:  # forwarded, not placed: the history it would go in is not held
                self.older_dropped = True
                return PutResult(Change(key, value, old_value, timestamp, False))
            i = bisect.bisect_left(versions, timestamp, key=_timestamp)
            replaced = versions[i][0] == timestamp  # i < len(versions): the newest is later
            if replaced:
                versions[i] = (timestamp, value)
            else:
                versions.insert(i, (timestamp, value))
            in_order = False
        self.touched.add(key)
        return PutResult(Change(key, value, old_value, timestamp, in_order), in_order, replaced)

    # -- reads ------------------------------------------------------------------------------
    def latest(self, key: str) -> Version | None:
        """The key's newest version (a tombstone has value None), or None without versions."""
        versions = self.versions.get(key)
        if versions is None:
            versions = self._get(key)
        return versions[-1] if versions else None

    def latest_value(self, key: str) -> tuple[str, int] | None:
        """The key's current value and its timestamp; None when none or a tombstone."""
        versions = self.versions.get(key)
        if versions is None:
            versions = self._get(key)
        if versions:
            ts, value = versions[-1]
            if value is not None:
                return value, ts
        return None

    def as_of(self, key: str, t: int) -> tuple[str, int] | None:
        """docs/semantics.md rules 7-8 (a timestamped table answers its current value)."""
        assert not self.latest_only, f"{self.name} holds its keys' newest versions only"
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
    def changed_rows(self, run: int, buckets: int, keys_per_part: int) -> Iterator[pa.Table]:
        """Store rows (``versiq.layout.STORE_SCHEMA``) for every version whose content changed,
        in key order, a table for each ``keys_per_part`` touched keys: the rows of a partition
        that touched millions of keys are built a part at a time, not as one list each."""
        assert not self.older_dropped, f"{self.name}: a version older than a key's newest, not held"
        touched = sorted(self.touched)
        for start in range(0, len(touched), keys_per_part):
            rows = self._rows(touched[start:start + keys_per_part], run, buckets)
            if rows.num_rows:
                yield rows

    def _rows(self, touched: list[str], run: int, buckets: int) -> pa.Table:
        keys: list[str] = []
        valid_from: list[int] = []
        valid_to: list[int | None] = []
        values: list[str | None] = []
        spans: list[tuple[str, int]] = []  # (key, how many of its rows), in key order
        for key in touched:
            final = self.versions[key]
            start = len(keys)
            if not self._versioned:
                if final != self.loaded.get(key, []):
                    keys.append(key)
                    valid_from.append(final[0][0])
                    valid_to.append(None)
                    values.append(final[0][1])
            else:
                loaded = self.loaded.get(key)
                before = {ts: (to, value) for ts, to, value in versions_with_valid_to(loaded)} if loaded else None
                last = len(final) - 1
                for i, (ts, value) in enumerate(final):
                    to = final[i + 1][0] if i < last else None
                    if before is None or before.get(ts) != (to, value):
                        keys.append(key)
                        valid_from.append(ts)
                        valid_to.append(to)
                        values.append(value)
            if len(keys) > start:
                spans.append((key, len(keys) - start))
        bucket: list[int] = []
        partition: list[int] = []
        for key, n in spans:
            bucket += [bucket_of(key, buckets)] * n
            partition += [self.partition.get(key, 0)] * n
        return pa.table({
            "bucket": bucket, "key": keys, "valid_from": valid_from, "valid_to": valid_to, "value": values,
            "tombstone": [value is None for value in values], "partition": partition, "run": [run] * len(keys),
        }, schema=STORE_SCHEMA)


def _timestamp(version: Version) -> int:
    return version[0]


def versions_with_valid_to(versions: list[Version]) -> list[tuple[int, int | None, str | None]]:
    """(valid_from, valid_to, value) for ascending versions."""
    return [(ts, versions[i + 1][0] if i + 1 < len(versions) else None, value)
            for i, (ts, value) in enumerate(versions)]

