"""The stores of the end-to-end schema-registry tests (tests/ingest/test_kafka_avro_ingest.py and
test_kafka_protobuf_ingest.py), built by ONE ``versiq ingest --config pipeline.yaml --report``
(the CLI's parser and command in the session's Spark, ``ingest_in_process``: the pipeline, report
and exit status of the process, without a JVM start) from topics on the session's Kafka broker
whose values and keys are in the Confluent wire format under schemas of the session's schema
registry:

    prices       Avro values (two versions of the subject's schema, a tombstone), two partitions,
                 and values that cannot be decoded (not the wire format, an unknown schema id, a
                 truncated payload)
    events       JSON Schema values (``json_sr``) with a timestamp field, one of them not JSON
    items        Protobuf values (a referenced import, a Timestamp, an enum, a oneof, a map, a
                 second message picked by the indexes, a truncated message)
    customers    Avro record keys (``key_format: avro``), a truncated key and one not in the wire format
    plain        an Avro string key schema's keys
    outage       one Avro value: the first run of the registry-outage test, which then makes its
                 own runs of this store

Each test asserts on its own store(s); ``RegistryStores`` carries the run's report, its
stderr and the schema ids the values were written with. Every store is built by one run (session
fixture ``registry_stores``, tests/ingest/conftest.py: once per xdist worker that runs one of
these tests); the CLI as a process of its own is test_kafka_avro_ingest.py's usage errors and
tests/ingest/test_ingest_cli.py's."""

from __future__ import annotations

import decimal
import io
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro

from tests.support.protobuf_wire import generate
from tests.support.protobuf_wire import wire as protobuf_wire

# ---------------------------------------------------------------------------------- Avro values
PRICE = {"type": "record", "name": "Price", "namespace": "versiq.e2e", "fields": [
    {"name": "sku", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": ["null", "string"], "default": None},
]}
# A second version of the subject's schema: records of both versions are read with their own.
PRICE_V2 = {**PRICE, "fields": [*PRICE["fields"], {"name": "stock", "type": "int", "default": 0}]}


def avro_wire(schema_id: int, schema: Any, datum: Any) -> bytes:
    """What Confluent's serializers write: magic byte 0, the schema id (4 bytes, big-endian), the
    Avro binary encoding of the datum."""
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def price(sku: str, cents: int, currency: str = "EUR", tags: list[str] | None = None, note: str | None = None,
          **more: Any) -> dict[str, Any]:
    return {"sku": sku, "amount": decimal.Decimal(cents).scaleb(-2), "currency": currency, "tags": tags or [],
            "note": note, **more}


def as_json(sku: str, cents: int, currency: str = "EUR", tags: list[str] | None = None, note: str | None = None,
            **more: Any) -> str:
    """The stored value of ``price(...)``: compact JSON, the decimal as its text."""
    amount = f"{cents // 100}.{cents % 100:02d}"
    return json.dumps({"sku": sku, "amount": amount, "currency": currency, "tags": tags or [], "note": note, **more},
                      separators=(",", ":"), ensure_ascii=False)


def produce_prices(broker: Any, registry: Any, topic: str) -> int:
    """Four records of keys a and b (schema versions 1 and 2, a tombstone); the id of version 1."""
    v1 = registry.register(f"{topic}-value", PRICE)
    v2 = registry.register(f"{topic}-value", PRICE_V2)
    assert v1 != v2
    broker.produce(topic, [
        {"key": "a", "value": avro_wire(v1, PRICE, price("a", 1050, tags=["x"])), "partition": 0,
         "timestamp_ms": 1_000},
        {"key": "b", "value": avro_wire(v1, PRICE, price("b", 5, "USD", note="é")), "partition": 1,
         "timestamp_ms": 1_001},
        {"key": "a", "value": avro_wire(v2, PRICE_V2, price("a", 1100, stock=3)), "partition": 0,
         "timestamp_ms": 2_000},
        {"key": "b", "value": None, "partition": 1, "timestamp_ms": 3_000},  # a tombstone
    ])
    return v1


def expected_prices() -> dict[str, list[tuple[int, str | None]]]:
    """The versions ``produce_prices`` makes."""
    return {"a": [(1_000, as_json("a", 1050, tags=["x"])), (2_000, as_json("a", 1100, stock=3))],
            "b": [(1_001, as_json("b", 5, "USD", note="é")), (3_000, None)]}


def _produce_prices_and_undecodable(broker: Any, registry: Any, topic: str) -> int:
    v1 = produce_prices(broker, registry, topic)
    good = avro_wire(v1, PRICE, price("c", 1))
    broker.produce(topic, [
        {"key": "c", "value": good, "partition": 0, "timestamp_ms": 4_000},
        {"key": "d", "value": b'{"sku": "d"}', "partition": 0, "timestamp_ms": 4_001},  # JSON, not the wire format
        {"key": "e", "value": b"\x00" + struct.pack(">I", 999_999) + good[5:], "partition": 0,
         "timestamp_ms": 4_002},                                                       # an unknown schema id
        {"key": "f", "value": good[:-2], "partition": 0, "timestamp_ms": 4_003},       # a truncated payload
    ])
    return v1


def _produce_json_sr(broker: Any, registry: Any, topic: str) -> int:
    json_id = registry.register(f"{topic}-value", {"$schema": "http://json-schema.org/draft-07/schema#",
                                                   "type": "object"}, schema_type="JSON")
    header = b"\x00" + struct.pack(">I", json_id)
    broker.produce(topic, [
        {"key": "x", "value": header + b'{"n": 1, "at": "1970-01-01T00:00:05Z"}', "timestamp_ms": 1},
        {"key": "y", "value": header + b"{oops", "timestamp_ms": 2},
    ])
    return json_id


# ------------------------------------------------------------------------------ Protobuf values
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


def _produce_items(broker: Any, registry: Any, topic: str, generated: Path) -> int:
    pb = generate({TYPES_FILE: TYPES, ITEM_FILE: ITEM}, generated)["versiq_pbe2e_item"]
    registry.register("versiq-pbe2e-types", TYPES, "PROTOBUF")
    item_id = registry.register(f"{topic}-value", ITEM, "PROTOBUF", references=[
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
    broker.produce(topic, [
        # Item is the file's second message: indexes [1]; Ping, the first, is the single byte 0
        {"key": "b1", "value": protobuf_wire(item_id, book, [1]), "partition": 0, "timestamp_ms": 1_000},
        {"key": "g1", "value": protobuf_wire(item_id, game, [1]), "partition": 1, "timestamp_ms": 1_001},
        {"key": "b1", "value": protobuf_wire(item_id, book2, [1]), "partition": 0, "timestamp_ms": 2_000},
        {"key": "g1", "value": None, "partition": 1, "timestamp_ms": 3_000},                  # a tombstone
        {"key": "p1", "value": protobuf_wire(item_id, pb.Ping(**{"from": "x"})), "partition": 1,
         "timestamp_ms": 3_001},
        {"key": "x1", "value": protobuf_wire(item_id, book, [1])[:-3], "partition": 1,
         "timestamp_ms": 3_002},                                                              # truncated
    ])
    return item_id


# ------------------------------------------------------------------------------------ Avro keys
KEY = {"type": "record", "name": "CustomerKey", "namespace": "versiq.e2e",
       "fields": [{"name": "region", "type": "string"}, {"name": "id", "type": "long"}]}
VALUE = {"type": "record", "name": "Customer", "namespace": "versiq.e2e",
         "fields": [{"name": "name", "type": "string"}]}


def _produce_customers(broker: Any, registry: Any, topic: str) -> int:
    key_id = registry.register(f"{topic}-key", KEY)
    value_id = registry.register(f"{topic}-value", VALUE)

    def key(region: str, n: int) -> bytes:
        return avro_wire(key_id, KEY, {"region": region, "id": n})

    def value(name: str) -> bytes:
        return avro_wire(value_id, VALUE, {"name": name})

    broker.produce(topic, [
        {"key": key("eu", 1), "value": value("Ada"), "timestamp_ms": 1_000},
        {"key": key("us", 1), "value": value("Bob"), "timestamp_ms": 1_001},
        {"key": key("eu", 1), "value": value("Ada L."), "timestamp_ms": 2_000},
        {"key": key("eu", 1)[:-1], "value": value("Eve"), "timestamp_ms": 2_001},     # a truncated key
        {"key": b"eu-0001", "value": value("Mal"), "timestamp_ms": 2_002},            # not the wire format
        {"key": key("us", 1), "value": None, "timestamp_ms": 3_000},                  # a tombstone
    ])
    return key_id


def _produce_plain(broker: Any, registry: Any, topic: str) -> int:
    string_id = registry.register(f"{topic}-key", json.dumps("string"))
    broker.produce(topic, [
        {"key": avro_wire(string_id, "string", "c-42"), "value": b'{"n": 1}', "timestamp_ms": 1_000}])
    return string_id


# ---------------------------------------------------------------------------------- the one run
@dataclass
class RegistryStores:
    """What the run built: ``warehouse``; ``pipeline``, its file; ``bootstrap``, the broker's;
    ``topics`` and ``ids`` (the schema id of each store's values, or keys for ``customers`` and
    ``plain``) by store; ``returncode``, ``stderr`` and ``report`` (the ``--report`` file's JSON)
    of the process."""

    warehouse: str
    pipeline: Path
    bootstrap: str
    topics: dict[str, str]
    ids: dict[str, int]
    returncode: int
    stderr: str
    report: dict[str, Any] = field(default_factory=dict)

    def path(self, store: str) -> str:
        return os.path.join(self.warehouse, store)

    def spec(self, store: str) -> Any:
        """The ``StoreSpec`` the pipeline file gives ``store``."""
        from versiq.ingest.config import load_config

        [spec] = [s for s in load_config(str(self.pipeline)).stores if s.name == store]
        return spec

    def store_report(self, store: str) -> dict[str, Any]:
        """The report of ``store``, once the run is known to have succeeded."""
        assert self.returncode == 0, self.stderr
        report: dict[str, Any] = self.report["stores"][store]
        assert report.get("error") is None, report
        return report


def build_registry_stores(broker: Any, registry: Any, folder: Path, spark: Any) -> RegistryStores:
    """Produce every topic, then run ``versiq ingest --config`` once over all of them in
    ``spark`` (``ingest_in_process``)."""
    from tests.support.ingest import ingest_in_process

    topics = {name: broker.new_topic(prefix, partitions=partitions) for name, prefix, partitions in [
        ("prices", "avro-prices", 2), ("events", "json-sr", 1),
        ("items", "pb-items", 2), ("customers", "avro-keys", 1), ("plain", "avro-string-keys", 1),
        ("outage", "avro-outage", 2)]}
    ids = {"prices": _produce_prices_and_undecodable(broker, registry, topics["prices"]),
           "events": _produce_json_sr(broker, registry, topics["events"]),
           "items": _produce_items(broker, registry, topics["items"], folder / "pb"),
           "customers": _produce_customers(broker, registry, topics["customers"]),
           "plain": _produce_plain(broker, registry, topics["plain"]),
           "outage": registry.register(f"{topics['outage']}-value", PRICE)}
    broker.produce(topics["outage"], [{"key": "z", "value": avro_wire(ids["outage"], PRICE, price("z", 1)),
                                       "partition": 0, "timestamp_ms": 500}])
    settings = {"prices": "value_format: avro",
                "events": "value_format: json_sr\n        timestamp_field: at",
                "items": "value_format: protobuf", "customers": "key_format: avro\n        value_format: avro",
                "plain": "key_format: avro", "outage": "value_format: avro"}
    pipeline = folder / "pipeline.yaml"
    pipeline.write_text("stores:\n" + "".join(f"""
  - name: {name}
    max_future: none
    source:
      kafka:
        bootstrap: "{broker.bootstrap}"
        topic: {topic}
        {settings[name]}
        schema_registry: {{url: "{registry.url}"}}
""" for name, topic in topics.items()))
    warehouse, report_file = str(folder / "wh"), folder / "report.json"
    status, printed = ingest_in_process(spark, "--warehouse", warehouse, "--config", str(pipeline),
                                        "--report", str(report_file))
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return RegistryStores(warehouse, pipeline, broker.bootstrap, topics, ids, status, printed, report)
