"""Kafka values in the Confluent schema-registry wire format (``value_format`` ``avro`` and
``json_sr``, ingest/records/registry.py), parsed by ``parse_kafka`` with writer schemas from a
real registry (the ``schema_registry`` fixture, Apicurio Registry's Confluent-compatible API):
every Avro type and logical type maps to the JSON documented in docs/contract.md; values that
cannot be decoded are ``bad_value`` naming the schema id; a registry that cannot be asked raises
``SchemaRegistryError`` (the run fails), and Spark's driver-side error becomes one line."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import struct
import uuid
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from tests.support.kafka_rows import parse
from versiq.ingest.kafka import KafkaSource, KafkaSourceError, reading_failed
from versiq.ingest.records import registry as wire
from versiq.ingest.records.kafka_rows import KAFKA_INPUT_SCHEMA, KafkaFormat, parse_kafka
from versiq.ingest.records.registry import SchemaRegistryError
from versiq.ingest.records.schema import PARSED_SCHEMA

EVERYTHING = {
    "type": "record", "name": "Everything", "namespace": "versiq.test",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "nan", "type": "double"},
        {"name": "inf", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "by", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "e", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}},
        {"name": "a", "type": {"type": "array", "items": "int"}},
        {"name": "m", "type": {"type": "map", "values": "string"}},
        {"name": "u_null", "type": ["null", "string"], "default": None},
        {"name": "u_str", "type": ["null", "string"], "default": None},
        {"name": "u_rec", "type": ["null", {"type": "record", "name": "Inner",
                                            "fields": [{"name": "x", "type": "int"}]}]},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "dec_small", "type": {"type": "fixed", "name": "Dec8", "size": 8, "logicalType": "decimal",
                                       "precision": 18, "scale": 9}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "tn", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
        {"name": "ltn", "type": {"type": "long", "logicalType": "local-timestamp-nanos"}},
        {"name": "dur", "type": {"type": "fixed", "name": "Twelve", "size": 12, "logicalType": "duration"}},
        {"name": "uid_fixed", "type": {"type": "fixed", "name": "Uuid16", "size": 16, "logicalType": "uuid"}},
        {"name": "uid_named", "type": ["null", "Uuid16"]},  # the named fixed again, in a union
        {"name": "big", "type": {"type": "bytes", "logicalType": "big-decimal"}},
        {"name": "bigs", "type": {"type": "array", "items": ["null", {"type": "bytes", "logicalType": "big-decimal"}]}},
        # logical types on a type they do not annotate: their underlying type
        {"name": "uid_short", "type": {"type": "fixed", "name": "Eight", "size": 8, "logicalType": "uuid"}},
        {"name": "dur_long", "type": {"type": "fixed", "name": "Sixteen", "size": 16, "logicalType": "duration"}},
        {"name": "big_fixed", "type": {"type": "fixed", "name": "Three", "size": 3, "logicalType": "big-decimal"}},
        {"name": "f_third", "type": "float"},
        {"name": "f_nan", "type": "float"},
        {"name": "f_inf", "type": {"type": "float"}},
        {"name": "fs", "type": {"type": "array", "items": "float"}},
        {"name": "u_float", "type": ["null", "float", "double"]},
        {"name": "fm", "type": {"type": "map", "values": ["null", "float"]}},
    ],
}
# months, days, milliseconds: each unsigned (4e9 is beyond a signed 32-bit int), little-endian
DURATION = struct.pack("<3I", 14, 40, 4_000_000_001)
UID = uuid.UUID("6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab")


def zigzag(n: int) -> bytes:
    """An Avro ``int``/``long``: a zigzag varint."""
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z > 0x7F:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    return bytes([*out, z])


def big_decimal(text: str) -> bytes:
    """A ``big-decimal``'s bytes as Avro's Java ``BigDecimalConversion`` writes them: the unscaled
    two's-complement integer as Avro ``bytes``, then the scale as an Avro ``int``."""
    sign, digits, exponent = decimal.Decimal(text).as_tuple()
    assert isinstance(exponent, int)
    unscaled = int("".join(map(str, digits))) * (-1 if sign else 1)
    raw = unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)
    return zigzag(len(raw)) + raw + zigzag(-exponent)


DATUM = {
    "b": True, "i": -7, "l": 2**62, "f": 0.1, "d": 0.1, "nan": float("nan"), "inf": float("-inf"), "s": "é\"\n",
    "by": b"\x00\xff", "fx": b"abcd", "e": "GREEN", "a": [1, 2], "m": {"k": "v"}, "u_null": None, "u_str": "x",
    "u_rec": {"x": 3}, "dec": decimal.Decimal("12.30"), "dec_small": decimal.Decimal("0.000000123"), "uid": UID,
    "day": datetime.date(2024, 1, 31), "tm": datetime.time(12, 0, 0, 123000), "tu": datetime.time(0, 0, 0, 5),
    "ts": datetime.datetime(2024, 1, 31, 12, 0, 0, 123000, tzinfo=datetime.UTC),
    "tsu": datetime.datetime(2024, 1, 31, 12, 0, 0, 123456, tzinfo=datetime.UTC),
    "lts": datetime.datetime(2024, 1, 31, 12, 0, 0), "tn": 1_706_702_400_123_456_789,
    "ltn": 1_706_702_400_000_000_000, "dur": DURATION, "uid_fixed": UID.bytes, "uid_named": UID.bytes,
    "big": big_decimal("-12345678901234567890.1234567890123456789000"),
    "bigs": [big_decimal("12.30"), None, big_decimal("1.2E+4"), big_decimal("0.00"), big_decimal("-0.005")],
    "uid_short": b"12345678", "dur_long": DURATION + b"\0" * 4, "big_fixed": b"\x02\x01\x04",
    "f_third": 1 / 3, "f_nan": float("nan"), "f_inf": float("inf"),
    "fs": [0.1, 1e-45, 3.4028234663852886e38, -0.0, 16777217.0], "u_float": 0.2, "fm": {"a": 0.7, "n": None},
}
EXPECTED = {
    "b": True, "i": -7, "l": 2**62, "f": 0.1, "d": 0.1, "nan": "NaN", "inf": "-Infinity", "s": "é\"\n",
    "by": base64.b64encode(b"\x00\xff").decode(), "fx": base64.b64encode(b"abcd").decode(), "e": "GREEN",
    "a": [1, 2], "m": {"k": "v"}, "u_null": None, "u_str": "x", "u_rec": {"x": 3}, "dec": "12.30",
    "dec_small": "0.000000123", "uid": str(UID), "day": "2024-01-31", "tm": "12:00:00.123", "tu": "00:00:00.000005",
    "ts": "2024-01-31T12:00:00.123Z", "tsu": "2024-01-31T12:00:00.123456Z", "lts": "2024-01-31T12:00:00.000",
    "tn": "2024-01-31T12:00:00.123456789Z", "ltn": "2024-01-31T12:00:00.000",
    "dur": {"months": 14, "days": 40, "milliseconds": 4_000_000_001},
    "uid_fixed": str(UID), "uid_named": str(UID),  # RFC 4122's big-endian bytes, not base64 or bytes_le
    # exact digits and the value's own scale, never an exponent (1.2E+4: unscaled 12, scale -3)
    "big": "-12345678901234567890.1234567890123456789000", "bigs": ["12.30", None, "12000", "0.00", "-0.005"],
    "uid_short": base64.b64encode(b"12345678").decode(), "dur_long": base64.b64encode(DURATION + b"\0" * 4).decode(),
    "big_fixed": base64.b64encode(b"\x02\x01\x04").decode(),
    # 32-bit floats: the shortest text that reads back as each (1/3 is 0.3333333432674408 as a double)
    "f_third": 0.33333334, "f_nan": "NaN", "f_inf": "Infinity", "fs": [0.1, 1e-45, 3.4028235e38, -0.0, 16777216.0],
    "u_float": 0.2, "fm": {"a": 0.7, "n": None},
}
PRICE = {"type": "record", "name": "Price", "fields": [
    {"name": "sku", "type": "string"}, {"name": "cents", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}


def wire_value(schema_id: int, payload: bytes) -> bytes:
    """A value in the Confluent wire format: magic byte 0, the schema id (4 bytes, big-endian)."""
    return b"\x00" + struct.pack(">I", schema_id) + payload


def avro_bytes(schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def test_every_avro_type_and_logical_type_becomes_the_documented_json(schema_registry):
    schema_id = schema_registry.register("everything-value", EVERYTHING)
    fmt = KafkaFormat(value_format="avro", schema_registry=schema_registry.url)
    [row] = parse([wire_value(schema_id, avro_bytes(EVERYTHING, DATUM))], fmt)
    assert row["reason"] is None, row["detail"]
    assert json.loads(row["value"]) == EXPECTED
    assert list(json.loads(row["value"])) == [f["name"] for f in EVERYTHING["fields"]]  # schema order
    assert row["value"] == json.dumps(EXPECTED, separators=(",", ":"), ensure_ascii=False)  # compact
    assert row["ts"] == 1_000 and row["key"] == "k0"


def test_tombstones_timestamp_field_and_top_level_types(schema_registry):
    price_id = schema_registry.register("price-value", PRICE)
    nullable_id = schema_registry.register("nullable-value", ["null", "string"])
    fmt = KafkaFormat(value_format="avro", schema_registry=schema_registry.url, timestamp_field="at")
    at = datetime.datetime(2024, 1, 31, 12, 0, 0, 5000, tzinfo=datetime.UTC)
    rows = parse([wire_value(price_id, avro_bytes(PRICE, {"sku": "a", "cents": 5, "at": at})), None], fmt)
    assert rows[0]["reason"] is None and rows[0]["ts"] == 1_706_702_400_005, rows[0]
    assert json.loads(rows[0]["value"]) == {"sku": "a", "cents": 5, "at": "2024-01-31T12:00:00.005Z"}
    assert rows[1]["reason"] is None and rows[1]["value"] is None and rows[1]["ts"] == 1_001  # a tombstone
    plain = KafkaFormat(value_format="avro", schema_registry=schema_registry.url)
    rows = parse([wire_value(nullable_id, avro_bytes(["null", "string"], None)),
                  wire_value(nullable_id, avro_bytes(["null", "string"], "hi"))], plain)
    assert [(r["reason"], r["value"]) for r in rows] == [(None, None), (None, '"hi"')]  # null datum: a tombstone
    # a timestamp_field the datum lacks: missing_field, naming the schema id
    [row] = parse([wire_value(nullable_id, avro_bytes(["null", "string"], "hi"))],
                  KafkaFormat(value_format="avro", schema_registry=schema_registry.url, timestamp_field="at"))
    assert row["reason"] == "missing_field" and f"schema id {nullable_id}" in row["detail"], row


def test_nanosecond_timestamps_and_timestamp_field(schema_registry):
    tick = {"type": "record", "name": "Tick", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-nanos"}}]}
    tick_id = schema_registry.register("tick-value", tick)
    fmt = KafkaFormat(value_format="avro", schema_registry=schema_registry.url, timestamp_field="at")
    cases = [  # nanoseconds since the epoch, the text, the record's timestamp (sub-millisecond digits truncated)
        (1_706_702_400_005_999_999, "2024-01-31T12:00:00.005999999", 1_706_702_400_005),
        (1_706_702_400_005_001_000, "2024-01-31T12:00:00.005001", 1_706_702_400_005),
        (1_706_702_400_000_000_000, "2024-01-31T12:00:00.000", 1_706_702_400_000),
        (0, "1970-01-01T00:00:00.000", 0),
        (2**63 - 1, "2262-04-11T23:47:16.854775807", 9_223_372_036_854),
    ]
    rows = parse([wire_value(tick_id, avro_bytes(tick, {"at": nanos, "local": nanos})) for nanos, _, _ in cases], fmt)
    for row, (_, text, ts) in zip(rows, cases, strict=True):
        assert row["reason"] is None and row["ts"] == ts, row
        assert json.loads(row["value"]) == {"at": text + "Z", "local": text}
    # before the epoch: the instant is stored as text, and as a record timestamp it is out of range
    [row] = parse([wire_value(tick_id, avro_bytes(tick, {"at": -1, "local": -(2**63)}))],
                  KafkaFormat(value_format="avro", schema_registry=schema_registry.url))
    assert json.loads(row["value"]) == {"at": "1969-12-31T23:59:59.999999999Z",
                                        "local": "1677-09-21T00:12:43.145224192"}
    [row] = parse([wire_value(tick_id, avro_bytes(tick, {"at": -1, "local": 0}))], fmt)
    assert row["reason"] == "bad_timestamp", row
    # a local timestamp has no offset: it is no instant, and timestamp_field does not read it
    [row] = parse([wire_value(tick_id, avro_bytes(tick, {"at": 0, "local": 0}))],
                  KafkaFormat(value_format="avro", schema_registry=schema_registry.url, timestamp_field="local"))
    assert row["reason"] == "bad_timestamp", row


def test_shortest_float32_is_the_shortest_text_that_reads_back():
    import random

    from versiq.ingest.records.floats import json_float, shortest_float32

    def single(x: float) -> float:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])

    generator = random.Random(7)
    for _ in range(20_000):
        value = struct.unpack("<f", struct.pack("<I", generator.getrandbits(32)))[0]
        if value != value or value in (float("inf"), float("-inf")):
            continue
        found = shortest_float32(value)
        assert single(found) == value, value
        digits = len(f"{found:.9e}".split("e")[0].replace("-", "").replace(".", "").rstrip("0"))
        assert digits == 1 or single(float(f"{value:.{digits - 1}g}")) != value, (value, found)
    assert [shortest_float32(single(x)) for x in (0.1, 0.9, 1 / 3, 123456.789, 1e-45)] == [
        0.1, 0.9, 0.33333334, 123456.79, 1e-45]
    assert shortest_float32(0.1) == 0.1 and shortest_float32(1e300) == 1e300  # a double: rounded to 32 bits first
    assert [json_float(x, float32=True) for x in (float("nan"), float("inf"), float("-inf"))] == [
        "NaN", "Infinity", "-Infinity"]
    assert json_float(0.1 + 0.2) == 0.30000000000000004  # a double is itself


def test_values_that_cannot_be_decoded_are_bad_value_naming_the_schema_id(schema_registry):
    price_id = schema_registry.register("price-value", PRICE)
    json_id = schema_registry.register("price-json-value", {"$schema": "http://json-schema.org/draft-07/schema#",
                                                            "type": "object"}, schema_type="JSON")
    good = avro_bytes(PRICE, {"sku": "abc", "cents": 5, "at": 1})
    fmt = KafkaFormat(value_format="avro", schema_registry=schema_registry.url)
    cases = {
        b'{"sku":"abc"}': "magic byte 0 (first byte 0x7b)",
        b"\x00\x00\x01": "3 byte(s), shorter than",
        wire_value(987_654, good): "schema id 987654 is not in the schema registry (404)",
        wire_value(price_id, good[:-3]): f"schema id {price_id}: the payload is not Avro data",
        wire_value(price_id, good + b"\x00\x01"): f"schema id {price_id}: 2 byte(s) after the Avro datum",
        wire_value(price_id, b"\x06\xff\xfe\xfd\x0a\x02"): f"schema id {price_id}: the payload is not Avro data",
        wire_value(json_id, b"{}"): f"schema id {json_id} is a JSON schema, not AVRO",
    }
    # a big-decimal's bytes are checked as the datum's are: its scale is in the value
    amount = {"type": "record", "name": "Amount", "fields": [{"name": "v", "type": {"type": "bytes",
                                                                                  "logicalType": "big-decimal"}}]}
    amount_id = schema_registry.register("amount-value", amount)

    def amount_value(inner: bytes) -> bytes:
        return wire_value(amount_id, zigzag(len(inner)) + inner)

    not_avro = f"schema id {amount_id}: the payload is not Avro data of its schema (ValueError: a big-decimal"
    most = wire.MAX_BIG_DECIMAL_DIGITS
    cases.update({
        amount_value(big_decimal("1.5")[:-1]): not_avro + "'s bytes end inside a varint",
        amount_value(b"\x00" + zigzag(2)): not_avro + "'s unscaled integer of 0 byte(s)",
        amount_value(big_decimal("1.5") + b"\x00"): f"schema id {amount_id}: the payload is not Avro data of its "
                                                    "schema (ValueError: 1 byte(s) after a big-decimal's scale",
        amount_value(b"\x02\x01" + zigzag(2**31)): not_avro + "'s varint 2147483648 does not fit a 32-bit integer",
        # scales that ask for billions of digits
        amount_value(b"\x02\x01" + zigzag(2**31 - 1)):
            not_avro + f" of 1 digit(s) with scale 2147483647 would be 2147483648 digits, more than {most}",
        amount_value(b"\x02\x01" + zigzag(-2**31)):
            not_avro + f" of 1 digit(s) with scale -2147483648 would be 2147483649 digits, more than {most}",
        amount_value(b"\x02\x01" + zigzag(most)): not_avro + f" of 1 digit(s) with scale {most} would be",
    })
    rows = parse(list(cases), fmt)
    for row, (value, expected) in zip(rows, cases.items(), strict=True):
        assert row["reason"] == "bad_value" and expected in row["detail"], (value, row["detail"])
        assert row["value"] is None
        raw = json.loads(row["raw"])  # the exact bytes, as text or base64
        assert raw.get("valueBase64") == base64.b64encode(value).decode() or raw.get("value") == value.decode()
    # the longest text a big-decimal may have: 0.000...1 of exactly that many digits
    [row] = parse([amount_value(b"\x02\x01" + zigzag(most - 1))], fmt)
    assert row["reason"] is None and json.loads(row["value"]) == {"v": "0." + "0" * (most - 2) + "1"}, row["detail"]


def test_json_schema_values(schema_registry):
    json_id = schema_registry.register("orders-json-value", {"$schema": "http://json-schema.org/draft-07/schema#",
                                                             "type": "object"}, schema_type="JSON")
    avro_id = schema_registry.register("price-value", PRICE)
    fmt = KafkaFormat(value_format="json_sr", schema_registry=schema_registry.url, timestamp_field="at")
    rows = parse([wire_value(json_id, b'{"a": 1, "at": 5000}'), wire_value(json_id, b"null"),
                  wire_value(json_id, b"{bad"), wire_value(avro_id, b"{}"), b'{"a":1}',
                  wire_value(json_id, b'{"a": 1}')], fmt)
    assert (rows[0]["reason"], rows[0]["value"], rows[0]["ts"]) == (None, '{"a":1,"at":5000}', 5000)
    assert (rows[1]["reason"], rows[1]["value"]) == (None, None)
    assert rows[2]["reason"] == "bad_value" and f"schema id {json_id}: the value is not JSON" in rows[2]["detail"]
    assert rows[3]["reason"] == "bad_value" and f"schema id {avro_id} is a AVRO schema, not JSON" in rows[3]["detail"]
    assert rows[4]["reason"] == "bad_value" and "magic byte" in rows[4]["detail"]
    assert rows[5]["reason"] == "missing_field" and f"schema id {json_id}" in rows[5]["detail"]


def test_schema_references_are_resolved(schema_registry):
    inner = {"type": "record", "name": "Money", "namespace": "versiq.ref",
             "fields": [{"name": "cents", "type": "long"}, {"name": "currency", "type": "string"},
                        {"name": "rate", "type": "float"}]}
    schema_registry.register("money-value", inner)
    outer = {"type": "record", "name": "Order", "namespace": "versiq.ref",
             "fields": [{"name": "id", "type": "string"}, {"name": "total", "type": "versiq.ref.Money"}]}
    import httpx

    response = httpx.post(f"{schema_registry.url}/subjects/order-value/versions", timeout=30,
                          headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
                          json={"schema": json.dumps(outer),
                                "references": [{"name": "versiq.ref.Money", "subject": "money-value", "version": 1}]})
    assert response.status_code == 200, response.text
    order_id = response.json()["id"]
    named: dict[str, Any] = {}
    fastavro.parse_schema(inner, named_schemas=named)
    payload = io.BytesIO()
    fastavro.schemaless_writer(payload, fastavro.parse_schema(outer, named_schemas=named),
                               {"id": "o1", "total": {"cents": 250, "currency": "EUR", "rate": 1.1}})
    [row] = parse([wire_value(order_id, payload.getvalue())],
                  KafkaFormat(value_format="avro", schema_registry=schema_registry.url))
    assert row["reason"] is None, row["detail"]
    # a float of the referenced schema is read as one too
    assert json.loads(row["value"]) == {"id": "o1", "total": {"cents": 250, "currency": "EUR", "rate": 1.1}}


def recorded_pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses the registry client makes between a request's tries (``RETRY_PAUSES_S``),
    recorded instead of slept: a test sees the retries without waiting for them."""
    import time
    import types

    pauses: list[float] = []
    monkeypatch.setattr(wire, "time", types.SimpleNamespace(sleep=pauses.append, monotonic=time.monotonic))
    return pauses


def test_a_registry_that_cannot_be_asked_raises_and_is_not_a_rejection(schema_registry, monkeypatch):
    from tests.support.server_process import free_ports

    pauses = recorded_pauses(monkeypatch)
    (closed,) = free_ports(1)
    value = wire_value(1, avro_bytes(PRICE, {"sku": "a", "cents": 1, "at": 1}))
    down = KafkaFormat(value_format="avro", schema_registry=f"http://user:pw-secret@127.0.0.1:{closed}")
    with pytest.raises(SchemaRegistryError, match="cannot be reached") as raised:
        parse([value], down)
    assert "pw-secret" not in str(raised.value) and "***@127.0.0.1" in str(raised.value)
    # tried 3 times, after each pause of the schedule
    assert f"{len(wire.RETRY_PAUSES_S) + 1} tries" in str(raised.value) and len(wire.RETRY_PAUSES_S) == 2
    assert pauses == list(wire.RETRY_PAUSES_S)
    pauses.clear()
    # the registry's root, not its Confluent-compatible base URL: a 404 without Confluent's error code
    wrong = KafkaFormat(value_format="avro", schema_registry=schema_registry.root)
    with pytest.raises(SchemaRegistryError, match="Confluent-compatible base URL"):
        parse([value], wrong)
    assert pauses == []  # a 404 is an answer: no retry
    with pytest.raises(SchemaRegistryError):
        wire.check_registry(f"http://127.0.0.1:{closed}")
    assert pauses == list(wire.RETRY_PAUSES_S)
    wire.check_registry(schema_registry.url)


def test_format_settings_are_checked():
    with pytest.raises(ValueError, match="needs a schema registry"):
        KafkaFormat(value_format="avro").validate()
    with pytest.raises(ValueError, match="not an http"):
        KafkaFormat(value_format="json_sr", schema_registry="registry:8081").validate()
    with pytest.raises(ValueError, match="applies to value_format or key_format 'avro', 'json_sr' and 'protobuf' only"):
        KafkaFormat(value_format="json", schema_registry="http://r:8081").validate()
    assert "secret" not in repr(KafkaFormat(value_format="avro", schema_registry="http://u:secret@r:8081"))


def test_a_registry_failure_in_a_spark_task_fails_the_read_with_one_line(spark):
    """What the driver sees when a Python worker's parse raised SchemaRegistryError: one line."""
    from tests.support.server_process import free_ports

    (closed,) = free_ports(1)
    fmt = KafkaFormat(value_format="avro", schema_registry=f"http://127.0.0.1:{closed}")
    value = wire_value(1, avro_bytes(PRICE, {"sku": "a", "cents": 1, "at": 1}))
    frame = spark.createDataFrame(pa.table({"key": [b"k"], "value": [value], "partition": pa.array([0], pa.int32()),
                                            "offset": [0], "timestamp": [1_000],
                                            "headers": pa.nulls(1, KAFKA_INPUT_SCHEMA.field("headers").type)}))

    def run(batches: Any) -> Any:
        for batch in batches:
            yield parse_kafka(batch, fmt, "kafka:t")

    from pyspark.sql.pandas.types import from_arrow_schema

    with pytest.raises(Exception) as raised:
        frame.mapInArrow(run, from_arrow_schema(PARSED_SCHEMA)).collect()
    source = KafkaSource(bootstrap="127.0.0.1:9", topic="t", format=fmt)
    failure = reading_failed(source, raised.value)
    assert isinstance(failure, KafkaSourceError)
    assert str(failure).startswith(f"reading kafka:t: the schema registry at http://127.0.0.1:{closed} cannot be "
                                   "reached"), str(failure)
    assert "\n" not in str(failure)
