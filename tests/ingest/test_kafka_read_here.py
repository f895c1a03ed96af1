"""A small Kafka run read in the driver (``kafka.read_here``, the confluent-kafka client) and
decided by DuckDB gives exactly what Spark's Kafka source and Spark's decisions give: the same
random topics ingested both ways, run after run, on a real broker (and a real schema registry),
compare equal in stores, stream times, positions, reports and ``_rejected`` rows. Which client
settings keep a run on Spark's path (``kafka.driver_config``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.ingest.test_kafka_ingest import _changelog, _spec, new_topic
from tests.support.ingest import rejected_rows, store_versions, stream_times
from tests.support.registry_stores import PRICE, price
from tests.support.registry_stores import avro_wire as wire
from versiq.ingest.kafka import KafkaSource, driver_config
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.plan import PARSE_HERE_BYTES_ENV
from versiq.ingest.records.kafka_rows import KafkaFormat
from versiq.layout import read_state

DRIVER = "parse in the driver, decide with DuckDB, write with Spark (a small run)"
SPARK = "parse, decide and write with Spark (a small run)"


def _odd_records(rng: random.Random, partitions: int, base: int) -> list[dict[str, Any]]:
    """Records every rule rejects or treats apart: bad JSON, not UTF-8, a JSON ``null`` value,
    a negative timestamp, headers of every kind, an empty key."""
    headers = [("trace", "é"), ("bin", b"\xff\x00"), ("none", None), ("rep", "1"), ("rep", b"\xfe")]
    out = [
        {"key": "k1", "value": "{bad", "timestamp_ms": base + 1, "headers": headers},
        {"key": "k2", "value": b"\xff\xfe", "timestamp_ms": base + 2},
        {"key": "k3", "value": "null", "timestamp_ms": base + 3, "headers": [("h", "x")]},
        {"key": "", "value": "1", "timestamp_ms": base + 4},
        {"key": "k5", "value": '{"z": 1, "a": [1, 2.50, "é"]}', "timestamp_ms": base + 6,
         "headers": [("late", "?")]},
    ]
    for record in out:
        record["partition"] = rng.randrange(partitions)
    return out


def _ingest(spark, wh: str, specs: list[StoreSpec], monkeypatch, caplog, here: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """One run of ``specs`` into ``wh``, read in the driver (``here``) or by Spark: each store's
    report, without its seconds."""
    if here:
        monkeypatch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
    else:
        monkeypatch.setenv(PARSE_HERE_BYTES_ENV, "0")  # every run parses in Spark tasks
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        reports = run_ingest(spark, wh, specs).stores
    out = {}
    for name, report in reports.items():
        assert report.error is None, report.error
        out[name] = dataclasses.asdict(report)
        out[name].pop("seconds", None)
    if any(r["run"] for r in out.values()):
        assert (DRIVER if here else SPARK) in caplog.text, caplog.text
    return out


def _same(path: str, reference: str) -> None:
    assert store_versions(path) == store_versions(reference)
    assert stream_times(path) == stream_times(reference)
    state, ref_state = (read_state(p, DeltaTable(p).version()) for p in (path, reference))
    assert state.kafka == ref_state.kafka and state.max_offset == ref_state.max_offset
    plain = lambda rows: sorted(json.dumps({k: v for k, v in r.items() if k != "ingested_at"}, sort_keys=True)  # noqa: E731
                                 for r in rows)
    assert plain(rejected_rows(path)) == plain(rejected_rows(reference))


def _debezium_topic(kafka_broker) -> str:  # type: ignore[no-untyped-def]
    topic = new_topic(kafka_broker, "here-dbz", 2)
    env = lambda op, after, ts: json.dumps({"op": op, "after": after, "ts_ms": ts})  # noqa: E731
    kafka_broker.produce(topic, [
        {"key": '{"id": 1}', "value": env("c", {"id": 1, "t": 5}, 100), "partition": 0, "timestamp_ms": 1},
        {"key": '{"id": 2}', "value": env("r", {"id": 2, "t": 6}, 101), "partition": 1, "timestamp_ms": 1},
        {"key": '{"id": 1}', "value": env("d", None, 102), "partition": 0, "timestamp_ms": 1},
        {"key": '{"id": 1}', "value": None, "partition": 0, "timestamp_ms": 1},  # a delete marker: skipped
        {"key": None, "value": env("t", None, 103), "partition": 1, "timestamp_ms": 1},
        {"key": '{"id": 3}', "value": env("u", {"id": 3}, 104), "partition": 1, "timestamp_ms": 1},
    ])
    return topic


def _avro_topic(kafka_broker, schema_registry) -> str:  # type: ignore[no-untyped-def]
    topic = kafka_broker.new_topic("here-avro", partitions=2)
    v1 = schema_registry.register(f"{topic}-value", PRICE)
    good = wire(v1, PRICE, price("c", 1))
    kafka_broker.produce(topic, [
        {"key": "a", "value": wire(v1, PRICE, price("a", 1050, tags=["x"])), "partition": 0, "timestamp_ms": 1_000},
        {"key": "b", "value": wire(v1, PRICE, price("b", 5, "USD", note="é")), "partition": 1, "timestamp_ms": 1_001},
        {"key": "b", "value": None, "partition": 1, "timestamp_ms": 3_000},
        {"key": "d", "value": b'{"sku": "d"}', "partition": 0, "timestamp_ms": 4_001},
        {"key": "f", "value": good[:-2], "partition": 0, "timestamp_ms": 4_003},
    ])
    return topic


@pytest.mark.rule(19, 20, 21)
def test_topics_read_here_equal_sparks_read_run_after_run(spark, kafka_broker, schema_registry, tmp_path,
                                                          monkeypatch, caplog):
    """The same runs of four stores made twice, read in the driver and read by Spark: two random
    topics (1 and 3 partitions; changelogs with bad JSON, bytes that are not UTF-8, JSON null,
    empty keys, headers, late records, partition conflicts) over two runs, a Debezium topic
    (a skipped delete marker, a truncate) and an Avro topic of the schema registry (a tombstone,
    values not in the wire format, a truncated one): equal reports, stores, stream times,
    positions and rejections after every run."""
    rng = random.Random(3)
    randoms = {f"r{n}": (new_topic(kafka_broker, "here", n), n) for n in (1, 3)}
    specs = [_spec(name, kafka_broker, topic, history_retention_ms=50) for name, (topic, _n) in randoms.items()]
    specs += [_spec("d", kafka_broker, _debezium_topic(kafka_broker),
                    format=KafkaFormat(value_format="debezium", key_field="id")),
              _spec("p", kafka_broker, _avro_topic(kafka_broker, schema_registry),
                    format=KafkaFormat(value_format="avro", schema_registry=schema_registry.url))]
    here, there = str(tmp_path / "here"), str(tmp_path / "spark")
    for run in range(2):
        for topic, partitions in randoms.values():
            records = _changelog(rng, rng.randrange(20, 120), partitions, base=10_000 + 300 * run)
            records += _odd_records(rng, partitions, base=10_000 + 300 * run)
            rng.shuffle(records)
            kafka_broker.produce(topic, records)
        reports = [_ingest(spark, wh, specs, monkeypatch, caplog, here=wh == here) for wh in (here, there)]
        assert reports[0] == reports[1]
        for spec in specs:
            _same(os.path.join(here, spec.name), os.path.join(there, spec.name))
        if run == 0:
            assert reports[0]["d"]["skipped"]  # the delete marker
    for name in randoms:
        assert rejected_rows(os.path.join(here, name))  # the runs rejected records
    assert len(rejected_rows(os.path.join(here, "p"))) == 2


def test_client_settings_without_a_same_meaning_librdkafka_setting_keep_spark_s_read(spark, kafka_broker, tmp_path,
                                                                                    monkeypatch, caplog):
    source = lambda **options: KafkaSource(bootstrap="127.0.0.1:9", topic="t", options=options)  # noqa: E731
    config, why = driver_config(source(**{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                          "sasl.username": "u", "sasl.password": "secret-pw",
                                          "ssl.truststore.location": "/ca.pem", "ssl.truststore.type": "PEM",
                                          "ssl.endpoint.identification.algorithm": "",
                                          "isolation.level": "read_committed", "request.timeout.ms": "5000",
                                          "default.api.timeout.ms": "5000"}))
    assert config is not None and why == ""
    assert config["ssl.ca.location"] == "/ca.pem" and config["ssl.endpoint.identification.algorithm"] == "none"
    assert config["isolation.level"] == "read_committed" and config["socket.timeout.ms"] == "5000"
    assert driver_config(source())[0] == {"bootstrap.servers": "127.0.0.1:9", "isolation.level": "read_uncommitted",
                                          "socket.timeout.ms": "10000"}
    for options, reason in [({"sasl.jaas.config": "x"}, "sasl.jaas.config"),
                            ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}, "GSSAPI"),
                            ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "sasl.username"),
                            ({"security.protocol": "SSL", "ssl.truststore.location": "/t.jks"}, "JKS")]:
        config, why = driver_config(source(**options))
        assert config is None and reason in why and "secret" not in why, (options, why)
    # a run of such a source reads with Spark, and says why once
    topic = new_topic(kafka_broker, "here-jaas", 1)
    kafka_broker.produce(topic, [{"key": "a", "value": "1", "timestamp_ms": 1_000}])
    monkeypatch.setenv("VERSIQ_KAFKA_SASL_JAAS_CONFIG", "org.apache.kafka.common.security.plain.PlainLoginModule "
                       'required password="s3cr3t-value";')
    monkeypatch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
    wh = str(tmp_path / "wh")
    for value in ("1", "2"):
        kafka_broker.produce(topic, [{"key": "a", "value": value, "timestamp_ms": 2_000 + int(value)}])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="versiq.ingest"):
            assert run_ingest(spark, wh, [_spec("j", kafka_broker, topic)]).stores["j"].error is None
        assert SPARK in caplog.text and "s3cr3t" not in caplog.text
        assert ("sasl.jaas.config have no same-meaning setting in librdkafka" in caplog.text) == (value == "1")


@pytest.mark.slow
def test_a_broker_gone_mid_read_fails_the_read_here_and_the_rerun_completes_it(spark, kafka_broker, tmp_path,
                                                                               monkeypatch):
    """The driver's read of a planned range with the broker gone fails with one line naming the
    source once no record came for ``POLL_TIMEOUT_MS`` (shortened here), before anything is
    written; the rerun, the broker back, reads the same range."""
    from versiq.ingest import kafka

    monkeypatch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
    monkeypatch.setattr(kafka, "POLL_TIMEOUT_MS", 5_000)
    rng = random.Random(5)
    topic = new_topic(kafka_broker, "here-outage", 2)
    kafka_broker.produce(topic, _changelog(rng, 100, 2, base=10_000))
    spec = _spec("o", kafka_broker, topic)
    assert spec.kafka is not None
    read = kafka.plan_run(spark, "store 'o'", False, None, spec.kafka)
    kafka_broker.stop()
    try:
        with pytest.raises(kafka.KafkaSourceError, match=r"reading kafka:here-outage-\w+ from .* failed: no records"):
            kafka.read_here(spec.kafka, read, None)
    finally:
        kafka_broker.ensure_running()
    wh = str(tmp_path / "wh")
    assert not os.path.isdir(os.path.join(wh, "o"))
    report = run_ingest(spark, wh, [spec]).stores["o"]
    assert report.error is None and report.read == 103, report
    assert read_state(os.path.join(wh, "o"), DeltaTable(os.path.join(wh, "o")).version()).kafka.next_offsets == {
        p: end for p, (_start, end) in read.ranges.items()}
