"""Stores fed by topics in the Confluent schema-registry wire format beyond Avro values (issue 44),
end to end on a real Kafka broker and a real schema registry (Apicurio Registry's
Confluent-compatible API): Protobuf values (a producer writes the magic byte, the schema id, the
message indexes and the message of a class protoc generated; ``versiq ingest --value-format
protobuf`` builds the store; ``versiq get`` reads back the JSON), and Avro keys (``key_format:
avro`` in a pipeline file: the store's key is the record's compact JSON with sorted members, a
string key schema's value the plain string, an undecodable key ``bad_key``)."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
from typing import Any

import fastavro

from tests.ingest.test_ingest_cli import VERSIQ
from tests.ingest.test_ingest_cli import env as _env
from tests.support.ingest import rejected_rows, store_versions
from tests.support.protobuf_wire import generate, wire
from versiq.ingest.config import load_config
from versiq.ingest.pipeline import run_ingest

TYPES_FILE = "versiq_pbe2e_types.proto"
TYPES = """syntax = "proto3";
package versiq.e2e;
message Money { int64 cents = 1; string currency = 2; }
"""
ITEM_FILE = "versiq_pbe2e_item.proto"
ITEM = f"""syntax = "proto3";
package versiq.e2e;
import "google/protobuf/timestamp.proto";
import "{TYPES_FILE}";

message Ping {{ string from = 1; }}
message Item {{
  enum Kind {{ KIND_UNSPECIFIED = 0; BOOK = 1; GAME = 2; }}
  string sku = 1;
  Kind kind = 2;
  Money price = 3;
  google.protobuf.Timestamp updated_at = 4;
  map<string, string> attrs = 5;
  oneof stock {{ int32 count = 6; bool unlimited = 7; }}
  repeated string tags = 8;
  int64 views = 9;
}}
"""


def _versions(path: str) -> dict[str, list[tuple[int, str | None]]]:
    return {k: [(v.timestamp, v.value) for v in vs] for k, vs in store_versions(path).items()}


def test_versiq_ingest_builds_a_store_from_protobuf_values(kafka_broker, schema_registry, tmp_path):
    pb = generate({TYPES_FILE: TYPES, ITEM_FILE: ITEM}, tmp_path / "pb")["versiq_pbe2e_item"]
    topic = kafka_broker.new_topic("pb-items", partitions=2)
    schema_registry.register("versiq-pbe2e-types", TYPES, "PROTOBUF")
    item_id = schema_registry.register(f"{topic}-value", ITEM, "PROTOBUF", references=[
        {"name": TYPES_FILE, "subject": "versiq-pbe2e-types", "version": 1}])

    def item(sku: str, seconds: int, **fields: Any) -> Any:
        message = pb.Item(sku=sku, **fields)
        message.updated_at.seconds = seconds
        return message

    book = item("b1", 1_700_000_000, kind=pb.Item.BOOK, count=3, tags=["new"], views=2**40)
    book.price.cents, book.price.currency = 1999, "EUR"
    book.attrs["z"], book.attrs["a"] = "last", "first"
    game = item("g1", 1_700_000_001, kind=pb.Item.GAME, unlimited=True)
    book2 = item("b1", 1_700_000_100, kind=pb.Item.BOOK, count=0)
    kafka_broker.produce(topic, [
        # Item is the file's second message: indexes [1]; Ping, the first, is the single byte 0
        {"key": "b1", "value": wire(item_id, book, [1]), "partition": 0, "timestamp_ms": 1_000},
        {"key": "g1", "value": wire(item_id, game, [1]), "partition": 1, "timestamp_ms": 1_001},
        {"key": "b1", "value": wire(item_id, book2, [1]), "partition": 0, "timestamp_ms": 2_000},
        {"key": "g1", "value": None, "partition": 1, "timestamp_ms": 3_000},                  # a tombstone
        {"key": "p1", "value": wire(item_id, pb.Ping(**{"from": "x"})), "partition": 1, "timestamp_ms": 3_001},
        {"key": "x1", "value": wire(item_id, book, [1])[:-3], "partition": 1, "timestamp_ms": 3_002},  # truncated
    ])
    wh, report_file = str(tmp_path / "wh"), tmp_path / "report.json"
    done = subprocess.run([*VERSIQ, "ingest", "--warehouse", wh, "--store", "items", "--kafka-bootstrap",
                           kafka_broker.bootstrap, "--topic", topic, "--value-format", "protobuf", "--schema-registry",
                           schema_registry.url, "--max-future", "none", "--report", str(report_file)],
                          env=_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    report = json.loads(report_file.read_text())["stores"]["items"]
    assert report["read"] == 6 and {k: v for k, v in report["rejected"].items() if v} == {"bad_value": 1}, report
    book_json = {"sku": "b1", "kind": "BOOK", "price": {"cents": 1999, "currency": "EUR"},
                 "updated_at": "2023-11-14T22:13:20Z", "attrs": {"a": "first", "z": "last"}, "count": 3,
                 "tags": ["new"], "views": 2**40}
    game_json = {"sku": "g1", "kind": "GAME", "updated_at": "2023-11-14T22:13:21Z", "attrs": {}, "unlimited": True,
                 "tags": [], "views": 0}
    book2_json = {"sku": "b1", "kind": "BOOK", "updated_at": "2023-11-14T22:15:00Z", "attrs": {}, "count": 0,
                  "tags": [], "views": 0}

    def text(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"))

    path = os.path.join(wh, "items")
    assert _versions(path) == {"b1": [(1_000, text(book_json)), (2_000, text(book2_json))],
                               "g1": [(1_001, text(game_json)), (3_000, None)],
                               "p1": [(3_001, '{"from":"x"}')]}
    [bad] = rejected_rows(path)
    assert bad["reason"] == "bad_value", bad
    assert f"schema id {item_id}: the payload is not a versiq.e2e.Item" in bad["detail"], bad
    # the value answers as JSON through the read path
    shown = subprocess.run([*VERSIQ, "get", "--warehouse", wh, "--store", "items", "--key", "b1"], env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    answer = json.loads(shown.stdout)
    assert answer["value"] == book2_json and answer["timestamp"] == 2_000, answer


KEY = {"type": "record", "name": "CustomerKey", "namespace": "versiq.e2e",
       "fields": [{"name": "region", "type": "string"}, {"name": "id", "type": "long"}]}
VALUE = {"type": "record", "name": "Customer", "namespace": "versiq.e2e",
         "fields": [{"name": "name", "type": "string"}]}


def avro_wire(schema_id: int, schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def test_avro_keys_end_to_end(spark, kafka_broker, schema_registry, tmp_path):
    topic = kafka_broker.new_topic("avro-keys", partitions=1)
    key_id = schema_registry.register(f"{topic}-key", KEY)
    value_id = schema_registry.register(f"{topic}-value", VALUE)
    plain_topic = kafka_broker.new_topic("avro-string-keys", partitions=1)
    string_id = schema_registry.register(f"{plain_topic}-key", json.dumps("string"))

    def key(region: str, n: int) -> bytes:
        return avro_wire(key_id, KEY, {"region": region, "id": n})

    def value(name: str) -> bytes:
        return avro_wire(value_id, VALUE, {"name": name})

    kafka_broker.produce(topic, [
        {"key": key("eu", 1), "value": value("Ada"), "timestamp_ms": 1_000},
        {"key": key("us", 1), "value": value("Bob"), "timestamp_ms": 1_001},
        {"key": key("eu", 1), "value": value("Ada L."), "timestamp_ms": 2_000},
        {"key": key("eu", 1)[:-1], "value": value("Eve"), "timestamp_ms": 2_001},     # a truncated key
        {"key": b"eu-0001", "value": value("Mal"), "timestamp_ms": 2_002},            # not the wire format
        {"key": key("us", 1), "value": None, "timestamp_ms": 3_000},                  # a tombstone
    ])
    kafka_broker.produce(plain_topic, [
        {"key": avro_wire(string_id, "string", "c-42"), "value": b'{"n": 1}', "timestamp_ms": 1_000}])
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"""
stores:
  - name: customers
    max_future: none
    source:
      kafka:
        bootstrap: "{kafka_broker.bootstrap}"
        topic: {topic}
        key_format: avro
        value_format: avro
        schema_registry: {{url: "{schema_registry.url}"}}
  - name: plain
    max_future: none
    source:
      kafka:
        bootstrap: "{kafka_broker.bootstrap}"
        topic: {plain_topic}
        key_format: avro
        schema_registry: {{url: "{schema_registry.url}"}}
""")
    wh = str(tmp_path / "wh")
    config = load_config(str(pipeline), wh)
    assert config.stores[0].kafka.format.key_format == "avro"
    result = run_ingest(spark, wh, config.stores)
    customers, plain = result.stores["customers"], result.stores["plain"]
    assert customers.error is None and plain.error is None, (customers.error, plain.error)
    assert {k: v for k, v in customers.rejected.items() if v} == {"bad_key": 2}
    eu, us = '{"id":1,"region":"eu"}', '{"id":1,"region":"us"}'
    assert _versions(os.path.join(wh, "customers")) == {
        eu: [(1_000, '{"name":"Ada"}'), (2_000, '{"name":"Ada L."}')],
        us: [(1_001, '{"name":"Bob"}'), (3_000, None)]}
    details = {r["offset"]: (r["reason"], r["detail"]) for r in rejected_rows(os.path.join(wh, "customers"))}
    assert details[3][0] == "bad_key" and f"schema id {key_id}: the payload is not Avro data" in details[3][1]
    assert details[4][0] == "bad_key" and "the key does not start with the schema registry's magic" in details[4][1]
    assert _versions(os.path.join(wh, "plain")) == {"c-42": [(1_000, '{"n":1}')]}
    # the JSON key text is the key the read path answers for
    shown = subprocess.run([*VERSIQ, "get", "--warehouse", wh, "--store", "customers", "--key", eu], env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    answer = json.loads(shown.stdout)
    assert answer["value"] == {"name": "Ada L."} and answer["timestamp"] == 2_000, answer


def test_key_format_usage_errors_exit_2_before_any_spark(tmp_path):
    wh = str(tmp_path / "wh")
    kafka = ["--store", "s", "--kafka-bootstrap", "127.0.0.1:1", "--topic", "t"]
    cases = [
        ([*kafka, "--key-format", "avro"], "key_format 'avro' needs a schema registry"),
        ([*kafka, "--value-format", "protobuf"], "value_format 'protobuf' needs a schema registry"),
        ([*kafka, "--key-format", "protobuf", "--value-format", "debezium", "--schema-registry", "http://127.0.0.1:1"],
         "does not apply to value_format 'debezium'"),
        (["--config", "x.yaml", "--key-format", "avro"], "not both (--key-format)"),
    ]
    for extra, message in cases:
        result = subprocess.run([*VERSIQ, "ingest", "--warehouse", wh, *extra], env=_env(), capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 2 and message in result.stderr, (extra, result.stderr)
