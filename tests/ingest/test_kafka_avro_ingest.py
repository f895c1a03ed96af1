"""Stores fed by topics of Avro and JSON Schema values in the Confluent schema-registry wire
format (issue 44), end to end on a real Kafka broker and a real schema registry (Apicurio
Registry's Confluent-compatible API): a producer writes each value with the id the registry gave
its schema, ``versiq ingest`` builds the store, and the stored values are the JSON of what was
written; records that cannot be decoded are rejected ``bad_value`` naming the schema id; a
registry that cannot be reached fails the run with nothing committed, and the rerun completes it.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
from typing import Any

import fastavro

from tests.ingest.test_ingest_cli import VERSIQ
from tests.ingest.test_ingest_cli import env as _env
from tests.support.ingest import rejected_rows, store_versions
from versiq.ingest.config import load_config
from versiq.ingest.kafka import KafkaSource
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.records.kafka_rows import KafkaFormat

PRICE = {"type": "record", "name": "Price", "namespace": "versiq.e2e", "fields": [
    {"name": "sku", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": ["null", "string"], "default": None},
]}
# A second version of the subject's schema: records of both versions are read with their own.
PRICE_V2 = {**PRICE, "fields": [*PRICE["fields"], {"name": "stock", "type": "int", "default": 0}]}


def wire(schema_id: int, schema: Any, datum: Any) -> bytes:
    """What Confluent's serializers write: magic byte 0, the schema id (4 bytes, big-endian), the
    Avro binary encoding of the datum."""
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def price(sku: str, cents: int, currency: str = "EUR", tags: list[str] | None = None, note: str | None = None,
          **more: Any) -> dict[str, Any]:
    import decimal

    return {"sku": sku, "amount": decimal.Decimal(cents).scaleb(-2), "currency": currency, "tags": tags or [],
            "note": note, **more}


def as_json(sku: str, cents: int, currency: str = "EUR", tags: list[str] | None = None, note: str | None = None,
            **more: Any) -> str:
    amount = f"{cents // 100}.{cents % 100:02d}"
    return json.dumps({"sku": sku, "amount": amount, "currency": currency, "tags": tags or [], "note": note, **more},
                      separators=(",", ":"), ensure_ascii=False)


def _produce_prices(broker: Any, registry: Any, topic: str) -> int:
    v1 = registry.register(f"{topic}-value", PRICE)
    v2 = registry.register(f"{topic}-value", PRICE_V2)
    assert v1 != v2
    broker.produce(topic, [
        {"key": "a", "value": wire(v1, PRICE, price("a", 1050, tags=["x"])), "partition": 0, "timestamp_ms": 1_000},
        {"key": "b", "value": wire(v1, PRICE, price("b", 5, "USD", note="é")), "partition": 1, "timestamp_ms": 1_001},
        {"key": "a", "value": wire(v2, PRICE_V2, price("a", 1100, stock=3)), "partition": 0, "timestamp_ms": 2_000},
        {"key": "b", "value": None, "partition": 1, "timestamp_ms": 3_000},  # a tombstone
    ])
    return v1


def _expected_prices() -> dict[str, list[tuple[int, str | None]]]:
    return {"a": [(1_000, as_json("a", 1050, tags=["x"])), (2_000, as_json("a", 1100, stock=3))],
            "b": [(1_001, as_json("b", 5, "USD", note="é")), (3_000, None)]}


def _versions(path: str) -> dict[str, list[tuple[int, str | None]]]:
    return {k: [(v.timestamp, v.value) for v in vs] for k, vs in store_versions(path).items()}


def test_versiq_ingest_builds_a_store_from_avro_values(kafka_broker, schema_registry, tmp_path):
    topic = kafka_broker.new_topic("avro-prices", partitions=2)
    _produce_prices(kafka_broker, schema_registry, topic)
    wh, report_file = str(tmp_path / "wh"), tmp_path / "report.json"
    done = subprocess.run([*VERSIQ, "ingest", "--warehouse", wh, "--store", "prices", "--kafka-bootstrap",
                           kafka_broker.bootstrap, "--topic", topic, "--value-format", "avro", "--schema-registry",
                           schema_registry.url, "--max-future", "none", "--report", str(report_file)],
                          env=_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    report = json.loads(report_file.read_text())["stores"]["prices"]
    assert report["read"] == 4 and not any(report["rejected"].values()), report
    assert _versions(os.path.join(wh, "prices")) == _expected_prices()
    # the value answers as JSON through the read path (GET /v1/stores/{store}/keys/{key})
    shown = subprocess.run([*VERSIQ, "get", "--warehouse", wh, "--store", "prices", "--key", "a"], env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    answer = json.loads(shown.stdout)
    assert answer["value"] == json.loads(as_json("a", 1100, stock=3)) and answer["timestamp"] == 2_000, answer


def test_records_that_cannot_be_decoded_are_rejected_and_json_schema_values_are_read(
        spark, kafka_broker, schema_registry, tmp_path):
    avro_topic = kafka_broker.new_topic("avro-bad", partitions=2)
    v1 = _produce_prices(kafka_broker, schema_registry, avro_topic)
    good = wire(v1, PRICE, price("c", 1))
    kafka_broker.produce(avro_topic, [
        {"key": "c", "value": good, "partition": 0, "timestamp_ms": 4_000},
        {"key": "d", "value": b'{"sku": "d"}', "partition": 0, "timestamp_ms": 4_001},  # JSON, not the wire format
        {"key": "e", "value": b"\x00" + struct.pack(">I", 999_999) + good[5:], "partition": 0,
         "timestamp_ms": 4_002},                                                       # an unknown schema id
        {"key": "f", "value": good[:-2], "partition": 0, "timestamp_ms": 4_003},       # a truncated payload
    ])
    json_topic = kafka_broker.new_topic("json-sr", partitions=1)
    json_id = schema_registry.register(f"{json_topic}-value", {"$schema": "http://json-schema.org/draft-07/schema#",
                                                               "type": "object"}, schema_type="JSON")
    header = b"\x00" + struct.pack(">I", json_id)
    kafka_broker.produce(json_topic, [
        {"key": "x", "value": header + b'{"n": 1, "at": "1970-01-01T00:00:05Z"}', "timestamp_ms": 1},
        {"key": "y", "value": header + b"{oops", "timestamp_ms": 2},
    ])
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"""
stores:
  - name: prices
    max_future: none
    source:
      kafka:
        bootstrap: "{kafka_broker.bootstrap}"
        topic: {avro_topic}
        value_format: avro
        schema_registry: {{url: "{schema_registry.url}"}}
  - name: events
    max_future: none
    source:
      kafka:
        bootstrap: "{kafka_broker.bootstrap}"
        topic: {json_topic}
        value_format: json_sr
        timestamp_field: at
        schema_registry: {{url: "{schema_registry.url}"}}
""")
    wh = str(tmp_path / "wh")
    config = load_config(str(pipeline), wh)
    result = run_ingest(spark, wh, config.stores)
    prices, events = result.stores["prices"], result.stores["events"]
    assert prices.error is None and events.error is None, (prices.error, events.error)
    assert {k: v for k, v in prices.rejected.items() if v} == {"bad_value": 3}
    expected = _expected_prices()
    expected["c"] = [(4_000, as_json("c", 1))]
    assert _versions(os.path.join(wh, "prices")) == expected
    rejected = rejected_rows(os.path.join(wh, "prices"))
    assert {r["reason"] for r in rejected} == {"bad_value"} and {r["partition"] for r in rejected} == {0}
    details = {r["offset"]: r["detail"] for r in rejected}
    assert set(details) == {3, 4, 5}
    assert "magic byte 0" in details[3]
    assert "schema id 999999 is not in the schema registry (404)" in details[4]
    assert f"schema id {v1}: the payload is not Avro data" in details[5]
    assert _versions(os.path.join(wh, "events")) == {"x": [(5_000, '{"n":1,"at":"1970-01-01T00:00:05Z"}')]}
    [bad] = rejected_rows(os.path.join(wh, "events"))
    assert bad["reason"] == "bad_value" and f"schema id {json_id}: the value is not JSON" in bad["detail"]


def test_a_registry_that_is_down_fails_the_run_with_nothing_committed_and_the_rerun_completes_it(
        spark, kafka_broker, schema_registry, tmp_path):
    from versiq import storage
    from versiq.layout import read_state

    topic = kafka_broker.new_topic("avro-outage", partitions=2)
    v1 = schema_registry.register(f"{topic}-value", PRICE)
    kafka_broker.produce(topic, [{"key": "z", "value": wire(v1, PRICE, price("z", 1)), "partition": 0,
                                  "timestamp_ms": 500}])
    wh = str(tmp_path / "wh")
    path = os.path.join(wh, "prices")
    source = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic,
                         format=KafkaFormat(value_format="avro", schema_registry=schema_registry.url))
    spec = StoreSpec(name="prices", source=source.name, kafka=source, max_future_ms=None)
    assert run_ingest(spark, wh, [spec]).stores["prices"].error is None
    version = storage.delta_table(path).version()
    position = read_state(path, version).kafka
    _produce_prices(kafka_broker, schema_registry, topic)

    schema_registry.stop()
    try:
        failed = subprocess.run([*VERSIQ, "ingest", "--warehouse", wh, "--store", "prices", "--kafka-bootstrap",
                                 kafka_broker.bootstrap, "--topic", topic, "--value-format", "avro",
                                 "--schema-registry", schema_registry.url, "--max-future", "none"],
                                env=_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    finally:
        schema_registry.ensure_running()
    assert failed.returncode == 1, failed.stderr
    assert "store prices: FAILED" in failed.stderr and "cannot be reached" in failed.stderr, failed.stderr
    assert schema_registry.url in failed.stderr and "Traceback" not in failed.stderr, failed.stderr
    # nothing committed: the store's version and position are those of the first run
    assert storage.delta_table(path).version() == version
    assert read_state(path, version).kafka == position
    assert not rejected_rows(path)

    # the rerun, with the registry back (same ids: its storage survives a restart)
    report = run_ingest(spark, wh, [spec]).stores["prices"]
    assert report.error is None, report.error
    assert report.read == 4 and not any(report.rejected.values())
    assert _versions(path) == {**_expected_prices(), "z": [(500, as_json("z", 1))]}


def test_schema_registry_usage_errors_exit_2_before_any_spark(tmp_path):
    wh = str(tmp_path / "wh")
    kafka = ["--store", "s", "--kafka-bootstrap", "127.0.0.1:1", "--topic", "t"]
    cases = [
        ([*kafka, "--value-format", "avro"], "value_format 'avro' needs a schema registry"),
        ([*kafka, "--schema-registry", "http://127.0.0.1:1"], "applies to value_format or key_format"),
        ([*kafka, "--value-format", "json_sr", "--schema-registry", "registry:8081"], "not an http:// or https://"),
        (["--config", "x.yaml", "--schema-registry", "http://127.0.0.1:1"], "not both (--schema-registry)"),
    ]
    for extra, message in cases:
        result = subprocess.run([*VERSIQ, "ingest", "--warehouse", wh, *extra], env=_env(), capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 2 and message in result.stderr, (extra, result.stderr)


def test_schema_registry_in_a_pipeline_file_is_checked(tmp_path):
    import pytest

    from versiq.ingest.errors import UsageError

    def load(registry: str, value_format: str = "avro") -> Any:
        pipeline = tmp_path / "p.yaml"
        pipeline.write_text(f"""
stores:
  - name: s
    source:
      kafka: {{bootstrap: "127.0.0.1:1", topic: t, value_format: {value_format}{registry}}}
""")
        return load_config(str(pipeline))

    spec = load(', schema_registry: {url: "https://u:pw@r:8081/apis/ccompat/v7"}').stores[0]
    assert spec.kafka.format.schema_registry == "https://u:pw@r:8081/apis/ccompat/v7"
    assert "pw" not in repr(spec)
    for registry, message in [
        ("", "needs a schema registry"),
        (", schema_registry: http://r:8081", "'schema_registry' must be a mapping"),
        (", schema_registry: {uri: http://r:8081}", "unknown field(s): uri"),
        (", schema_registry: {}", "'url' is required"),
        (", schema_registry: {url: r:8081}", "not an http:// or https:// URL"),
    ]:
        with pytest.raises(UsageError, match=re.escape(message)):
            load(registry)
    with pytest.raises(UsageError, match="applies to value_format or key_format 'avro', 'json_sr' and 'protobuf' only"):
        load(', schema_registry: {url: "http://r:8081"}', "json")
