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
files' digest); the catalog swaps the store's reference atomically, so a reader never sees a
half-built index.

:class:`StoreView` is what every read path hands to ``query.reads``: this index, or an older
snapshot read from files (``query.snapshots``).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from versiq import layout, storage
from versiq.query import index_files, reads
from versiq.query.files import arrow


def resolve_sql(kind: str, one_key: bool) -> str:
    where = "WHERE key = $key " if one_key else ""
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

    def may_contain(self, key: str) -> bool:
        return layout.may_hold_key(key, self.min_key, self.max_key)


def files_by_bucket(dt: DeltaTable, table_path: str) -> dict[int, list[DataFile]]:
    adds = pa.table(dt.get_add_actions(flatten=True))
    cols = adds.column_names
    paths = adds.column("path").to_pylist()
    buckets = adds.column("partition.bucket").to_pylist() if "partition.bucket" in cols else None
    mins = adds.column("min.key").to_pylist() if "min.key" in cols else [None] * len(paths)
    maxs = adds.column("max.key").to_pylist() if "max.key" in cols else [None] * len(paths)
    nrec = adds.column("num_records").to_pylist() if "num_records" in cols else [0] * len(paths)
    out: dict[int, list[DataFile]] = {}
    for i, p in enumerate(paths):
        if buckets is None or buckets[i] is None:
            raise ValueError("store table is not partitioned by 'bucket' (versiq layout)")
        out.setdefault(int(buckets[i]), []).append(
            DataFile(storage.data_file(table_path, p), mins[i], maxs[i], int(nrec[i] or 0))
        )
    for files in out.values():
        files.sort(key=lambda f: f.path)
    return out


@dataclass(frozen=True)
class BucketIndex:
    """Resolved rows of one bucket of the current snapshot, sorted by (key, valid_from), from the
    memory-mapped files of ``query.index_files`` (shared by every process of the host)."""

    files: frozenset[str]
    data: index_files.BucketFiles
    physical_rows: int

    @staticmethod
    def open_or_build(con: duckdb.DuckDBPyConnection, kind: str, files: list[DataFile], bucket: int,
                      cache: str) -> BucketIndex:
        paths = [f.path for f in files]
        directory = index_files.bucket_directory(cache, bucket, index_files.bucket_digest(kind, paths))
        data, _built = index_files.open_or_build(directory, lambda: arrow(con, resolve_sql(kind, False),
                                                                            {"files": paths}))
        return BucketIndex(files=frozenset(paths), data=data, physical_rows=sum(f.num_records for f in files))

    def rows(self, key: str) -> reads.KeyRows | None:
        return self.data.rows(key)


def _tagged(data: index_files.BucketFiles, ordinal: int,
            chunk: int) -> Iterator[tuple[str, int, index_files.BucketFiles]]:
    """The bucket's ``(key, ordinal)`` from ``ordinal`` on, each with the bucket's files."""
    for key, i in data.keys_from(ordinal, chunk):
        yield key, i, data


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

    def key_rows(self, con: duckdb.DuckDBPyConnection, lo: str | None, hi: str | None, after: str | None,
                 limit: int) -> list[tuple[str, reads.KeyRows]]:  # pragma: no cover
        """Up to ``limit`` keys in ``[lo, hi)`` and above ``after``, ascending (UTF-8 byte order),
        each with its resolved rows (None bounds: unbounded)."""
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        return {"files": self.file_count, "rows": self.physical_rows}


@dataclass(frozen=True)
class LoadedStore(StoreView):
    """The serving index of the current snapshot of one store (immutable; swapped whole)."""

    buckets: dict[int, BucketIndex] = field(default_factory=dict)
    loaded_at: float = 0.0

    def rows(self, con: duckdb.DuckDBPyConnection, key: str) -> reads.KeyRows | None:
        b = self.buckets.get(layout.bucket_of(key, self.settings.buckets))
        return None if b is None else b.rows(key)

    def key_rows(self, con: duckdb.DuckDBPyConnection, lo: str | None, hi: str | None, after: str | None,
                 limit: int) -> list[tuple[str, reads.KeyRows]]:
        """A merge of the buckets' sorted key columns, each entered by binary search; each key's
        rows are taken at the ordinal its column gives (no probe: a key lives in one bucket)."""
        chunk = max(16, min(1024, 2 * limit // max(1, len(self.buckets)) + 1))
        streams = []
        for b in self.buckets.values():
            i = 0 if lo is None else b.data.first_at_or_after(lo)
            if after is not None:
                i = max(i, b.data.first_at_or_after(after, strictly_after=True))
            streams.append(_tagged(b.data, i, chunk))
        out: list[tuple[str, reads.KeyRows]] = []
        for key, ordinal, data in heapq.merge(*streams, key=itemgetter(0)):
            if len(out) >= limit or (hi is not None and key >= hi):
                break
            out.append((key, data.rows_at(ordinal)))
        return out

    def counts(self) -> dict[str, int]:
        return {
            "files": self.file_count,
            "rows": self.physical_rows,
            "keys": sum(b.data.key_count for b in self.buckets.values()),
            "versions": sum(b.data.row_count for b in self.buckets.values()),
        }


def build_loaded(name: str, path: str, dt: DeltaTable, settings: layout.StoreSettings, prev: LoadedStore | None,
                 con: duckdb.DuckDBPyConnection, cache: str) -> LoadedStore:
    """The index of ``dt``'s snapshot, its buckets' files under ``cache`` (this store's folder of
    ``index_files.cache_dir``): buckets whose files did not change since ``prev`` are shared,
    the others opened from the cache or built into it."""
    version = dt.version()
    state = layout.read_state(path, version)
    files = files_by_bucket(dt, path)
    buckets: dict[int, BucketIndex] = {}
    for b, bfiles in files.items():
        old = prev.buckets.get(b) if prev is not None else None
        if old is not None and old.files == frozenset(f.path for f in bfiles):
            buckets[b] = old
        else:
            buckets[b] = BucketIndex.open_or_build(con, settings.kind, bfiles, b, cache)
    return LoadedStore(
        name=name,
        snapshot=version,
        settings=settings,
        state=state,
        file_count=sum(len(v) for v in files.values()),
        physical_rows=sum(f.num_records for v in files.values() for f in v),
        buckets=buckets,
        loaded_at=time.monotonic(),
    )
