"""versiq's read engine: Kafka Streams VersionedKeyQuery / MultiVersionedKeyQuery over versiq stores.

Library use (no FastAPI needed)::

    from versiq.query import Engine, VersionedKeyQuery, MultiVersionedKeyQuery

See ``query.engine`` for the public reads and how they are answered: ``query.catalog``
(discovery, refresh bound, readiness), ``query.index`` (the current snapshot in memory, memory per
worker), ``query.snapshots`` (older snapshots with DuckDB), ``query.reads`` (the read rules);
``query.api`` for the typed queries, results and errors, and ``query.streams`` for streams
(append-only event logs read with DuckDB)::

    engine.stream_records("clicks", StreamRecordsQuery(key="u-1", from_time=t0), limit=100)
"""

from versiq.query.api import (
    InvalidQuery,
    KeyResult,
    MultiVersionedKeyQuery,
    QueryError,
    SnapshotGone,
    SnapshotNotFound,
    StoreInfo,
    StoreNotFound,
    StoreUnavailable,
    StreamNotFound,
    StreamUnavailable,
    UnsupportedQuery,
    VersionedKeyQuery,
    VersionedRecord,
    VersionsPage,
)
from versiq.query.engine import Engine
from versiq.query.streams import StreamInfo, StreamPosition, StreamRecord, StreamRecordsPage, StreamRecordsQuery

__all__ = [
    "Engine",
    "InvalidQuery",
    "KeyResult",
    "MultiVersionedKeyQuery",
    "QueryError",
    "SnapshotGone",
    "SnapshotNotFound",
    "StoreInfo",
    "StoreNotFound",
    "StoreUnavailable",
    "StreamInfo",
    "StreamNotFound",
    "StreamUnavailable",
    "StreamPosition",
    "StreamRecord",
    "StreamRecordsPage",
    "StreamRecordsQuery",
    "UnsupportedQuery",
    "VersionedKeyQuery",
    "VersionedRecord",
    "VersionsPage",
]
