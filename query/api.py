"""Typed query objects and results of the query engine (IQv2 style), usable without FastAPI.

Names follow Kafka Streams' ``org.apache.kafka.streams.query`` (VersionedKeyQuery,
MultiVersionedKeyQuery) and ``state`` (VersionedRecord) packages. Timestamps are epoch ms.
Values are the stored compact JSON text (``str``); callers decide whether to parse them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["ok", "not-found", "expired"]


@dataclass(frozen=True)
class VersionedKeyQuery:
    """One key, latest (``as_of is None``) or as of a timestamp (docs/semantics.md rules 6-8)."""

    key: str
    as_of: int | None = None


@dataclass(frozen=True)
class MultiVersionedKeyQuery:
    """Every version of one key valid in ``[from_time, to_time]`` (rules 9-11); None = unbounded.
    ``include_deleted``: tombstones meeting the same conditions are returned too, marked deleted
    (rule 32)."""

    key: str
    from_time: int | None = None
    to_time: int | None = None
    ascending: bool = True
    include_deleted: bool = False


@dataclass(frozen=True)
class KeysQuery:
    """Which keys of a store to list, in UTF-8 byte order (Python's ``str`` order), and as of
    when to answer for each (KIP-969's key range).

    ``prefix`` keeps the keys that start with it; ``start`` (inclusive) and ``end`` (exclusive)
    bound the range; ``as_of`` None answers with each key's latest record. ``include_deleted``
    also lists keys whose answer is a tombstone (as deleted entries)."""

    prefix: str | None = None
    start: str | None = None
    end: str | None = None
    as_of: int | None = None
    include_deleted: bool = False


@dataclass(frozen=True)
class KeyEntry:
    """One key of a listing with the record that answers for it; ``deleted`` entries are the
    tombstone that answers (``value`` None) with its validity."""

    key: str
    value: str | None
    timestamp: int
    valid_to: int | None
    deleted: bool = False


@dataclass(frozen=True)
class KeysPage:
    """One page of a key listing."""

    entries: list[KeyEntry]
    snapshot: int
    #: The last key returned when more keys follow, else None.
    resume_after: str | None


@dataclass(frozen=True)
class VersionedRecord:
    """A value with its validity ``[timestamp, valid_to)``; ``valid_to`` None = still valid.
    ``deleted``: a tombstone (``value`` None), returned only when a range asks for them."""

    value: str | None
    timestamp: int
    valid_to: int | None
    deleted: bool = False


@dataclass(frozen=True)
class KeyResult:
    """Answer to a VersionedKeyQuery: a record, or why there is none."""

    outcome: Outcome
    record: VersionedRecord | None
    snapshot: int
    #: ``streamTime - H`` of the key's partition at that snapshot (None: no record seen yet).
    horizon: int | None
    #: For a not-found answer caused by a tombstone: the tombstone's timestamp.
    deleted_at: int | None = None


@dataclass(frozen=True)
class VersionsPage:
    """One page of a MultiVersionedKeyQuery answer."""

    records: list[VersionedRecord]
    snapshot: int
    horizon: int | None
    #: Timestamp of the last record returned when more records follow, else None.
    resume_after: int | None
    #: The range lies wholly before the horizon and its answer is past retention (rule 32): no
    #: record is returned, and the API answers *expired*.
    expired: bool = False
    #: The range reaches below the horizon (``from`` missing or ``< h <= to``): history before
    #: ``h`` that once met it is no longer returned (rule 32).
    truncated: bool = False


@dataclass(frozen=True)
class ChangesPage:
    """One page of a store's change feed (``query.changes``)."""

    changes: list[Any]
    #: The snapshot the feed runs to (``untilSnapshot``, or the current one when asked).
    snapshot: int
    #: The position ``(snapshot, key, validFrom)`` of the last change when more follow, else None.
    resume_after: tuple[int, str, int] | None


@dataclass(frozen=True)
class RejectedPage:
    """One page of a store's rejected input records (``query.rejected``)."""

    #: Records as ``versiq.rejected.record_dict`` gives them (place fields only when known).
    records: list[dict[str, Any]]
    #: The store snapshot listed: the rejections of the runs it committed.
    snapshot: int
    #: Rejected records per reason at this snapshot, over all reasons (the filter aside).
    counts: dict[str, int]
    #: Records matching the filter, on all pages.
    total: int
    #: The ordinal of the last record returned when more follow, else None.
    resume_after: int | None


@dataclass(frozen=True)
class StoreInfo:
    name: str
    kind: str
    history_retention_ms: int
    partitions: int
    snapshot: int
    #: Stream time per partition (absent: that partition has seen no record).
    stream_time: dict[int, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    #: Derived tables: the snapshot of each direct input this snapshot was computed from
    #: (``StoreState.inputs``); empty for ordinary stores.
    inputs: dict[str, int] = field(default_factory=dict)
    #: Derived tables: per upstream source, ``{"run": last run consumed, "snapshot": its
    #: snapshot after that run}`` (``StoreState.sources``); empty for ordinary stores.
    sources: dict[str, dict[str, int]] = field(default_factory=dict)


class QueryError(Exception):
    """Base of the engine's errors; each maps to one problem type in the HTTP API."""


class StoreNotFound(QueryError):
    pass


class StreamNotFound(QueryError):
    """No stream of that name (unknown, refused, or the name is a store)."""


class SnapshotNotFound(QueryError):
    """The requested snapshot is above the store's (or stream's) latest version."""


class SnapshotGone(QueryError):
    """The requested snapshot can no longer be read (vacuumed or its log cleaned up)."""


class RecordNotFound(QueryError):
    """No rejected record with that id in the snapshot read."""


class UnsupportedQuery(QueryError):
    """The query does not apply to this store (e.g. as-of on a timestamped store)."""


class InvalidQuery(QueryError):
    """The query's parameters are invalid (e.g. ``from_time > to_time``, page size < 1): a client error."""


class StoreUnavailable(QueryError):
    """The warehouse has the store (a ``_delta_log``) but it cannot be read: 503, not 404."""


class StreamUnavailable(QueryError):
    """The warehouse has the stream but it cannot be read: 503, not 404."""
