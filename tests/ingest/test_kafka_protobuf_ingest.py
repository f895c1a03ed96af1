"""Stores fed by topics in the Confluent schema-registry wire format beyond Avro values (issue 44),
end to end on a real Kafka broker and a real schema registry (Apicurio Registry's
Confluent-compatible API): Protobuf values (a producer writes the magic byte, the schema id, the
message indexes and the message of a class protoc generated; ``versiq ingest`` with
``value_format: protobuf`` builds the store, and ``--value-format protobuf`` makes the same store;
``versiq get`` reads back the JSON), and Avro keys (``key_format: avro`` in a pipeline file: the
store's key is the record's compact JSON with sorted members, a string key schema's value the plain
string, an undecodable key ``bad_key``).

The stores are built by one ``versiq ingest --config`` run (in the session's Spark) with those of
test_kafka_avro_ingest.py (the ``registry_stores`` fixture, tests/support/registry_stores.py);
each test checks its own."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.ingest.test_ingest_cli import VERSIQ
from tests.ingest.test_ingest_cli import env as _env
from tests.support.ingest import get_in_process, rejected_rows, store_versions


def _versions(path: str) -> dict[str, list[tuple[int, str | None]]]:
    return {k: [(v.timestamp, v.value) for v in vs] for k, vs in store_versions(path).items()}


def test_versiq_ingest_builds_a_store_from_protobuf_values(registry_stores, schema_registry):
    from versiq.cli.main import build_parser
    from versiq.ingest.commands import _pipeline_from_args

    report = registry_stores.store_report("items")
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

    path = registry_stores.path("items")
    assert _versions(path) == {"b1": [(1_000, text(book_json)), (2_000, text(book2_json))],
                               "g1": [(1_001, text(game_json)), (3_000, None)],
                               "p1": [(3_001, '{"from":"x"}')]}
    [bad] = rejected_rows(path)
    assert bad["reason"] == "bad_value", bad
    assert f"schema id {registry_stores.ids['items']}: the payload is not a versiq.e2e.Item" in bad["detail"], bad
    # the value answers as JSON through the read path
    status, shown = get_in_process("--warehouse", registry_stores.warehouse, "--store", "items", "--key", "b1")
    assert status == 0, shown
    answer = json.loads(shown)
    assert answer["value"] == book2_json and answer["timestamp"] == 2_000, answer
    # --value-format protobuf --schema-registry URL make the store the pipeline file made
    args = build_parser().parse_args([
        "ingest", "--warehouse", registry_stores.warehouse, "--store", "items", "--kafka-bootstrap",
        registry_stores.bootstrap, "--topic", registry_stores.topics["items"], "--value-format", "protobuf",
        "--schema-registry", schema_registry.url, "--max-future", "none"])
    [from_flags] = _pipeline_from_args(args).stores
    assert from_flags == registry_stores.spec("items")


def test_avro_keys_end_to_end(registry_stores):
    customers, plain = registry_stores.store_report("customers"), registry_stores.store_report("plain")
    assert registry_stores.spec("customers").kafka.format.key_format == "avro"
    assert {k: v for k, v in customers["rejected"].items() if v} == {"bad_key": 2}
    assert not any(plain["rejected"].values()), plain
    eu, us = '{"id":1,"region":"eu"}', '{"id":1,"region":"us"}'
    assert _versions(registry_stores.path("customers")) == {
        eu: [(1_000, '{"name":"Ada"}'), (2_000, '{"name":"Ada L."}')],
        us: [(1_001, '{"name":"Bob"}'), (3_000, None)]}
    details = {r["offset"]: (r["reason"], r["detail"]) for r in rejected_rows(registry_stores.path("customers"))}
    key_id = registry_stores.ids["customers"]
    assert details[3][0] == "bad_key" and f"schema id {key_id}: the payload is not Avro data" in details[3][1]
    assert details[4][0] == "bad_key" and "the key does not start with the schema registry's magic" in details[4][1]
    assert _versions(registry_stores.path("plain")) == {"c-42": [(1_000, '{"n":1}')]}
    # the JSON key text is the key the read path answers for
    status, shown = get_in_process("--warehouse", registry_stores.warehouse, "--store", "customers", "--key", eu)
    assert status == 0, shown
    answer = json.loads(shown)
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
