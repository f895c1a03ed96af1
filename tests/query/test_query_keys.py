"""Queries beyond one key (issue 16): the key listing and many keys at once agree with the
reference model (tests/support/reference.py) on random changelogs split into runs, random key
ranges, prefixes and as-of times, on the in-memory index (current snapshot) AND the DuckDB path
(every snapshot written, read from files), across page sizes; and a batch answers exactly what
the single-key reads of the same snapshot answer."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.reference import InRecord, ReferenceStore
from tests.support.storebuilder import StoreBuilder
from versiq.query.api import InvalidQuery, KeyEntry, KeysQuery, UnsupportedQuery, VersionedKeyQuery
from versiq.query.engine import Engine
from versiq.query.reads import prefix_end

KEYS = ["a", "ab", "abc", "b", "b/1", "é", "é/x", "k 1", "\U0001f600", "\uffff"]
VALUES = [None, "1", '""', '{"v":2}']
BOUNDS = [None, "", "a", "ab", "b", "b/", "c", "é", "\U0001f600"]

# a few keys get many versions
record = st.tuples(st.sampled_from(KEYS[:3] * 3 + KEYS), st.sampled_from(VALUES), st.integers(0, 40),
                   st.one_of(st.none(), st.integers(0, 1)))
runs_st = st.lists(st.lists(record, max_size=14), min_size=1, max_size=3)


def model_entry(ref: ReferenceStore, key: str, t: int | None, include_deleted: bool) -> KeyEntry | None:
    """What the listing shows for ``key``, from the model alone."""
    if ref.kind == "timestamped":
        current = ref.current.get(key)
        if current is None:
            return None
        if current[0] is None:
            return KeyEntry(key, None, current[1], None, True) if include_deleted else None
        return KeyEntry(key, current[0], current[1], None)
    versions = ref.all_versions(key)
    if not versions:
        return None
    if t is None:
        last = versions[-1]
        if last.value is not None:
            return KeyEntry(key, last.value, last.timestamp, None)
        return KeyEntry(key, None, last.timestamp, None, True) if include_deleted else None
    outcome, found = ref.as_of(key, t)
    if outcome == "ok" and found is not None:
        return KeyEntry(key, found.value, found.timestamp, found.valid_to)
    if outcome == "expired" or not include_deleted:
        return None
    h = ref.horizon(key)
    answering = [v for v in versions if v.timestamp <= t]
    if h is not None and t < h:
        answering = [versions[-1]] if versions[-1].timestamp <= t else []
    if answering and answering[-1].value is None:
        return KeyEntry(key, None, answering[-1].timestamp, answering[-1].valid_to, True)
    return None


def model_keys(ref: ReferenceStore, q: KeysQuery) -> list[KeyEntry]:
    keys = set(ref.versions) | set(ref.current)
    out = []
    for key in sorted(keys):  # code-point order = UTF-8 byte order
        if q.prefix is not None and not key.startswith(q.prefix):
            continue
        if (q.start is not None and key < q.start) or (q.end is not None and key >= q.end):
            continue
        entry = model_entry(ref, key, q.as_of, q.include_deleted)
        if entry is not None:
            out.append(entry)
    return out


def _all_pages(eng: Engine, q: KeysQuery, snapshot: int | None, page_size: int) -> list[KeyEntry]:
    got: list[KeyEntry] = []
    resume = None
    while True:
        page = eng.keys("s", q, snapshot=snapshot, resume_after=resume, limit=page_size)
        assert len(page.entries) <= page_size
        got.extend(page.entries)
        if page.resume_after is None:
            return got
        assert page.entries and page.resume_after == page.entries[-1].key
        resume = page.resume_after


def _check(eng: Engine, ref: ReferenceStore, snapshot: int | None, queries: list[KeysQuery]) -> None:
    for q in queries:
        want = model_keys(ref, q)
        for size in (1, 2, 1000):
            assert _all_pages(eng, q, snapshot, size) == want, (q, size, snapshot)
        # a batch answers what the single-key reads of the same snapshot answer
        keys = [*KEYS, "zz"]
        snap, results = eng.get_many("s", keys, q.as_of, snapshot)
        for key, result in zip(keys, results, strict=True):
            single = eng.get("s", VersionedKeyQuery(key, q.as_of), snapshot=snap)
            assert result == single, (key, q.as_of)


@settings(max_examples=60, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(kind=st.sampled_from(["versioned", "versioned", "timestamped"]), h=st.sampled_from([0, 3, 10, 1000]),
       partitions=st.integers(1, 2), buckets=st.integers(1, 4), runs=runs_st, data=st.data())
@pytest.mark.rule(6, 7, 8, 12, 22, 31)
def test_key_listing_and_batches_match_the_model(kind: str, h: int, partitions: int, buckets: int,
                                                 runs: list[Any], data: Any) -> None:
    with tempfile.TemporaryDirectory() as wh:
        b = StoreBuilder(wh, "s", kind=kind, history_retention_ms=h, partitions=partitions, buckets=buckets)
        for i, run in enumerate(runs):
            b.apply([InRecord(f"f{i}", j, k, v, t, p) for j, (k, v, t, p) in enumerate(run)])
        query = st.builds(
            KeysQuery,
            prefix=st.sampled_from(BOUNDS), start=st.sampled_from(BOUNDS), end=st.sampled_from(BOUNDS),
            as_of=st.none() if kind == "timestamped" else st.one_of(st.none(), st.integers(-1, 42)),
            include_deleted=st.booleans(),
        ).filter(lambda q: q.start is None or q.end is None or q.start <= q.end)
        eng = Engine(wh, refresh_interval_s=3600)
        try:
            eng.refresh()
            _check(eng, b.ref, None, data.draw(st.lists(query, min_size=1, max_size=5), label="index"))
            for v, ref in b.at.items():  # the DuckDB path, every snapshot (the current one too)
                files = eng._files_view("s", v)
                orig = eng._view
                eng._view = lambda store, snap, _f=files: _f  # type: ignore[method-assign]
                try:
                    _check(eng, ref, v, data.draw(st.lists(query, min_size=1, max_size=2), label=f"files {v}"))
                finally:
                    eng._view = orig  # type: ignore[method-assign]
        finally:
            eng.close()


@pytest.mark.rule(7, 31)
def test_deleted_entries_show_the_tombstone_that_answers(tmp_path: Any) -> None:
    """A key deleted at 5 and set again at 10: as of 7 it is a deleted entry valid [5, 10), and
    left out without includeDeleted; as of 12 (and latest) it has its value."""
    b = StoreBuilder(str(tmp_path), "s", kind="versioned", history_retention_ms=1000, partitions=1, buckets=2)
    b.apply([InRecord("f", 0, "a", '"x"', 1, None), InRecord("f", 1, "a", None, 5, None),
             InRecord("f", 2, "a", "1", 10, None), InRecord("f", 3, "b", None, 3, None)])
    with Engine(str(tmp_path), refresh_interval_s=3600) as eng:
        def listing(**kw: Any) -> list[KeyEntry]:
            return eng.keys("s", KeysQuery(**kw)).entries
        assert listing(as_of=7, include_deleted=True) == [KeyEntry("a", None, 5, 10, True),
                                                          KeyEntry("b", None, 3, None, True)]
        assert listing(as_of=7) == []
        assert listing(as_of=12) == [KeyEntry("a", "1", 10, None)]
        assert listing() == [KeyEntry("a", "1", 10, None)]
        assert listing(include_deleted=True) == [KeyEntry("a", "1", 10, None), KeyEntry("b", None, 3, None, True)]
        assert listing(as_of=2, prefix="a") == [KeyEntry("a", '"x"', 1, 5)]
        _, results = eng.get_many("s", ["b", "a", "zz"], as_of=2)  # rule 31's example
        assert [r.outcome for r in results] == ["not-found", "ok", "not-found"]
        assert results[1].record is not None and (results[1].record.timestamp, results[1].record.valid_to) == (1, 5)


@pytest.mark.parametrize("kind", ["versioned", "timestamped"])
def test_store_counts_tell_deleted_keys_from_the_listed_ones(tmp_path: Any, kind: str) -> None:
    """``counts.deletedKeys`` is how many of the store's ``keys`` the latest listing leaves out
    without ``includeDeleted`` (their latest record is a tombstone): a reader can say how many
    keys have a value and how many are deleted without listing them."""
    b = StoreBuilder(str(tmp_path), "s", kind=kind, history_retention_ms=1000, partitions=1, buckets=2)
    b.apply([InRecord("f", 0, "a", '"x"', 1, None), InRecord("f", 1, "a", None, 5, None),
             InRecord("f", 2, "a", "1", 10, None), InRecord("f", 3, "b", None, 3, None),
             InRecord("f", 4, "c", "2", 4, None), InRecord("f", 5, "c", None, 8, None)])
    with Engine(str(tmp_path), refresh_interval_s=3600) as eng:
        counts = eng.store_info("s").counts
        listed = eng.keys("s", KeysQuery()).entries
        every = eng.keys("s", KeysQuery(include_deleted=True)).entries
    assert [e.key for e in listed] == ["a"] and len(every) == 3
    assert (counts["keys"], counts["deletedKeys"]) == (len(every), len(every) - len(listed))


def test_prefix_end() -> None:
    assert prefix_end("ab") == "ac"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff") is None and prefix_end("") is None
    assert prefix_end("\ud7ff") == "\ue000"  # never a surrogate


def test_listing_errors(tmp_path: Any) -> None:
    b = StoreBuilder(str(tmp_path), "s", kind="timestamped", history_retention_ms=0, partitions=1, buckets=2)
    b.apply([InRecord("f", 0, "a", "1", 1, None)])
    with Engine(str(tmp_path), refresh_interval_s=3600) as eng:
        with pytest.raises(UnsupportedQuery):
            eng.keys("s", KeysQuery(as_of=5))
        with pytest.raises(UnsupportedQuery):
            eng.get_many("s", ["a"], as_of=5)
        with pytest.raises(InvalidQuery):
            eng.keys("s", KeysQuery(start="b", end="a"))
        with pytest.raises(InvalidQuery):
            eng.keys("s", KeysQuery(), limit=0)
        assert [e.key for e in eng.keys("s", KeysQuery()).entries] == ["a"]
