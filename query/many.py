"""Reads of many keys at once: ``keys:batchGet``, point-in-time lookups and key listings.

Each key is answered by the rules of ``query.reads`` in their batch form (``reads.answer_many``,
tested equal to the single-key form), over the segments a :class:`~versiq.query.index.StoreView`
hands out: the serving index locates a whole batch with one probe per bucket, and a listing takes
a run of keys from each bucket. So a batch answers exactly what ``Engine.get`` answers for each
key of the same snapshot, without a Python-level read per key (a page of 1,000 keys in a few ms).
"""

from __future__ import annotations

from operator import attrgetter

import duckdb
import numpy as np
import pyarrow as pa

from versiq import layout
from versiq.query import reads
from versiq.query.api import KeyEntry, KeyResult, KeysPage, KeysQuery, VersionedRecord
from versiq.query.index import KeyChunk, StoreView

#: The fewest keys a listing asks each round for (a page of few keys still reads a useful run).
MIN_ROUND = 64


def horizons(view: StoreView, keys: list[str], seg: reads.KeySegments) -> np.ndarray:
    """Per key, ``streamTime - H`` of its partition at ``view``'s snapshot (``reads.NO_HORIZON``
    where that partition has seen no record, and for timestamped stores, where no retention
    applies). The partition is that of the key's rows, else ``layout.default_partition_of``."""
    h = np.full(len(seg), reads.NO_HORIZON, dtype=np.int64)
    if view.settings.kind == "timestamped":
        return h
    partition = seg.partition.copy()
    for i in np.flatnonzero(~seg.present).tolist():
        partition[i] = view.settings.partitioning.of(keys[i])
    for p in np.unique(partition).tolist():
        horizon = layout.horizon(view.state.stream_time.get(p), view.settings.history_retention_ms)
        if horizon is not None:
            h[partition == p] = horizon
    return h


def _answers(view: StoreView, keys: list[str], seg: reads.KeySegments, t: np.ndarray,
             latest: np.ndarray) -> tuple[reads.Answers, np.ndarray]:
    h = horizons(view, keys, seg)
    if view.settings.kind == "timestamped":  # one value per key: latest reads only (rule 12)
        latest = np.ones(len(seg), dtype=bool)
    return reads.answer_many(seg, t, latest, h), h


def _picked(seg: reads.KeySegments, ans: reads.Answers,
            idx: np.ndarray) -> tuple[list[str | None], list[int], list[int | None]]:
    """Value, timestamp and shown validTo of the rows ``ans`` picked for the keys at ``idx``
    (a key without a row reads row 0: the caller ignores it)."""
    if len(seg.valid_from) == 0:
        return [None] * len(idx), [0] * len(idx), [None] * len(idx)
    rows = np.maximum(ans.row[idx], 0)
    valid_to = np.where(ans.valid_to_shown[idx], seg.valid_to[rows], reads.NULL_TS)
    values: list[str | None] = seg.values.take(pa.array(rows)).to_pylist()
    return values, seg.valid_from[rows].tolist(), [None if v == reads.NULL_TS else v for v in valid_to.tolist()]


def _results(view: StoreView, seg: reads.KeySegments, ans: reads.Answers, h: np.ndarray) -> list[KeyResult]:
    """The ``KeyResult`` of every key of ``seg`` (``Engine.get``'s shape)."""
    values, timestamps, valid_tos = _picked(seg, ans, np.arange(len(seg)))
    horizons = [None if v == reads.NO_HORIZON else v for v in h.tolist()]
    out = []
    for code, has_row, value, ts, vt, horizon in zip(ans.outcome.tolist(), (ans.row >= 0).tolist(), values,
                                                     timestamps, valid_tos, horizons, strict=True):
        if code == reads.OK:
            out.append(KeyResult("ok", VersionedRecord(value, ts, vt), view.snapshot, horizon))
        else:
            out.append(KeyResult(reads.OUTCOMES[code], None, view.snapshot, horizon, ts if has_row else None))
    return out


def answer_pairs(view: StoreView, con: duckdb.DuckDBPyConnection,
                 pairs: list[tuple[str, int | None]]) -> list[KeyResult]:
    """What ``Engine.get`` answers from ``view`` for each ``(key, asOf)`` pair (``asOf`` None:
    latest), in order; a key named by several pairs is located once."""
    slot_of: dict[str, int] = {}
    of_pair = np.fromiter((slot_of.setdefault(key, len(slot_of)) for key, _ in pairs), dtype=np.int64,
                          count=len(pairs))
    latest = np.fromiter((as_of is None for _, as_of in pairs), dtype=bool, count=len(pairs))
    t = np.fromiter((0 if as_of is None else as_of for _, as_of in pairs), dtype=np.int64, count=len(pairs))
    unique = list(slot_of)
    groups = view.segments(con, unique)
    group_of, slot_in = np.zeros(len(unique), dtype=np.int64), np.zeros(len(unique), dtype=np.int64)
    for g, (positions, _seg) in enumerate(groups):
        group_of[positions] = g
        slot_in[positions] = np.arange(len(positions))
    pair_group = group_of[of_pair]
    order = np.argsort(pair_group, kind="stable")
    bounds = np.searchsorted(pair_group[order], np.arange(len(groups) + 1))
    out: list[KeyResult | None] = [None] * len(pairs)
    for g, (_positions, seg) in enumerate(groups):
        members = order[bounds[g]:bounds[g + 1]]
        if len(members) == 0:
            continue
        member_seg = seg.take(slot_in[of_pair[members]])
        member_keys = [pairs[i][0] for i in members.tolist()]
        ans, h = _answers(view, member_keys, member_seg, t[members], latest[members])
        for i, result in zip(members.tolist(), _results(view, member_seg, ans, h), strict=True):
            out[i] = result
    results = [r for r in out if r is not None]
    assert len(results) == len(pairs), "every pair is in exactly one group"
    return results


def _listed(view: StoreView, chunk: KeyChunk, query: KeysQuery) -> list[KeyEntry]:
    """The entries of ``chunk``'s keys that a listing shows: the record each key's read answers,
    or with ``include_deleted`` the tombstone behind a not-found."""
    n = len(chunk.keys)
    latest = np.full(n, query.as_of is None)
    t = np.full(n, 0 if query.as_of is None else int(query.as_of), dtype=np.int64)
    ans, _h = _answers(view, chunk.keys, chunk.segments, t, latest)
    ok = ans.outcome == reads.OK
    shown = ok | ((ans.outcome == reads.NOT_FOUND) & (ans.row >= 0)) if query.include_deleted else ok
    idx = np.flatnonzero(shown)
    values, timestamps, valid_tos = _picked(chunk.segments, ans, idx)
    deleted = (~ok[idx]).tolist()
    return [KeyEntry(chunk.keys[i], None if gone else value, ts, vt, deleted=gone)
            for i, value, ts, vt, gone in zip(idx.tolist(), values, timestamps, valid_tos, deleted, strict=True)]


def list_keys(view: StoreView, con: duckdb.DuckDBPyConnection, query: KeysQuery, lo: str | None,
              hi: str | None, resume_after: str | None, limit: int) -> KeysPage:
    """One page of a key listing of ``[lo, hi)`` after ``resume_after``: chunks from every
    source of the view, answered, merged by key; the merge is trusted up to the smallest last
    key of a chunk that did not reach the end of its source, and another round reads on from
    there until the page is full."""
    entries: list[KeyEntry] = []
    after = resume_after
    while True:
        chunks = view.key_chunks(con, lo, hi, after, max(MIN_ROUND, limit + 1 - len(entries)))
        bound = min((c.keys[-1] for c in chunks if not c.exhausted), default=None)
        if bound is not None:  # keys above the bound are read again by the next round, if any
            chunks = [c.upto(bound) for c in chunks]
        found = [e for c in chunks for e in _listed(view, c, query)]
        found.sort(key=attrgetter("key"))
        entries.extend(found)
        if bound is None or len(entries) > limit:
            break
        after = bound
    more = len(entries) > limit
    entries = entries[:limit]
    return KeysPage(entries, view.snapshot, entries[-1].key if more else None)
