"""SQL for analysts: a DuckDB connection in which every store of a warehouse is a
view of its resolved versions and every stream a view of its records, from one snapshot each.

    con = versiq.sql.connect("warehouse")          # or s3://bucket/prefix
    con.sql("SELECT key, value FROM prices WHERE valid_to IS NULL").show()

A store's view has the columns ``key, value, valid_from, valid_to, deleted``: the read rule of
``versiq.layout`` applied (one row per version), tombstones as rows with ``deleted`` true and no
value, and nothing the HTTP API would not show: history that ended at or before its partition's
retention horizon is left out (docs/semantics.md, rule 22). A timestamped store's view has one
row per key (its current value or tombstone). A stream's view has ``key, value, timestamp, run,
seq`` in stream order. ``value`` is the record's JSON text (use DuckDB's JSON functions on it).

The session is read-only: each table's data files are handed to DuckDB as Arrow datasets
(``versiq.storage``: local files or S3 objects), and then DuckDB's external access is turned off,
so a query can read those views and nothing else, and can write no file (``COPY``, ``ATTACH``,
``read_csv('/etc/passwd')`` are refused).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import duckdb
import pyarrow.dataset as ds

from versiq import layout, names, storage

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _dataset(table_path: str, files: list[str], schema: object) -> ds.Dataset:
    if storage.is_s3(table_path):
        fs = storage.s3_filesystem()
        return ds.dataset([f.split("://", 1)[1] for f in files], schema=schema, format="parquet", filesystem=fs)
    return ds.dataset(files, schema=schema, format="parquet")


def _store_view(kind: str, history_retention_ms: int, state: layout.StoreState, raw: str) -> str:
    """The SELECT of a store's view over its raw rows ``raw``."""
    columns = 'key, valid_from, valid_to, value, tombstone, "partition", run'
    visible = "TRUE"
    if kind == "versioned" and state.stream_time:
        visible = layout.answerable_sql(state.stream_time, history_retention_ms)
    return (f"SELECT key, value, valid_from, valid_to, tombstone AS deleted FROM "
            f"(SELECT {columns} FROM {raw} {layout.read_rule_sql(kind)}) WHERE {visible}")


def connect(warehouse: str, snapshots: Mapping[str, int] | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection with one view per store and stream of ``warehouse`` (its
    current snapshot, or the one ``snapshots`` names). A table whose name is not a plain SQL
    identifier is still a view: quote it (``SELECT * FROM "prices-eu"``). KeyError for a name
    in ``snapshots`` that is not in the warehouse."""
    warehouse = storage.normalize(warehouse)
    pinned = dict(snapshots or {})
    con = storage.duckdb_connect(private=True)  # its views and settings are its own
    found: set[str] = set()
    for name, path in storage.subdirectories(warehouse):
        if not names.is_valid_store_name(name) or not layout.has_table(path):
            continue
        try:
            table = storage.delta_table(path, pinned.get(name))
            settings = layout.StoreSettings.from_description(table.metadata().description)
        except (ValueError, KeyError, TypeError):  # not a versiq table (or an unreadable one): no view
            continue
        found.add(name)
        version = table.version()
        files = list(table.file_uris())
        stream = settings.kind == layout.STREAM_KIND
        schema = layout.STREAM_SCHEMA if stream else layout.STORE_SCHEMA
        raw = "_raw_" + re.sub(r"\W", "_", name)
        con.register(raw, _dataset(path, files, schema))
        if stream:
            select = f"SELECT key, value, timestamp, run, seq FROM {raw} ORDER BY run, seq"
        else:
            state = layout.read_state(path, version)
            select = _store_view(settings.kind, settings.history_retention_ms, state, raw)
        con.sql(f"CREATE VIEW {_quoted(name)} AS {select}")
    missing = sorted(set(pinned) - found)
    if missing:
        raise KeyError(f"no store or stream named {', '.join(map(repr, missing))} in {warehouse}")
    con.sql("SET enable_external_access = false")
    return con
