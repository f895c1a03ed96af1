"""What the warehouse holds, kept up to date: discovery of stores and streams, the refresh
thread, the handle of each table with its current snapshot, and readiness.

``start()`` loads every store, then a daemon thread calls ``refresh()`` every
``refresh_interval_s``. A refresh pass discovers new stores and streams (direct children of the
warehouse with a valid name, ``_delta_log/`` and a versiq settings description; an unknown format
version or kind is *refused*, a Delta table without the versiq marker is ignored, one whose log
cannot be read is *unavailable* and retried at every pass), forgets the ones that left the
warehouse, brings each table's ``DeltaTable`` up to date (``update_incremental``) and, when its
version moved, builds the new index (``query.index.build_loaded``) and swaps the handle's
snapshot reference atomically. A failed refresh keeps serving the last good snapshot and records
the error (``readiness()["stores"][name]["error"]``), logged once per failure.

Bound: a commit of a table already served becomes visible to ``snapshot=None`` reads about the
build time of its changed buckets after it lands in a local warehouse, and ``watch_interval_s``
(0.1 s; 0.5 s on S3) plus that build time where the kernel cannot say so: between full passes,
a watch pass checks whether the commit after each loaded snapshot exists
(``refresh_committed``) every ``watch_interval_s`` and, in a local warehouse, as soon as the
kernel reports a commit file written under it (``versiq.notify``). New stores,
removed ones and failing ones wait for the next full pass, at most ``refresh_interval_s``.
Building a changed bucket is one DuckDB scan of its files (~1 s per million physical rows here),
written once to the host's serving index.

A warehouse child whose settings have ``kind = stream`` (``versiq.layout.STREAM_KIND``) is a
*stream*, never a store: it has no serving index; a refresh keeps the current snapshot's file
list with its statistics (``query.streams.StreamSnapshot``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb
from deltalake import DeltaTable

from versiq import layout, names, storage
from versiq.notify import FileChanges
from versiq.query import index_files
from versiq.query.api import StoreNotFound, StoreUnavailable, StreamNotFound, StreamUnavailable
from versiq.query.index import LoadedStore, build_loaded
from versiq.query.published import Published
from versiq.query.streams import StreamSnapshot

log = logging.getLogger("versiq.query.catalog")


#: The watch pass's interval for a local warehouse: one ``stat`` per table served.
WATCH_INTERVAL_S = 0.1
#: ... and for one on S3, where each check is a HEAD request.
WATCH_INTERVAL_S3_S = 0.5


def _is_commit_file(path: str) -> bool:
    """A Delta commit file (``.../_delta_log/<version>.json``), the only change the watch pass
    looks for (Delta writes it under a temporary name, then renames it into place)."""
    return path.endswith(".json") and os.path.basename(os.path.dirname(path)) == layout.DELTA_LOG_DIR


@dataclass
class StoreHandle:
    name: str
    path: str
    settings: layout.StoreSettings
    dt: DeltaTable | None = None
    loaded: LoadedStore | None = None
    error: str | None = None
    last_refresh: float | None = None  # monotonic time of the last successful refresh check


@dataclass
class StreamHandle:
    name: str
    path: str
    settings: layout.StoreSettings
    dt: DeltaTable | None = None
    loaded: StreamSnapshot | None = None
    error: str | None = None
    last_refresh: float | None = None


def has_commits(path: str) -> bool:
    """Whether a table directory has any Delta commit or checkpoint file (else it is being
    created and is not a store yet, rather than a broken one)."""
    try:
        names_ = storage.listdir(layout.delta_log(path))
    except OSError:
        return True  # the log exists but cannot be listed: that is an unreadable store
    return any(n.endswith(".json") or ".checkpoint" in n for n in names_)


def settings_or_none(description: str | None) -> layout.StoreSettings | None:
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


class Catalog:
    """The stores and streams of ``warehouse`` and their current snapshots (module docstring).

    ``on_refresh(names)`` is called after every refresh pass with the names of the tables still
    in the warehouse (the engine drops cached older snapshots of the others)."""

    def __init__(self, warehouse: str, *, refresh_interval_s: float = 1.0,
                 on_refresh: Callable[[set[str]], None] | None = None, cache_dir: str | None = None,
                 watch_interval_s: float | None = None, notified: bool = True) -> None:
        self.warehouse = storage.normalize(warehouse)
        #: Whether the watch pass also runs as soon as the kernel reports a commit file written
        #: (a local warehouse; ``_loop``). Off: only every ``watch_interval_s`` (tests that
        #: refresh by hand).
        self.notified = notified and not storage.is_s3(self.warehouse)
        #: How often the refresh thread looks for the next commit of each table it serves
        #: (``refresh_committed``); default WATCH_INTERVAL_S, or WATCH_INTERVAL_S3_S for a bucket.
        self.watch_interval_s = watch_interval_s if watch_interval_s is not None else (
            WATCH_INTERVAL_S3_S if storage.is_s3(self.warehouse) else WATCH_INTERVAL_S)
        #: Where the serving indexes of this warehouse's stores live (``query.index_files``).
        self.cache_dir = index_files.cache_dir(self.warehouse, cache_dir)
        self.refresh_interval_s = refresh_interval_s
        self.stores: dict[str, StoreHandle] = {}
        self.streams: dict[str, StreamHandle] = {}
        self._refused: dict[str, str] = {}
        #: Directories with a ``_delta_log`` that cannot be read (corrupt log, unreadable
        #: metadata): name -> error. Retried at every refresh until readable or gone.
        self._unavailable: dict[str, str] = {}
        self._ignored: set[str] = set()
        self._on_refresh = on_refresh
        self.refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._build_con: duckdb.DuckDBPyConnection | None = None
        #: Why the last refresh could not list the warehouse (an unreachable bucket), else None.
        self._warehouse_error: str | None = None
        #: The kernel's notifications of commit files written (a local warehouse), while the
        #: refresh thread runs.
        self._commits: FileChanges | None = None
        #: Set for a table's waiters when its snapshot moves, it leaves, or its refresh fails
        #: (``query.published``): a long poll sleeps on it instead of polling.
        self.published = Published()

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
        if self._commits is not None:
            self._commits.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self.refresh_lock:
            if self._build_con is not None:
                self._build_con.close()
                self._build_con = None

    def __enter__(self) -> Catalog:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        """Full passes every ``refresh_interval_s``; between them, a watch pass that loads only
        the tables whose next commit has landed, every ``watch_interval_s`` and, in a local
        warehouse, also as soon as the kernel says a commit file was written (``versiq.notify``;
        the interval still catches what it does not see, e.g. a network file system written from
        another host)."""
        commits = None if not self.notified else FileChanges(
            [self.warehouse], "the warehouse's commits", keep=_is_commit_file)
        self._commits = commits
        next_full = time.monotonic() + self.refresh_interval_s
        try:
            while not self._stop.is_set():
                wait_s = max(0.0, min(self.watch_interval_s, next_full - time.monotonic()))
                if commits is not None and commits.notified:
                    commits.wait(wait_s)  # a commit file written, or the interval (changes the kernel misses)
                else:
                    self._stop.wait(wait_s)
                if self._stop.is_set():
                    break
                try:
                    if time.monotonic() >= next_full:
                        next_full = time.monotonic() + self.refresh_interval_s
                        self.refresh()
                    else:
                        self.refresh_committed()
                except Exception:  # pragma: no cover - refresh records per-store errors itself
                    log.exception("refresh pass failed")
        finally:
            if commits is not None:
                commits.close()

    def refresh_committed(self) -> list[str]:
        """The watch pass: for every table served, one existence check of the commit file after
        its loaded snapshot (a ``stat``; a HEAD on S3), and a refresh of the tables that have one.
        Cheap enough to run many times a second, so a commit is served about the build of its
        changed buckets after it lands (at most ``watch_interval_s`` later where the kernel does
        not report it). Returns the names refreshed."""
        moved: list[str] = []
        with self.refresh_lock:
            handles: list[StoreHandle | StreamHandle] = [*self.stores.values(), *self.streams.values()]
            for handle in handles:
                loaded = handle.loaded
                if loaded is None or handle.error is not None:
                    continue  # the full pass deals with tables not loaded or failing
                try:
                    landed = storage.exists(layout.log_file(handle.path, loaded.snapshot + 1))
                except OSError:
                    continue  # an unreachable bucket: the full pass reports it
                if landed:
                    moved.append(handle.name)
                    if isinstance(handle, StoreHandle):
                        self._refresh_store(handle)
                    else:
                        self._refresh_stream(handle)
        return moved


    # ------------------------------------------------------------------ refresh
    def refresh(self) -> None:
        """One synchronous refresh pass: discover stores, reload those whose version moved."""
        with self.refresh_lock:
            self._started = True
            try:
                entries = storage.subdirectories(self.warehouse)
            except OSError as exc:  # the bucket cannot be reached (a local warehouse is never listed in vain)
                error = f"cannot list the warehouse: {storage.error_line(exc)}"
                if self._warehouse_error != error:
                    log.error("%s (serving what is loaded; retried at every refresh)", error)
                self._warehouse_error = error
                return
            if self._warehouse_error is not None:
                log.info("the warehouse can be listed again")
                self._warehouse_error = None
            present = {name for name, path in entries if layout.has_delta_log(path)}
            for gone in [n for n in self._refused if n not in present]:
                del self._refused[gone]
            for gone in [n for n in self._unavailable if n not in present]:
                del self._unavailable[gone]
                log.info("store %s is no longer in the warehouse", gone)
            self._forget_removed(present)
            index_files.remove_unlisted(self.cache_dir, present)
            self._ignored &= present
            for name, path in entries:
                if not names.is_valid_store_name(name) or name not in present:
                    continue
                if name in self.stores or name in self.streams or name in self._refused or name in self._ignored:
                    continue
                self._discover(name, path)
            for handle in list(self.stores.values()):
                self._refresh_store(handle)
            for stream in list(self.streams.values()):
                self._refresh_stream(stream)
            if self._on_refresh is not None:
                self._on_refresh(set(self.stores) | set(self.streams))

    def _forget_removed(self, present: set[str]) -> None:
        """Stores and streams whose directory (or ``_delta_log``) is gone leave the catalog: the
        warehouse is the truth, so they are no longer listed or served (readiness follows), and
        a store's serving index is freed at once (``index_files.remove_store``; the folders of
        stores this process never served wait for ``index_files.remove_unlisted``)."""
        for table in (self.stores, self.streams):
            for name in [n for n in table if n not in present]:
                del table[name]
                log.info("%s is no longer in the warehouse: not served any more", name)
                index_files.remove_store(self.cache_dir, name)
                self.published.publish(name)

    def _discover(self, name: str, path: str) -> None:
        try:
            dt = storage.delta_table(path)
            description = dt.metadata().description
        except Exception as exc:
            if not has_commits(path):  # a store being created: its first commit is not written yet
                log.debug("skipping %s: %s", path, exc)
                return
            error = f"cannot read the Delta table: {type(exc).__name__}: {storage.error_line(exc)}"
            if self._unavailable.get(name) != error:
                log.error("store %s is unavailable: %s", name, error)
            self._unavailable[name] = error
            return
        if self._unavailable.pop(name, None) is not None:
            log.info("store %s is readable again", name)
        try:
            settings = settings_or_none(description)
        except ValueError as exc:
            self._refused[name] = str(exc)
            log.warning("refusing store %s: %s", name, exc)
            return
        if settings is None:
            self._ignored.add(name)
            return
        if settings.kind == layout.STREAM_KIND:
            self.streams[name] = StreamHandle(name=name, path=path, settings=settings, dt=dt)
            return
        self.stores[name] = StoreHandle(name=name, path=path, settings=settings, dt=dt)

    def _build_connection(self) -> duckdb.DuckDBPyConnection:
        if self._build_con is None:
            self._build_con = storage.duckdb_connect(self.warehouse)
        return self._build_con

    def _refresh_table(self, handle: StoreHandle | StreamHandle, kind: str,
                       load: Callable[[DeltaTable], None]) -> None:
        """Bring ``handle``'s Delta table up to date and ``load`` its snapshot (``_load_table``);
        a new snapshot, once set, wakes the table's waiters (``published``)."""
        before = handle.loaded
        try:
            self._load_table(handle, kind, load)
        finally:
            if handle.loaded is not before:
                self.published.publish(handle.name)

    def _load_table(self, handle: StoreHandle | StreamHandle, kind: str,
                    load: Callable[[DeltaTable], None]) -> None:
        """On any failure keep serving the last good snapshot, say why in ``handle.error`` and
        re-read the log next time."""
        if not layout.has_delta_log(handle.path):
            handle.error = f"{kind} directory or its _delta_log is gone (serving last good snapshot)"
            return
        try:
            if handle.dt is None:
                handle.dt = storage.delta_table(handle.path)
            else:
                handle.dt.update_incremental()
            load(handle.dt)
            handle.last_refresh = time.monotonic()
        except Exception as exc:
            error = f"{type(exc).__name__}: {storage.error_line(exc)}"
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
    def _same_settings(handle: StoreHandle | StreamHandle, dt: DeltaTable, kind: str) -> layout.StoreSettings:
        settings = settings_or_none(dt.metadata().description)
        if settings is None or settings != handle.settings:
            raise ValueError(f"{kind} settings changed or became unreadable: {settings!r}")
        return settings

    def _refresh_store(self, handle: StoreHandle) -> None:
        def load(dt: DeltaTable) -> None:
            prev = handle.loaded
            if prev is not None and prev.snapshot == dt.version():
                return
            settings = self._same_settings(handle, dt, "store")
            handle.loaded = build_loaded(handle.name, handle.path, dt, settings, prev, self._build_connection(),
                                         os.path.join(self.cache_dir, handle.name))

        self._refresh_table(handle, "store", load)

    def _refresh_stream(self, handle: StreamHandle) -> None:
        """Bring a stream's file list up to date (no index: reads go to the files)."""
        def load(dt: DeltaTable) -> None:
            prev = handle.loaded
            if prev is None or prev.snapshot != dt.version():
                settings = self._same_settings(handle, dt, "stream")
                handle.loaded = StreamSnapshot.open(handle.name, handle.path, settings, dt)

        self._refresh_table(handle, "stream", load)

    def store_handle(self, store: str) -> StoreHandle:
        return self._lookup(store, self.stores, self.streams, "store", "stream", StoreNotFound)

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
            raise error(names.unknown_name(kind, name, sorted(own)))
        return handle

    def current_store(self, store: str) -> LoadedStore:
        """The current snapshot's index of ``store``; StoreUnavailable when it has none."""
        handle = self.store_handle(store)
        loaded = handle.loaded
        if loaded is None:
            raise StoreUnavailable(f"store {store!r} cannot be read: {handle.error or 'not loaded yet'}")
        return loaded


    def stream_handle(self, stream: str) -> StreamHandle:
        handle: StreamHandle = self._lookup(stream, self.streams, self.stores, "stream", "store", StreamNotFound)
        return handle

    def current_stream(self, stream: str) -> StreamSnapshot:
        """The current snapshot of ``stream``; StreamUnavailable when it has none."""
        handle = self.stream_handle(stream)
        if handle.loaded is None:
            raise StreamUnavailable(f"stream {stream!r} cannot be read: {handle.error or 'not loaded yet'}")
        return handle.loaded

    def refresh_stream(self, stream: str) -> None:
        """Refresh one stream now (its current files were compacted away before the next pass)."""
        handle = self.stream_handle(stream)
        with self.refresh_lock:
            self._refresh_stream(handle)

    def unavailable(self) -> dict[str, str]:
        """Stores and streams in the warehouse that cannot be read: name -> error. Their reads
        answer StoreUnavailable/StreamUnavailable (503), never "not found"."""
        out = dict(self._unavailable)
        for table in (self.stores, self.streams):
            for name, handle in table.items():
                if handle.loaded is None:
                    out[name] = handle.error or "not loaded yet"
        return dict(sorted(out.items()))


    def readiness(self) -> dict[str, Any]:
        """``{"ready", "stores": {name: {"snapshot", "lastRefreshAgeSeconds", "error"}}, "streams":
        {same}, "refused"}``.

        Ready once a refresh pass ran and every store and stream of the warehouse (every
        directory with a ``_delta_log``, refused format versions aside) has a loaded snapshot:
        ``unavailable`` names those that cannot be read, ``warehouse`` why the warehouse itself
        could not be listed at the last refresh (an unreachable bucket: not ready until it can
        be), and readiness follows the warehouse at
        every refresh (a repaired store makes it ready again, a removed one leaves it). One
        serving its last good snapshot after a failed refresh stays ready (its ``error`` says
        why it is stale).
        """
        now = time.monotonic()
        ready = self._started
        out: dict[str, dict[str, Any]] = {"stores": {}, "streams": {}}
        handles: list[tuple[str, dict[str, StoreHandle] | dict[str, StreamHandle]]] = [
            ("stores", self.stores), ("streams", self.streams)]
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
        if self._unavailable or self._warehouse_error is not None:
            ready = False
        return {"ready": ready, "stores": out["stores"], "streams": out["streams"], "refused": dict(self._refused),
                "unavailable": self.unavailable(), "warehouse": self._warehouse_error}

