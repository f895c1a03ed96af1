"""A foreign-key join's subscriptions: which left keys point at each right key (KIP-213's
subscription store), persisted as the join table's ``_subscriptions`` side table.

A right-side change re-joins every left row whose current foreign key is the changed key
(docs/semantics.md, rule 16). The left table cannot answer that without evaluating the foreign
key of every one of its rows, so each pass appends the pointers its left changes moved
(``SUBSCRIPTIONS_SCHEMA``: from run ``run`` on, ``key`` points at ``foreign_key``), and a later
pass asks the side table for the keys of the right keys that changed: two small DuckDB queries
over (foreign key, key) pairs, however large the left table.

A table built before the side table existed has none: its first pass builds the pointers from
the whole left table once (``build``) and writes them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from versiq import storage
from versiq.layout import SUBSCRIPTIONS_DIR, SUBSCRIPTIONS_SCHEMA, has_table


class Subscriptions:
    """The pointers of one foreign-key join table during a pass: what its snapshot's run left
    in the side table, overlaid with the moves of this pass."""

    def __init__(self, table_path: str | None, run: int | None,
                 build: Callable[[], Iterable[tuple[str, str]]]) -> None:
        """``table_path``/``run``: the join table and the run of the snapshot the pass starts
        from (None: no snapshot, nothing persisted yet); ``build``: every (key, foreign key) of
        the left table, for a table without a side table."""
        self._path = None if table_path is None else storage.join(table_path, SUBSCRIPTIONS_DIR)
        self._run = run or 0
        self._build = build
        #: key -> foreign key (None: none) for the keys whose pointer this pass set
        self.moves: dict[str, str | None] = {}
        self._loaded: dict[str, set[str]] = {}  # foreign key -> persisted keys pointing at it
        self._all: dict[str, set[str]] | None = None  # the whole index, when built from the left table
        self.rebuilt = False
        if self._path is not None and run is not None and not has_table(self._path):
            self._build_all()

    def _build_all(self) -> None:
        self._all = {}
        for key, foreign_key in self._build():
            self._all.setdefault(foreign_key, set()).add(key)
        self.rebuilt = True

    def moved(self, key: str, foreign_key: str | None) -> None:
        """``key`` points at ``foreign_key`` from now on."""
        self.moves[key] = foreign_key

    def load(self, foreign_keys: Iterable[str]) -> None:
        """Read the persisted keys of ``foreign_keys`` (bulk, before the pass needs them)."""
        wanted = sorted({f for f in foreign_keys if f not in self._loaded})
        if not wanted or self._all is not None:
            return
        found: dict[str, set[str]] = {f: set() for f in wanted}
        if self._path is not None and has_table(self._path):
            files = list(storage.delta_table(self._path).file_uris())
            if files:
                con = storage.duckdb_connect(self._path)
                try:
                    con.register("wanted", pa.table({"foreign_key": pa.array(wanted, pa.string())}))
                    rows = con.sql(
                        "WITH candidates AS (SELECT DISTINCT key FROM read_parquet($files) "
                        "WHERE run <= $run AND foreign_key IN (SELECT foreign_key FROM wanted)) "
                        "SELECT foreign_key, key FROM read_parquet($files) "
                        "WHERE run <= $run AND key IN (SELECT key FROM candidates) "
                        "QUALIFY row_number() OVER (PARTITION BY key ORDER BY run DESC) = 1",
                        params={"files": files, "run": self._run}).fetchall()
                finally:
                    con.close()
                for foreign_key, key in rows:
                    if foreign_key in found:
                        found[foreign_key].add(key)
        self._loaded.update(found)

    def subscribers(self, foreign_key: str) -> list[str]:
        """The left keys pointing at ``foreign_key`` now, sorted."""
        if self._all is not None:
            persisted = self._all.get(foreign_key, set())
        else:
            self.load([foreign_key])
            persisted = self._loaded[foreign_key]
        keys = {k for k in persisted if k not in self.moves}
        keys.update(k for k, f in self.moves.items() if f == foreign_key)
        return sorted(keys)

    def rows(self, run: int) -> pa.Table:
        """The side table's rows of this pass (``SUBSCRIPTIONS_SCHEMA``): every pointer it
        moved; every pointer when it built them from the left table."""
        pointers = dict(self.moves)
        if self._all is not None:
            for foreign_key, keys in self._all.items():
                for key in keys:
                    pointers.setdefault(key, foreign_key)
        ordered = sorted(pointers)
        return pa.table({"foreign_key": [pointers[k] for k in ordered], "key": ordered, "run": [run] * len(ordered)},
                        schema=SUBSCRIPTIONS_SCHEMA)
