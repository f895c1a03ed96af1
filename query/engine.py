"""The versiq read engine: VersionedKeyQuery / MultiVersionedKeyQuery over the stores of a warehouse,
and the records of its streams. The public face of ``versiq.query``; it answers from:

- ``query.catalog``: what the warehouse holds and each table's current snapshot (refresh);
- ``query.index``: the serving index (memory-mapped files, ``query.index_files``) of a store's
  current snapshot (``snapshot=None`` reads);
- ``query.snapshots``: older snapshots read from files with DuckDB (``snapshot=V``, pinned pages);
- ``query.reads``: docs/semantics.md rules 6-11 and the retention edges, once for every path, so the
  paths cannot disagree. Expiry is judged with the stream time of the snapshot that answers
  (``versiq.layout.read_state(path, V)``), for the key's partition (its rows' ``partition``
  column; ``default_partition_of`` for a key without rows).

Usable as a library (no FastAPI)::

    engine = Engine("/path/to/warehouse")
    engine.start()                      # first load + background refresh thread
    engine.get("prices", VersionedKeyQuery("k1", as_of=1_700_000_000_000))
    engine.versions("prices", MultiVersionedKeyQuery("k1"), limit=100)
    engine.keys("prices", KeysQuery(prefix="sku-"), limit=100)     # which keys exist
    engine.get_many("prices", ["k1", "k2"], as_of=1_700_000_000_000)  # many keys, one snapshot
    engine.close()

Key listings, batches and lookups answer through ``query.many``: the same rules in their batch
form (``reads.answer_many``, tested equal to the per-key form ``get`` uses), so a listed record
is always what the single-key read of that snapshot answers.

Provenance: ``StoreInfo.inputs`` / ``.sources`` (and ``StreamInfo``'s) are ``StoreState.inputs`` /
``.sources`` of the answering snapshot: the snapshots of the inputs a derived table was computed
from; empty for ordinary stores.

Timestamped stores (KIP-258) keep one value per key, so only *latest* reads apply: ``get`` with
``as_of is None`` returns the current value with its timestamp (``horizon`` None: no retention
applies); ``get`` with ``as_of`` and every ``versions``/``iter_versions`` call raise
:class:`UnsupportedQuery`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa

from versiq import layout, storage
from versiq.query import changes as changes_mod
from versiq.query import history, lookups, many, reads
from versiq.query.api import (
    ChangesPage,
    InvalidQuery,
    KeyResult,
    KeysPage,
    KeysQuery,
    MultiVersionedKeyQuery,
    RejectedPage,
    SnapshotGone,
    SnapshotNotFound,
    StoreInfo,
    UnsupportedQuery,
    VersionedKeyQuery,
    VersionedRecord,
    VersionsPage,
)
from versiq.query.catalog import Catalog, StoreHandle, StreamHandle
from versiq.query.files import latest_version_on_disk
from versiq.query.history import Commit
from versiq.query.index import StoreView
from versiq.query.rejected import RejectedTables, rejected_page, rejected_record
from versiq.query.snapshots import SnapshotCache, store_snapshot, stream_snapshot
from versiq.query.streams import (
    StreamInfo,
    StreamPosition,
    StreamRecord,
    StreamRecordsPage,
    StreamRecordsQuery,
    StreamSnapshot,
    check_query,
)


def _horizon(view: StoreView, key: str, rows: reads.KeyRows | None) -> int | None:
    p = rows.partition if rows is not None else view.settings.partitioning.of(key)
    return layout.horizon(view.state.stream_time.get(p), view.settings.history_retention_ms)


class Engine:
    """Answers versioned-store queries for every store of ``warehouse`` (see module docstring)."""

    def __init__(self, warehouse: str, *, refresh_interval_s: float = 1.0, cache_dir: str | None = None,
                 watch_interval_s: float | None = None, notified: bool = True) -> None:
        self._snapshots = SnapshotCache()
        self._rejected = RejectedTables()
        self.catalog = Catalog(warehouse, refresh_interval_s=refresh_interval_s, on_refresh=self._snapshots.retain,
                               cache_dir=cache_dir, watch_interval_s=watch_interval_s, notified=notified)
        self.warehouse = self.catalog.warehouse
        self.refresh_interval_s = refresh_interval_s
        self._local = threading.local()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """First load of every store, then a daemon thread refreshing every refresh_interval_s."""
        self.catalog.start()

    def close(self) -> None:
        self.catalog.close()

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh(self) -> None:
        """One synchronous refresh pass (``Catalog.refresh``)."""
        self.catalog.refresh()

    def readiness(self) -> dict[str, Any]:
        return self.catalog.readiness()

    def unavailable(self) -> dict[str, str]:
        return self.catalog.unavailable()

    @property
    def _stores(self) -> dict[str, StoreHandle]:
        return self.catalog.stores

    @property
    def _streams(self) -> dict[str, StreamHandle]:
        return self.catalog.streams

    # ------------------------------------------------------------------ snapshots
    def _con(self) -> duckdb.DuckDBPyConnection:
        """This thread's DuckDB connection for reads from files."""
        con: duckdb.DuckDBPyConnection | None = getattr(self._local, "con", None)
        if con is None:
            con = storage.duckdb_connect(self.warehouse, config={"threads": 1})
            self._local.con = con
        return con

    def _view(self, store: str, snapshot: int | None) -> StoreView:
        loaded = self.catalog.current_store(store)
        if snapshot is None or snapshot == loaded.snapshot:
            return loaded
        return self._files_view(store, snapshot)

    def _files_view(self, store: str, snapshot: int) -> StoreView:
        """Snapshot ``snapshot`` read from files with DuckDB (never the serving index)."""
        handle = self.catalog.store_handle(store)
        newest = handle.loaded.snapshot if handle.loaded is not None else -1
        return self._snapshots.get("store", store, handle.path, newest, snapshot,
                                   lambda dt: store_snapshot(store, handle.path, handle.settings, snapshot, dt))

    def _stream_view(self, stream: str, snapshot: int | None) -> StreamSnapshot:
        loaded = self.catalog.current_stream(stream)
        if snapshot is None or snapshot == loaded.snapshot:
            return loaded
        handle = self.catalog.stream_handle(stream)
        return self._snapshots.get("stream", stream, handle.path, loaded.snapshot, snapshot,
                                   lambda dt: stream_snapshot(stream, handle.path, handle.settings, snapshot, dt))

    # ------------------------------------------------------------------ system time
    def _table(self, name: str, what: str) -> tuple[str, int]:
        """The path and current snapshot of store (``what="store"``) or stream ``name``."""
        if what == "stream":
            return self.catalog.stream_handle(name).path, self.catalog.current_stream(name).snapshot
        return self.catalog.store_handle(name).path, self.catalog.current_store(name).snapshot

    def newest_committed(self, name: str, what: str = "store") -> int:
        """The newest snapshot of a store or stream committed to its log (loaded or not yet)."""
        path, current = self._table(name, what)
        return max(current, latest_version_on_disk(path))

    def _feed_commits(self, store: str, since: int, until: int | None) -> tuple[str, int, list[Commit]]:
        """The path, the snapshot the feed runs to, and the commits in ``(since, until]``, oldest first."""
        path, current = self._table(store, "store")
        until = current if until is None else until
        if until > current:
            raise SnapshotNotFound(f"store {store!r} has no snapshot {until} yet (latest: {current})")
        if since < -1 or since > until:
            raise InvalidQuery(f"sinceSnapshot ({since}) must be -1 (from the start) or a snapshot not after "
                               f"untilSnapshot ({until})")
        return path, until, [c for c in reversed(history.commits(path, until)) if since < c.snapshot]

    def stream_changes(self, store: str, since: int,
                       until: int | None = None) -> tuple[int, Iterator[tuple[int, pa.RecordBatch]]]:
        """The whole change feed in one pass (the NDJSON answer): the snapshot it runs to, and
        ``(snapshot, batch)`` pairs of Arrow batches in feed order (``query.changes``). Runs
        lazily on its own DuckDB connection; the caller drives it from one thread at a time."""
        path, until, commits = self._feed_commits(store, since, until)

        def batches() -> Iterator[tuple[int, pa.RecordBatch]]:
            con = storage.duckdb_connect(path, config={"threads": 1})
            try:
                for commit in commits:
                    try:
                        for batch in changes_mod.commit_batches(con, path, commit):
                            yield commit.snapshot, batch
                    except duckdb.IOException as exc:
                        raise SnapshotGone(f"the files of snapshot {commit.snapshot} of store {store!r} were "
                                           "vacuumed: its changes can no longer be read "
                                           f"({storage.error_line(exc)})") from None
            finally:
                con.close()

        return until, batches()

    def changes(self, store: str, since: int, until: int | None = None,
                resume_after: tuple[int, str, int] | None = None, limit: int = 1000) -> ChangesPage:
        """One page of the change feed of ``store`` (``query.changes``): the changes of the
        commits after snapshot ``since`` up to ``until`` (default: the current snapshot), after
        ``resume_after`` (a change's position), ordered by (snapshot, key, validFrom)."""
        path, until, commits = self._feed_commits(store, since, until)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidQuery(f"invalid page size {limit!r}")
        commits = [c for c in commits if resume_after is None or c.snapshot >= resume_after[0]]
        out: list[changes_mod.Change] = []
        for commit in commits:
            after = resume_after[1:] if resume_after is not None and commit.snapshot == resume_after[0] else None
            try:
                out += changes_mod.commit_changes(self._con(), path, commit, after, limit + 1 - len(out))
            except duckdb.IOException as exc:
                raise SnapshotGone(f"the files of snapshot {commit.snapshot} of store {store!r} were vacuumed: "
                                   f"its changes can no longer be read ({storage.error_line(exc)})") from None
            if len(out) > limit:
                break
        page = out[:limit]
        more = len(out) > limit
        return ChangesPage(page, until, page[-1].position() if more else None)

    def rejected(self, store: str, reason: str | None = None, *, snapshot: int | None = None,
                 resume_after: int | None = None, limit: int = 100) -> RejectedPage:
        """One page of the input records a store rejected, as of ``snapshot`` (default: current):
        the rejections of the runs that snapshot committed, in (run, source, place) order
        (``versiq.rejected``), only ``reason``'s when given, with the counts per reason."""
        view = self._view(store, snapshot)
        path = self.catalog.store_handle(store).path
        table, counts = self._rejected.get(path, view.state.run)
        return rejected_page(table, counts, view.snapshot, reason, resume_after, limit)

    def rejected_record(self, store: str, record_id: int, snapshot: int | None = None) -> tuple[int, dict[str, Any]]:
        """The snapshot read and one record it rejected, raw text whole (``query.rejected``);
        RecordNotFound when it has no record ``record_id``."""
        view = self._view(store, snapshot)
        table, _counts = self._rejected.get(self.catalog.store_handle(store).path, view.state.run)
        return view.snapshot, rejected_record(table, record_id)

    def history(self, name: str, what: str = "store") -> list[Commit]:
        """The commits of a store or stream up to its current snapshot, newest first
        (``query.history``)."""
        return history.commits(*self._table(name, what))

    def snapshot_at(self, name: str, system_time: int, what: str = "store") -> int:
        """The newest snapshot of a store or stream committed at or before ``system_time``
        (epoch ms); SnapshotNotFound when its first listed commit is later."""
        path, current = self._table(name, what)
        found = history.snapshot_at(path, current, system_time)
        if found is None:
            raise SnapshotNotFound(f"{what} {name!r} has no snapshot committed at or before {system_time} "
                                   "(asOfSystemTime is before its first commit the log still lists)")
        return found

    # ------------------------------------------------------------------ stores
    def list_stores(self) -> list[StoreInfo]:
        """Every loaded store (current snapshot), by name."""
        out = []
        for name in sorted(self.catalog.stores):
            loaded = self.catalog.stores[name].loaded
            if loaded is not None:
                out.append(self._info(loaded))
        return out

    def store_info(self, store: str, snapshot: int | None = None) -> StoreInfo:
        """Settings, stream time and counts of a store at ``snapshot`` (default: current).

        ``counts``: ``files`` and ``rows`` (physical rows, from the add actions) always;
        ``keys`` and ``versions`` (resolved, tombstones included) for the current snapshot, and
        ``deletedKeys``: how many of those keys are deleted (their latest version a tombstone).
        """
        return self._info(self._view(store, snapshot))

    @staticmethod
    def _info(view: StoreView) -> StoreInfo:
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
        return self.catalog.current_store(store).snapshot

    def next_snapshot_event(self, name: str) -> asyncio.Event:
        """An event of the running event loop that is set when store or stream ``name`` has a
        new current snapshot (or leaves the warehouse): a long poll awaits it instead of polling
        (``query.published``). Take it before reading the current snapshot, then await it."""
        return self.catalog.published.event(name)

    def get(self, store: str, query: VersionedKeyQuery, snapshot: int | None = None) -> KeyResult:
        """VersionedKeyQuery: latest (rule 6) or as of ``query.as_of`` (rules 7-8, retention edges).

        Timestamped stores answer latest only (UnsupportedQuery for ``as_of``).
        """
        view = self._view(store, snapshot)
        self._check_as_of(view, query.as_of)
        return self._answer(view, query.key, view.rows(self._con(), query.key), query.as_of)

    def get_many(self, store: str, keys: list[str], as_of: int | None = None,
                 snapshot: int | None = None) -> tuple[int, list[KeyResult]]:
        """Many VersionedKeyQuery answers from one snapshot (the current one unless ``snapshot``
        is given), in the order of ``keys``: each exactly what ``get`` answers for it."""
        view = self._view(store, snapshot)
        self._check_as_of(view, as_of)
        return view.snapshot, many.answer_pairs(view, self._con(), [(key, as_of) for key in keys])

    def lookup(self, store: str, pairs: list[tuple[str, int | None]],
               snapshot: int | None = None) -> tuple[int, list[KeyResult]]:
        """Point-in-time lookups (``query.lookups``): each ``(key, asOf)`` pair answered from one
        snapshot exactly as ``get`` answers it (``asOf`` None: latest), in the order of ``pairs``.
        A key's versions are located once however many pairs name it."""
        if len(pairs) > lookups.MAX_LOOKUPS:
            raise InvalidQuery(f"{len(pairs)} pairs; at most {lookups.MAX_LOOKUPS} per lookup")
        view = self._view(store, snapshot)
        for _key, as_of in pairs:
            self._check_as_of(view, as_of)
        return view.snapshot, many.answer_pairs(view, self._con(), pairs)

    @staticmethod
    def _check_as_of(view: StoreView, as_of: int | None) -> None:
        if view.settings.kind == "timestamped" and as_of is not None:
            raise UnsupportedQuery(
                f"store {view.name!r} is timestamped (KIP-258): it keeps one value per key, "
                "so only latest reads apply (no asOf)"
            )

    @staticmethod
    def _answer(view: StoreView, key: str, rows: reads.KeyRows | None, as_of: int | None) -> KeyResult:
        """The read rules for one key of ``view``: latest (rules 6, 12) or as of (7-8), with the
        tombstone behind a not-found."""
        if view.settings.kind == "timestamped":
            outcome, record = reads.latest(rows)
            h = None
        else:
            h = _horizon(view, key, rows)
            if as_of is None:
                outcome, record = reads.latest(rows)
            else:
                outcome, record = reads.as_of(rows, int(as_of), h)
        tombstone = None
        if outcome == "not-found":
            tombstone = reads.tombstone_answer(rows, None if as_of is None else int(as_of), h)
        return KeyResult(outcome, record, view.snapshot, h, None if tombstone is None else tombstone[0])

    def keys(self, store: str, query: KeysQuery, *, snapshot: int | None = None,
             resume_after: str | None = None, limit: int = 100) -> KeysPage:
        """One page of a key listing: the keys of ``query``'s range in UTF-8 byte order, each
        with the record ``get`` would answer (latest, or as of ``query.as_of``); keys without
        one are left out, except that ``include_deleted`` lists a key whose answer is a
        tombstone as a deleted entry. ``resume_after`` is the last key of the previous page;
        the page's ``resume_after`` is None exactly when no listed key follows."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidQuery(f"invalid page size {limit!r}")
        if query.start is not None and query.end is not None and query.start > query.end:
            raise InvalidQuery(f"start ({query.start!r}) is after end ({query.end!r})")
        view = self._view(store, snapshot)
        self._check_as_of(view, query.as_of)
        lo = max((b for b in (query.start, query.prefix) if b is not None), default=None)
        ends = [b for b in (query.end, None if query.prefix is None else reads.prefix_end(query.prefix))
                if b is not None]
        hi = min(ends, default=None)
        return many.list_keys(view, self._con(), query, lo, hi, resume_after, limit)

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

    def _check_versions(self, view: StoreView, query: MultiVersionedKeyQuery, limit: int) -> None:
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
        self, view: StoreView, query: MultiVersionedKeyQuery, resume_after: int | None, limit: int
    ) -> VersionsPage:
        self._check_versions(view, query, limit)
        rows = view.rows(self._con(), query.key)
        h = _horizon(view, query.key, rows)
        idx = reads.range_indices(rows, query.from_time, query.to_time, h, query.ascending, resume_after,
                                  query.include_deleted)
        expired, truncated = reads.range_edges(rows, query.from_time, query.to_time, h)
        if rows is None or len(idx) == 0:
            return VersionsPage([], view.snapshot, h, None, expired, truncated)
        records = [rows.record(int(i)) for i in idx[:limit]]
        more = len(idx) > limit
        return VersionsPage(records, view.snapshot, h, records[-1].timestamp if more else None, expired, truncated)


    # ------------------------------------------------------------------ streams
    def list_streams(self) -> list[StreamInfo]:
        """Every loaded stream (current snapshot), by name."""
        out = []
        for name in sorted(self.catalog.streams):
            loaded = self.catalog.streams[name].loaded
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
        self.catalog.refresh_stream(stream)
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

