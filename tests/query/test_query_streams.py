"""Query engine over streams (query/streams.py) and derived-table provenance.

Streams are real Delta tables written in the versiq stream layout by
``tests/support/storebuilder.StreamBuilder``; answers are checked against a plain Python filter/sort
of the records written (the stream-order reference).
"""

from __future__ import annotations

import glob
import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.storebuilder import StoreBuilder, StreamBuilder, StreamRow
from versiq import layout
from versiq.query.api import InvalidQuery, SnapshotGone, SnapshotNotFound, StoreNotFound, StreamNotFound
from versiq.query.engine import Engine
from versiq.query.streams import StreamPosition, StreamRecord, StreamRecordsQuery

KEYS = ["a", "b", "c", "é/x%2F", "k 1", "z"]


def expected(rows: list[StreamRow], q: StreamRecordsQuery) -> list[StreamRecord]:
    """The stream-order reference: filter, then sort by (run, seq), reversed for desc."""
    out = [
        StreamRecord(r.key, r.value, r.timestamp, r.run, r.seq)
        for r in rows
        if (q.key is None or r.key == q.key)
        and (q.from_time is None or r.timestamp >= q.from_time)
        and (q.to_time is None or r.timestamp <= q.to_time)
    ]
    out.sort(key=lambda r: (r.run, r.sequence), reverse=not q.ascending)
    return out


def collect(engine: Engine, name: str, q: StreamRecordsQuery, page_size: int, snapshot=None):
    records: list[StreamRecord] = []
    resume = None
    pages = 0
    while True:
        page = engine.stream_records(name, q, snapshot=snapshot, resume_after=resume, limit=page_size)
        pages += 1
        records += page.records
        if page.resume_after is None:
            return records, pages
        assert len(page.records) == page_size  # read one ahead: no short page before the end
        assert page.resume_after == page.records[-1].position
        resume = page.resume_after


def record_list(i0: int, n: int) -> list[tuple[str, str | None, int]]:
    """Deterministic records: keys cycle, timestamps are a permutation (not stream order)."""
    return [
        (KEYS[(i * 7) % len(KEYS)], None if i % 5 == 3 else f'{{"i":{i},"x":1.50}}', 1000 + (i * 13) % 61)
        for i in range(i0, i0 + n)
    ]


@pytest.fixture(scope="module")
def q_stream_wh(tmp_path_factory):
    wh = str(tmp_path_factory.mktemp("swh"))
    s = StreamBuilder(wh, "s", buckets=4)
    s.append(record_list(0, 25))
    s.append(record_list(25, 20))
    s.append([])  # an empty run: a commit without files
    s.append(record_list(45, 16), inputs={"src": 3}, sources={"src": {"run": 2, "snapshot": 3}})
    store = StoreBuilder(wh, "st")
    store.apply([("k", "1", 1)])
    store.apply([("k", "2", 2)], inputs={"s": 1, "other": 4}, sources={"clicks": {"run": 7, "snapshot": 9}})
    return wh, s, store


@pytest.fixture(scope="module")
def q_stream_engine(q_stream_wh):
    e = Engine(q_stream_wh[0], refresh_interval_s=3600)
    e.refresh()
    yield e
    e.close()


# ---------------------------------------------------------------------------- discovery
def test_streams_are_not_stores(q_stream_wh, q_stream_engine):
    e = q_stream_engine
    assert [s.name for s in e.list_stores()] == ["st"]
    assert [s.name for s in e.list_streams()] == ["s"]
    with pytest.raises(StoreNotFound, match="is a stream"):
        e.store_info("s")
    with pytest.raises(StreamNotFound, match="is a store"):
        e.stream_info("st")
    for bad in ("nope", "", "..", "_x", "a/b"):
        with pytest.raises(StreamNotFound):
            e.stream_info(bad)
    ready = e.readiness()
    assert ready["ready"] is True and set(ready["stores"]) == {"st"}
    assert ready["streams"]["s"]["snapshot"] == q_stream_wh[1].version
    assert ready["streams"]["s"]["error"] is None


def test_stream_info_and_provenance(q_stream_wh, q_stream_engine):
    e = q_stream_engine
    s = q_stream_wh[1]
    info = e.stream_info("s")
    assert info.snapshot == s.version == 3 and info.last_run == 4 and info.buckets == 4
    assert info.counts["records"] == 61 and info.counts["files"] >= 4
    assert info.min_timestamp == min(r.timestamp for r in s.records)
    assert info.max_timestamp == max(r.timestamp for r in s.records)
    assert info.inputs == {"src": 3} and info.sources == {"src": {"run": 2, "snapshot": 3}}
    old = e.stream_info("s", snapshot=0)
    assert old.snapshot == 0 and old.last_run == 1 and old.counts["records"] == 25
    assert old.inputs == {} and old.sources == {}
    # a run without records still moves the snapshot and the last run
    assert e.stream_info("s", snapshot=2).last_run == 3
    assert e.stream_info("s", snapshot=2).counts == e.stream_info("s", snapshot=1).counts
    # derived store: provenance of the answering snapshot; ordinary snapshot: empty
    st_info = e.store_info("st")
    assert st_info.inputs == {"s": 1, "other": 4}
    assert st_info.sources == {"clicks": {"run": 7, "snapshot": 9}}
    first = e.store_info("st", snapshot=0)
    assert first.inputs == {} and first.sources == {}


# ---------------------------------------------------------------------------- records
def test_order_key_and_bounds(q_stream_wh, q_stream_engine):
    e = q_stream_engine
    rows = q_stream_wh[1].records
    everything = e.stream_records("s", StreamRecordsQuery(), limit=1000)
    assert everything.records == expected(rows, StreamRecordsQuery())
    assert [r.position for r in everything.records] == sorted(r.position for r in everything.records)
    assert everything.resume_after is None and everything.snapshot == 3
    assert any(r.value is None for r in everything.records)
    assert everything.records[0] == StreamRecord("a", '{"i":0,"x":1.50}', 1000, 1, 1)
    desc = e.stream_records("s", StreamRecordsQuery(ascending=False), limit=1000).records
    assert desc == everything.records[::-1]
    for key in [*KEYS, "missing"]:
        for asc in (True, False):
            q = StreamRecordsQuery(key, ascending=asc)
            assert e.stream_records("s", q, limit=1000).records == expected(rows, q), key
    # bounds are inclusive on both ends
    ts = sorted({r.timestamp for r in rows})
    lo, hi = ts[3], ts[10]
    got = e.stream_records("s", StreamRecordsQuery(None, lo, hi), limit=1000).records
    assert got == expected(rows, StreamRecordsQuery(None, lo, hi))
    assert {r.timestamp for r in got} == set(ts[3:11])
    one = e.stream_records("s", StreamRecordsQuery(None, lo, lo), limit=1000).records
    assert one and all(r.timestamp == lo for r in one)
    assert e.stream_records("s", StreamRecordsQuery(None, ts[-1] + 1), limit=10).records == []
    assert e.stream_records("s", StreamRecordsQuery("a", None, ts[0] - 1), limit=10).records == []


@pytest.mark.parametrize("page_size", [1, 4, 7, 61, 1000])
def test_paging_to_the_end(q_stream_wh, q_stream_engine, page_size):
    e = q_stream_engine
    rows = q_stream_wh[1].records
    for q in (StreamRecordsQuery(), StreamRecordsQuery(ascending=False), StreamRecordsQuery("b"),
              StreamRecordsQuery("c", 1010, 1040, ascending=False)):
        got, pages = collect(e, "s", q, page_size)
        want = expected(rows, q)
        assert got == want
        assert pages == max(1, -(-len(want) // page_size))  # no empty trailing page


def test_iter_stream_records(q_stream_wh, q_stream_engine):
    rows = q_stream_wh[1].records
    q = StreamRecordsQuery(ascending=False)
    assert list(q_stream_engine.iter_stream_records("s", q, page_size=3)) == expected(rows, q)
    assert list(q_stream_engine.iter_stream_records("s", q, snapshot=0, page_size=5)) == expected(
        q_stream_wh[1].at[0], q
    )


def test_invalid_queries(q_stream_engine):
    e = q_stream_engine
    with pytest.raises(InvalidQuery, match="after"):
        e.stream_records("s", StreamRecordsQuery(None, 5, 4))
    with pytest.raises(InvalidQuery, match="empty"):
        e.stream_records("s", StreamRecordsQuery(""))
    for bad in (0, -1, True):
        with pytest.raises(InvalidQuery):
            e.stream_records("s", StreamRecordsQuery(), limit=bad)
    with pytest.raises(StreamNotFound):
        e.stream_records("nope", StreamRecordsQuery())


# ---------------------------------------------------------------------------- snapshots
def test_snapshot_reads(q_stream_wh, q_stream_engine):
    e = q_stream_engine
    s = q_stream_wh[1]
    for v, rows in s.at.items():
        for q in (StreamRecordsQuery(), StreamRecordsQuery("a", ascending=False)):
            got, _ = collect(e, "s", q, 6, snapshot=v)
            assert got == expected(rows, q), (v, q)
            assert e.stream_records("s", q, snapshot=v).snapshot == v
    # a position carried from a page of snapshot 0 continues within snapshot 0 only
    page = e.stream_records("s", StreamRecordsQuery(), snapshot=0, limit=20)
    rest = e.stream_records("s", StreamRecordsQuery(), snapshot=0, resume_after=page.resume_after, limit=100)
    assert [r.sequence for r in rest.records] == [21, 22, 23, 24, 25] and rest.resume_after is None
    with pytest.raises(SnapshotNotFound):
        e.stream_records("s", StreamRecordsQuery(), snapshot=4)
    with pytest.raises(SnapshotNotFound):
        e.stream_info("s", snapshot=99)


@settings(max_examples=40)
@given(
    key=st.one_of(st.none(), st.sampled_from([*KEYS, "q"])),
    lo=st.one_of(st.none(), st.integers(995, 1065)),
    hi=st.one_of(st.none(), st.integers(995, 1065)),
    asc=st.booleans(),
    page_size=st.integers(1, 30),
    snapshot=st.sampled_from([None, 0, 1, 2, 3]),
)
def test_property_pages_equal_reference(q_stream_wh, q_stream_engine, key, lo, hi, asc, page_size, snapshot):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    s = q_stream_wh[1]
    q = StreamRecordsQuery(key, lo, hi, asc)
    got, _ = collect(q_stream_engine, "s", q, page_size, snapshot=snapshot)
    assert got == expected(s.at[s.version if snapshot is None else snapshot], q)


# ---------------------------------------------------------------------------- lifecycle
def test_refresh_picks_up_runs_and_new_streams(tmp_path):
    wh = str(tmp_path)
    s = StreamBuilder(wh, "s")
    s.append(record_list(0, 5))
    e = Engine(wh, refresh_interval_s=3600)
    try:
        e.refresh()
        page = e.stream_records("s", StreamRecordsQuery(), limit=3)
        assert page.snapshot == 0
        s.append(record_list(5, 5))
        t = StreamBuilder(wh, "t")
        t.append(record_list(0, 2))
        # before a refresh the current snapshot is still 0; V=1 is readable from files already
        assert e.stream_info("s").snapshot == 0
        assert e.stream_info("s", snapshot=1).counts["records"] == 10
        # the pinned position continues in snapshot 0
        rest = e.stream_records("s", StreamRecordsQuery(), snapshot=0, resume_after=page.resume_after)
        assert [r.sequence for r in rest.records] == [4, 5]
        e.refresh()
        assert e.stream_info("s").snapshot == 1 and e.current_stream_snapshot("s") == 1
        assert [x.name for x in e.list_streams()] == ["s", "t"]
        assert len(e.stream_records("s", StreamRecordsQuery()).records) == 10
    finally:
        e.close()


def test_vacuumed_snapshot_is_gone(tmp_path):
    wh = str(tmp_path)
    s = StreamBuilder(wh, "s", buckets=1)
    s.append(record_list(0, 5))
    s.append(record_list(5, 5))
    e = Engine(wh, refresh_interval_s=3600)
    try:
        e.refresh()
        assert len(e.stream_records("s", StreamRecordsQuery(), snapshot=0).records) == 5
        dt = DeltaTable(s.path)
        dt.optimize.compact()
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        with pytest.raises(SnapshotGone):  # the cached file list points at removed files
            e.stream_records("s", StreamRecordsQuery(), snapshot=0)
        with pytest.raises(SnapshotGone):
            e.stream_records("s", StreamRecordsQuery(), snapshot=1)
        e.refresh()
        # compaction keeps every record and its stream position
        assert e.stream_records("s", StreamRecordsQuery(), limit=100).records == expected(
            s.records, StreamRecordsQuery()
        )
        # the log of version 0 cleaned up as well (after a checkpoint): gone, not an error
        DeltaTable(s.path).create_checkpoint()
        os.remove(layout.log_file(s.path, 0))
        e2 = Engine(wh, refresh_interval_s=3600)
        try:
            e2.refresh()
            with pytest.raises(SnapshotGone):
                e2.stream_info("s", snapshot=0)
        finally:
            e2.close()
    finally:
        e.close()


def test_key_reads_open_only_the_keys_bucket(tmp_path):
    """Bucket pruning: with another bucket's file missing, key reads of other buckets still
    work (they never open it), while a read of every key fails as gone."""
    wh = str(tmp_path)
    s = StreamBuilder(wh, "s", buckets=4)
    s.append(record_list(0, 30))
    by_bucket = {layout.bucket_of(k, 4) for k in KEYS}
    assert len(by_bucket) >= 2
    victim_key = KEYS[0]
    victim = layout.bucket_of(victim_key, 4)
    for f in glob.glob(os.path.join(s.path, f"bucket={victim}", "*.parquet")):
        os.remove(f)
    e = Engine(wh, refresh_interval_s=3600)
    try:
        e.refresh()
        for key in KEYS:
            q = StreamRecordsQuery(key)
            if layout.bucket_of(key, 4) == victim:
                with pytest.raises(SnapshotGone):
                    e.stream_records("s", q)
            else:
                assert e.stream_records("s", q).records == expected(s.records, q)
        with pytest.raises(SnapshotGone):
            e.stream_records("s", StreamRecordsQuery())
    finally:
        e.close()


def test_unknown_format_stream_is_refused(tmp_path):
    wh = str(tmp_path)
    StreamBuilder(wh, "ok").append(record_list(0, 3))
    table = pa.Table.from_pylist([], schema=layout.STREAM_SCHEMA)
    description = json.dumps({layout.FORMAT_KEY: 2, "kind": "stream", "historyRetentionMs": 0,
                              "partitions": 1, "buckets": 4})
    write_deltalake(os.path.join(wh, "future"), table, partition_by=["bucket"], description=description)
    e = Engine(wh, refresh_interval_s=3600)
    try:
        e.refresh()
        state = e.readiness()
        assert set(state["streams"]) == {"ok"} and "future" in state["refused"]
        with pytest.raises(StreamNotFound, match="refused"):
            e.stream_info("future")
    finally:
        e.close()


def test_stream_position_order():
    assert StreamPosition(1, 9) < StreamPosition(2, 1) < StreamPosition(2, 2)
