"""Stores fed by topics of Avro and JSON Schema values in the Confluent schema-registry wire
format (issue 44), end to end on a real Kafka broker and a real schema registry (Apicurio
Registry's Confluent-compatible API): a producer writes each value with the id the registry gave
its schema, ``versiq ingest`` builds the store, and the stored values are the JSON of what was
written; records that cannot be decoded are rejected ``bad_value`` naming the schema id; a
registry that cannot be reached fails the run with nothing committed, and the rerun completes it.

The stores are built by one ``versiq ingest --config`` run (in the session's Spark) with those of
test_kafka_protobuf_ingest.py (the ``registry_stores`` fixture, tests/support/registry_stores.py);
each test checks its own.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from tests.ingest.test_ingest_cli import VERSIQ
from tests.ingest.test_ingest_cli import env as _env
from tests.support.ingest import get_in_process, ingest_in_process, rejected_rows, store_versions
from tests.support.registry_stores import as_json, expected_prices, produce_prices
from versiq.ingest.config import load_config


def _versions(path: str) -> dict[str, list[tuple[int, str | None]]]:
    return {k: [(v.timestamp, v.value) for v in vs] for k, vs in store_versions(path).items()}


def _flags(stores: Any, store: str, value_format: str) -> list[str]:
    """The ``versiq ingest`` flags of a store of ``registry_stores``'s run (without the registry)."""
    return ["--warehouse", stores.warehouse, "--store", store, "--kafka-bootstrap", stores.bootstrap,
            "--topic", stores.topics[store], "--value-format", value_format, "--max-future", "none"]


def test_versiq_ingest_builds_a_store_from_avro_values(registry_stores, schema_registry):
    from versiq.cli.main import build_parser
    from versiq.ingest.commands import _pipeline_from_args

    # the topic's undecodable records are the next test's
    report = registry_stores.store_report("prices")
    assert report["read"] == 8 and report["accepted_latest"] + report["accepted_out_of_order"] == 5, report
    versions = _versions(registry_stores.path("prices"))
    assert {key: versions[key] for key in ("a", "b")} == expected_prices()
    # the value answers as JSON through the read path (GET /v1/stores/{store}/keys/{key})
    status, shown = get_in_process("--warehouse", registry_stores.warehouse, "--store", "prices", "--key", "a")
    assert status == 0, shown
    answer = json.loads(shown)
    assert answer["value"] == json.loads(as_json("a", 1100, stock=3)) and answer["timestamp"] == 2_000, answer
    # --value-format avro --schema-registry URL make the store the pipeline file made
    args = build_parser().parse_args(["ingest", *_flags(registry_stores, "prices", "avro"),
                                      "--schema-registry", schema_registry.url])
    [from_flags] = _pipeline_from_args(args).stores
    assert from_flags == registry_stores.spec("prices")


def test_records_that_cannot_be_decoded_are_rejected_and_json_schema_values_are_read(registry_stores):
    prices, events = registry_stores.store_report("prices"), registry_stores.store_report("events")
    assert {k: v for k, v in prices["rejected"].items() if v} == {"bad_value": 3}
    expected = expected_prices()
    expected["c"] = [(4_000, as_json("c", 1))]
    path = registry_stores.path("prices")
    assert _versions(path) == expected
    rejected = rejected_rows(path)
    assert {r["reason"] for r in rejected} == {"bad_value"} and {r["partition"] for r in rejected} == {0}
    details = {r["offset"]: r["detail"] for r in rejected}
    assert set(details) == {3, 4, 5}
    assert "magic byte 0" in details[3]
    assert "schema id 999999 is not in the schema registry (404)" in details[4]
    assert f"schema id {registry_stores.ids['prices']}: the payload is not Avro data" in details[5]
    assert {k: v for k, v in events["rejected"].items() if v} == {"bad_value": 1}
    assert _versions(registry_stores.path("events")) == {"x": [(5_000, '{"n":1,"at":"1970-01-01T00:00:05Z"}')]}
    [bad] = rejected_rows(registry_stores.path("events"))
    assert bad["reason"] == "bad_value"
    assert f"schema id {registry_stores.ids['events']}: the value is not JSON" in bad["detail"]


def test_a_registry_that_is_down_fails_the_run_with_nothing_committed_and_the_rerun_completes_it(
        spark, kafka_broker, schema_registry, registry_stores, tmp_path, monkeypatch, caplog):
    """A registry that is down is one whose port refuses connections: the failed run is given a
    registry URL on a port nothing listens on, the rerun the registry's (a store keeps no
    registry URL; that a restarted registry keeps its ids is the fixture's own test,
    tests/ingest/test_schema_registry.py). Both runs are ``versiq ingest`` with the same flags,
    made in this process by the CLI's command: its exit status and what it prints on stderr,
    and its log for the one line of the failure."""
    import logging

    from tests.ingest.test_kafka_registry_rows import recorded_pauses
    from tests.support.schema_registry import CCOMPAT_PATH
    from tests.support.server_process import free_ports
    from versiq import storage
    from versiq.ingest.records.registry import RETRY_PAUSES_S
    from versiq.layout import read_state

    # the first run: registry_stores' (the store's one record)
    path = registry_stores.path("outage")
    assert registry_stores.store_report("outage")["read"] == 1
    assert _versions(path) == {"z": [(500, as_json("z", 1))]}
    version = storage.delta_table(path).version()
    position = read_state(path, version).kafka
    produce_prices(kafka_broker, schema_registry, registry_stores.topics["outage"])

    flags = _flags(registry_stores, "outage", "avro")
    (closed,) = free_ports(1)
    down = f"http://127.0.0.1:{closed}{CCOMPAT_PATH}"
    pauses = recorded_pauses(monkeypatch)  # the run's tries, without waiting between them
    with caplog.at_level(logging.INFO):
        status, printed = ingest_in_process(spark, *flags, "--schema-registry", down)
    assert status == 1, printed
    assert "store outage: FAILED" in printed and "cannot be reached" in printed and down in printed, printed
    assert pauses == list(RETRY_PAUSES_S)
    # one line in the log, no traceback
    [failure] = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("versiq")]
    assert "store outage failed" in failure.getMessage() and "cannot be reached" in failure.getMessage()
    assert failure.exc_info is None and "Traceback" not in caplog.text, caplog.text
    # nothing committed: the store's version and position are those of the first run
    assert storage.delta_table(path).version() == version
    assert read_state(path, version).kafka == position
    assert not rejected_rows(path)

    # the rerun, with the registry reachable
    report_file = tmp_path / "report.json"
    status, printed = ingest_in_process(spark, *flags, "--schema-registry", schema_registry.url,
                                        "--report", str(report_file))
    assert status == 0, printed
    report = json.loads(report_file.read_text())["stores"]["outage"]
    assert report["read"] == 4 and not any(report["rejected"].values()), report
    assert _versions(path) == {**expected_prices(), "z": [(500, as_json("z", 1))]}


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
