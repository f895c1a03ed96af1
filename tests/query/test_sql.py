"""SQL for analysts (issue 16 item 9): ``versiq.sql.connect`` and ``versiq sql`` over a warehouse of
real Delta stores. A store's view holds exactly the versions a range read over all time could
return (the read rule applied, expired history left out, tombstones as deleted rows): the
reference model's; a stream's view its records in stream order; ``--snapshot-of`` pins a table;
the session reads nothing but its views and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import duckdb
import pytest

from tests.support.service import Warehouse, build_warehouse
from versiq import sql
from versiq.query.api import VersionedKeyQuery
from versiq.query.engine import Engine

pytestmark = pytest.mark.rule(22)


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build_warehouse(str(tmp_path_factory.mktemp("sql")))


def _model_rows(builder: Any) -> list[tuple[Any, ...]]:
    ref = builder.ref
    out = []
    for key in sorted(ref.versions):
        for v in ref.range(key, None, None, True, include_deleted=True):
            out.append((key, v.value, v.timestamp, v.valid_to, v.value is None))
    return sorted(out, key=lambda r: (r[0], r[2]))


def _normal(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [(k, None if v is None else json.dumps(json.loads(v), sort_keys=True), *rest) for k, v, *rest in rows]


def test_store_views_are_the_versions_reads_can_return(wh: Warehouse) -> None:
    con = sql.connect(wh.path)
    for builder in (wh.prices, wh.live):
        name = builder.path.rsplit("/", 1)[1]
        rows = con.sql(f'SELECT key, value, valid_from, valid_to, deleted FROM "{name}" '
                       "ORDER BY key, valid_from").fetchall()
        assert _normal(rows) == _normal(_model_rows(builder)), name
    # expired history of "expiring" (v1 ended at T0 + 1000, before the horizon) is not shown
    assert [r[0] for r in con.sql("SELECT value FROM prices WHERE key = 'expiring'").fetchall()] == ['"v2"']
    # a timestamped store: one row per key, its current value (what a latest read answers)
    with Engine(wh.path) as engine:
        latest = engine.get("sessions", VersionedKeyQuery("s-1")).record
    assert latest is not None
    assert con.sql("SELECT key, value, valid_from FROM sessions").fetchall() == [("s-1", latest.value,
                                                                                 latest.timestamp)]
    # a stream: its records in stream order (run, seq)
    runs = con.sql("SELECT run, seq FROM clicks").fetchall()
    assert runs == sorted(runs) and len(runs) > 0
    # JSON values work with DuckDB's JSON functions
    assert con.sql("SELECT max(CAST(json_extract(value, '$.price') AS DOUBLE)) FROM prices").fetchall() == [(2.0,)]


def test_the_session_reads_only_its_views_and_writes_nothing(wh: Warehouse, tmp_path: Any) -> None:
    con = sql.connect(wh.path)
    for statement in (f"COPY (SELECT 1) TO '{tmp_path}/x.csv'", "SELECT * FROM read_csv('/etc/passwd')",
                      f"SELECT * FROM read_parquet('{wh.prices.path}/**/*.parquet')",
                      f"ATTACH '{tmp_path}/db.duckdb'", "SET enable_external_access = true"):
        with pytest.raises(duckdb.Error):
            con.sql(statement).fetchall()
    assert not (tmp_path / "x.csv").exists()


def test_snapshot_of_pins_a_table(wh: Warehouse) -> None:
    [(first,)] = sql.connect(wh.path, {"clicks": 0}).sql("SELECT count(*) FROM clicks").fetchall()
    [(now,)] = sql.connect(wh.path).sql("SELECT count(*) FROM clicks").fetchall()
    assert 0 < first < now
    with pytest.raises(KeyError, match="nope"):
        sql.connect(wh.path, {"nope": 0})


def _versiq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "versiq.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_the_cli_runs_queries_and_a_shell(wh: Warehouse) -> None:
    out = _versiq("sql", "--warehouse", wh.path, "-c", "SELECT key, deleted FROM prices WHERE key = 'deleted' "
                  "ORDER BY valid_from", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == [{"key": "deleted", "deleted": False},
                                                                      {"key": "deleted", "deleted": True}]
    csv = _versiq("sql", "--warehouse", wh.path, "-c", "SELECT count(*) AS n FROM sessions", "--format", "csv")
    assert csv.stdout.splitlines() == ["\"n\"", "1"] or csv.stdout.splitlines() == ["n", "1"], csv.stdout
    shell = _versiq("sql", "--warehouse", wh.path, "--snapshot-of", "clicks=0",
                    stdin="SELECT count(*)\nFROM clicks;\nSELECT 42 AS answer;\n")
    assert shell.returncode == 0 and "42" in shell.stdout, shell.stderr
    bad = _versiq("sql", "--warehouse", wh.path, "-c", "SELECT * FROM nowhere")
    assert bad.returncode == 2 and "nowhere" in bad.stderr
    assert _versiq("sql", "--warehouse", wh.path, "--snapshot-of", "clicks", "-c", "SELECT 1").returncode == 2


def test_a_table_whose_first_commit_was_killed_is_no_view(wh: Warehouse) -> None:
    """A ``_delta_log`` without a commit (a writer killed inside a table's first commit) is not a
    table yet (``layout.has_table``): no view, and the other tables' views are unaffected."""
    import os
    import shutil

    def views() -> set[str]:
        con = sql.connect(wh.path)
        return {name for (name,) in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}

    before = views()
    assert {"prices", "clicks"} <= before
    half = os.path.join(wh.path, "half_written")
    os.makedirs(os.path.join(half, "_delta_log"))
    try:
        assert views() == before
    finally:
        shutil.rmtree(half)
