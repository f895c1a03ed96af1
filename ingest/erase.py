"""``versiq erase``: remove every row of given keys from a store and from everything that keeps
a copy of them under the warehouse, and leave a record that it was done (an audit trail).

What holds a key's rows (``versiq.layout``):

- the store table, its ``_changelog`` and ``_emitted`` (matched by ``key``) and its
  ``_rejected`` (matched by text: a rejected record's key may never have been parsed, so a row
  whose ``raw`` or ``detail`` contains the key's text, or its JSON-escaped form, goes);
- every derived table keyed by the store's key, transitively: filters and copies, primary-key
  joins, tables made from a stream and stream-table joins (their output's key is the input's
  key), each with its own side tables. Tables that aggregate or join through another key
  (``group_by``, ``fk_join``) and everything computed from them cannot lose a key's share by
  deleting rows: they are named in the result, to be recomputed with ``versiq rebuild``.

Each table's rows go in one Delta commit (``delta.erase_matching``) under that table's writer
lock, then the files that held them are deleted at once, whatever the vacuum retention: the
files the commit removed, and every other file no snapshot of the table references any more
that holds a matching row (older compactions' inputs, a killed writer's leftovers). Delta's
log keeps per-file statistics whose ``minValues``/``maxValues`` may quote a key; those of
files that held one are cut to ``numRecords`` in the commit files and checkpoints, and the
``.crc`` checksum files quoting one are deleted (Delta and the readers recompute what they
hold). A rewritten checkpoint no longer has the size ``_last_checkpoint`` records; when it is
the newest, delta-spark writes a new checkpoint of the current snapshot, and its own
``_last_checkpoint``, rather than versiq editing Delta's pointer (``write_checkpoint``).
Snapshots that read a deleted file are gone: reads of them, and page tokens pinned to them,
answer 410.

Every step recomputes what is left from the tables themselves, so an erase killed at any point
is completed by running it again. The audit row (``_erasures``) is written last: an erase
recorded there was done everywhere.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from versiq import storage
from versiq.ingest.delta import append_rows, erase_matching
from versiq.ingest.errors import UsageError
from versiq.ingest.frames import local_frame
from versiq.ingest.store import SIDE_TABLES, check_still_writer, existing_store_path, writer_lock
from versiq.layout import (
    ERASE_SECRET_FILE,
    ERASURES_DIR,
    ERASURES_SCHEMA,
    MAX_KEY_BYTES,
    PRIVATE_DIR,
    REJECTED_DIR,
    STATS_STRING_PREFIX,
    StoreSettings,
    bucket_of,
    delta_log,
    has_table,
    read_state,
)

log = logging.getLogger("versiq.erase")

#: Derived operations whose output rows of a key come from that key's input rows alone.
KEYED_OPS = ("from", "join", "stream_join")
_COMMIT_FILE = re.compile(r"\d{20}\.json\Z")
_CHECKPOINT_FILE = re.compile(r"\d{20}\.checkpoint.*\.parquet\Z")
#: Delta's pointer to a table's newest checkpoint, in its log folder.
LAST_CHECKPOINT_FILE = "_last_checkpoint"

SparkFactory = Callable[[], SparkSession]


def _new_spark() -> SparkSession:
    from versiq.ingest.spark import get_spark

    return get_spark(app_name="versiq-erase", short_lived=True)


@dataclass(frozen=True)
class DerivedTable:
    """A derived table (or stream output) of the warehouse, as its newest commit defines it."""

    name: str
    path: str
    op: str
    inputs: tuple[str, ...]


@dataclass
class EraseResult:
    """What one ``versiq erase`` did (its output, ``to_dict``): never a key or a value."""

    store: str
    keys: int
    #: The store's snapshot after the erase.
    snapshot: int = -1
    #: Rows removed by this invocation, per table (``orders``, ``orders/_rejected``, ...).
    rows: dict[str, int] = field(default_factory=dict)
    files_deleted: int = 0
    log_files_scrubbed: int = 0
    #: Tables that aggregate or join through another key: ``versiq rebuild --table T`` each.
    rebuild: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "keys": self.keys, "snapshot": self.snapshot, "rows": self.rows,
                "files_deleted": self.files_deleted, "log_files_scrubbed": self.log_files_scrubbed,
                "rebuild": self.rebuild}


def erase_keys(warehouse: str, store: str, keys: list[str], lock_timeout_s: float = 60.0,
               spark: SparkFactory = _new_spark) -> EraseResult:
    """Erase ``keys`` from ``store`` and the derived tables keyed by its key (module docstring)."""
    keys = _checked_keys(keys)
    store_path = existing_store_path(warehouse, store)
    keyed, rebuild = affected_tables(store, derived_tables(warehouse))
    result = EraseResult(store, len(keys), rebuild=rebuild)
    session = _Session(spark)
    with writer_lock(store_path, lock_timeout_s):
        _erase_table(session, store, store_path, keys, result)
    for table in keyed:
        with writer_lock(table.path, lock_timeout_s):
            _erase_table(session, table.name, table.path, keys, result)
    with writer_lock(store_path, lock_timeout_s):
        result.snapshot = storage.delta_table(store_path).version()
        _record(session.get(), warehouse, store_path, keys, result, [store] + [t.name for t in keyed])
    for name in rebuild:
        log.warning("table %s aggregates or joins through another key: run `versiq rebuild --table %s` to "
                    "recompute it without the erased keys", name, name)
    return result


def _checked_keys(keys: list[str]) -> list[str]:
    """The keys, each once, in order; a UsageError for none, or for one no store can hold."""
    unique = list(dict.fromkeys(keys))
    if not unique:
        raise UsageError("no key to erase (give --key or --keys-file)")
    for number, key in enumerate(unique, 1):
        if not key or len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise UsageError(f"key {number} is empty or longer than {MAX_KEY_BYTES} bytes: no store holds it")
    return unique


class _Session:
    """The Spark session, started the first time a commit needs it."""

    def __init__(self, factory: SparkFactory) -> None:
        self._factory = factory
        self._spark: SparkSession | None = None

    def get(self) -> SparkSession:
        if self._spark is None:
            self._spark = self._factory()
        return self._spark


# ------------------------------------------------------------------------------ which tables


def operation_of(definition: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """A derived table's operation (``from``: a filter, copy or table made from a stream;
    ``aggregate``, ``join``, ``fk_join``, ``stream_join``) and inputs, from its definition (its
    pipeline entry, ``ingest.derived.spec``)."""
    for op, sides in (("join", ("left", "right")), ("fk_join", ("left", "right")),
                      ("stream_join", ("stream", "table"))):
        sub = definition.get(op)
        if isinstance(sub, dict):
            return op, tuple(str(sub[side]) for side in sides if side in sub)
    source = (str(definition["from"]),) if "from" in definition else ()
    return ("aggregate" if "group_by" in definition else "from"), source


def derived_tables(warehouse: str) -> list[DerivedTable]:
    """Every derived table of the warehouse: a table whose newest state has a definition."""
    out = []
    for name, folder in storage.subdirectories(warehouse):
        if name.startswith(("_", ".")) or not has_table(folder):
            continue
        try:
            state = read_state(folder, storage.delta_table(folder).version())
            definition = json.loads(state.definition) if state.definition else None
        except (OSError, ValueError):
            continue  # not a table versiq can read: nothing of the store's is in it
        if isinstance(definition, dict):
            op, inputs = operation_of(definition)
            out.append(DerivedTable(name, folder, op, inputs))
    return out


def affected_tables(store: str, tables: list[DerivedTable]) -> tuple[list[DerivedTable], list[str]]:
    """The derived tables keyed by ``store``'s key, directly or through others (their rows of
    an erased key go too), and those to recompute: an aggregate or foreign-key join reading
    one of those, and every table that reads a table to recompute."""
    keyed, rebuild = {store}, set[str]()
    changed = True
    while changed:
        changed = False
        for table in tables:
            if table.name in keyed or table.name in rebuild or not set(table.inputs) & (keyed | rebuild):
                continue
            if table.op in KEYED_OPS and not set(table.inputs) & rebuild:
                keyed.add(table.name)
            else:
                rebuild.add(table.name)
            changed = True
    return [t for t in tables if t.name in keyed], sorted(rebuild)


# ------------------------------------------------------------------------------ one table


@dataclass(frozen=True)
class _Target:
    """One Delta table to erase from and how its rows are matched: ``key`` (with ``buckets``
    when the table is partitioned by bucket) or ``text`` (``_rejected``: ``raw`` and ``detail``)."""

    path: str
    label: str
    match: str
    buckets: int | None = None


def _targets(name: str, path: str) -> list[_Target]:
    """The table at ``path`` first, then its side tables that exist."""
    settings = StoreSettings.from_description(storage.delta_table(path).metadata().description)
    out = [_Target(path, name, "key", settings.buckets)]
    for side in SIDE_TABLES:
        side_path = storage.join(path, side)
        if has_table(side_path):
            out.append(_Target(side_path, f"{name}/{side}", "text" if side == REJECTED_DIR else "key"))
    return out


def _erase_table(session: _Session, name: str, path: str, keys: list[str], result: EraseResult) -> None:
    """Erase ``keys`` from one table and its side tables (the caller holds the table's lock)."""
    for target in _targets(name, path):
        table = storage.delta_table(target.path)
        rows = len(_matching(target, list(table.file_uris()), keys, count_rows=True))
        if rows:
            check_still_writer(path)
            spark = session.get()
            erase_matching(_source_frame(spark, target, keys), target.path, _condition(target),
                           state=read_state(target.path, table.version()))
            log.info("%s: erase committed (%d row(s))", target.label, rows)
        result.rows[target.label] = result.rows.get(target.label, 0) + rows
        result.files_deleted += _delete_files(target, keys)
        result.log_files_scrubbed += scrub_log(target.path, keys)
        if not last_checkpoint_holds(target.path):
            check_still_writer(path)
            write_checkpoint(session.get(), target.path)
            log.info("%s: checkpoint written after the erase", target.label)


def needles(keys: list[str]) -> list[str]:
    """The texts that quote a key: itself and its JSON-escaped forms (as a rejected record's
    raw text or Delta's statistics may hold it)."""
    out: dict[str, None] = {}
    for key in keys:
        for text in (key, json.dumps(key)[1:-1], json.dumps(key, ensure_ascii=False)[1:-1]):
            out[text] = None
            out[json.dumps(text, ensure_ascii=False)[1:-1]] = None
    return list(out)


def _condition(target: _Target) -> str:
    if target.match == "text":
        return "instr(t.raw, s.needle) > 0 OR instr(coalesce(t.detail, ''), s.needle) > 0"
    if target.buckets is not None:
        return "t.bucket = s.bucket AND t.key = s.key"
    return "t.key = s.key"


def _source_frame(spark: SparkSession, target: _Target, keys: list[str]) -> Any:
    if target.match == "text":
        return local_frame(spark, pa.table({"needle": needles(keys)}))
    if target.buckets is not None:
        buckets = target.buckets
        return local_frame(spark, pa.table({"key": keys, "bucket": pa.array([bucket_of(k, buckets) for k in keys],
                                                                              pa.int32())}))
    return local_frame(spark, pa.table({"key": keys}))


def _matching(target: _Target, files: list[str], keys: list[str], count_rows: bool = False) -> list[str]:
    """The files among ``files`` holding a matching row (``count_rows``: one entry per row).
    A file DuckDB cannot read (a killed writer's partial file) counts as matching."""
    if not files:
        return []
    con = storage.duckdb_connect(target.path)
    try:
        con.register("erase_keys", pa.table({"key": keys}))
        con.register("erase_needles", pa.table({"needle": needles(keys)}))
        where = ("EXISTS (SELECT 1 FROM erase_needles n WHERE contains(t.raw, n.needle) "
                 "OR contains(coalesce(t.detail, ''), n.needle))" if target.match == "text"
                 else "t.key IN (SELECT key FROM erase_keys)")
        sql = f"SELECT filename FROM read_parquet($files, filename = true, hive_partitioning = false) t WHERE {where}"
        try:
            found = [row[0] for row in con.sql(sql, params={"files": files}).fetchall()]
        except duckdb.Error:
            if count_rows or len(files) == 1:
                raise
            found = []
            for one in files:
                try:
                    found += _matching(target, [one], keys)
                except duckdb.Error:
                    found.append(one)
    finally:
        con.close()
    return found if count_rows else sorted(set(found))


def _delete_files(target: _Target, keys: list[str]) -> int:
    """Delete the table's data files that no snapshot references any more (``files_under``:
    outside its ``_`` folders, so never a nested side table's) and that hold a matching row."""
    referenced = set(storage.delta_table(target.path).file_uris())
    candidates = sorted(f for f in storage.files_under(target.path) - referenced if f.endswith(".parquet"))
    deleted = 0
    for path in _matching(target, candidates, keys):
        deleted += storage.remove(path)
        _remove_local_checksum(path)
    if deleted:
        log.info("%s: deleted %d file(s) that held erased keys", target.label, deleted)
    return deleted


def _remove_local_checksum(path: str) -> None:
    """Hadoop's checksum of a local file (``.<name>.crc`` beside it), stale once the file is
    changed or gone (a reader through Hadoop would then refuse the file)."""
    if not storage.is_s3(path):
        folder, name = os.path.split(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, f".{name}.crc"))


# ------------------------------------------------------------------------------ the Delta log


def _reveals(text: str, keys: list[str], quoted: list[str]) -> bool:
    """Whether ``text`` quotes an erased key, whole or as the prefix Delta's statistics keep of
    a long one."""
    if any(n in text for n in quoted):
        return True
    return any(len(k) > STATS_STRING_PREFIX and k[:STATS_STRING_PREFIX - 1] in text for k in keys)


def _scrubbed_stats(stats: str) -> str:
    """Statistics without min/max values: only ``numRecords`` (a reader then keeps the file)."""
    try:
        records = json.loads(stats).get("numRecords")
    except (ValueError, AttributeError):
        records = None
    return json.dumps({} if records is None else {"numRecords": records}, separators=(",", ":"))


def _scrub_action(action: dict[str, Any], keys: list[str], quoted: list[str]) -> bool:
    changed = False
    for kind in ("add", "remove"):
        body = action.get(kind)
        if isinstance(body, dict) and isinstance(body.get("stats"), str) and _reveals(body["stats"], keys, quoted):
            body["stats"] = _scrubbed_stats(body["stats"])
            changed = True
    return changed


def scrub_log(table_path: str, keys: list[str]) -> int:
    """Cut the statistics that quote an erased key out of the table's Delta log (commit files
    and checkpoints) and delete the checksum files (``N.crc``) quoting one; returns how many
    log files changed. Only statistics of files that held the key can quote it, and those files
    are gone: no snapshot still readable loses anything a reader needs."""
    quoted = needles(keys)
    changed = 0
    for path in storage.all_files(delta_log(table_path)):
        name = storage.basename(path)
        if name.startswith("."):
            continue  # Hadoop's checksum of the file beside it: handled with that file
        if _COMMIT_FILE.match(name):
            changed += _scrub_commit(path, keys, quoted)
        elif _CHECKPOINT_FILE.match(name):
            changed += _scrub_checkpoint(path, keys, quoted)
        elif name.endswith(".crc") and _reveals(storage.read_bytes(path).decode("utf-8", "replace"), keys, quoted):
            storage.remove(path)
            _remove_local_checksum(path)
            changed += 1
    return changed


def _scrub_commit(path: str, keys: list[str], quoted: list[str]) -> bool:
    text = storage.read_text(path)
    if not _reveals(text, keys, quoted):
        return False
    lines = []
    for line in text.splitlines():
        if line.strip() and _reveals(line, keys, quoted):
            action = json.loads(line)
            if _scrub_action(action, keys, quoted):
                line = json.dumps(action, separators=(",", ":"), ensure_ascii=False)
        lines.append(line)
    storage.write_bytes(path, ("\n".join(lines) + ("\n" if text.endswith("\n") else "")).encode("utf-8"))
    _remove_local_checksum(path)
    if _reveals(storage.read_text(path), keys, quoted):
        log.warning("%s still quotes an erased key outside file statistics", path)
    return True


def _scrub_checkpoint(path: str, keys: list[str], quoted: list[str]) -> bool:
    """A checkpoint's ``add``/``remove`` statistics as ``_scrub_action`` does (``stats``; a
    ``stats_parsed`` struct of such a row is nulled)."""
    table = pq.read_table(pa.BufferReader(storage.read_bytes(path)))
    if not _reveals(json.dumps(table.to_pylist(), default=str, ensure_ascii=False), keys, quoted):
        return False
    columns = []
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if name in ("add", "remove") and pa.types.is_struct(column.type):
            column = _scrub_struct(column, keys, quoted)
        columns.append(column)
    out = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_arrays(columns, schema=table.schema), out)
    storage.write_bytes(path, out.getvalue().to_pybytes())
    _remove_local_checksum(path)
    return True


def _scrub_struct(column: pa.StructArray, keys: list[str], quoted: list[str]) -> pa.StructArray:
    names = [f.name for f in column.type]
    if "stats" not in names:
        return column
    stats = column.field("stats").to_pylist()
    hit = [s is not None and _reveals(s, keys, quoted) for s in stats]
    arrays = []
    for f in column.type:
        array = column.field(f.name)
        if f.name == "stats":
            array = pa.array([_scrubbed_stats(s) if h else s for s, h in zip(stats, hit, strict=True)], f.type)
        elif f.name == "stats_parsed":
            array = pc.if_else(pa.array(hit), pa.nulls(len(array), f.type), array)
        arrays.append(array)
    return pa.StructArray.from_arrays(arrays, fields=list(column.type), mask=column.is_null())


def last_checkpoint_holds(table_path: str) -> bool:
    """Whether the table's ``_last_checkpoint`` (if any) names a checkpoint of the size it
    records (``sizeInBytes``, all parts of it together). A checkpoint ``scrub_log`` rewrote
    no longer does: readers are not known to check the size, but nothing vouches that they
    never will, so the erase then has Delta write a checkpoint of its own
    (``write_checkpoint``)."""
    folder = delta_log(table_path)
    try:
        hint = json.loads(storage.read_text(storage.join(folder, LAST_CHECKPOINT_FILE)))
    except FileNotFoundError:
        return True
    except ValueError:
        return False
    if not isinstance(hint, dict) or not isinstance(hint.get("version"), int):
        return False
    recorded = hint.get("sizeInBytes")
    if recorded is None:
        return True  # a pointer without a size: nothing the rewrite contradicts
    prefix = f"{hint['version']:020d}.checkpoint."
    parts = [p for p in storage.all_files(folder) if storage.basename(p).startswith(prefix)
             and _CHECKPOINT_FILE.match(storage.basename(p))]
    return bool(parts) and sum(storage.file_size(p) for p in parts) == recorded


def write_checkpoint(spark: SparkSession, table_path: str) -> None:
    """Have delta-spark write a checkpoint of the table's newest snapshot and the
    ``_last_checkpoint`` that describes it, read afresh from the scrubbed log (the session's
    cached state of the table is dropped first: it may predate the scrub). The caller holds the
    table's writer lock. The checkpoint holds the newest snapshot's files only, none of which
    held an erased key, and Delta's checkpoints keep no statistics of removed files."""
    jvm: Any = spark.sparkContext._jvm
    session: Any = spark._jsparkSession
    delta_log_class = jvm.org.apache.spark.sql.delta.DeltaLog
    delta_log_class.invalidateCache(session, jvm.org.apache.hadoop.fs.Path(table_path))
    delta_log_class.forTable(session, table_path).checkpoint()


# ------------------------------------------------------------------------------ the audit trail


def erase_secret(warehouse: str) -> bytes:
    """The warehouse's key of the keyed hashes in ``_erasures``
    (``<warehouse>/_versiq/erase-secret``): 32 random bytes as hex, created by the first erase
    (a local file of mode 0600, readable by its owner only)."""
    path = storage.join(storage.normalize(warehouse), PRIVATE_DIR, ERASE_SECRET_FILE)
    if storage.is_s3(path):
        if not storage.exists(path):
            storage.write_bytes(path, secrets.token_hex(32).encode())
        return storage.read_text(path).strip().encode()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
    return storage.read_text(path).strip().encode()


def key_hash(secret: bytes, key: str) -> str:
    """HMAC-SHA256 of the key's UTF-8 bytes under ``secret``, hex: who holds the secret can tell
    whether a given key was erased; the trail alone reveals no key."""
    return hmac.new(secret, key.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _record(spark: SparkSession, warehouse: str, store_path: str, keys: list[str], result: EraseResult,
            tables: list[str]) -> None:
    secret = erase_secret(warehouse)
    row = {"erased_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
           "store": result.store, "user": getpass.getuser(), "keys": len(keys),
           "key_hashes": [key_hash(secret, k) for k in keys], "snapshot": result.snapshot,
           "tables": tables, "rebuild": result.rebuild}
    check_still_writer(store_path)
    append_rows(local_frame(spark, pa.Table.from_pylist([row], schema=ERASURES_SCHEMA)),
                storage.join(store_path, ERASURES_DIR), ERASURES_SCHEMA)
    log.info("store %s: erase of %d key(s) recorded in %s", result.store, len(keys), ERASURES_DIR)
