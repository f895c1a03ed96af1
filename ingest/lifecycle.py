"""Dropping a store, stream or derived table, and rebuilding a derived table (``versiq drop``,
``versiq rebuild``; docs/contract.md, "Drop and rebuild").

Who reads what: every derived commit records the snapshot of each direct input it was computed
from (``StoreState.inputs``), so the warehouse itself says which derived tables read a table:
the newest state of each derived table names its inputs. No pipeline file is needed to find them.

How a table is dropped, so that no reader ever sees a half-deleted one: under the table's writer
lock, its Delta log goes first, oldest file first (a commit, then the checkpoint of the same
version), ``_last_checkpoint`` and the rest of the log last. A reader of the log at any moment
therefore finds either the whole newest snapshot (what the remaining checkpoint and commits
give) or no protocol and metadata at all, which it cannot read (delta-rs refuses it): never an
older snapshot. Once the log is gone the table is no longer a table (``layout.has_delta_log``)
and the service forgets it; the rest of its directory or prefix (data files, side tables, the
lock) is removed after that. A drop killed at any point leaves a directory without a complete
log, and running it again completes it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from versiq import layout, storage
from versiq.ingest.errors import UsageError
from versiq.ingest.store import writer_lock
from versiq.layout import STREAM_KIND, StoreSettings, has_table, read_state
from versiq.names import check_store_name, unknown_name

log = logging.getLogger("versiq.ingest")

#: A Delta log file named by its version: ``<20 digits>.json``, ``.crc``, ``.checkpoint.parquet``.
_VERSIONED = re.compile(r"^(\d{20})\.(.+)$")


@dataclass(frozen=True)
class TableInfo:
    """A table of the warehouse as a drop sees it: its kind and the inputs its newest state names."""

    name: str
    path: str
    kind: str
    derived: bool
    inputs: tuple[str, ...] = ()


@dataclass
class DropResult:
    """What a drop removed, dependents first (``dropped``), for the command's summary."""

    dropped: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"dropped": list(self.dropped)}


# -- what the warehouse holds -------------------------------------------------------------------

def table_info(name: str, path: str) -> TableInfo | None:
    """The table at ``path`` (None when it is not a readable versiq table: being created, half
    dropped, or not versiq's)."""
    if not has_table(path):
        return None
    try:
        table = storage.delta_table(path)
        settings = StoreSettings.from_description(table.metadata().description)
        state = read_state(path, table.version())
    except (OSError, ValueError, Exception):  # noqa: BLE001 - an unreadable table reads nothing
        return None
    derived = state.definition is not None or bool(state.inputs)
    return TableInfo(name, path, settings.kind, derived, tuple(sorted(state.inputs)) if derived else ())


def warehouse_tables(warehouse: str) -> dict[str, TableInfo]:
    """Every readable table of the warehouse, by name."""
    out: dict[str, TableInfo] = {}
    for name, path in storage.subdirectories(warehouse):
        if name.startswith(("_", ".")):
            continue
        info = table_info(name, path)
        if info is not None:
            out[name] = info
    return out


def dependents(tables: dict[str, TableInfo], names: Iterable[str]) -> list[str]:
    """The derived tables that read any of ``names``, directly or through other derived tables,
    ordered so that every table comes before the tables it reads (the order to drop them in)."""
    wanted = set(names)
    found: list[str] = []

    def visit(name: str) -> None:
        for reader in sorted(t.name for t in tables.values() if name in t.inputs):
            if reader in wanted or reader in found:
                continue
            visit(reader)
            found.insert(0, reader)

    for name in sorted(wanted):
        visit(name)
    return _readers_first(tables, found)


def _readers_first(tables: dict[str, TableInfo], names: list[str]) -> list[str]:
    """``names`` ordered so that a table comes before every table it reads (a topological order
    of the reverse input graph; ties by name)."""
    left = set(names)
    out: list[str] = []
    while left:
        ready = sorted(n for n in left if not any(n in tables[o].inputs for o in left if o != n))
        if not ready:  # a cycle cannot be committed; keep going rather than loop for ever
            ready = sorted(left)
        out.extend(ready)
        left -= set(ready)
    return out


# -- dropping -----------------------------------------------------------------------------------

def _target(warehouse: str, name: str, want_table: bool, tables: dict[str, TableInfo]) -> str:
    """The path of what ``--store``/``--table`` names; a UsageError for an invalid name, one of
    the other flag's kind, or nothing under that name. A directory without a readable log (a
    drop that was interrupted, a table whose first commit never landed) is a target too:
    dropping it again completes it."""
    try:
        check_store_name(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    path = layout.table_path(warehouse, name)
    info = tables.get(name)
    if info is None:
        if storage.isdir(path):
            return path  # an interrupted drop, a table whose first commit never landed, or an unreadable one
        flag = "table" if want_table else "store"
        raise UsageError(unknown_name(flag, name, sorted(tables), f"warehouse {warehouse}"))
    is_table = info.derived or info.kind == STREAM_KIND
    if want_table and not is_table:
        raise UsageError(f"{name!r} is a source store, not a derived table or stream: use --store {name}")
    if not want_table and info.kind == STREAM_KIND:
        raise UsageError(f"{name!r} is a stream: use --table {name}")
    return path


def drop(warehouse: str, name: str, *, table: bool = False, cascade: bool = False,
         lock_timeout_s: float = 60.0) -> DropResult:
    """Drop store (or, with ``table``, derived table or stream) ``name`` of ``warehouse``.

    Refused (``UsageError``, naming them) while derived tables read it, unless ``cascade``: then
    they are dropped too, each before the tables it reads. Each table is dropped under its own
    writer lock (``drop_path``)."""
    warehouse = storage.normalize(warehouse)
    tables = warehouse_tables(warehouse)
    path = _target(warehouse, name, table, tables)
    readers = dependents(tables, [name])
    if readers and not cascade:
        raise UsageError(f"{name!r} is read by derived table(s) {', '.join(readers)}: drop them first, "
                         "or give --cascade to drop them too")
    result = DropResult()
    for reader in readers:
        drop_path(tables[reader].path, lock_timeout_s)
        result.dropped.append(reader)
    drop_path(path, lock_timeout_s)
    result.dropped.append(name)
    return result


def drop_path(path: str, lock_timeout_s: float) -> None:
    """Remove the table at ``path`` under its writer lock: its Delta logs first (``delete_log``),
    then everything else; the lock last (a local lock file is unlinked while held, an S3 lease
    is deleted by its release). A writer that was waiting for the lock then finds no table and
    creates a new one. Completes a drop that was interrupted."""
    private = storage.join(path, layout.PRIVATE_DIR)
    with writer_lock(path, lock_timeout_s):
        delete_log(layout.delta_log(path))
        for side in (layout.REJECTED_DIR, layout.CHANGELOG_DIR, layout.EMITTED_DIR, layout.SUBSCRIPTIONS_DIR):
            delete_log(layout.delta_log(storage.join(path, side)))
        storage.delete_children(path, keep={layout.PRIVATE_DIR})
        storage.delete_children(private, keep={layout.LOCK_FILE})
        if not storage.is_s3(path):
            storage.delete_file(storage.join(private, layout.LOCK_FILE))
    storage.remove_empty_dir(private)
    storage.remove_empty_dir(path)
    log.info("dropped %s", storage.basename(path))


def delete_log(log_dir: str) -> None:
    """Delete a Delta log so that it never reads as an older snapshot (module docstring): its
    versioned files in version order (a commit before the checkpoint of its version), then the
    rest of the folder (``_last_checkpoint``, Delta's staging folders)."""
    try:
        names = storage.listdir(log_dir)
    except FileNotFoundError:
        return
    for file_name in sorted((n for n in names if _VERSIONED.match(n)), key=_log_order):
        storage.delete_file(storage.join(log_dir, file_name))
    storage.delete_tree(log_dir)


def _log_order(file_name: str) -> tuple[int, int, str]:
    """Sort key of a versioned Delta log file for ``delete_log``: by version, the commit
    (``.json``) before anything else of its version."""
    match = _VERSIONED.match(file_name)
    assert match is not None
    return (int(match.group(1)), 0 if match.group(2) == "json" else 1, file_name)


# -- rebuilding ---------------------------------------------------------------------------------

def rebuild(spark_factory: Callable[[], Any], warehouse: str, pipeline: Any, name: str, *, cascade: bool = False,
            lock_timeout_s: float = 60.0) -> tuple[DropResult, dict[str, Any]]:
    """Recompute derived table ``name`` of ``pipeline`` from its inputs' current history: drop its
    data and state, then run the derive phase for it (and, with ``cascade``, the derived tables
    that read it, dropped too) as for a table new to the warehouse (docs/derived-tables.md,
    "Tables added over an existing store"). The tables it reads are not dropped; one that is
    behind its sources is brought up to date in the same run, as a pipeline run would.

    Refused (``UsageError``) for a name the pipeline has no table of, and while derived tables
    read it without ``cascade`` (their results came from the table's old history). Returns the
    drop and each derived table's report (``TableReport``)."""
    from versiq.ingest.derived.derive import derive

    warehouse = storage.normalize(warehouse)
    specs = {t.name: t for t in pipeline.tables}
    if name not in specs:
        raise UsageError(unknown_name("derived table", name, sorted(specs), "the pipeline file"))
    tables = warehouse_tables(warehouse)
    readers = dependents(tables, [name])
    if readers and not cascade:
        raise UsageError(f"{name!r} is read by derived table(s) {', '.join(readers)}: give --cascade to rebuild "
                         "them too")
    missing = [r for r in readers if r not in specs]
    if missing:
        raise UsageError(f"derived table(s) {', '.join(missing)} read {name!r} but are not in the pipeline file: "
                         "drop them, or rebuild with the pipeline file that defines them")
    result = DropResult()
    for table_name in [*readers, name]:
        if table_name in tables or storage.isdir(layout.table_path(warehouse, table_name)):
            drop_path(layout.table_path(warehouse, table_name), lock_timeout_s)
            result.dropped.append(table_name)
    chosen = _with_upstream(pipeline.tables, {name, *readers})
    restricted = type(pipeline)(stores=pipeline.stores, streams=pipeline.streams, tables=chosen)
    return result, derive(spark_factory(), warehouse, restricted, lock_timeout_s)


def _with_upstream(specs: list[Any], names: set[str]) -> list[Any]:
    """The pipeline's tables named, with every derived table they read, in file order."""
    by_name = {t.name: t for t in specs}
    wanted = set(names)
    stack = list(names)
    while stack:
        for parent in by_name[stack.pop()].inputs:
            if parent in by_name and parent not in wanted:
                wanted.add(parent)
                stack.append(parent)
    return [t for t in specs if t.name in wanted]
