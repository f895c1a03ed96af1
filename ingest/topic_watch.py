"""Continuous mode's wake-up for Kafka topics: a consumer that says when records land.

A consumer (confluent-kafka, the source's own librdkafka settings: ``kafka.driver_config``) is
assigned every partition of each watched topic, at the partition's end offset when the watch
starts, in no consumer group and committing nothing. Each record it receives says that a run is
due; the records themselves are dropped: what a run reads is decided by the store's position,
committed with its data, and the broker's end offsets when the run starts (``kafka.plan_read``),
exactly as without the watch. The broker answers a consumer's fetch as soon as a record is
there, so a run starts within milliseconds of a record landing; while nothing arrives the
consumer's fetch waits at the broker (docs/benchmarks.md, "A topic's records wake the runs").

Why this is exact: the end offsets asked at the start of the watch come before the first run,
which reads everything up to the end offsets it asks itself; from then on every record lands
after one of those and is received, so a record a run did not read wakes a later one. A record
received just after a run started may be one that run read already: the next run then finds
little or nothing new, which costs one cheap run, never a record.

New partitions are found by asking the topic's metadata every ``PARTITIONS_RECHECK_S`` and are
watched from their first offset. A consumer that cannot be created (a setting librdkafka
refuses) or whose topic cannot be asked raises ``KafkaSourceError``; errors while consuming (a
broker that restarts) are the client's to retry, logged at debug level.

A topic whose client settings librdkafka cannot take (``watchable`` is False: ``sasl.jaas.config``,
a JKS store, GSSAPI...) is polled instead (``TopicPolls``): its end offsets are asked with the Java
Kafka client the runs use for it, through the session's JVM, every watch interval, and a change
since the last ask says that a run is due. The same argument makes it exact: the ends asked
before the first run come before what it reads, and a record that lands later moves an end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from versiq.ingest.kafka import (
    METADATA_TIMEOUT_S,
    ClientLog,
    KafkaSource,
    KafkaSourceError,
    drain,
    driver_config,
    java_error,
    java_metadata_consumer,
    java_partitions,
    metadata_client,
    redacted,
    topic_offsets_at,
    topic_partitions,
)

log = logging.getLogger("versiq.ingest")

#: How often the watched topics' partitions are asked again (a topic that gained partitions).
PARTITIONS_RECHECK_S = 10.0
#: The watch's consumer settings over the source's: no consumer group and nothing committed;
#: librdkafka fetches until one record waits to be taken (its default: 100,000 records or 64 MB)
#: and then checks the queue every 10 ms without asking the broker, so a busy topic costs the
#: broker no fetch per record and this process no record it does not need. (The partitions are
#: not paused instead: librdkafka resumes fetching a paused partition late.)
WATCH_CONSUMER = {"group.id": "versiq-watch", "enable.auto.commit": False, "enable.auto.offset.store": False,
                  "auto.offset.reset": "latest", "queued.min.messages": 1, "fetch.queue.backoff.ms": 10}


def cannot_watch(source: KafkaSource, why: str) -> KafkaSourceError:
    """The one-line error of a topic's watch that cannot ask the broker (credentials redacted)."""
    return KafkaSourceError(redacted(f"cannot watch {source.name} at {source.bootstrap}: {why}", source))


def watchable(source: KafkaSource) -> bool:
    """Whether ``source`` can be watched by a consumer in this process: its settings all have a
    same-meaning librdkafka setting (``kafka.driver_config``)."""
    return driver_config(source)[0] is not None


class TopicChanges:
    """Records landing in the topics of ``sources`` (module docstring). ``wait(timeout_s)`` is
    True when a record landed in a topic since the watch started or its last ``rearm()``, which
    a run calls before it starts: the run reads what landed so far, and the watch goes on from
    each partition's end offset. ``close()`` closes the consumers."""

    def __init__(self, sources: Sequence[KafkaSource]) -> None:
        self._watches: list[_TopicWatch] = []
        try:
            for source in sources:
                self._watches.append(_TopicWatch(source))
        except BaseException:
            self.close()
            raise
        self._next_recheck = time.monotonic() + PARTITIONS_RECHECK_S

    def wait(self, timeout_s: float) -> bool:
        if time.monotonic() >= self._next_recheck:
            self._next_recheck = time.monotonic() + PARTITIONS_RECHECK_S
            for watch in self._watches:
                watch.add_new_partitions()
        if any(watch.landed for watch in self._watches):
            return True
        share = timeout_s / len(self._watches)
        return any([watch.received(share) for watch in self._watches])

    def rearm(self) -> None:
        for watch in self._watches:  # every topic: the run reads each up to its end offsets
            watch.rearm()

    def close(self) -> None:
        for watch in self._watches:
            watch.close()


class _TopicWatch:
    """One topic's consumer (``TopicChanges``, ``WATCH_CONSUMER``): ``landed`` once a record
    was taken, until ``rearm``."""

    def __init__(self, source: KafkaSource) -> None:
        from confluent_kafka import Consumer, KafkaException

        config, why = driver_config(source)
        if config is None:
            raise ValueError(f"{source.name}: {why}")
        self.source = source
        self.landed = False
        consumer_config: dict[str, Any] = {**config, **WATCH_CONSUMER, "error_cb": self._on_error,
                                           "logger": ClientLog(source),  # a broker that is down: debug lines
                                           "client.id": config.get("client.id", "versiq-watch")}
        try:
            self._consumer = Consumer(consumer_config)
        except (KafkaException, ValueError) as exc:
            raise KafkaSourceError(redacted(f"cannot create a Kafka client for {source.bootstrap}: {exc}",
                                            source)) from None
        self._config = config
        self._partitions: set[int] = set()
        try:
            self._admin = metadata_client(source, config)
            self._assign(self._topic_partitions(), at_end=True)
        except BaseException:
            self._consumer.close()
            raise

    def _on_error(self, error: Any) -> None:
        log.debug("%s", redacted(f"{self.source.name}: watch: {error}", self.source))

    def _failed(self, exc: BaseException) -> KafkaSourceError:
        return cannot_watch(self.source, str(exc))

    def _topic_partitions(self) -> set[int]:
        from confluent_kafka import KafkaException

        try:
            return set(topic_partitions(self._admin, self.source, METADATA_TIMEOUT_S))
        except (KafkaException, KafkaSourceError) as exc:
            raise self._failed(exc) from None
        finally:
            drain(self._admin)  # its log lines wait for a poll, even while no run rearms the watch

    def _ends(self, partitions: set[int]) -> dict[int, int]:
        """The end offset of each of ``partitions`` now, as a run asks it
        (``kafka.topic_offsets_at``: the last stable offset under read_committed, where a
        partition's high watermark may be past the records of an open transaction)."""
        import concurrent.futures

        from confluent_kafka import KafkaException
        from confluent_kafka.admin import OffsetSpec

        try:
            return topic_offsets_at(self._admin, self.source, self._config, partitions, (OffsetSpec.latest(),),
                                    METADATA_TIMEOUT_S)[0]
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            raise self._failed(exc) from None
        finally:
            drain(self._admin)

    def _assign(self, partitions: set[int], at_end: bool) -> None:
        """Watch ``partitions`` too: from their end offset now (``at_end``: the first run reads
        what is there), or from their first offset (a partition added while watching)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        starts = self._ends(partitions) if at_end else dict.fromkeys(partitions, OFFSET_BEGINNING)
        self._consumer.incremental_assign([TopicPartition(self.source.topic, p, o) for p, o in starts.items()])
        self._partitions |= partitions

    def add_new_partitions(self) -> None:
        try:
            new = self._topic_partitions() - self._partitions
        except KafkaSourceError as exc:
            log.debug("%s", exc)  # the runs say what is wrong with the topic
            return
        if new:
            log.info("%s: watching its new partition(s) %s", self.source.name, sorted(new))
            self._assign(new, at_end=False)

    def received(self, timeout_s: float) -> bool:
        """Whether a record landed (waiting up to ``timeout_s``)."""
        message = self._consumer.poll(timeout_s)
        if message is None or message.error() is not None:
            return False
        self.landed = True
        return True

    def rearm(self) -> None:
        """Watch again from each partition's end offset now: a run that starts after this reads
        everything before it. A broker that does not answer leaves the watch where it was
        (it then wakes for records the run reads too: one run more, no record missed)."""
        from confluent_kafka import TopicPartition

        topic = self.source.topic
        try:
            for p, end in self._ends(self._partitions).items():
                self._consumer.seek(TopicPartition(topic, p, end))
        except Exception as exc:  # noqa: BLE001 - the watch goes on from where it was
            log.debug("%s: watch: %s", self.source.name, exc)
        self.landed = False

    def close(self) -> None:
        self._consumer.close()


class TopicPolls:
    """Records landing in topics this process cannot consume with librdkafka (module docstring):
    ``changed()`` asks each topic's end offsets with the Java client, through ``spark``'s JVM, and
    is True when one moved since the last ask (a partition added counts). The first ask, when
    the polls are made, raises ``KafkaSourceError`` when a broker does not answer; later ones
    that fail count as no change, said in one warning until the broker answers again.
    ``close()`` closes the clients."""

    def __init__(self, spark: Any, sources: Sequence[KafkaSource]) -> None:
        self._polls: list[_TopicPoll] = []
        try:
            for source in sources:
                self._polls.append(_TopicPoll(spark, source))
        except BaseException:
            self.close()
            raise

    def changed(self) -> bool:
        return any([poll.changed() for poll in self._polls])  # every topic asked: each keeps its ends

    def close(self) -> None:
        for poll in self._polls:
            poll.close()


class _TopicPoll:
    """One topic's end offsets, asked with one Java consumer kept for the watch's life. A poll is
    two calls into the JVM (the offsets, then whether they equal the last ones): the partitions
    are asked again only every ``PARTITIONS_RECHECK_S`` (``kafka.java_partitions``, as a run asks
    them)."""

    def __init__(self, spark: Any, source: KafkaSource) -> None:
        self.source = source
        self._jvm = spark.sparkContext._jvm
        self._timeout = self._jvm.java.time.Duration.ofSeconds(METADATA_TIMEOUT_S)
        self._consumer = java_metadata_consumer(self._jvm, source, "versiq-watch")
        self._failing = False
        try:
            self._wanted = java_partitions(self._jvm, self._consumer, source)
            self._next_recheck = time.monotonic() + PARTITIONS_RECHECK_S
            self._ends = self._ask()
        except BaseException:
            self._consumer.close()
            raise

    def _failed(self, exc: BaseException) -> KafkaSourceError:
        return cannot_watch(self.source, java_error(exc))

    def _ask(self) -> Any:
        """The end offsets of the partitions now (a Java map)."""
        try:
            return self._consumer.endOffsets(self._wanted, self._timeout)
        except Exception as exc:  # noqa: BLE001
            raise self._failed(exc) from None

    def changed(self) -> bool:
        try:
            if time.monotonic() >= self._next_recheck:
                self._next_recheck = time.monotonic() + PARTITIONS_RECHECK_S
                self._wanted = java_partitions(self._jvm, self._consumer, self.source)
            ends = self._ask()
            moved = not ends.equals(self._ends)
        except KafkaSourceError as exc:
            if not self._failing:  # once, not at every poll
                log.warning("%s; asking again every poll", exc)
            self._failing = True
            return False
        except Exception as exc:  # noqa: BLE001 - the JVM is going away (a stop): no run is due
            log.debug("%s: watch: %s", self.source.name, exc)
            return False
        if self._failing:
            log.info("%s: the watch reaches the broker again", self.source.name)
            self._failing = False
        self._ends = ends
        return moved

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception as exc:  # noqa: BLE001 - the JVM may be gone already (a signal to the group)
            log.debug("%s: closing the watch: %s", self.source.name, exc)
