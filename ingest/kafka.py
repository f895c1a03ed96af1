"""Kafka topics as sources of stores and streams: what a run reads from a topic, read
with Spark's own Kafka source (spark-sql-kafka-0-10), or, for a store's run of few records
(``plan.choose_plan``), in the driver with the confluent-kafka client (``read_here``), which
gives the same rows without a Spark job.

**Where a run starts and ends.** A store fed by a topic keeps its position in the topic, the next
offset of every partition (``layout.KafkaPosition``), in its own ``StoreState``: committed in the
same Delta commit as the run's data, never in a consumer group. A run reads, per partition, from
that offset (a new store or partition: the earliest retained offset, or the end with
``--starting-offsets latest``) to the end offset the broker reports when the run starts; the
next run starts there. A crash before the commit leaves the position where it was, so the rerun
reads the same records again (and possibly more: a run over a longer range is the same as two
runs, rule 21); a crash after it reads on from the end. No record is read twice into a store or
skipped.

**Offsets lost to retention.** When the earliest offset still in a partition is above the
offset the store needs, records were deleted before versiq read them. The run fails naming the
partition and the lost range, unless the source allows offset gaps: then the gap is recorded in
the run's report and in the store's state, and the run reads on from the earliest offset.

**The topic's partitions.** A Kafka partition is the store's stream-time partition (rule 19);
a new store gets as many partitions as the topic has. When partitions are added to the topic,
the store's partition count grows with it (a settings change committed before the run's data):
each new partition has its own stream time, starting below every timestamp. A key keeps the
partition it was first seen in, so a record of a known key that arrives in another partition
(Kafka's default partitioner moves keys when partitions are added) is rejected
``partition_conflict`` and kept; producers that keep a key's partition lose nothing. A topic
with fewer partitions than the store, or a partition that ends before the store's position,
means the topic was deleted and created again: the run fails.

**The topic's id.** Offsets alone cannot tell a recreated topic that is already longer than the
store's position from the old one, so the position keeps the topic's id and every run compares
it (``check_topic_id``): another id fails the run. A position committed before ids were kept
adopts the topic's id at its next committed run.

**Client options.** ``options`` (the pipeline file) and ``VERSIQ_KAFKA_<NAME>`` environment
variables (``VERSIQ_KAFKA_SASL_JAAS_CONFIG`` is ``sasl.jaas.config``; the environment wins) are
Kafka (Java) client settings given to Spark's source and to this module's metadata clients, so
one configuration (security protocol, SASL, SSL) serves all. Their values are never logged,
reported or shown. Settings versiq manages itself (group, offsets, deserializers) are refused.
A run read in the driver and the metadata give them to librdkafka (``driver_config``), only
when every one has a setting of the same meaning there (``DRIVER_OPTIONS``); otherwise the
store's runs read with Spark's source and ask the metadata with the Java client, and the log
says why once.

**A run read in the driver** (``read_here``) assigns each partition at the run's start offset
and reads until its end offset (or the partition's end, past records the log cleaner removed),
with the source's ``isolation.level`` (the Java client's default, ``read_uncommitted``, unless
set), never committing to a consumer group. The position is still committed with the run's data
only: a broker that stops answering for ``POLL_TIMEOUT_MS``, or records deleted before they
were read, fail the run before anything is written, and the rerun reads the range again.

**The broker's metadata** (partitions, offsets, the topic's id) is asked with the same client as
the records would be in the driver: the confluent-kafka client when ``driver_config`` gives the
source's settings (``driver_topic_offsets``, no JVM), else the Java Kafka client Spark's source uses
(same jar, same settings), through the session's JVM (``java_topic_offsets``). Both give the same
offsets and the same id (Java's text of it), and fail the same way.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import logging
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from versiq import settings
from versiq.ingest.errors import UsageError
from versiq.ingest.order import MAX_POS, POS_BITS, RUN_SCHEMA
from versiq.ingest.records.kafka_rows import KAFKA_INPUT_SCHEMA, KafkaFormat, parse_kafka
from versiq.ingest.records.registry import SchemaRegistryError, check_registry
from versiq.ingest.records.schema import BATCH_ROWS, PARSED_SCHEMA
from versiq.ingest.sources import SourceError
from versiq.layout import KafkaPosition

log = logging.getLogger("versiq.ingest")
T = TypeVar("T")

#: Environment variables ``VERSIQ_KAFKA_<NAME>`` are client option ``<name>`` (``_`` -> ``.``).
ENV_PREFIX = settings.KAFKA.name
#: Client settings versiq decides (the position is the store's; values are bytes).
MANAGED_OPTIONS = frozenset({"bootstrap.servers", "group.id", "enable.auto.commit", "auto.offset.reset",
                             "key.deserializer", "value.deserializer", "auto.commit.interval.ms"})
STARTING_OFFSETS = ("earliest", "latest")
#: How long a metadata request to the broker may take before the run fails (also the Kafka
#: clients' ``default.api.timeout.ms`` of Spark's source unless the options set it).
METADATA_TIMEOUT_S = 15
#: How long a Spark task waits for records from the broker before the run fails (Spark's
#: default is ``spark.network.timeout``, 120 s), and how often Spark's driver asks for offsets
#: (default 3, each up to the API timeout): with Spark's defaults a broker that went away kept
#: a run waiting about 3 minutes before it failed; with these, about 30 s.
POLL_TIMEOUT_MS = 30_000
FETCH_OFFSET_RETRIES = 2
#: A run over many records splits each partition's range into Spark tasks of about this many
#: records (Spark's ``minPartitions``), so a one-partition topic is not parsed by one core.
RECORDS_PER_TASK = 1_000_000
#: The Kafka clients' timeouts unless the options set them (an admin client refuses an API
#: timeout below its request timeout).
CLIENT_TIMEOUTS = {"default.api.timeout.ms": str(METADATA_TIMEOUT_S * 1000), "request.timeout.ms": "10000"}
#: Offsets count records, not bytes: a run's input size, which decides whether it plans as a
#: small run (``ingest.spark.small_run``), is taken as its records times this (a JSON value of a
#: few fields with its key; a Debezium envelope is larger, so its small runs end sooner in
#: records, never later than the files' limit in bytes would put them).
RECORD_BYTES_ESTIMATE = 256


class KafkaSourceError(SourceError):
    """The broker (or the schema registry of Avro, JSON Schema or Protobuf values and keys) cannot
    be reached, the topic is missing or changed, or offsets the store needs were deleted: the run
    fails and commits nothing (a rerun retries)."""


def redacted(text: str, source: KafkaSource) -> str:
    """``text`` (a Kafka client's error message) without the values of the client settings:
    a client that refuses a setting quotes its value, which may be a secret."""
    for name, value in source.client_options().items():
        if name != "bootstrap.servers" and len(value) >= 6:  # not "all", "1": words of the message
            text = text.replace(value, "***")
    return text


@dataclass(frozen=True)
class KafkaSource:
    """Where a store or stream reads from: a topic of a Kafka cluster, and how its records map
    to versiq records (``records.kafka_rows.KafkaFormat``)."""

    bootstrap: str
    topic: str
    #: Kafka client settings (SASL, SSL, ...): never logged (``repr`` leaves them out).
    options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    starting_offsets: str = "earliest"
    allow_offset_gaps: bool = False
    format: KafkaFormat = field(default_factory=KafkaFormat)

    @property
    def name(self) -> str:
        """How reports, logs and ``_rejected`` name the source (no settings in it)."""
        return f"kafka:{self.topic}"

    def identity(self) -> str:
        return f"kafka://{self.bootstrap}/{self.topic}"

    def validate(self, what: str) -> None:
        if not self.bootstrap or not self.topic:
            raise UsageError(f"{what}: a Kafka source needs bootstrap servers and a topic")
        if self.starting_offsets not in STARTING_OFFSETS:
            raise UsageError(f"{what}: starting offsets must be earliest or latest, not {self.starting_offsets!r}")
        managed = sorted(set(self.options) & MANAGED_OPTIONS)
        if managed:
            raise UsageError(f"{what}: Kafka option(s) {', '.join(managed)} are set by versiq (the store keeps "
                             "its own offsets); remove them")
        try:
            self.format.validate()
        except ValueError as exc:
            raise UsageError(f"{what}: {exc}") from None

    def client_options(self) -> dict[str, str]:
        """The Kafka client settings: ``options``, then ``VERSIQ_KAFKA_*`` variables over them."""
        out = {str(k): str(v) for k, v in self.options.items()}
        for suffix, value in settings.KAFKA.values().items():
            out[suffix.lower().replace("_", ".")] = value
        managed = sorted(set(out) & MANAGED_OPTIONS)
        if managed:
            raise UsageError(f"Kafka option(s) {', '.join(managed)} (from {ENV_PREFIX}* variables) are set by versiq")
        out["bootstrap.servers"] = self.bootstrap
        return out


@dataclass(frozen=True)
class TopicOffsets:
    """What the broker reports for a topic when a run starts."""

    partitions: int
    #: Per partition, the earliest offset still stored and the end offset (next to be written).
    earliest: dict[int, int]
    end: dict[int, int]
    #: The topic's id (``TopicDescription.topicId()``), asked after the offsets: the offsets are
    #: those of the topic with this id. None: the broker keeps no topic ids (before Kafka 2.8).
    topic_id: str | None = None


@dataclass
class KafkaRead:
    """One run's read of a topic: ``ranges[p] = (start, end)`` reads offsets [start, end)."""

    partitions: int
    ranges: dict[int, tuple[int, int]]
    #: Ranges lost to retention, allowed by the source: ``{"partition", "from", "to"}``.
    gaps: list[dict[str, int]] = field(default_factory=list)
    #: The id of the topic the ranges are offsets of (``TopicOffsets.topic_id``).
    topic_id: str | None = None

    @property
    def empty(self) -> bool:
        return all(start >= end for start, end in self.ranges.values())

    @property
    def records(self) -> int:
        """How many records the run reads (at most: a compacted topic has holes in its offsets)."""
        return sum(max(0, end - start) for start, end in self.ranges.values())

    @property
    def input_bytes(self) -> int:
        """The run's input size for the small-run decision (``RECORD_BYTES_ESTIMATE``)."""
        return self.records * RECORD_BYTES_ESTIMATE

    @property
    def advances(self) -> bool:
        """Whether the run moves the position: records to read, or an allowed gap to record."""
        return not self.empty or bool(self.gaps)

    def position(self, before: KafkaPosition | None, topic: str, run: int) -> KafkaPosition:
        """The store's position after this run, with the id of the topic it read (a position
        committed before ids were kept adopts the topic's id here)."""
        offsets = dict(before.next_offsets) if before is not None else {}
        offsets.update({p: end for p, (_start, end) in self.ranges.items()})
        gaps = list(before.gaps) if before is not None else []
        gaps += [{**gap, "run": run} for gap in self.gaps]
        return KafkaPosition(topic=topic, next_offsets=offsets, gaps=gaps, topic_id=self.topic_id)


def check_position(what: str, exists: bool, position: KafkaPosition | None, source: KafkaSource) -> None:
    """A store or stream (``what``: "store 'prices'") that exists reads one topic for life: one
    built from files (no position) cannot switch to a topic, nor one topic to another."""
    if exists and position is None:
        raise UsageError(f"{what} was built from files; it cannot switch to Kafka topic {source.topic} "
                         "(create a new one instead)")
    if position is not None and position.topic != source.topic:
        raise UsageError(f"{what} reads Kafka topic {position.topic}, not {source.topic} (create a new one instead)")


def plan_run(spark: SparkSession, what: str, exists: bool, position: KafkaPosition | None,
             source: KafkaSource) -> KafkaRead:
    """``check_position``, then what this run reads (``plan_read``) from the broker's offsets now
    (``topic_offsets``: only a source whose settings keep the Java client uses ``spark``)."""
    check_position(what, exists, position, source)
    return plan_read(source, position, topic_offsets(spark, source))


def plan_read(source: KafkaSource, position: KafkaPosition | None, offsets: TopicOffsets) -> KafkaRead:
    """Which offsets a run reads (module docstring): from ``position`` (None: a new store) to
    the end offsets the broker reported. Raises ``KafkaSourceError`` for a recreated topic and
    for offsets lost to retention (unless the source allows gaps)."""
    check_topic_id(source, position, offsets.topic_id)
    known = position.next_offsets if position is not None else {}
    if known and max(known) >= offsets.partitions:
        raise KafkaSourceError(
            f"topic {source.topic} has {offsets.partitions} partition(s) but the store has read partition "
            f"{max(known)}: was the topic deleted and created again? Ingest it into a new store")
    ranges: dict[int, tuple[int, int]] = {}
    gaps: list[dict[str, int]] = []
    lost: list[str] = []
    for p in range(offsets.partitions):
        earliest, end = offsets.earliest[p], offsets.end[p]
        if p in known:
            start = known[p]
        elif position is None and source.starting_offsets == "latest":
            start = end
        else:  # a new store from the earliest offset, or a partition added to the topic later
            start = earliest
        if start > end:
            raise KafkaSourceError(
                f"topic {source.topic} partition {p} ends at offset {end} but the store has read up to offset "
                f"{start}: was the topic deleted and created again? Ingest it into a new store")
        if start < earliest:
            gaps.append({"partition": p, "from": start, "to": earliest})
            lost.append(f"partition {p} offsets [{start}, {earliest})")
            start = earliest
        ranges[p] = (start, end)
    if lost and not source.allow_offset_gaps:
        raise KafkaSourceError(
            f"topic {source.topic}: records the store had not read yet were deleted by the topic's retention: "
            f"{'; '.join(lost)}. Rerun with --allow-offset-gaps (pipeline: allow_offset_gaps: true) to record "
            "the gap and read on")
    return KafkaRead(partitions=offsets.partitions, ranges=ranges, gaps=gaps, topic_id=offsets.topic_id)


def check_topic_id(source: KafkaSource, position: KafkaPosition | None, topic_id: str | None) -> None:
    """The store's position is a position in the topic it was read from: a topic deleted and
    created again under the same name has another id, and its offsets name other records
    (whatever its length: a longer new topic would otherwise be read from the old position,
    its first records skipped). Raises ``KafkaSourceError`` when the ids differ, or when the
    broker reports no id for a topic the store knows by id (then nothing tells the two apart).
    A position without an id (committed before ids were kept) is not checked: the run adopts
    the topic's id (``KafkaRead.position``)."""
    if position is None or position.topic_id is None or position.topic_id == topic_id:
        return
    now = f"has id {topic_id}" if topic_id is not None else "has no topic id on this broker"
    raise KafkaSourceError(
        f"topic {source.topic} {now} but the store read topic id {position.topic_id}: the topic was deleted "
        "and created again; its offsets are not the store's. Ingest it into a new store")


def read_report(source: KafkaSource, read: KafkaRead) -> dict[str, Any]:
    """The run report's ``kafka`` member: what the run read (docs/contract.md)."""
    return {"topic": source.topic, "partitions": read.partitions,
            "offsets": {str(p): [start, end] for p, (start, end) in sorted(read.ranges.items())},
            "gaps": read.gaps}


def describe_read(source: KafkaSource, read: KafkaRead) -> str:
    return f"{source.name} offsets {read.ranges} (at most {read.records} record(s))"


# ---------------------------------------------------------------- the broker, through the JVM
def java_error(exc: BaseException) -> str:
    """The Java exception's class and message, one line (no py4j traceback)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        return f"{java.getClass().getName()}: {java.getMessage()}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


_KAFKA_ERROR = re.compile(r"(org\.apache\.kafka\.[\w.]*(?:Exception|Error)[^\n]*)")
#: A Spark task's ``records.registry.SchemaRegistryError``, in the driver's exception text.
_REGISTRY_ERROR = re.compile(r"SchemaRegistryError: ([^\n]+)")


def reading_failed(source: KafkaSource, exc: BaseException) -> KafkaSourceError | None:
    """The run's error when Spark's read of the topic failed because of Kafka (the broker went
    away, records vanished) or of the schema registry (unreachable, 5xx: ``records.registry``):
    one line naming the source and the error, not the Java or Python stack trace. None for any
    other failure."""
    if isinstance(exc, SchemaRegistryError):
        return KafkaSourceError(f"reading {source.name}: {exc}")
    registry = _REGISTRY_ERROR.findall(str(exc))
    if registry:
        return KafkaSourceError(f"reading {source.name}: {registry[-1].strip()}")
    found = _KAFKA_ERROR.findall(str(exc))
    if not found:
        return None
    return KafkaSourceError(redacted(f"reading {source.name} from {source.bootstrap} failed: {found[-1].strip()}",
                                     source))


@contextlib.contextmanager
def read_errors(source: KafkaSource) -> Iterator[None]:
    """Inside the block (the Spark actions that read the topic), a failure caused by Kafka is
    ``reading_failed``'s one-line ``KafkaSourceError``; any other failure passes unchanged."""
    try:
        yield
    except Exception as exc:
        failure = reading_failed(source, exc)
        if failure is None:
            raise
        raise failure from None


def _client_properties(jvm: Any, source: KafkaSource, extra: Mapping[str, str]) -> Any:
    """The Java ``Properties`` of a metadata client: the timeouts, the source's client
    settings, then ``extra``."""
    props = jvm.java.util.Properties()
    for name, value in [*CLIENT_TIMEOUTS.items(), *source.client_options().items(), *extra.items()]:
        props.setProperty(name, value)
    return props


def topic_offsets(spark: SparkSession, source: KafkaSource) -> TopicOffsets:
    """Partition count, earliest and end offsets of the topic, then its id: asked with the
    confluent-kafka client (``driver_topic_offsets``) when the source's client settings all have
    a same-meaning librdkafka setting (``driver_config``), else with the Java Kafka client
    Spark's source uses, through the session's JVM (``java_topic_offsets``). Both give the same
    ``TopicOffsets`` and fail with the same one-line ``KafkaSourceError``."""
    config, _why = driver_config(source)
    if config is None:
        return java_topic_offsets(spark, source)
    return driver_topic_offsets(source, config)


def java_topic_offsets(spark: SparkSession, source: KafkaSource) -> TopicOffsets:
    """``topic_offsets`` asked with the Java Kafka client (the one Spark's source uses, with the
    same settings), then the topic's id (``java_topic_id``): asked after the offsets, so a topic
    recreated meanwhile has the new id and fails the run. Raises ``KafkaSourceError`` when the
    broker does not answer or the topic does not exist."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    consumer = java_metadata_consumer(jvm, source)
    timeout = jvm.java.time.Duration.ofSeconds(METADATA_TIMEOUT_S)
    try:
        wanted = java_partitions(jvm, consumer, source)
        try:
            earliest = consumer.beginningOffsets(wanted, timeout)
            end = consumer.endOffsets(wanted, timeout)
        except Exception as exc:  # noqa: BLE001
            raise KafkaSourceError(redacted(
                f"cannot read the offsets of topic {source.topic} at {source.bootstrap}: {java_error(exc)}",
                source)) from None

        def offsets(found: Any) -> dict[int, int]:
            return {int(tp.partition()): int(found.get(tp)) for tp in found.keySet()}

        found_earliest, found_end = offsets(earliest), offsets(end)
    finally:
        consumer.close()
    return TopicOffsets(partitions=int(wanted.size()), earliest=found_earliest, end=found_end,
                        topic_id=java_topic_id(jvm, source))


def java_partitions(jvm: Any, consumer: Any, source: KafkaSource) -> Any:
    """The topic's partitions as a Java list of ``TopicPartition``, asked with ``consumer``
    (``java_metadata_consumer``) from the cluster's topic list, which never creates a topic.
    Raises ``KafkaSourceError`` when the broker does not answer, the topic does not exist or its
    partitions are not numbered 0..n-1."""
    timeout = jvm.java.time.Duration.ofSeconds(METADATA_TIMEOUT_S)
    try:
        infos = consumer.listTopics(timeout)
    except Exception as exc:  # noqa: BLE001 - broker down, DNS, auth: one line
        raise KafkaSourceError(redacted(
            f"cannot reach Kafka at {source.bootstrap} (topic {source.topic}): {java_error(exc)}",
            source)) from None
    if not infos.containsKey(source.topic):
        raise KafkaSourceError(f"topic {source.topic} does not exist on {source.bootstrap}")
    parts = sorted(int(info.partition()) for info in infos.get(source.topic))
    if parts != list(range(len(parts))):
        raise KafkaSourceError(f"topic {source.topic}: unexpected partition numbers {parts}")
    wanted = jvm.java.util.ArrayList()
    for p in parts:
        wanted.add(jvm.org.apache.kafka.common.TopicPartition(source.topic, p))
    return wanted


def java_metadata_consumer(jvm: Any, source: KafkaSource, client_id: str = "versiq-metadata") -> Any:
    """A Java ``KafkaConsumer`` with the source's client settings that only asks metadata and
    offsets (no group, nothing committed); raises ``KafkaSourceError`` on a setting the client
    refuses. The caller closes it. ``client_id``: one per kind of use (two clients of one id in
    a JVM share its JMX name)."""
    deserializer = "org.apache.kafka.common.serialization.ByteArrayDeserializer"
    props = _client_properties(jvm, source, {"key.deserializer": deserializer, "value.deserializer": deserializer,
                                             "enable.auto.commit": "false", "client.id": client_id})
    try:
        return jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props)
    except Exception as exc:  # noqa: BLE001 - a bad setting: the client's own message
        raise KafkaSourceError(redacted(f"cannot create a Kafka client for {source.bootstrap}: {java_error(exc)}",
                                        source)) from None


def java_topic_id(jvm: Any, source: KafkaSource) -> str | None:
    """The topic's id (``TopicDescription.topicId()``, Kafka 2.8 and later; None from a broker
    that keeps no ids), asked with the Java admin client and the source's settings. Raises
    ``KafkaSourceError`` when the broker does not answer or the topic does not exist."""
    props = _client_properties(jvm, source, {"client.id": "versiq-metadata"})
    try:
        admin = jvm.org.apache.kafka.clients.admin.AdminClient.create(props)
    except Exception as exc:  # noqa: BLE001 - a bad setting: the client's own message
        raise KafkaSourceError(redacted(f"cannot create a Kafka client for {source.bootstrap}: {java_error(exc)}",
                                        source)) from None
    try:
        topics = jvm.java.util.Collections.singletonList(source.topic)
        try:
            described = admin.describeTopics(topics).allTopicNames().get(
                METADATA_TIMEOUT_S, jvm.java.util.concurrent.TimeUnit.SECONDS)
        except Exception as exc:  # noqa: BLE001 - broker down, topic deleted meanwhile: one line
            raise KafkaSourceError(redacted(
                f"cannot describe topic {source.topic} at {source.bootstrap}: {java_error(exc)}", source)) from None
        found = described.get(source.topic).topicId()
        return None if found.equals(jvm.org.apache.kafka.common.Uuid.ZERO_UUID) else str(found.toString())
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(METADATA_TIMEOUT_S))


# ---------------------------------------------------------------- reading the records
def _reader_options(source: KafkaSource) -> dict[str, str]:
    options = {f"kafka.{name}": value for name, value in CLIENT_TIMEOUTS.items()}
    options.update({f"kafka.{name}": value for name, value in source.client_options().items()})
    return options


def read_records(spark: SparkSession, source: KafkaSource, read: KafkaRead, max_timestamp: int | None) -> DataFrame:
    """The run's records as ``order.RUN_SCHEMA`` rows (each parsed by ``records.kafka_rows``),
    read by Spark's Kafka source from exactly ``read.ranges``.

    ``seq`` is ``(partition << 40) | (offset - start)``: the partition plays the part a file
    plays for file sources, and every record carries its offset, so a partition's processing
    order is offset order (rule 20). ``raw`` is kept for every record (a record rejected later
    cannot be read again from a file), with the record's headers when it has any."""
    ranges = {p: r for p, r in read.ranges.items() if r[0] < r[1]}
    if not ranges:
        return spark.createDataFrame(RUN_SCHEMA.empty_table())
    _check_ranges(source, ranges)
    topic = source.topic
    reader = (spark.read.format("kafka")
              .option("assign", json.dumps({topic: sorted(ranges)}))
              .option("startingOffsets", json.dumps({topic: {str(p): s for p, (s, _e) in ranges.items()}}))
              .option("endingOffsets", json.dumps({topic: {str(p): e for p, (_s, e) in ranges.items()}}))
              # records the run planned to read were deleted meanwhile: fail, the rerun decides
              .option("failOnDataLoss", "true")
              .option("kafkaConsumer.pollTimeoutMs", str(POLL_TIMEOUT_MS))
              .option("fetchOffset.numRetries", str(FETCH_OFFSET_RETRIES))
              # a rejected record's raw shows its headers (records.kafka_rows)
              .option("includeHeaders", "true"))
    records = sum(end - start for start, end in ranges.values())
    tasks = max(len(ranges), spark.sparkContext.defaultParallelism, -(-records // RECORDS_PER_TASK))
    if records >= RECORDS_PER_TASK // 10 and tasks > len(ranges):
        reader = reader.option("minPartitions", str(tasks))
    for name, value in _reader_options(source).items():
        reader = reader.option(name, value)
    frame = reader.load().select(
        "key", "value", F.col("partition").cast("int").alias("partition"), "offset",
        F.unix_millis(F.col("timestamp")).alias("timestamp"), F.to_json("headers").alias("headers"))
    starts = {p: s for p, (s, _e) in ranges.items()}
    fmt, name = source.format, source.name

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield _with_kafka_order(parse_kafka(_kafka_input(batch), fmt, name, max_timestamp), starts)

    return frame.mapInArrow(parse, from_arrow_schema(RUN_SCHEMA))


def _kafka_input(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of Spark's Kafka source, its headers as Spark's JSON of them (``read_records``), as
    ``KAFKA_INPUT_SCHEMA``.

    Spark hands an array of structs to Python far more slowly than a string, even when every
    record's is null (the common case: most topics carry no headers), so the tasks send the
    headers as ``to_json`` text, in which a binary value is base64 and a null value is left
    out, and they are rebuilt here."""
    texts = batch.column(batch.schema.get_field_index("headers"))
    if texts.null_count == len(texts):
        headers = pa.nulls(len(texts), _HEADERS)
    else:
        headers = pa.array([None if text is None else [
            {"key": h["key"], "value": None if h.get("value") is None else base64.b64decode(h["value"])}
            for h in json.loads(text)] for text in texts.to_pylist()], _HEADERS)
    columns = [batch.column(batch.schema.get_field_index(name)) for name in KAFKA_INPUT_SCHEMA.names[:-1]]
    return pa.RecordBatch.from_arrays([*columns, headers], schema=KAFKA_INPUT_SCHEMA)


def _check_ranges(source: KafkaSource, ranges: dict[int, tuple[int, int]]) -> None:
    """Before a run reads ``ranges``: a registry that cannot be asked fails the run here, before
    anything is read (Spark's tasks would fail the same way, each after its tries:
    ``records.registry.SchemaRegistryError``), and so does a range too long for ``seq``."""
    if source.format.schema_registry is not None:
        try:
            check_registry(source.format.schema_registry)
        except SchemaRegistryError as exc:
            raise KafkaSourceError(f"reading {source.name}: {exc}") from None
    for p, (start, end) in ranges.items():
        if end - start > MAX_POS:
            raise KafkaSourceError(f"topic {source.topic} partition {p}: {end - start} records in one run; at most "
                                   f"{MAX_POS}")


def _with_kafka_order(batch: pa.RecordBatch, starts: dict[int, int]) -> pa.RecordBatch:
    """A ``PARSED_SCHEMA`` batch of Kafka records as ``RUN_SCHEMA`` (``read_records``)."""
    part = batch.column(PARSED_SCHEMA.get_field_index("part"))
    offset = batch.column(PARSED_SCHEMA.get_field_index("offset"))
    base = pa.array([starts[p] for p in part.to_pylist()], pa.int64())
    seq = pc.add(pc.shift_left(part.cast(pa.int64()), pa.scalar(POS_BITS, pa.int64())), pc.subtract(offset, base))
    columns = [batch.column(PARSED_SCHEMA.get_field_index(name)) for name in RUN_SCHEMA.names[1:-1]]
    return pa.RecordBatch.from_arrays([seq, *columns, pa.nulls(batch.num_rows, pa.int64())], schema=RUN_SCHEMA)


# ---------------------------------------------------------------- reading a small run in the driver
#: Java client settings with the same meaning in librdkafka (the confluent-kafka client a small
#: run reads with, ``read_here``), each to its librdkafka name. ``None``: understood, with nothing
#: to set (``default.api.timeout.ms`` bounds the Java client's blocking calls; the driver's read
#: is bounded by ``POLL_TIMEOUT_MS``, as a Spark task's).
DRIVER_OPTIONS: dict[str, str | None] = {
    "bootstrap.servers": "bootstrap.servers",
    "client.id": "client.id",
    "security.protocol": "security.protocol",
    "sasl.mechanism": "sasl.mechanism",
    "sasl.username": "sasl.username",
    "sasl.password": "sasl.password",
    "ssl.keystore.location": "ssl.keystore.location",
    "ssl.keystore.password": "ssl.keystore.password",
    "ssl.key.password": "ssl.key.password",
    "ssl.truststore.location": "ssl.ca.location",
    "ssl.keystore.type": None,
    "ssl.truststore.type": None,
    "ssl.endpoint.identification.algorithm": "ssl.endpoint.identification.algorithm",
    "isolation.level": "isolation.level",
    "request.timeout.ms": "socket.timeout.ms",
    "default.api.timeout.ms": None,
    "max.partition.fetch.bytes": "max.partition.fetch.bytes",
    "fetch.max.bytes": "fetch.max.bytes",
}
#: SASL mechanisms that need nothing but a user name and password in both clients (GSSAPI and
#: OAUTHBEARER are configured differently in each).
DRIVER_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HEADERS = KAFKA_INPUT_SCHEMA.field("headers").type
#: The stores (source names) whose reason to read with Spark was logged (``driver_config``).
_LOGGED_SPARK_READS: set[tuple[str, str]] = set()


def driver_config(source: KafkaSource) -> tuple[dict[str, str] | None, str]:
    """The librdkafka settings of ``source``'s client settings (``DRIVER_OPTIONS``), or None and
    why not: a setting that has no same-meaning librdkafka setting (``sasl.jaas.config``, a Java
    JKS keystore or truststore, GSSAPI or OAUTHBEARER) keeps its runs on Spark's Kafka source.
    Names only in the reason, never values (other than the mechanism or store type)."""
    options = source.client_options()
    unknown = sorted(set(options) - set(DRIVER_OPTIONS))
    if unknown:
        return None, f"Kafka option(s) {', '.join(unknown)} have no same-meaning setting in librdkafka"
    if "SASL" in options.get("security.protocol", "PLAINTEXT").upper():
        mechanism = options.get("sasl.mechanism", "GSSAPI").upper()  # both clients' default
        if mechanism not in DRIVER_SASL_MECHANISMS:
            return None, f"sasl.mechanism {mechanism} is configured differently in librdkafka"
        if "sasl.username" not in options:
            return None, "SASL without sasl.username (the Java client's credentials are in sasl.jaas.config)"
    for store, librdkafka_type in (("keystore", "PKCS12"), ("truststore", "PEM")):
        stated = options.get(f"ssl.{store}.type", "JKS").upper()
        if f"ssl.{store}.location" in options and stated != librdkafka_type:
            return None, f"ssl.{store}.type {stated}: librdkafka reads a {store} of type {librdkafka_type} only"
    config: dict[str, str] = {"isolation.level": "read_uncommitted",  # the Java client's default
                              "socket.timeout.ms": CLIENT_TIMEOUTS["request.timeout.ms"]}
    for name, value in options.items():
        target = DRIVER_OPTIONS[name]
        if target == "ssl.endpoint.identification.algorithm":
            value = value or "none"  # the Java client's empty value turns the check off
        if target is not None:
            config[target] = value
    return config, ""


def reads_here(source: KafkaSource, store: str) -> bool:
    """Whether a small run of ``source`` may read in the driver (``driver_config``); when not,
    says why once per store and reason."""
    config, why = driver_config(source)
    if config is None and (store, why) not in _LOGGED_SPARK_READS:
        _LOGGED_SPARK_READS.add((store, why))
        log.info("%s: %s: its runs read with Spark's Kafka source", store, why)
    return config is not None


#: A new librdkafka client drops its connection to the bootstrap server once it knows the
#: brokers' own addresses, and its first request then waits half of ``reconnect.backoff.ms``
#: (at least 11 ms) before it may connect again: librdkafka's default (100 ms) would add 50 ms
#: to every run's metadata.
METADATA_RECONNECT_BACKOFF_MS = 10
#: librdkafka settings of ``driver_config`` that only a consumer takes: an admin client warns
#: about each on stderr, so they are left out of its settings.
_CONSUMER_ONLY = frozenset({"isolation.level", "max.partition.fetch.bytes", "fetch.max.bytes"})


class ClientLog:
    """Where librdkafka's own log lines of a metadata or watch client go: the debug log, without the
    source's setting values (a broker that cannot be reached is the run's one-line
    ``KafkaSourceError``, not a line per connection attempt on stderr). They arrive when the
    client is polled (``drain``)."""

    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    def log(self, _level: int, message: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s", redacted(f"librdkafka: {message % args if args else message}", self.source))


def _client_error(failure: Any) -> str:
    """A confluent-kafka exception or ``KafkaError`` as one line: the error's name and text."""
    error = failure.args[0] if isinstance(failure, BaseException) and failure.args else failure
    name, text = getattr(error, "name", None), getattr(error, "str", None)
    line = f"{name()}: {text()}" if callable(name) and callable(text) else str(failure) or type(failure).__name__
    return " ".join(line.split())


def java_uuid(most: int, least: int) -> str:
    """A Kafka ``Uuid`` of these two 64-bit halves as Java's ``Uuid.toString()`` writes it (the
    form a position keeps): URL-safe base64 of its 16 bytes, without padding. librdkafka's own
    text of an id (``str(Uuid)``) is standard base64, which differs in ``+`` and ``/``."""
    raw = struct.pack(">QQ", most & 0xFFFF_FFFF_FFFF_FFFF, least & 0xFFFF_FFFF_FFFF_FFFF)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def driver_topic_offsets(source: KafkaSource, config: Mapping[str, str] | None = None) -> TopicOffsets:
    """``java_topic_offsets``' answer asked with a confluent-kafka admin client of the source's
    librdkafka settings (``config``: ``driver_config``'s): the topic's partitions (a metadata
    request that never creates the topic), their earliest and end offsets (the end is the last
    stable offset with ``isolation.level`` ``read_committed``, as the Java consumer's), then, after
    the offsets, the topic's id in Java's form (``java_uuid``). Each of the three waits up to
    ``METADATA_TIMEOUT_S``, asking again after the errors the Java clients retry (``_asked``: a
    broker that restarted, a leader that moved). Raises ``KafkaSourceError`` (one line, no
    setting's value) when the broker does not answer or the topic does not exist. No JVM: a run
    read in the driver plans without the session."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import OffsetSpec

    if config is None:
        config, why = driver_config(source)
        if config is None:
            raise ValueError(f"{source.name}: {why}")
    topic = source.topic
    admin = metadata_client(source, config)

    def partitions(wait: float) -> list[int]:
        return topic_partitions(admin, source, wait)

    def offsets(wait: float) -> tuple[dict[int, int], ...]:
        return topic_offsets_at(admin, source, config, parts, (OffsetSpec.earliest(), OffsetSpec.latest()), wait)

    def topic_id(wait: float) -> str | None:
        uuid = admin.describe_topics(TopicCollection([topic]), request_timeout=wait)[topic].result(wait + 5).topic_id
        most, least = (0, 0) if uuid is None else (uuid.get_most_significant_bits(), uuid.get_least_significant_bits())
        return None if most == least == 0 else java_uuid(most, least)

    try:
        parts = _asked(partitions, f"cannot reach Kafka at {source.bootstrap} (topic {topic})", source)
        if parts != list(range(len(parts))):
            raise KafkaSourceError(f"topic {topic}: unexpected partition numbers {parts}")
        earliest, end = _asked(offsets, f"cannot read the offsets of topic {topic} at {source.bootstrap}", source)
        found_id = _asked(topic_id, f"cannot describe topic {topic} at {source.bootstrap}", source)
    finally:
        drain(admin)
    return TopicOffsets(partitions=len(parts), earliest=earliest, end=end, topic_id=found_id)


def topic_partitions(admin: Any, source: KafkaSource, wait: float) -> list[int]:
    """The partitions of ``source``'s topic, asked with ``admin`` (``metadata_client``: a request
    that never creates the topic). Raises ``KafkaSourceError`` when the topic does not exist,
    ``KafkaException`` for the broker's other errors."""
    from confluent_kafka import KafkaError, KafkaException

    topic = source.topic
    found = admin.list_topics(topic, timeout=wait).topics.get(topic)
    if found is None or (found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise KafkaSourceError(f"topic {topic} does not exist on {source.bootstrap}")
    if found.error is not None:
        raise KafkaException(found.error)
    return sorted(int(p) for p in found.partitions)


def topic_offsets_at(admin: Any, source: KafkaSource, config: Mapping[str, str], partitions: Iterable[int],
                     specs: Sequence[Any], wait: float) -> tuple[dict[int, int], ...]:
    """For each of ``specs`` (``OffsetSpec.earliest()``, ``latest()``), the offset of each of
    ``partitions``, asked with ``admin``, the requests under way together. The latest is the last
    stable offset under ``isolation.level`` ``read_committed`` (``config``: ``driver_config``'s),
    as the Java consumer's end offsets. Raises ``KafkaException`` or ``TimeoutError``."""
    from confluent_kafka import IsolationLevel, TopicPartition

    committed = config.get("isolation.level", "read_uncommitted").lower() == "read_committed"
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    parts = list(partitions)
    asked = [admin.list_offsets({TopicPartition(source.topic, p): spec for p in parts}, isolation_level=level,
                                request_timeout=wait) for spec in specs]
    return tuple({tp.partition: int(future.result(wait + 5).offset) for tp, future in futures.items()}
                 for futures in asked)


#: The errors of a metadata request the Java clients retry until their timeout
#: (``RetriableException``): a broker that restarted or is not the leader yet, a timed-out request.
_RETRIED_ERRORS = frozenset({"UNKNOWN_LEADER_EPOCH", "FENCED_LEADER_EPOCH", "NOT_LEADER_FOR_PARTITION",
                             "LEADER_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE", "BROKER_NOT_AVAILABLE",
                             "OFFSET_NOT_AVAILABLE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION",
                             "KAFKA_STORAGE_ERROR", "NOT_CONTROLLER", "_TRANSPORT", "_ALL_BROKERS_DOWN"})


def _asked(request: Callable[[float], T], failed: str, source: KafkaSource) -> T:
    """``request(seconds left)`` until it answers, asked again after a ``_RETRIED_ERRORS`` error
    for up to ``METADATA_TIMEOUT_S`` in all; its failure (or the last one) is a one-line
    ``KafkaSourceError``: ``failed`` and the client's error."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + METADATA_TIMEOUT_S
    pause = 0.05
    while True:
        try:
            return request(max(0.1, deadline - time.monotonic()))
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            retried = error is not None and (error.retriable() or error.name() in _RETRIED_ERRORS)
            if not retried or time.monotonic() + pause >= deadline:
                raise KafkaSourceError(redacted(f"{failed}: {_client_error(exc)}", source)) from None
            log.debug("%s", redacted(f"{failed}: {_client_error(exc)}; asking again", source))
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def metadata_client(source: KafkaSource, config: Mapping[str, str]) -> Any:
    """A confluent-kafka admin client of ``config`` (``driver_config``'s settings of ``source``)
    for ``driver_topic_offsets``. Raises ``KafkaSourceError`` for a setting it refuses."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin_config: dict[str, Any] = {name: value for name, value in config.items() if name not in _CONSUMER_ONLY}
    admin_config.update({"client.id": "versiq-metadata", "allow.auto.create.topics": False,
                         "reconnect.backoff.ms": METADATA_RECONNECT_BACKOFF_MS, "logger": ClientLog(source)})
    try:
        return AdminClient(admin_config)
    except (KafkaException, ValueError, TypeError) as exc:  # a bad setting: the client's own message
        raise KafkaSourceError(redacted(f"cannot create a Kafka client for {source.bootstrap}: {_client_error(exc)}",
                                        source)) from None


def drain(admin: Any) -> None:
    """Hand the client's queued log lines to ``ClientLog`` (an admin client's are served by
    ``poll`` only)."""
    with contextlib.suppress(Exception):
        admin.poll(0)


def read_here(source: KafkaSource, read: KafkaRead, max_timestamp: int | None) -> pa.Table:
    """``read_records``' rows as one Arrow table, read in this process with the confluent-kafka
    client (librdkafka): each partition assigned at the run's start offset and read up to its end
    offset, nothing committed to any consumer group, then parsed by ``records.kafka_rows`` as
    Spark's tasks parse them. A small run's Spark job costs more than its read
    (``plan.choose_plan``). Raises ``KafkaSourceError`` when the broker stops answering for
    ``POLL_TIMEOUT_MS``, the records planned were deleted meanwhile, or the read is refused: the
    run fails before anything is written (the rerun reads the range again)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    ranges = {p: r for p, r in read.ranges.items() if r[0] < r[1]}
    if not ranges:
        return RUN_SCHEMA.empty_table()
    _check_ranges(source, ranges)
    config, why = driver_config(source)
    if config is None:
        raise ValueError(f"{source.name}: {why}")
    errors: list[str] = []

    def on_error(error: Any) -> None:
        errors.append(str(error))

    consumer_config: dict[str, Any] = {
        **config, "group.id": "versiq-driver-read", "enable.auto.commit": False, "enable.auto.offset.store": False,
        "auto.offset.reset": "error", "enable.partition.eof": True, "error_cb": on_error,
        "client.id": config.get("client.id", "versiq-driver-read")}
    try:
        consumer = Consumer(consumer_config)
    except (KafkaException, ValueError) as exc:
        raise KafkaSourceError(redacted(f"cannot create a Kafka client for {source.bootstrap}: {exc}",
                                        source)) from None
    columns: dict[int, tuple[list[Any], ...]] = {p: ([], [], [], [], []) for p in ranges}
    pending = set(ranges)
    following = {p: start for p, (start, _end) in ranges.items()}  # the next offset to read
    try:
        consumer.assign([TopicPartition(source.topic, p, start) for p, (start, _end) in ranges.items()])
        progress = time.monotonic()
        while pending:
            # at most the records left (consume returns once it has that many, or at the timeout)
            left = sum(ranges[p][1] - following[p] for p in pending)
            for msg in consumer.consume(num_messages=max(1, min(10_000, left)), timeout=0.5):
                p, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if p in pending and offset >= ranges[p][1]:  # the rest of the range is gone
                            pending.discard(p)                             # (compacted, or control records)
                        continue
                    if error.retriable() and not error.fatal():
                        errors.append(str(error))
                        continue
                    raise KafkaSourceError(redacted(
                        f"reading {source.name} from {source.bootstrap} failed: partition {p}: {error}", source))
                if p not in pending:
                    continue
                end = ranges[p][1]
                following[p] = offset + 1
                if offset < end:
                    keys, values, offsets, stamps, headers = columns[p]
                    keys.append(msg.key())
                    values.append(msg.value())
                    offsets.append(offset)
                    stamps.append(msg.timestamp()[1])
                    found: Any = msg.headers()
                    headers.append(None if found is None else [{"key": k, "value": v} for k, v in found])
                    progress = time.monotonic()
                if offset >= end - 1:
                    pending.discard(p)
                    consumer.pause([TopicPartition(source.topic, p)])
            if pending and time.monotonic() - progress > POLL_TIMEOUT_MS / 1000:
                last = f": {errors[-1]}" if errors else ""
                raise KafkaSourceError(redacted(
                    f"reading {source.name} from {source.bootstrap} failed: no records for {POLL_TIMEOUT_MS // 1000} s "
                    f"in partition(s) {sorted(pending)}{last}", source))
    finally:
        consumer.close()
    starts = {p: s for p, (s, _e) in ranges.items()}
    batches: list[pa.RecordBatch] = []
    for p in sorted(ranges):
        keys, values, offsets, stamps, headers = columns[p]
        for lo in range(0, len(offsets), BATCH_ROWS):
            hi = lo + BATCH_ROWS
            batch = pa.RecordBatch.from_arrays(
                [pa.array(keys[lo:hi], pa.binary()), pa.array(values[lo:hi], pa.binary()),
                 pa.array([p] * len(offsets[lo:hi]), pa.int32()), pa.array(offsets[lo:hi], pa.int64()),
                 pa.array(stamps[lo:hi], pa.int64()), pa.array(headers[lo:hi], _HEADERS)], schema=KAFKA_INPUT_SCHEMA)
            batches.append(_with_kafka_order(parse_kafka(batch, source.format, source.name, max_timestamp), starts))
    return pa.Table.from_batches(batches, schema=RUN_SCHEMA)
