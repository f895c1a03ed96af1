"""``versiq maintain``: compaction, checkpoint and vacuum of one store.

- **Compaction** rewrites each bucket that has more than one file (or superseded rows) as one
  file with exactly the rows the read rule selects (``versiq.layout``), sorted by
  (key, valid_from), and drops history that no query can return any more: versions whose
  ``valid_to`` is at or before the horizon of their partition (docs/semantics.md, Retention edges:
  such history is never returned, and no later record can touch it, since any record at or
  before it is late). The commit carries the unchanged store state, so readers and later runs
  see the same store. The commit is a plain Delta remove+add: old snapshots stay readable until
  vacuum.
- **Checkpoint** writes a Delta checkpoint so readers load the log quickly.
- **Vacuum** deletes files removed longer ago than ``VACUUM_RETENTION_HOURS`` (1 hour = the
  default page-token lifetime of the service, so a token's pinned snapshot stays readable for
  its whole life; set ``VERSIQ_VACUUM_RETENTION_HOURS`` to keep old snapshots longer), and
  files no commit ever referenced (left by a killed ingest or maintain, or a failed write) once
  they are older than the same retention: delta-rs's *full* vacuum, in the store table and in
  each side table (``_rejected``, ``_changelog``, ``_emitted``). This never touches a file a
  writer may still commit: maintain holds the store's writer lock, so no ingest of the store
  is between writing its files and committing them; a run's side-table files that a crash left
  uncommitted are committed first (``finish_pending_sides``), exactly as the next ingest would;
  and the retention spares anything written in the last hour whatever its origin.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import duckdb
from deltalake import DeltaTable
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from versiq.ingest.store import (
    SIDE_TABLES,
    existing_store_path,
    finish_pending_sides,
    is_store,
    open_store,
    writer_lock,
)
from versiq.ingest.writer import file_stats
from versiq.layout import (
    STATE_KEY,
    STORE_FILE_SCHEMA,
    STORE_PARTITION_COLUMNS,
    STORE_SCHEMA,
    STREAM_KIND,
    StoreSettings,
    read_rule_sql,
    read_state,
)

log = logging.getLogger("versiq.maintain")

VACUUM_RETENTION_HOURS = int(os.environ.get("VERSIQ_VACUUM_RETENTION_HOURS", "1"))
COMPACT_FILES_PER_BUCKET = 4


def maintain_store(warehouse: str, store: str, lock_timeout_s: float = 60.0) -> dict[str, Any]:
    path = existing_store_path(warehouse, store)
    with writer_lock(path, lock_timeout_s):
        table = DeltaTable(path)
        handle = open_store(path, StoreSettings.from_description(table.metadata().description), set())
        if finish_pending_sides(handle):  # their files are referenced before any full vacuum
            log.info("store %s: completed the side-table commits of run %d", store, handle.state.run)
        result = compact(path)
        table = DeltaTable(path)
        table.create_checkpoint()
        # vacuum may commit too: carry the state so the newest commit always has it
        state = read_state(path, table.version())
        removed = table.vacuum(retention_hours=VACUUM_RETENTION_HOURS, dry_run=False,
                               enforce_retention_duration=False, full=True,
                               commit_properties=CommitProperties(custom_metadata={STATE_KEY: state.to_json()}))
        side_removed = 0
        for side in SIDE_TABLES:
            side_path = os.path.join(path, side)
            if is_store(side_path):
                side_removed += len(DeltaTable(side_path).vacuum(
                    retention_hours=VACUUM_RETENTION_HOURS, dry_run=False, enforce_retention_duration=False,
                    full=True))
        result.update(checkpoint=table.version(), vacuumed_files=len(removed), vacuumed_side_files=side_removed)
        return result


def compact_if_due(warehouse: str, store: str, lock_timeout_s: float) -> dict[str, Any] | None:
    """Compact when the store has accumulated several files per bucket (continuous mode)."""
    path = os.path.join(warehouse, store)
    if not is_store(path):
        return None
    table = DeltaTable(path)
    settings = StoreSettings.from_description(table.metadata().description)
    if len(table.file_uris()) <= COMPACT_FILES_PER_BUCKET * settings.buckets:
        return None
    return maintain_store(warehouse, store, lock_timeout_s)


def compact(path: str) -> dict[str, Any]:
    """Rewrite every bucket with superseded rows or several files; one commit for all."""
    table = DeltaTable(path)
    settings = StoreSettings.from_description(table.metadata().description)
    version = table.version()
    state = read_state(path, version)
    if settings.kind == STREAM_KIND:  # append-only: every record stays; checkpoint + vacuum only
        return {"store": os.path.basename(path), "buckets_rewritten": 0, "rows_before": None,
                "rows_after": None, "snapshot": version, "stream": True}
    adds_table = DeltaTable(path).get_add_actions(flatten=True)
    import pyarrow as pa

    actions = pa.table(adds_table).to_pylist()
    by_bucket: dict[int, list[dict[str, Any]]] = {}
    for action in actions:
        by_bucket.setdefault(int(action["partition.bucket"]), []).append(action)
    horizon_sql = "NULL"
    if settings.kind == "versioned" and state.stream_time:
        cases = " ".join(f"WHEN {p} THEN {t - settings.history_retention_ms}"
                         for p, t in sorted(state.stream_time.items()))
        horizon_sql = f"CASE \"partition\" {cases} END"
    new_actions: list[AddAction | RemoveAction] = []
    rewritten = rows_before = rows_after = 0
    con = duckdb.connect()
    try:
        for bucket, files in sorted(by_bucket.items()):
            full = [os.path.join(path, f["path"]) for f in files]
            count = sum(int(f["num_records"]) for f in files)
            sql = (
                "SELECT key, valid_from, valid_to, value, tombstone, \"partition\", run "
                "FROM read_parquet($files) " + read_rule_sql(settings.kind)
            )
            if settings.kind == "versioned":
                sql = (f"SELECT * FROM ({sql}) WHERE valid_to IS NULL OR {horizon_sql} IS NULL "
                       f"OR valid_to > {horizon_sql}")
            resolved = con.sql(sql + " ORDER BY key, valid_from", params={"files": full}).to_arrow_table()
            if len(files) == 1 and resolved.num_rows == count:
                continue
            rewritten += 1
            rows_before += count
            rows_after += resolved.num_rows
            now = int(time.time() * 1000)
            for f in files:
                new_actions.append(RemoveAction(f["path"], False, now, int(f["size_bytes"]),
                                                {"bucket": str(bucket)}))
            if resolved.num_rows:
                import pyarrow.parquet as pq

                data = resolved.cast(STORE_FILE_SCHEMA)
                rel = f"bucket={bucket}/compact-{version:08d}-{os.urandom(8).hex()}.parquet"
                target = os.path.join(path, rel)
                pq.write_table(data, target + ".tmp", row_group_size=4096, compression="zstd")
                os.replace(target + ".tmp", target)
                new_actions.append(AddAction(rel, os.path.getsize(target), {"bucket": str(bucket)}, now,
                                             False, file_stats(data)))
    finally:
        con.close()
    if new_actions:
        table.create_write_transaction(
            new_actions, mode="append", schema=STORE_SCHEMA, partition_by=STORE_PARTITION_COLUMNS,
            commit_properties=CommitProperties(custom_metadata={STATE_KEY: state.to_json()}),
        )
    log.info("compacted %d bucket(s): %d rows -> %d", rewritten, rows_before, rows_after)
    return {"store": os.path.basename(path), "buckets_rewritten": rewritten, "rows_before": rows_before,
            "rows_after": rows_after, "snapshot": DeltaTable(path).version()}
