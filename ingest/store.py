"""Writer-side access to one store: lock, settings, state, existing versions, Delta commits.

Every Delta write goes through Delta's Spark connector (``versiq.ingest.delta``): a run's
side-table rows first, then its table commit, which carries the store state; the writer lock
(and on S3 the run's Delta ``txn``, ``delta.run_txn_needed``) makes a run commit at most once. Reading (the snapshot a
run starts from, its existing versions) is delta-rs and DuckDB, as in the service.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from versiq import layout, storage
from versiq import settings as registry
from versiq.durations import format_duration
from versiq.ingest.delta import SideRun, commit_table, replace_runs, set_description
from versiq.ingest.errors import LeaseLost, LockTimeout, UsageError, one_line
from versiq.ingest.holder import Holder, end_orphan_jvm
from versiq.ingest.plan import scans_per_bucket
from versiq.ingest.sources import SourceError
from versiq.ingest.spark import driver_jvm_pid
from versiq.layout import (
    CHANGELOG_DIR,
    CHANGELOG_SCHEMA,
    EMITTED_DIR,
    EMITTED_SCHEMA,
    LOCK_FILE,
    PRIVATE_DIR,
    REJECTED_DIR,
    REJECTED_SCHEMA,
    STORE_SCHEMA,
    STORE_SORT,
    STREAM_KIND,
    STREAM_SCHEMA,
    STREAM_SORT,
    SUBSCRIPTIONS_DIR,
    SUBSCRIPTIONS_SCHEMA,
    StoreSettings,
    StoreState,
    bucket_of,
    has_table,
    read_rule_sql,
    read_state,
)
from versiq.names import check_store_name, unknown_name

if TYPE_CHECKING:
    from versiq.ingest.lease import Lease

log = logging.getLogger("versiq.ingest")


#: How often a writer whose lease was lost cancels its Spark jobs (``_cancel_spark_jobs_until``).
_CANCEL_EVERY_S = 0.2
#: The S3 leases this process holds: store path -> lease (``writer_lock``), checked before every
#: commit to the store (``check_still_writer``).
_leases: dict[str, Lease] = {}
#: The local locks this process holds: store path -> hold (``_local_lock``).
_local_holds: dict[str, _LocalHold] = {}


#: What a holder of a store's writer lock does to the store table (``writer_lock``): a ``RUN``
#: only appends to it (a run of a store or derived table; its side tables are its own), a
#: ``COMPACTION`` rewrites files without changing what a query sees (Delta commits such a
#: rewrite beside appends: ``versiq.ingest.maintain``); anything else (erase, drop, a stream's
#: run) is ``EXCLUSIVE``.
RUN, COMPACTION, EXCLUSIVE = "run", "compaction", "exclusive"


@dataclass
class _ProcessHold:
    """This process's hold of one store's writer lock: who holds it (``RUN``, ``COMPACTION``),
    and the ``__exit__`` of the lock between processes once taken; ``busy`` while that lock is
    being taken or given back."""

    kinds: list[str]
    busy: bool = True
    release: Callable[..., Any] | None = None


_process_holds: dict[str, _ProcessHold] = {}
_process_holds_changed = threading.Condition()


def _shares(kind: str, held: list[str]) -> bool:
    """Whether a holder of ``kind`` may join this process's holders ``held`` of a store: a run
    and a compaction go together, never two of one kind, nor anything with ``EXCLUSIVE``."""
    return kind != EXCLUSIVE and EXCLUSIVE not in held and kind not in held


@contextlib.contextmanager
def writer_lock(store_path: str, timeout_s: float, kind: str = EXCLUSIVE) -> Iterator[None]:
    """The one-writer-per-store lock, held for a whole run (or compaction) of the store.

    Between processes the lock is exclusive (``_processes_lock``). Inside one process a run and a
    compaction of the store may hold it together (``kind``: ``RUN``, ``COMPACTION``), so that
    continuous mode's compaction never keeps a run waiting; the lock between processes is taken
    by the first of them and given back by the last. Any other pair waits, as two processes do,
    and a wait longer than ``timeout_s`` raises ``LockTimeout``."""
    deadline = time.monotonic() + timeout_s
    with _process_holds_changed:
        while True:
            hold = _process_holds.get(store_path)
            if hold is None:
                hold = _process_holds[store_path] = _ProcessHold([])
                first = True
                break
            if not hold.busy and _shares(kind, hold.kinds):
                hold.kinds.append(kind)
                first = False
                break
            if not _process_holds_changed.wait(max(0.0, deadline - time.monotonic())):
                raise LockTimeout(f"store {storage.basename(store_path)!r} is locked by another writer of this "
                                  f"process ({', '.join(hold.kinds) or 'starting'}); waited {timeout_s:g}s")
    if first:
        lock = _processes_lock(store_path, timeout_s)
        try:
            lock.__enter__()
        except BaseException:
            with _process_holds_changed:
                del _process_holds[store_path]
                _process_holds_changed.notify_all()
            raise
        with _process_holds_changed:
            hold.kinds.append(kind)
            hold.release, hold.busy = lock.__exit__, False
            _process_holds_changed.notify_all()
    failure: tuple[Any, Any, Any] = (None, None, None)
    try:
        yield
    except BaseException as exc:
        failure = (type(exc), exc, exc.__traceback__)
        raise
    finally:
        _leave(store_path, hold, kind, failure)


def _leave(store_path: str, hold: _ProcessHold, kind: str, failure: tuple[Any, Any, Any]) -> None:
    """``kind`` lets go of this process's hold of the store; the last holder gives back the lock
    between processes, with its own outcome (``failure``, which the lock may turn into its own
    error, such as ``LeaseLost``)."""
    with _process_holds_changed:
        hold.kinds.remove(kind)
        last = not hold.kinds
        if last:
            hold.busy = True
    if not last:
        return
    try:
        assert hold.release is not None
        hold.release(*failure)
    finally:
        with _process_holds_changed:
            del _process_holds[store_path]
            _process_holds_changed.notify_all()


@contextlib.contextmanager
def _processes_lock(store_path: str, timeout_s: float) -> Iterator[None]:
    """The store's lock between processes (``writer_lock``).

    Local warehouse: an exclusive ``flock`` on ``<store>/_versiq/lock``, released by the OS if
    the process dies. S3 warehouse: a lease object at the same place, written with conditional
    puts and renewed in the background (``versiq.ingest.lease``): a second writer on any machine
    waits for it, and one whose lease was lost stops before its commit (``check_still_writer``).
    On S3 the commit protocol is the last line: a run's Delta transaction id and versiq's
    conditional-put LogStore make two writers unable to both commit on one snapshot; on local
    disk the lock itself is (``delta.run_txn_needed``)."""
    if storage.is_s3(store_path):
        from versiq.ingest.lease import s3_lease

        with s3_lease(storage.join(store_path, PRIVATE_DIR, LOCK_FILE), timeout_s, ttl_s=lease_ttl_s()) as lease:
            _leases[store_path] = lease
            ended = threading.Event()
            lease.on_lost(lambda _reason: _cancel_spark_jobs_until(ended))
            try:
                yield
            except LeaseLost:
                raise
            except Exception as exc:
                if not lease.lost:
                    raise
                # The block failed after its lease was lost, most likely because its jobs were
                # cancelled, or because S3 is gone (what the lease saw first): that is the cause.
                log.info("store %s: the run's own error once its lease was lost: %s", storage.basename(store_path),
                         one_line(exc))
                lease.check()
                raise
            finally:
                ended.set()
                _leases.pop(store_path, None)
        return
    with _local_lock(store_path, timeout_s):
        yield


def _cancel_spark_jobs_until(ended: threading.Event) -> None:
    """Cancel this process's Spark jobs, and those it starts, until ``ended`` is set (the writer
    lock's block is over): a writer whose lease was lost must stop, and a job writing to a dead
    S3 server would otherwise run through S3A's retries. The runs of other stores going on
    beside it (``side_by_side``) lose their jobs too: they fail this run before their commit,
    which their rerun makes, as when S3 fails them (a lost lease is most often S3 going away).
    A job started in the background (``delta.StateAhead``) is an optimisation that survives
    being cancelled."""

    def cancel() -> None:
        from pyspark import SparkContext

        while not ended.is_set():
            context = SparkContext._active_spark_context
            if context is not None:
                with contextlib.suppress(Exception):  # the JVM may be stopping with us
                    context.cancelAllJobs()
            ended.wait(_CANCEL_EVERY_S)

    if not ended.is_set():
        log.warning("the lease was lost: cancelling this process's Spark jobs until the run ends")
        threading.Thread(target=cancel, name="versiq-lease-lost", daemon=True).start()


def lease_ttl_s() -> float:
    """The ttl of an S3 writer's lease: ``VERSIQ_LEASE_TTL`` (a duration), default 30 s. A longer
    ttl lets a writer ride out a longer S3 outage; a crashed writer on another host blocks the
    store that long."""
    from versiq.ingest.lease import DEFAULT_TTL_S

    try:
        ttl_s = registry.LEASE_TTL.value()
    except registry.SettingError as exc:
        raise UsageError(str(exc)) from None
    return DEFAULT_TTL_S if ttl_s is None else ttl_s


def check_still_writer(store_path: str) -> None:
    """Called before every Delta write to the store. S3: raise ``LeaseLost`` when this process's
    lease was taken or ran out. Local disk (a lock cannot be lost while the process lives): name
    the JVM that is about to write in the lock file, so that if this process dies the next writer
    ends that JVM before it reads the store (``versiq.ingest.holder``)."""
    lease = _leases.get(store_path)
    if lease is not None:
        lease.check()
    hold = _local_holds.get(store_path)
    if hold is not None:
        hold.name_jvm()


@dataclass
class _LocalHold:
    """This process's hold of a local store's lock file, and the holder it names there."""

    handle: TextIO
    holder: Holder

    def write(self, text: str) -> None:
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(text)
        self.handle.flush()

    def name_jvm(self) -> None:
        jvm = driver_jvm_pid()
        if jvm is not None and jvm != self.holder.jvm:
            self.holder = self.holder.with_jvm(jvm)
            # no fsync: other processes see the page cache, and a crash of the machine that
            # loses the record ends the JVM it names too
            self.write(self.holder.encode())


@contextlib.contextmanager
def _local_lock(store_path: str, timeout_s: float) -> Iterator[None]:
    """Exclusive lock on ``<store>/_versiq/lock`` (released by the OS if the process dies). The
    file names the holder, and the JVM that writes for it once it writes
    (``check_still_writer``), until the block ends; a holder that died leaves its record, and
    its JVM, if still running, is ended before the next writer goes on (``versiq.ingest.holder``)."""
    path = os.path.join(store_path, PRIVATE_DIR, LOCK_FILE)
    handle = _open_lock_file(path)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "unknown"
                    raise LockTimeout(
                        f"store {storage.basename(store_path)!r} is locked by another writer "
                        f"({holder}); waited {timeout_s:g}s"
                    ) from None
                time.sleep(0.2)
                continue
            if _is_lock_file(handle, path):
                break
            # The table was dropped while this writer waited (``versiq drop`` unlinks the lock
            # file it holds): the lock obtained is of a file no other writer can open any more.
            handle.close()
            handle = _open_lock_file(path)
        handle.seek(0)
        end_orphan_jvm(Holder.decode(handle.read()), storage.basename(store_path))
        hold = _LocalHold(handle, Holder.me())
        hold.write(hold.holder.encode())
        _local_holds[store_path] = hold
        try:
            yield
        except Exception:
            hold.write("")  # the run failed, its JVM answered: nothing of it is still under way
            raise
        except BaseException:  # interrupted, possibly inside a call to the JVM: the record stays
            _local_holds.pop(store_path, None)
            raise
        hold.write("")  # released: the next writer has no JVM to end
    finally:
        _local_holds.pop(store_path, None)
        with contextlib.suppress(OSError):
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()


def _open_lock_file(path: str) -> TextIO:
    """Open (creating it and its folder) a local store's lock file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the whole block


def _is_lock_file(handle: TextIO, path: str) -> bool:
    """Whether ``handle`` is still the file at ``path`` (not unlinked by a drop of the store)."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def existing_store_path(warehouse: str, store: str) -> str:
    """The path of an existing store; UsageError for an invalid name or a missing store."""
    try:
        check_store_name(store)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    path = layout.table_path(warehouse, store)
    if not has_table(path):
        if not storage.isdir(warehouse):
            raise UsageError(f"the warehouse {warehouse} does not exist")
        stores = [name for name, folder in storage.subdirectories(warehouse) if has_table(folder)]
        raise UsageError(unknown_name("store", store, stores, f"warehouse {warehouse}"))
    return path


@dataclass
class StoreHandle:
    """The store as this run read it: the snapshot every decision of the run is based on."""

    path: str
    settings: StoreSettings
    table: DeltaTable | None  # None: the store does not exist yet
    state: StoreState

    @property
    def version(self) -> int | None:
        return None if self.table is None else self.table.version()

    def data_files(self) -> list[str]:
        """The snapshot's data files."""
        return [] if self.table is None else list(self.table.file_uris())

    def bucket_files(self, buckets: set[int]) -> dict[int, list[str]]:
        """The snapshot's data files of ``buckets`` (the locations DuckDB reads), per bucket."""
        if self.table is None or not buckets:
            return {}
        return {bucket: [f["file"] for f in files]
                for bucket, files in layout.bucket_files(self.table, self.path).items() if bucket in buckets}


def open_store(path: str, requested: StoreSettings, explicit: set[str]) -> StoreHandle:
    """Open (or plan to create) a store; settings named in ``explicit`` must match a store's."""
    if not has_table(path):
        return StoreHandle(path, requested, None, StoreState())
    table = storage.delta_table(path)
    try:
        settings = StoreSettings.from_description(table.metadata().description)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None
    fields = {
        "kind": (settings.kind, requested.kind),
        "history_retention": (settings.history_retention_ms, requested.history_retention_ms),
        "partitions": (settings.partitions, requested.partitions),
        "buckets": (settings.buckets, requested.buckets),
    }
    shown: dict[str, Callable[[Any], str]] = {"history_retention": format_duration}
    for name, (have, want) in fields.items():
        if name in explicit and have != want:
            show = shown.get(name, str)
            raise UsageError(f"store {storage.basename(path)!r} was created with {name} = {show(have)}; "
                             f"it cannot be changed to {show(want)} (create a new store instead)")
    return StoreHandle(path, settings, table, read_state(path, table.version()))


def existing_versions(handle: StoreHandle, keys: pa.Table) -> pa.Table:
    """The current rows (read rule applied) of the given keys, via DuckDB over the snapshot files.

    ``keys``: one row per key. With a ``from_ts`` column (the smallest timestamp of each key's
    records in the run; null: every version), only the versions the run can change or needs:
    those still valid at or after it (``valid_to`` null or later), a suffix of each key's
    history that holds its newest version.
    A run's decisions and the rows it writes see no earlier version: each ends before every
    record of the run, so no record replaces it, lands inside it or follows it directly (a
    record at its end replaces the next version). A batch of current events into a store with
    years of history hands Spark one or two versions per key instead of all of them (10k
    events into a 2M-version store after about 90 batches: 143,587 stored rows in each of the
    run's plans, then 10,524; docs/benchmarks.md).

    Only the files of the keys' buckets are read (``layout.bucket_of``: a key's rows are all in
    its bucket), each bucket's files for that bucket's keys only (``_stored_rows``), so that
    DuckDB skips the row groups whose key statistics hold none of them; of the rest only the key
    column is read in full, other columns for matching rows only. The cost follows the run's
    keys (a row group or two per key and file at most), not the size of the store.
    """
    schema = pa.schema([f for f in STORE_SCHEMA if f.name != "bucket"])
    if keys.num_rows == 0:
        return schema.empty_table()
    buckets = [bucket_of(key, handle.settings.buckets) for key in keys.column("key").to_pylist()]
    files = handle.bucket_files(set(buckets))
    if not files:
        return schema.empty_table()
    con = storage.duckdb_connect(handle.path)
    try:
        con.register("batch_keys", keys.append_column("key_bucket", pa.array(buckets, pa.int32())))
        source, params = _stored_rows(files)
        sql = f"SELECT * FROM {source} " + read_rule_sql(handle.settings.kind)
        if "from_ts" in keys.column_names:
            sql = (f"SELECT v.* FROM ({sql}) v JOIN batch_keys b ON v.key = b.key "
                   "WHERE b.from_ts IS NULL OR v.valid_to IS NULL OR v.valid_to > b.from_ts")
        result = con.sql(sql, params=params).to_arrow_table()
    finally:
        con.close()
    return result.cast(schema)


#: The columns ``existing_versions`` reads from a store's files.
_STORED_COLUMNS = 'key, valid_from, valid_to, value, tombstone, "partition", run'


def _stored_rows(files: dict[int, list[str]]) -> tuple[str, dict[str, Any]]:
    """The DuckDB relation (``FROM`` text and its parameters) of the rows of the run's keys
    (``batch_keys``, with each key's bucket ``key_bucket``) in ``files`` (the data files of
    their buckets, per bucket).

    A file is sorted by key and cut into row groups whose statistics hold their smallest and
    largest key. DuckDB skips row groups by the keys a semi join looks for: by each key when
    they are few (its ``dynamic_or_filter_threshold``, 50), else by their range, smallest to
    largest. Looked for together, the keys of a run of a few records spread over the whole key
    range of every bucket, and DuckDB would read the key column of every touched bucket in full,
    a cost that grows with the store. Asked per bucket, with only that bucket's keys, each file
    is read only where one of them can be; a run touching more buckets than the run plan allows
    (``plan.scans_per_bucket``) asks for its keys in one scan."""
    if not scans_per_bucket(len(files)):
        every = [name for names in files.values() for name in names]
        return (f"(SELECT {_STORED_COLUMNS} FROM read_parquet($files) "
                "WHERE key IN (SELECT key FROM batch_keys))"), {"files": every}
    parts = [f"SELECT {_STORED_COLUMNS} FROM read_parquet($bucket{bucket}) "
             f"WHERE key IN (SELECT k.key FROM batch_keys k WHERE k.key_bucket = {int(bucket)})"
             for bucket in sorted(files)]
    return "(" + " UNION ALL ".join(parts) + ")", {f"bucket{bucket}": names for bucket, names in files.items()}


def table_schema(kind: str) -> pa.Schema:
    """The Delta schema of a store (versioned/timestamped) or stream table."""
    return STREAM_SCHEMA if kind == STREAM_KIND else STORE_SCHEMA


def table_sort(kind: str) -> tuple[str, ...]:
    """The order of rows inside every data file of a store or stream (``versiq.layout``)."""
    return STREAM_SORT if kind == STREAM_KIND else STORE_SORT


#: The side tables of a store: directory -> schema.
SIDE_TABLES = {REJECTED_DIR: REJECTED_SCHEMA, CHANGELOG_DIR: CHANGELOG_SCHEMA, EMITTED_DIR: EMITTED_SCHEMA,
               SUBSCRIPTIONS_DIR: SUBSCRIPTIONS_SCHEMA}


def commit_store(handle: StoreHandle, rows: DataFrame, state: StoreState, new_run: bool = True) -> int:
    """Commit the run's rows and state in one Delta commit; returns the new version.

    ``rows`` are the table's columns, partitioned as the files are to be cut (whole buckets per
    task). A run is committed at most once (``delta.run_txn_needed``). ``new_run=False``: a
    commit of state only, between runs."""
    kind = handle.settings.kind
    check_still_writer(handle.path)
    commit_table(rows, handle.path, table_schema(kind), run=state.run, state=state,
                 description=handle.settings.to_description(), sort=table_sort(kind), create=handle.table is None,
                 new_run=new_run)
    handle.table = storage.delta_table(handle.path)
    handle.state = state
    return handle.table.version()


def grow_partitions(spark: SparkSession, handle: StoreHandle, partitions: int) -> StoreHandle:
    """The store with ``partitions`` stream-time partitions, the count of the Kafka topic it
    reads (``ingest.kafka``): a new store is created with it; an existing one whose topic gained
    partitions has its settings changed first, in a commit of their own (a crash after it leaves
    a store that already has them: the rerun finds nothing to change). Fewer partitions than the
    store has mean the topic was recreated: a ``SourceError``."""
    if handle.table is None:
        return replace(handle, settings=replace(handle.settings, partitions=partitions))
    have = handle.settings.partitions
    if partitions < have:
        raise SourceError(f"the topic has {partitions} partition(s) but store {storage.basename(handle.path)!r} has "
                          f"{have}: was the topic deleted and created again? Ingest it into a new store")
    if partitions == have:
        return handle
    settings = replace(handle.settings, partitions=partitions)
    check_still_writer(handle.path)
    set_description(spark, handle.path, settings.to_description(), handle.state)
    log.warning("store %s: the topic has %d partitions now (was %d); the new ones start with their own stream time",
                storage.basename(handle.path), partitions, have)
    return StoreHandle(handle.path, settings, storage.delta_table(handle.path), handle.state)


def commit_side(store_path: str, side: str, state: StoreState, rows: DataFrame, empty: bool | None = None) -> None:
    """Write a run's rows of a side table (``_rejected``, ``_changelog``, ``_emitted``) before the
    run's table commit, replacing any rows an unfinished attempt of the run left there.
    ``rows``: one partition, in the order the run processed them."""
    commit_sides(store_path, state, {side: (rows, empty)})


def commit_sides(store_path: str, state: StoreState, sides: Mapping[str, tuple[DataFrame, bool | None]]) -> None:
    """``commit_side`` for several side tables of the run (directory -> (rows, empty)), their
    commits made at once (``delta.replace_runs``); returns once all are committed."""
    check_still_writer(store_path)
    replace_runs([SideRun(rows, storage.join(store_path, side), SIDE_TABLES[side], empty)
                  for side, (rows, empty) in sides.items()], run=state.run, state=state)
