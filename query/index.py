"""The serving index of a store's current snapshot: what answers ``snapshot=None`` reads.

The index is one :class:`BucketIndex` per ``bucket`` (``versiq.layout``) holding the *resolved*
rows of that bucket (read rule applied: max ``run`` per (key, valid_from) / per key) sorted by
(key, valid_from) as columnar arrays, plus a crc32 probe table of its keys. The columns live in
memory-mapped local files (``query.index_files``, where the format is defined): every worker and
every replica on the host shares them through the OS page cache, a process's private memory does
not grow with the store, and a start with the files in place opens them instead of building. A
lookup is ``crc32`` for the bucket, a ``searchsorted`` over the bucket's key hashes and one over
the key's few versions: microseconds, no I/O once the pages are cached.

:func:`build_loaded` builds the index of a new snapshot, building **only the buckets whose set
of data files changed** (others are shared with the previous index, and across processes by the
files' digest); a bucket to which a commit only added files is **merged**: the resolved rows of
the added files are applied to the previous bucket's columns (``index_files.merged``) instead of
reading and sorting every file of the bucket again, so a small commit's refresh does not grow
with the store. The catalog swaps the store's reference atomically, so a reader never sees a
half-built index.

:class:`StoreView` is what every read path hands to ``query.reads``: this index, or an older
snapshot read from files (``query.snapshots``).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from versiq import layout
from versiq.query import index_files, reads
from versiq.query.files import arrow

log = logging.getLogger("versiq.query")


def resolve_sql(kind: str, keys: str | None) -> str:
    """The resolved rows (read rule applied) of ``$files``, sorted by (key, valid_from): of every
    key (``keys`` None), of ``$key`` (``"one"``) or of the keys of the list ``$keys`` (``"many"``)."""
    where = {None: "", "one": "WHERE key = $key ", "many": "WHERE key IN (SELECT unnest($keys)) "}[keys]
    return (
        "SELECT key, valid_from, valid_to, value, tombstone, \"partition\" "
        f"FROM read_parquet($files, hive_partitioning = false) {where}"
        f"{layout.read_rule_sql(kind)} ORDER BY key, valid_from"
    )



@dataclass(frozen=True)
class DataFile:
    path: str  # absolute local path
    min_key: str | None
    max_key: str | None
    num_records: int
    #: The file's smallest and greatest ``run`` (Delta's statistics; None when not recorded).
    min_run: int | None = None
    max_run: int | None = None

    def may_contain(self, key: str) -> bool:
        return layout.may_hold_key(key, self.min_key, self.max_key)


def files_by_bucket(dt: DeltaTable, table_path: str) -> dict[int, list[DataFile]]:
    """The data files of ``dt``'s snapshot per bucket (``layout.bucket_files``), each bucket's
    sorted by path, with the key and run statistics the index prunes and merges by."""
    stats = ("min.key", "max.key", "num_records", "min.run", "max.run")
    out = {bucket: [DataFile(f["file"], f["min.key"], f["max.key"], int(f["num_records"] or 0), f["min.run"],
                             f["max.run"]) for f in files]
           for bucket, files in layout.bucket_files(dt, table_path, stats).items()}
    for files in out.values():
        files.sort(key=lambda f: f.path)
    return out


#: A bucket whose new files hold more resolved rows than this share of its rows is built again
#: from all its files rather than merged (``BucketIndex.merge_or_build``): merging costs a copy of
#: the bucket plus work per added key, building a read and sort of every file.
MERGE_AT_MOST = 0.25


@dataclass(frozen=True)
class BucketIndex:
    """Resolved rows of one bucket of the current snapshot, sorted by (key, valid_from), from the
    memory-mapped files of ``query.index_files`` (shared by every process of the host)."""

    files: frozenset[str]
    data: index_files.BucketFiles
    physical_rows: int
    #: The greatest ``run`` of the bucket's files (None: a file without the statistic).
    max_run: int | None = None

    @staticmethod
    def _of(files: list[DataFile], data: index_files.BucketFiles) -> BucketIndex:
        runs = [f.max_run for f in files if f.max_run is not None]
        return BucketIndex(files=frozenset(f.path for f in files), data=data,
                           physical_rows=sum(f.num_records for f in files),
                           max_run=max(runs) if runs and len(runs) == len(files) else None)

    @staticmethod
    def open_or_build(con: duckdb.DuckDBPyConnection, kind: str, files: list[DataFile], bucket: int,
                      cache: str, prev: BucketIndex | None = None) -> BucketIndex:
        """The bucket of ``files``: opened from the cache, else built into it, by merging the rows
        of the files added since ``prev`` into it when that is what changed (``merge_from``),
        otherwise from every file."""
        paths = [f.path for f in files]
        directory = index_files.bucket_directory(cache, bucket, index_files.bucket_digest(kind, paths))
        def build() -> pa.Table | index_files.BucketTables:
            new_files = prev.merge_from(files) if prev is not None else None
            if prev is not None and new_files is not None:
                try:
                    added = arrow(con, resolve_sql(kind, None), {"files": [f.path for f in new_files]})
                    if added.num_rows <= MERGE_AT_MOST * max(1, prev.data.row_count):
                        return index_files.merged(prev.data, added, kind)
                except Exception as exc:  # noqa: BLE001 - the merge is an optimisation: build from the files
                    log.warning("bucket %d: merging %d new file(s) failed (%s): building it from its files",
                                bucket, len(new_files), exc)
            return arrow(con, resolve_sql(kind, None), {"files": paths})

        data, _built = index_files.open_or_build(directory, build)
        return BucketIndex._of(files, data)

    def merge_from(self, files: list[DataFile]) -> list[DataFile] | None:
        """The files of ``files`` that this bucket was not built from, when they can be merged
        into it (``index_files.merged``): every file of this bucket is still there (nothing was
        compacted or erased) and each added file's rows are of later runs than all of this
        bucket's (Delta's statistics say so). None otherwise."""
        paths = {f.path for f in files}
        if self.max_run is None or not self.files <= paths:
            return None
        added = [f for f in files if f.path not in self.files]
        if not added or any(f.min_run is None or f.min_run <= self.max_run for f in added):
            return None
        return added

    def rows(self, key: str) -> reads.KeyRows | None:
        return self.data.rows(key)


@dataclass(frozen=True)
class KeyChunk:
    """A run of a store's keys in ascending (UTF-8 byte) order with their resolved rows, from one
    source of a key listing (a bucket of the serving index, or a query over older files).
    ``exhausted``: no key of the listed range follows ``keys[-1]`` in that source."""

    keys: list[str]
    segments: reads.KeySegments
    exhausted: bool

    def upto(self, bound: str) -> KeyChunk:
        """The chunk's keys up to ``bound`` (inclusive)."""
        n = bisect.bisect_right(self.keys, bound)
        return KeyChunk(self.keys[:n], self.segments.head(n), self.exhausted and n == len(self.keys))


@dataclass(frozen=True)
class StoreView:
    """A readable snapshot of a store (current index or older files)."""

    name: str
    snapshot: int
    settings: layout.StoreSettings
    state: layout.StoreState
    file_count: int
    physical_rows: int

    def rows(self, con: duckdb.DuckDBPyConnection, key: str) -> reads.KeyRows | None:  # pragma: no cover
        raise NotImplementedError

    def segments(self, con: duckdb.DuckDBPyConnection, keys: list[str]) -> list[tuple[np.ndarray, reads.KeySegments]]:
        """The resolved rows of many keys, in groups: ``(positions in keys, their segments)``;
        every position is in exactly one group. By default a group per key (``rows``)."""
        return [(np.array([i], dtype=np.int64), reads.KeySegments.of(self.rows(con, key)))
                for i, key in enumerate(keys)]

    def key_chunks(self, con: duckdb.DuckDBPyConnection, lo: str | None, hi: str | None, after: str | None,
                   want: int) -> list[KeyChunk]:  # pragma: no cover
        """Keys in ``[lo, hi)`` and above ``after`` (None bounds: unbounded) with their resolved
        rows, from each source of the store: together at least the first ``want`` keys of the
        range, or all of them. Every key below the smallest last key of a chunk that is not
        ``exhausted`` is in some chunk (that is where a listing can trust the merge up to)."""
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        return {"files": self.file_count, "rows": self.physical_rows}


@dataclass(frozen=True)
class LoadedStore(StoreView):
    """The serving index of the current snapshot of one store (immutable; swapped whole)."""

    buckets: dict[int, BucketIndex] = field(default_factory=dict)

    def rows(self, con: duckdb.DuckDBPyConnection, key: str) -> reads.KeyRows | None:
        b = self.buckets.get(layout.bucket_of(key, self.settings.buckets))
        return None if b is None else b.rows(key)

    def segments(self, con: duckdb.DuckDBPyConnection, keys: list[str]) -> list[tuple[np.ndarray, reads.KeySegments]]:
        """A group per bucket: the keys' hashes (crc32, which also names the bucket) and probes
        computed for the whole group at once (``index_files.BucketFiles.find_many``)."""
        hashes = np.fromiter((index_files.key_hash(k) for k in keys), dtype=np.uint32, count=len(keys))
        of_bucket = hashes % np.uint32(self.settings.buckets)
        groups = []
        for b in np.unique(of_bucket).tolist():
            positions = np.flatnonzero(of_bucket == b)
            bucket = self.buckets.get(b)
            if bucket is None:  # no file in this bucket: none of its keys has rows
                groups.append((positions, reads.KeySegments.absent(len(positions))))
                continue
            ordinals = bucket.data.find_many([keys[p] for p in positions], hashes[positions])
            groups.append((positions, bucket.data.segments(ordinals)))
        return groups

    def key_chunks(self, con: duckdb.DuckDBPyConnection, lo: str | None, hi: str | None, after: str | None,
                   want: int) -> list[KeyChunk]:
        """A chunk per bucket, each entered by binary search: keys spread evenly over buckets
        (crc32), so a bucket's share of ``want`` with a margin makes one round enough almost
        always."""
        share = -(-want * 5 // (4 * max(1, len(self.buckets)))) + 16
        chunks = []
        for b in self.buckets.values():
            data = b.data
            first = 0 if lo is None else data.first_at_or_after(lo)
            if after is not None:
                first = max(first, data.first_at_or_after(after, strictly_after=True))
            end = data.key_count if hi is None else data.first_at_or_after(hi)
            stop = min(end, first + share)
            if stop > first:
                chunks.append(KeyChunk(data.keys_between(first, stop), data.segments_range(first, stop),
                                       exhausted=stop >= end))
        return chunks

    def counts(self) -> dict[str, int]:
        return {
            "files": self.file_count,
            "rows": self.physical_rows,
            "keys": sum(b.data.key_count for b in self.buckets.values()),
            "deletedKeys": sum(b.data.deleted_key_count for b in self.buckets.values()),
            "versions": sum(b.data.row_count for b in self.buckets.values()),
        }


def build_loaded(name: str, path: str, dt: DeltaTable, settings: layout.StoreSettings, prev: LoadedStore | None,
                 con: duckdb.DuckDBPyConnection, cache: str) -> LoadedStore:
    """The index of ``dt``'s snapshot, its buckets' files under ``cache`` (this store's folder of
    ``index_files.cache_dir``): buckets whose files did not change since ``prev`` are shared,
    the others opened from the cache or built into it (merged into ``prev``'s bucket when files
    were only added to it: the cost of a small commit does not grow with the bucket)."""
    version = dt.version()
    state = layout.read_state(path, version)
    files = files_by_bucket(dt, path)
    buckets: dict[int, BucketIndex] = {}
    for b, bfiles in files.items():
        old = prev.buckets.get(b) if prev is not None else None
        if old is not None and old.files == frozenset(f.path for f in bfiles):
            buckets[b] = old
        else:
            buckets[b] = BucketIndex.open_or_build(con, settings.kind, bfiles, b, cache, old)
    return LoadedStore(
        name=name,
        snapshot=version,
        settings=settings,
        state=state,
        file_count=sum(len(v) for v in files.values()),
        physical_rows=sum(f.num_records for v in files.values() for f in v),
        buckets=buckets,
    )
