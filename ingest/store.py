"""Writer-side access to one store: lock, settings, state, existing versions, Delta commits.

All Delta writes go through delta-rs (``deltalake``): Spark executors write the Parquet files
and this module commits them in one transaction whose commitInfo carries the store state and
whose Delta ``txn`` (app ``versiq.ingest``, version = run) makes the run idempotent.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from versiq.ingest.errors import UsageError
from versiq.layout import (
    APP_ID,
    CHANGELOG_DIR,
    CHANGELOG_SCHEMA,
    EMITTED_DIR,
    EMITTED_SCHEMA,
    LOCK_FILE,
    PRIVATE_DIR,
    REJECTED_DIR,
    REJECTED_SCHEMA,
    STATE_KEY,
    STORE_FILE_SCHEMA,
    STORE_PARTITION_COLUMNS,
    STORE_SCHEMA,
    STREAM_FILE_SCHEMA,
    STREAM_KIND,
    STREAM_SCHEMA,
    StoreSettings,
    StoreState,
    has_delta_log,
    read_rule_sql,
    read_state,
)
from versiq.names import check_store_name


class LockTimeout(Exception):
    """Another writer holds the store's lock."""


@contextlib.contextmanager
def writer_lock(store_path: str, timeout_s: float) -> Iterator[None]:
    """Exclusive lock on ``<store>/_versiq/lock`` (released by the OS if the process dies)."""
    folder = os.path.join(store_path, PRIVATE_DIR)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_FILE)
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the whole block
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "unknown"
                    raise LockTimeout(
                        f"store {os.path.basename(store_path)!r} is locked by another writer "
                        f"({holder}); waited {timeout_s:g}s"
                    ) from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        handle.write(f"pid={os.getpid()} host={socket.gethostname()} since={since}")
        handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()


def is_store(path: str) -> bool:
    return has_delta_log(path) and DeltaTable.is_deltatable(path)


def existing_store_path(warehouse: str, store: str) -> str:
    """The path of an existing store; UsageError for an invalid name or a missing store."""
    try:
        check_store_name(store)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    path = os.path.join(warehouse, store)
    if not is_store(path):
        raise UsageError(f"no store {store!r} in warehouse {warehouse}")
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
        return [] if self.table is None else list(self.table.file_uris())


def open_store(path: str, requested: StoreSettings, explicit: set[str]) -> StoreHandle:
    """Open (or plan to create) a store; settings named in ``explicit`` must match a store's."""
    if not is_store(path):
        return StoreHandle(path, requested, None, StoreState())
    table = DeltaTable(path)
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
    for name, (have, want) in fields.items():
        if name in explicit and have != want:
            raise UsageError(
                f"store {os.path.basename(path)!r} was created with {name} = {have}; "
                f"it cannot be changed to {want} (create a new store instead)"
            )
    return StoreHandle(path, settings, table, read_state(path, table.version()))


def existing_versions(handle: StoreHandle, keys: pa.Table) -> pa.Table:
    """The current rows (read rule applied) of the given keys, via DuckDB over the snapshot files.

    Only the key column of the store is scanned in full; other columns are read for matching
    rows only, so the cost follows the batch far more than the table.
    """
    schema = pa.schema([f for f in STORE_SCHEMA if f.name != "bucket"])
    files = handle.data_files()
    if not files or keys.num_rows == 0:
        return schema.empty_table()
    con = duckdb.connect()
    try:
        con.register("batch_keys", keys)
        sql = (
            "SELECT key, valid_from, valid_to, value, tombstone, \"partition\", run "
            "FROM read_parquet($files) WHERE key IN (SELECT key FROM batch_keys) "
            + read_rule_sql(handle.settings.kind)
        )
        result = con.sql(sql, params={"files": files}).to_arrow_table()
    finally:
        con.close()
    return result.cast(schema)


def _commit_properties(state: StoreState, run: int) -> CommitProperties:
    return CommitProperties(
        custom_metadata={STATE_KEY: state.to_json()},
        app_transactions=[Transaction(APP_ID, run)],
    )


def table_schema(kind: str) -> pa.Schema:
    """The Delta schema of a store (versioned/timestamped) or stream table."""
    return STREAM_SCHEMA if kind == STREAM_KIND else STORE_SCHEMA


def file_schema(kind: str) -> pa.Schema:
    """The schema of the Parquet files of a store or stream table (without partition columns)."""
    return STREAM_FILE_SCHEMA if kind == STREAM_KIND else STORE_FILE_SCHEMA


#: The side tables of a store: directory -> schema. Each is committed after the store's own
#: commit with the same transaction id; the store state keeps their add actions until then.
SIDE_TABLES = {REJECTED_DIR: REJECTED_SCHEMA, CHANGELOG_DIR: CHANGELOG_SCHEMA, EMITTED_DIR: EMITTED_SCHEMA}


def validate_adds(adds: list[dict[str, Any]], root: str, partitioned: bool,
                  expected: pa.Schema | None = None) -> None:
    """Checks delta-rs does not make: unique paths, files present with the table's schema,
    full stats, partition membership."""
    if expected is None:
        expected = STORE_FILE_SCHEMA if partitioned else REJECTED_SCHEMA
    seen: set[str] = set()
    for add in adds:
        path = add["path"]
        if path in seen:
            raise RuntimeError(f"duplicate file path in commit: {path}")
        seen.add(path)
        if not os.path.isfile(os.path.join(root, path)):
            raise RuntimeError(f"file to commit is missing: {path}")
        stats = json.loads(add["stats"])
        if stats.get("numRecords", 0) <= 0 or not {"minValues", "maxValues", "nullCount"} <= set(stats):
            raise RuntimeError(f"file to commit has no records or incomplete stats: {path}")
        schema = pq.read_schema(os.path.join(root, path))
        if not schema.remove_metadata().equals(expected):
            raise RuntimeError(f"file {path} has schema {schema} instead of the table's {expected}")
        if partitioned:
            bucket = add["partition_values"]["bucket"]
            if not path.startswith(f"bucket={bucket}/") or add.get("bucket_min") != add.get("bucket_max") \
                    or str(add.get("bucket_min")) != bucket:
                raise RuntimeError(f"file {path} does not belong to partition bucket={bucket}")


def _actions(adds: list[dict[str, Any]]) -> list[AddAction | RemoveAction]:
    return list[AddAction | RemoveAction](_to_actions(adds))


def _to_actions(adds: list[dict[str, Any]]) -> list[AddAction]:
    return [
        AddAction(a["path"], int(a["size"]), a["partition_values"], int(a["modification_time"]), True,
                  a["stats"])
        for a in adds
    ]


def commit_store(handle: StoreHandle, adds: list[dict[str, Any]], state: StoreState) -> int:
    """Commit the run's data files and state in one Delta transaction; returns the new version."""
    kind = handle.settings.kind
    validate_adds(adds, handle.path, partitioned=True, expected=file_schema(kind))
    props = _commit_properties(state, state.run)
    if handle.table is None:
        create_table_with_add_actions(
            handle.path,
            Schema.from_arrow(table_schema(kind)),
            _to_actions(adds),
            mode="error",
            partition_by=STORE_PARTITION_COLUMNS,
            name=os.path.basename(handle.path),
            description=handle.settings.to_description(),
            commit_properties=props,
        )
        handle.table = DeltaTable(handle.path)
    else:
        handle.table.create_write_transaction(
            _actions(adds), mode="append", schema=table_schema(kind), partition_by=STORE_PARTITION_COLUMNS,
            commit_properties=props,
        )
        handle.table.update_incremental()
    handle.state = state
    return handle.table.version()


def rejected_path(store_path: str) -> str:
    return os.path.join(store_path, REJECTED_DIR)


def commit_side(store_path: str, side: str, run: int, adds: list[dict[str, Any]]) -> None:
    """Commit a run's files of a side table (``_rejected``, ``_changelog``, ``_emitted``) with
    the run's txn id; skipped when that run is already there (a rerun finishing a crashed run)."""
    path = os.path.join(store_path, side)
    schema = SIDE_TABLES[side]
    validate_adds(adds, path, partitioned=False, expected=schema)
    props = CommitProperties(app_transactions=[Transaction(APP_ID, run)])
    if not is_store(path):
        create_table_with_add_actions(
            path, Schema.from_arrow(schema), _to_actions(adds), mode="error",
            name=os.path.basename(store_path) + "." + side, commit_properties=props,
        )
        return
    table = DeltaTable(path)
    if (table.transaction_version(APP_ID) or 0) >= run:
        return
    table.create_write_transaction(_actions(adds), mode="append", schema=schema, commit_properties=props)


def commit_rejected(store_path: str, run: int, adds: list[dict[str, Any]]) -> None:
    commit_side(store_path, REJECTED_DIR, run, adds)


def _pending_sides(state: StoreState) -> list[tuple[str, list[dict[str, Any]]]]:
    """The side tables a run's state still holds add actions for, in commit order."""
    sides = ((REJECTED_DIR, state.rejected_adds), (CHANGELOG_DIR, state.changelog_adds),
             (EMITTED_DIR, state.emitted_adds))
    return [(side, adds) for side, adds in sides if adds]


def commit_pending_sides(store_path: str, state: StoreState) -> None:
    """Commit the side tables of the run ``state`` describes (after its store commit)."""
    for side, adds in _pending_sides(state):
        commit_side(store_path, side, state.run, adds)


def finish_pending_sides(handle: StoreHandle) -> bool:
    """Complete a run whose store commit landed but whose side-table commits did not."""
    state = handle.state
    if state.run == 0:
        return False
    finished = False
    for side, adds in _pending_sides(state):
        path = os.path.join(handle.path, side)
        if is_store(path) and (DeltaTable(path).transaction_version(APP_ID) or 0) >= state.run:
            continue
        commit_side(handle.path, side, state.run, adds)
        finished = True
    return finished
