"""Kafka records as parsed rows (``ingest.records.kafka_rows``, no Spark, no broker): the key, value
and timestamp rules of the json, string and Debezium formats, the ``raw`` text of every row, the
``max_future`` guard, and the fast path agreeing with the general one everywhere."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from versiq.ingest.records import PARSED_SCHEMA, compact
from versiq.ingest.records.kafka_rows import (
    KAFKA_INPUT_SCHEMA,
    SKIPPED,
    SKIPPED_DETAIL,
    KafkaFormat,
    parse_kafka,
)
from versiq.layout import MAX_KEY_BYTES, REJECT_REASONS

TS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
JSON_FORMAT = KafkaFormat()
DEBEZIUM = KafkaFormat(value_format="debezium")


def batch(records: list[tuple[Any, ...]]) -> pa.RecordBatch:
    """``records``: (key, value[, timestamp[, partition[, headers]]]), headers a list of (name,
    value) pairs (absent: null, as Spark gives a record without headers); offsets are 100, 101, ..."""
    columns = [[r[0] for r in records], [r[1] for r in records], [r[3] if len(r) > 3 else 0 for r in records],
               [100 + i for i in range(len(records))], [r[2] if len(r) > 2 else TS for r in records],
               [None if len(r) < 5 or r[4] is None else [{"key": n, "value": v} for n, v in r[4]] for r in records]]
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, KAFKA_INPUT_SCHEMA, strict=True)],
                                      schema=KAFKA_INPUT_SCHEMA)


def parse(records: list[tuple[Any, ...]], fmt: KafkaFormat = JSON_FORMAT, **kw: Any) -> list[dict[str, Any]]:
    """The rows, checked to be the same with and without the fast path."""
    fast = parse_kafka(batch(records), fmt, "kafka:t", **kw)
    general = parse_kafka(batch(records), fmt, "kafka:t", fast=False, **kw)
    assert fast.schema == PARSED_SCHEMA
    assert fast.to_pylist() == general.to_pylist()
    return fast.to_pylist()


def one(key: Any, value: Any, fmt: KafkaFormat = JSON_FORMAT, ts: Any = TS, **kw: Any) -> dict[str, Any]:
    return parse([(key, value, ts)], fmt, **kw)[0]


def outcome(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["reason"], row["detail"]) if row["reason"] else (row["key"], row["value"], row["ts"])


# ---------------------------------------------------------------------------------------- json and string
def test_a_record_maps_position_key_value_timestamp_and_raw():
    rows = parse([(b"k1", b'{"price": 1.50, "tags":["a"]}', TS, 3), (b"k2", b'{"n":1}', TS + 1, 3)])
    assert rows[0] == {
        "source": "kafka:t", "pos": 100, "key": "k1", "value": '{"price":1.50,"tags":["a"]}', "ts": TS,
        "part": 3, "offset": 100, "reason": None, "detail": None,
        "raw": '{"key":"k1","value":"{\\"price\\": 1.50, \\"tags\\":[\\"a\\"]}"}',
    }
    assert (rows[1]["pos"], rows[1]["offset"], rows[1]["value"]) == (101, 101, '{"n":1}')
    assert json.loads(rows[1]["raw"]) == {"key": "k2", "value": '{"n":1}'}


def test_headers_are_in_raw_by_name_and_change_nothing_else():
    headers = [("trace", "é-1".encode()), ("bin", b"\xff\x00"), ("none", None), ("rep", b"a"), ("empty", b""),
               ("rep", b"\xfe"), ("rep", None)]
    rows = parse([(b"k", b"{bad", TS, 0, headers), (b"k", b'{"n":1}', TS, 0, headers), (b"k", b'{"n":1}', TS, 0, [])])
    assert rows[0]["reason"] == "bad_value"
    assert rows[0]["raw"] == ('{"key":"k","value":"{bad","headers":{"trace":"é-1","bin":{"base64":"/wA="},'
                              '"none":null,"rep":["a",{"base64":"/g=="},null],"empty":""}}')
    assert (rows[1]["key"], rows[1]["value"], rows[1]["ts"]) == ("k", '{"n":1}', TS)
    assert json.loads(rows[1]["raw"])["headers"] == json.loads(rows[0]["raw"])["headers"]
    assert rows[2]["raw"] == '{"key":"k","value":"{\\"n\\":1}"}'  # no headers: no member


@pytest.mark.parametrize("value", [None, b"null", b" null\n"])
def test_a_null_value_and_json_null_are_tombstones(value):
    row = one(b"k", value)
    assert outcome(row) == ("k", None, TS)
    assert json.loads(row["raw"]) == {"key": "k", "value": None if value is None else value.decode()}


@pytest.mark.parametrize("value, detail", [
    (b'{"a":1', "the value is not JSON text: Expecting ',' delimiter: line 1 column 7 (char 6)"),
    (b'{"a":1}x', "the value is not JSON text: Extra data: line 1 column 8 (char 7)"),
    (b'{"a":1,"a":2}', "the value is not JSON text: duplicate member name 'a'"),
    (b'{"a":NaN}', "the value is not JSON text: NaN is not valid JSON"),
    (b"", "the value is empty (0 bytes), which is not JSON text (a tombstone has a null value)"),
    (b"\xff{}", "the value is not valid UTF-8: 'utf-8' codec can't decode byte 0xff in position 0: "
                "invalid start byte"),
])
def test_invalid_json_values_are_bad_value_with_the_parser_message(value, detail):
    row = one(b"k", value)
    assert outcome(row) == ("bad_value", detail)
    assert (row["key"], row["value"], row["ts"], row["pos"], row["part"]) == (None, None, None, 100, 0)


def test_a_value_that_is_not_utf8_is_given_as_base64_in_raw():
    row = one(b"k", b"\x80abc")
    assert row["reason"] == "bad_value"
    assert json.loads(row["raw"]) == {"key": "k", "valueBase64": base64.b64encode(b"\x80abc").decode()}


def test_a_lone_surrogate_escape_in_a_value_is_bad_value():
    assert outcome(one(b"k", b'{"a":"\\ud800"}')) == ("bad_value", "'value' is not valid Unicode (lone surrogate)")


def test_json_keeps_canonical_text_and_compacts_the_rest():
    canonical = '{"name":"Zoë \\"Z\\"","n":-0,"x":1E5}'
    assert one(b"k", canonical.encode())["value"] == canonical
    assert one(b"k", b'{"a" : "\\u00e9\\n"}')["value"] == '{"a":"\u00e9\\n"}'
    assert one(b"k", b"[1, 2.50]")["value"] == "[1,2.50]"


def test_string_values_are_stored_as_json_strings():
    fmt = KafkaFormat(value_format="string")
    rows = parse([(b"k", 'héllo "x"\n'.encode()), (b"k", b""), (b"k", None), (b"k", b"\xc3")], fmt)
    assert [r["value"] for r in rows] == ['"héllo \\"x\\"\\n"', '""', None, None]
    assert [r["reason"] for r in rows] == [None, None, None, "bad_value"]
    assert rows[3]["detail"].startswith("the value is not valid UTF-8: 'utf-8' codec can't decode byte 0xc3")
    assert json.loads(rows[0]["raw"]) == {"key": "k", "value": 'héllo "x"\n'}


def test_json_and_string_formats_differ_on_the_same_bytes():
    value = b'{"a": 1}'
    assert one(b"k", value)["value"] == '{"a":1}'
    assert one(b"k", value, KafkaFormat(value_format="string"))["value"] == '"{\\"a\\": 1}"'
    assert one(b"k", b"not json", KafkaFormat(value_format="string"))["value"] == '"not json"'
    assert one(b"k", b"not json")["reason"] == "bad_value"


# ---------------------------------------------------------------------------------------- keys
def test_key_rules():
    rows = parse([(None, b"1"), (b"\xfe\xff", b"1"), (b"", b"1"), (b"x" * (MAX_KEY_BYTES + 1), b"1"),
                  (b"x" * MAX_KEY_BYTES, b"1"), ("ключ".encode(), b"1")])
    assert [outcome(r)[:2] for r in rows[:4]] == [
        ("bad_key", "the record has no key (null)"),
        ("bad_key", "the key is not valid UTF-8: 'utf-8' codec can't decode byte 0xfe in position 0: "
                    "invalid start byte"),
        ("bad_key", "the key is empty"),
        ("bad_key", f"'key' is {MAX_KEY_BYTES + 1} bytes of UTF-8; the limit is {MAX_KEY_BYTES} bytes (4 KiB)"),
    ]
    assert [r["key"] for r in rows[4:]] == ["x" * MAX_KEY_BYTES, "ключ"]
    assert json.loads(rows[0]["raw"]) == {"key": None, "value": "1"}
    assert json.loads(rows[1]["raw"]) == {"keyBase64": "/v8=", "value": "1"}
    assert rows[1]["raw"] == '{"keyBase64":"/v8=","value":"1"}'


def test_a_key_and_value_not_utf8_are_both_base64():
    row = one(b"\xff", b"\xfe", KafkaFormat(value_format="string"))
    assert json.loads(row["raw"]) == {"keyBase64": "/w==", "valueBase64": "/g=="}


def test_key_and_value_over_1_mib_together_are_too_large():
    value = b'"' + b"x" * (1024 * 1024 - 3) + b'"'
    assert one(b"k", value)["reason"] is None  # 1 + 1,048,575 bytes
    row = one(b"kk", value)
    assert outcome(row) == ("too_large", "key and value are 1048577 bytes together (limit 1 MiB)")
    assert json.loads(row["raw"])["value"] == value.decode()


# ---------------------------------------------------------------------------------------- timestamps
@pytest.mark.parametrize("ts, detail", [
    (-1, "the Kafka record timestamp is -1: the record has none (Kafka writes -1 when the producer set no "
         "timestamp); set timestamp_field to read one from the value"),
    (None, "the record has no Kafka timestamp (null)"),
])
def test_a_record_without_kafka_timestamp_is_bad_timestamp(ts, detail):
    assert outcome(one(b"k", b"1", ts=ts)) == ("bad_timestamp", detail)
    assert outcome(one(b"k", None, ts=ts)) == ("bad_timestamp", detail)
    assert one(b"k", b"1", ts=0)["ts"] == 0


@pytest.mark.parametrize("field, value, expected", [
    ("updated_at", b'{"updated_at":"2024-01-01T01:00:00+01:00"}', TS),
    ("updated_at", b'{"updated_at": "2024-01-01T00:00:00.1239Z"}', TS + 123),
    ("meta.ts", b'{"meta":{"ts":1704067200000},"v":1}', TS),
    ("meta.ts", b'{"meta":{"ts":"1704067200000"}}', TS),
    ("updated_at", b'{"updated_at":"2024-01-01T00:00:00"}',
     ("bad_timestamp", "'updated_at': '2024-01-01T00:00:00' is not a timestamp: expected epoch milliseconds "
                       "(a non-negative integer) or an RFC 3339 instant with offset such as 2024-01-31T12:00:00Z")),
    ("updated_at", b'{"updated_at":1.5}',
     ("bad_timestamp", "'updated_at' must be epoch ms or an RFC 3339 instant, got 1.5")),
    ("updated_at", b'{"updated_at":-5}', ("bad_timestamp", "'updated_at': timestamp -5 is outside [0, 2^63-1]")),
    ("updated_at", b'{"updated_at":true}',
     ("bad_timestamp", "'updated_at' must be epoch ms or an RFC 3339 instant, got true")),
    ("meta.ts", b'{"meta":{"at":1}}', ("missing_field", "missing field 'meta.ts' in the value")),
    ("meta.ts", b'{"v":1}', ("missing_field", "missing field 'meta.ts' in the value")),
    ("meta.ts", b'{"meta":7}',
     ("missing_field", "missing field 'meta.ts' in the value ('meta' is a number, not a JSON object)")),
    ("meta.ts", b'[1]', ("missing_field", "missing field 'meta.ts' in the value ('' is an array, not a JSON object)")),
    ("meta.ts", b'{"meta":{"ts":null}}', ("missing_field", "field 'meta.ts' in the value is null")),
])
def test_timestamp_field_reads_the_value_like_a_files_timestamp(field, value, expected):
    row = one(b"k", value, KafkaFormat(timestamp_field=field), ts=-1)  # the Kafka timestamp is not used
    assert (row["ts"] if row["reason"] is None else outcome(row)) == expected


@pytest.mark.parametrize(("headers", "expected"), [
    ([("at", b"1704067200123")], TS + 123),
    ([("at", b"2024-01-01T00:00:00.5Z")], TS + 500),
    ([("at", b"1"), ("other", b"x"), ("at", b"2")], 2),  # the last header of the name, as Kafka's lastHeader
    ([], ("missing_field", "the record has no header 'at' (timestamp_header)")),
    ([("At", b"1")], ("missing_field", "the record has no header 'at' (timestamp_header)")),  # names are exact
    ([("at", None)], ("missing_field", "header 'at' is null (timestamp_header)")),
    ([("at", b"\xff")], ("bad_timestamp", "header 'at' is not valid UTF-8: 'utf-8' codec can't decode byte 0xff "
                                          "in position 0: invalid start byte")),
    ([("at", b"-5")], ("bad_timestamp", "header 'at': timestamp -5 is outside [0, 2^63-1]")),
    ([("at", b"0012")], 12),  # digits are epoch ms
    ([("at", b"yesterday")], ("bad_timestamp", "header 'at': 'yesterday' is not a timestamp: expected epoch "
                                               "milliseconds (a non-negative integer) or an RFC 3339 instant with "
                                               "offset such as 2024-01-31T12:00:00Z")),
])
def test_timestamp_header_takes_the_timestamp_from_a_header(headers, expected):
    """``timestamp_header``: the record's timestamp is the header's text (epoch ms or RFC 3339),
    whatever the Kafka timestamp (-1 here); the value is read by its own rules."""
    fmt = KafkaFormat(timestamp_header="at")
    row = parse([(b"k", b'{"n":1}', -1, 0, headers)], fmt)[0]
    assert (row["ts"] if row["reason"] is None else outcome(row)) == expected
    if row["reason"] is None:
        assert (row["key"], row["value"]) == ("k", '{"n":1}')
        tombstone = parse([(b"k", None, -1, 0, headers)], fmt)[0]  # a tombstone's timestamp too
        assert (tombstone["value"], tombstone["ts"]) == (None, expected)


def test_timestamp_header_settings_that_cannot_mean_anything_are_refused():
    for fmt, message in [(KafkaFormat(timestamp_header=""), "timestamp_header is empty"),
                         (KafkaFormat(timestamp_header="at", timestamp_field="a"), "not both"),
                         (KafkaFormat(value_format="debezium", timestamp_header="at"), "does not apply")]:
        with pytest.raises(ValueError, match=message):
            fmt.validate()
    KafkaFormat(value_format="string", timestamp_header="at").validate()  # a string value has no fields: fine


def test_a_tombstone_with_timestamp_field_takes_the_kafka_timestamp():
    fmt = KafkaFormat(timestamp_field="updated_at")
    assert outcome(one(b"k", None, fmt, ts=TS + 5)) == ("k", None, TS + 5)
    assert outcome(one(b"k", b"null", fmt, ts=TS + 5)) == ("k", None, TS + 5)
    assert one(b"k", None, fmt, ts=-1)["reason"] == "bad_timestamp"


def test_max_timestamp_refuses_records_from_the_future_like_files():
    rows = parse([(b"a", b"1", TS), (b"b", b"2", TS + 1), (None, b"3", TS + 1)], max_timestamp=TS)
    assert outcome(rows[0]) == ("a", "1", TS)
    assert rows[1]["reason"] == "bad_timestamp"
    assert rows[1]["detail"].startswith(f"timestamp {TS + 1} (2024-01-01T00:00:00.001Z) is later than {TS} ")
    assert (rows[1]["key"], rows[1]["value"], rows[1]["ts"]) == (None, None, None)
    assert json.loads(rows[1]["raw"]) == {"key": "b", "value": "2"}
    assert rows[2]["reason"] == "bad_key"  # rejections stay as they are


# ---------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize("kwargs, message", [
    ({"value_format": "proto"}, "value_format 'proto' is not one of 'json', 'string', 'debezium', 'avro', "
                                "'json_sr', 'protobuf'"),
    ({"value_format": "protobuf"}, "value_format 'protobuf' needs a schema registry"),
    ({"key_format": "avro"}, "key_format 'avro' needs a schema registry"),
    ({"value_format": "avro"}, "value_format 'avro' needs a schema registry"),
    ({"value_format": "json_sr", "schema_registry": "registry:8081"}, "is not an http:// or https:// URL"),
    ({"schema_registry": "http://registry:8081"}, "a schema registry applies to value_format or key_format 'avro', "
                                                  "'json_sr' and 'protobuf' only"),
    ({"value_format": "string", "timestamp_field": "ts"}, "timestamp_field needs JSON values"),
    ({"timestamp_field": "meta..ts"}, "timestamp_field 'meta..ts' is not a dotted path"),
    ({"timestamp_field": ""}, "timestamp_field '' is not a dotted path"),
    ({"debezium_timestamp": "source.ts_ms"}, "debezium_timestamp 'source.ts_ms' applies to value_format 'debezium'"),
    ({"value_format": "string", "key_field": "id"}, "key_field applies to value_format 'debezium' only"),
    ({"value_format": "debezium", "debezium_timestamp": "ts_us"}, "debezium_timestamp 'ts_us' is not 'ts_ms'"),
    ({"value_format": "debezium", "key_field": ""}, "key_field is empty"),
])
def test_bad_format_settings_are_refused(kwargs, message):
    fmt = KafkaFormat(**kwargs)
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        fmt.validate()
    with pytest.raises(ValueError):
        parse_kafka(batch([(b"k", b"1")]), fmt, "kafka:t")


def test_good_format_settings_pass():
    for fmt in (KafkaFormat(), KafkaFormat(value_format="string"), KafkaFormat(timestamp_field="a.b"),
                KafkaFormat("debezium", "updated_at", "source.ts_ms", "id"),
                KafkaFormat("avro", "at", schema_registry="https://u:p@registry:8081/apis/ccompat/v7"),
                KafkaFormat("json_sr", schema_registry="http://127.0.0.1:8081")):
        fmt.validate()


# ---------------------------------------------------------------------------------------- Debezium
# inventory.customers as Debezium's tutorial database has it, written by the MySQL and the Postgres
# connectors through Kafka Connect's JsonConverter (compact JSON, schemas.enable true or false).
ROW_FIELDS = [{"type": "int32", "optional": False, "field": "id"},
              {"type": "string", "optional": False, "field": "first_name"},
              {"type": "string", "optional": False, "field": "last_name"},
              {"type": "string", "optional": False, "field": "email"}]
KEY_SCHEMA = {"type": "struct", "fields": ROW_FIELDS[:1], "optional": False,
              "name": "dbserver1.inventory.customers.Key"}
VALUE_SCHEMA = {
    "type": "struct", "optional": False, "name": "dbserver1.inventory.customers.Envelope", "version": 2,
    "fields": [
        {"type": "struct", "fields": ROW_FIELDS, "optional": True, "name": "dbserver1.inventory.customers.Value",
         "field": "before"},
        {"type": "struct", "fields": ROW_FIELDS, "optional": True, "name": "dbserver1.inventory.customers.Value",
         "field": "after"},
        {"type": "struct", "optional": False, "name": "io.debezium.connector.mysql.Source", "field": "source",
         "fields": [{"type": "string", "optional": False, "field": "version"},
                    {"type": "string", "optional": False, "field": "connector"},
                    {"type": "string", "optional": False, "field": "name"},
                    {"type": "int64", "optional": False, "field": "ts_ms"},
                    {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
                     "parameters": {"allowed": "true,last,false,incremental"}, "default": "false",
                     "field": "snapshot"},
                    {"type": "string", "optional": False, "field": "db"},
                    {"type": "string", "optional": True, "field": "table"},
                    {"type": "int64", "optional": False, "field": "pos"}]},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "struct", "optional": True, "name": "event.block", "version": 1, "field": "transaction",
         "fields": [{"type": "string", "optional": False, "field": "id"},
                    {"type": "int64", "optional": False, "field": "total_order"},
                    {"type": "int64", "optional": False, "field": "data_collection_order"}]},
    ],
}
SALLY = {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "sally.thomas@acme.com"}
ANNE = {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}
ANNE_MARIE = {**ANNE, "first_name": "Anne Marie"}
ZOE = {"id": 1005, "first_name": "Zoë", "last_name": "O\"Neil", "email": "zoe@example.com"}
DB_TS = TS - 250  # source.ts_ms: when MySQL committed; the envelope's ts_ms is when Debezium read it


def source(connector: str = "mysql", snapshot: str = "false") -> dict[str, Any]:
    if connector == "mysql":
        return {"version": "2.7.3.Final", "connector": "mysql", "name": "dbserver1", "ts_ms": DB_TS,
                "ts_us": DB_TS * 1000, "ts_ns": DB_TS * 1_000_000, "snapshot": snapshot, "db": "inventory",
                "sequence": None, "table": "customers", "server_id": 223344, "gtid": None,
                "file": "mysql-bin.000003", "pos": 484, "row": 0, "thread": 7, "query": None}
    return {"version": "2.7.3.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": DB_TS,
            "ts_us": DB_TS * 1000, "ts_ns": DB_TS * 1_000_000, "snapshot": snapshot, "db": "postgres",
            "sequence": '["24023119","24023128"]', "schema": "inventory", "table": "customers", "txId": 555,
            "lsn": 24023128, "xmin": None}


def jackson(obj: Any) -> bytes:
    """What the JsonConverter writes: compact JSON in UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def dkey(id_: int, schema: bool = True) -> bytes:
    return jackson({"schema": KEY_SCHEMA, "payload": {"id": id_}} if schema else {"id": id_})


def event(op: str, before: Any, after: Any, schema: bool = True, connector: str = "mysql",
          ts_ms: int = TS, **extra: Any) -> bytes:
    payload = {"before": before, "after": after, "source": source(connector, "true" if op == "r" else "false"),
               "op": op, "ts_ms": ts_ms, "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000,
               "transaction": None, **extra}
    return jackson({"schema": VALUE_SCHEMA, "payload": payload} if schema else payload)


@pytest.mark.parametrize("schema", [True, False])
@pytest.mark.parametrize("connector", ["mysql", "postgresql"])
def test_debezium_snapshot_create_update_delete_and_the_delete_marker(schema, connector):
    messages = [
        (dkey(1001, schema), event("r", None, SALLY, schema, connector, TS)),
        (dkey(1004, schema), event("c", None, ANNE, schema, connector, TS + 1)),
        (dkey(1004, schema), event("u", ANNE, ANNE_MARIE, schema, connector, TS + 2)),
        (dkey(1004, schema), event("d", ANNE_MARIE, None, schema, connector, TS + 3)),
        (dkey(1004, schema), None),
        (dkey(1005, schema), event("c", None, ZOE, schema, connector, TS + 4)),
    ]
    rows = parse([(k, v, 1) for k, v in messages], DEBEZIUM)
    assert [outcome(r) for r in rows] == [
        ('{"id":1001}', compact(SALLY), TS),
        ('{"id":1004}', '{"id":1004,"first_name":"Anne","last_name":"Kretchmar","email":"annek@noanswer.org"}',
         TS + 1),
        ('{"id":1004}', '{"id":1004,"first_name":"Anne Marie","last_name":"Kretchmar","email":"annek@noanswer.org"}',
         TS + 2),
        ('{"id":1004}', None, TS + 3),
        (SKIPPED, SKIPPED_DETAIL),
        ('{"id":1005}', '{"id":1005,"first_name":"Zoë","last_name":"O\\"Neil","email":"zoe@example.com"}', TS + 4),
    ]
    assert [r["pos"] for r in rows] == [100, 101, 102, 103, 104, 105]
    for row, (key, value) in zip(rows, messages, strict=True):
        assert json.loads(row["raw"]) == {"key": key.decode(), "value": value and value.decode()}
    assert (rows[4]["key"], rows[4]["value"], rows[4]["ts"]) == (None, None, None)


def test_debezium_source_ts_ms_is_when_the_database_made_the_change():
    fmt = KafkaFormat(value_format="debezium", debezium_timestamp="source.ts_ms")
    rows = parse([(dkey(1004), event("c", None, ANNE)), (dkey(1004), event("d", ANNE, None))], fmt)
    assert [r["ts"] for r in rows] == [DB_TS, DB_TS]


def test_debezium_key_field_takes_one_member_of_the_key():
    fmt = KafkaFormat(value_format="debezium", key_field="id")
    assert one(dkey(1004), event("c", None, ANNE), fmt)["key"] == "1004"
    assert one(dkey(1004, schema=False), event("c", None, ANNE), fmt)["key"] == "1004"
    composite = jackson({"tenant": "acme", "id": -0})
    assert one(composite, event("c", None, ANNE))["key"] == '{"tenant":"acme","id":0}'
    assert one(b'{"tenant":"acme","id":-0}', event("c", None, ANNE), fmt)["key"] == "0"
    assert one(composite, event("c", None, ANNE), KafkaFormat(value_format="debezium", key_field="tenant"))["key"] \
        == "acme"


@pytest.mark.parametrize("key, fmt, detail", [
    (None, DEBEZIUM, "the record has no key (null)"),
    (b"", DEBEZIUM, "the key is empty"),
    (b"1004", DEBEZIUM, "the Debezium key is a number, not a JSON object"),
    (b"{id:1004}", DEBEZIUM, "the key is not JSON text: Expecting property name enclosed in double quotes: "
                             "line 1 column 2 (char 1)"),
    (b'{"schema":null,"payload":[1004]}', DEBEZIUM, "the Debezium key's payload is an array, not a JSON object"),
    (b'{"id":1004}', KafkaFormat(value_format="debezium", key_field="uuid"),
     "the Debezium key has no field 'uuid' (key_field)"),
    (b'{"id":10.5}', KafkaFormat(value_format="debezium", key_field="id"),
     "field 'id' of the Debezium key must be a string or an integer, got 10.5"),
    (b'{"id":null}', KafkaFormat(value_format="debezium", key_field="id"),
     "field 'id' of the Debezium key must be a string or an integer, got null"),
    (b'{"id":""}', KafkaFormat(value_format="debezium", key_field="id"), "field 'id' of the Debezium key is empty"),
])
def test_debezium_bad_keys(key, fmt, detail):
    assert outcome(one(key, event("c", None, ANNE), fmt)) == ("bad_key", detail)


def test_debezium_truncate_and_message_events_are_bad_value_naming_the_op():
    truncate = event("t", None, None, connector="postgresql")
    row = one(None, truncate, DEBEZIUM)  # Debezium writes truncate events without a key
    assert outcome(row) == ("bad_value", "Debezium op \"t\" (truncate) is not the change of one row: only 'c', 'r', "
                                         "'u' and 'd' are")
    assert json.loads(row["raw"]) == {"key": None, "value": truncate.decode()}
    message = jackson({"op": "m", "ts_ms": TS, "source": source("postgresql"),
                       "message": {"prefix": "audit", "content": "aGk="}})
    assert one(b'{"prefix":"audit"}', message, DEBEZIUM)["detail"].startswith('Debezium op "m" (message) is not')
    assert one(dkey(1), event("x", None, ANNE), DEBEZIUM)["detail"].startswith('Debezium op "x" is not')


@pytest.mark.parametrize("value, fmt, expected", [
    (event("c", None, None), DEBEZIUM, ("bad_value", "Debezium op 'c' has no 'after' row (missing or null)")),
    (jackson({"op": "u", "ts_ms": TS}), DEBEZIUM,
     ("bad_value", "Debezium op 'u' has no 'after' row (missing or null)")),
    (jackson({"op": "c", "after": [1], "ts_ms": TS}), DEBEZIUM,
     ("bad_value", "the 'after' row of Debezium op 'c' is an array, not a JSON object")),
    (jackson({"before": None, "after": ANNE, "source": source()}), DEBEZIUM,
     ("missing_field", "missing field 'op' in the Debezium change event")),
    (jackson({"after": ANNE, "source": source(), "op": "c"}), DEBEZIUM,
     ("missing_field", "missing field 'ts_ms' in the Debezium change event")),
    (jackson({"before": ANNE, "after": None, "op": "d"}), DEBEZIUM,
     ("missing_field", "missing field 'ts_ms' in the Debezium change event")),
    (jackson({"after": ANNE, "op": "c", "ts_ms": TS}), KafkaFormat("debezium", debezium_timestamp="source.ts_ms"),
     ("missing_field", "missing field 'source.ts_ms' in the Debezium change event")),
    (jackson({"after": ANNE, "op": "c", "ts_ms": -1}), DEBEZIUM,
     ("bad_timestamp", "'ts_ms': timestamp -1 is outside [0, 2^63-1]")),
    (b"null", DEBEZIUM, ("bad_value", "the value is JSON null, not a Debezium change event (a JSON object)")),
    (b'{"schema":{},"payload":"x"}', DEBEZIUM,
     ("bad_value", "the payload of the value is a string, not a Debezium change event (a JSON object)")),
    (b"{not json", DEBEZIUM, ("bad_value", "the value is not JSON text: Expecting property name enclosed in double "
                                           "quotes: line 1 column 2 (char 1)")),
])
def test_debezium_bad_change_events(value, fmt, expected):
    assert outcome(one(dkey(1004), value, fmt)) == expected


def test_debezium_timestamp_field_reads_the_after_row_and_a_delete_keeps_the_envelope_time():
    fmt = KafkaFormat(value_format="debezium", timestamp_field="updated_at")
    row = {**ANNE, "updated_at": "2024-01-01T00:00:00.5Z"}
    rows = parse([(dkey(1004), event("c", None, row, ts_ms=TS + 9)),
                  (dkey(1004), event("u", row, ANNE_MARIE, ts_ms=TS + 9)),
                  (dkey(1004), event("d", row, None, ts_ms=TS + 9)),
                  (dkey(1004), None)], fmt)
    assert [outcome(r) for r in rows] == [
        ('{"id":1004}', compact(row), TS + 500),
        ("missing_field", "missing field 'updated_at' in the Debezium 'after' row"),
        ('{"id":1004}', None, TS + 9),
        (SKIPPED, SKIPPED_DETAIL),
    ]


def test_debezium_delete_markers_are_neither_records_nor_rejections_and_max_timestamp_keeps_them():
    rows = parse([(dkey(1004), event("d", ANNE, None, ts_ms=TS + 10)), (dkey(1004), None, -1), (None, None)],
                 DEBEZIUM, max_timestamp=TS)
    assert rows[0]["reason"] == "bad_timestamp"
    assert [(r["reason"], r["detail"], r["pos"]) for r in rows[1:]] == [(SKIPPED, SKIPPED_DETAIL, 101),
                                                                        (SKIPPED, SKIPPED_DETAIL, 102)]
    assert [json.loads(r["raw"]) for r in rows[1:]] == [{"key": dkey(1004).decode(), "value": None},
                                                        {"key": None, "value": None}]


def test_reason_codes_are_the_layouts_plus_skipped():
    assert SKIPPED not in REJECT_REASONS
    for code in ("bad_key", "bad_value", "bad_timestamp", "missing_field", "too_large"):
        assert code in REJECT_REASONS


# ---------------------------------------------------------------------------------------- fast path
def test_orjson_escapes_every_code_point_as_compact_does():
    """The fast path's premise (``kafka_rows._canonical``): orjson's dumps of a string is
    ``compact``'s, so canonical text with escapes may take the fast path."""
    chars = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    assert orjson.dumps(chars).decode() == json.dumps(chars, ensure_ascii=False, separators=(",", ":"))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=10,
)
TEXTS = st.one_of(
    st.binary(max_size=12),
    st.text(max_size=12).map(str.encode),
    st.builds(lambda v, sep: json.dumps(v, separators=sep, ensure_ascii=False).encode(), JSON,
              st.sampled_from([(",", ":"), (", ", ": ")])),
    st.builds(lambda op, after, ts, wrap: jackson({"schema": None, "payload": {"op": op, "after": after, "ts_ms": ts}}
                                                  if wrap else {"op": op, "after": after, "ts_ms": ts}),
              st.sampled_from(["c", "r", "u", "d", "t", 1]), JSON, st.integers(-2, 2**63) | st.text(max_size=4),
              st.booleans()),
)
FORMATS = st.sampled_from([KafkaFormat(), KafkaFormat(value_format="string"), DEBEZIUM,
                           KafkaFormat(timestamp_field="a"), KafkaFormat("debezium", "a", "source.ts_ms", "a")])


def decoded(raw: dict[str, Any], name: str) -> bytes | None:
    if name + "Base64" in raw:
        assert name not in raw
        return base64.b64decode(raw[name + "Base64"], validate=True)
    return None if raw[name] is None else raw[name].encode()


def header_bytes(value: Any) -> bytes | None:
    """One header value of raw back as bytes (docs/contract.md, Kafka sources)."""
    if isinstance(value, dict):
        assert list(value) == ["base64"]
        data = base64.b64decode(value["base64"], validate=True)
        with pytest.raises(UnicodeDecodeError):
            data.decode()
        return data
    return None if value is None else value.encode()


def grouped(headers: list[tuple[str, bytes | None]]) -> dict[str, list[bytes | None]]:
    out: dict[str, list[bytes | None]] = {}
    for name, value in headers:
        out.setdefault(name, []).append(value)
    return out


HEADERS = st.none() | st.lists(st.tuples(st.sampled_from(["a", "b", "é", ""]) | st.text(max_size=3),
                                         st.none() | st.binary(max_size=4) | st.text(max_size=4).map(str.encode)),
                               max_size=4)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.none() | TEXTS, st.none() | TEXTS, st.none() | st.integers(-2, 2**63 - 1),
                          st.just(0), HEADERS), max_size=6), FORMATS)
def test_every_record_gives_one_row_whose_raw_gives_back_its_bytes(records, fmt):
    rows = parse(records, fmt)  # also: the fast path agrees with the general one
    without = parse([r[:4] for r in records], fmt)
    assert len(rows) == len(records)
    for i, (row, (key, value, _ts, _p, headers)) in enumerate(zip(rows, records, strict=True)):
        assert row["pos"] == row["offset"] == 100 + i and row["source"] == "kafka:t" and row["part"] == 0
        raw = json.loads(row["raw"])
        names = [next(n for n in raw if n.startswith("key")), next(n for n in raw if n.startswith("value"))]
        assert list(raw) == names + (["headers"] if headers else [])
        assert (decoded(raw, "key"), decoded(raw, "value")) == (key, value)
        if headers:  # every value of every name, in order; names in the order they first appear
            assert list(raw["headers"]) == list(grouped(headers))
            for name, values in grouped(headers).items():
                got = raw["headers"][name] if len(values) > 1 else [raw["headers"][name]]
                assert [header_bytes(v) for v in got] == values
        # headers are in raw only: the outcome is the same without them
        assert {**row, "raw": None} == {**without[i], "raw": None}
        assert json.loads(without[i]["raw"]) == {n: raw[n] for n in names}
        assert (row["reason"] is None) == (row["key"] is not None)
        if row["reason"] is None:
            assert row["ts"] is not None and row["detail"] is None
        else:
            assert row["reason"] in (*REJECT_REASONS, SKIPPED) and row["detail"]
            assert row["value"] is None and row["ts"] is None
