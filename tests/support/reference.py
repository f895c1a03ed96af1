"""A small pure-Python, record-at-a-time reference model of a versiq store (docs/semantics.md, rules 1-12 and 19-22).

It is deliberately naive (dicts, one record at a time, linear scans) so that it is easy to check
by eye against docs/semantics.md; the real implementation (Spark set-wise ingest, indexed reads) must
agree with it on every generated changelog and query.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from versiq.layout import DEFAULT_PARTITIONER, default_partition_of

REASONS = (
    "late", "malformed", "missing_field", "bad_key", "bad_timestamp", "bad_value",
    "bad_partition", "duplicate_offset", "partition_conflict", "too_large", "expression_error", "bad_offset",
)


@dataclass(frozen=True)
class InRecord:
    """A well-formed input record; ``value`` is compact JSON text or None (tombstone)."""

    source: str
    pos: int
    key: str
    value: str | None
    timestamp: int
    partition: int | None = None
    offset: int | None = None


@dataclass(frozen=True)
class Version:
    value: str | None  # None = tombstone
    timestamp: int
    valid_to: int | None


@dataclass
class RunCounts:
    read: int = 0
    accepted_latest: int = 0
    accepted_out_of_order: int = 0
    replaced_same_timestamp: int = 0
    tombstones: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))


class ReferenceStore:
    def __init__(self, kind: str = "versioned", history_retention_ms: int = 86_400_000,
                 partitions: int = 1, partitioner: str = DEFAULT_PARTITIONER) -> None:
        self.kind = kind
        self.h = history_retention_ms
        self.partitions = partitions
        self.partitioner = partitioner
        self.versions: dict[str, dict[int, str | None]] = {}  # versioned: key -> ts -> value
        self.current: dict[str, tuple[str | None, int]] = {}  # timestamped: key -> (value, ts)
        self.stream_time: dict[int, int] = {}
        self.max_offset: dict[int, int] = {}
        self.home: dict[str, int] = {}
        self.rejected: list[tuple[str, InRecord]] = []

    # ---------------------------------------------------------------- writes
    def run(self, records: list[InRecord]) -> RunCounts:
        """Apply one run: ``records`` in file order ((source, pos) ascending)."""
        counts = RunCounts(read=len(records))
        records = sorted(records, key=lambda r: (r.source, r.pos))
        by_partition: dict[int, list[InRecord]] = {}
        partition_of: dict[InRecord, int] = {}
        run_home: dict[str, int] = {}
        for r in records:
            if r.partition is not None:
                if not 0 <= r.partition < self.partitions:
                    self._reject("bad_partition", r, counts)
                    continue
                p = r.partition
            else:
                p = default_partition_of(r.key, self.partitions, self.partitioner)
            home = self.home.get(r.key, run_home.get(r.key))
            if home is None:
                run_home[r.key] = p
            elif home != p:
                self._reject("partition_conflict", r, counts)
                continue
            partition_of[r] = p
            by_partition.setdefault(p, []).append(r)
        for p in sorted(by_partition):
            recs = by_partition[p]
            if all(r.offset is not None for r in recs):
                recs = sorted(recs, key=lambda r: (r.offset, r.source, r.pos))
            seen: set[int] = set()
            prev_max = self.max_offset.get(p)
            for r in recs:
                if r.offset is not None:
                    if (prev_max is not None and r.offset <= prev_max) or r.offset in seen:
                        self._reject("duplicate_offset", r, counts)
                        continue
                    seen.add(r.offset)
                    self.max_offset[p] = max(self.max_offset.get(p, r.offset), r.offset)
                self._put(p, r, counts)
        for key, p in run_home.items():
            if self._has_versions(key):
                self.home.setdefault(key, p)
        return counts

    def _has_versions(self, key: str) -> bool:
        return key in self.versions or key in self.current

    def _reject(self, reason: str, r: InRecord, counts: RunCounts) -> None:
        counts.rejected[reason] += 1
        self.rejected.append((reason, r))

    def _put(self, p: int, r: InRecord, counts: RunCounts) -> None:
        st = self.stream_time.get(p)
        if self.kind == "timestamped":
            cur = self.current.get(r.key)
            if cur is None or r.timestamp >= cur[1]:
                counts.accepted_latest += 1
            else:
                counts.accepted_out_of_order += 1
            if r.value is None:
                counts.tombstones += 1
            self.current[r.key] = (r.value, r.timestamp)
            self.stream_time[p] = r.timestamp if st is None else max(st, r.timestamp)
            return
        if st is not None and r.timestamp < st - self.h:
            self._reject("late", r, counts)
            return
        self.stream_time[p] = r.timestamp if st is None else max(st, r.timestamp)
        versions = self.versions.setdefault(r.key, {})
        if r.timestamp in versions:
            counts.replaced_same_timestamp += 1
        if all(t <= r.timestamp for t in versions):
            counts.accepted_latest += 1
        else:
            counts.accepted_out_of_order += 1
        if r.value is None:
            counts.tombstones += 1
        versions[r.timestamp] = r.value

    # ---------------------------------------------------------------- reads
    def all_versions(self, key: str) -> list[Version]:
        """Every stored version (tombstones included), ascending, with validTo."""
        stamps = sorted(self.versions.get(key, {}))
        out = []
        for i, t in enumerate(stamps):
            nxt = stamps[i + 1] if i + 1 < len(stamps) else None
            out.append(Version(self.versions[key][t], t, nxt))
        return out

    def partition_of_key(self, key: str) -> int:
        return self.home.get(key, default_partition_of(key, self.partitions, self.partitioner))

    def horizon(self, key: str) -> int | None:
        st = self.stream_time.get(self.partition_of_key(key))
        return None if st is None else st - self.h

    def latest(self, key: str) -> Version | None:
        """Rule 6 (and rule 12 for timestamped stores)."""
        if self.kind == "timestamped":
            cur = self.current.get(key)
            if cur is None or cur[0] is None:
                return None
            return Version(cur[0], cur[1], None)
        vs = self.all_versions(key)
        if not vs or vs[-1].value is None:
            return None
        return vs[-1]

    def as_of(self, key: str, t: int) -> tuple[str, Version | None]:
        """Rules 7-8 with the retention edges: ('ok', v) | ('not-found', None) | ('expired', None)."""
        vs = self.all_versions(key)
        h = self.horizon(key)
        if h is not None and t < h:
            if not vs:
                return ("not-found", None)
            newest = vs[-1]
            if newest.timestamp <= t:
                if newest.value is None:
                    return ("not-found", None)
                return ("ok", newest)
            return ("expired", None)
        candidates = [v for v in vs if v.timestamp <= t]
        if not candidates or candidates[-1].value is None:
            return ("not-found", None)
        return ("ok", candidates[-1])

    def range(self, key: str, lo: int | None, hi: int | None, ascending: bool = True,
              include_deleted: bool = False) -> list[Version]:
        """Rules 9-11 with the retention edges; ``include_deleted``: tombstones too (rule 32)."""
        vs = self.all_versions(key)
        h = self.horizon(key)
        shown = (lambda v: True) if include_deleted else (lambda v: v.value is not None)  # noqa: E731
        if h is not None and hi is not None and hi < h:
            out = [vs[-1]] if vs and vs[-1].timestamp <= hi and shown(vs[-1]) else []
        else:
            out = [
                v for v in vs
                if shown(v)
                and (hi is None or v.timestamp <= hi)
                and (lo is None or v.valid_to is None or v.valid_to > lo)
                and (h is None or v.valid_to is None or v.valid_to > h)
            ]
        return out if ascending else list(reversed(out))

    def range_edges(self, key: str, lo: int | None, hi: int | None) -> tuple[bool, bool]:
        """Rule 32: ``(expired, truncated)`` of a range read."""
        h = self.horizon(key)
        if h is None:
            return False, False
        if hi is not None and hi < h:
            vs = self.all_versions(key)
            return bool(vs) and vs[-1].timestamp > hi, False
        return False, lo is None or lo < h
