"""Which offsets a run reads from a topic (``ingest.kafka.plan_read``), without a broker: the
position a store committed, new stores and partitions, offsets lost to retention, a recreated
topic; and the client options (what is refused, what the environment adds, what is never shown)."""

from __future__ import annotations

import pytest

from versiq.ingest.errors import UsageError
from versiq.ingest.kafka import KafkaSource, KafkaSourceError, TopicOffsets, plan_read
from versiq.layout import KafkaPosition, StoreState


def _offsets(earliest: list[int], end: list[int]) -> TopicOffsets:
    return TopicOffsets(partitions=len(end), earliest=dict(enumerate(earliest)), end=dict(enumerate(end)))


SOURCE = KafkaSource(bootstrap="127.0.0.1:9092", topic="prices")


def test_a_new_store_reads_from_the_earliest_offset_to_the_end() -> None:
    read = plan_read(SOURCE, None, _offsets([0, 5, 0], [10, 7, 0]))
    assert read.ranges == {0: (0, 10), 1: (5, 7), 2: (0, 0)}
    assert not read.empty and read.gaps == []


def test_a_new_store_with_latest_starts_at_the_end() -> None:
    source = KafkaSource(bootstrap="b:1", topic="prices", starting_offsets="latest")
    read = plan_read(source, None, _offsets([0, 0], [10, 7]))
    assert read.ranges == {0: (10, 10), 1: (7, 7)} and read.empty


def test_a_store_goes_on_from_its_committed_offsets_and_new_partitions_from_the_earliest() -> None:
    position = KafkaPosition(topic="prices", next_offsets={0: 4, 1: 7})
    read = plan_read(KafkaSource(bootstrap="b:1", topic="prices", starting_offsets="latest"), position,
                     _offsets([0, 0, 2], [9, 7, 5]))
    # latest applies to a new store only: a partition added later is read from its start
    assert read.ranges == {0: (4, 9), 1: (7, 7), 2: (2, 5)}
    after = read.position(position, "prices", run=3)
    assert after.next_offsets == {0: 9, 1: 7, 2: 5}


def test_offsets_lost_to_retention_fail_the_run_naming_partition_and_range() -> None:
    position = KafkaPosition(topic="prices", next_offsets={0: 4, 1: 2})
    with pytest.raises(KafkaSourceError, match=r"partition 1 offsets \[2, 6\)") as caught:
        plan_read(SOURCE, position, _offsets([0, 6], [9, 8]))
    assert "--allow-offset-gaps" in str(caught.value)


def test_allowed_gaps_are_recorded_and_the_run_reads_on() -> None:
    source = KafkaSource(bootstrap="b:1", topic="prices", allow_offset_gaps=True)
    position = KafkaPosition(topic="prices", next_offsets={0: 4, 1: 2})
    read = plan_read(source, position, _offsets([0, 6], [9, 8]))
    assert read.ranges == {0: (4, 9), 1: (6, 8)}
    assert read.gaps == [{"partition": 1, "from": 2, "to": 6}]
    after = read.position(position, "prices", run=5)
    assert after.gaps == [{"partition": 1, "from": 2, "to": 6, "run": 5}]
    # the position survives the state's JSON (it is committed with the data)
    state = StoreState(run=5, kafka=after)
    assert StoreState.from_json(state.to_json()).kafka == after


def test_a_recreated_topic_fails_the_run() -> None:
    with pytest.raises(KafkaSourceError, match="created again"):
        plan_read(SOURCE, KafkaPosition(topic="prices", next_offsets={0: 40}), _offsets([0], [3]))
    with pytest.raises(KafkaSourceError, match="created again"):
        plan_read(SOURCE, KafkaPosition(topic="prices", next_offsets={0: 1, 2: 1}), _offsets([0, 0], [3, 3]))


def test_a_recreated_topic_is_told_by_its_id_whatever_its_offsets() -> None:
    position = KafkaPosition(topic="prices", next_offsets={0: 5}, topic_id="old-id")
    longer = TopicOffsets(partitions=1, earliest={0: 0}, end={0: 8}, topic_id="new-id")
    with pytest.raises(KafkaSourceError, match=r"topic prices has id new-id but the store read topic id old-id: "
                                               "the topic was deleted and created again"):
        plan_read(SOURCE, position, longer)
    with pytest.raises(KafkaSourceError, match="has no topic id on this broker"):
        plan_read(SOURCE, position, TopicOffsets(partitions=1, earliest={0: 0}, end={0: 8}))
    same = plan_read(SOURCE, position, TopicOffsets(partitions=1, earliest={0: 0}, end={0: 8}, topic_id="old-id"))
    assert same.ranges == {0: (5, 8)}
    assert same.position(position, "prices", run=2).topic_id == "old-id"


def test_a_position_without_an_id_adopts_the_topics_id_and_keeps_it() -> None:
    legacy = StoreState.from_json(StoreState(run=1, kafka=KafkaPosition(topic="prices", next_offsets={0: 5}))
                                  .to_json())
    assert legacy.kafka is not None and legacy.kafka.topic_id is None
    assert "topicId" not in legacy.to_json()
    read = plan_read(SOURCE, legacy.kafka, TopicOffsets(partitions=1, earliest={0: 0}, end={0: 8}, topic_id="t-id"))
    after = read.position(legacy.kafka, "prices", run=2)
    assert after.topic_id == "t-id" and after.next_offsets == {0: 8}
    assert StoreState.from_json(StoreState(run=2, kafka=after).to_json()).kafka == after
    assert plan_read(SOURCE, None, TopicOffsets(partitions=1, earliest={0: 0}, end={0: 3},
                                                topic_id="t-id")).position(None, "prices", 1).topic_id == "t-id"


def test_client_options_come_from_the_source_and_the_environment_and_managed_ones_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = KafkaSource(bootstrap="b:1", topic="t", options={"security.protocol": "SASL_SSL",
                                                              "sasl.mechanism": "PLAIN"})
    monkeypatch.setenv("VERSIQ_KAFKA_SASL_JAAS_CONFIG", "secret-jaas")
    monkeypatch.setenv("VERSIQ_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    options = source.client_options()
    assert options == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                       "sasl.jaas.config": "secret-jaas", "bootstrap.servers": "b:1"}
    assert "secret" not in repr(source) and "SASL" not in repr(source)  # options never shown
    with pytest.raises(UsageError, match="group.id"):
        KafkaSource(bootstrap="b:1", topic="t", options={"group.id": "g"}).validate("store 's'")
    monkeypatch.setenv("VERSIQ_KAFKA_ENABLE_AUTO_COMMIT", "true")
    with pytest.raises(UsageError, match="enable.auto.commit"):
        source.client_options()


def test_error_messages_never_quote_a_client_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from versiq.ingest.kafka import redacted

    monkeypatch.setenv("VERSIQ_KAFKA_SSL_KEY_PASSWORD", "hunter2")
    source = KafkaSource(bootstrap="b:1", topic="t", options={"security.protocol": "SASL_SSL"})
    text = redacted("Invalid value hunter2 for ssl.key.password; protocol SASL_SSL at b:1", source)
    assert text == "Invalid value *** for ssl.key.password; protocol *** at b:1"


def test_a_store_reads_one_topic_for_life() -> None:
    from versiq.ingest.kafka import check_position

    check_position("store 's'", False, None, SOURCE)  # a new store
    check_position("store 's'", True, KafkaPosition(topic="prices"), SOURCE)
    with pytest.raises(UsageError, match="store 's' was built from files; it cannot switch to Kafka topic prices"):
        check_position("store 's'", True, None, SOURCE)
    with pytest.raises(UsageError, match="stream 'c' reads Kafka topic clicks, not prices"):
        check_position("stream 'c'", True, KafkaPosition(topic="clicks"), SOURCE)
