"""Query engine (query/): read rules 6-11, retention edges, paging, snapshots, refresh, errors.

Stores are real Delta tables written in the versiq layout by ``tests/support/storebuilder.py`` from
the reference model; both read paths are checked (in-memory index of the current snapshot and
the DuckDB reader of ``snapshot=V``).
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime

import pytest

from tests.support.storebuilder import StoreBuilder, write_rows
from versiq import layout
from versiq.query.api import (
    InvalidQuery,
    KeyResult,
    MultiVersionedKeyQuery,
    SnapshotGone,
    SnapshotNotFound,
    StoreNotFound,
    UnsupportedQuery,
    VersionedKeyQuery,
    VersionedRecord,
)
from versiq.query.engine import Engine

DAY = 86_400_000


@pytest.fixture
def q_warehouse(tmp_path):
    return str(tmp_path / "wh")


@pytest.fixture
def q_engine(q_warehouse):
    engines: list[Engine] = []

    def make() -> Engine:
        e = Engine(q_warehouse, refresh_interval_s=3600)
        e.refresh()
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()


class _FilesEngine:
    """Engine facade whose current view is a files (DuckDB) view: exercises that path."""

    def __init__(self, engine: Engine, view) -> None:
        self._e = engine
        self._v = view

    def get(self, store, q, snapshot=None):
        self._e._view, orig = (lambda s, snap: self._v), self._e._view  # type: ignore[method-assign]
        try:
            return Engine.get(self._e, store, q)
        finally:
            self._e._view = orig  # type: ignore[method-assign]

    def versions(self, store, q, **kw):
        self._e._view, orig = (lambda s, snap: self._v), self._e._view  # type: ignore[method-assign]
        try:
            return Engine.versions(self._e, store, q, **kw)
        finally:
            self._e._view = orig  # type: ignore[method-assign]


def rec(value, ts, vt):
    return VersionedRecord(value, ts, vt)


def as_of(engine, key, t, store="s"):
    r: KeyResult = engine.get(store, VersionedKeyQuery(key, t))
    return r.outcome, r.record


def rng(engine, key, lo=None, hi=None, asc=True, store="s", limit=1000):
    return engine.versions(store, MultiVersionedKeyQuery(key, lo, hi, asc), limit=limit).records


# ---------------------------------------------------------------------------- rules 6-7
@pytest.mark.rule(6, 7)
def test_latest_and_as_of_rules_6_7(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s", history_retention_ms=DAY)
    b.apply([("a", "1", 10), ("a", "2", 20), ("a", None, 30), ("e", '""', 5), ("t", "1", 1), ("t", None, 2)])
    e = q_engine()
    for eng in (e, _FilesEngine(e, e._files_view("s", b.version))):
        # Rule 6: latest is a tombstone -> nothing; empty string is a value; unknown key.
        r = eng.get("s", VersionedKeyQuery("a"))
        assert (r.outcome, r.record) == ("not-found", None)
        r = eng.get("s", VersionedKeyQuery("e"))
        assert (r.outcome, r.record) == ("ok", rec('""', 5, None))
        assert eng.get("s", VersionedKeyQuery("zz")).outcome == "not-found"
        # Rule 7: largest timestamp <= t, inclusive, with validTo.
        assert as_of(eng, "a", 9) == ("not-found", None)
        assert as_of(eng, "a", 10) == ("ok", rec("1", 10, 20))
        assert as_of(eng, "a", 19) == ("ok", rec("1", 10, 20))
        assert as_of(eng, "a", 20) == ("ok", rec("2", 20, 30))
        assert as_of(eng, "a", 30) == ("not-found", None)
        assert as_of(eng, "a", 10**12) == ("not-found", None)
        assert as_of(eng, "e", 5) == ("ok", rec('""', 5, None))
        assert as_of(eng, "zz", 5) == ("not-found", None)
    latest = e.get("s", VersionedKeyQuery("t"))
    assert latest.snapshot == b.version and latest.horizon == 30 - DAY


@pytest.mark.rule(6)
def test_latest_has_no_valid_to(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s")
    b.apply([("k", "1", 1), ("k", "2", 2)])
    e = q_engine()
    assert e.get("s", VersionedKeyQuery("k")).record == rec("2", 2, None)
    assert e.get("s", VersionedKeyQuery("k", 1)).record == rec("1", 1, 2)


# ---------------------------------------------------------------------------- retention edges
def retention_store(q_warehouse):
    # H = 100; stream time 1000 -> h = 900.
    b = StoreBuilder(q_warehouse, "s", history_retention_ms=100)
    b.apply(
        [
            ("old", "1", 100), ("dead", "1", 100), ("new", "1", 100), ("edge", "1", 100),
            ("old", "2", 500),            # newest value 500 <= t < h
            ("dead", None, 500),          # newest is a tombstone
            ("edge", "2", 900), ("edge", "3", 901),   # validTo == h / > h
            ("new", "2", 950),            # newest after t
            ("clock", "x", 1000),
        ]
    )
    assert not b.ref.rejected
    return b


@pytest.mark.rule(8, 22)
def test_retention_edges_as_of(q_warehouse, q_engine):
    b = retention_store(q_warehouse)
    e = q_engine()
    for eng in (e, _FilesEngine(e, e._files_view("s", b.version))):
        assert eng.get("s", VersionedKeyQuery("old", 0)).horizon == 900
        assert as_of(eng, "old", 600) == ("ok", rec("2", 500, None))
        assert as_of(eng, "old", 499) == ("expired", None)  # rule 8: only the latest may answer
        assert as_of(eng, "old", 100) == ("expired", None)
        assert as_of(eng, "dead", 600) == ("not-found", None)
        assert as_of(eng, "dead", 200) == ("expired", None)
        assert as_of(eng, "nokey", 10) == ("not-found", None)
        assert as_of(eng, "new", 899) == ("expired", None)
        assert as_of(eng, "new", 900) == ("ok", rec("1", 100, 950))  # t == h: rule 7
        assert as_of(eng, "edge", 900) == ("ok", rec("2", 900, 901))
        assert as_of(eng, "edge", 899) == ("expired", None)
        for key in ("old", "dead", "new", "edge", "nokey"):
            for t in (0, 99, 100, 499, 500, 600, 899, 900, 901, 950, 2000):
                want = b.ref.as_of(key, t)
                got = as_of(eng, key, t)
                assert got[0] == want[0], (key, t)


@pytest.mark.rule(10, 22)
def test_retention_edges_range(q_warehouse, q_engine):
    b = retention_store(q_warehouse)
    e = q_engine()
    for eng in (e, _FilesEngine(e, e._files_view("s", b.version))):
        # to < h: rule 10, only the latest version may qualify (timestamp <= to).
        assert rng(eng, "old", 0, 899) == [rec("2", 500, None)]
        assert rng(eng, "old", 0, 499) == []
        assert rng(eng, "new", 0, 899) == []
        assert rng(eng, "dead", 0, 899) == []
        # History ending at or before h is hidden: edge@100 (validTo 900 == h) is expired,
        # edge@900 (validTo 901 > h) is still visible.
        assert rng(eng, "edge") == [rec("2", 900, 901), rec("3", 901, None)]
        assert rng(eng, "edge", 0, 900) == [rec("2", 900, 901)]
        assert rng(eng, "new", None, None) == [rec("1", 100, 950), rec("2", 950, None)]
        page = eng.versions("s", MultiVersionedKeyQuery("edge"))
        assert page.horizon == 900


# ---------------------------------------------------------------------------- rules 9-11
@pytest.mark.rule(9, 11)
def test_range_rules_9_11(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s", history_retention_ms=10 * DAY)
    b.apply([("k", "1", 10), ("k", "2", 20), ("k", None, 30), ("k", "4", 40), ("k", "5", 50)])
    e = q_engine()
    for eng in (e, _FilesEngine(e, e._files_view("s", b.version))):
        allv = [rec("1", 10, 20), rec("2", 20, 30), rec("4", 40, 50), rec("5", 50, None)]
        assert rng(eng, "k") == allv
        assert rng(eng, "k", asc=False) == allv[::-1]
        # Written before `from` but still valid at `from`: returned; validTo == from: not.
        assert rng(eng, "k", 15, 15) == [rec("1", 10, 20)]
        assert rng(eng, "k", 20, 20) == [rec("2", 20, 30)]
        # timestamp == to is returned; tombstones never are (30..39 is the tombstone's validity).
        assert rng(eng, "k", 30, 40) == [rec("4", 40, 50)]
        assert rng(eng, "k", 31, 39) == []
        assert rng(eng, "k", None, 10) == [rec("1", 10, 20)]
        assert rng(eng, "k", 45, None) == [rec("4", 40, 50), rec("5", 50, None)]
        assert rng(eng, "k", 0, 9) == []
        assert rng(eng, "nokey") == []
        with pytest.raises(InvalidQuery):
            rng(eng, "k", 5, 4)
        with pytest.raises(InvalidQuery):
            eng.versions("s", MultiVersionedKeyQuery("k"), limit=0)


def _iso(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp() * 1000)


@pytest.mark.rule(9, 11)
def test_kip_968_example(q_warehouse, q_engine):
    t1, t5, t10, t15, t20 = (
        _iso(f"2023-01-{d:02d}T10:00:00.00Z") for d in (1, 5, 10, 15, 20)
    )
    b = StoreBuilder(q_warehouse, "s", history_retention_ms=365 * DAY)
    b.apply([("1", "1", t1), ("1", None, t5), ("1", None, t10), ("1", "2", t15), ("1", "3", t20)])
    e = q_engine()
    for eng in (e, _FilesEngine(e, e._files_view("s", b.version))):
        # Example 1: no bounds = all versions.
        assert rng(eng, "1") == [rec("1", t1, t5), rec("2", t15, t20), rec("3", t20, None)]
        # Example 2: 2023-01-17 .. 2023-01-25.
        got = rng(eng, "1", _iso("2023-01-17T10:00:00Z"), _iso("2023-01-25T10:00:00Z"))
        assert got == [rec("2", t15, t20), rec("3", t20, None)]
        # fromTime before the first tombstone returns (k, v) validTo=2023-01-05; from >= it not.
        assert rng(eng, "1", t5 - 1, t5 - 1) == [rec("1", t1, t5)]
        assert rng(eng, "1", t5, t10) == []
        assert as_of(eng, "1", t10) == ("not-found", None)
        assert as_of(eng, "1", t15 + 1) == ("ok", rec("2", t15, t20))


# ---------------------------------------------------------------------------- paging
@pytest.mark.parametrize("asc", [True, False])
def test_paging_to_the_end(q_warehouse, q_engine, asc):
    b = StoreBuilder(q_warehouse, "s", history_retention_ms=10 * DAY)
    b.apply([("k", str(i), i * 10) for i in range(1, 8)] + [("k", None, 35)])
    e = q_engine()
    q = MultiVersionedKeyQuery("k", 15, 65, asc)
    want = rng(e, "k", 15, 65, asc)
    assert len(want) == 6
    for eng in (e, _FilesEngine(e, e._files_view("s", b.version))):
        for size in (1, 2, 3, 5, 6, 7):
            got: list[VersionedRecord] = []
            resume = None
            while True:
                page = eng.versions("s", q, resume_after=resume, limit=size)
                got.extend(page.records)
                assert len(page.records) <= size
                if page.resume_after is None:
                    break
                assert page.resume_after == page.records[-1].timestamp
                resume = page.resume_after
            assert got == want, size
        # Exactly `size` records left: resume_after is None (read one ahead).
        page = eng.versions("s", q, limit=6)
        assert len(page.records) == 6 and page.resume_after is None
    assert list(e.iter_versions("s", q, page_size=2)) == want
    assert list(e.iter_versions("s", q, page_size=2, snapshot=b.version)) == want


def test_iter_versions_pins_snapshot(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s", history_retention_ms=10 * DAY)
    b.apply([("k", str(i), i) for i in range(1, 6)])
    e = q_engine()
    it = e.iter_versions("s", MultiVersionedKeyQuery("k"), page_size=2)
    first = next(it)
    b.apply([("k", "new", 3), ("k", "more", 100)])
    e.refresh()
    rest = list(it)
    assert [first, *rest] == [rec(str(i), i, i + 1 if i < 5 else None) for i in range(1, 6)]


# ---------------------------------------------------------------------------- snapshots
def test_snapshot_answers_as_at_v(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s", history_retention_ms=50)
    v0 = b.apply([("a", "1", 10), ("a", "2", 20), ("b", "x", 5)])
    v1 = b.apply([("a", "3", 15), ("a", None, 100), ("b", "y", 90)])
    v2 = b.apply([("a", "4", 200), ("c", "z", 150)])
    e = q_engine()
    assert e.current_snapshot("s") == v2
    for v in (v0, v1, v2):
        ref = b.at[v]
        for key in ("a", "b", "c", "zz"):
            for t in (0, 5, 10, 14, 15, 19, 20, 50, 99, 100, 150, 199, 200, 300):
                r = e.get("s", VersionedKeyQuery(key, t), snapshot=v)
                assert r.snapshot == v
                want = ref.as_of(key, t)
                rr = r.record
                got_rec = None if rr is None else (rr.value, rr.timestamp, rr.valid_to)
                want_rec = None if want[1] is None else (want[1].value, want[1].timestamp, want[1].valid_to)
                assert (r.outcome, got_rec) == (want[0], want_rec), (v, key, t)
                assert r.horizon == ref.horizon(key)
            page = e.versions("s", MultiVersionedKeyQuery(key), snapshot=v)
            assert [(x.value, x.timestamp, x.valid_to) for x in page.records] == [
                (x.value, x.timestamp, x.valid_to) for x in ref.range(key, None, None)
            ]
            assert page.horizon == ref.horizon(key)
        info = e.store_info("s", snapshot=v)
        assert info.snapshot == v and info.stream_time == ref.stream_time
    assert e.store_info("s").counts["keys"] == 3


def test_snapshot_not_found_and_gone(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s")
    v0 = b.apply([("a", "1", 10)])
    b.apply([("a", "2", 20)])
    e = q_engine()
    with pytest.raises(SnapshotNotFound):
        e.get("s", VersionedKeyQuery("a"), snapshot=b.version + 1)
    with pytest.raises(SnapshotNotFound):
        e.versions("s", MultiVersionedKeyQuery("a"), snapshot=99)
    # A snapshot newer than the loaded one but on disk is answered from files.
    v2 = b.apply([("a", "3", 30)])
    assert e.current_snapshot("s") == v2 - 1
    assert e.get("s", VersionedKeyQuery("a"), snapshot=v2).record == rec("3", 30, None)
    # Compaction (optimize, a commit without versiq.state) then vacuum: v0's files are gone,
    # the current snapshot is still readable and keeps its stream time.
    from deltalake import DeltaTable

    dt = DeltaTable(b.path)
    dt.optimize.compact()
    dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    e2 = q_engine()
    assert e2.get("s", VersionedKeyQuery("a")).record == rec("3", 30, None)
    assert e2.store_info("s").stream_time == {0: 30}
    with pytest.raises(SnapshotGone):
        e2.get("s", VersionedKeyQuery("a", 10), snapshot=v0)
    with pytest.raises(SnapshotGone):
        e2.versions("s", MultiVersionedKeyQuery("a"), snapshot=v2)


def test_snapshot_log_cleaned_up_is_gone(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s")
    b.apply([("a", "1", 10)])
    b.apply([("a", "2", 20)])
    b.apply([("a", "3", 30)])
    from deltalake import DeltaTable

    DeltaTable(b.path).create_checkpoint()
    os.remove(layout.log_file(b.path, 0))
    os.remove(layout.log_file(b.path, 1))
    e = q_engine()
    assert e.get("s", VersionedKeyQuery("a")).record == rec("3", 30, None)
    with pytest.raises(SnapshotGone):
        e.get("s", VersionedKeyQuery("a"), snapshot=1)


# ---------------------------------------------------------------------------- stores
@pytest.mark.parametrize("name", ["../x", "..", ".hidden", "a/b", "", "x" * 101, "_delta_log", "a..b"])
def test_store_not_found_for_invalid_names(q_warehouse, q_engine, name):
    StoreBuilder(q_warehouse, "s").apply([("a", "1", 1)])
    e = q_engine()
    with pytest.raises(StoreNotFound):
        e.get(name, VersionedKeyQuery("a"))
    with pytest.raises(StoreNotFound):
        e.versions(name, MultiVersionedKeyQuery("a"))
    with pytest.raises(StoreNotFound):
        e.store_info(name)


def test_discovery_refused_and_ignored(q_warehouse, q_engine):
    StoreBuilder(q_warehouse, "good").apply([("a", "1", 1)])
    settings = layout.StoreSettings("versioned", DAY, 1, 4)
    future = json.dumps({"versiq.format": 2, "kind": "versioned", "historyRetentionMs": 1,
                         "partitions": 1, "buckets": 4})
    write_rows(os.path.join(q_warehouse, "future"), settings, [], layout.StoreState(), 1, description=future)
    weird = json.dumps({"versiq.format": 1, "kind": "bitemporal", "historyRetentionMs": 1,
                        "partitions": 1, "buckets": 4})
    write_rows(os.path.join(q_warehouse, "weird"), settings, [], layout.StoreState(), 1, description=weird)
    write_rows(os.path.join(q_warehouse, "plain"), settings, [], layout.StoreState(), 1,
               description="just a delta table")
    os.makedirs(os.path.join(q_warehouse, "nolog"))
    shutil.copytree(os.path.join(q_warehouse, "good"), os.path.join(q_warehouse, "_private"))
    e = q_engine()
    assert [s.name for s in e.list_stores()] == ["good"]
    ready = e.readiness()
    assert ready["ready"] is True
    assert set(ready["refused"]) == {"future", "weird"}
    assert "format" in ready["refused"]["future"]
    with pytest.raises(StoreNotFound):
        e.get("future", VersionedKeyQuery("a"))
    for name in ("plain", "nolog", "_private", "missing"):
        with pytest.raises(StoreNotFound):
            e.get(name, VersionedKeyQuery("a"))


def test_refresh_picks_up_commits_and_new_stores(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s", buckets=8)
    b.apply([(f"k{i}", "1", 1) for i in range(20)])
    e = q_engine()
    before = e._stores["s"].loaded
    assert before is not None
    assert e.get("s", VersionedKeyQuery("k1")).record == rec("1", 1, None)
    v = b.apply([("k1", "2", 2)])
    assert e.current_snapshot("s") == v - 1
    e.refresh()
    assert e.current_snapshot("s") == v
    assert e.get("s", VersionedKeyQuery("k1")).record == rec("2", 2, None)
    # Only the changed bucket was rebuilt; other buckets are shared.
    after = e._stores["s"].loaded
    assert after is not None
    changed = layout.bucket_of("k1", 8)
    for bk, idx in after.buckets.items():
        assert (idx is before.buckets[bk]) == (bk != changed)
    StoreBuilder(q_warehouse, "t").apply([("x", "9", 9)])
    with pytest.raises(StoreNotFound):
        e.get("t", VersionedKeyQuery("x"))
    e.refresh()
    assert e.get("t", VersionedKeyQuery("x")).record == rec("9", 9, None)
    assert [s.name for s in e.list_stores()] == ["s", "t"]


def test_background_refresh(q_warehouse):
    b = StoreBuilder(q_warehouse, "s")
    b.apply([("k", "1", 1)])
    import time

    with Engine(q_warehouse, refresh_interval_s=0.05) as e:
        v = b.apply([("k", "2", 2)])
        deadline = time.monotonic() + 10
        while e.current_snapshot("s") != v and time.monotonic() < deadline:
            time.sleep(0.02)
        assert e.get("s", VersionedKeyQuery("k")).record == rec("2", 2, None)
        assert e.readiness()["stores"]["s"]["lastRefreshAgeSeconds"] < 5


def test_failed_refresh_keeps_last_good_snapshot(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s")
    b.apply([("k", "1", 1)])
    e = q_engine()
    good = e.current_snapshot("s")
    # A corrupt next commit: the table cannot be brought up to date.
    with open(layout.log_file(b.path, good + 1), "w") as fh:
        fh.write("{not json\n")
    e.refresh()
    ready = e.readiness()
    assert ready["stores"]["s"]["error"]
    assert ready["stores"]["s"]["snapshot"] == good
    assert e.get("s", VersionedKeyQuery("k")).record == rec("1", 1, None)
    os.remove(layout.log_file(b.path, good + 1))
    b.apply([("k", "2", 2)])
    e.refresh()
    assert e.readiness()["stores"]["s"]["error"] is None
    assert e.get("s", VersionedKeyQuery("k")).record == rec("2", 2, None)


def test_failed_refresh_on_missing_data_file(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s", buckets=1)
    b.apply([("k", "1", 1)])
    e = q_engine()
    good = e.current_snapshot("s")
    b.apply([("k", "2", 2)])
    from deltalake import DeltaTable

    newest = set(DeltaTable(b.path).file_uris()) - set(DeltaTable(b.path, version=good).file_uris())
    for f in newest:
        os.remove(f)
    e.refresh()
    assert e.readiness()["stores"]["s"]["error"]
    assert e.current_snapshot("s") == good
    assert e.get("s", VersionedKeyQuery("k")).record == rec("1", 1, None)


# ---------------------------------------------------------------------------- max-run rule
def test_read_rule_max_run_wins(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "s", buckets=2)
    b.apply([("k", "1", 10), ("k", "2", 20)])
    # Run 2 rewrites (k, 10) with a stale row of run 1 appended again (must lose) and the
    # true row again under run 2 — in the same commit, different files/rows.
    bucket = layout.bucket_of("k", 2)
    stale = {"bucket": bucket, "key": "k", "valid_from": 10, "valid_to": None, "value": "stale",
             "tombstone": False, "partition": 0, "run": 1}
    b.commit(extra_rows=[stale, {**stale, "valid_to": 20, "value": "1", "run": 2}])
    b.apply([("k", "3", 5)])
    e = q_engine()
    for eng in (e, _FilesEngine(e, e._files_view("s", b.version))):
        assert rng(eng, "k") == [rec("3", 5, 10), rec("1", 10, 20), rec("2", 20, None)]
    assert e.store_info("s").counts["versions"] == 3


# ---------------------------------------------------------------------------- timestamped
@pytest.mark.rule(12)
def test_timestamped_store_latest_only(q_warehouse, q_engine):
    b = StoreBuilder(q_warehouse, "ts", kind="timestamped")
    b.apply([("a", "1", 10), ("a", "2", 5), ("b", "1", 1), ("b", None, 2)])
    b.apply([("c", "x", 100)])
    e = q_engine()
    for snap in (None, b.version, b.version - 1):
        r = e.get("ts", VersionedKeyQuery("a"), snapshot=snap)
        # Latest by processing order, not by timestamp (KIP-258).
        assert (r.outcome, r.record) == ("ok", rec("2", 5, None))
        assert e.get("ts", VersionedKeyQuery("b"), snapshot=snap).outcome == "not-found"
        with pytest.raises(UnsupportedQuery):
            e.get("ts", VersionedKeyQuery("a", 10), snapshot=snap)
        with pytest.raises(UnsupportedQuery):
            e.versions("ts", MultiVersionedKeyQuery("a"), snapshot=snap)
    assert e.get("ts", VersionedKeyQuery("c")).record == rec("x", 100, None)
    assert e.get("ts", VersionedKeyQuery("c"), snapshot=b.version - 1).outcome == "not-found"
    with pytest.raises(UnsupportedQuery):
        list(e.iter_versions("ts", MultiVersionedKeyQuery("a")))
    assert e.store_info("ts").kind == "timestamped"


# ---------------------------------------------------------------------------- partitions
@pytest.mark.rule(19, 22)
@pytest.mark.parametrize("partitioner", layout.PARTITIONERS)
def test_explicit_partitions_use_the_keys_partition(q_warehouse, q_engine, partitioner):
    from tests.support.reference import InRecord
    b = StoreBuilder(q_warehouse, "s", history_retention_ms=10, partitions=2, partitioner=partitioner)
    # Key "a" explicitly lives in partition 1, whose stream time stays 20; partition 0 moves to 1000.
    b.apply([
        InRecord("f", 0, "a", "1", 5, partition=1),
        InRecord("f", 1, "a", "2", 20, partition=1),
        InRecord("f", 2, "z", "1", 1000, partition=0),
    ])
    e = q_engine()
    for snap in (None, 0):
        r = e.get("s", VersionedKeyQuery("a", 10), snapshot=snap)
        assert (r.outcome, r.horizon) == ("ok", 10)
        assert r.record == rec("1", 5, 20)
        # A key without rows: the horizon of its default partition by the store's partitioner
        # ("d": crc32 puts it in 0, Kafka's murmur2 in 1).
        nokey = e.get("s", VersionedKeyQuery("d", 0), snapshot=snap)
        assert nokey.horizon == {layout.CRC32: 990, layout.MURMUR2: 10}[partitioner]
        assert nokey.outcome == "not-found"


def test_readers_never_see_a_half_built_index(q_warehouse, q_engine):
    import threading
    import time

    b = StoreBuilder(q_warehouse, "s", buckets=4)
    b.apply([(f"k{i}", "0", 0) for i in range(50)])
    e = q_engine()
    stop = threading.Event()
    seen: list[tuple[int, str | None, str | None]] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                for key in ("k1", "k2", "k33"):
                    r = e.get("s", VersionedKeyQuery(key))
                    seen.append((r.snapshot, key, None if r.record is None else r.record.value))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for run in range(1, 5):
        b.apply([(f"k{i}", str(run), run) for i in range(50)])
        e.refresh()
    # under load the readers may not have been scheduled since the last swap: let them see it
    deadline = time.monotonic() + 30
    while not any(s == b.version for s, _, _ in list(seen)) and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert {s for s, _, _ in seen} >= {b.version}
    for snap, key, value in seen:
        want = b.at[snap].latest(key)
        assert value == (None if want is None else want.value)
