"""Property tests of the reads beyond one key (issue 16) against the reference model: random
changelogs split into runs (real Delta stores written by ``StoreBuilder``), then

- point-in-time lookups of random ``(key, asOf)`` pairs at a random snapshot equal the single-key
  reads of that snapshot (item 3; rule 31);
- the change feed of a random window ``(V, W]``, upserted by (key, validFrom) over the versions
  of snapshot V, gives the versions of snapshot W, paged or streamed (item 5).
"""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.reference import InRecord, ReferenceStore
from tests.support.storebuilder import StoreBuilder
from versiq.query.api import VersionedKeyQuery
from versiq.query.engine import Engine

KEYS = ["a", "b", "c", "é/x"]
record = st.tuples(st.sampled_from(KEYS), st.sampled_from([None, "1", '"x"', '{"v":2}']), st.integers(0, 60),
                   st.one_of(st.none(), st.integers(0, 1)))
runs_st = st.lists(st.lists(record, min_size=1, max_size=10), min_size=1, max_size=4)
SETTINGS = settings(max_examples=30, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _versions(ref: ReferenceStore) -> dict[str, list[tuple[int, str | None, int | None]]]:
    return {k: [(v.timestamp, v.value, v.valid_to) for v in ref.all_versions(k)]
            for k in ref.versions if ref.all_versions(k)}


def _store(wh: str, runs: list[list[tuple]], h: int, partitions: int) -> StoreBuilder:
    b = StoreBuilder(wh, "s", history_retention_ms=h, partitions=partitions, buckets=2)
    for i, run in enumerate(runs):
        b.apply([InRecord(f"f{i}", j, k, v, t, p) for j, (k, v, t, p) in enumerate(run)])
    return b


@pytest.mark.rule(31)
@SETTINGS
@given(runs=runs_st, h=st.sampled_from([0, 10, 1000]), partitions=st.integers(1, 2), data=st.data())
def test_lookups_equal_single_key_reads(runs, h, partitions, data):
    with tempfile.TemporaryDirectory() as wh:
        b = _store(wh, runs, h, partitions)
        with Engine(wh, refresh_interval_s=3600) as engine:
            snapshot = data.draw(st.sampled_from(sorted(b.at)), label="snapshot")
            pairs = data.draw(st.lists(st.tuples(st.sampled_from([*KEYS, "zz"]),
                                                 st.one_of(st.none(), st.integers(-1, 65))), min_size=1,
                                       max_size=40), label="pairs")
            pairs = [(k, None if t is not None and t < 0 else t) for k, t in pairs]
            answered, results = engine.lookup("s", pairs, snapshot)
            assert answered == snapshot
            for (key, as_of), result in zip(pairs, results, strict=True):
                assert result == engine.get("s", VersionedKeyQuery(key, as_of), snapshot=snapshot), (key, as_of)


@SETTINGS
@given(runs=runs_st, data=st.data())
def test_the_change_feed_replayed_over_v_gives_w(runs, data):
    with tempfile.TemporaryDirectory() as wh:
        b = _store(wh, runs, 10 ** 6, 1)
        snapshots = sorted(b.at)
        with Engine(wh, refresh_interval_s=3600) as engine:
            w = data.draw(st.sampled_from(snapshots), label="W")
            v = data.draw(st.sampled_from([-1, *[s for s in snapshots if s <= w]]), label="V")
            page_size = data.draw(st.integers(1, 7), label="page size")
            changes, resume = [], None
            while True:
                page = engine.changes("s", v, w, resume, page_size)
                assert page.snapshot == w
                changes += page.changes
                if page.resume_after is None:
                    break
                resume = page.resume_after
            assert [c.position() for c in changes] == sorted(c.position() for c in changes)
            until, batches = engine.stream_changes("s", v, w)
            streamed = [(s, row["key"], row["timestamp"]) for s, batch in batches for row in batch.to_pylist()]
            assert until == w and streamed == [c.position() for c in changes]
            replayed = {k: {t: (t, val, vt) for t, val, vt in vs} for k, vs in
                        (_versions(b.at[v]) if v >= 0 else {}).items()}
            for c in changes:
                replayed.setdefault(c.key, {})[c.timestamp] = (c.timestamp, c.value, c.valid_to)
            assert {k: [vs[t] for t in sorted(vs)] for k, vs in replayed.items() if vs} == _versions(b.at[w])
