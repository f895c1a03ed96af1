"""The serving index on disk (query/index_files.py, issue 17): the files of a bucket answer exactly
what its resolved rows hold (crc32 collisions included), are built once per bucket content and
shared by every engine of the host (a second engine, or a restart, opens them without building),
a commit builds only the buckets it touched, and stale directories go away."""

from __future__ import annotations

import json
import logging
import os
import random
import string
import time
import zlib

import numpy as np
import pyarrow as pa
import pytest

from tests.support.storebuilder import StoreBuilder
from versiq import layout
from versiq.query import index_files
from versiq.query.api import VersionedKeyQuery
from versiq.query.engine import Engine
from versiq.query.reads import NULL_TS


def _colliding_keys() -> tuple[str, str]:
    """Two different keys with the same crc32 (a birthday search: ~100k random keys)."""
    rng = random.Random(7)
    seen: dict[int, str] = {}
    while True:
        key = "".join(rng.choices(string.ascii_letters, k=12))
        h = zlib.crc32(key.encode())
        if h in seen and seen[h] != key:
            return seen[h], key
        seen[h] = key


def _resolved(rows: list[tuple[str, int, int | None, str | None, int]]) -> pa.Table:
    rows = sorted(rows, key=lambda r: (r[0].encode(), r[1]))
    return pa.table({
        "key": [r[0] for r in rows], "valid_from": [r[1] for r in rows], "valid_to": [r[2] for r in rows],
        "value": [r[3] for r in rows], "tombstone": [r[3] is None for r in rows], "partition": [r[4] for r in rows],
    }, schema=pa.schema([("key", pa.string()), ("valid_from", pa.int64()), ("valid_to", pa.int64()),
                         ("value", pa.string()), ("tombstone", pa.bool_()), ("partition", pa.int32())]))


def test_a_bucket_answers_what_its_rows_hold_collisions_included(tmp_path):
    a, b = _colliding_keys()
    assert zlib.crc32(a.encode()) == zlib.crc32(b.encode())
    rows = [(a, 1, 5, "a1", 0), (a, 5, None, "a2", 0), (b, 3, None, None, 1), ("é", 2, None, "e", 2),
            ("", 9, None, "empty key", 0)] + [(f"k{i:03d}", i, None, f"v{i}", 0) for i in range(200)]
    directory = str(tmp_path / "b0")
    index_files.write_bucket(directory, _resolved(rows))
    bucket = index_files.open_bucket(directory)
    assert bucket.key_count == 204 and bucket.row_count == 205
    got = bucket.rows(a)
    assert got is not None and len(got) == 2
    assert [got.record(i).value for i in range(len(got))] == ["a1", "a2"]
    assert got.record(0).valid_to == 5 and got.record(1).valid_to is None
    tomb = bucket.rows(b)
    assert tomb is not None and len(tomb) == 1 and tomb.is_tombstone(0) and tomb.partition == 1
    assert bucket.rows("é") is not None and bucket.rows("") is not None
    assert bucket.rows("missing") is None and bucket.rows("k2000") is None
    # keys ascend in UTF-8 byte order, entered by binary search
    keys = bucket.keys_between(0, bucket.key_count)
    assert keys == sorted(keys) and len(keys) == 204 and keys[0] == ""
    assert bucket.keys_between(5, 12) == keys[5:12]
    assert keys[bucket.first_at_or_after("k1")] == "k100"
    assert keys[bucket.first_at_or_after("k100")] == "k100"
    assert keys[bucket.first_at_or_after("k100", strictly_after=True)] == "k101"
    assert bucket.first_at_or_after("\U0010ffff") == 204
    # a batch probe finds what the single probe finds (missing keys: -1), and hands out the rows
    wanted = [a, "missing", b, "", "k199", "é", "k2000"]
    ordinals = bucket.find_many(wanted, np.array([index_files.key_hash(k) for k in wanted], dtype=np.uint32))
    assert [keys[o] if o >= 0 else None for o in ordinals] == [a, None, b, "", "k199", "é", None]
    segments = bucket.segments(ordinals)
    assert list(segments.present) == [True, False, True, True, True, True, False]
    assert (segments.start[0], segments.end[0]) == (got.start, got.end) and segments.partition[2] == 1
    # columns are views of the mapping (no copies)
    assert not bucket.valid_from.flags.owndata and bucket.valid_to[bucket.rows("k005").start] == NULL_TS


def test_an_empty_bucket_opens(tmp_path):
    directory = str(tmp_path / "empty")
    index_files.write_bucket(directory, _resolved([]))
    bucket = index_files.open_bucket(directory)
    assert bucket.key_count == 0 and bucket.rows("x") is None and bucket.keys_between(0, 0) == []
    assert list(bucket.find_many(["x"], np.array([1], dtype=np.uint32))) == [-1]


def test_a_bucket_is_built_once_and_then_opened(tmp_path):
    directory = index_files.bucket_directory(str(tmp_path / "store"), 3, index_files.bucket_digest("versioned", ["f"]))
    built, was_built = index_files.open_or_build(directory, lambda: _resolved([("k", 1, None, "v", 0)]))
    assert was_built and built.rows("k") is not None

    def never() -> pa.Table:
        raise AssertionError("the files exist: nothing to build")

    opened, was_built = index_files.open_or_build(directory, never)
    assert not was_built and opened.rows("k") is not None
    assert [e for e in os.listdir(os.path.dirname(directory)) if e.startswith(".build-")] == []


def test_the_digest_follows_the_kind_and_the_set_of_files():
    d = index_files.bucket_digest
    assert d("versioned", ["a", "b"]) == d("versioned", ["b", "a"])
    assert len({d("versioned", ["a", "b"]), d("timestamped", ["a", "b"]), d("versioned", ["a"])}) == 3


def test_engines_share_the_files_and_a_commit_builds_only_its_buckets(tmp_path, monkeypatch):
    wh, cache = str(tmp_path / "wh"), str(tmp_path / "cache")
    builder = StoreBuilder(wh, "s", buckets=8)
    builder.apply([(f"k{i}", "1", 1) for i in range(40)])
    first = Engine(wh, refresh_interval_s=3600, cache_dir=cache)
    first.refresh()
    store_dir = os.path.join(index_files.cache_dir(wh, cache), "s", f"v{index_files.FORMAT_VERSION}")
    before = {e: os.stat(os.path.join(store_dir, e)).st_ino for e in os.listdir(store_dir) if not e.endswith(".lock")}
    assert len(before) == 8

    # A second engine (another worker, a restart) opens the same files: building would fail.
    def no_build(*args, **kwargs):
        raise AssertionError("built a bucket whose files exist")

    monkeypatch.setattr(index_files, "write_bucket", no_build)
    second = Engine(wh, refresh_interval_s=3600, cache_dir=cache)
    second.refresh()
    assert second.get("s", VersionedKeyQuery("k7")).record.value == "1"
    monkeypatch.undo()

    builder.apply([("k1", "2", 2)])
    first.refresh()
    after = {e: os.stat(os.path.join(store_dir, e)).st_ino for e in os.listdir(store_dir) if not e.endswith(".lock")}
    changed = layout.bucket_of("k1", 8)
    new = set(after) - set(before)
    assert [name.split("-")[0] for name in new] == [f"b{changed}"]
    assert first.get("s", VersionedKeyQuery("k1")).record.value == "2"
    assert second.get("s", VersionedKeyQuery("k1")).record.value == "1"  # not refreshed yet: its mapping stands
    second.refresh()
    assert second.get("s", VersionedKeyQuery("k1")).record.value == "2"
    first.close()
    second.close()


def test_stale_directories_of_a_bucket_are_removed(tmp_path, monkeypatch):
    store = str(tmp_path / "store")
    old = index_files.bucket_directory(store, 0, "old")
    index_files.open_or_build(old, lambda: _resolved([("k", 1, None, "v", 0)]))
    other_bucket = index_files.bucket_directory(store, 1, "other")
    index_files.open_or_build(other_bucket, lambda: _resolved([("j", 1, None, "v", 0)]))
    past = time.time() - index_files.STALE_AFTER_S - 5
    os.utime(old, (past, past))
    os.utime(other_bucket, (past, past))
    recent = index_files.bucket_directory(store, 0, "recent")
    index_files.open_or_build(recent, lambda: _resolved([("k", 1, None, "v2", 0)]))
    fresh = index_files.bucket_directory(store, 0, "fresh")
    index_files.open_or_build(fresh, lambda: _resolved([("k", 1, None, "v3", 0)]))
    assert not os.path.exists(old)
    assert os.path.exists(recent)  # not old enough: a process may be about to open it
    assert os.path.exists(other_bucket)  # another bucket's current files


@pytest.mark.parametrize("configured", [None, "/somewhere"])
def test_the_cache_folder_is_per_warehouse(monkeypatch, configured):
    monkeypatch.setenv("VERSIQ_CACHE_DIR", "/env-cache")
    a, b = index_files.cache_dir("/wh/a", configured), index_files.cache_dir("s3://bucket/wh", configured)
    assert a != b and a.startswith((configured or "/env-cache") + "/index/")
    monkeypatch.delenv("VERSIQ_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert index_files.cache_dir("/wh/a").startswith("/xdg/versiq/index/")


def test_unreadable_files_are_built_again(tmp_path):
    """Files renamed into place whose data never reached the disk (or edited by hand) are not
    served and do not make the store unavailable: they are removed and built again."""
    directory = index_files.bucket_directory(str(tmp_path / "store"), 0, "d")
    index_files.open_or_build(directory, lambda: _resolved([("k", 1, None, "v", 0)]))
    with open(os.path.join(directory, "rows.arrow"), "r+b") as handle:
        handle.truncate(10)
    with pytest.raises(pa.ArrowInvalid):
        index_files.open_bucket(directory)
    rebuilt, was_built = index_files.open_or_build(directory, lambda: _resolved([("k", 1, None, "v2", 0)]))
    assert was_built and rebuilt.rows("k").record(0).value == "v2"


def test_the_index_of_a_store_removed_from_the_warehouse_is_removed(tmp_path):
    """A store the catalog sees leave the warehouse (dropped) loses its index at that refresh; a
    folder of a store this process never served (left by another process) goes once it is
    stale, not before: another replica may still be building it."""
    import shutil

    wh, cache = str(tmp_path / "wh"), str(tmp_path / "cache")
    StoreBuilder(wh, "kept").apply([("k", "1", 1)])
    StoreBuilder(wh, "dropped").apply([("k", "1", 1)])
    engine = Engine(wh, refresh_interval_s=3600, cache_dir=cache)
    engine.refresh()
    folder = index_files.cache_dir(wh, cache)
    assert sorted(os.listdir(folder)) == ["dropped", "kept"]
    shutil.rmtree(os.path.join(wh, "dropped"))
    os.makedirs(os.path.join(folder, "orphan", f"v{index_files.FORMAT_VERSION}"))
    engine.refresh()
    assert sorted(os.listdir(folder)) == ["kept", "orphan"]
    past = time.time() - index_files.STALE_AFTER_S - 5
    for path in (os.path.join(folder, "orphan"), os.path.join(folder, "orphan", f"v{index_files.FORMAT_VERSION}")):
        os.utime(path, (past, past))
    engine.refresh()
    assert os.listdir(folder) == ["kept"]
    assert engine.get("kept", VersionedKeyQuery("k")).record.value == "1"
    engine.close()


@pytest.mark.parametrize("kind", ["versioned", "timestamped"])
def test_a_bucket_merged_with_added_files_equals_one_built_from_all_of_them(tmp_path, kind):
    """Commit after commit of random records (out of order, tombstones, same-timestamp
    replacements, crc32-colliding and non-ASCII keys), the bucket merged from the previous one
    and the resolved rows of the added files (``index_files.merged``) has exactly the files a
    build from every data file has."""
    import duckdb
    from deltalake import DeltaTable

    from versiq.query.files import arrow
    from versiq.query.index import BucketIndex, files_by_bucket, resolve_sql

    rng = random.Random(11)
    a, b = _colliding_keys()
    keys = [a, b, "", "é", "zz", "a/b"] + [f"k{i:02d}" for i in range(30)]
    builder = StoreBuilder(str(tmp_path / "wh"), "s", kind=kind, buckets=1)
    con = duckdb.connect()
    prev: BucketIndex | None = None
    merges = 0
    for commit in range(12):
        records = [(rng.choice(keys), None if rng.random() < 0.15 else json.dumps(rng.randrange(100)),
                    rng.randrange(0, 60 + 10 * commit)) for _ in range(rng.randint(1, 25))]
        builder.apply(records)
        files = files_by_bucket(DeltaTable(builder.path), builder.path)[0]
        paths = [f.path for f in files]
        full = index_files.bucket_tables(arrow(con, resolve_sql(kind, None), {"files": paths}))
        if prev is not None:
            added = prev.merge_from(files)
            assert added is not None and [f.path for f in added] == sorted(set(paths) - prev.files)
            got = index_files.merged(prev.data, arrow(con, resolve_sql(kind, None), {"files": [f.path for f in added]}),
                                     kind)
            assert got.rows.equals(full.rows), commit
            assert got.keys.equals(full.keys), commit
            merges += 1
        directory = str(tmp_path / f"b{commit}")
        index_files.write_bucket(directory, full)
        prev = BucketIndex(frozenset(paths), index_files.open_bucket(directory), 0,
                           max(f.max_run for f in files if f.max_run is not None))
    assert merges == 11


def test_a_refresh_merges_a_commit_into_its_buckets_and_builds_them_after_a_compaction(tmp_path, monkeypatch, caplog):
    """The engine merges the files a commit added into the buckets it touched, answering what an
    engine that builds from every file answers; files that went away (a compaction rewrote
    them) make it build the bucket from its files again."""
    from deltalake import DeltaTable

    wh = str(tmp_path / "wh")
    builder = StoreBuilder(wh, "s", buckets=2)
    keys = [f"k{i}" for i in range(100)]
    builder.apply([(k, json.dumps(i), 10) for i, k in enumerate(keys)])
    engine = Engine(wh, refresh_interval_s=3600, cache_dir=str(tmp_path / "cache"))
    engine.refresh()
    calls = []
    merged = index_files.merged
    counting = lambda *a: calls.append(1) or merged(*a)  # noqa: E731
    monkeypatch.setattr(index_files, "merged", counting)

    def same_as_a_fresh_build(label: str) -> None:
        fresh = Engine(wh, refresh_interval_s=3600, cache_dir=str(tmp_path / f"fresh-{label}"))
        fresh.refresh()
        for key in keys + ["nope"]:
            for as_of in (None, 5, 15, 25, 35):
                want, got = (e.get("s", VersionedKeyQuery(key, as_of=as_of)) for e in (fresh, engine))
                assert got.record == want.record, (label, key, as_of)
        fresh.close()

    builder.apply([("k1", "100", 20), ("k2", None, 20), ("new", "1", 30)])
    engine.refresh()
    assert calls, "the commit's buckets were built, not merged"
    keys.append("new")
    same_as_a_fresh_build("merged")
    # a merge that fails is logged and the bucket built from its files: the refresh goes on
    def broken(*args):
        raise RuntimeError("merge broke")

    monkeypatch.setattr(index_files, "merged", broken)
    builder.apply([("k3", "300", 40)])
    with caplog.at_level(logging.WARNING, logger="versiq.query"):
        engine.refresh()
    assert any("merging 1 new file(s) failed (merge broke)" in r.getMessage() for r in caplog.records)
    same_as_a_fresh_build("fallback")
    monkeypatch.setattr(index_files, "merged", counting)
    # a compaction: the same rows in one new file per bucket (the old files removed)
    calls.clear()
    table = DeltaTable(builder.path)
    rows = table.to_pyarrow_table()
    from deltalake import write_deltalake
    write_deltalake(builder.path, rows, mode="overwrite", partition_by=["bucket"])
    engine.refresh()
    assert not calls
    same_as_a_fresh_build("compacted")
    engine.close()
