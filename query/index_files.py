"""The serving index on disk: one bucket's resolved rows in a read-optimised, memory-mapped form.

Why: each serving process used to build and hold the whole current snapshot in its
own memory (about 1.1 GB per worker at 10M versions, rebuilt at every start). The same columns
written once to local files and memory-mapped are shared by every worker and every replica on the
host through the OS page cache; a process's private memory stays small, and start-up is opening
files when they exist.

This module is the one place the format is defined. It is internal to a serving host (never in
a warehouse; with a warehouse on S3 it is the only local copy) and versioned: a change of
``FORMAT_VERSION`` puts new files beside the old ones, which are then never read again.

Layout (``cache`` is ``VERSIQ_CACHE_DIR``, see ``cache_dir``)::

    <cache>/<warehouse id>/<store>/v<FORMAT_VERSION>/b<bucket>-<digest>/
        rows.arrow   the bucket's resolved rows (read rule applied), sorted by (key, valid_from):
                     valid_from int64, valid_to int64 (reads.NULL_TS while valid),
                     tombstone uint8 (0/1), partition int32, value large_string (null for tombstones)
        keys.arrow   one row per distinct key, same length columns:
                     key large_string (ascending, UTF-8 byte order), start int64, end int64 (the
                     key's rows in rows.arrow), and, sorted apart, hash uint32 (crc32 of the
                     key's UTF-8 bytes, ascending) with ordinal int32 (the key's row in this file)

Both are Arrow IPC files of one uncompressed record batch, so opening them is ``mmap`` and every
column is a zero-copy view. ``<digest>`` is a SHA-256 of the store kind and the bucket's sorted data
file paths: a bucket whose files did not change between snapshots keeps its directory (a commit
that touches a few buckets builds only those), and any process can tell whether the files it
needs exist without asking anyone. A directory is built under a temporary name and renamed into
place, under an exclusive ``flock`` of ``<dir>.lock`` so that workers starting together build
each bucket once. Directories of the same bucket that are no longer current are removed once
they are ``STALE_AFTER_S`` old (processes that still map them keep their pages: Linux unlinks
do not affect open mappings).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from versiq import settings, storage
from versiq.query import reads

log = logging.getLogger("versiq.query")

FORMAT_VERSION = 1
#: A no-longer-current bucket directory is removed once it is this old (seconds).
STALE_AFTER_S = 60.0

ROWS_SCHEMA = pa.schema([
    ("valid_from", pa.int64()), ("valid_to", pa.int64()), ("tombstone", pa.uint8()),
    ("partition", pa.int32()), ("value", pa.large_string()),
])
KEYS_SCHEMA = pa.schema([
    ("key", pa.large_string()), ("start", pa.int64()), ("end", pa.int64()),
    ("hash", pa.uint32()), ("ordinal", pa.int32()),
])


def cache_dir(warehouse: str, configured: str | None = None) -> str:
    """The folder of this warehouse's serving indexes: ``configured``, else ``VERSIQ_CACHE_DIR``,
    else the user's cache folder (``$XDG_CACHE_HOME/versiq`` or ``~/.cache/versiq``), each with a
    sub-folder per warehouse (its normalized location hashed), so one cache serves many."""
    base = configured or settings.CACHE_DIR.value() or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "versiq")
    warehouse_id = hashlib.sha256(storage.normalize(warehouse).encode()).hexdigest()[:16]
    return os.path.join(os.path.abspath(base), "index", warehouse_id)


def bucket_digest(kind: str, files: list[str]) -> str:
    """What identifies a bucket's index: the store kind and its data files (sorted)."""
    h = hashlib.sha256(f"v{FORMAT_VERSION}\0{kind}".encode())
    for path in sorted(files):
        h.update(b"\0" + path.encode())
    return h.hexdigest()[:32]


def key_hash(key: str) -> int:
    return zlib.crc32(key.encode())


@dataclass(frozen=True)
class BucketFiles:
    """One bucket's index, opened from its files (every column a view of the mapping)."""

    directory: str
    keys: pa.LargeStringArray  # ascending
    starts: np.ndarray  # int64, per key
    ends: np.ndarray  # int64, per key
    hashes: np.ndarray  # uint32, ascending
    ordinals: np.ndarray  # int32, key row of each hash
    valid_from: np.ndarray
    valid_to: np.ndarray
    tombstone: np.ndarray  # bool view of the uint8 column
    partition: np.ndarray
    values: pa.LargeStringArray

    @property
    def key_count(self) -> int:
        return len(self.keys)

    @property
    def row_count(self) -> int:
        return len(self.valid_from)

    @functools.cached_property
    def deleted_key_count(self) -> int:
        """Keys whose latest version is a tombstone: listed only with ``includeDeleted``, so a
        reader of ``key_count`` can tell them from the keys that have a value (counted once per
        mapping: the files never change)."""
        if self.key_count == 0:
            return 0
        return int(np.count_nonzero(self.tombstone[np.asarray(self.ends, dtype=np.int64) - 1]))

    def find(self, key: str) -> int | None:
        """The key's ordinal (its row in ``keys``), or None: a crc32 probe, then the key itself."""
        h = key_hash(key)
        # A uint32 needle: a Python int would make numpy cast the whole column to int64 first.
        j = int(self.hashes.searchsorted(np.uint32(h), side="left"))
        while j < len(self.hashes) and int(self.hashes[j]) == h:
            i = int(self.ordinals[j])
            if self.keys[i].as_py() == key:
                return i
            j += 1
        return None

    def rows(self, key: str) -> reads.KeyRows | None:
        i = self.find(key)
        return None if i is None else self.rows_at(i)

    def rows_at(self, ordinal: int) -> reads.KeyRows:
        """The resolved rows of the key at ``ordinal`` (a key listing knows it without a probe)."""
        s, e = int(self.starts[ordinal]), int(self.ends[ordinal])
        return reads.KeyRows(self.valid_from, self.valid_to, self.tombstone, self.values, s, e,
                             int(self.partition[s]))

    def find_many(self, keys: list[str], hashes: np.ndarray) -> np.ndarray:
        """``find`` of every key at once (``hashes``: their ``key_hash``, uint32): the ordinals,
        -1 for a key the bucket does not hold. One ``searchsorted`` and one string comparison
        for the batch; a key whose hash run starts with another key (a crc32 collision, a few
        per million keys) is probed alone."""
        out = np.full(len(keys), -1, dtype=np.int64)
        n = len(self.hashes)
        if n == 0 or not keys:
            return out
        j = np.minimum(self.hashes.searchsorted(hashes, side="left"), n - 1)
        hit = self.hashes[j] == hashes
        candidate = np.where(hit, self.ordinals[j], 0).astype(np.int64)
        same = pc.equal(self.keys.take(pa.array(candidate)), pa.array(keys, pa.large_string()))
        same_np = same.to_numpy(zero_copy_only=False)
        out[hit & same_np] = candidate[hit & same_np]
        for p in np.flatnonzero(hit & ~same_np):
            found = self.find(keys[p])
            out[p] = -1 if found is None else found
        return out

    def segments(self, ordinals: np.ndarray) -> reads.KeySegments:
        """The resolved rows of the keys at ``ordinals`` (-1: a key without rows) as one batch."""
        present = ordinals >= 0
        at = np.where(present, ordinals, 0)
        if self.key_count == 0:
            start = end = np.zeros(len(ordinals), dtype=np.int64)
        else:
            start = np.where(present, self.starts[at], 0)
            end = np.where(present, self.ends[at], 0)
        return self._segments(start, end)

    def segments_range(self, first: int, stop: int) -> reads.KeySegments:
        """The resolved rows of the keys at ordinals ``[first, stop)`` (a key listing's run)."""
        return self._segments(np.asarray(self.starts[first:stop], dtype=np.int64),
                              np.asarray(self.ends[first:stop], dtype=np.int64))

    def _segments(self, start: np.ndarray, end: np.ndarray) -> reads.KeySegments:
        partition = (self.partition[np.minimum(start, self.row_count - 1)].astype(np.int64)
                     if self.row_count else np.zeros(len(start), dtype=np.int64))
        return reads.KeySegments(self.valid_from, self.valid_to, self.tombstone, self.values, start, end, partition)

    def keys_between(self, first: int, stop: int) -> list[str]:
        """The keys at ordinals ``[first, stop)``, ascending."""
        keys: list[str] = self.keys.slice(first, max(0, stop - first)).to_pylist()
        return keys

    def first_at_or_after(self, key: str, strictly_after: bool = False) -> int:
        """The ordinal of the first key >= ``key`` (> with ``strictly_after``), by binary search."""
        keys = _KeyColumn(self.keys)
        return (bisect.bisect_right if strictly_after else bisect.bisect_left)(keys, key)


class _KeyColumn:
    """A sorted Arrow string column seen as a sequence of str, for ``bisect``."""

    def __init__(self, keys: pa.LargeStringArray) -> None:
        self._keys = keys

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i: int) -> str:
        value = self._keys[i].as_py()
        assert isinstance(value, str)
        return value


def _write(path: str, table: pa.Table) -> None:
    batch = table.combine_chunks().to_batches(max_chunksize=max(table.num_rows, 1))
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for b in batch:
            writer.write_batch(b)


def _read(path: str) -> pa.RecordBatch:
    reader = pa.ipc.open_file(pa.memory_map(path, "r"))
    if reader.num_record_batches == 0:  # an empty bucket
        return pa.RecordBatch.from_pylist([], schema=reader.schema)
    return reader.get_batch(0)


def rows_from_table(tbl: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.Array, np.ndarray]:
    """The read columns of resolved rows (valid_from, valid_to with ``reads.NULL_TS`` while valid,
    tombstone, value, partition), as the serving index stores them and older snapshots read them."""
    vf = tbl.column("valid_from").to_numpy().astype(np.int64, copy=False)
    vt = pc.fill_null(tbl.column("valid_to"), reads.NULL_TS).to_numpy().astype(np.int64, copy=False)
    tomb = pc.fill_null(tbl.column("tombstone"), False).to_numpy().astype(bool, copy=False)
    values = tbl.column("value").combine_chunks()
    part = pc.fill_null(tbl.column("partition"), 0).to_numpy().astype(np.int32, copy=False)
    return vf, vt, tomb, values, part


def key_runs(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Where each key's rows start and end (int64) in a column sorted by key."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    changes = np.flatnonzero(pc.not_equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)) + 1
    starts = np.concatenate([np.zeros(1, dtype=np.int64), changes.astype(np.int64)])
    return starts, np.append(starts[1:], np.int64(n)).astype(np.int64)


@dataclass(frozen=True)
class BucketTables:
    """The two files of a bucket, as tables (``ROWS_SCHEMA``, ``KEYS_SCHEMA``), ready to write."""

    rows: pa.Table
    keys: pa.Table


def _keys_table(keys: pa.Array, starts: np.ndarray, ends: np.ndarray, hashes: np.ndarray) -> pa.Table:
    """``keys.arrow`` of keys in ascending order with their row ranges and crc32 (in key order)."""
    order = np.argsort(hashes, kind="stable").astype(np.int32)
    return pa.table({"key": keys.cast(pa.large_string()), "start": starts, "end": ends, "hash": hashes[order],
                     "ordinal": order}, schema=KEYS_SCHEMA)


def bucket_tables(resolved: pa.Table) -> BucketTables:
    """A bucket's files from its resolved rows (columns key, valid_from, valid_to, tombstone,
    partition, value; sorted by key, valid_from)."""
    vf, vt, tomb, values, part = rows_from_table(resolved)
    rows = pa.table({"valid_from": vf, "valid_to": vt, "tombstone": tomb.view(np.uint8), "partition": part,
                     "value": values.cast(pa.large_string())}, schema=ROWS_SCHEMA)
    keycol = resolved.column("key").combine_chunks()
    starts, ends = key_runs(keycol)
    uniq = keycol.take(pa.array(starts))
    hashes = np.fromiter((key_hash(k) for k in uniq.to_pylist()), dtype=np.uint32, count=len(uniq))
    return BucketTables(rows, _keys_table(uniq, starts, ends, hashes))


def merged(old: BucketFiles, added: pa.Table, kind: str) -> BucketTables:
    """The bucket ``old`` with ``added`` applied: ``added`` are the resolved rows (as for
    ``bucket_tables``) of data files committed after every file ``old`` was built from, so each of
    them is of a later run than any row of ``old``, and the read rule (``layout.read_rule_window``)
    gives it precedence: for a versioned store it replaces the row of the same (key, valid_from),
    for a timestamped one the key's row. The result equals ``bucket_tables`` of the resolved rows
    of all the files; its cost is a copy of the bucket's columns plus the work on the keys of
    ``added``, instead of reading and sorting every data file of the bucket again."""
    keycol = added.column("key").combine_chunks()
    a_starts, a_ends = key_runs(keycol)
    a_keys = keycol.take(pa.array(a_starts)).cast(pa.large_string())
    a_list = a_keys.to_pylist()
    a_hashes = np.fromiter((key_hash(k) for k in a_list), dtype=np.uint32, count=len(a_list))
    a_vf, a_vt, a_tomb, a_values, a_part = rows_from_table(added)
    n_rows, n_keys = old.row_count, old.key_count
    found = old.find_many(a_list, a_hashes)
    lengths = np.asarray(old.ends, dtype=np.int64) - np.asarray(old.starts, dtype=np.int64)
    row_parts: list[np.ndarray] = []
    key_parts: list[np.ndarray] = []
    length_parts: list[np.ndarray] = []
    next_key = next_row = 0
    for j, key in enumerate(a_list):
        at = int(found[j]) if found[j] >= 0 else old.first_at_or_after(key)
        at_row = int(old.starts[at]) if at < n_keys else n_rows
        row_parts.append(np.arange(next_row, at_row, dtype=np.int64))  # the old keys before this one
        key_parts.append(np.arange(next_key, at, dtype=np.int64))
        length_parts.append(lengths[next_key:at])
        mine = np.arange(a_starts[j], a_ends[j], dtype=np.int64)
        if found[j] >= 0 and kind == "versioned":
            s, e = int(old.starts[at]), int(old.ends[at])
            kept = np.flatnonzero(~np.isin(old.valid_from[s:e], a_vf[mine])) + s
            both = np.concatenate([kept, mine + n_rows])
            stamps = np.concatenate([old.valid_from[kept], a_vf[mine]])
            mine_rows = both[np.argsort(stamps, kind="stable")]
        else:  # a new key, or a timestamped key's one row
            mine_rows = mine + n_rows
        row_parts.append(mine_rows)
        key_parts.append(np.array([n_keys + j], dtype=np.int64))
        length_parts.append(np.array([len(mine_rows)], dtype=np.int64))
        next_key = at + 1 if found[j] >= 0 else at
        next_row = int(old.ends[at]) if found[j] >= 0 else at_row
    row_parts.append(np.arange(next_row, n_rows, dtype=np.int64))
    key_parts.append(np.arange(next_key, n_keys, dtype=np.int64))
    length_parts.append(lengths[next_key:])
    take = np.concatenate(row_parts)
    rows = pa.table({
        "valid_from": np.concatenate([old.valid_from, a_vf])[take],
        "valid_to": np.concatenate([old.valid_to, a_vt])[take],
        "tombstone": np.concatenate([old.tombstone, a_tomb])[take].view(np.uint8),
        "partition": np.concatenate([old.partition, a_part])[take],
        "value": pa.concat_arrays([old.values, a_values.cast(pa.large_string())]).take(pa.array(take)),
    }, schema=ROWS_SCHEMA)
    key_take = np.concatenate(key_parts)
    old_hashes = np.empty(n_keys, dtype=np.uint32)
    old_hashes[old.ordinals] = old.hashes
    ends = np.cumsum(np.concatenate(length_parts)).astype(np.int64)
    starts = ends - np.concatenate(length_parts)
    keys = pa.concat_arrays([old.keys, a_keys]).take(pa.array(key_take))
    return BucketTables(rows, _keys_table(keys, starts, ends, np.concatenate([old_hashes, a_hashes])[key_take]))


def write_bucket(directory: str, contents: pa.Table | BucketTables) -> None:
    """Write the files of one bucket into ``directory`` (created): from its resolved rows (see
    ``bucket_tables``) or from its tables."""
    os.makedirs(directory)
    tables = contents if isinstance(contents, BucketTables) else bucket_tables(contents)
    _write(os.path.join(directory, "rows.arrow"), tables.rows)
    _write(os.path.join(directory, "keys.arrow"), tables.keys)


def open_bucket(directory: str) -> BucketFiles:
    """Map the files of one bucket (FileNotFoundError when they are not there)."""
    rows = _read(os.path.join(directory, "rows.arrow"))
    keys = _read(os.path.join(directory, "keys.arrow"))

    def ints(batch: pa.RecordBatch, name: str) -> np.ndarray:
        column = batch.column(name)
        return column.to_numpy(zero_copy_only=True)

    if keys.num_rows and int(keys.column("end")[keys.num_rows - 1].as_py()) != rows.num_rows:
        raise ValueError(f"{directory}: keys.arrow and rows.arrow do not match")
    return BucketFiles(
        directory=directory,
        keys=keys.column("key"),
        starts=ints(keys, "start"), ends=ints(keys, "end"), hashes=ints(keys, "hash"),
        ordinals=ints(keys, "ordinal"),
        valid_from=ints(rows, "valid_from"), valid_to=ints(rows, "valid_to"),
        tombstone=ints(rows, "tombstone").view(np.bool_), partition=ints(rows, "partition"),
        values=rows.column("value"),
    )


def bucket_directory(store_dir: str, bucket: int, digest: str) -> str:
    return os.path.join(store_dir, f"v{FORMAT_VERSION}", f"b{bucket}-{digest}")


@contextlib.contextmanager
def _exclusive(lock_path: str) -> Iterator[None]:
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _open_if_sound(directory: str, repair: bool) -> BucketFiles | None:
    """The bucket's files opened, or None when they are missing, or unreadable (a host that lost
    power after the rename but before the data reached the disk; a cache folder edited by
    hand): with ``repair`` (under the bucket's lock) such files are removed, to be built again."""
    try:
        return open_bucket(directory)
    except FileNotFoundError:
        return None
    except (pa.ArrowException, OSError, ValueError) as exc:
        if repair:
            log.warning("serving index files %s are unreadable (%s): building them again", directory, exc)
            shutil.rmtree(directory, ignore_errors=True)
        return None


def open_or_build(directory: str, build: Callable[[], pa.Table | BucketTables]) -> tuple[BucketFiles, bool]:
    """The bucket at ``directory``: opened when its files exist, else built with ``build()``
    (its resolved rows as an Arrow table, or its tables) by this process while others wait, then opened.
    Returns the bucket and whether this process built it."""
    opened = _open_if_sound(directory, repair=False)
    if opened is not None:
        return opened, False
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    with _exclusive(directory + ".lock"):
        opened = _open_if_sound(directory, repair=True)
        if opened is not None:
            return opened, False  # another process built it while we waited
        temporary = tempfile.mkdtemp(prefix=".build-", dir=parent)
        try:
            write_bucket(os.path.join(temporary, "b"), build())
            os.rename(os.path.join(temporary, "b"), directory)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
    _remove_stale(directory)
    return open_bucket(directory), True


def remove_unlisted(warehouse_cache: str, present: set[str]) -> None:
    """Remove the index folders (``<warehouse_cache>/<store>``) of stores and streams that are no
    longer in the warehouse (``present``: the names with a Delta log), once nothing in them has
    changed for ``STALE_AFTER_S``. A store deleted from the warehouse would
    otherwise keep its files on the serving host for ever; one that comes back builds anew (its
    data files, and so the digests, are new)."""
    try:
        entries = list(os.scandir(warehouse_cache))
    except FileNotFoundError:
        return
    now = time.time()
    for entry in entries:
        if entry.name in present or not entry.is_dir(follow_symlinks=False):
            continue
        with contextlib.suppress(FileNotFoundError):
            versions = os.path.join(entry.path, f"v{FORMAT_VERSION}")
            changed = max([entry.stat().st_mtime] + ([os.stat(versions).st_mtime] if os.path.isdir(versions) else []))
            if now - changed > STALE_AFTER_S:
                shutil.rmtree(entry.path, ignore_errors=True)
                log.info("removed the serving index of %s: it is no longer in the warehouse", entry.name)


def remove_store(warehouse_cache: str, name: str) -> None:
    """Remove the index folder of store ``name`` at once: the catalog saw the store leave the
    warehouse (dropped), so nothing will be read from it again (a process still mapping its
    files keeps their pages: Linux unlinks do not affect open mappings). A store of that name
    created later builds anew (its data files, and so the digests, are new)."""
    folder = os.path.join(warehouse_cache, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed the serving index of %s: it left the warehouse", name)


def _remove_stale(current: str) -> None:
    """Remove the other directories of the same bucket once they are STALE_AFTER_S old."""
    parent, name = os.path.split(current)
    prefix = name.split("-", 1)[0] + "-"
    now = time.time()
    for entry in os.scandir(parent):
        if entry.name == name or not entry.name.startswith(prefix) or entry.name.endswith(".lock"):
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - entry.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(entry.path, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(entry.path + ".lock")
