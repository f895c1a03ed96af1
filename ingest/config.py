"""The YAML pipeline file of ``versiq ingest --config``:

```yaml
stores:
  - name: prices                 # letters, digits, _ - .
    source: data/prices/         # a file or a directory (recursive); relative to the YAML file
    format: jsonl                # jsonl | csv | parquet (default: by file extension)
    kind: versioned              # versioned | timestamped
    history_retention: 7d        # ms integer, 5m / 12h / 7d, or ISO-8601 (P7D)
    max_future: 1h               # refuse records later than the run's clock + this (none: no limit)
    partitions: 4
    buckets: 16                  # optional physical layout
  - name: orders                 # a Kafka topic instead of files (docs/contract.md, Kafka sources)
    source:
      kafka:
        bootstrap: "broker:9092"
        topic: orders
        value_format: debezium     # json (default) | string | debezium | avro | json_sr | protobuf
        # key_format: string       # string (default) | avro | json_sr | protobuf (not with debezium)
        # schema_registry: {url: "http://registry:8081"}   # avro, json_sr, protobuf: Confluent-compatible base URL
        options: {security.protocol: SASL_SSL}   # Kafka client settings (or VERSIQ_KAFKA_* variables)
streams:                         # append-only event logs (docs/derived-tables.md)
  - name: clicks
    source: data/clicks/
    max_future: 1h               # as for stores: a stream record later than this is refused
tables:                          # derived tables (docs/derived-tables.md)
  - name: big_prices
    from: prices
    filter: "value.amount > 100"
```
Errors are ``UsageError`` naming the entry and the field, raised before any data is touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from versiq import layout, storage
from versiq.durations import DurationError, parse_duration_ms
from versiq.ingest.derived.spec import TableSpec, check_global_store, parse_tables
from versiq.ingest.errors import UsageError
from versiq.ingest.future import DEFAULT_MAX_FUTURE_MS, parse_max_future
from versiq.ingest.kafka import KafkaSource
from versiq.ingest.pipeline import StoreSpec
from versiq.ingest.records.kafka_rows import KafkaFormat
from versiq.ingest.streams import StreamSpec
from versiq.layout import STREAM_KIND, StoreSettings, has_table

_STORE_FIELDS = {"name", "source", "format", "kind", "history_retention", "partitions", "buckets", "global",
                 "max_future"}
_STREAM_FIELDS = {"name", "source", "format", "buckets", "max_future"}
_KAFKA_FIELDS = {"bootstrap", "topic", "options", "starting_offsets", "allow_offset_gaps", "value_format",
                 "timestamp_field", "timestamp_header", "debezium_timestamp", "key_field", "schema_registry",
                 "key_format"}
_REGISTRY_FIELDS = {"url"}


@dataclass(frozen=True)
class Pipeline:
    """A whole pipeline file. ``inputs`` is the declaration order of the source inputs (stores,
    then streams, as the sections appear): the tie-break of the input merge."""

    stores: list[StoreSpec]
    streams: list[StreamSpec] = field(default_factory=list)
    tables: list[TableSpec] = field(default_factory=list)

    @property
    def inputs(self) -> list[str]:
        return [s.name for s in self.stores] + [s.name for s in self.streams]


def load_config(path: str, warehouse: str | None = None, *,
                default_max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS) -> Pipeline:
    """Load and check a pipeline file. With ``warehouse``, the kind of an existing store that
    the file does not state is read from the store (it decides rules 15 and 18)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config {path}: expected a mapping with 'stores:' (and 'streams:', 'tables:')")
    unknown_top = set(data) - {"stores", "streams", "tables"}
    if unknown_top:
        raise UsageError(f"config {path}: unknown top-level key(s): {', '.join(sorted(unknown_top))}")
    for section in ("stores", "streams"):
        if data.get(section) is not None and not isinstance(data[section], list):
            raise UsageError(f"config {path}: '{section}:' must be a list")
    if not data.get("stores") and not data.get("streams"):
        raise UsageError(f"config {path}: expected a non-empty 'stores:' (or 'streams:') list")
    base = os.path.dirname(os.path.abspath(path))
    stores = [_store(entry, i, base, default_max_future_ms) for i, entry in enumerate(data.get("stores") or [])]
    streams = [_stream(entry, i, base, default_max_future_ms) for i, entry in enumerate(data.get("streams") or [])]
    kinds: dict[str, str] = {}
    for index, spec in enumerate(stores):
        kind = spec.kind or _existing_kind(warehouse, spec.name) or "versioned"
        kinds[spec.name] = kind
        check_global_store(f"stores[{index}] ({spec.name})", data["stores"][index], kind)
    for stream in streams:
        if stream.name in kinds:
            raise UsageError(f"config {path}: the name {stream.name!r} is used twice")
        kinds[stream.name] = STREAM_KIND
    if len(kinds) != len(stores) + len(streams):
        raise UsageError(f"config {path}: a store name appears twice")
    tables = parse_tables(data.get("tables"), kinds)
    if warehouse is not None:
        for table in tables:
            _check_existing_table(warehouse, table)
    needed = {name for t in tables for name in t.inputs}
    stores = [replace(s, changelog=True) if s.name in needed else s for s in stores]
    return Pipeline(stores=stores, streams=streams, tables=tables)


def _check_existing_table(warehouse: str, table: TableSpec) -> None:
    """A derived table that exists must have been computed from the same definition: results
    of a changed filter or join applied to new records only would silently mix two tables."""
    path = layout.table_path(warehouse, table.name)
    if not has_table(path):
        return

    from versiq.layout import read_state

    delta = storage.delta_table(path)
    state = read_state(path, delta.version())
    if state.definition is None:
        raise UsageError(f"tables ({table.name}): {table.name!r} already exists in the warehouse and is not a "
                         "derived table (a source store or stream); choose another name")
    if state.definition != table.definition:
        raise UsageError(f"tables ({table.name}): the definition changed since the table was built "
                         f"(was {state.definition}, now {table.definition}); delete {path} to rebuild it from "
                         "its inputs, or give the new definition a new name")


def _existing_kind(warehouse: str | None, name: str) -> str | None:
    if warehouse is None:
        return None
    try:

        table = storage.delta_table(layout.table_path(warehouse, name))
        return StoreSettings.from_description(table.metadata().description).kind
    except Exception:  # noqa: BLE001 - no store yet (or not readable): the default applies
        return None


def _checked_entry(entry: Any, where: str, fields: set[str], hint: str = "") -> str | KafkaSource:
    """The checks every ``stores:``/``streams:`` entry shares; returns its source: a path (a
    relative one is relative to the pipeline file's folder, ``base``) or a Kafka topic."""
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: expected a mapping")
    unknown = set(entry) - fields
    if unknown:
        raise UsageError(f"{where}: unknown field(s): {', '.join(sorted(unknown))}{hint}")
    if not isinstance(entry.get("name"), str) or not entry["name"]:
        raise UsageError(f"{where}: 'name' is required (a string)")
    if isinstance(entry.get("source"), dict):
        return _kafka_source(entry["source"], f"{where} ({entry['name']})")
    if not isinstance(entry.get("source"), str) or not entry["source"]:
        raise UsageError(f"{where}: 'source' is required (a file or directory, or {{kafka: {{...}}}})")
    return str(entry["source"])


def _kafka_source(source: dict[str, Any], where: str) -> KafkaSource:
    """``source: {kafka: {bootstrap, topic, options, starting_offsets, allow_offset_gaps,
    value_format, key_format, timestamp_field, timestamp_header, debezium_timestamp, key_field,
    schema_registry: {url}}}``."""
    if set(source) != {"kafka"} or not isinstance(source["kafka"], dict):
        raise UsageError(f"{where}: 'source' must be a path or {{kafka: {{bootstrap: ..., topic: ...}}}}")
    kafka = source["kafka"]
    unknown = set(kafka) - _KAFKA_FIELDS
    if unknown:
        raise UsageError(f"{where}: source.kafka: unknown field(s): {', '.join(sorted(unknown))}")
    for required in ("bootstrap", "topic"):
        if not isinstance(kafka.get(required), str) or not kafka[required]:
            raise UsageError(f"{where}: source.kafka: '{required}' is required (a string)")
    options = kafka.get("options") or {}
    if not isinstance(options, dict):
        raise UsageError(f"{where}: source.kafka: 'options' must be a mapping of Kafka client settings")
    if not isinstance(kafka.get("allow_offset_gaps", False), bool):
        raise UsageError(f"{where}: source.kafka: 'allow_offset_gaps' must be true or false")
    text = {name: kafka[name] for name in ("value_format", "timestamp_field", "timestamp_header",
                                          "debezium_timestamp", "key_field", "starting_offsets", "key_format")
            if name in kafka}
    for name, value in text.items():
        if not isinstance(value, str):
            raise UsageError(f"{where}: source.kafka: '{name}' must be a string")
    fmt = KafkaFormat(value_format=text.get("value_format", "json"), timestamp_field=text.get("timestamp_field"),
                      timestamp_header=text.get("timestamp_header"),
                      debezium_timestamp=text.get("debezium_timestamp", "ts_ms"), key_field=text.get("key_field"),
                      schema_registry=_schema_registry(kafka, where), key_format=text.get("key_format", "string"))
    result = KafkaSource(bootstrap=kafka["bootstrap"], topic=kafka["topic"],
                         options={str(k): str(v) for k, v in options.items()},
                         starting_offsets=text.get("starting_offsets", "earliest"),
                         allow_offset_gaps=kafka.get("allow_offset_gaps", False), format=fmt)
    result.validate(where)
    return result


def _schema_registry(kafka: dict[str, Any], where: str) -> str | None:
    """``schema_registry: {url: ...}`` of a Kafka source (avro, json_sr, protobuf values or keys), its URL."""
    if "schema_registry" not in kafka:
        return None
    registry = kafka["schema_registry"]
    if not isinstance(registry, dict):
        raise UsageError(f"{where}: source.kafka: 'schema_registry' must be a mapping such as "
                         "{url: http://registry:8081}")
    unknown = set(registry) - _REGISTRY_FIELDS
    if unknown:
        raise UsageError(f"{where}: source.kafka.schema_registry: unknown field(s): {', '.join(sorted(unknown))}")
    if not isinstance(registry.get("url"), str) or not registry["url"]:
        raise UsageError(f"{where}: source.kafka.schema_registry: 'url' is required (the registry's "
                         "Confluent-compatible base URL)")
    return str(registry["url"])


def _check_integers(entry: dict[str, Any], where: str) -> None:
    for name in ("partitions", "buckets"):
        if name in entry and (not isinstance(entry[name], int) or isinstance(entry[name], bool)):
            raise UsageError(f"{where} ({entry['name']}): '{name}' must be an integer")


def _absolute(source: str, base: str) -> str:
    return source if os.path.isabs(source) or storage.is_s3(source) else os.path.join(base, source)


def _source_fields(source: str | KafkaSource, base: str) -> dict[str, Any]:
    """The ``source`` (and ``kafka``) arguments of a store's or stream's spec."""
    if isinstance(source, KafkaSource):
        return {"source": source.name, "kafka": source}
    return {"source": _absolute(source, base)}


def _max_future(entry: dict[str, Any], where: str, default: int | None) -> int | None:
    """An entry's ``max_future`` (stores and streams alike), else the run's default."""
    if "max_future" not in entry:
        return default
    try:
        if entry["max_future"] is None:  # YAML's null is not 'none': say which one is meant
            raise DurationError("null is not a duration: give one such as 1h, or none for no limit")
        return parse_max_future(str(entry["max_future"]))
    except DurationError as exc:
        raise UsageError(f"{where} ({entry['name']}): max_future: {exc} (or none)") from None


def _stream(entry: Any, index: int, base: str, default_max_future_ms: int | None) -> StreamSpec:
    where = f"streams[{index}]"
    source = _checked_entry(entry, where, _STREAM_FIELDS, " (a stream has no kind, history retention or partitions)")
    _check_integers(entry, where)
    return StreamSpec(name=entry["name"], **_source_fields(source, base), format=entry.get("format"),
                      buckets=entry.get("buckets"), max_future_ms=_max_future(entry, where, default_max_future_ms))


def _store(entry: Any, index: int, base: str, default_max_future_ms: int | None) -> StoreSpec:
    where = f"stores[{index}]"
    source = _checked_entry(entry, where, _STORE_FIELDS)
    retention = entry.get("history_retention")
    retention_ms = None
    if retention is not None:
        try:
            retention_ms = parse_duration_ms(retention)
        except DurationError as exc:
            raise UsageError(f"{where} ({entry['name']}): history_retention: {exc}") from None
    max_future_ms = _max_future(entry, where, default_max_future_ms)
    _check_integers(entry, where)
    return StoreSpec(
        max_future_ms=max_future_ms,
        name=entry["name"],
        **_source_fields(source, base),
        format=entry.get("format"),
        kind=entry.get("kind"),
        history_retention_ms=retention_ms,
        partitions=entry.get("partitions"),
        buckets=entry.get("buckets"),
    )
