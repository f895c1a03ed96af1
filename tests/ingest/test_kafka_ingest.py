"""Stores and streams fed by Kafka topics (issue #14), on a real single-node KRaft broker
(``tests/support/kafka_broker.py``): the store equals the reference model fed what a consumer
reads from the topic, partition by partition in offset order; exactly once across runs,
crashes and a broker that goes away; offsets lost to retention; partitions added to the topic;
Debezium change events; a pipeline mixing Kafka and files. The model is fed the records a
real consumer reads back, so what the broker holds (not what the test meant to send) is the
reference."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import logging
import os
import random
import re
import signal
import subprocess
import time
import zlib
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ingest.test_ingest_cli import VERSIQ
from tests.ingest.test_ingest_cli import env as _env
from tests.support.e2e import model_key_json, serve_engine
from tests.support.ingest import (
    expressions,
    ingest_in_process,
    model_versions,
    rejected_rows,
    store_versions,
    stream_times,
)
from tests.support.processes import run_then_kill
from tests.support.reference import InRecord, ReferenceStore
from versiq.ingest.kafka import RECORD_BYTES_ESTIMATE, KafkaSource
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.plan import PARSE_HERE_BYTES_ENV
from versiq.ingest.records.kafka_rows import KafkaFormat
from versiq.ingest.spark import INTERPRETED_RUN_BYTES_ENV
from versiq.layout import read_state

H = 50  # history retention (ms) of the model tests: some records are late


def consume(broker: Any, topic: str) -> list[dict[str, Any]]:
    """Every record the topic holds now, as a consumer reads it (partition, offset order)."""
    from confluent_kafka import Consumer, TopicPartition

    ends = broker.end_offsets(topic)
    starts = broker.start_offsets(topic)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "versiq-test-reader",
                         "enable.auto.commit": False})
    out: list[dict[str, Any]] = []
    try:
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in ends if ends[p] > starts[p]])
        want = sum(ends[p] - starts[p] for p in ends)
        deadline = time.monotonic() + 60
        seen: dict[int, int] = {}
        while time.monotonic() < deadline and any(seen.get(p, starts[p] - 1) < ends[p] - 1 for p in ends
                                                  if ends[p] > starts[p]):
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seen[msg.partition()] = msg.offset()
            out.append({"key": msg.key(), "value": msg.value(), "partition": msg.partition(),
                        "offset": msg.offset(), "timestamp": msg.timestamp()[1]})
        assert len(out) <= want
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r["partition"], r["offset"]))


def model_records(records: list[dict[str, Any]]) -> list[InRecord]:
    """Well-formed JSON-valued records as the model's input (bad keys are counted apart)."""
    out = []
    for r in records:
        if r["key"] is None:
            continue
        try:
            key = r["key"].decode("utf-8")
        except UnicodeDecodeError:
            continue
        value = None if r["value"] is None else json.dumps(json.loads(r["value"]), separators=(",", ":"),
                                                           ensure_ascii=False)
        out.append(InRecord(f"p{r['partition']}", r["offset"], key, value, r["timestamp"], r["partition"],
                            r["offset"]))
    return out


def new_topic(broker: Any, prefix: str, partitions: int, **config: str) -> str:
    """A fresh topic that keeps its records: the tests' timestamps are small epoch ms (1970),
    which time-based retention would delete at its next check."""
    return broker.new_topic(prefix, partitions=partitions, config={"retention.ms": "-1", **config})


def _partition(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def _changelog(rng: random.Random, n: int, partitions: int, base: int, null_key: bool = True) -> list[dict[str, Any]]:
    """Out-of-order timestamps, tombstones, a key that changes partition, a binary key and a null
    key (not on compacted topics: the broker refuses a record without a key there)."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        key = f"k{rng.randrange(12)}"
        value = None if rng.random() < 0.15 else json.dumps({"n": i, "s": "é" * rng.randrange(3)})
        out.append({"key": key, "value": value, "partition": _partition(key, partitions),
                    "timestamp_ms": base + rng.randrange(400)})
    if null_key:
        out.append({"key": None, "value": "1", "partition": 0, "timestamp_ms": base + 5})
    out.append({"key": b"\xff\xfe-bin", "value": "2", "partition": partitions - 1, "timestamp_ms": base + 6})
    out.append({"key": "k1", "value": "3", "partition": (_partition("k1", partitions) + 1) % partitions,
                "timestamp_ms": base + 7})
    return out


def _spec(name: str, broker: Any, topic: str, **kwargs: Any) -> StoreSpec:
    fmt = kwargs.pop("format", KafkaFormat())
    source = KafkaSource(bootstrap=broker.bootstrap, topic=topic, format=fmt,
                         allow_offset_gaps=kwargs.pop("allow_offset_gaps", False))
    return StoreSpec(name=name, source=source.name, kafka=source, max_future_ms=None, **kwargs)


@pytest.mark.rule(19, 20, 21)
def test_a_three_partition_topic_equals_the_model_across_runs_and_over_http(spark, kafka_broker, tmp_path):
    rng = random.Random(14)
    # a compacted changelog topic, not cleaned during the test (the consumer reading it back after
    # each run must see what the run read; test_a_compacted_topic... has a cleaned one)
    topic = new_topic(kafka_broker, "model", 3, **{"cleanup.policy": "compact",
                                                  "min.compaction.lag.ms": str(10**12)})
    wh = str(tmp_path / "wh")
    spec = _spec("prices", kafka_broker, topic, history_retention_ms=H)
    model = ReferenceStore(history_retention_ms=H, partitions=3)
    fed: set[tuple[int, int]] = set()
    bad_keys = 0
    for chunk in range(3):  # three runs, each over what was produced since the last one
        kafka_broker.produce(topic, _changelog(rng, 40, 3, base=1_000 + 150 * chunk, null_key=False))
        report = run_ingest(spark, wh, [spec]).stores["prices"]
        assert report.error is None, report.error
        held = consume(kafka_broker, topic)
        new = [r for r in held if (r["partition"], r["offset"]) not in fed]
        fed |= {(r["partition"], r["offset"]) for r in new}
        counts = model.run(model_records(new))
        bad_keys += len(new) - len(model_records(new))
        assert report.read == len(new)
        assert report.accepted_latest == counts.accepted_latest
        assert report.accepted_out_of_order == counts.accepted_out_of_order
        assert report.tombstones == counts.tombstones
        assert {k: v for k, v in report.rejected.items() if v} == {
            k: v for k, v in {**counts.rejected, "bad_key": counts.rejected["bad_key"] + len(new)
                              - len(model_records(new))}.items() if v}
        assert report.kafka is not None and report.kafka["partitions"] == 3
    path = os.path.join(wh, "prices")
    keys = sorted({r.key for r in model_records(consume(kafka_broker, topic))})
    assert store_versions(path) == model_versions(model, keys)
    assert stream_times(path) == model.stream_time
    state = read_state(path, DeltaTable(path).version())
    assert state.kafka is not None and state.kafka.next_offsets == kafka_broker.end_offsets(topic)
    # a run with nothing new commits nothing
    again = run_ingest(spark, wh, [spec]).stores["prices"]
    assert again.run is None and again.snapshot == DeltaTable(path).version()
    # rejected records keep topic, partition, offset and the raw bytes (base64 when not UTF-8)
    rows = [r for r in rejected_rows(path) if r["reason"] == "bad_key"]
    assert len(rows) == bad_keys == 3
    assert all(r["source"] == f"kafka:{topic}" and r["offset"] is not None and r["line"] is None for r in rows)
    raws = [json.loads(r["raw"]) for r in rows]
    assert {"keyBase64": base64.b64encode(b"\xff\xfe-bin").decode(), "value": "2"} in raws
    conflicts = [r for r in rejected_rows(path) if r["reason"] == "partition_conflict"]
    assert conflicts and all(json.loads(r["raw"])["key"] == "k1" for r in conflicts)
    # the same answers over HTTP
    with serve_engine(wh) as (url, _engine), httpx.Client(base_url=url) as client:
        for key in keys:
            for as_of in (None, 1_100, 1_300, 1_500):
                status, expected = model_key_json(model, key, as_of)
                resp = client.get(f"/v1/stores/prices/keys/{key}", params={} if as_of is None else {"asOf": as_of})
                assert resp.status_code == status, (key, as_of, resp.text)
                if status == 200:
                    body = resp.json()
                    assert {k: body[k] for k in expected} == expected
                else:
                    assert resp.json()["type"].endswith(expected)


changelogs = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "dé", "e"]), st.one_of(st.none(), st.integers(0, 9)),
                                 st.integers(1, 300)), min_size=1, max_size=40)


@pytest.mark.rule(2, 3, 19, 20, 21)
@settings(max_examples=6)
@given(records=changelogs, data=st.data())
def test_random_changelogs_split_into_random_runs_agree_with_the_model(spark, kafka_broker, tmp_path_factory,
                                                                       records, data):
    """A random changelog produced to a topic in random chunks, one run after each: the store
    equals the model fed the whole topic in one run (rule 21), counts summed over the runs too."""
    partitions = data.draw(st.integers(1, 3), label="partitions")
    history = data.draw(st.sampled_from([0, 20, 100]), label="history retention")
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(records) - 1)), max_size=2), label="cuts"))
    topic = new_topic(kafka_broker, "property", partitions)
    wh = str(tmp_path_factory.mktemp("kafka-property"))
    spec = _spec("p", kafka_broker, topic, history_retention_ms=history)
    summed = {"read": 0, "latest": 0, "out_of_order": 0, "tombstones": 0, "late": 0}
    for chunk in (records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)], strict=True)):
        if not chunk:
            continue
        kafka_broker.produce(topic, [{"key": k, "value": None if v is None else str(v),
                                      "partition": _partition(k, partitions), "timestamp_ms": ts}
                                     for k, v, ts in chunk])
        # a run of a few records plans as a small run; as a large one it must write the same store
        with expressions(generated=data.draw(st.booleans(), label="generated code")):
            report = run_ingest(spark, wh, [spec]).stores["p"]
        assert report.error is None, report.error
        for name, value in (("read", report.read), ("latest", report.accepted_latest),
                            ("out_of_order", report.accepted_out_of_order), ("tombstones", report.tombstones),
                            ("late", report.rejected["late"])):
            summed[name] += value
    model = ReferenceStore(history_retention_ms=history, partitions=partitions)
    counts = model.run(model_records(consume(kafka_broker, topic)))
    assert summed == {"read": counts.read, "latest": counts.accepted_latest,
                      "out_of_order": counts.accepted_out_of_order, "tombstones": counts.tombstones,
                      "late": counts.rejected["late"]}
    path = os.path.join(wh, "p")
    assert store_versions(path) == model_versions(model, {k for k, _v, _t in records})
    assert stream_times(path) == model.stream_time


def test_a_run_of_few_records_plans_as_a_small_run(spark, kafka_broker, tmp_path, caplog, monkeypatch):
    """Offsets count records, not bytes: a run's size is its records times
    ``RECORD_BYTES_ESTIMATE``, so a micro-batch of a few thousand records plans as a small run
    (``ingest.spark.plans_for_input``: measured, continuous mode's runs of 3-5k records took
    3.0-3.5 s instead of 4.8-5 s), and one beyond the limit as a large run. A run of few records
    is read in the driver and decided by DuckDB (``kafka.read_here``); with
    ``VERSIQ_PARSE_HERE_BYTES=0`` Spark reads and decides it."""
    monkeypatch.delenv(INTERPRETED_RUN_BYTES_ENV, raising=False)
    monkeypatch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
    topic = new_topic(kafka_broker, "small", 1)
    wh = str(tmp_path / "wh")
    spec = _spec("s", kafka_broker, topic)
    kafka_broker.produce(topic, [{"key": f"k{i}", "value": str(i), "timestamp_ms": 1000 + i} for i in range(10)])
    with caplog.at_level(logging.DEBUG, logger="versiq.ingest"):
        assert run_ingest(spark, wh, [spec]).stores["s"].error is None
    # the run's plan: 10 records
    assert "parse in the driver, decide with DuckDB, write with Spark (a small run)" in caplog.text
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"  # the session's own, after the run
    caplog.clear()
    monkeypatch.setenv(INTERPRETED_RUN_BYTES_ENV, str(5 * RECORD_BYTES_ESTIMATE))  # 10 records are beyond it
    monkeypatch.setenv(PARSE_HERE_BYTES_ENV, "0")
    kafka_broker.produce(topic, [{"key": f"k{i}", "value": "70", "timestamp_ms": 2000 + i} for i in range(10)])
    with caplog.at_level(logging.DEBUG, logger="versiq.ingest"):
        report = run_ingest(spark, wh, [spec]).stores["s"]
    assert report.error is None and report.read == 10 and report.accepted_latest == 10
    assert "parse, decide and write with Spark" in caplog.text and "a small run" not in caplog.text
    assert [v.value for v in store_versions(os.path.join(wh, "s"))["k3"]] == ["3", "70"]


def _compacted(broker: Any, topic: str, produced: int, timeout: float = 90) -> list[dict[str, Any]]:
    """The topic's records once the log cleaner has compacted it (fewer records than produced)."""
    deadline = time.monotonic() + timeout
    while True:
        held = consume(broker, topic)
        if len(held) < produced:
            return held
        assert time.monotonic() < deadline, "the log cleaner did not compact the topic"
        time.sleep(1)


def test_a_compacted_topic_with_offsets_the_cleaner_removed(spark, kafka_broker, tmp_path):
    topic = new_topic(kafka_broker, "compacted", 1, **{"cleanup.policy": "compact", "segment.ms": "100",
                                                      "min.cleanable.dirty.ratio": "0.01",
                                                      "delete.retention.ms": "100"})
    records = [{"key": "first", "value": "0", "timestamp_ms": 999}]  # never updated: kept before the gap
    records += [{"key": f"k{i % 3}", "value": None if i == 7 else str(i), "timestamp_ms": 1_000 + i}
                for i in range(30)]
    kafka_broker.produce(topic, records)
    time.sleep(0.5)
    kafka_broker.produce(topic, [{"key": "roll", "value": "0", "timestamp_ms": 2_000}])  # closes the segment
    held = _compacted(kafka_broker, topic, len(records) + 1)
    offsets = [r["offset"] for r in held]
    assert offsets != list(range(offsets[0], offsets[0] + len(offsets)))  # the cleaner left gaps
    wh = str(tmp_path / "wh")
    report = run_ingest(spark, wh, [_spec("c", kafka_broker, topic)]).stores["c"]
    assert report.error is None and report.read == len(held)
    model = ReferenceStore(partitions=1)
    model.run(model_records(held))
    keys = {r.key for r in model_records(held)}
    assert store_versions(os.path.join(wh, "c")) == model_versions(model, keys)
    state = read_state(os.path.join(wh, "c"), DeltaTable(os.path.join(wh, "c")).version())
    assert state.kafka is not None and state.kafka.next_offsets == {0: 32}


def test_debezium_change_events_of_all_four_operations(spark, kafka_broker, tmp_path):
    topic = new_topic(kafka_broker, "dbserver1.inventory.customers", 1)

    def event(op: str, before: dict | None, after: dict | None, ts: int, schema: bool) -> str:
        payload = {"before": before, "after": after,
                   "source": {"version": "2.7.3.Final", "connector": "mysql", "name": "dbserver1",
                              "ts_ms": ts - 3, "snapshot": "true" if op == "r" else "false", "db": "inventory",
                              "table": "customers", "server_id": 223344, "file": "mysql-bin.000003", "pos": 154},
                   "op": op, "ts_ms": ts, "transaction": None}
        return json.dumps({"schema": {"type": "struct", "name": "dbserver1.inventory.customers.Envelope"},
                           "payload": payload} if schema else payload)

    def key(i: int) -> str:
        return json.dumps({"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]},
                           "payload": {"id": i}})

    anne = {"id": 1001, "first_name": "Anne", "email": "annek@noanswer.org"}
    sally = {"id": 1002, "first_name": "Sally", "email": "sally.thomas@acme.com"}
    kafka_broker.produce(topic, [
        {"key": key(1001), "value": event("r", None, anne, 1_000, True)},
        {"key": key(1002), "value": event("r", None, sally, 1_001, False)},
        {"key": key(1001), "value": event("u", anne, {**anne, "email": "anne@example.com"}, 2_000, True)},
        {"key": key(1003), "value": event("c", None, {"id": 1003, "first_name": "Ed"}, 2_500, False)},
        {"key": key(1002), "value": event("d", sally, None, 3_000, True)},
        {"key": key(1002), "value": None},  # the tombstone Debezium writes after a delete
        {"key": key(1003), "value": event("t", None, None, 3_500, False)},
    ])
    wh = str(tmp_path / "wh")
    spec = _spec("customers", kafka_broker, topic, format=KafkaFormat(value_format="debezium", key_field="id"))
    report = run_ingest(spark, wh, [spec]).stores["customers"]
    assert report.error is None, report.error
    assert report.read == 7 and report.skipped == {"skipped_delete_marker": 1}
    assert {k: v for k, v in report.rejected.items() if v} == {"bad_value": 1}
    assert report.tombstones == 1
    versions = store_versions(os.path.join(wh, "customers"))
    assert [(v.timestamp, v.value) for v in versions["1001"]] == [
        (1_000, json.dumps(anne, separators=(",", ":"))),
        (2_000, json.dumps({**anne, "email": "anne@example.com"}, separators=(",", ":")))]
    assert [(v.timestamp, v.value) for v in versions["1002"]] == [
        (1_001, json.dumps(sally, separators=(",", ":"))), (3_000, None)]
    assert [v.timestamp for v in versions["1003"]] == [2_500]


def test_offsets_deleted_by_retention_fail_the_run_unless_gaps_are_allowed(spark, kafka_broker, tmp_path):
    topic = new_topic(kafka_broker, "retention", 2)
    records = [{"key": f"k{i}", "value": str(i), "partition": i % 2, "timestamp_ms": 1_000 + i} for i in range(20)]
    kafka_broker.produce(topic, records[:8])
    wh = str(tmp_path / "wh")
    spec = _spec("r", kafka_broker, topic)
    assert run_ingest(spark, wh, [spec]).stores["r"].error is None
    path = os.path.join(wh, "r")
    before = DeltaTable(path).version()
    kafka_broker.produce(topic, records[8:])
    kafka_broker.delete_records(topic, {1: 7})  # partition 1 held offsets 0..9; the store read 0..3
    failed = run_ingest(spark, wh, [spec]).stores["r"]
    assert failed.error is not None and "partition 1 offsets [4, 7)" in failed.error, failed.error
    assert DeltaTable(path).version() == before  # nothing committed
    allowed = _spec("r", kafka_broker, topic, allow_offset_gaps=True)
    report = run_ingest(spark, wh, [allowed]).stores["r"]
    assert report.error is None and report.kafka is not None
    assert report.kafka["gaps"] == [{"partition": 1, "from": 4, "to": 7}]
    state = read_state(path, DeltaTable(path).version())
    assert state.kafka is not None and state.kafka.gaps == [{"partition": 1, "from": 4, "to": 7, "run": 2}]
    lost = {f"k{2 * o + 1}" for o in range(4, 7)}
    assert set(store_versions(path)) == {f"k{i}" for i in range(20)} - lost


@pytest.mark.rule(19)
def test_partitions_added_to_the_topic_get_their_own_stream_time(spark, kafka_broker, tmp_path):
    topic = new_topic(kafka_broker, "grow", 2)
    kafka_broker.produce(topic, [{"key": "a", "value": "1", "partition": 0, "timestamp_ms": 100_000},
                                 {"key": "b", "value": "1", "partition": 1, "timestamp_ms": 100_000}])
    wh = str(tmp_path / "wh")
    spec = _spec("g", kafka_broker, topic, history_retention_ms=1_000)
    assert run_ingest(spark, wh, [spec]).stores["g"].error is None
    kafka_broker.add_partitions(topic, 3)
    kafka_broker.produce(topic, [{"key": "c", "value": "1", "partition": 2, "timestamp_ms": 5},  # own stream time
                                 {"key": "a", "value": "2", "partition": 2, "timestamp_ms": 100_001},
                                 {"key": None, "value": "3", "partition": 2, "timestamp_ms": 100_002}])
    report = run_ingest(spark, wh, [spec]).stores["g"]
    assert report.error is None, report.error
    assert report.accepted_latest == 1 and report.rejected["partition_conflict"] == 1
    assert report.rejected["bad_key"] == 1
    path = os.path.join(wh, "g")
    # `versiq rejected` shows where in the topic each rejected record was, with its raw bytes
    listed = subprocess.run([*VERSIQ, "rejected", "--warehouse", wh, "--store", "g"], env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    rows = sorted((json.loads(line) for line in listed.stdout.splitlines()), key=lambda r: r["offset"])
    assert [(r["reason"], r["source"], r["partition"], r["offset"]) for r in rows] == [
        ("partition_conflict", f"kafka:{topic}", 2, 1), ("bad_key", f"kafka:{topic}", 2, 2)]
    assert json.loads(rows[1]["raw"]) == {"key": None, "value": "3"}
    table = subprocess.run([*VERSIQ, "rejected", "--warehouse", wh, "--store", "g", "--format", "table"],
                           env=_env(), capture_output=True, text=True, timeout=120)
    assert table.returncode == 0 and "partition 2 offset 2" in table.stdout, table.stderr
    assert stream_times(path) == {0: 100_000, 1: 100_000, 2: 5}
    with serve_engine(wh) as (url, _engine), httpx.Client(base_url=url) as client:
        assert client.get("/v1/stores/g").json()["partitions"] == 3
        assert client.get("/v1/stores/g/keys/c").json()["timestamp"] == 5


def test_rejected_records_show_their_headers_and_headers_change_no_stored_value(spark, kafka_broker, tmp_path):
    """Headers as docs/contract.md words them: by name, UTF-8 text, base64 for other bytes, null,
    every value of a repeated name in order; also in the raw of a record rejected after parsing
    (late), and a record without headers keeps the raw it always had. A second store of the same
    run takes its timestamps from a header (``timestamp_header``): the last of its name, RFC 3339
    or epoch ms, a tombstone's too; a record without it is ``missing_field``."""
    topic, stamped = new_topic(kafka_broker, "headers", 1), new_topic(kafka_broker, "stamped", 1)
    kafka_broker.produce(stamped, [
        {"key": "a", "value": '{"n": 1}', "timestamp_ms": 5, "headers": [("at", "1970-01-01T00:00:20Z")]},
        {"key": "a", "value": '{"n": 2}', "timestamp_ms": 6, "headers": [("at", "1"), ("at", "30000")]},
        {"key": "b", "value": '{"n": 3}', "timestamp_ms": 7},
        {"key": "a", "value": None, "timestamp_ms": 8, "headers": [("at", "40000")]},
    ])
    headers = [("trace", "é-1"), ("bin", b"\xff\x00"), ("none", None), ("rep", "1"), ("empty", b""),
               ("rep", b"\xfe"), ("rep", None)]
    kafka_broker.produce(topic, [
        {"key": "a", "value": '{"n": 1}', "timestamp_ms": 10_000, "headers": [("trace", "t-0"), ("bin", b"\xff")]},
        {"key": "b", "value": "{bad", "timestamp_ms": 10_001, "headers": headers},
        {"key": "c", "value": "2", "timestamp_ms": 1, "headers": [("h", "late")]},
        {"key": "d", "value": "{bad", "timestamp_ms": 10_002},
    ])
    wh = str(tmp_path / "wh")
    reports = run_ingest(spark, wh, [_spec("h", kafka_broker, topic, history_retention_ms=1_000),
                                     _spec("s", kafka_broker, stamped, format=KafkaFormat(timestamp_header="at"),
                                           history_retention_ms=10**9)]).stores
    assert reports["s"].error is None and {k: v for k, v in reports["s"].rejected.items() if v} == {
        "missing_field": 1}, reports["s"]
    assert [(v.timestamp, v.value) for v in store_versions(os.path.join(wh, "s"))["a"]] == [
        (20_000, '{"n":1}'), (30_000, '{"n":2}'), (40_000, None)]
    report = reports["h"]
    assert report.error is None, report.error
    assert report.accepted_latest == 1 and {k: v for k, v in report.rejected.items() if v} == {
        "bad_value": 2, "late": 1}
    assert [(v.timestamp, v.value) for v in store_versions(os.path.join(wh, "h"))["a"]] == [(10_000, '{"n":1}')]
    listed = subprocess.run([*VERSIQ, "rejected", "--warehouse", wh, "--store", "h"], env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    raws = {r["offset"]: r["raw"] for r in map(json.loads, listed.stdout.splitlines())}
    assert raws == {
        1: '{"key":"b","value":"{bad","headers":{"trace":"é-1","bin":{"base64":"/wA="},"none":null,'
           '"rep":["1",{"base64":"/g=="},null],"empty":""}}',
        2: '{"key":"c","value":"2","headers":{"h":"late"}}',
        3: '{"key":"d","value":"{bad"}',
    }


def _records(n: int, base: int, partitions: int = 1) -> list[dict[str, Any]]:
    return [{"key": f"k{base + i}", "value": str(base + i), "partition": i % partitions, "timestamp_ms": 1_000 + i}
            for i in range(n)]


#: The broker's metadata asked with the Java client through the JVM (``kafka.java_topic_offsets``):
#: a client setting that has no same-meaning librdkafka setting (``kafka.driver_config``) keeps a
#: source's runs on Java's client; without one they ask with confluent-kafka.
JAVA_METADATA_ENV = {"VERSIQ_KAFKA_RECEIVE_BUFFER_BYTES": "65536"}
METADATA_CLIENTS = {"librdkafka": {}, "java": JAVA_METADATA_ENV}


@pytest.mark.parametrize("client", list(METADATA_CLIENTS))
def test_a_recreated_topic_fails_the_next_run_whatever_its_length(spark, kafka_broker, tmp_path, client, caplog):
    """5 records ingested, the topic deleted and created again, 8 records produced: the new
    topic is longer than the store's position, so offsets alone cannot tell; its id does. The
    run fails with one line, exit 1, and commits nothing (its first 5 records are not skipped).
    The runs after the first ask the broker with ``client``, the first with the other one: the
    position's id is the same text whichever client asked it. The first run is the CLI's command
    in this process (no JVM start); so are the Java client's runs (whose own process would start
    a JVM to ask the broker), while librdkafka's are ``versiq ingest`` processes that start none."""
    topic = new_topic(kafka_broker, "recreated", 1)
    kafka_broker.produce(topic, _records(5, 0))
    wh, report = str(tmp_path / "wh"), tmp_path / "report.json"
    args = ["--warehouse", wh, "--store", "s", "--kafka-bootstrap", kafka_broker.bootstrap,
            "--topic", topic, "--max-future", "none", "--report", str(report)]
    other = next(env for name, env in METADATA_CLIENTS.items() if name != client)

    def ingest(*more: str, client_env: dict[str, str], as_process: bool = False) -> tuple[int, str]:
        if as_process:
            done = subprocess.run([*VERSIQ, "ingest", *args, *more], env={**_env(), **client_env},
                                  capture_output=True, text=True, timeout=300)
            return done.returncode, done.stderr
        with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO, logger="versiq"):
            for name, value in client_env.items():
                patch.setenv(name, value)
            caplog.clear()
            status, printed = ingest_in_process(spark, *args, *more)
        return status, printed + "\n".join(r.getMessage() for r in caplog.records)

    status, printed = ingest(client_env=other)
    assert status == 0, printed
    path = os.path.join(wh, "s")
    before = DeltaTable(path).version()
    as_process = client == "librdkafka"  # a process that asks librdkafka starts no JVM
    status, printed = ingest("--log-level", "info", client_env=METADATA_CLIENTS[client], as_process=as_process)
    assert status == 0 and f"no new records in kafka:{topic}" in printed, printed
    kafka_broker.recreate_topic(topic, 1, {"retention.ms": "-1"})
    kafka_broker.produce(topic, _records(8, 100))
    status, printed = ingest(client_env=METADATA_CLIENTS[client], as_process=as_process)
    assert status == 1, printed
    failed = [line for line in printed.splitlines() if line.startswith("store s: FAILED")]
    assert len(failed) == 1 and f"topic {topic} has id" in failed[0], printed
    assert "deleted and created again" in failed[0], printed
    assert DeltaTable(path).version() == before  # nothing committed
    assert set(store_versions(path)) == {f"k{i}" for i in range(5)}


@pytest.mark.parametrize("client", list(METADATA_CLIENTS))
@pytest.mark.parametrize("partitions, produced", [(1, 5), (2, 2), (2, 0)],
                         ids=["fewer-partitions", "shorter", "empty"])
def test_a_recreated_topic_of_any_shape_fails_every_run(spark, kafka_broker, tmp_path, partitions, produced, client,
                                                        monkeypatch):
    """A store of a 2-partition topic that read 3 records per partition; the topic is created
    again with fewer partitions, or fewer records, or none: every run fails, none commits (the
    broker asked with either client)."""
    for name, value in METADATA_CLIENTS[client].items():
        monkeypatch.setenv(name, value)
    topic = new_topic(kafka_broker, "reshaped", 2)
    kafka_broker.produce(topic, _records(6, 0, partitions=2))
    wh = str(tmp_path / "wh")
    spec = _spec("s", kafka_broker, topic)
    assert run_ingest(spark, wh, [spec]).stores["s"].error is None
    path = os.path.join(wh, "s")
    before = DeltaTable(path).version()
    kafka_broker.recreate_topic(topic, partitions, {"retention.ms": "-1"})
    kafka_broker.produce(topic, _records(produced, 100, partitions))
    for _ in range(2):  # a failed run adopts nothing: the next one fails too
        error = run_ingest(spark, wh, [spec]).stores["s"].error
        assert error is not None and "deleted and created again" in error, error
        assert "\n" not in error
        assert DeltaTable(path).version() == before


@pytest.mark.parametrize("client", list(METADATA_CLIENTS))
def test_a_stream_of_a_recreated_topic_fails_too(spark, kafka_broker, tmp_path, client, monkeypatch):
    """A stream keeps the topic's id in its position as a store does: 2 records appended, the
    topic created again with 3, the run fails and appends nothing (either client)."""
    from versiq.ingest.config import Pipeline
    from versiq.ingest.run import run_pipeline
    from versiq.ingest.streams import StreamSpec
    from versiq.query.history import commits

    for name, value in METADATA_CLIENTS[client].items():
        monkeypatch.setenv(name, value)
    topic = new_topic(kafka_broker, "restream", 1)
    kafka_broker.produce(topic, _records(2, 0))
    source = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic)
    pipeline = Pipeline(stores=[], streams=[StreamSpec("c", source.name, max_future_ms=None, kafka=source)])
    wh = str(tmp_path / "wh")
    assert run_pipeline(spark, wh, pipeline).streams["c"].appended == 2
    path = os.path.join(wh, "c")
    state = read_state(path, DeltaTable(path).version())
    assert state.kafka is not None and state.kafka.topic_id is not None
    before = DeltaTable(path).version()
    # the history names the topic's id with the position (GET .../history)
    assert commits(path, before)[0].kafka == {"topic": topic, "topicId": state.kafka.topic_id, "nextOffsets": {"0": 2}}
    kafka_broker.recreate_topic(topic, 1, {"retention.ms": "-1"})
    kafka_broker.produce(topic, _records(3, 100))
    error = run_pipeline(spark, wh, pipeline).streams["c"].error
    assert error is not None and "deleted and created again" in error, error
    assert DeltaTable(path).version() == before


def _same_store(path: str, reference: str) -> None:
    assert store_versions(path) == store_versions(reference)
    assert stream_times(path) == stream_times(reference)
    assert (read_state(path, DeltaTable(path).version()).kafka
            == read_state(reference, DeltaTable(reference).version()).kafka)
    by = lambda r: (r["partition"], r["offset"], r["reason"])  # noqa: E731
    committed = read_state(path, DeltaTable(path).version()).run
    assert sorted(map(by, (r for r in rejected_rows(path) if r["run"] <= committed))) == \
        sorted(map(by, rejected_rows(reference)))


@pytest.mark.slow
def test_sigkill_at_several_moments_then_rerun_equals_an_uninterrupted_run(spark, kafka_broker, tmp_path):
    rng = random.Random(99)
    topic = new_topic(kafka_broker, "crash", 3)
    kafka_broker.produce(topic, _changelog(rng, 300, 3, base=10_000))
    # moments: during start-up, while reading the topic, between the side tables and the store commit
    moments = [(None, 4.0 + rng.random() * 4), ("run 1 over", rng.random()), ("committing run 1", 0.0)]

    def args(i: int) -> list[str]:
        return ["ingest", "--warehouse", str(tmp_path / f"wh{i}"), "--store", "c", "--kafka-bootstrap",
                kafka_broker.bootstrap, "--topic", topic, "--history-retention", str(H), "--max-future", "none"]

    def kill(i: int) -> None:
        run_then_kill([*VERSIQ, *args(i), "--log-level", "info"], _env(), *moments[i])

    # the three runs are killed at once (each watched by a thread of its own: most of their time
    # is their JVMs' start) while this process makes the reference run
    with concurrent.futures.ThreadPoolExecutor(len(moments)) as pool:
        killed = [pool.submit(kill, i) for i in range(len(moments))]
        reference = str(tmp_path / "ref")
        assert run_ingest(spark, reference, [_spec("c", kafka_broker, topic, history_retention_ms=H)]).stores["c"] \
            .error is None
        for future in killed:
            future.result(timeout=300)
    ref = os.path.join(reference, "c")
    for i in range(len(moments)):
        wh = str(tmp_path / f"wh{i}")
        if i == 0:  # the CLI's own rerun once (its arguments are the reference's spec), its
            # command in this process (no JVM start of ~8 s) ...
            status, printed = ingest_in_process(spark, *args(i)[1:])
            assert status == 0, printed
        else:  # ... then the same run as the reference's spec
            report = run_ingest(spark, wh, [_spec("c", kafka_broker, topic, history_retention_ms=H)]).stores["c"]
            assert report.error is None, report.error
        _same_store(os.path.join(wh, "c"), ref)


@pytest.mark.slow
def test_the_broker_going_away_mid_run_never_leaves_a_partial_commit(spark, kafka_broker, tmp_path):
    rng = random.Random(7)
    topic = new_topic(kafka_broker, "outage", 2)
    kafka_broker.produce(topic, _changelog(rng, 200, 2, base=10_000))
    reference = str(tmp_path / "ref")
    assert run_ingest(spark, reference, [_spec("o", kafka_broker, topic)]).stores["o"].error is None
    wh = str(tmp_path / "wh")
    args = [*VERSIQ, "ingest", "--warehouse", wh, "--store", "o", "--kafka-bootstrap", kafka_broker.bootstrap,
            "--topic", topic, "--max-future", "none", "--log-level", "info"]
    # the Kafka clients' timeouts through VERSIQ_KAFKA_* (10 s and 15 s by default, kafka.CLIENT_TIMEOUTS):
    # the run still fails on the broker that went away, after 2 x 5 s of offset requests, not 2 x 15 s
    short = {"VERSIQ_KAFKA_REQUEST_TIMEOUT_MS": "5000", "VERSIQ_KAFKA_DEFAULT_API_TIMEOUT_MS": "5000"}
    proc = subprocess.Popen(args, env={**_env(), **short}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "run 1 over" in line:  # it has asked the broker for offsets and starts reading
                kafka_broker.stop()
                break
        rest = proc.stderr.read()
        code = proc.wait(timeout=300)
    finally:
        kafka_broker.ensure_running()
    path = os.path.join(wh, "o")
    if code != 0:  # failed cleanly: no store commit at all
        assert "FAILED" in rest or "error" in rest.lower(), rest
        assert not os.path.isdir(os.path.join(path, "_delta_log"))
    # the rerun in the session's Spark (the spec the CLI's arguments make; no JVM start)
    report = run_ingest(spark, wh, [_spec("o", kafka_broker, topic)]).stores["o"]
    assert report.error is None, report.error
    _same_store(path, os.path.join(reference, "o"))


def test_a_pipeline_mixes_kafka_and_file_sources_with_derived_tables(spark, kafka_broker, tmp_path):
    from versiq.ingest.config import load_config
    from versiq.ingest.run import run_pipeline

    orders = new_topic(kafka_broker, "orders", 2)
    clicks = new_topic(kafka_broker, "clicks", 1)
    kafka_broker.produce(orders, [{"key": f"o{i}", "value": json.dumps({"customer": f"c{i % 2}", "amount": i}),
                                   "partition": i % 2, "timestamp_ms": 1_000 + i} for i in range(6)])
    kafka_broker.produce(clicks, [{"key": "c0", "value": None, "timestamp_ms": 1_500},
                                  {"key": "c1", "value": '"home"', "timestamp_ms": 1_600}])
    src = tmp_path / "customers"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"key": f"c{i}", "value": {"name": f"N{i}"}, "timestamp": 500})
                                         + "\n" for i in range(2)))
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"""
stores:
  - name: orders
    source: {{kafka: {{bootstrap: "{kafka_broker.bootstrap}", topic: {orders}}}}}
    max_future: none
  - name: customers
    source: customers/
streams:
  - name: clicks
    source:
      kafka: {{bootstrap: "{kafka_broker.bootstrap}", topic: {clicks}, value_format: json}}
    max_future: none
tables:
  - name: big_orders
    from: orders
    filter: "value.amount > 2"
""")
    wh = str(tmp_path / "wh")
    pipeline = load_config(str(config), wh)
    report = run_pipeline(spark, wh, pipeline)
    assert not report.failed, report.to_json()
    assert report.stores["orders"].read == 6 and report.stores["customers"].read == 2
    assert report.streams["clicks"].appended == 2 and report.streams["clicks"].kafka is not None
    def live(table: str) -> set[str]:  # a filter emits a tombstone for a record it drops (rule 13)
        return {k for k, vs in store_versions(os.path.join(wh, table)).items() if vs[-1].value is not None}

    assert live("big_orders") == {"o3", "o4", "o5"}
    kafka_broker.produce(orders, [{"key": "o9", "value": json.dumps({"customer": "c0", "amount": 9}),
                                   "partition": 1, "timestamp_ms": 2_000}])
    again = run_pipeline(spark, wh, pipeline)
    assert not again.failed and again.stores["orders"].read == 1 and again.streams["clicks"].run is None
    assert live("big_orders") == {"o3", "o4", "o5", "o9"}


@pytest.mark.slow
def test_continuous_mode_makes_produced_records_visible_while_serving(kafka_broker, tmp_path):
    topic = new_topic(kafka_broker, "live", 2)
    kafka_broker.produce(topic, [{"key": "a", "value": "1", "timestamp_ms": 1_000}])
    wh = str(tmp_path / "wh")
    proc = subprocess.Popen(
        [*VERSIQ, "ingest", "--warehouse", wh, "--store", "live", "--kafka-bootstrap", kafka_broker.bootstrap,
         "--topic", topic, "--continuous", "--trigger-interval", "500ms", "--max-future", "none"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 180
        while not os.path.isdir(os.path.join(wh, "live", "_delta_log")):
            assert proc.poll() is None and time.monotonic() < deadline, "the first run did not commit"
            time.sleep(0.5)
        with serve_engine(wh, refresh_interval_s=0.5) as (url, _engine), httpx.Client(base_url=url) as client:
            for i, key in enumerate(("b", "c")):
                kafka_broker.produce(topic, [{"key": key, "value": str(i), "timestamp_ms": 2_000 + i}])
                deadline = time.monotonic() + 120
                while client.get(f"/v1/stores/live/keys/{key}").status_code != 200:
                    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                    assert time.monotonic() < deadline, f"{key} did not become visible"
                    time.sleep(0.3)
            assert client.get("/v1/stores/live/keys/a").json()["value"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, proc.stderr.read() if proc.stderr else ""


def test_kafka_usage_errors_exit_2_before_any_spark(tmp_path):
    wh = str(tmp_path / "wh")
    cases = [
        (["--store", "s", "--kafka-bootstrap", "127.0.0.1:1"], "--kafka-bootstrap and --topic"),
        (["--store", "s", "--kafka-bootstrap", "127.0.0.1:1", "--topic", "t", "--source", "x"], "not both"),
        (["--store", "s", "--kafka-bootstrap", "127.0.0.1:1", "--topic", "t", "--partitions", "3"], "topic's"),
        (["--store", "s", "--kafka-bootstrap", "127.0.0.1:1", "--topic", "t", "--timestamp-header", "at",
          "--timestamp-field", "a"], "not both"),
    ]
    for extra, message in cases:
        result = subprocess.run([*VERSIQ, "ingest", "--warehouse", wh, *extra], env=_env(), capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2 and message in result.stderr, (extra, result.stderr)


def test_timestamp_header_in_a_pipeline_file(tmp_path):
    """``timestamp_header`` of a Kafka source in a pipeline file; with ``timestamp_field`` it is
    a usage error naming the source."""
    from versiq.ingest.config import load_config
    from versiq.ingest.errors import UsageError

    config = tmp_path / "pipeline.yaml"
    source = '{kafka: {bootstrap: "127.0.0.1:1", topic: t, timestamp_header: event-time%s}}'
    config.write_text(f"stores:\n  - name: s\n    source: {source % ''}\n")
    store = load_config(str(config), str(tmp_path / "wh")).stores[0]
    assert store.kafka is not None and store.kafka.format.timestamp_header == "event-time"
    config.write_text(f"stores:\n  - name: s\n    source: {source % ', timestamp_field: at'}\n")
    with pytest.raises(UsageError, match="timestamp_field .* or timestamp_header .*, not both"):
        load_config(str(config), str(tmp_path / "wh"))


def test_client_settings_are_used_and_never_logged_or_reported(kafka_broker, tmp_path):
    """A secret given as a VERSIQ_KAFKA_* variable reaches the Kafka clients (a bad value of a
    real setting fails the run) but appears in no log line and no report, even at debug level."""
    topic = new_topic(kafka_broker, "secret", 1)
    kafka_broker.produce(topic, [{"key": "a", "value": "1", "timestamp_ms": 1_000}])
    wh, report = str(tmp_path / "wh"), tmp_path / "report.json"
    args = [*VERSIQ, "ingest", "--warehouse", wh, "--store", "s", "--kafka-bootstrap", kafka_broker.bootstrap,
            "--topic", topic, "--report", str(report), "--log-level", "debug"]
    secret = "org.apache.kafka.common.security.plain.PlainLoginModule required password=\"s3cr3t-value\";"
    ok = subprocess.run(args, env={**_env(), "VERSIQ_KAFKA_SASL_JAAS_CONFIG": secret}, capture_output=True,
                        text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "s3cr3t" not in ok.stderr + ok.stdout + report.read_text()
    # a one-shot run's JVM ends with the run: C1 only (ingest/spark.py, SHORT_LIVED_JIT_OPTION)
    assert re.search(r"driver JVM options: .*-XX:TieredStopAtLevel=1", ok.stderr), ok.stderr
    bad = subprocess.run(args, env={**_env(), "VERSIQ_KAFKA_SECURITY_PROTOCOL": "s3cr3t-protocol"},
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "store s: FAILED" in bad.stderr, bad.stderr
    assert "s3cr3t" not in bad.stderr + bad.stdout + report.read_text()
