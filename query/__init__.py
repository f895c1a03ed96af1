"""versiq's read engine: Kafka Streams VersionedKeyQuery / MultiVersionedKeyQuery over versiq stores.

Library use (no FastAPI needed)::

    from query import Engine, VersionedKeyQuery, MultiVersionedKeyQuery

See ``query.engine`` for the design (in-memory index of the current snapshot, DuckDB for older
snapshots, refresh bound and memory) and ``query.api`` for the typed queries, results and errors.
"""

from query.api import (
    InvalidQuery,
    KeyResult,
    MultiVersionedKeyQuery,
    QueryError,
    SnapshotGone,
    SnapshotNotFound,
    StoreInfo,
    StoreNotFound,
    UnsupportedQuery,
    VersionedKeyQuery,
    VersionedRecord,
    VersionsPage,
)
from query.engine import Engine

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
    "UnsupportedQuery",
    "VersionedKeyQuery",
    "VersionedRecord",
    "VersionsPage",
]
