"""Kafka values and keys in the Confluent schema-registry wire format (``value_format`` and
``key_format`` ``avro``, ``json_sr``, ``protobuf``): the value is a magic byte ``0``, the writer
schema's id as a 4-byte big-endian integer, then the payload, the Avro binary encoding of one
datum of that schema (``avro``), JSON text (``json_sr``, the Confluent JSON Schema serializer's
format), or the message indexes and the bytes of one message (``protobuf``: ``records.protobuf``
builds the classes from the schema, ``.proto`` text or a base64 ``FileDescriptorProto``, picks
the message and renders its JSON). Each function takes ``what``, ``value`` or ``key``: a key
that cannot be decoded is ``bad_key``.

**The registry.** Each writer schema is fetched by its id from ``GET {url}/schemas/ids/{id}``
under the registry's Confluent-compatible base URL (Confluent Schema Registry's root; Apicurio
Registry's ``/apis/ccompat/v7``; Karapace, Redpanda), with the schemas it references
(``GET {url}/subjects/{subject}/versions/{version}``), and kept for the life of the process (a
Spark Python worker reads many batches): a schema id names one schema forever. An id the registry
does not know is remembered for ``MISSING_TTL_S`` only.

**What a record is.** A value that is not in the wire format (shorter than the 5-byte header,
no magic byte 0), whose schema id the registry answers 404 for, whose schema is of another type
(a JSON schema's id under ``avro``), whose schema does not compile (Protobuf) or whose payload is
not one datum of its schema (truncated, corrupt, bytes left over; Protobuf message indexes that
name no message) is ``bad_value``, and the detail names the schema id. A null value is a
tombstone, as for every format.

**What the environment is.** A registry that cannot be reached (connection refused, a timeout),
answers 5xx, refuses the credentials (401, 403) or answers anything else unexpected (a 404
without Confluent's error code 40403: the URL is not a Confluent-compatible base URL) is not a
property of the record: ``SchemaRegistryError`` is raised after a few tries, the run fails and
commits nothing, and a rerun reads the same records again (``ingest.kafka.reading_failed``). So
is a protoc that cannot be run at all (``protobuf.ProtocFailed``).

**Avro to JSON** (``avro_json``; docs/contract.md, Kafka sources): a record is an
object of its fields in the schema's order; a map an object; an array an array; an enum its
symbol; a union the value of its branch, unwrapped (``["null", "string"]`` gives null or the
string); ``string`` a string; ``bytes`` and ``fixed`` standard base64 text; ``int``/``long``
numbers; ``float``/``double`` numbers (``records.floats``: a 32-bit ``float`` is the shortest
decimal that reads back as the same float, ``0.1f`` is ``0.1`` as Java's ``Float.toString``
writes it; a ``double`` is its own shortest text), NaN and the infinities the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"`` (JSON has no such numbers). Logical types: ``decimal`` a string
of its exact digits with the schema's scale (``"12.30"``), ``big-decimal`` (on ``bytes``: the
Avro ``bytes`` of the unscaled two's-complement big-endian integer, then the scale as an Avro
``int``, both in the value) a string of its exact digits with the value's own scale (``"12.30"``,
``"12000"`` for a negative scale; never an exponent), ``uuid`` (on ``string``, or on a
``fixed`` of 16 bytes, big-endian as RFC 4122 lays them out) its canonical lowercase text,
``duration`` (a ``fixed`` of 12 bytes: three little-endian unsigned 32-bit integers) the object
``{"months": 1, "days": 2, "milliseconds": 3}`` (the three are independent, as a month is no
fixed number of days: an ISO-8601 text would merge them into one string to parse again),
``date`` ``"2024-01-31"``, ``time-millis``/``time-micros`` ``"12:00:00.123"``,
``timestamp-millis``/``-micros``/``-nanos`` an RFC 3339 UTC instant
(``"2024-01-31T12:00:00.123Z"``: 3 fraction digits, 6 when there are microseconds, 9 when there
are nanoseconds), ``local-timestamp-millis``/``-micros``/``-nanos`` the same without ``Z``; a
logical type on a type it does not annotate (``uuid`` on a ``fixed`` of another size,
``duration`` on one not of 12 bytes, ``big-decimal`` on anything but ``bytes``) and unknown ones
are their underlying type, as the specification says readers treat them. A ``big-decimal`` whose
bytes are not those two values (truncated, an empty integer, bytes after the scale, a scale
beyond an ``int``) or whose text would exceed ``MAX_BIG_DECIMAL_DIGITS`` digits is ``bad_value``.
A datum that is null (the ``null`` branch of a union at the top) is a tombstone,
like a JSON null value.

fastavro reads a ``float`` as the double of its value and knows no nanosecond timestamps (a
Python ``datetime`` holds microseconds), no ``big-decimal``, and neither ``duration`` nor ``uuid``
on a ``fixed``, so the writer schema (and each schema it references) is parsed with those types
marked by logical types of versiq's own (``_readable``), whose readers (registered in fastavro's
``LOGICAL_READERS`` under those names only) return the shortest float, the instant's text, the
``Decimal``, the UUID's text and the duration's object.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from versiq.ingest.records.fields import Reject
from versiq.ingest.records.floats import json_float, shortest_float32

MAGIC = 0
HEADER_BYTES = 5
#: How long a schema id the registry answered 404 for is remembered (the producer may register
#: schemas in a registry that was restored meanwhile; a run reads on after this).
MISSING_TTL_S = 60.0
#: One request's timeouts, and the tries of a request that failed for the environment (with
#: these pauses between them) before the run fails.
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 10.0
RETRY_PAUSES_S = (0.5, 1.5)
#: How deep schema references may nest (a cycle of references stops here).
MAX_REFERENCE_DEPTH = 16
#: The most digits a ``big-decimal``'s text may have (its scale is in the value, so a few bytes
#: could otherwise ask for a text of billions of zeros): as many as Python writes an int with.
MAX_BIG_DECIMAL_DIGITS = 4300
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_USERINFO = re.compile(r"//[^/@]*@")


class SchemaRegistryError(Exception):
    """The schema registry could not be asked (unreachable, 5xx, refused credentials, not a
    Confluent-compatible API), or protoc could not be run to compile a Protobuf schema: the run
    fails and commits nothing; a rerun reads again. The message is one line and carries no
    credentials."""


def public_url(url: str) -> str:
    """``url`` without the credentials of its userinfo (``https://***@host/``): for messages."""
    return _USERINFO.sub("//***@", url)


def check_url(url: str) -> str | None:
    """Why ``url`` cannot be a schema registry's base URL, or None."""
    if not re.match(r"https?://[^/]", url):
        return f"schema registry URL {public_url(url)!r} is not an http:// or https:// URL"
    return None


@dataclass(frozen=True)
class Schema:
    """A writer schema: its type (``AVRO``, ``JSON``, ``PROTOBUF``) and, for Avro, fastavro's
    parse, for Protobuf the compiled ``protobuf.ProtoSchema``; ``error`` when the registry's text
    cannot be used (every record of it is ``bad_value``)."""

    schema_type: str
    parsed: Any = None
    error: str | None = None


# ---------------------------------------------------------------- the registry client
class _Client:
    """One registry's Confluent-compatible API, with the process's cache of its schemas."""

    def __init__(self, url: str) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.public = public_url(self.url)
        # httpx reads basic-auth credentials from the URL's userinfo
        self.http = httpx.Client(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                                 headers={"Accept": _CONTENT_TYPE}, follow_redirects=True)
        self.schemas: dict[int, Schema] = {}
        self.missing: dict[int, float] = {}  # schema id -> when the 404 was seen
        self.subject_versions: dict[tuple[str, int], dict[str, Any]] = {}
        self.lock = threading.Lock()

    def _get(self, path: str) -> dict[str, Any] | None:
        """The JSON object at ``path``; None for Confluent's "not found" (a 404 with an
        ``error_code`` of 404xx); ``SchemaRegistryError`` for anything the environment is to blame
        for, after ``RETRY_PAUSES_S``."""
        import httpx

        last = ""
        for attempt in range(len(RETRY_PAUSES_S) + 1):
            if attempt:
                time.sleep(RETRY_PAUSES_S[attempt - 1])
            try:
                response = self.http.get(self.url + path)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if response.status_code >= 500 or response.status_code == 429:
                last = f"HTTP {response.status_code}: {_body(response)}"
                continue
            if response.status_code == 404 and _confluent_not_found(response):
                return None
            if response.status_code != 200:
                raise SchemaRegistryError(
                    f"the schema registry at {self.public} answered GET {path} with HTTP {response.status_code}: "
                    f"{_body(response)}" + (" (is the URL its Confluent-compatible base URL?)"
                                            if response.status_code == 404 else ""))
            try:
                found = response.json()
            except ValueError:
                found = None
            if not isinstance(found, dict):
                raise SchemaRegistryError(f"the schema registry at {self.public} answered GET {path} with "
                                          f"something other than a JSON object: {_body(response)}")
            return found
        raise SchemaRegistryError(f"the schema registry at {self.public} cannot be reached (GET {path}, "
                                  f"{len(RETRY_PAUSES_S) + 1} tries): {last}")

    def check(self) -> None:
        """One request that any Confluent-compatible registry answers (``GET /config``, the
        global compatibility level): ``SchemaRegistryError`` when it cannot be asked."""
        if self._get("/config") is None:
            raise SchemaRegistryError(f"the schema registry at {self.public} answered GET /config with 404: is the "
                                      "URL its Confluent-compatible base URL?")

    def schema(self, schema_id: int) -> Schema | None:
        """The writer schema of ``schema_id``, None when the registry does not know it."""
        with self.lock:
            found = self.schemas.get(schema_id)
            if found is not None:
                return found
            seen = self.missing.get(schema_id)
            if seen is not None and time.monotonic() - seen < MISSING_TTL_S:
                return None
            answer = self._get(f"/schemas/ids/{schema_id}")
            if answer is None:
                self.missing[schema_id] = time.monotonic()
                return None
            self.missing.pop(schema_id, None)
            found = self._schema(answer, f"schema id {schema_id}", 0)
            self.schemas[schema_id] = found
            return found

    def _schema(self, answer: dict[str, Any], what: str, depth: int) -> Schema:
        schema_type = str(answer.get("schemaType") or "AVRO").upper()
        text = answer.get("schema")
        if not isinstance(text, str):
            return Schema(schema_type, error=f"the registry's answer for {what} has no schema text")
        if schema_type == "AVRO":
            return self._avro(answer, text, what, depth)
        if schema_type == "PROTOBUF":
            return self._protobuf(answer, text, what, depth)
        return Schema(schema_type)

    def _avro(self, answer: dict[str, Any], text: str, what: str, depth: int) -> Schema:
        from fastavro import parse_schema

        _install_readers()
        named: dict[str, Any] = {}
        try:
            for reference in answer.get("references") or []:
                self._avro_reference(reference, what, depth + 1, named)
            definition = _readable(json.loads(text))
            return Schema("AVRO", parse_schema(definition, named_schemas=named))
        except SchemaRegistryError:
            raise
        except _Unusable as exc:
            return Schema("AVRO", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - the schema text is not Avro: every record of it is bad
            return Schema("AVRO", error=f"{what} is not a valid Avro schema: {type(exc).__name__}: {exc}")

    def _avro_reference(self, reference: Any, what: str, depth: int, named: dict[str, Any]) -> None:
        """Parse a referenced schema into ``named`` (fastavro's named types)."""
        from fastavro import parse_schema

        answer = self._referenced(reference, what, depth)
        for nested in answer.get("references") or []:
            self._avro_reference(nested, what, depth + 1, named)
        parse_schema(_readable(json.loads(answer["schema"])), named_schemas=named)

    def _protobuf(self, answer: dict[str, Any], text: str, what: str, depth: int) -> Schema:
        """Compile the schema with the schemas of its references (``records.protobuf.build``:
        each ``.proto`` text or a base64 ``FileDescriptorProto``)."""
        from versiq.ingest.records import protobuf

        imports: dict[str, str] = {}
        try:
            self._proto_imports(answer, what, depth + 1, imports)
            return Schema("PROTOBUF", protobuf.build(text, imports))
        except _Unusable as exc:
            return Schema("PROTOBUF", error=str(exc))
        except protobuf.ProtoUnusable as exc:
            return Schema("PROTOBUF", error=str(exc))
        except protobuf.ProtocFailed as exc:
            raise SchemaRegistryError(f"{what}: {exc}") from None

    def _proto_imports(self, answer: dict[str, Any], what: str, depth: int, imports: dict[str, str]) -> None:
        """The texts of ``answer``'s references (and theirs) into ``imports``, by import path."""
        for reference in answer.get("references") or []:
            if not isinstance(reference, dict) or not isinstance(reference.get("name"), str):
                raise _Unusable(f"{what}: a schema reference is not {{name, subject, version}}: {reference!r}")
            if reference["name"] in imports:
                continue
            found = self._referenced(reference, what, depth)
            if not isinstance(found.get("schema"), str):
                raise _Unusable(f"{what}: the registry's answer for reference {reference['name']!r} has no schema "
                                "text")
            imports[reference["name"]] = found["schema"]
            self._proto_imports(found, what, depth + 1, imports)

    def _referenced(self, reference: Any, what: str, depth: int) -> dict[str, Any]:
        """The registry's answer for a schema reference {name, subject, version} (cached)."""
        if depth > MAX_REFERENCE_DEPTH:
            raise _Unusable(f"{what}: schema references nest deeper than {MAX_REFERENCE_DEPTH}")
        if not isinstance(reference, dict) or "subject" not in reference or "version" not in reference:
            raise _Unusable(f"{what}: a schema reference is not {{name, subject, version}}: {reference!r}")
        subject, version = str(reference["subject"]), reference["version"]
        try:
            key = (subject, int(version))
        except (TypeError, ValueError):
            raise _Unusable(f"{what}: schema reference {reference!r} has no version number") from None
        answer = self.subject_versions.get(key)
        if answer is None:
            answer = self._get(f"/subjects/{quote(subject, safe='')}/versions/{key[1]}")
            if answer is None:
                raise _Unusable(f"{what} references subject {subject!r} version {version}, which the registry "
                                "does not have (404)")
            self.subject_versions[key] = answer
        return answer


class _Unusable(Exception):
    """A schema whose references cannot be resolved: its records are ``bad_value``."""


def _confluent_not_found(response: Any) -> bool:
    try:
        code = response.json().get("error_code")
    except (ValueError, AttributeError):
        return False
    return isinstance(code, int) and 40400 <= code <= 40499


def _body(response: Any) -> str:
    text = " ".join(response.text.split())
    return text[:200] + ("..." if len(text) > 200 else "")


_CLIENTS: dict[tuple[int, str], _Client] = {}
_CLIENTS_LOCK = threading.Lock()


def client(url: str) -> _Client:
    """The process's client of the registry at ``url`` (one per process: a forked Python worker
    makes its own)."""
    key = (os.getpid(), url)
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None:
            found = _CLIENTS[key] = _Client(url)
        return found


def check_registry(url: str) -> None:
    """``SchemaRegistryError`` unless the registry at ``url`` answers (before a run reads)."""
    client(url).check()


# ---------------------------------------------------------------- the wire format
#: The ``value_format``/``key_format`` of each schema type, for details.
_FORMAT_OF = {"AVRO": "avro", "JSON": "json_sr", "PROTOBUF": "protobuf"}


def _header(data: bytes, what: str = "value") -> int:
    """The schema id of a ``what`` (``value`` or ``key``) in the wire format; ``bad_value`` (or
    ``bad_key``) when it is not in it."""
    if len(data) < HEADER_BYTES:
        raise Reject(f"bad_{what}", f"the {what} is {len(data)} byte(s), shorter than the schema registry's 5-byte "
                     "header (magic byte 0 and a 4-byte schema id)")
    if data[0] != MAGIC:
        raise Reject(f"bad_{what}", f"the {what} does not start with the schema registry's magic byte 0 (first "
                     f"byte 0x{data[0]:02x}): it was not written with a schema registry serializer")
    return int.from_bytes(data[1:HEADER_BYTES], "big")


def _writer_schema(url: str, schema_id: int, expected: str, what: str = "value") -> Schema:
    found = client(url).schema(schema_id)
    if found is None:
        raise Reject(f"bad_{what}", f"schema id {schema_id} is not in the schema registry (404)")
    if found.schema_type != expected:
        raise Reject(f"bad_{what}", f"schema id {schema_id} is a {found.schema_type} schema, not {expected} "
                     f"({what}_format {_FORMAT_OF[expected]})")
    if found.error is not None:
        raise Reject(f"bad_{what}", f"schema id {schema_id}: {found.error}")
    return found


def avro_value(data: bytes, url: str, what: str = "value") -> tuple[int, bytes]:
    """(schema id, the compact JSON text of the decoded datum) of an Avro value (or key: ``what``)
    in the wire format; ``bad_value`` (``bad_key``) when it is not one; ``SchemaRegistryError``
    when the registry cannot be asked."""
    from fastavro import schemaless_reader

    reason = f"bad_{what}"
    schema_id = _header(data, what)
    schema = _writer_schema(url, schema_id, "AVRO", what)
    stream = io.BytesIO(data)
    stream.seek(HEADER_BYTES)
    try:
        datum = schemaless_reader(stream, schema.parsed, None)
    except Exception as exc:  # noqa: BLE001 - fastavro's errors on corrupt data are of many kinds
        raise Reject(reason, f"schema id {schema_id}: the payload is not Avro data of its schema "
                     f"({type(exc).__name__}: {exc})") from None
    left = len(data) - stream.tell()
    if left:
        raise Reject(reason, f"schema id {schema_id}: {left} byte(s) after the Avro datum of its schema")
    try:
        return schema_id, _dumps(avro_json(datum))
    except (RecursionError, TypeError, ValueError) as exc:
        raise Reject(reason, f"schema id {schema_id}: the decoded datum cannot be rendered as JSON "
                     f"({type(exc).__name__}: {exc})") from None


def json_sr_value(data: bytes, url: str, what: str = "value") -> tuple[int, bytes]:
    """(schema id, the JSON payload's bytes) of a JSON Schema value (or key) in the wire format,
    its id checked with the registry (the payload is not validated against the schema)."""
    schema_id = _header(data, what)
    _writer_schema(url, schema_id, "JSON", what)
    return schema_id, data[HEADER_BYTES:]


def protobuf_value(data: bytes, url: str, what: str = "value") -> tuple[int, bytes]:
    """(schema id, the compact JSON text of the message) of a Protobuf value (or key) in
    Confluent's wire format: the 5-byte header, the message indexes (``protobuf.read_indexes``),
    the message's bytes, decoded with the class built from the writer schema
    (``protobuf.ProtoSchema``). ``bad_value`` (``bad_key``) when it cannot be decoded;
    ``SchemaRegistryError`` when the registry cannot be asked."""
    from google.protobuf.message import DecodeError

    from versiq.ingest.records import protobuf

    reason = f"bad_{what}"
    schema_id = _header(data, what)
    schema: protobuf.ProtoSchema = _writer_schema(url, schema_id, "PROTOBUF", what).parsed
    try:
        indexes, start = protobuf.read_indexes(data, HEADER_BYTES)
        name, cls = schema.message_class(indexes)
    except (ValueError, LookupError) as exc:
        raise Reject(reason, f"schema id {schema_id}: {exc}") from None
    try:
        message = cls.FromString(data[start:])
    except (DecodeError, RecursionError, ValueError) as exc:
        raise Reject(reason, f"schema id {schema_id}: the payload is not a {name} message ({exc})") from None
    try:
        return schema_id, _dumps(schema.to_json(message))
    except Exception as exc:  # noqa: BLE001 - json_format's errors (a Timestamp out of range, an Any of an unknown type)
        raise Reject(reason, f"schema id {schema_id}: the {name} message cannot be rendered as JSON "
                     f"({type(exc).__name__}: {exc})") from None


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # nested deeper than orjson renders
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


# ---------------------------------------------------------------- Avro to JSON
#: versiq's own logical types (``_readable``): a 32-bit ``float``; the nanosecond timestamps; the
#: logical types on a ``fixed`` of the size each needs; ``big-decimal`` on ``bytes``.
_FLOAT32 = "versiq-float32"
_NANOS = {"timestamp-nanos": "versiq-timestamp-nanos", "local-timestamp-nanos": "versiq-local-timestamp-nanos"}
_FIXED = {("uuid", 16): "versiq-uuid", ("duration", 12): "versiq-duration"}
_BIG_DECIMAL = "versiq-big-decimal"
_EPOCH = datetime.datetime(1970, 1, 1)


def _readable(schema: Any) -> Any:
    """The Avro schema (its JSON) with every ``float``, every ``long`` of logical type
    ``timestamp-nanos`` or ``local-timestamp-nanos``, every ``fixed`` of logical type ``uuid`` of 16
    bytes or ``duration`` of 12, and every ``bytes`` of logical type ``big-decimal`` given versiq's
    logical type for it (a ``float``'s own logical type, which Avro's specification ignores, is
    replaced). The binary encoding is the underlying type's: the schema still reads the same
    bytes."""
    if isinstance(schema, str):
        return {"type": "float", "logicalType": _FLOAT32} if schema == "float" else schema
    if isinstance(schema, list):
        return [_readable(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    kind, out = schema.get("type"), dict(schema)
    if kind == "float":
        out["logicalType"] = _FLOAT32
    elif kind == "long" and schema.get("logicalType") in _NANOS:
        out["logicalType"] = _NANOS[schema["logicalType"]]
    elif kind == "fixed" and (schema.get("logicalType"), schema.get("size")) in _FIXED:
        out["logicalType"] = _FIXED[schema["logicalType"], schema["size"]]
    elif kind == "bytes" and schema.get("logicalType") == "big-decimal":
        out["logicalType"] = _BIG_DECIMAL
    elif kind in ("record", "error") and isinstance(schema.get("fields"), list):
        out["fields"] = [dict(f, type=_readable(f["type"])) if isinstance(f, dict) and "type" in f else f
                         for f in schema["fields"]]
    elif kind == "array" and "items" in schema:
        out["items"] = _readable(schema["items"])
    elif kind == "map" and "values" in schema:
        out["values"] = _readable(schema["values"])
    elif isinstance(kind, (dict, list)):
        out["type"] = _readable(kind)
    return out


def _read_float32(data: float, writer_schema: Any = None, reader_schema: Any = None) -> float:
    return shortest_float32(data)


def _read_timestamp_nanos(data: int, writer_schema: Any = None, reader_schema: Any = None) -> str:
    return _nanos_instant(data) + "Z"


def _read_local_timestamp_nanos(data: int, writer_schema: Any = None, reader_schema: Any = None) -> str:
    return _nanos_instant(data)


def _read_fixed_uuid(data: bytes, writer_schema: Any = None, reader_schema: Any = None) -> str:
    return str(uuid.UUID(bytes=bytes(data)))


def _read_duration(data: bytes, writer_schema: Any = None, reader_schema: Any = None) -> dict[str, int]:
    months, days, milliseconds = (int.from_bytes(data[i:i + 4], "little") for i in (0, 4, 8))
    return {"months": months, "days": days, "milliseconds": milliseconds}


def _read_big_decimal(data: bytes, writer_schema: Any = None, reader_schema: Any = None) -> decimal.Decimal:
    """The exact ``Decimal`` of a ``big-decimal``'s bytes: the unscaled integer as Avro ``bytes``
    (a zigzag varint length, then that many bytes of a two's-complement big-endian integer), then
    the scale as an Avro ``int``, and nothing after it (the value is ``unscaled * 10**-scale``).
    ``ValueError`` when the bytes are not that, or its text would exceed
    ``MAX_BIG_DECIMAL_DIGITS`` digits."""
    data = bytes(data)
    length, start = _zigzag(data, 0, 64)
    if length <= 0 or start + length > len(data):
        raise ValueError(f"a big-decimal's unscaled integer of {length} byte(s) in {len(data)} byte(s)")
    if length > MAX_BIG_DECIMAL_DIGITS:
        raise ValueError(f"a big-decimal of more than {MAX_BIG_DECIMAL_DIGITS} digits")
    unscaled = int.from_bytes(data[start:start + length], "big", signed=True)
    scale, end = _zigzag(data, start + length, 32)
    if end != len(data):
        raise ValueError(f"{len(data) - end} byte(s) after a big-decimal's scale")
    sign, digits, _ = decimal.Decimal(unscaled).as_tuple()
    shown = len(digits) - scale if scale < 0 else max(len(digits), scale + 1)
    if shown > MAX_BIG_DECIMAL_DIGITS:
        raise ValueError(f"a big-decimal of {len(digits)} digit(s) with scale {scale} would be {shown} digits, "
                         f"more than {MAX_BIG_DECIMAL_DIGITS}")
    return decimal.Decimal((sign, digits, -scale))


def _zigzag(data: bytes, pos: int, bits: int) -> tuple[int, int]:
    """The Avro ``int`` (``bits`` 32) or ``long`` (64) at ``pos`` of ``data``, a zigzag varint,
    and the position after it; ``ValueError`` when it is cut off or longer than such a number."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("a big-decimal's bytes end inside a varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
        if shift >= -(-bits // 7) * 7:
            raise ValueError(f"a varint longer than a {bits}-bit integer in a big-decimal")
    value = (result >> 1) ^ -(result & 1)
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ValueError(f"a big-decimal's varint {value} does not fit a {bits}-bit integer")
    return value, pos


def _install_readers() -> None:
    """Register the readers of versiq's logical types with fastavro (idempotent; only these
    names, so fastavro reads every other schema as before)."""
    from fastavro.read import LOGICAL_READERS

    LOGICAL_READERS["float-" + _FLOAT32] = _read_float32
    LOGICAL_READERS["long-" + _NANOS["timestamp-nanos"]] = _read_timestamp_nanos
    LOGICAL_READERS["long-" + _NANOS["local-timestamp-nanos"]] = _read_local_timestamp_nanos
    LOGICAL_READERS["fixed-" + _FIXED["uuid", 16]] = _read_fixed_uuid
    LOGICAL_READERS["fixed-" + _FIXED["duration", 12]] = _read_duration
    LOGICAL_READERS["bytes-" + _BIG_DECIMAL] = _read_big_decimal


def _nanos_instant(nanos: int) -> str:
    """The instant ``nanos`` after the epoch as RFC 3339 text without an offset, with 3 fraction
    digits, 6 when there are microseconds, 9 when there are nanoseconds (a ``long`` of
    nanoseconds spans the years 1677 to 2262, all of which ``datetime`` holds)."""
    seconds, fraction = divmod(nanos, 1_000_000_000)
    text = (_EPOCH + datetime.timedelta(seconds=seconds)).isoformat(timespec="seconds")
    digits = 3 if fraction % 1_000_000 == 0 else 6 if fraction % 1000 == 0 else 9
    return f"{text}.{fraction:09d}"[:len(text) + 1 + digits]


def _instant(value: datetime.datetime) -> str:
    spec = "milliseconds" if value.microsecond % 1000 == 0 else "microseconds"
    if value.tzinfo is None:
        return value.isoformat(timespec=spec)
    return value.astimezone(datetime.UTC).replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def avro_json(value: Any) -> Any:
    """A datum fastavro decoded, as the JSON value versiq stores (module docstring)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):  # a 32-bit float's reader made it its shortest double
        return json_float(value)
    if isinstance(value, dict):
        return {str(k): avro_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [avro_json(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, datetime.datetime):
        return _instant(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, datetime.time):
        return value.isoformat(timespec="milliseconds" if value.microsecond % 1000 == 0 else "microseconds")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, tuple):  # (name, value) of fastavro's named unions, if asked for
        return [avro_json(v) for v in value]
    raise TypeError(f"no JSON form for a decoded {type(value).__name__}")
