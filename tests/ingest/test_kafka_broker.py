"""The ``kafka_broker`` fixture is a real Kafka broker: what is produced through it is read back by a
plain consumer with the partitions, offsets, timestamps, keys and values asked for; deleting records
raises the low watermark; a restart keeps the data; partitions can be added."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

from tests.support.kafka_broker import new_cluster_id


def _consume(bootstrap: str, topic: str, ends: dict[int, int], timeout: float = 30.0) -> list[Any]:
    """Every record of ``topic`` from each partition's start up to ``ends`` (no consumer group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        # From each log start, which delete_records may have raised: asking for offset 0 instead
        # would go through an "offset out of range" reset, which was seen to stall on a busy machine.
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        seen: list[Any] = []
        positions = {p: 0 for p in ends}
        deadline = time.monotonic() + timeout
        while any(positions[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"timed out reading {topic}: at {positions}, ends {ends}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            seen.append(msg)
            positions[partition] = offset + 1
        return seen
    finally:
        consumer.close()


def test_records_round_trip_with_partitions_offsets_timestamps_and_raw_bytes(kafka_broker):
    topic = kafka_broker.new_topic("roundtrip", partitions=3)
    records = [
        {"key": "a", "value": "1", "partition": 0, "timestamp_ms": 1_000},
        {"key": b"\xff\xfe\x00binary", "value": b"\x80\x81", "partition": 2, "timestamp_ms": 5_000},
        {"key": "a", "value": None, "partition": 0, "timestamp_ms": 3_000},  # a tombstone, older timestamp
        ("b", "2", 1, 1_700_000_000_000, [("h", b"\x00x"), ("empty", None)]),
        (None, b"no key", 2, 7_000),
    ]
    positions = kafka_broker.produce(topic, records)
    assert positions == [(0, 0), (2, 0), (0, 1), (1, 0), (2, 1)]
    assert kafka_broker.end_offsets(topic) == {0: 2, 1: 1, 2: 2}
    assert kafka_broker.start_offsets(topic) == {0: 0, 1: 0, 2: 0}

    got = {(m.partition(), m.offset()): m for m in _consume(kafka_broker.bootstrap, topic, {0: 2, 1: 1, 2: 2})}
    expected = {
        (0, 0): (b"a", b"1", 1_000), (0, 1): (b"a", None, 3_000),
        (1, 0): (b"b", b"2", 1_700_000_000_000),
        (2, 0): (b"\xff\xfe\x00binary", b"\x80\x81", 5_000), (2, 1): (None, b"no key", 7_000),
    }
    assert {pos: (m.key(), m.value(), m.timestamp()[1]) for pos, m in got.items()} == expected
    assert all(m.timestamp()[0] == TIMESTAMP_CREATE_TIME for m in got.values())
    assert got[(1, 0)].headers() == [("h", b"\x00x"), ("empty", None)]


def test_delete_records_raises_the_low_watermark(kafka_broker):
    topic = kafka_broker.new_topic("retention", partitions=2)
    kafka_broker.produce(topic, [(f"k{i}", f"v{i}", i % 2, 1_000 + i) for i in range(10)])
    assert kafka_broker.delete_records(topic, {0: 3}) == {0: 3}
    assert kafka_broker.start_offsets(topic) == {0: 3, 1: 0}
    assert kafka_broker.end_offsets(topic) == {0: 5, 1: 5}
    first = _consume(kafka_broker.bootstrap, topic, {0: 5})[0]
    assert (first.offset(), first.key()) == (3, b"k6")


def test_restart_keeps_ports_and_data(kafka_broker):
    topic = kafka_broker.new_topic("restart", partitions=2, config={"cleanup.policy": "compact"})
    kafka_broker.produce(topic, [("k", "before", 1, 2_000)])
    bootstrap, log_dir = kafka_broker.bootstrap, kafka_broker.log_dir
    try:
        kafka_broker.restart()
        assert (kafka_broker.bootstrap, kafka_broker.log_dir) == (bootstrap, log_dir)
        assert kafka_broker.end_offsets(topic) == {0: 0, 1: 1}
        kafka_broker.kill()
        assert not kafka_broker.is_running()
        kafka_broker.start()
        kafka_broker.produce(topic, [("k", "after", 1, 3_000)])
        got = _consume(kafka_broker.bootstrap, topic, {1: 2})
        assert [(m.offset(), m.value()) for m in got] == [(0, b"before"), (1, b"after")]
    finally:
        kafka_broker.ensure_running()


def test_add_partitions_grows_the_topic(kafka_broker):
    topic = kafka_broker.new_topic("grow", partitions=1)
    kafka_broker.add_partitions(topic, 4)
    assert kafka_broker.partitions(topic) == 4
    assert kafka_broker.produce(topic, [("k", "v", 3, 1_000)]) == [(3, 0)]
    assert kafka_broker.end_offsets(topic) == {0: 0, 1: 0, 2: 0, 3: 1}


def test_cluster_ids_never_start_with_a_dash():
    """``kafka-storage format -t -abc…`` reads such an id as an option and fails: one in 64 random
    ids did, and a CI run failed on it. Ids are made like Kafka's own, which skips them."""
    ids = [new_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
