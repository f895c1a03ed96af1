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
