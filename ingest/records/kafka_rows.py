"""Kafka records as parsed rows: one Arrow batch of Kafka records (``KAFKA_INPUT_SCHEMA``: the
key and value bytes, partition, offset, record timestamp and headers) becomes one batch of
``PARSED_SCHEMA`` rows, one row per record in the same order; nothing is dropped here.

The mapping (how a Kafka record becomes a versiq record):

- **Position.** ``pos`` and ``offset`` are the record's offset and ``part`` its partition, so
  the ordering rules of files (rule 20, offsets increase per partition) hold for topics as they
  are. ``source`` is the caller's name for the topic (such as ``kafka:prices``).
- **raw** is set on every row, records included: a Kafka record cannot be read again from a file
  the way ``files.raw_texts`` re-reads a file's lines, so the row carries its own text. It is
  the compact JSON object ``{"key": <text>, "value": <text>}`` of the UTF-8 texts of the bytes
  (null for null bytes); bytes that are not valid UTF-8 are given as ``"keyBase64"`` /
  ``"valueBase64"`` (standard base64) instead, so raw always gives back the exact bytes. A
  record with headers has a third member, ``"headers"`` (``_headers_member``): an object of the
  header names, in the order each name first appears, each to its value as UTF-8 text, null for
  a null value, or ``{"base64": <text>}`` for bytes that are not UTF-8; a name the record repeats
  maps to the array of its values in order. A record without headers has no such member, so its
  raw is what it was before headers were read. One rule reads a header: with
  ``timestamp_header`` (``_header_timestamp``) the record's timestamp is that header's value;
  otherwise headers never change a record's key, value, timestamp or outcome. Headers are not
  stored with a version (a Kafka Streams versioned store keeps none either).
- **Key.** The key bytes as UTF-8 text. A null key, bytes that are not UTF-8, and the empty key
  are ``bad_key`` (unlike a file's empty ``key``, which is ``missing_field``: a Kafka record
  always has the key slot, so the key is wrong rather than missing). With ``debezium`` the key
  bytes are JSON, the connector's key struct, with or without the JSON converter's schema
  envelope (``{"schema": ..., "payload": {...}}``): the key is the compact text of that object
  (member order kept), or with ``key_field`` the value of that one member (a string as it is,
  an integer as its decimal text; anything else is ``bad_key``). Key JSON that does not parse
  or is not an object is ``bad_key``. With ``key_format`` ``avro``, ``json_sr`` or ``protobuf``
  the key bytes are in the schema registry's wire format and decoded like values (below): a
  decoded string is the key as it is, an integer its decimal text, anything else (a record, a
  Protobuf message, an array) its compact JSON text with every object's members sorted by name
  (``canonical_key``: the same key for the same logical record whatever order a writer's schema
  declares its fields in). A key that cannot be decoded, a null datum and the empty string are
  ``bad_key`` naming the schema id. The key size limit and the Unicode check of every format
  apply (``batch.Batcher``).
- **Value.** ``json``: UTF-8 JSON text, parsed strictly and stored compact, like a file's value
  column; text that is not UTF-8 or not JSON is ``bad_value``. A null value is a tombstone (the
  compacted-topic convention), and so is the JSON text ``null``: a JSON null value is a
  tombstone in every file format (an absent or null ``value`` in JSON Lines, ``null`` in a CSV
  or Parquet value column), and one rule for all inputs is worth more than telling two nulls
  apart. ``string``: the UTF-8 text stored as a JSON string (the empty text is the JSON string
  ``""``, not a tombstone); a null value is a tombstone; bytes that are not UTF-8 are
  ``bad_value``. ``debezium``: see below. ``avro``, ``json_sr`` and ``protobuf``: the Confluent
  schema registry's wire format (magic byte 0, the 4-byte schema id, the payload), each value
  decoded with its writer schema from the registry at ``schema_registry`` (``records.registry``):
  Avro becomes the JSON of the decoded datum, Protobuf the JSON of the message
  (``records.protobuf``), JSON Schema's payload is JSON text; the result then
  follows the ``json`` rules (a null datum or JSON ``null`` is a tombstone, ``timestamp_field``
  reads it). A value not in the wire format, an unknown schema id or a corrupt payload is
  ``bad_value`` naming the schema id; a registry that cannot be asked fails the run
  (``registry.SchemaRegistryError``).
- **Timestamp.** The Kafka record timestamp; a negative one (Kafka's -1: the producer set none)
  or a null one is ``bad_timestamp``. With ``timestamp_field`` (a dotted path such as
  ``meta.ts``: every dot separates two member names) the timestamp is read from the value
  instead, by the rules of a file's ``timestamp`` (``fields.timestamp_from_json``: epoch ms or
  an RFC 3339 instant); a path that is not there or ends at null is ``missing_field``. A
  tombstone has no value to read a field from, so it takes the Kafka record timestamp (a
  compacted topic's deletes must stay possible); a Debezium delete takes the envelope's.
- **Debezium** (``value_format="debezium"``, the JSON converter, with or without its schema
  envelope; the envelope is recognised as an object of exactly the members ``schema`` and
  ``payload``, ``schema`` an object or null). Operations ``c`` (create), ``r`` (snapshot read)
  and ``u`` (update) store the compact text of the ``after`` row, which must be an object; ``d``
  (delete) is a tombstone. Any other ``op`` (``t`` truncate, ``m`` message) is ``bad_value``: it
  is not the change of one key. The timestamp is the envelope's ``ts_ms`` (when the connector
  processed the change) or, with ``debezium_timestamp="source.ts_ms"``, the source block's
  (when the database made it); missing, it is ``missing_field``. ``timestamp_field`` reads the
  ``after`` row instead (for ``c``, ``r``, ``u``; a delete has no ``after`` row and keeps the
  envelope's timestamp: the last row's own time would put the delete at the time of the version
  it deletes). The field must be epoch ms or RFC 3339 text: connectors' microsecond types
  (Postgres ``MicroTimestamp``) are read as milliseconds, far in the future, which the
  ``max_future`` guard then refuses. A null value (the tombstone Debezium writes after each
  delete for log compaction) is neither a record nor a rejection: its row has reason
  ``SKIPPED`` and raw set, and the caller counts and drops it (the ``d`` event before it
  already deleted the key). The JSON text ``null`` is not such a message: it is ``bad_value``.
- **Size.** Key and value bytes over 1 MiB together are ``too_large`` (the record limit of every
  format, ``MAX_RECORD_BYTES``).
- **max_timestamp.** After parsing, ``files.refuse_future``: records stamped later are
  ``bad_timestamp``, exactly as for files.

When several rules fail, the first in this order decides: size, key, value, timestamp; for
Debezium the value (and its timestamp) comes before the key, since a truncate event has a null
key and its op is the reason to give.

Every value and key takes a fast path when its bytes are already canonical compact JSON (orjson
re-serialises them to exactly the same bytes; the general path then gives the same outcome and
is skipped); anything else takes the strict general path, which words every rejection.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

import orjson
import pyarrow as pa

from versiq.ingest.records import registry as wire
from versiq.ingest.records.batch import Batcher
from versiq.ingest.records.fields import Reject, timestamp_from_json
from versiq.ingest.records.files import refuse_future
from versiq.ingest.records.jsonvalue import RawInt, compact, strict_loads
from versiq.ingest.records.schema import MAX_RECORD_BYTES
from versiq.timestamps import MAX_TIMESTAMP, TimestampError, parse_timestamp

#: The ``reason`` of a Debezium delete marker's row: not in ``versiq.layout.REJECT_REASONS``, since
#: such a row is not a rejection; the caller counts and drops it.
SKIPPED = "skipped_delete_marker"
SKIPPED_DETAIL = ("the null-value message Debezium writes after a delete (the preceding 'd' event "
                  "already deleted the key)")

VALUE_FORMATS = ("json", "string", "debezium", "avro", "json_sr", "protobuf")
#: The formats (of values and of keys) in the schema registry's wire format.
REGISTRY_FORMATS = ("avro", "json_sr", "protobuf")
#: ``string``: the key bytes as UTF-8 text; the others: the schema registry's wire format.
KEY_FORMATS = ("string", "avro", "json_sr", "protobuf")
DEBEZIUM_TIMESTAMPS = ("ts_ms", "source.ts_ms")

#: The columns ``parse_kafka`` reads (Spark's Kafka source with ``includeHeaders``, its
#: timestamp as epoch ms). ``headers`` is null for a record without headers (Spark's own choice).
KAFKA_INPUT_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.int64()),
        pa.field("headers", pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))),
    ]
)

_ROW_OPS = ("c", "r", "u")
_OTHER_OPS = {"t": "truncate", "m": "message"}

# Bound once: the per-record loop avoids attribute lookups.
_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError
_b64encode = base64.b64encode
_SLOW: Any = object()  # "not canonical: take the general path"


@dataclass(frozen=True)
class KafkaFormat:
    """How a topic's records map to versiq records (the module docstring has the rules).

    ``value_format``: ``json``, ``string``, ``debezium``, ``avro``, ``json_sr`` or ``protobuf``.
    ``timestamp_field``: a dotted path into the JSON value (for ``debezium``, into the ``after``
    row; for ``avro``, into the decoded datum) to take the timestamp from instead of the Kafka
    record's. ``debezium_timestamp``: ``ts_ms`` (the envelope's) or ``source.ts_ms`` (the source
    block's). ``key_field``: with ``debezium``, one member of the key struct as the key instead
    of the struct's compact JSON text. ``schema_registry``: with ``avro``, ``json_sr`` and
    ``protobuf`` values or keys, the schema registry's Confluent-compatible base URL (left out of
    ``repr``: its userinfo may hold credentials). ``key_format``: ``string`` (the key bytes as
    UTF-8 text) or ``avro``, ``json_sr``, ``protobuf`` (the registry's wire format, decoded: the
    module docstring's Key rule). ``timestamp_header``: the name of a record header whose value
    (UTF-8 epoch milliseconds or an RFC 3339 instant; the last header of that name) is the
    record's timestamp instead of the Kafka record's."""

    value_format: str = "json"
    timestamp_field: str | None = None
    debezium_timestamp: str = "ts_ms"
    key_field: str | None = None
    schema_registry: str | None = field(default=None, repr=False)
    key_format: str = "string"
    timestamp_header: str | None = None

    def validate(self) -> None:
        """Refuse settings that cannot mean anything, before any record is read (ValueError)."""
        if self.value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format {self.value_format!r} is not one of "
                             f"{', '.join(repr(f) for f in VALUE_FORMATS)}")
        if self.key_format not in KEY_FORMATS:
            raise ValueError(f"key_format {self.key_format!r} is not one of "
                             f"{', '.join(repr(f) for f in KEY_FORMATS)}")
        needs = [f"{what}_format {fmt!r}" for what, fmt in (("value", self.value_format), ("key", self.key_format))
                 if fmt in REGISTRY_FORMATS]
        if needs:
            if not self.schema_registry:
                raise ValueError(f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} a schema registry: its "
                                 "Confluent-compatible base URL (pipeline: schema_registry: {url: ...}; "
                                 "--schema-registry URL)")
            problem = wire.check_url(self.schema_registry)
            if problem is not None:
                raise ValueError(problem)
        elif self.schema_registry is not None:
            raise ValueError(f"a schema registry applies to value_format or key_format 'avro', 'json_sr' and "
                             f"'protobuf' only, not value_format {self.value_format!r} with key_format "
                             f"{self.key_format!r}")
        if self.value_format == "debezium" and self.key_format != "string":
            raise ValueError(f"key_format {self.key_format!r} does not apply to value_format 'debezium': its keys are "
                             "the connector's JSON key struct (key_field picks one member)")
        if self.timestamp_field is not None:
            if self.value_format == "string":
                raise ValueError("timestamp_field needs JSON values: with value_format 'string' the value is "
                                 "stored as text and has no fields")
            if "" in self.timestamp_field.split("."):
                raise ValueError(f"timestamp_field {self.timestamp_field!r} is not a dotted path of member "
                                 "names such as 'updated_at' or 'meta.ts'")
        if self.timestamp_header is not None:
            if not self.timestamp_header:
                raise ValueError("timestamp_header is empty: name the header that holds the timestamp")
            if self.timestamp_field is not None:
                raise ValueError("give timestamp_field (a field of the value) or timestamp_header (a record "
                                 "header), not both")
            if self.value_format == "debezium":
                raise ValueError("timestamp_header does not apply to value_format 'debezium': its timestamp is "
                                 "the envelope's (debezium_timestamp)")
        if self.value_format != "debezium":
            if self.debezium_timestamp != "ts_ms":
                raise ValueError(f"debezium_timestamp {self.debezium_timestamp!r} applies to value_format "
                                 f"'debezium' only, not {self.value_format!r}")
            if self.key_field is not None:
                raise ValueError(f"key_field applies to value_format 'debezium' only, not {self.value_format!r}: "
                                 "other keys are the key bytes as text")
        if self.debezium_timestamp not in DEBEZIUM_TIMESTAMPS:
            raise ValueError(f"debezium_timestamp {self.debezium_timestamp!r} is not 'ts_ms' (the envelope's) "
                             "or 'source.ts_ms' (the source block's)")
        if self.key_field == "":
            raise ValueError("key_field is empty: name one member of the Debezium key")


def parse_kafka(batch: pa.RecordBatch, fmt: KafkaFormat, source: str, max_timestamp: int | None = None,
                *, fast: bool = True) -> pa.RecordBatch:
    """One ``PARSED_SCHEMA`` row per record of ``batch`` (columns of ``KAFKA_INPUT_SCHEMA``), in
    order: a record, a rejection, or (Debezium's delete markers) a ``SKIPPED`` row.

    ``max_timestamp``: records stamped later become ``bad_timestamp`` (``files.refuse_future``).
    ``fast``: try the canonical-JSON fast path first (tests turn it off to compare)."""
    fmt.validate()
    rules = _Rules(fmt, fast)
    key_of, value_of, debezium = rules.key, rules.value, fmt.value_format == "debezium"
    header = fmt.timestamp_header
    out = Batcher(source)
    columns = [batch.column(name).to_pylist() for name in KAFKA_INPUT_SCHEMA.names]
    for key_b, value_b, part, offset, kts, headers in zip(*columns, strict=True):
        try:
            key_t = None if key_b is None else key_b.decode()
        except UnicodeDecodeError:
            key_t = None
        try:
            value_t = None if value_b is None else value_b.decode()
        except UnicodeDecodeError:
            value_t = None
        raw = "{" + _member("key", key_b, key_t) + "," + _member("value", value_b, value_t)
        raw += "}" if not headers else "," + _headers_member(headers) + "}"
        if debezium and value_b is None:
            out.reject(offset, SKIPPED, SKIPPED_DETAIL, raw, part, offset)
            continue
        try:
            size = (0 if key_b is None else len(key_b)) + (0 if value_b is None else len(value_b))
            if size > MAX_RECORD_BYTES:
                raise Reject("too_large", f"key and value are {size} bytes together (limit 1 MiB)")
            if debezium:  # a truncate event has no key: its op is the reason
                value, ts = value_of(value_b, value_t, kts)
                key = key_of(key_b, key_t)
            else:
                key = key_of(key_b, key_t)
                if header is None:
                    value, ts = value_of(value_b, value_t, kts)
                else:  # the value's own rules with a stand-in timestamp; the header's replaces it
                    value, _ = value_of(value_b, value_t, 0)
                    ts = _header_timestamp(headers, header)
        except Reject as rej:
            out.reject(offset, rej.reason, rej.detail, raw, part, offset)
            continue
        out.record(offset, key, value, ts, part, offset, raw)
    parsed = out.flush()
    return parsed if max_timestamp is None else refuse_future(parsed, max_timestamp)


def _member(name: str, data: bytes | None, text: str | None) -> str:
    """One member of ``raw``: the bytes' text, null, or (not UTF-8) ``<name>Base64``."""
    if text is not None:
        return '"' + name + '":' + encode_basestring(text)
    if data is None:
        return '"' + name + '":null'
    return '"' + name + 'Base64":"' + _b64encode(data).decode("ascii") + '"'


def _headers_member(headers: list[dict[str, Any]]) -> str:
    """The ``headers`` member of ``raw`` (module docstring): Kafka keeps headers as a list of
    (name, value) pairs in which a name may repeat; raw groups them by name so that a reader
    finds a header by its name, and keeps every value of a repeated name in order (the order
    of values across different names is not kept)."""
    grouped: dict[str, list[str]] = {}
    for header in headers:
        grouped.setdefault(header["key"], []).append(_header_value(header["value"]))
    members = [encode_basestring(name) + ":" + (values[0] if len(values) == 1 else "[" + ",".join(values) + "]")
               for name, values in grouped.items()]
    return '"headers":{' + ",".join(members) + "}"


def _header_timestamp(headers: list[dict[str, Any]] | None, name: str) -> int:
    """The timestamp in the last header called ``name`` (as Kafka's ``Headers.lastHeader``): its
    UTF-8 text, epoch milliseconds or an RFC 3339 instant, by the rules of a file's
    ``timestamp``; missing or null is ``missing_field``."""
    found = [h["value"] for h in headers or () if h["key"] == name]
    if not found:
        raise Reject("missing_field", f"the record has no header '{name}' (timestamp_header)")
    data = found[-1]
    if data is None:
        raise Reject("missing_field", f"header '{name}' is null (timestamp_header)")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise Reject("bad_timestamp", f"header '{name}' is not valid UTF-8: {_utf8_error(data)}") from None
    value: Any = text
    if text.lstrip("-").isascii() and text.lstrip("-").isdigit():
        try:
            value = strict_loads(text)  # epoch ms, as a JSON integer is read
        except ValueError:  # leading zeros: not a number's text
            pass
    try:
        return timestamp_from_json(value, True)
    except Reject as rej:
        raise Reject(rej.reason, f"header '{name}': {rej.detail}") from None


def _header_value(data: bytes | None) -> str:
    """One header value in ``raw``: its UTF-8 text, null, or ``{"base64": ...}``."""
    if data is None:
        return "null"
    try:
        return encode_basestring(data.decode())
    except UnicodeDecodeError:
        return '{"base64":"' + _b64encode(data).decode("ascii") + '"}'


def _canonical(data: bytes) -> Any:
    """orjson's parse of ``data`` when ``data`` is its own canonical compact text, else ``_SLOW``.

    orjson is a strict RFC 8259 parser (valid UTF-8, no NaN, nothing after the value) that keeps
    the last of duplicate members and reads numbers as int/float; bytes that re-serialise to
    themselves therefore have no duplicates, no whitespace, and every number's text is orjson's.
    orjson escapes every code point exactly as ``compact`` does (``json``'s encoder with
    ``ensure_ascii=False``; tests/ingest/test_kafka_rows.py checks all of them), so the
    ``dumps`` of any part of the parse is that part's ``compact`` text, escapes included."""
    try:
        obj = _loads(data)
        if _dumps(obj) == data:
            return obj
    except (_JSONDecodeError, TypeError):  # TypeError: orjson's dumps nests less deeply than loads
        pass
    return _SLOW


def _fast_timestamp(obj: Any, path: tuple[str, ...]) -> int | None:
    """The timestamp at ``path`` of an orjson parse when it is plainly valid, else None (the
    general path then decides and words the rejection)."""
    for name in path:
        if type(obj) is not dict:
            return None
        obj = obj.get(name)
    if type(obj) is int:
        return obj if 0 <= obj <= MAX_TIMESTAMP else None
    if type(obj) is str:
        try:
            return parse_timestamp(obj)
        except TimestampError:
            return None
    return None


def _unwrap(obj: Any) -> tuple[Any, bool]:
    """(the payload, whether it was in the JSON converter's schema envelope)."""
    if (type(obj) is dict and len(obj) == 2 and "payload" in obj and "schema" in obj
            and (obj["schema"] is None or type(obj["schema"]) is dict)):
        return obj["payload"], True
    return obj, False


def _timestamp_at(obj: Any, path: tuple[str, ...], where: str) -> int:
    """The timestamp at ``path`` of a strict parse, by the rules of a file's ``timestamp``."""
    for depth, name in enumerate(path):
        if not isinstance(obj, dict):
            parent = ".".join(path[:depth])
            raise Reject("missing_field", f"missing field '{'.'.join(path)}' in {where} ('{parent}' is "
                         f"{_kind(obj)}, not a JSON object)")
        if name not in obj:
            raise Reject("missing_field", f"missing field '{'.'.join(path)}' in {where}")
        obj = obj[name]
    return _timestamp_of(obj, ".".join(path), where)


def _timestamp_of(value: Any, name: str, where: str) -> int:
    if value is None:
        raise Reject("missing_field", f"field '{name}' in {where} is null")
    try:
        return timestamp_from_json(value, True)
    except Reject as rej:
        detail = (rej.detail.replace("'timestamp'", f"'{name}'") if "'timestamp'" in rej.detail
                  else f"'{name}': {rej.detail}")
        raise Reject(rej.reason, detail) from None


def _kind(value: Any) -> str:
    """What a strictly parsed JSON value is, for details (numbers are ``str`` subclasses)."""
    if value is None:
        return "JSON null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return "a boolean"
    return "a string" if type(value) is str else "a number"


def _kafka_timestamp(ts: int | None) -> int:
    if ts is None:
        raise Reject("bad_timestamp", "the record has no Kafka timestamp (null)")
    if ts < 0:
        raise Reject("bad_timestamp", f"the Kafka record timestamp is {ts}: the record has none (Kafka writes "
                     "-1 when the producer set no timestamp); set timestamp_field to read one from the value")
    return ts


def _utf8_error(data: bytes) -> str:
    """Why ``data`` (known not to decode) is not UTF-8, for a rejection's detail."""
    try:
        data.decode()
    except UnicodeDecodeError as exc:
        return str(exc)
    raise AssertionError("the bytes are valid UTF-8")


def canonical_key(parsed: Any) -> str:
    """The store key of a decoded registry key (``strict_loads`` parse): a string as it is, an
    integer its decimal text, anything else its compact JSON text with every object's members
    sorted by name (code points), so a record gives the same key whatever order its writer's
    schema declares the fields in. A null or empty key is ``bad_key``."""
    if parsed is None:
        raise Reject("bad_key", "the decoded key is null")
    if type(parsed) is str:
        if not parsed:
            raise Reject("bad_key", "the decoded key is the empty string")
        return parsed
    if isinstance(parsed, RawInt):
        return "0" if parsed == "-0" else str.__str__(parsed)
    return compact(_sorted_members(parsed))


def _sorted_members(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: _sorted_members(value[name]) for name in sorted(value)}
    if isinstance(value, list):
        return [_sorted_members(v) for v in value]
    return value


def _text_key(data: bytes | None, text: str | None) -> str:
    if data is None:
        raise Reject("bad_key", "the record has no key (null)")
    if text is None:
        raise Reject("bad_key", f"the key is not valid UTF-8: {_utf8_error(data)}")
    if not text:
        raise Reject("bad_key", "the key is empty")
    return text


class _Rules:
    """One format's key and value rules, with its settings bound once per batch."""

    def __init__(self, fmt: KafkaFormat, fast: bool) -> None:
        self.fast = fast
        self.path = tuple(fmt.timestamp_field.split(".")) if fmt.timestamp_field else None
        self.key_field = fmt.key_field
        self.source_ts = fmt.debezium_timestamp == "source.ts_ms"
        self.registry_url = fmt.schema_registry or ""
        self.key: Callable[[bytes | None, str | None], str] = (
            self.debezium_key if fmt.value_format == "debezium" else
            {"string": _text_key, "avro": self.registry_key, "json_sr": self.registry_key,
             "protobuf": self.registry_key}[fmt.key_format])
        self.key_decoder = {"avro": wire.avro_value, "json_sr": wire.json_sr_value,
                            "protobuf": wire.protobuf_value}.get(fmt.key_format)
        self.value: Callable[[bytes | None, str | None, int | None], tuple[str | None, int]] = {
            "json": self.json_value, "string": self.string_value, "debezium": self.debezium_value,
            "avro": self.avro_value, "json_sr": self.json_sr_value, "protobuf": self.protobuf_value,
        }[fmt.value_format]

    # ------------------------------------------------------------------ json and string values
    def json_value(self, data: bytes | None, text: str | None, kts: int | None) -> tuple[str | None, int]:
        if data is None:
            return None, _kafka_timestamp(kts)
        path = self.path
        if self.fast and text is not None:
            obj = _canonical(data)
            if obj is not _SLOW:
                if obj is None or path is None:
                    return (None if obj is None else text), _kafka_timestamp(kts)
                ts = _fast_timestamp(obj, path)
                if ts is not None:
                    return text, ts
        if text is None:
            raise Reject("bad_value", f"the value is not valid UTF-8: {_utf8_error(data)}")
        if not text:
            raise Reject("bad_value", "the value is empty (0 bytes), which is not JSON text (a tombstone has a "
                         "null value)")
        try:
            parsed = strict_loads(text)
        except (ValueError, RecursionError) as exc:
            raise Reject("bad_value", f"the value is not JSON text: {exc}") from None
        if parsed is None:
            return None, _kafka_timestamp(kts)
        value = compact(parsed)
        return value, (_kafka_timestamp(kts) if path is None else _timestamp_at(parsed, path, "the value"))

    def string_value(self, data: bytes | None, text: str | None, kts: int | None) -> tuple[str | None, int]:
        if data is None:
            return None, _kafka_timestamp(kts)
        if text is None:
            raise Reject("bad_value", f"the value is not valid UTF-8: {_utf8_error(data)}")
        return encode_basestring(text), _kafka_timestamp(kts)

    # ------------------------------------------------------------------ schema registry values
    def avro_value(self, data: bytes | None, text: str | None, kts: int | None) -> tuple[str | None, int]:
        """The JSON of the Avro datum (``registry.avro_json``), then the ``json`` rules."""
        if data is None:
            return None, _kafka_timestamp(kts)
        schema_id, decoded = wire.avro_value(data, self.registry_url)
        try:
            return self.json_value(decoded, decoded.decode(), kts)
        except Reject as rej:  # a timestamp_field that is not there: say which schema the datum had
            raise Reject(rej.reason, f"schema id {schema_id}: {rej.detail}") from None

    def protobuf_value(self, data: bytes | None, text: str | None, kts: int | None) -> tuple[str | None, int]:
        """The JSON of the Protobuf message (``protobuf.ProtoSchema.to_json``), then the ``json`` rules."""
        if data is None:
            return None, _kafka_timestamp(kts)
        schema_id, decoded = wire.protobuf_value(data, self.registry_url)
        try:
            return self.json_value(decoded, decoded.decode(), kts)
        except Reject as rej:
            raise Reject(rej.reason, f"schema id {schema_id}: {rej.detail}") from None

    def registry_key(self, data: bytes | None, text: str | None) -> str:
        """A key in the registry's wire format (``key_format``), decoded: a JSON string is the key
        as it is, an integer its decimal text, anything else (a record, a message, an array) the
        compact JSON text with the members of every object sorted by name (``canonical_key``)."""
        if data is None:
            raise Reject("bad_key", "the record has no key (null)")
        assert self.key_decoder is not None
        schema_id, decoded = self.key_decoder(data, self.registry_url, "key")
        try:
            parsed = strict_loads(decoded.decode())
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise Reject("bad_key", f"schema id {schema_id}: the key is not JSON text: {exc}") from None
        try:
            return canonical_key(parsed)
        except Reject as rej:
            raise Reject(rej.reason, f"schema id {schema_id}: {rej.detail}") from None
        except RecursionError:
            raise Reject("bad_key", f"schema id {schema_id}: the decoded key is nested too deeply") from None

    def json_sr_value(self, data: bytes | None, text: str | None, kts: int | None) -> tuple[str | None, int]:
        """The JSON payload after the header, by the ``json`` rules."""
        if data is None:
            return None, _kafka_timestamp(kts)
        schema_id, payload = wire.json_sr_value(data, self.registry_url)
        try:
            payload_text: str | None = payload.decode()
        except UnicodeDecodeError:
            payload_text = None
        try:
            return self.json_value(payload, payload_text, kts)
        except Reject as rej:
            raise Reject(rej.reason, f"schema id {schema_id}: {rej.detail}") from None

    # ------------------------------------------------------------------ Debezium
    def debezium_key(self, data: bytes | None, text: str | None) -> str:
        text = _text_key(data, text)
        assert data is not None
        field = self.key_field
        if self.fast:
            obj = _canonical(data)
            if obj is not _SLOW:
                payload, wrapped = _unwrap(obj)
                if type(payload) is dict:
                    if field is None:
                        return _dumps(payload).decode() if wrapped else text
                    member = payload.get(field)
                    if type(member) is str and member:
                        return member
                    if type(member) is int:
                        return str(member)
        try:
            parsed = strict_loads(text)
        except (ValueError, RecursionError) as exc:
            raise Reject("bad_key", f"the key is not JSON text: {exc}") from None
        payload, wrapped = _unwrap(parsed)
        where = "the Debezium key's payload" if wrapped else "the Debezium key"
        if not isinstance(payload, dict):
            raise Reject("bad_key", f"{where} is {_kind(payload)}, not a JSON object")
        if field is None:
            return compact(payload)
        if field not in payload:
            raise Reject("bad_key", f"{where} has no field {field!r} (key_field)")
        member = payload[field]
        if isinstance(member, RawInt):
            return "0" if member == "-0" else str.__str__(member)
        if type(member) is str:
            if not member:
                raise Reject("bad_key", f"field {field!r} of {where} is empty")
            return member
        raise Reject("bad_key", f"field {field!r} of {where} must be a string or an integer, got "
                     f"{compact(member)}")

    def debezium_value(self, data: bytes | None, text: str | None, kts: int | None) -> tuple[str | None, int]:
        assert data is not None  # parse_kafka emits null values as SKIPPED rows
        if self.fast and text is not None:
            done = self._fast_debezium(data)
            if done is not None:
                return done
        if text is None:
            raise Reject("bad_value", f"the value is not valid UTF-8: {_utf8_error(data)}")
        try:
            parsed = strict_loads(text)
        except (ValueError, RecursionError) as exc:
            raise Reject("bad_value", f"the value is not JSON text: {exc}") from None
        envelope, wrapped = _unwrap(parsed)
        if not isinstance(envelope, dict):
            where = "the payload of the value" if wrapped else "the value"
            raise Reject("bad_value", f"{where} is {_kind(envelope)}, not a Debezium change event (a JSON object)")
        op = envelope.get("op")
        if op is None:
            raise Reject("missing_field", "missing field 'op' in the Debezium change event")
        if op == "d":
            return None, self._envelope_timestamp(envelope)
        if op not in _ROW_OPS:
            name = f" ({_OTHER_OPS[op]})" if type(op) is str and op in _OTHER_OPS else ""
            raise Reject("bad_value", f"Debezium op {compact(op)}{name} is not the change of one row: only "
                         "'c', 'r', 'u' and 'd' are")
        after = envelope.get("after")
        if after is None:
            raise Reject("bad_value", f"Debezium op '{op}' has no 'after' row (missing or null)")
        if not isinstance(after, dict):
            raise Reject("bad_value", f"the 'after' row of Debezium op '{op}' is {_kind(after)}, not a JSON object")
        value = compact(after)
        path = self.path
        return value, (self._envelope_timestamp(envelope) if path is None
                       else _timestamp_at(after, path, "the Debezium 'after' row"))

    def _fast_debezium(self, data: bytes) -> tuple[str | None, int] | None:
        """The canonical, plainly valid change event's (value, timestamp); None: general path."""
        obj = _canonical(data)
        if obj is _SLOW:
            return None
        envelope, _wrapped = _unwrap(obj)
        if type(envelope) is not dict:
            return None
        op = envelope.get("op")
        if op == "d":
            value = None
        elif op in _ROW_OPS:
            after = envelope.get("after")
            if type(after) is not dict:
                return None
            value = _dumps(after).decode()
            if self.path is not None:
                ts = _fast_timestamp(after, self.path)
                return None if ts is None else (value, ts)
        else:
            return None
        ts = _fast_timestamp(envelope, ("source", "ts_ms") if self.source_ts else ("ts_ms",))
        return None if ts is None else (value, ts)

    def _envelope_timestamp(self, envelope: dict[str, Any]) -> int:
        if self.source_ts:
            block = envelope.get("source")
            if not isinstance(block, dict) or "ts_ms" not in block:
                raise Reject("missing_field", "missing field 'source.ts_ms' in the Debezium change event")
            return _timestamp_of(block["ts_ms"], "source.ts_ms", "the Debezium change event")
        if "ts_ms" not in envelope:
            raise Reject("missing_field", "missing field 'ts_ms' in the Debezium change event")
        return _timestamp_of(envelope["ts_ms"], "ts_ms", "the Debezium change event")
