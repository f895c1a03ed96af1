"""The batch form of the read rules (``reads.answer_many``, ``reads.last_at_or_before``) answers
exactly what the per-key form (``reads.latest``, ``reads.as_of``, ``reads.tombstone_answer``)
answers, on random histories, times and horizons: keys of many versions, none, tombstones first
or last, times before, at and after every version and the horizon."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from versiq.query import reads

# One key's resolved history: distinct timestamps, each a value or a tombstone.
history = st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=12,
                   unique_by=lambda v: v[0]).map(sorted)
question = st.tuples(st.integers(-1, 45), st.booleans(), st.one_of(st.none(), st.integers(-5, 50)))


def _columns(histories: list[list[tuple[int, bool]]]) -> tuple[reads.KeySegments, list[reads.KeyRows | None]]:
    vf: list[int] = []
    vt: list[int] = []
    tomb: list[bool] = []
    values: list[str | None] = []
    starts, ends = [], []
    for h in histories:
        starts.append(len(vf))
        for i, (ts, deleted) in enumerate(h):
            vf.append(ts)
            vt.append(h[i + 1][0] if i + 1 < len(h) else reads.NULL_TS)
            tomb.append(deleted)
            values.append(None if deleted else f"v{ts}")
        ends.append(len(vf))
    cols = (np.array(vf, dtype=np.int64), np.array(vt, dtype=np.int64), np.array(tomb, dtype=bool),
            pa.array(values, pa.string()))
    start, end = np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)
    seg = reads.KeySegments(*cols, start, end, np.zeros(len(histories), dtype=np.int64))
    singles = [reads.KeyRows(*cols, int(s), int(e), 0) if e > s else None for s, e in zip(start, end, strict=True)]
    return seg, singles


@pytest.mark.rule(6, 7, 8)
@settings(max_examples=400, derandomize=True, deadline=None, database=None)
@given(st.lists(st.tuples(history, question), min_size=1, max_size=12))
def test_the_batch_form_answers_as_the_single_key_form(cases):
    seg, singles = _columns([h for h, _ in cases])
    t = np.array([q[0] for _, q in cases], dtype=np.int64)
    latest = np.array([q[1] for _, q in cases], dtype=bool)
    h = np.array([reads.NO_HORIZON if q[2] is None else q[2] for _, q in cases], dtype=np.int64)
    ans = reads.answer_many(seg, t, latest, h)
    for i, (rows, (at, is_latest, horizon)) in enumerate(zip(singles, [q for _, q in cases], strict=True)):
        outcome, record = reads.latest(rows) if is_latest else reads.as_of(rows, at, horizon)
        assert reads.OUTCOMES[ans.outcome[i]] == outcome
        tombstone = reads.tombstone_answer(rows, None if is_latest else at, horizon) if outcome == "not-found" else None
        row = int(ans.row[i])
        if record is not None:
            shown = int(seg.valid_to[row]) if ans.valid_to_shown[i] and seg.valid_to[row] != reads.NULL_TS else None
            assert (seg.values[row].as_py(), int(seg.valid_from[row]), shown) == (
                record.value, record.timestamp, record.valid_to)
        elif tombstone is not None:
            assert bool(seg.tombstone[row])
            shown = int(seg.valid_to[row]) if ans.valid_to_shown[i] and seg.valid_to[row] != reads.NULL_TS else None
            assert (int(seg.valid_from[row]), shown) == tombstone
        else:
            assert row == -1


@settings(max_examples=200, derandomize=True, deadline=None, database=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 1000), max_size=300, unique=True).map(sorted),
                          st.integers(-1, 1001)), min_size=1, max_size=8))
def test_one_binary_search_of_every_segment(cases):
    vf = np.array([ts for tss, _ in cases for ts in tss], dtype=np.int64)
    ends = np.cumsum([len(tss) for tss, _ in cases]).astype(np.int64)
    starts = ends - np.array([len(tss) for tss, _ in cases], dtype=np.int64)
    t = np.array([at for _, at in cases], dtype=np.int64)
    got = reads.last_at_or_before(vf, starts, ends, t)
    for i, (tss, at) in enumerate(cases):
        assert got[i] == starts[i] + int(np.searchsorted(np.array(tss, dtype=np.int64), at, side="right")) - 1


def test_keys_without_versions_are_not_found():
    seg = reads.KeySegments.absent(3)
    ans = reads.answer_many(seg, np.zeros(3, dtype=np.int64), np.array([True, False, False]),
                            np.array([reads.NO_HORIZON, 5, reads.NO_HORIZON], dtype=np.int64))
    assert ans.outcome.tolist() == [reads.NOT_FOUND] * 3 and ans.row.tolist() == [-1] * 3
