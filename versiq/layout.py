"""The on-disk layout of a versiq store: the one contract between ``ingest`` and ``query``.

Everything that both the writer (ingest/) and the readers (query/, service/) must agree on is
defined here and nowhere else. Format version 1.

Warehouse
=========
``<warehouse>/<store>/`` is one store. The service lists as stores exactly the direct children
of the warehouse whose name is valid (``versiq.names``), that have a ``_delta_log/`` and whose
Delta metadata ``description`` is the settings JSON below with a known ``versiq.format``.
``<warehouse>/_versiq/`` is versiq's own (not a store: names starting with ``_`` are never
store names). Directories starting with ``_`` inside
a store are versiq's own:

- ``_delta_log/``: the store table's Delta log (with Delta's ``N.crc`` checksum files, which
  spare the next writer a rebuild of the snapshot's state; readers do not need them).
- ``_rejected/``: a second Delta table with every rejected input record (``REJECTED_SCHEMA``).
- ``_changelog/``: source stores that derived tables read: the accepted records of each run in
  processing order (``CHANGELOG_SCHEMA``), kept on every run from the first one a derived table
  read the store in (``changelogSince``; earlier history is bootstrapped from the store itself).
- ``_emitted/``: derived tables and stream outputs: every result the operator emitted, in order
  (``EMITTED_SCHEMA``; docs/derived-tables.md).
- ``_subscriptions/``: foreign-key joins: the left keys that point at each right key
  (``SUBSCRIPTIONS_SCHEMA``), so a right-side change finds them without reading the left table.
- ``_versiq/``: the writer lock file (``lock``).
- ``_erasures/``: the audit trail of ``versiq erase`` (``ERASURES_SCHEMA``): one row per erase
  of keys from the store, with a keyed hash of each key (HMAC-SHA256 under the warehouse's
  secret ``<warehouse>/_versiq/erase-secret``, a file of mode 0600 created by the first erase),
  never a key or a value.

A child whose settings say ``"kind": "stream"`` is a **stream**, not a store: an append-only
Delta table (``STREAM_SCHEMA``, partitioned by ``bucket``, files sorted by (key, timestamp,
run, seq)); ``(run, seq)`` is unique and is the stream order (seq = 1, 2, ... per run). Source
streams and stream-table join outputs are streams; the service serves them under
``/v1/streams``. A run's side-table rows are committed *before* the table's own commit, each
side table's commit replacing its rows of that run and later ones (``replaceWhere run >= R``):
rows of a run later than the table's committed run (``StoreState.run``) are an unfinished
attempt that the rerun replaces, and every reader ignores them.

Store table
===========
A Delta table partitioned by ``bucket`` with the columns of ``STORE_SCHEMA``:

- ``bucket``    INT    ``crc32(utf8(key)) mod buckets`` (``bucket_of``): physical layout only,
                       lets a reader open one directory for a key. Never changes results.
- ``key``       STRING the record key: at most ``MAX_KEY_BYTES`` (4 KiB) of UTF-8, so that every
                       stored key can be asked for in a URL (ingest rejects longer ones ``bad_key``).
- ``valid_from``BIGINT the version's timestamp (epoch ms).
- ``valid_to``  BIGINT the next version's timestamp (exclusive); null = still valid.
- ``value``     STRING compact JSON text of the value; null for a tombstone.
- ``tombstone`` BOOL   true for a tombstone version (stored: it bounds the validity before it).
- ``partition`` INT    the key's stream-time partition (docs/semantics.md, rules 19-21):
                       the one its first record named, else ``default_partition_of``.
- ``run``       BIGINT the ingest run (1, 2, ...) that wrote this row.

Rows are **appended**, never rewritten in place: each run appends one complete row for every
(key, valid_from) whose content it changed (new versions, same-timestamp replacements and
neighbours whose ``valid_to`` moved). The read rule resolves them:

- ``kind = versioned``: for each (key, valid_from) the row with the greatest ``run`` is the
  version.
- ``kind = timestamped`` (KIP-258): for each key the row with the greatest ``run`` is the
  current value; ``valid_from`` is that record's timestamp, ``valid_to`` is always null, and a
  tombstone row means the key is deleted.

``versiq maintain`` compacts a bucket back to one row per version (or per key), which the read
rule makes unobservable. Inside every data file rows are sorted by (key, valid_from, run) and
row groups are small (1 MiB), so one key's versions sit in one or two row groups. Every add
action carries ``numRecords`` and, for the columns of ``DELTA_STATS_COLUMNS`` only,
``minValues``, ``maxValues`` and ``nullCount``. String statistics are Delta's: at most a
32-character prefix, a truncated maximum followed by one tie-breaking character, so a reader
prunes a file for a key only with ``may_hold_key``.

Every table is written by Delta's Spark connector (delta-spark) with ``TABLE_PROPERTIES``:
protocol (1, 2), no table features, no deletion vectors, so delta-rs and DuckDB read every
snapshot by listing its Parquet files. Delta writes a checkpoint every 50 commits (a
checkpoint costs a Spark job; replaying 50 small commit files costs a reader little).

Settings (immutable, set when the store is created)
===================================================
The Delta metadata ``description`` holds ``StoreSettings`` as JSON
(``{"versiq.format": 1, "kind": ..., "historyRetentionMs": ..., "partitions": ...,
"buckets": ..., "partitioner": ...}``), set when the table is created (its first commit).
``partitioner`` (``murmur2``, Kafka's default partitioner, or ``crc32``) places a key whose
records name no partition; settings written before it existed have none and mean ``crc32``,
which such stores keep: a key's partition never moves.

State (per commit)
==================
Every commit of a run, of ``versiq erase`` and of ``versiq maintain`` to the store table carries
``StoreState`` as JSON in the commitInfo member ``userMetadata`` (Delta's own field for it):
last run number, per-partition stream time and highest offset, the source files already done,
and for derived tables the source runs/snapshots (``sources``) and direct input snapshots
(``inputs``) the snapshot was computed from. The state of snapshot V is the one in the newest
commit <= V that has it (``read_state``). Data and state are thus one atomic Delta commit. The
first run's commit creates the table, partitioned and with its properties and settings: Delta's
``CREATE OR REPLACE TABLE AS SELECT`` at version 0 (``ingest.delta.commit_table``), with the Delta transaction
``(appId="versiq.ingest", version=run)``. Every later run's commit is a plain append (Delta's
``WRITE``, mode ``Append``), which records that transaction where the run needs it (on S3:
``versiq.ingest.delta.run_txn_needed``; a run that appends no rows is a commit all the same). A
commit of state only, between runs, is an append too, told apart by its transaction
``(appId="versiq.state", version=the table version it creates)``; maintenance never appends,
and continuous mode's compactions (which change no data a query sees) carry no state, since
one may commit after a run that began later (``ingest.maintain``; ``query.history`` tells the
kinds apart).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from versiq import storage

if TYPE_CHECKING:
    from deltalake import DeltaTable

FORMAT_VERSION = 1
FORMAT_KEY = "versiq.format"
#: The commitInfo member holding the state: Delta's ``userMetadata``. Commits made by versiq
#: before it wrote through delta-spark (delta-rs) kept it in ``versiq.state``; both are read.
STATE_KEY = "userMetadata"
LEGACY_STATE_KEY = "versiq.state"
APP_ID = "versiq.ingest"
#: The Delta transaction of a commit of state only, between runs (versioned by the table version
#: it creates; ``versiq.ingest`` would make Delta skip it as the run already committed).
STATE_APP_ID = "versiq.state"
DEFAULT_BUCKETS = 16
#: The longest key a store holds, in UTF-8 bytes. A key is a URL path segment when it is read
#: (percent-encoded: up to 3 bytes per byte, plus a page token that repeats it), so a key that
#: can be ingested must stay well inside what the HTTP server accepts in a request line.
MAX_KEY_BYTES = 4096
KINDS = ("versioned", "timestamped")
#: A stream table (``STREAM_SCHEMA``): an append-only event log, never a versioned store.
STREAM_KIND = "stream"

REJECTED_DIR = "_rejected"
CHANGELOG_DIR = "_changelog"
EMITTED_DIR = "_emitted"
SUBSCRIPTIONS_DIR = "_subscriptions"
PRIVATE_DIR = "_versiq"
#: The Delta log directory of a table: a directory with one is a table (a store, stream or side table).
DELTA_LOG_DIR = "_delta_log"
LOCK_FILE = "lock"
ERASURES_DIR = "_erasures"
#: The Delta transaction that marks an erase commit (``versiq erase``), versioned by the table
#: version it creates.
ERASE_APP_ID = "versiq.erase"
#: ``<warehouse>/_versiq/<ERASE_SECRET_FILE>``: the key of the keyed hashes in ``_erasures``.
ERASE_SECRET_FILE = "erase-secret"

STORE_SCHEMA = pa.schema(
    [
        pa.field("bucket", pa.int32()),
        pa.field("key", pa.string()),
        pa.field("valid_from", pa.int64()),
        pa.field("valid_to", pa.int64()),
        pa.field("value", pa.string()),
        pa.field("tombstone", pa.bool_()),
        pa.field("partition", pa.int32()),
        pa.field("run", pa.int64()),
    ]
)
STORE_PARTITION_COLUMNS = ["bucket"]
#: The columns whose statistics Delta collects: those readers prune files with (keys, times,
#: runs); never the values, whose long JSON would only bloat the log.
DELTA_STATS_COLUMNS = ("key", "valid_from", "timestamp", "run", "seq", "reason", "sequence")
#: Table properties of every table versiq creates: nothing a reader listing Parquet files
#: could misread (no deletion vectors), and checkpoints delta-rs reads.
TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "false",
    "delta.checkpointInterval": "50",
}
#: How many characters of a string Delta keeps in its statistics.
STATS_STRING_PREFIX = 32
#: The order of a store's rows inside each data file.
STORE_SORT = ("key", "valid_from", "run")

#: A stream table (a source stream or a stream-table join's output): one row per record, in
#: stream order (run, seq). Partitioned by ``bucket`` like a store so a key's records are cheap.
STREAM_SCHEMA = pa.schema(
    [
        pa.field("bucket", pa.int32()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("timestamp", pa.int64()),
        pa.field("run", pa.int64()),
        pa.field("seq", pa.int64()),
    ]
)
#: The order of a stream's rows inside each data file.
STREAM_SORT = ("key", "timestamp", "run", "seq")

#: ``<store>/_changelog``: the accepted records of each run of a source store that derived
#: tables read, in the store's processing order (``seq``), so derived tables can be computed
#: (and recomputed after a crash) record by record.
CHANGELOG_SCHEMA = pa.schema(
    [
        pa.field("run", pa.int64()),
        pa.field("seq", pa.int64()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("timestamp", pa.int64()),
        pa.field("partition", pa.int32()),
    ]
)

#: ``<fk join>/_subscriptions``: KIP-213's subscription store, persisted: from run ``run`` on, left
#: key ``key`` points at right key ``foreign_key`` (null: at none). A key's pointer is its row of
#: the greatest run up to the table's run (rows of a later run are an unfinished attempt's).
SUBSCRIPTIONS_SCHEMA = pa.schema(
    [
        pa.field("foreign_key", pa.string()),
        pa.field("key", pa.string()),
        pa.field("run", pa.int64()),
    ]
)

#: ``<derived>/_emitted``: every result a derived table's operator emitted, in order.
EMITTED_SCHEMA = pa.schema(
    [
        pa.field("run", pa.int64()),
        pa.field("sequence", pa.int64()),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("timestamp", pa.int64()),
        pa.field("cause", pa.string()),
    ]
)

REJECTED_SCHEMA = pa.schema(
    [
        pa.field("run", pa.int64()),
        pa.field("source", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("row", pa.int64()),
        pa.field("partition", pa.int64()),
        pa.field("offset", pa.int64()),
        pa.field("reason", pa.string()),
        pa.field("raw", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("ingested_at", pa.string()),
    ]
)

#: ``<store>/_erasures``: one row per ``versiq erase`` of the store (an audit trail): when
#: (``erased_at``, RFC 3339 UTC), by whom (the user name of the process), how many keys and the
#: HMAC-SHA256 of each (hex, under the warehouse's erase secret), the store's snapshot after
#: the erase, the tables erased from and those left to ``versiq rebuild``. Never a key or value.
ERASURES_SCHEMA = pa.schema(
    [
        pa.field("erased_at", pa.string()),
        pa.field("store", pa.string()),
        pa.field("user", pa.string()),
        pa.field("keys", pa.int64()),
        pa.field("key_hashes", pa.list_(pa.string())),
        pa.field("snapshot", pa.int64()),
        pa.field("tables", pa.list_(pa.string())),
        pa.field("rebuild", pa.list_(pa.string())),
    ]
)

#: Rejection reason codes (docs/contract.md): every report lists all of them, zeros included.
REJECT_REASONS = (
    "late",
    "malformed",
    "missing_field",
    "bad_key",
    "bad_timestamp",
    "bad_value",
    "bad_partition",
    "duplicate_offset",
    "partition_conflict",
    "too_large",
    "expression_error",
    "bad_offset",
)


def read_rule_window(kind: str) -> str:
    """The read rule's window, SQL that DuckDB and Spark both read: the row numbered 1 in it
    is the one a read sees (the greatest run per (key, valid_from) for versioned stores, per
    key for timestamped ones)."""
    if kind == "versioned":
        return "PARTITION BY key, valid_from ORDER BY run DESC"
    return "PARTITION BY key ORDER BY run DESC, valid_from DESC"


def read_rule_sql(kind: str) -> str:
    """The read rule as a DuckDB ``QUALIFY`` clause over store rows (with a ``run`` column)."""
    return f"QUALIFY row_number() OVER ({read_rule_window(kind)}) = 1"


def newest_row_order(kind: str) -> str:
    """The order in which a key's newest row by the read rule is the greatest, for DuckDB's
    ``arg_max``: a versioned key's newest version is its greatest ``valid_from``, in that
    version's row of the greatest ``run``; a timestamped key's value is its row of the greatest
    ``run``. One aggregate per key instead of the rule's window over every row."""
    return "(valid_from, run)" if kind == "versioned" else "(run, valid_from)"


def bucket_of(key: str, buckets: int) -> int:
    """The physical bucket of ``key``: zlib CRC-32 of its UTF-8 bytes modulo ``buckets``."""
    return zlib.crc32(key.encode("utf-8")) % buckets


#: The partitioners a store can be created with (``StoreSettings.partitioner``): how a key whose
#: records name no partition gets one. ``murmur2`` is Kafka's default partitioner, so a store fed
#: by a topic puts a key it has never seen where a producer would; ``crc32`` is what stores
#: created before the setting existed use (their settings do not name one), kept for them since
#: a key's partition must never move.
MURMUR2 = "murmur2"
CRC32 = "crc32"
PARTITIONERS = (MURMUR2, CRC32)
#: The partitioner of a new store.
DEFAULT_PARTITIONER = MURMUR2
#: Kafka's ``Utils.murmur2``: its seed and multiplier (MurmurHash2, 32 bits).
MURMUR2_SEED = 0x9747B28C
MURMUR2_M = 0x5BD1E995
_U32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``org.apache.kafka.common.utils.Utils.murmur2`` of ``data`` as an unsigned 32-bit
    int (Java's int, read as unsigned): 4-byte little-endian blocks, then the 1-3 tail bytes."""
    m = MURMUR2_M
    n = len(data)
    h = (MURMUR2_SEED ^ n) & _U32
    end = n - n % 4
    for i in range(0, end, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * m) & _U32
        k = ((k ^ (k >> 24)) * m) & _U32
        h = ((h * m) & _U32) ^ k
    tail = n % 4
    if tail:
        h ^= int.from_bytes(data[end:], "little")
        h = (h * m) & _U32
    h ^= h >> 13
    h = (h * m) & _U32
    return h ^ (h >> 15)


def murmur2_partition(data: bytes, partitions: int) -> int:
    """Kafka's default partition of a record with key bytes ``data``:
    ``Utils.toPositive(Utils.murmur2(data)) % partitions`` (``toPositive`` clears the sign bit)."""
    return (murmur2(data) & 0x7FFFFFFF) % partitions


def murmur2_positive(keys: pa.Array) -> np.ndarray:
    """``toPositive(murmur2(b))`` of every value ``b`` of a binary (or string: its UTF-8 bytes)
    Arrow array, as uint32, vectorised over the keys: ``murmur2`` block by block, each step over
    the keys that still have that block (numpy's uint32 products wrap as Java's int ones do)."""
    binary = keys.cast(pa.large_binary())
    if isinstance(binary, pa.ChunkedArray):
        binary = binary.combine_chunks()
    n = len(binary)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int64)[binary.offset:binary.offset + n + 1]
    data_buffer = binary.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(4, np.uint8)]).astype(np.uint32)  # tail reads stay in bounds
    starts, lengths = offsets[:-1], np.diff(offsets)
    m = np.uint32(MURMUR2_M)
    h = np.uint32(MURMUR2_SEED) ^ lengths.astype(np.uint32)
    blocks = lengths // 4

    def word(at: np.ndarray, count: int) -> np.ndarray:
        value = np.zeros(len(at), dtype=np.uint32)
        for byte in range(count):
            value |= data[at + byte] << np.uint32(8 * byte)
        return value

    for j in range(int(blocks.max())):
        active = np.flatnonzero(blocks > j)
        k = word(starts[active] + 4 * j, 4) * m
        k = (k ^ (k >> np.uint32(24))) * m
        h[active] = (h[active] * m) ^ k
    tails = lengths % 4
    for count in (1, 2, 3):
        at = np.flatnonzero(tails == count)
        h[at] = (h[at] ^ word(starts[at] + 4 * blocks[at], count)) * m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h & np.uint32(0x7FFFFFFF)


def default_partition_of(key: str, partitions: int, partitioner: str) -> int:
    """A key's stream-time partition when its records name none (docs/semantics.md, rules 19-21):
    by the store's ``partitioner`` over the key's UTF-8 bytes (``PARTITIONERS``)."""
    data = key.encode("utf-8")
    if partitioner == MURMUR2:
        return murmur2_partition(data, partitions)
    if partitioner == CRC32:
        return zlib.crc32(data) % partitions
    raise ValueError(f"unknown partitioner {partitioner!r}")


@dataclass(frozen=True)
class Partitioning:
    """How a store places a key whose records name no partition: ``count`` partitions and the
    ``partitioner`` that hashes the key's UTF-8 bytes (``default_partition_of``)."""

    count: int
    partitioner: str

    def of(self, key: str) -> int:
        return default_partition_of(key, self.count, self.partitioner)

    def of_keys(self, keys: pa.Array) -> np.ndarray:
        """``of`` each key of a string array, vectorised, as int64."""
        if self.count == 1:
            return np.zeros(len(keys), dtype=np.int64)
        if self.partitioner == MURMUR2:
            return murmur2_positive(keys).astype(np.int64) % self.count
        return np.fromiter((self.of(key) for key in keys.to_pylist()), dtype=np.int64, count=len(keys))


@dataclass(frozen=True)
class StoreSettings:
    """Settings fixed when a store is created."""

    kind: str
    history_retention_ms: int
    partitions: int
    buckets: int = DEFAULT_BUCKETS
    format: int = FORMAT_VERSION
    #: How a key whose records name no partition gets one (``PARTITIONERS``). Written to the
    #: settings of every store created since it exists; settings without it are ``crc32``.
    partitioner: str = DEFAULT_PARTITIONER

    @property
    def partitioning(self) -> Partitioning:
        return Partitioning(self.partitions, self.partitioner)

    def to_description(self) -> str:
        return json.dumps(
            {
                FORMAT_KEY: self.format,
                "kind": self.kind,
                "historyRetentionMs": self.history_retention_ms,
                "partitions": self.partitions,
                "buckets": self.buckets,
                "partitioner": self.partitioner,
            },
            sort_keys=True,
        )

    @staticmethod
    def from_description(description: str | None) -> StoreSettings:
        """Parse the Delta description; ValueError when it is not a versiq store we can read."""
        if not description:
            raise ValueError("not a versiq store (no settings in the Delta metadata)")
        try:
            data = json.loads(description)
        except json.JSONDecodeError as exc:
            raise ValueError("not a versiq store (metadata description is not JSON)") from exc
        if not isinstance(data, dict) or FORMAT_KEY not in data:
            raise ValueError("not a versiq store (no versiq.format marker)")
        if data[FORMAT_KEY] != FORMAT_VERSION:
            raise ValueError(
                f"unsupported versiq.format {data[FORMAT_KEY]!r} (this reader knows {FORMAT_VERSION})"
            )
        kind = data.get("kind")
        if kind not in KINDS and kind != STREAM_KIND:
            raise ValueError(f"unknown store kind {kind!r}")
        partitioner = data.get("partitioner", CRC32)
        if partitioner not in PARTITIONERS:
            raise ValueError(f"unknown partitioner {partitioner!r}")
        return StoreSettings(
            kind=kind,
            history_retention_ms=int(data["historyRetentionMs"]),
            partitions=int(data["partitions"]),
            buckets=int(data["buckets"]),
            partitioner=partitioner,
        )


@dataclass
class KafkaPosition:
    """Where a store or stream fed by a Kafka topic is in it (``StoreState.kafka``), committed in
    the same Delta commit as the run's data: the consumer position never lives in a consumer
    group, so data and position cannot disagree (versiq.ingest.kafka)."""

    topic: str
    #: Per Kafka partition, the offset of the next record to read (Kafka's "committed offset").
    next_offsets: dict[int, int] = field(default_factory=dict)
    #: Offset ranges deleted by the topic's retention before they were read, accepted with
    #: ``--allow-offset-gaps``: ``{"partition": p, "from": a, "to": b, "run": r}`` ([a, b) lost).
    gaps: list[dict[str, int]] = field(default_factory=list)
    #: The id Kafka gave the topic when it was created (``TopicDescription.topicId()``): the
    #: offsets above are offsets of that topic only; one deleted and created again under the
    #: same name has another id. None in a position committed before ids were kept.
    topic_id: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"topic": self.topic, **({"topicId": self.topic_id} if self.topic_id is not None else {}),
                "nextOffsets": {str(p): o for p, o in sorted(self.next_offsets.items())}, "gaps": self.gaps}

    @staticmethod
    def from_dict(data: dict[str, object]) -> KafkaPosition:
        offsets = data.get("nextOffsets") or {}
        gaps = data.get("gaps") or []
        topic_id = data.get("topicId")
        assert isinstance(offsets, dict) and isinstance(gaps, list)
        return KafkaPosition(topic=str(data["topic"]), next_offsets={int(p): int(o) for p, o in offsets.items()},
                             gaps=[{k: int(v) for k, v in gap.items()} for gap in gaps],
                             topic_id=None if topic_id is None else str(topic_id))


@dataclass
class StoreState:
    """What a store remembers between runs; committed with the data of every run."""

    run: int = 0
    stream_time: dict[int, int] = field(default_factory=dict)
    max_offset: dict[int, int] = field(default_factory=dict)
    done_files: list[str] = field(default_factory=list)
    #: Source stores only: the first run whose accepted records go to ``_changelog`` (None:
    #: no changelog is kept); every run from it on keeps one. It may be the next run (set by a
    #: state-only commit when a table was added and the run had nothing new). Tables start from
    #: the store's snapshot of run ``changelog_since - 1`` and then read the changelog.
    changelog_since: int | None = None
    #: Derived tables only: per upstream *source* store/stream, the last run consumed and the
    #: source's snapshot after that run (``{"orders": {"run": 3, "snapshot": 7}}``).
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Derived tables only: the snapshot of each direct input this snapshot was computed from.
    inputs: dict[str, int] = field(default_factory=dict)
    #: Derived tables only: the table's definition (canonical JSON of its pipeline entry).
    definition: str | None = None
    #: Stores and streams fed by a Kafka topic: the position in it (None for file sources).
    kafka: KafkaPosition | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                FORMAT_KEY: FORMAT_VERSION,
                "run": self.run,
                "streamTime": {str(p): t for p, t in sorted(self.stream_time.items())},
                "maxOffset": {str(p): o for p, o in sorted(self.max_offset.items())},
                "doneFiles": sorted(self.done_files),
                "changelogSince": self.changelog_since,
                "sources": self.sources,
                "inputs": self.inputs,
                "definition": self.definition,
                **({"kafka": self.kafka.to_dict()} if self.kafka is not None else {}),
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str) -> StoreState:
        data = json.loads(text)
        return StoreState(
            run=int(data.get("run", 0)),
            stream_time={int(p): int(t) for p, t in data.get("streamTime", {}).items()},
            max_offset={int(p): int(o) for p, o in data.get("maxOffset", {}).items()},
            done_files=list(data.get("doneFiles", [])),
            changelog_since=None if data.get("changelogSince") is None else int(data["changelogSince"]),
            sources={name: {"run": int(v["run"]), "snapshot": int(v["snapshot"])}
                     for name, v in data.get("sources", {}).items()},
            inputs={name: int(v) for name, v in data.get("inputs", {}).items()},
            definition=data.get("definition"),
            kafka=KafkaPosition.from_dict(data["kafka"]) if data.get("kafka") else None,
        )


def log_file(table_path: str, version: int) -> str:
    return storage.join(delta_log(table_path), f"{version:020d}.json")


def read_state(table_path: str, version: int) -> StoreState:
    """The ``StoreState`` of snapshot ``version``: from the newest commit <= version carrying one.

    Reads the commit JSON files directly: the state is small and this avoids loading the whole
    snapshot. Raises FileNotFoundError when the log of that version is gone (log cleanup).
    """
    for v in range(version, -1, -1):
        for line in storage.read_text(log_file(table_path, v)).splitlines():
            if not line.startswith('{"commitInfo"'):
                continue
            info = json.loads(line)["commitInfo"]
            text = info.get(STATE_KEY, info.get(LEGACY_STATE_KEY))
            if text is not None:
                return StoreState.from_json(text)
    return StoreState()


def bucket_files(table: DeltaTable, table_path: str, stats: tuple[str, ...] = ()) -> dict[int, list[dict[str, Any]]]:
    """The data files of ``table``'s snapshot (a store or stream table at ``table_path``) per
    bucket, the ``bucket`` partition value of each add action, in the order of the snapshot's
    add actions. Each file is a dict of ``"file"``, the location DuckDB reads
    (``storage.data_file``), and the add action's columns named in ``stats`` as delta-rs's
    flattened ``get_add_actions`` names them (``num_records``, ``size_bytes``, ``min.<column>``
    and ``max.<column>`` for the columns of ``DELTA_STATS_COLUMNS``): None where the snapshot
    records no such value. ValueError for a file without a bucket (a table not partitioned by
    ``bucket``)."""
    adds = pa.table(table.get_add_actions(flatten=True))

    def column(name: str) -> list[Any]:
        return adds.column(name).to_pylist() if name in adds.column_names else [None] * adds.num_rows

    values = {name: column(name) for name in stats}
    files: dict[int, list[dict[str, Any]]] = {}
    for i, (path, bucket) in enumerate(zip(column("path"), column("partition.bucket"), strict=True)):
        if bucket is None:
            raise ValueError(f"the table {table_path} is not partitioned by 'bucket' (versiq layout)")
        files.setdefault(int(bucket), []).append(
            {"file": storage.data_file(table_path, path), **{name: values[name][i] for name in stats}})
    return files


def may_hold_key(key: str, min_key: str | None, max_key: str | None) -> bool:
    """Whether a file whose Delta statistics say [min_key, max_key] may hold ``key``.

    Delta keeps a prefix of long strings: the minimum is a prefix of the true one (a lower
    bound as it is); a truncated maximum is a prefix followed by a tie-breaking character that
    need not sort after every continuation. Comparing ``key`` cut to the maximum's length minus
    one with the maximum minus its last character is a true bound in both cases."""
    if min_key is not None and key < min_key:
        return False
    if max_key is None:
        return True
    if len(max_key.encode("utf-16-le")) // 2 <= STATS_STRING_PREFIX:  # never truncated: exact
        return key <= max_key
    cut = len(max_key) - 1
    return key[:cut] <= max_key[:cut]


def horizon(stream_time: int | None, history_retention_ms: int) -> int | None:
    """``streamTime - H`` for a partition, or None when the partition has seen no record."""
    if stream_time is None:
        return None
    return stream_time - history_retention_ms


def horizon_sql(stream_time: dict[int, int], history_retention_ms: int, quote: str = '"') -> str:
    """``horizon`` of each row's partition as an SQL expression over its ``partition`` column
    (quoted with ``quote``: DuckDB's ``"``, Spark's `````): NULL for a partition that has seen no
    record (and for a store that has seen none)."""
    cases = " ".join(f"WHEN {p} THEN {t - history_retention_ms}" for p, t in sorted(stream_time.items()))
    return f"CASE {quote}partition{quote} {cases} END" if cases else "NULL"


def answerable_sql(stream_time: dict[int, int], history_retention_ms: int, quote: str = '"') -> str:
    """The rows of a versioned store a query can still return, as an SQL condition: not
    history that ended at or before its partition's horizon (docs/semantics.md, retention
    edges; ``versiq maintain`` drops it)."""
    bound = horizon_sql(stream_time, history_retention_ms, quote)
    return f"valid_to IS NULL OR {bound} IS NULL OR valid_to > {bound}"


def table_path(warehouse: str, name: str) -> str:
    """Where table ``name`` of ``warehouse`` lives: a direct child of the warehouse (a local
    directory or an S3 prefix, ``versiq.storage``)."""
    return storage.join(storage.normalize(warehouse), name)


def delta_log(table_path: str) -> str:
    """The Delta log directory of the table at ``table_path``."""
    return storage.join(table_path, DELTA_LOG_DIR)


def has_delta_log(path: str) -> bool:
    """Whether ``path`` is a table directory (it has a Delta log), readable or not."""
    return storage.isdir(delta_log(path))


def has_table(path: str) -> bool:
    """Whether ``path`` holds a Delta table: a Delta log with at least one commit. A log without
    one is what a writer killed inside the table's first commit leaves; the table does not exist
    yet, and the rerun's first commit creates it."""
    return has_delta_log(path) and storage.is_delta_table(path)
