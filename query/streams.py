"""Streams: append-only event logs kept as Delta tables (``versiq.layout.STREAM_SCHEMA``).

A stream is a warehouse child whose settings description has ``"kind": "stream"``: a source
stream or the output of a stream-table join. Its rows are records ``(key, value, timestamp)``
tagged with their stream position ``(run, seq)``, unique within the stream; *stream order* is
``(run, seq)`` ascending. Rows are partitioned by ``bucket = bucket_of(key, buckets)``.

Reads never use a serving index: :meth:`StreamSnapshot.page` runs one DuckDB query over the
Parquet files that delta-rs lists for the snapshot, after pruning them with the add actions'
partition value (the key's bucket) and statistics (min/max ``key``, ``timestamp`` and
``run``). A page reads ``limit + 1`` records so ``resume_after`` is None exactly when no record
follows; the next page continues strictly after ``resume_after`` in the query's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
from deltalake import DeltaTable

from versiq import layout, storage
from versiq.query.api import InvalidQuery, SnapshotGone
from versiq.query.files import arrow


@dataclass(frozen=True)
class StreamRecordsQuery:
    """The records of a stream, optionally of one ``key`` and with ``from_time <= timestamp <=
    to_time`` (None = unbounded), in stream order (``ascending``) or reversed."""

    key: str | None = None
    from_time: int | None = None
    to_time: int | None = None
    ascending: bool = True


@dataclass(frozen=True, order=True)
class StreamPosition:
    """A record's place in stream order."""

    run: int
    sequence: int


@dataclass(frozen=True)
class StreamRecord:
    """One stream record; ``value`` is compact JSON text, None for a null value."""

    key: str
    value: str | None
    timestamp: int
    run: int
    sequence: int

    @property
    def position(self) -> StreamPosition:
        return StreamPosition(self.run, self.sequence)


@dataclass(frozen=True)
class StreamRecordsPage:
    records: list[StreamRecord]
    snapshot: int
    #: Position of the last record returned when more records follow, else None.
    resume_after: StreamPosition | None


@dataclass(frozen=True)
class StreamInfo:
    name: str
    snapshot: int
    buckets: int
    #: The last run committed to the stream at that snapshot (None: no run yet).
    last_run: int | None
    #: ``files`` and ``records`` (from the add actions).
    counts: dict[str, int] = field(default_factory=dict)
    #: Smallest / largest record timestamp (from the file statistics; None when empty).
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    #: Provenance of a derived stream (``StoreState.inputs`` / ``.sources``); empty otherwise.
    inputs: dict[str, int] = field(default_factory=dict)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- files
@dataclass(frozen=True)
class StreamFile:
    """One data file of a stream snapshot with the statistics used for pruning (None =
    unknown, never pruned on)."""

    path: str  # absolute local path
    bucket: int
    num_records: int
    min_key: str | None = None
    max_key: str | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    min_run: int | None = None
    max_run: int | None = None

    def may_match(self, query: StreamRecordsQuery, after: StreamPosition | None) -> bool:
        key = query.key
        if key is not None:
            if not layout.may_hold_key(key, self.min_key, self.max_key):
                return False
        if query.from_time is not None and self.max_timestamp is not None and self.max_timestamp < query.from_time:
            return False
        if query.to_time is not None and self.min_timestamp is not None and self.min_timestamp > query.to_time:
            return False
        if after is not None:
            if query.ascending and self.max_run is not None and self.max_run < after.run:
                return False
            if not query.ascending and self.min_run is not None and self.min_run > after.run:
                return False
        return True


def stream_files(dt: DeltaTable, table_path: str) -> tuple[StreamFile, ...]:
    """The data files of ``dt``'s snapshot (``layout.bucket_files``), sorted by path, with the
    key, timestamp and run statistics reads prune by."""
    stats = ("num_records", "min.key", "max.key", "min.timestamp", "max.timestamp", "min.run", "max.run")
    out = [StreamFile(path=f["file"], bucket=bucket, num_records=int(f["num_records"] or 0),
                      min_key=f["min.key"], max_key=f["max.key"],
                      min_timestamp=f["min.timestamp"], max_timestamp=f["max.timestamp"],
                      min_run=f["min.run"], max_run=f["max.run"])
           for bucket, files in layout.bucket_files(dt, table_path, stats).items() for f in files]
    out.sort(key=lambda f: f.path)
    return tuple(out)


def check_query(query: StreamRecordsQuery, limit: int) -> None:
    """InvalidQuery for an empty key, ``from_time > to_time`` or a page size below 1."""
    if query.key is not None and (not isinstance(query.key, str) or query.key == ""):
        raise InvalidQuery("the key must not be empty")
    if query.from_time is not None and query.to_time is not None and query.from_time > query.to_time:
        raise InvalidQuery(f"from ({query.from_time}) is after to ({query.to_time})")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidQuery(f"invalid page size {limit!r}")


# ---------------------------------------------------------------------------------- snapshots
@dataclass(frozen=True)
class StreamSnapshot:
    """One readable snapshot of a stream: its settings, state and file list (immutable)."""

    name: str
    snapshot: int
    settings: layout.StoreSettings
    state: layout.StoreState
    files: tuple[StreamFile, ...] = ()

    @staticmethod
    def open(name: str, path: str, settings: layout.StoreSettings, dt: DeltaTable) -> StreamSnapshot:
        """The snapshot ``dt`` is at (state via ``layout.read_state``)."""
        version = dt.version()
        return StreamSnapshot(
            name=name,
            snapshot=version,
            settings=settings,
            state=layout.read_state(path, version),
            files=stream_files(dt, path),
        )

    def info(self) -> StreamInfo:
        mins = [f.min_timestamp for f in self.files if f.num_records]
        maxs = [f.max_timestamp for f in self.files if f.num_records]
        known = bool(mins) and all(t is not None for t in mins + maxs)
        return StreamInfo(
            name=self.name,
            snapshot=self.snapshot,
            buckets=self.settings.buckets,
            last_run=self.state.run or None,
            counts={"files": len(self.files), "records": sum(f.num_records for f in self.files)},
            min_timestamp=min(t for t in mins if t is not None) if known else None,
            max_timestamp=max(t for t in maxs if t is not None) if known else None,
            inputs=dict(self.state.inputs),
            sources={k: dict(v) for k, v in self.state.sources.items()},
        )

    def page(
        self,
        con: duckdb.DuckDBPyConnection,
        query: StreamRecordsQuery,
        resume_after: StreamPosition | None,
        limit: int,
    ) -> StreamRecordsPage:
        """Up to ``limit`` records after ``resume_after`` (exclusive) in the query's order."""
        check_query(query, limit)
        bucket = None if query.key is None else layout.bucket_of(query.key, self.settings.buckets)
        files = [
            f.path for f in self.files
            if (bucket is None or f.bucket == bucket) and f.num_records and f.may_match(query, resume_after)
        ]
        if not files:
            return StreamRecordsPage([], self.snapshot, None)
        where: list[str] = []
        params: dict[str, Any] = {"files": files, "n": limit + 1}
        if query.key is not None:
            where.append("key = $key")
            params["key"] = query.key
        if query.from_time is not None:
            where.append('"timestamp" >= $lo')
            params["lo"] = query.from_time
        if query.to_time is not None:
            where.append('"timestamp" <= $hi')
            params["hi"] = query.to_time
        op = ">" if query.ascending else "<"
        if resume_after is not None:
            where.append(f"(run {op} $run OR (run = $run AND seq {op} $seq))")
            params["run"] = resume_after.run
            params["seq"] = resume_after.sequence
        direction = "ASC" if query.ascending else "DESC"
        sql = (
            'SELECT key, value, "timestamp", run, seq FROM read_parquet($files, hive_partitioning = false)'
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY run {direction}, seq {direction} LIMIT $n"
        )
        try:
            tbl = arrow(con, sql, params)
        except duckdb.IOException as exc:
            raise SnapshotGone(f"snapshot {self.snapshot} of stream {self.name!r} is gone: "
                               f"{storage.error_line(exc)}") from exc
        keys = tbl.column("key").to_pylist()
        values = tbl.column("value").to_pylist()
        stamps = tbl.column("timestamp").to_pylist()
        runs = tbl.column("run").to_pylist()
        seqs = tbl.column("seq").to_pylist()
        records = [
            StreamRecord(keys[i], values[i], int(stamps[i]), int(runs[i]), int(seqs[i]))
            for i in range(min(limit, tbl.num_rows))
        ]
        more = tbl.num_rows > limit
        return StreamRecordsPage(records, self.snapshot, records[-1].position if more else None)
