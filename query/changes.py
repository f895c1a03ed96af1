"""The change feed of a store: what each commit after a snapshot changed.

A run's commit appends rows to the store (``versiq.layout``): the versions the run added, the
versions whose ``validTo`` it moved (written again with the new one), and tombstones. Those rows
are exactly the data files the commit added, so the changes of commit ``c`` are read from its
own add actions (``query.history``), never from a later snapshot in which compaction may have
merged them away. Commits of ``maintain`` (compaction, vacuum) and ``settings`` change no answer
and contribute nothing. Changes are ordered by (snapshot, key, validFrom).

Replaying the changes of ``(V, W]`` over snapshot V, upserting each by (key, validFrom), gives
snapshot W's versions (before W's retention horizon drops expired history from what reads show).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from versiq import storage
from versiq.query.history import DERIVE, INGEST, Commit


@dataclass(frozen=True)
class Change:
    snapshot: int
    key: str
    timestamp: int
    valid_to: int | None
    #: The version's JSON text; None for a tombstone.
    value: str | None

    @property
    def deleted(self) -> bool:
        return self.value is None

    def position(self) -> tuple[int, str, int]:
        return self.snapshot, self.key, self.timestamp


def commit_batches(con: duckdb.DuckDBPyConnection, table_path: str, commit: Commit,
                   batch_rows: int = 10_000) -> Iterator[pa.RecordBatch]:
    """All changes of one commit as Arrow batches (``key, timestamp, valid_to, value``; value
    null for a tombstone) in (key, validFrom) order: one scan, for the streamed feed."""
    if commit.operation not in (INGEST, DERIVE) or not commit.added_files:
        return
    files = [storage.data_file(table_path, p) for p in commit.added_files]
    reader = con.sql(
        "SELECT key, valid_from AS timestamp, valid_to, CASE WHEN tombstone THEN NULL ELSE value END AS value "
        "FROM read_parquet($files, hive_partitioning = false) ORDER BY key, valid_from",
        params={"files": files}).to_arrow_reader(batch_rows)
    yield from reader


def commit_changes(con: duckdb.DuckDBPyConnection, table_path: str, commit: Commit,
                   after: tuple[str, int] | None = None, limit: int | None = None) -> list[Change]:
    """The changes one commit made, by (key, validFrom), after ``after`` and at most ``limit`` of
    them (DuckDB sorts and cuts, so a page of a commit of millions of rows costs one scan, not a
    Python object per row); none for maintenance commits. A run writes at most one row per
    (key, validFrom) (``versiq.layout``), so the commit's files hold each change once."""
    if commit.operation not in (INGEST, DERIVE) or not commit.added_files:
        return []
    files = [storage.data_file(table_path, p) for p in commit.added_files]
    where = ""
    params: dict[str, object] = {"files": files}
    if after is not None:
        where = "WHERE key > $key OR (key = $key AND valid_from > $after)"
        params = {"files": files, "key": after[0], "after": after[1]}
    cut = "" if limit is None else f"LIMIT {int(limit)}"
    rows = con.sql(
        "SELECT key, valid_from, valid_to, CASE WHEN tombstone THEN NULL ELSE value END "
        f"FROM read_parquet($files, hive_partitioning = false) {where} ORDER BY key, valid_from {cut}",
        params=params).fetchall()
    return [Change(commit.snapshot, k, int(vf), None if vt is None else int(vt), v) for k, vf, vt, v in rows]
