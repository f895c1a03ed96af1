"""The versiq read engine: VersionedKeyQuery / MultiVersionedKeyQuery over the stores of a warehouse,
and the records of its streams.

Usable as a library (no FastAPI)::

    engine = Engine("/path/to/warehouse")
    engine.start()                      # first load + background refresh thread
    engine.get("prices", VersionedKeyQuery("k1", as_of=1_700_000_000_000))
    engine.versions("prices", MultiVersionedKeyQuery("k1"), limit=100)
    engine.close()

Read paths
==========
*Current snapshot* (``snapshot=None`` or the loaded version): an in-memory index per process,
built at refresh from the Delta snapshot and never touching DuckDB or files at request time.
The index is one :class:`_BucketIndex` per ``bucket`` (``versiq.layout``) holding the *resolved*
rows of that bucket (read rule applied: max ``run`` per (key, valid_from) / per key) sorted by
(key, valid_from) as columnar arrays — ``valid_from``/``valid_to`` int64 and ``tombstone``/
``partition`` numpy arrays, ``value`` an Arrow string array — plus a dict ``key -> ordinal`` and
an ``offsets`` array giving each key's row range. A lookup is ``crc32`` for the bucket, one dict
probe and a ``searchsorted`` over the key's few versions: a few microseconds, no I/O.

*Older snapshots* (``snapshot=V`` below or above the loaded one, and pages pinned to them):
DuckDB reads the Parquet files of ``DeltaTable(path, version=V)`` for the key's bucket only,
pruned further with the add actions' min/max ``key`` statistics, with the read rule in SQL
(``QUALIFY row_number() ... ORDER BY run DESC``). One DuckDB connection per thread. The file
lists (and ``StoreState``) of the 8 most recently used older snapshots are cached.

Both paths hand the key's resolved versions to ``query.reads``, which implements SEMANTICS.md
rules 6-11 and the retention edges once, so the paths cannot disagree. Expiry is judged with
the stream time of the snapshot that answers (``versiq.layout.read_state(path, V)``), for the
key's partition (its rows' ``partition`` column; ``default_partition_of`` for a key without rows).

Refresh
=======
``start()`` loads every store, then a daemon thread calls ``refresh()`` every
``refresh_interval_s``. A refresh pass discovers new stores (direct children of the warehouse
with a valid name, ``_delta_log/`` and a versiq settings description; an unknown format version
or kind is *refused* and reported by ``readiness()``, a Delta table without the versiq marker
is ignored), brings each store's ``DeltaTable`` up to date (``update_incremental``) and, when
its version moved, rebuilds **only the buckets whose set of data files changed** (others are
shared with the previous index), then swaps the store's snapshot reference atomically: a
reader never sees a half-built index. A failed refresh keeps serving the last good snapshot
and records the error (``readiness()["stores"][name]["error"]``).

Bound: a commit becomes visible to ``snapshot=None`` reads at most
``refresh_interval_s + build time of the changed buckets`` after it lands (a full rebuild is
one DuckDB scan of the changed buckets: ~1 s per million physical rows here). ``?snapshot=V``
reads of a version newer than the loaded one are answered from files immediately.

Memory per worker (process): per resolved row 8 (valid_from) + 8 (valid_to) + 1 (tombstone) +
4 (partition) bytes + the value's UTF-8 bytes + 4 bytes Arrow offset; per distinct key
~150-200 bytes (dict entry, the key's str object, an int, 8 bytes of offsets). Measured: 200 k
keys x 3 versions with ~50-byte values -> ~85 MB RSS, build 0.55 s, as-of p50 ~15 us in-process
(so 1 M keys x 3 versions ~ 0.4-0.5 GB). During a rebuild the changed buckets exist twice until
the swap. Each uvicorn worker process holds its own index.

Streams
=======
A warehouse child whose settings have ``kind = stream`` (``versiq.layout.STREAM_KIND``) is a
*stream*, never a store: it is not listed by ``list_stores`` and has no in-memory index. A
refresh pass only brings its ``DeltaTable`` up to date and keeps the current snapshot's file
list with its statistics (``query.streams.StreamSnapshot``); ``stream_records`` answers with one
DuckDB query over the files of the snapshot, pruned to the key's bucket and by the statistics.
Older snapshots' file lists are cached like stores'. ``readiness()`` reports streams under
``streams``.

Provenance
==========
``StoreInfo.inputs`` / ``.sources`` (and ``StreamInfo``'s) are ``StoreState.inputs`` /
``.sources`` of the answering snapshot (``layout.read_state``): the snapshots of the inputs a
derived table was computed from; empty for ordinary stores.

Timestamped stores (KIP-258)
============================
A ``timestamped`` store keeps one value per key, so only *latest* reads apply:
``get`` with ``as_of is None`` returns the current value with its timestamp (``horizon`` None:
no retention applies). ``get`` with ``as_of`` and every ``versions``/``iter_versions`` call
raise :class:`UnsupportedQuery`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from versiq import layout, names
from versiq.query import reads
from versiq.query.api import (
    InvalidQuery,
    KeyResult,
    MultiVersionedKeyQuery,
    SnapshotGone,
    SnapshotNotFound,
    StoreInfo,
    StoreNotFound,
    StoreUnavailable,
    StreamNotFound,
    StreamUnavailable,
    UnsupportedQuery,
    VersionedKeyQuery,
    VersionedRecord,
    VersionsPage,
)
from versiq.query.files import abs_path as _abs_path
from versiq.query.files import arrow as _arrow
from versiq.query.files import latest_version_on_disk as _latest_version_on_disk
from versiq.query.streams import (
    StreamInfo,
    StreamPosition,
    StreamRecord,
    StreamRecordsPage,
    StreamRecordsQuery,
    StreamSnapshot,
    check_query,
    stream_files,
)

log = logging.getLogger(__name__)

SNAPSHOT_CACHE_SIZE = 8

def _resolve_sql(kind: str, one_key: bool) -> str:
    where = "WHERE key = $key " if one_key else ""
    return (
        "SELECT key, valid_from, valid_to, value, tombstone, \"partition\" "
        f"FROM read_parquet($files, hive_partitioning = false) {where}"
        f"{layout.read_rule_sql(kind)} ORDER BY key, valid_from"
    )


# ---------------------------------------------------------------------------------- files
@dataclass(frozen=True)
class _DataFile:
    path: str  # absolute local path
    min_key: str | None
    max_key: str | None
    num_records: int

    def may_contain(self, key: str) -> bool:
        if self.min_key is not None and key < self.min_key:
            return False
        # String statistics may be truncated prefixes of the true maximum: stay safe.
        if self.max_key is not None and key > self.max_key and not key.startswith(self.max_key):
            return False
        return True


def _files_by_bucket(dt: DeltaTable, table_path: str) -> dict[int, list[_DataFile]]:
    adds = pa.table(dt.get_add_actions(flatten=True))
    cols = adds.column_names
    paths = adds.column("path").to_pylist()
    buckets = adds.column("partition.bucket").to_pylist() if "partition.bucket" in cols else None
    mins = adds.column("min.key").to_pylist() if "min.key" in cols else [None] * len(paths)
    maxs = adds.column("max.key").to_pylist() if "max.key" in cols else [None] * len(paths)
    nrec = adds.column("num_records").to_pylist() if "num_records" in cols else [0] * len(paths)
    out: dict[int, list[_DataFile]] = {}
    for i, p in enumerate(paths):
        if buckets is None or buckets[i] is None:
            raise ValueError("store table is not partitioned by 'bucket' (versiq layout)")
        out.setdefault(int(buckets[i]), []).append(
            _DataFile(_abs_path(table_path, p), mins[i], maxs[i], int(nrec[i] or 0))
        )
    for files in out.values():
        files.sort(key=lambda f: f.path)
    return out


def _rows_from_table(tbl: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.Array, np.ndarray]:
    vf = tbl.column("valid_from").to_numpy().astype(np.int64, copy=False)
    vt = pc.fill_null(tbl.column("valid_to"), reads.NULL_TS).to_numpy().astype(np.int64, copy=False)
    tomb = pc.fill_null(tbl.column("tombstone"), False).to_numpy().astype(bool, copy=False)
    values = tbl.column("value").combine_chunks()
    part = pc.fill_null(tbl.column("partition"), 0).to_numpy().astype(np.int32, copy=False)
    return vf, vt, tomb, values, part


# ---------------------------------------------------------------------------------- index
@dataclass(frozen=True)
class _BucketIndex:
    """Resolved rows of one bucket of the current snapshot, sorted by (key, valid_from)."""

    files: frozenset[str]
    keys: dict[str, int]
    offsets: np.ndarray  # int64, len(keys) + 1
    valid_from: np.ndarray
    valid_to: np.ndarray
    tombstone: np.ndarray
    partition: np.ndarray
    values: pa.Array
    physical_rows: int

    @staticmethod
    def build(con: duckdb.DuckDBPyConnection, kind: str, files: list[_DataFile]) -> _BucketIndex:
        tbl = _arrow(con, _resolve_sql(kind, False), {"files": [f.path for f in files]})
        vf, vt, tomb, values, part = _rows_from_table(tbl)
        n = tbl.num_rows
        keycol = tbl.column("key").combine_chunks()
        if n:
            neq = pc.not_equal(keycol.slice(1), keycol.slice(0, n - 1))
            changes = np.flatnonzero(neq.to_numpy(zero_copy_only=False)) + 1
            starts = np.concatenate([np.zeros(1, dtype=np.int64), changes.astype(np.int64)])
        else:
            starts = np.zeros(0, dtype=np.int64)
        uniq = keycol.take(pa.array(starts)).to_pylist() if n else []
        keys = {k: i for i, k in enumerate(uniq)}
        offsets = np.append(starts, np.int64(n)).astype(np.int64)
        return _BucketIndex(
            files=frozenset(f.path for f in files),
            keys=keys,
            offsets=offsets,
            valid_from=vf,
            valid_to=vt,
            tombstone=tomb,
            partition=part,
            values=values,
            physical_rows=sum(f.num_records for f in files),
        )

    def rows(self, key: str) -> reads.KeyRows | None:
        i = self.keys.get(key)
        if i is None:
            return None
        s, e = int(self.offsets[i]), int(self.offsets[i + 1])
        return reads.KeyRows(
            self.valid_from, self.valid_to, self.tombstone, self.values, s, e, int(self.partition[s])
        )


@dataclass(frozen=True)
class _View:
    """A readable snapshot of a store (current index or older files)."""

    name: str
    snapshot: int
    settings: layout.StoreSettings
    state: layout.StoreState
    file_count: int
    physical_rows: int

    def rows(self, engine: Engine, key: str) -> reads.KeyRows | None:  # pragma: no cover
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        return {"files": self.file_count, "rows": self.physical_rows}


@dataclass(frozen=True)
class _Loaded(_View):
    """The in-memory index of the current snapshot of one store (immutable; swapped whole)."""

    buckets: dict[int, _BucketIndex] = field(default_factory=dict)
    loaded_at: float = 0.0

    def rows(self, engine: Engine, key: str) -> reads.KeyRows | None:
        b = self.buckets.get(layout.bucket_of(key, self.settings.buckets))
        return None if b is None else b.rows(key)

    def counts(self) -> dict[str, int]:
        return {
            "files": self.file_count,
            "rows": self.physical_rows,
            "keys": sum(len(b.keys) for b in self.buckets.values()),
            "versions": sum(len(b.valid_from) for b in self.buckets.values()),
        }


@dataclass(frozen=True)
class _FilesSnapshot(_View):
    """An older (or not yet loaded) snapshot: file lists per bucket, read with DuckDB per key."""

    path: str = ""
    files: dict[int, list[_DataFile]] = field(default_factory=dict)

    def rows(self, engine: Engine, key: str) -> reads.KeyRows | None:
        files = [
            f.path
            for f in self.files.get(layout.bucket_of(key, self.settings.buckets), [])
            if f.may_contain(key)
        ]
        if not files:
            return None
        try:
            tbl = _arrow(engine._con(), _resolve_sql(self.settings.kind, True), {"files": files, "key": key})
        except duckdb.IOException as exc:
            raise SnapshotGone(f"snapshot {self.snapshot} of store {self.name!r} is gone: {exc}") from exc
        if tbl.num_rows == 0:
            return None
        vf, vt, tomb, values, part = _rows_from_table(tbl)
        return reads.KeyRows(vf, vt, tomb, values, 0, tbl.num_rows, int(part[0]))


# ---------------------------------------------------------------------------------- stores
@dataclass
class _StoreHandle:
    name: str
    path: str
    settings: layout.StoreSettings
    dt: DeltaTable | None = None
    loaded: _Loaded | None = None
    error: str | None = None
    last_refresh: float | None = None  # monotonic time of the last successful refresh check


@dataclass
class _StreamHandle:
    name: str
    path: str
    settings: layout.StoreSettings
    dt: DeltaTable | None = None
    loaded: StreamSnapshot | None = None
    error: str | None = None
    last_refresh: float | None = None


def _has_commits(path: str) -> bool:
    """Whether a table directory has any Delta commit or checkpoint file (else it is being
    created and is not a store yet, rather than a broken one)."""
    try:
        names_ = os.listdir(os.path.join(path, "_delta_log"))
    except OSError:
        return True  # the log exists but cannot be listed: that is an unreadable store
    return any(n.endswith(".json") or ".checkpoint" in n for n in names_)


def _settings_or_none(description: str | None) -> layout.StoreSettings | None:
    """Settings of a versiq store; None for a Delta table without the versiq marker (not a
    store); ValueError for a versiq store this reader cannot read (refused)."""
    try:
        data = json.loads(description) if description else None
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or layout.FORMAT_KEY not in data:
        return None
    try:
        return layout.StoreSettings.from_description(description)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"invalid versiq settings: {exc!r}") from exc


class Engine:
    """Answers versioned-store queries for every store of ``warehouse`` (see module docstring)."""

    def __init__(self, warehouse: str, *, refresh_interval_s: float = 1.0) -> None:
        self.warehouse = os.path.abspath(warehouse)
        self.refresh_interval_s = refresh_interval_s
        self._stores: dict[str, _StoreHandle] = {}
        self._streams: dict[str, _StreamHandle] = {}
        self._refused: dict[str, str] = {}
        #: Directories with a ``_delta_log`` that cannot be read (corrupt log, unreadable
        #: metadata): name -> error. Retried at every refresh until readable or gone.
        self._unavailable: dict[str, str] = {}
        self._ignored: set[str] = set()
        self._local = threading.local()
        self._refresh_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._snapshot_cache: OrderedDict[tuple[str, int], _FilesSnapshot] = OrderedDict()
        self._stream_cache: OrderedDict[tuple[str, int], StreamSnapshot] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._build_con: duckdb.DuckDBPyConnection | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """First load of every store, then a daemon thread refreshing every refresh_interval_s."""
        self.refresh()
        self._started = True
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="versiq-refresh", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._refresh_lock:
            if self._build_con is not None:
                self._build_con.close()
                self._build_con = None

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_interval_s):
            try:
                self.refresh()
            except Exception:  # pragma: no cover - refresh records per-store errors itself
                log.exception("refresh pass failed")

    # ------------------------------------------------------------------ refresh
    def refresh(self) -> None:
        """One synchronous refresh pass: discover stores, reload those whose version moved."""
        with self._refresh_lock:
            self._started = True
            try:
                entries = sorted(os.scandir(self.warehouse), key=lambda e: e.name)
            except FileNotFoundError:
                entries = []
            present = {e.name for e in entries
                       if e.is_dir() and os.path.isdir(os.path.join(e.path, "_delta_log"))}
            for gone in [n for n in self._refused if n not in present]:
                del self._refused[gone]
            for gone in [n for n in self._unavailable if n not in present]:
                del self._unavailable[gone]
                log.info("store %s is no longer in the warehouse", gone)
            self._forget_removed(present)
            self._ignored &= present
            for entry in entries:
                name = entry.name
                if not names.is_valid_store_name(name) or name not in present:
                    continue
                if name in self._stores or name in self._streams or name in self._refused or name in self._ignored:
                    continue
                self._discover(name, entry.path)
            for handle in list(self._stores.values()):
                self._refresh_store(handle)
            for stream in list(self._streams.values()):
                self._refresh_stream(stream)

    def _forget_removed(self, present: set[str]) -> None:
        """Stores and streams whose directory (or ``_delta_log``) is gone leave the catalog: the
        warehouse is the truth, so they are no longer listed or served (readiness follows)."""
        for table in (self._stores, self._streams):
            for name in [n for n in table if n not in present]:
                del table[name]  # type: ignore[attr-defined]
                log.info("%s is no longer in the warehouse: not served any more", name)
        with self._cache_lock:
            for cache in (self._snapshot_cache, self._stream_cache):
                for key in [k for k in cache if k[0] not in present]:
                    del cache[key]  # type: ignore[attr-defined]

    def _discover(self, name: str, path: str) -> None:
        try:
            dt = DeltaTable(path)
            description = dt.metadata().description
        except Exception as exc:
            if not _has_commits(path):  # a store being created: its first commit is not written yet
                log.debug("skipping %s: %s", path, exc)
                return
            error = f"cannot read the Delta table: {type(exc).__name__}: {exc}"
            if self._unavailable.get(name) != error:
                log.error("store %s is unavailable: %s", name, error)
            self._unavailable[name] = error
            return
        if self._unavailable.pop(name, None) is not None:
            log.info("store %s is readable again", name)
        try:
            settings = _settings_or_none(description)
        except ValueError as exc:
            self._refused[name] = str(exc)
            log.warning("refusing store %s: %s", name, exc)
            return
        if settings is None:
            self._ignored.add(name)
            return
        if settings.kind == layout.STREAM_KIND:
            self._streams[name] = _StreamHandle(name=name, path=path, settings=settings, dt=dt)
            return
        self._stores[name] = _StoreHandle(name=name, path=path, settings=settings, dt=dt)

    def _build_connection(self) -> duckdb.DuckDBPyConnection:
        if self._build_con is None:
            self._build_con = duckdb.connect()
        return self._build_con

    def _refresh_table(self, handle: _StoreHandle | _StreamHandle, kind: str,
                       load: Callable[[DeltaTable], None]) -> None:
        """Bring ``handle``'s Delta table up to date and ``load`` its snapshot; on any failure keep
        serving the last good snapshot, say why in ``handle.error`` and re-read the log next time."""
        if not os.path.isdir(os.path.join(handle.path, "_delta_log")):
            handle.error = f"{kind} directory or its _delta_log is gone (serving last good snapshot)"
            return
        try:
            if handle.dt is None:
                handle.dt = DeltaTable(handle.path)
            else:
                handle.dt.update_incremental()
            load(handle.dt)
            handle.last_refresh = time.monotonic()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if handle.error != error:  # once per failure, not at every refresh
                if handle.loaded is None:
                    log.error("%s %s is unavailable: %s", kind, handle.name, error)
                else:
                    log.error("refresh of %s %s failed (serving its last good snapshot %d): %s", kind,
                              handle.name, handle.loaded.snapshot, error)
            handle.error = error
            # Force a full re-read of the log next time (the table object may be inconsistent).
            handle.dt = None
            return
        if handle.error is not None:
            log.info("%s %s is readable again", kind, handle.name)
        handle.error = None

    @staticmethod
    def _same_settings(handle: _StoreHandle | _StreamHandle, dt: DeltaTable, kind: str) -> layout.StoreSettings:
        settings = _settings_or_none(dt.metadata().description)
        if settings is None or settings != handle.settings:
            raise ValueError(f"{kind} settings changed or became unreadable: {settings!r}")
        return settings

    def _refresh_store(self, handle: _StoreHandle) -> None:
        def load(dt: DeltaTable) -> None:
            version = dt.version()
            prev = handle.loaded
            if prev is not None and prev.snapshot == version:
                return
            settings = self._same_settings(handle, dt, "store")
            state = layout.read_state(handle.path, version)
            files = _files_by_bucket(dt, handle.path)
            con = self._build_connection()
            buckets: dict[int, _BucketIndex] = {}
            for b, bfiles in files.items():
                old = prev.buckets.get(b) if prev is not None else None
                if old is not None and old.files == frozenset(f.path for f in bfiles):
                    buckets[b] = old
                else:
                    buckets[b] = _BucketIndex.build(con, settings.kind, bfiles)
            handle.loaded = _Loaded(
                name=handle.name,
                snapshot=version,
                settings=settings,
                state=state,
                file_count=sum(len(v) for v in files.values()),
                physical_rows=sum(f.num_records for v in files.values() for f in v),
                buckets=buckets,
                loaded_at=time.monotonic(),
            )

        self._refresh_table(handle, "store", load)

    def _refresh_stream(self, handle: _StreamHandle) -> None:
        """Bring a stream's file list up to date (no index: reads go to the files)."""
        def load(dt: DeltaTable) -> None:
            prev = handle.loaded
            if prev is None or prev.snapshot != dt.version():
                settings = self._same_settings(handle, dt, "stream")
                handle.loaded = StreamSnapshot.open(handle.name, handle.path, settings, dt)

        self._refresh_table(handle, "stream", load)

    # ------------------------------------------------------------------ views
    def _con(self) -> duckdb.DuckDBPyConnection:
        con: duckdb.DuckDBPyConnection | None = getattr(self._local, "con", None)
        if con is None:
            con = duckdb.connect(config={"threads": 1})
            self._local.con = con
        return con

    def _handle(self, store: str) -> _StoreHandle:
        return self._lookup(store, self._stores, self._streams, "store", "stream", StoreNotFound)

    def _lookup(self, name: str, own: dict[str, Any], other: dict[str, Any], kind: str, other_kind: str,
                error: type[Exception]) -> Any:
        """The handle of store/stream ``name``, or ``error`` saying precisely why there is none."""
        if not isinstance(name, str) or not names.is_valid_store_name(name):
            raise error(f"invalid {kind} name {name!r}")
        handle = own.get(name)
        if handle is None:
            unavailable = self._unavailable.get(name)
            if unavailable is not None:
                raise (StreamUnavailable if kind == "stream" else StoreUnavailable)(
                    f"{kind} {name!r} is in the warehouse but cannot be read: {unavailable}")
            reason = self._refused.get(name)
            if reason is not None:
                raise error(f"{kind} {name!r} is refused: {reason}")
            if name in other:
                raise error(f"no {kind} {name!r}: {name!r} is a {other_kind} (/v1/{other_kind}s/{name})")
            raise error(f"no {kind} {name!r}")
        return handle

    def _current(self, store: str) -> _Loaded:
        handle = self._handle(store)
        loaded = handle.loaded
        if loaded is None:
            raise StoreUnavailable(f"store {store!r} cannot be read: {handle.error or 'not loaded yet'}")
        return loaded

    def _view(self, store: str, snapshot: int | None) -> _View:
        loaded = self._current(store)
        if snapshot is None or snapshot == loaded.snapshot:
            return loaded
        return self._files_view(store, snapshot)

    def _files_view(self, store: str, snapshot: int) -> _FilesSnapshot:
        """Snapshot ``snapshot`` read from files with DuckDB (never the in-memory index)."""
        handle = self._handle(store)
        if isinstance(snapshot, bool) or not isinstance(snapshot, int) or snapshot < 0:
            raise SnapshotNotFound(f"invalid snapshot {snapshot!r}")
        cache_key = (store, snapshot)
        with self._cache_lock:
            cached = self._snapshot_cache.get(cache_key)
            if cached is not None:
                self._snapshot_cache.move_to_end(cache_key)
                return cached
        latest = _latest_version_on_disk(handle.path)
        if handle.loaded is not None:
            latest = max(latest, handle.loaded.snapshot)
        if snapshot > latest:
            raise SnapshotNotFound(f"store {store!r} has no snapshot {snapshot} (latest is {latest})")
        try:
            dt = DeltaTable(handle.path, version=snapshot)
            state = layout.read_state(handle.path, snapshot)
            files = _files_by_bucket(dt, handle.path)
        except Exception as exc:
            raise SnapshotGone(
                f"snapshot {snapshot} of store {store!r} is no longer readable: {exc}"
            ) from exc
        view = _FilesSnapshot(
            name=store,
            snapshot=snapshot,
            settings=handle.settings,
            state=state,
            file_count=sum(len(v) for v in files.values()),
            physical_rows=sum(f.num_records for v in files.values() for f in v),
            path=handle.path,
            files=files,
        )
        with self._cache_lock:
            self._snapshot_cache[cache_key] = view
            while len(self._snapshot_cache) > SNAPSHOT_CACHE_SIZE:
                self._snapshot_cache.popitem(last=False)
        return view

    @staticmethod
    def _horizon(view: _View, key: str, rows: reads.KeyRows | None) -> int | None:
        p = rows.partition if rows is not None else layout.default_partition_of(key, view.settings.partitions)
        return layout.horizon(view.state.stream_time.get(p), view.settings.history_retention_ms)

    # ------------------------------------------------------------------ public reads
    def unavailable(self) -> dict[str, str]:
        """Stores and streams in the warehouse that cannot be read: name -> error. Their reads
        answer StoreUnavailable/StreamUnavailable (503), never "not found"."""
        out = dict(self._unavailable)
        for table in (self._stores, self._streams):
            for name, handle in table.items():
                if handle.loaded is None:
                    out[name] = handle.error or "not loaded yet"
        return dict(sorted(out.items()))

    def list_stores(self) -> list[StoreInfo]:
        """Every loaded store (current snapshot), by name."""
        out = []
        for name in sorted(self._stores):
            loaded = self._stores[name].loaded
            if loaded is not None:
                out.append(self._info(loaded))
        return out

    def store_info(self, store: str, snapshot: int | None = None) -> StoreInfo:
        """Settings, stream time and counts of a store at ``snapshot`` (default: current).

        ``counts``: ``files`` and ``rows`` (physical rows, from the add actions) always;
        ``keys`` and ``versions`` (resolved, tombstones included) for the current snapshot.
        """
        return self._info(self._view(store, snapshot))

    @staticmethod
    def _info(view: _View) -> StoreInfo:
        return StoreInfo(
            name=view.name,
            kind=view.settings.kind,
            history_retention_ms=view.settings.history_retention_ms,
            partitions=view.settings.partitions,
            snapshot=view.snapshot,
            stream_time=dict(view.state.stream_time),
            counts=view.counts(),
            inputs=dict(view.state.inputs),
            sources={name: dict(v) for name, v in view.state.sources.items()},
        )

    def current_snapshot(self, store: str) -> int:
        return self._current(store).snapshot

    def get(self, store: str, query: VersionedKeyQuery, snapshot: int | None = None) -> KeyResult:
        """VersionedKeyQuery: latest (rule 6) or as of ``query.as_of`` (rules 7-8, retention edges).

        Timestamped stores answer latest only (UnsupportedQuery for ``as_of``).
        """
        view = self._view(store, snapshot)
        rows = view.rows(self, query.key)
        if view.settings.kind == "timestamped":
            if query.as_of is not None:
                raise UnsupportedQuery(
                    f"store {store!r} is timestamped (KIP-258): it keeps one value per key, "
                    "so only latest reads apply (no asOf)"
                )
            outcome, record = reads.latest(rows)
            return KeyResult(outcome, record, view.snapshot, None)
        h = self._horizon(view, query.key, rows)
        if query.as_of is None:
            outcome, record = reads.latest(rows)
        else:
            outcome, record = reads.as_of(rows, int(query.as_of), h)
        return KeyResult(outcome, record, view.snapshot, h)

    def versions(
        self,
        store: str,
        query: MultiVersionedKeyQuery,
        *,
        snapshot: int | None = None,
        resume_after: int | None = None,
        limit: int = 100,
    ) -> VersionsPage:
        """One page of a MultiVersionedKeyQuery (rules 9-11, retention edges).

        ``resume_after`` is the timestamp of the last record of the previous page; ascending
        pages continue with larger timestamps, descending with smaller. ``resume_after`` of the
        returned page is None exactly when no record follows. Raises InvalidQuery for
        ``from_time > to_time`` or ``limit < 1``; UnsupportedQuery on a timestamped store.
        """
        return self._page(self._view(store, snapshot), query, resume_after, limit)

    def iter_versions(
        self,
        store: str,
        query: MultiVersionedKeyQuery,
        *,
        snapshot: int | None = None,
        page_size: int = 100,
    ) -> Iterator[VersionedRecord]:
        """Every record of a MultiVersionedKeyQuery, fetched lazily page by page from one
        snapshot (the current one at the first ``next()`` unless ``snapshot`` is given)."""
        view = self._view(store, snapshot)
        self._check_versions(view, query, page_size)
        resume: int | None = None
        while True:
            page = self._page(view, query, resume, page_size)
            yield from page.records
            if page.resume_after is None:
                return
            resume = page.resume_after

    def _check_versions(self, view: _View, query: MultiVersionedKeyQuery, limit: int) -> None:
        if view.settings.kind == "timestamped":
            raise UnsupportedQuery(
                f"store {view.name!r} is timestamped (KIP-258): it keeps no history, "
                "so versions queries do not apply"
            )
        if query.from_time is not None and query.to_time is not None and query.from_time > query.to_time:
            raise InvalidQuery(f"from ({query.from_time}) is after to ({query.to_time})")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidQuery(f"invalid page size {limit!r}")

    def _page(
        self, view: _View, query: MultiVersionedKeyQuery, resume_after: int | None, limit: int
    ) -> VersionsPage:
        self._check_versions(view, query, limit)
        rows = view.rows(self, query.key)
        h = self._horizon(view, query.key, rows)
        idx = reads.range_indices(rows, query.from_time, query.to_time, h, query.ascending, resume_after)
        if rows is None or len(idx) == 0:
            return VersionsPage([], view.snapshot, h, None)
        records = [rows.record(int(i)) for i in idx[:limit]]
        more = len(idx) > limit
        return VersionsPage(records, view.snapshot, h, records[-1].timestamp if more else None)

    # ------------------------------------------------------------------ streams
    def _stream_handle(self, stream: str) -> _StreamHandle:
        handle: _StreamHandle = self._lookup(stream, self._streams, self._stores, "stream", "store", StreamNotFound)
        return handle

    def _stream_view(self, stream: str, snapshot: int | None) -> StreamSnapshot:
        handle = self._stream_handle(stream)
        loaded = handle.loaded
        if loaded is None:
            raise StreamUnavailable(f"stream {stream!r} cannot be read: {handle.error or 'not loaded yet'}")
        if snapshot is None or snapshot == loaded.snapshot:
            return loaded
        if isinstance(snapshot, bool) or not isinstance(snapshot, int) or snapshot < 0:
            raise SnapshotNotFound(f"invalid snapshot {snapshot!r}")
        cache_key = (stream, snapshot)
        with self._cache_lock:
            cached = self._stream_cache.get(cache_key)
            if cached is not None:
                self._stream_cache.move_to_end(cache_key)
                return cached
        latest = max(_latest_version_on_disk(handle.path), loaded.snapshot)
        if snapshot > latest:
            raise SnapshotNotFound(f"stream {stream!r} has no snapshot {snapshot} (latest is {latest})")
        try:
            dt = DeltaTable(handle.path, version=snapshot)
            view = StreamSnapshot(
                name=stream,
                snapshot=snapshot,
                settings=handle.settings,
                state=layout.read_state(handle.path, snapshot),
                files=stream_files(dt, handle.path),
            )
        except Exception as exc:
            raise SnapshotGone(
                f"snapshot {snapshot} of stream {stream!r} is no longer readable: {exc}"
            ) from exc
        with self._cache_lock:
            self._stream_cache[cache_key] = view
            while len(self._stream_cache) > SNAPSHOT_CACHE_SIZE:
                self._stream_cache.popitem(last=False)
        return view

    def list_streams(self) -> list[StreamInfo]:
        """Every loaded stream (current snapshot), by name."""
        out = []
        for name in sorted(self._streams):
            loaded = self._streams[name].loaded
            if loaded is not None:
                out.append(loaded.info())
        return out

    def stream_info(self, stream: str, snapshot: int | None = None) -> StreamInfo:
        """Snapshot, last run, counts, timestamp range and provenance of a stream at ``snapshot``
        (default: current). Raises StreamNotFound, SnapshotNotFound, SnapshotGone."""
        return self._stream_view(stream, snapshot).info()

    def current_stream_snapshot(self, stream: str) -> int:
        return self._stream_view(stream, None).snapshot

    def stream_records(
        self,
        stream: str,
        query: StreamRecordsQuery,
        *,
        snapshot: int | None = None,
        resume_after: StreamPosition | None = None,
        limit: int = 100,
    ) -> StreamRecordsPage:
        """One page of a stream's records in stream order ``(run, seq)`` (reversed when
        ``query.ascending`` is false), filtered by key and ``from_time <= timestamp <= to_time``.

        ``resume_after`` is the position of the last record of the previous page;
        ``resume_after`` of the returned page is None exactly when no record follows. Raises
        InvalidQuery for an empty key, ``from_time > to_time`` or ``limit < 1``.
        """
        check_query(query, limit)
        view = self._stream_view(stream, snapshot)
        try:
            return view.page(self._con(), query, resume_after, limit)
        except SnapshotGone:
            if snapshot is not None:
                raise
        # The current snapshot's files were compacted away and vacuumed before the next
        # refresh: refresh this stream now and answer from its newest snapshot.
        handle = self._stream_handle(stream)
        with self._refresh_lock:
            self._refresh_stream(handle)
        return self._stream_view(stream, None).page(self._con(), query, resume_after, limit)

    def iter_stream_records(
        self,
        stream: str,
        query: StreamRecordsQuery,
        *,
        snapshot: int | None = None,
        page_size: int = 1000,
    ) -> Iterator[StreamRecord]:
        """Every record of a stream query, fetched lazily page by page from one snapshot."""
        check_query(query, page_size)
        view = self._stream_view(stream, snapshot)
        resume: StreamPosition | None = None
        while True:
            page = view.page(self._con(), query, resume, page_size)
            yield from page.records
            if page.resume_after is None:
                return
            resume = page.resume_after

    # ------------------------------------------------------------------ health
    def readiness(self) -> dict[str, Any]:
        """``{"ready", "stores": {name: {"snapshot", "lastRefreshAgeSeconds", "error"}}, "streams":
        {same}, "refused"}``.

        Ready once a refresh pass ran and every store and stream of the warehouse (every
        directory with a ``_delta_log``, refused format versions aside) has a loaded snapshot:
        ``unavailable`` names those that cannot be read, and readiness follows the warehouse at
        every refresh (a repaired store makes it ready again, a removed one leaves it). One
        serving its last good snapshot after a failed refresh stays ready (its ``error`` says
        why it is stale).
        """
        now = time.monotonic()
        ready = self._started
        out: dict[str, dict[str, Any]] = {"stores": {}, "streams": {}}
        handles: list[tuple[str, dict[str, _StoreHandle] | dict[str, _StreamHandle]]] = [
            ("stores", self._stores), ("streams", self._streams)]
        for member, table in handles:
            for name in sorted(table):
                h = table[name]
                loaded = h.loaded
                if loaded is None:
                    ready = False
                out[member][name] = {
                    "snapshot": None if loaded is None else loaded.snapshot,
                    "lastRefreshAgeSeconds": None if h.last_refresh is None else round(now - h.last_refresh, 3),
                    "error": h.error,
                }
        if self._unavailable:
            ready = False
        return {"ready": ready, "stores": out["stores"], "streams": out["streams"], "refused": dict(self._refused),
                "unavailable": self.unavailable()}
