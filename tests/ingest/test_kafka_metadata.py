"""What a run plans with (``kafka.topic_offsets``: partitions, earliest and end offsets, the
topic's id) is the same whichever client asks the broker, the confluent-kafka admin client
(``driver_topic_offsets``) or the Java client through the JVM (``java_topic_offsets``), on a
real broker: offsets of a multi-partition topic, a topic deleted and created again, the topic's
id in Java's text (which a store's position keeps) whatever its bytes, read_committed end
offsets; and both fail with the same one-line ``KafkaSourceError``."""

from __future__ import annotations

import logging
import re
import time
import uuid

import pytest

from tests.ingest.test_kafka_ingest import new_topic
from tests.support.server_process import free_ports
from versiq.ingest import kafka
from versiq.ingest.kafka import KafkaSource, KafkaSourceError, TopicOffsets, java_uuid
from versiq.ingest.spark import SparkOnDemand

#: A Java client setting without a same-meaning librdkafka one: its source keeps the JVM's client.
JAVA_ONLY = {"receive.buffer.bytes": "65536"}


def _both(spark, source: KafkaSource) -> TopicOffsets:  # type: ignore[no-untyped-def]
    java = kafka.java_topic_offsets(spark, source)
    here = kafka.driver_topic_offsets(source)
    assert here == java
    return here


def _records(partition: int, n: int) -> list[dict[str, object]]:
    return [{"key": f"k{partition}-{i}", "value": str(i), "partition": partition, "timestamp_ms": 1_000 + i}
            for i in range(n)]


def test_java_uuid_is_java_s_text_of_an_id() -> None:
    assert java_uuid(0, 1) == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert java_uuid(-1, -1) == "_____________________w"  # signed halves, as confluent-kafka gives them
    assert java_uuid(0xFBEF_0000_0000_0000, 0) == "--8AAAAAAAAAAAAAAAAAAA"  # librdkafka writes "++8A..."
    assert java_uuid(0xFFEF_0000_0000_0000, 0) == java_uuid(-0x0011_0000_0000_0000, 0)


def test_both_clients_give_the_same_offsets_and_id_and_see_a_recreated_topic(spark, kafka_broker):
    topic = new_topic(kafka_broker, "meta", 3)
    kafka_broker.produce(topic, _records(0, 7) + _records(1, 4))  # partition 2 stays empty
    kafka_broker.delete_records(topic, {0: 3})
    source = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic)
    first = _both(spark, source)
    assert (first.partitions, first.earliest, first.end) == (3, {0: 3, 1: 0, 2: 0}, {0: 7, 1: 4, 2: 0})
    assert first.topic_id is not None and re.fullmatch(r"[A-Za-z0-9_-]{22}", first.topic_id)
    kafka_broker.produce(topic, _records(2, 2))
    assert _both(spark, source) == TopicOffsets(3, {0: 3, 1: 0, 2: 0}, {0: 7, 1: 4, 2: 2}, first.topic_id)
    # deleted and created again, longer than before: only the id tells
    kafka_broker.recreate_topic(topic, 2, {"retention.ms": "-1"})
    kafka_broker.produce(topic, _records(0, 9))
    again = _both(spark, source)
    assert (again.partitions, again.earliest, again.end) == (2, {0: 0, 1: 0}, {0: 9, 1: 0})
    assert again.topic_id is not None and again.topic_id != first.topic_id


def test_topic_ids_with_every_base64_character_are_equal_in_both(spark, kafka_broker):
    """librdkafka writes an id in standard base64 (``+``, ``/``), Java in URL-safe base64
    (``-``, ``_``): a position one client's run committed must match the other's id. Topics are
    created until ids with both characters were seen (each id has one with odds of about 30%)."""
    seen: set[str] = set()
    for _ in range(60):
        topic = new_topic(kafka_broker, "ids", 1)
        topic_id = _both(spark, KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic)).topic_id
        assert topic_id is not None
        seen |= set(topic_id) & {"-", "_"}
        kafka_broker.delete_topic(topic)
        if seen == {"-", "_"}:
            break
    assert seen == {"-", "_"}


def test_read_committed_ends_at_the_last_stable_offset_in_both(spark, kafka_broker):
    from confluent_kafka import Producer

    topic = new_topic(kafka_broker, "txn", 2)
    kafka_broker.produce(topic, _records(0, 2))
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"versiq-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for record in _records(0, 3):
        producer.produce(topic, key=str(record["key"]), value=str(record["value"]), partition=0)
    assert producer.flush(30) == 0
    try:
        plain = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic)
        committed = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic,
                                options={"isolation.level": "read_committed"})
        assert _both(spark, plain).end == {0: 5, 1: 0}  # the open transaction's records too
        assert _both(spark, committed).end == {0: 2, 1: 0}  # up to the open transaction
    finally:
        producer.abort_transaction(30)


def test_both_clients_fail_with_the_same_one_line_errors(spark, kafka_broker, monkeypatch, capfd, caplog):
    monkeypatch.setattr(kafka, "METADATA_TIMEOUT_S", 3)

    def errors(source: KafkaSource) -> list[str]:
        out = []
        for ask in (lambda: kafka.java_topic_offsets(spark, source), lambda: kafka.driver_topic_offsets(source)):
            started = time.monotonic()
            with pytest.raises(KafkaSourceError) as caught:
                ask()
            assert time.monotonic() - started < 3 + 10
            assert "\n" not in str(caught.value)
            out.append(str(caught.value))
        return out

    missing = f"missing-{uuid.uuid4().hex[:8]}"
    assert errors(KafkaSource(bootstrap=kafka_broker.bootstrap, topic=missing)) == [
        f"topic {missing} does not exist on {kafka_broker.bootstrap}"] * 2
    (port,) = free_ports(1)
    with caplog.at_level(logging.DEBUG, logger="versiq.ingest"):
        for message in errors(KafkaSource(bootstrap=f"127.0.0.1:{port}", topic="t")):
            assert message.startswith(f"cannot reach Kafka at 127.0.0.1:{port} (topic t): "), message
        # librdkafka's lines are in the debug log, without any setting's value
        assert "librdkafka: FAIL [versiq-metadata#producer-" in caplog.text and "Connection refused" in caplog.text
        secret = KafkaSource(bootstrap="b:1", topic="t", options={"sasl.password": "s3cr3t-value"})
        kafka.ClientLog(secret).log(3, "%s [%s] %s", "SASL", "rdkafka#producer-9", "s3cr3t-value refused")
    assert "librdkafka: SASL [rdkafka#producer-9] *** refused" in caplog.text and "s3cr3t" not in caplog.text
    bad = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=missing, options={"security.protocol": "s3cr3t-protocol"})
    for message in errors(bad):
        assert message.startswith(f"cannot create a Kafka client for {kafka_broker.bootstrap}: ") and "s3cr3t" not in \
            message, message
    printed = capfd.readouterr()
    assert "rdkafka" not in printed.err + printed.out  # librdkafka's lines go to the debug log


def test_a_missing_topic_is_not_created_by_asking_for_it(tmp_path):
    """A broker that creates topics on request (``auto.create.topics.enable``) creates none when
    a run asks the metadata of one it does not have (an admin client would by default)."""
    from confluent_kafka.admin import AdminClient

    from tests.support.kafka_broker import KafkaBroker

    broker = KafkaBroker(work_dir=tmp_path / "kafka", extra_config={"auto.create.topics.enable": "true"}).start()
    try:
        source = KafkaSource(bootstrap=broker.bootstrap, topic="not-there")
        with pytest.raises(KafkaSourceError, match="topic not-there does not exist"):
            kafka.driver_topic_offsets(source)
        time.sleep(1)
        assert "not-there" not in AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics
    finally:
        broker.close()


def test_the_source_s_settings_pick_the_client_and_librdkafka_s_needs_no_session(spark, kafka_broker, monkeypatch):
    topic = new_topic(kafka_broker, "pick", 2)
    asked: list[str] = []
    for name in ("java_topic_offsets", "driver_topic_offsets"):
        real = getattr(kafka, name)
        monkeypatch.setattr(kafka, name, lambda *args, _real=real, _name=name: asked.append(_name) or _real(*args))
    plain = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic)
    java_only = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic, options=JAVA_ONLY)
    assert kafka.topic_offsets(spark, java_only) == kafka.topic_offsets(spark, plain)
    assert asked == ["java_topic_offsets", "driver_topic_offsets"]
    on_demand = SparkOnDemand()  # a CLI run's session: started by the first run that needs it
    read = kafka.plan_run(on_demand, "store 's'", False, None, plain)  # type: ignore[arg-type]
    assert read.ranges == {0: (0, 0), 1: (0, 0)} and read.topic_id is not None
    assert on_demand.running() is None


def test_both_clients_answer_right_after_the_broker_restarted(spark, kafka_broker):
    """A broker that has just restarted answers some requests with errors the Java clients
    retry (``UNKNOWN_LEADER_EPOCH``: its partitions' leaders are not loaded yet); confluent-kafka's
    metadata asks again as they do, within ``METADATA_TIMEOUT_S``."""
    topic = new_topic(kafka_broker, "restart", 3)
    kafka_broker.produce(topic, _records(0, 3) + _records(2, 1))
    source = KafkaSource(bootstrap=kafka_broker.bootstrap, topic=topic)
    before = _both(spark, source)
    kafka_broker.restart()
    assert kafka.driver_topic_offsets(source) == before
    assert kafka.java_topic_offsets(spark, source) == before


def test_errors_the_java_clients_retry_are_asked_again_until_the_timeout(monkeypatch):
    from confluent_kafka import KafkaError, KafkaException

    monkeypatch.setattr(kafka, "METADATA_TIMEOUT_S", 0.6)
    source = KafkaSource(bootstrap="b:1", topic="t")
    waits: list[float] = []

    def failing(*codes: int):  # type: ignore[no-untyped-def]
        left = list(codes)

        def request(wait: float) -> str:
            waits.append(wait)
            if left:
                raise KafkaException(KafkaError(left.pop(0)))
            return "answer"
        return request

    assert kafka._asked(failing(KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION), "x", source) \
        == "answer"
    assert len(waits) == 3 and all(0 < wait <= 0.6 for wait in waits)
    waits.clear()
    with pytest.raises(KafkaSourceError, match="^x: TOPIC_AUTHORIZATION_FAILED: "):  # not retried
        kafka._asked(failing(KafkaError.TOPIC_AUTHORIZATION_FAILED), "x", source)
    assert len(waits) == 1
    started = time.monotonic()
    with pytest.raises(KafkaSourceError, match="^x: UNKNOWN_LEADER_EPOCH: "):
        kafka._asked(failing(*[KafkaError.UNKNOWN_LEADER_EPOCH] * 100), "x", source)
    assert 0.3 < time.monotonic() - started < 0.6 + 0.5
