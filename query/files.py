"""Small helpers shared by the store and stream readers: the newest version on disk, and
DuckDB -> Arrow (a Delta add action's file location is ``versiq.storage.data_file``)."""

from __future__ import annotations

import re
from typing import Any

import duckdb
import pyarrow as pa

from versiq import layout, storage

_LOG_FILE = re.compile(r"(\d{20})\.(?:json|checkpoint\.parquet|checkpoint\.\d+\.\d+\.parquet)\Z")


def arrow(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pa.Table:
    """Run ``sql`` with named ``params`` and return the result as an Arrow table."""
    rel = con.sql(sql, params=params)
    assert rel is not None
    tbl = rel.to_arrow_table()
    return tbl if isinstance(tbl, pa.Table) else pa.table(tbl)


def latest_version_on_disk(table_path: str) -> int:
    """The newest Delta version whose commit (or checkpoint) file exists; -1 when none."""
    best = -1
    try:
        entries = storage.listdir(layout.delta_log(table_path))
    except FileNotFoundError:
        return -1
    for name in entries:
        m = _LOG_FILE.match(name)
        if m:
            best = max(best, int(m.group(1)))
    return best
