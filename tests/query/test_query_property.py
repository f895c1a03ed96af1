"""Property test: the query engine agrees with the reference model (tests/support/reference.py) on random
changelogs split into runs, on the in-memory index (current snapshot) AND the DuckDB path
(``snapshot=V`` for every version written, including the current one read from files)."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.reference import InRecord, ReferenceStore
from tests.support.storebuilder import StoreBuilder
from versiq.query.api import MultiVersionedKeyQuery, UnsupportedQuery, VersionedKeyQuery
from versiq.query.engine import Engine

KEYS = ["a", "b", "c", "é/x%2F", "k 1"]
PROBE_KEYS = [*KEYS, "zz"]
VALUES = [None, "1", '""', '{"v":2}', "null"]
BOUNDS = [None, 0, 3, 10, 17, 25, 40]

record = st.tuples(
    st.sampled_from(KEYS),
    st.sampled_from(VALUES),
    st.integers(0, 40),
    st.one_of(st.none(), st.integers(0, 1)),
)
runs_st = st.lists(st.lists(record, max_size=12), min_size=1, max_size=3)


def _t(v):
    return None if v is None else (v.value, v.timestamp, v.valid_to)


def _td(v):
    """A version with whether it is a tombstone (the model's: a None value)."""
    return (v.value, v.timestamp, v.valid_to, getattr(v, "deleted", v.value is None))


def _check_key(eng, ref: ReferenceStore, key: str, snapshot, ts_list, ranges, page_size: int) -> None:
    if ref.kind == "timestamped":
        r = eng.get("s", VersionedKeyQuery(key), snapshot=snapshot)
        want = ref.latest(key)
        assert (r.outcome == "ok") == (want is not None)
        assert _t(r.record) == _t(want)
        return
    r = eng.get("s", VersionedKeyQuery(key), snapshot=snapshot)
    assert _t(r.record) == _t(ref.latest(key)), key
    assert r.outcome == ("not-found" if r.record is None else "ok")
    assert r.horizon == ref.horizon(key)
    for t in ts_list:
        r = eng.get("s", VersionedKeyQuery(key, t), snapshot=snapshot)
        outcome, want = ref.as_of(key, t)
        assert (r.outcome, _t(r.record)) == (outcome, _t(want)), (key, t, snapshot)
    for lo, hi in ranges:
        for asc in (True, False):
            q = MultiVersionedKeyQuery(key, lo, hi, asc)
            want_list = [_t(v) for v in ref.range(key, lo, hi, asc)]
            page = eng.versions("s", q, snapshot=snapshot, limit=1000)
            assert [_t(v) for v in page.records] == want_list, (key, lo, hi, asc, snapshot)
            assert page.resume_after is None and page.horizon == ref.horizon(key)
            got = []
            resume = None
            while True:
                page = eng.versions("s", q, snapshot=snapshot, resume_after=resume, limit=page_size)
                got.extend(page.records)
                if page.resume_after is None:
                    break
                resume = page.resume_after
            assert [_t(v) for v in got] == want_list
            # rule 32: the range's edges, and tombstones when asked (values unchanged)
            assert (page.expired, page.truncated) == ref.range_edges(key, lo, hi), (key, lo, hi, snapshot)
            deleted_q = MultiVersionedKeyQuery(key, lo, hi, asc, include_deleted=True)
            with_deleted = eng.versions("s", deleted_q, snapshot=snapshot, limit=1000).records
            assert [_td(v) for v in with_deleted] == [_td(v) for v in ref.range(key, lo, hi, asc, True)]
            assert [_t(v) for v in with_deleted if not v.deleted] == want_list


@settings(
    max_examples=50,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    kind=st.sampled_from(["versioned", "versioned", "versioned", "timestamped"]),
    h=st.sampled_from([0, 3, 10, 1000]),
    partitions=st.integers(1, 2),
    buckets=st.integers(1, 4),
    runs=runs_st,
    data=st.data(),
)
@pytest.mark.rule(6, 7, 8, 9, 10, 11, 12, 22, 32)
def test_engine_matches_reference(kind, h, partitions, buckets, runs, data):
    with tempfile.TemporaryDirectory() as wh:
        b = StoreBuilder(wh, "s", kind=kind, history_retention_ms=h, partitions=partitions, buckets=buckets)
        for i, run in enumerate(runs):
            b.apply([InRecord(f"f{i}", j, k, v, t, p) for j, (k, v, t, p) in enumerate(run)])
        eng = Engine(wh, refresh_interval_s=3600)
        try:
            eng.refresh()
            assert eng.current_snapshot("s") == b.version
            ranges = [(lo, hi) for lo in BOUNDS for hi in BOUNDS if lo is None or hi is None or lo <= hi]
            # Index path (current snapshot): exhaustive probes.
            for key in PROBE_KEYS:
                _check_key(eng, b.ref, key, None, range(-1, 43), ranges, page_size=1)
            # DuckDB path at every version written (current one included, forced to files).
            for v, ref in b.at.items():
                files = eng._files_view("s", v)
                orig = eng._view
                eng._view = lambda store, snap, _f=files: _f  # type: ignore[method-assign]
                try:
                    key = data.draw(st.sampled_from(PROBE_KEYS), label="key")
                    ts_list = data.draw(st.lists(st.integers(-1, 42), min_size=1, max_size=6), label="ts")
                    rs = data.draw(st.lists(st.sampled_from(ranges), max_size=3), label="ranges")
                    for k in dict.fromkeys([key, *KEYS[:2]]):
                        _check_key(eng, ref, k, v, ts_list, rs, page_size=2)
                finally:
                    eng._view = orig  # type: ignore[method-assign]
                # And through the public API with snapshot=V.
                for k in KEYS[:3]:
                    r = eng.get("s", VersionedKeyQuery(k), snapshot=v)
                    assert r.snapshot == v and _t(r.record) == _t(ref.latest(k))
            if kind == "timestamped":
                try:
                    eng.versions("s", MultiVersionedKeyQuery("a"))
                except UnsupportedQuery:
                    pass
                else:
                    raise AssertionError("versions on a timestamped store must be refused")
        finally:
            eng.close()
