"""The read rules of docs/semantics.md (rules 6-11 and the retention edges) over one key's versions.

Both read paths (the serving index of the current snapshot and the DuckDB reader of older
snapshots) produce a :class:`KeyRows` — the key's *resolved* versions (read rule of
``versiq.layout`` already applied), ascending by timestamp — and answer through the functions
here, so the two paths cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from versiq.query.api import Outcome, VersionedRecord

#: Sentinel for a null ``valid_to`` in the int64 arrays (timestamps are >= -1).
NULL_TS = np.iinfo(np.int64).min


@dataclass(frozen=True)
class KeyRows:
    """One key's resolved versions: rows ``[start, end)`` of the column arrays, ascending."""

    valid_from: np.ndarray  # int64, ascending within [start, end)
    valid_to: np.ndarray  # int64, NULL_TS = still valid
    tombstone: np.ndarray  # bool
    values: pa.Array  # string (null for tombstones)
    start: int
    end: int
    partition: int

    def __len__(self) -> int:
        return self.end - self.start

    def record(self, i: int) -> VersionedRecord:
        """The record of version ``i`` (0-based within the key)."""
        j = self.start + i
        vt = int(self.valid_to[j])
        value: Any = self.values[j].as_py()
        deleted = bool(self.tombstone[j])
        return VersionedRecord(
            value=None if deleted else value, timestamp=int(self.valid_from[j]),
            valid_to=None if vt == NULL_TS else vt, deleted=deleted,
        )

    def is_tombstone(self, i: int) -> bool:
        return bool(self.tombstone[self.start + i])

    def timestamp(self, i: int) -> int:
        return int(self.valid_from[self.start + i])


def latest(rows: KeyRows | None) -> tuple[Outcome, VersionedRecord | None]:
    """Rule 6 (and rule 12 for a timestamped store, whose key has exactly one resolved row)."""
    if rows is None or len(rows) == 0:
        return "not-found", None
    n = len(rows)
    if rows.is_tombstone(n - 1):
        return "not-found", None
    rec = rows.record(n - 1)
    # The latest version is returned without validTo (rule 6).
    return "ok", VersionedRecord(rec.value, rec.timestamp, None)


def as_of(rows: KeyRows | None, t: int, h: int | None) -> tuple[Outcome, VersionedRecord | None]:
    """Rules 7-8 with the retention edges (``h`` = streamTime - H of the key's partition)."""
    if rows is None or len(rows) == 0:
        return "not-found", None
    n = len(rows)
    if h is not None and t < h:
        if rows.timestamp(n - 1) <= t:
            if rows.is_tombstone(n - 1):
                return "not-found", None
            return "ok", rows.record(n - 1)
        return "expired", None
    vf = rows.valid_from[rows.start : rows.end]
    i = int(np.searchsorted(vf, t, side="right")) - 1
    if i < 0 or rows.is_tombstone(i):
        return "not-found", None
    return "ok", rows.record(i)


def tombstone_answer(rows: KeyRows | None, t: int | None, h: int | None) -> tuple[int, int | None] | None:
    """When ``latest`` (``t`` None) or ``as_of`` answers not-found because of a tombstone: that
    tombstone's ``(timestamp, validTo)``; None otherwise (no version at ``t``, or expired)."""
    if rows is None or len(rows) == 0:
        return None
    n = len(rows)
    if t is None or (h is not None and t < h):
        if rows.is_tombstone(n - 1) and (t is None or rows.timestamp(n - 1) <= t):
            return rows.timestamp(n - 1), None
        return None
    vf = rows.valid_from[rows.start : rows.end]
    i = int(np.searchsorted(vf, t, side="right")) - 1
    if i < 0 or not rows.is_tombstone(i):
        return None
    return rows.timestamp(i), rows.record(i).valid_to


def range_edges(rows: KeyRows | None, lo: int | None, hi: int | None, h: int | None) -> tuple[bool, bool]:
    """``(expired, truncated)`` of a range read (rule 32). *Expired*: ``to < h`` and the key's
    newest version is after ``to`` (rule 10 can return nothing, and it is retention, not the
    key's history, that says so: the answer an as-of read at ``to`` gives). *Truncated*: the
    range reaches below ``h`` (``from`` missing or ``< h``) while ``to`` is at or after it."""
    if h is None:
        return False, False
    if hi is not None and hi < h:
        expired = rows is not None and len(rows) > 0 and rows.timestamp(len(rows) - 1) > hi
        return expired, False
    return False, lo is None or lo < h


def prefix_end(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (None: no bound), in
    code-point order, which is UTF-8 byte order."""
    chars = list(prefix)
    while chars and chars[-1] == chr(0x10FFFF):
        chars.pop()
    if not chars:
        return None
    following = ord(chars[-1]) + 1
    chars[-1] = chr(0xE000 if 0xD800 <= following <= 0xDFFF else following)
    return "".join(chars)


def range_indices(
    rows: KeyRows | None,
    lo: int | None,
    hi: int | None,
    h: int | None,
    ascending: bool,
    resume_after: int | None,
    include_deleted: bool = False,
) -> np.ndarray:
    """Indices (within the key) of the versions rules 9-11 return, in the requested order,
    restricted to timestamps after ``resume_after`` (ascending) / before it (descending).
    ``include_deleted``: tombstones are treated as versions too (rule 32)."""
    empty = np.empty(0, dtype=np.int64)
    if rows is None or len(rows) == 0:
        return empty
    s, e = rows.start, rows.end
    vf = rows.valid_from[s:e]
    vt = rows.valid_to[s:e]
    live = np.ones(e - s, dtype=bool) if include_deleted else ~rows.tombstone[s:e]
    n = e - s
    if h is not None and hi is not None and hi < h:
        # Rule 10: only the latest version may qualify.
        if live[n - 1] and vf[n - 1] <= hi:
            idx = np.array([n - 1], dtype=np.int64)
        else:
            idx = empty
    else:
        mask = live.copy()
        if hi is not None:
            mask &= vf <= hi
        still_valid = vt == NULL_TS
        if lo is not None:
            mask &= still_valid | (vt > lo)
        if h is not None:
            # History that ended at or before the horizon is expired (retention edges).
            mask &= still_valid | (vt > h)
        idx = np.flatnonzero(mask).astype(np.int64)
    if resume_after is not None and len(idx):
        idx = idx[vf[idx] > resume_after] if ascending else idx[vf[idx] < resume_after]
    return idx if ascending else idx[::-1]


# ----------------------------------------------------------------------------- many keys at once
# The same rules over many keys in one pass of array operations: what batchGet, point-in-time
# lookups and key listings answer with (a page of 1,000 keys in a few ms).
# Each function below is the batch form of the per-key function it names, rule for rule;
# tests/query/test_reads_batch.py checks on random histories that they answer alike.

#: The horizon of a key whose partition has seen no record, in the int64 arrays of the batch
#: reads: below every timestamp, so ``t < h`` never holds (as ``h is None`` in ``as_of``).
NO_HORIZON = np.iinfo(np.int64).min

#: Outcome codes of :class:`Answers` (indices into ``OUTCOMES``).
OK, NOT_FOUND, EXPIRED = 0, 1, 2
OUTCOMES: tuple[Outcome, ...] = ("ok", "not-found", "expired")


@dataclass(frozen=True)
class KeySegments:
    """Many keys' resolved versions over shared column arrays: key ``i``'s versions are rows
    ``[start[i], end[i])`` (empty: the key has none), ascending by timestamp. The batch form of
    :class:`KeyRows`; ``partition[i]`` is that of the key's rows (meaningless when empty)."""

    valid_from: np.ndarray  # int64
    valid_to: np.ndarray  # int64, NULL_TS = still valid
    tombstone: np.ndarray  # bool
    values: pa.Array  # string (null for tombstones)
    start: np.ndarray  # int64, per key
    end: np.ndarray  # int64, per key
    partition: np.ndarray  # int64, per key

    def __len__(self) -> int:
        return len(self.start)

    @property
    def present(self) -> np.ndarray:
        """Per key: whether it has any resolved version."""
        return self.end > self.start  # type: ignore[no-any-return]

    def take(self, idx: np.ndarray) -> KeySegments:
        """The keys at ``idx`` (in that order, repeats allowed), over the same columns."""
        return KeySegments(self.valid_from, self.valid_to, self.tombstone, self.values,
                           self.start[idx], self.end[idx], self.partition[idx])

    def head(self, n: int) -> KeySegments:
        """The first ``n`` keys."""
        return KeySegments(self.valid_from, self.valid_to, self.tombstone, self.values,
                           self.start[:n], self.end[:n], self.partition[:n])

    @staticmethod
    def absent(n: int) -> KeySegments:
        """``n`` keys without rows."""
        empty, none = np.zeros(0, dtype=np.int64), np.zeros(n, dtype=np.int64)
        return KeySegments(empty, empty, np.zeros(0, dtype=bool), pa.array([], pa.string()), none, none, none)

    @staticmethod
    def of(rows: KeyRows | None) -> KeySegments:
        """One key's rows as a batch of one (a key without rows: an empty segment)."""
        if rows is None:
            return KeySegments.absent(1)
        return KeySegments(rows.valid_from, rows.valid_to, rows.tombstone, rows.values,
                           np.array([rows.start], dtype=np.int64), np.array([rows.end], dtype=np.int64),
                           np.array([rows.partition], dtype=np.int64))


@dataclass(frozen=True)
class Answers:
    """What the single-key rules answer for each key of a :class:`KeySegments`.

    ``outcome``: codes of ``OUTCOMES``. ``row``: the row of the answering version (``OK``), or of
    the tombstone behind a not-found (what ``tombstone_answer`` reports), else -1.
    ``valid_to_shown``: whether that row's ``validTo`` is part of the answer (never for latest
    reads, rule 6, nor for a tombstone found past the horizon)."""

    outcome: np.ndarray  # int8
    row: np.ndarray  # int64
    valid_to_shown: np.ndarray  # bool


def last_at_or_before(valid_from: np.ndarray, start: np.ndarray, end: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per segment, the row of its last version with timestamp <= ``t`` (``start - 1`` when none):
    one binary search of every segment at once (``searchsorted(..., 'right') - 1`` of ``as_of``),
    log2 of the longest segment steps."""
    lo, hi = start.copy(), end.copy()
    active = lo < hi
    while active.any():
        mid = (lo + hi) // 2
        right = active & (valid_from[np.where(active, mid, lo[np.argmax(active)])] <= t)
        lo = np.where(right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)
        active = lo < hi
    return lo - 1  # type: ignore[no-any-return]


def answer_many(seg: KeySegments, t: np.ndarray, latest_read: np.ndarray, h: np.ndarray) -> Answers:
    """``latest`` where ``latest_read`` (rule 6), else ``as_of`` at ``t`` with horizon ``h``
    (``NO_HORIZON``: none) (rules 7-8, retention edges), with ``tombstone_answer``'s tombstone."""
    n = len(seg)
    outcome = np.full(n, NOT_FOUND, dtype=np.int8)
    row = np.full(n, -1, dtype=np.int64)
    shown = np.zeros(n, dtype=bool)
    present = seg.present
    if not present.any():
        return Answers(outcome, row, shown)
    last = seg.end - 1
    last_c = np.where(present, last, int(last[np.argmax(present)]))
    last_tomb = seg.tombstone[last_c]
    # Latest (rule 6): the newest version, unless it is a tombstone; no validTo either way.
    newest = present & latest_read
    # As of t before the horizon: only the newest version may answer, if it is at or before t;
    # otherwise the answer is expired (retention edges).
    before_h = present & ~latest_read & (t < h)
    fits = before_h & (seg.valid_from[last_c] <= t)
    outcome[before_h & ~fits] = EXPIRED
    for chosen, with_valid_to in ((newest, False), (fits, True)):
        row[chosen] = last[chosen]
        outcome[chosen & ~last_tomb] = OK
        shown[chosen & ~last_tomb] = with_valid_to
    # As of t at or after the horizon (rules 7-8): the version valid at t, unless a tombstone.
    w = np.flatnonzero(present & ~latest_read & ~(t < h))
    if len(w):
        i = last_at_or_before(seg.valid_from, seg.start[w], seg.end[w], t[w])
        found = i >= seg.start[w]
        tomb = seg.tombstone[np.where(found, i, seg.start[w])] & found
        outcome[w[found & ~tomb]] = OK
        row[w[found]] = i[found]
        shown[w[found]] = True
    return Answers(outcome, row, shown)
