"""A real Apache Kafka broker for the tests: one single-node KRaft server (broker and controller in
one JVM, ``node.id=1``) run as a Java subprocess from the jars of ``tests/kafka-broker/pom.xml``,
which ``make`` fetches into ``.cache/kafka-broker`` (``make .cache/kafka-broker/.fetched``).

It listens on 127.0.0.1 only, on free ports chosen once (a ``restart()`` keeps them and the log
directory, so a test can take the broker away in the middle of an ingest run and bring it back),
keeps its data and its log file (``broker.log``, the JVM's stdout and stderr) in a temporary
directory, and is stopped at interpreter exit whatever happens to the test that started it.
Administration and producing go through ``confluent_kafka`` (the client the project uses).

    broker = KafkaBroker()
    broker.start()                      # formats the storage on the first start (~2 s in all)
    broker.create_topic("t", partitions=3, config={"cleanup.policy": "compact"})
    broker.produce("t", [{"key": "k", "value": b"v", "partition": 2, "timestamp_ms": 1000}])
    broker.end_offsets("t")             # {0: 0, 1: 0, 2: 1}
    broker.stop()
"""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.processes import java_binary
from tests.support.server_process import ServerProcess, free_ports

ROOT = Path(__file__).resolve().parents[2]
JARS_DIR = ROOT / ".cache" / "kafka-broker"
KAFKA_VERSION = "4.3.1"  # tests/kafka-broker/pom.xml
FETCH_HINT = "run `make .cache/kafka-broker/.fetched` (make test does it) to fetch the Kafka broker's jars"

Header = tuple[str, bytes | str | None]
Record = Mapping[str, Any] | Sequence[Any]

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
"""

# librdkafka's own log lines (connection refused while a broker restarts, retries) go here, not to
# stderr: pytest shows them with a failing test's captured log.
_CLIENT_LOG = logging.getLogger("tests.kafka_broker.client")



def new_cluster_id() -> str:
    """A random cluster id as Kafka's ``Uuid.randomUuid().toString()`` makes one.

    URL-safe base64 of 16 random bytes, never starting with ``-``: Kafka regenerates such ids
    because ``kafka-storage format -t -abc`` reads the id as an option (one in 64 ids did, and
    failed a CI run with "argument --cluster-id/-t: expected one argument").
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBrokerError(RuntimeError):
    """The broker could not be started, or a request to it failed."""


def jars_present(jars_dir: Path = JARS_DIR) -> bool:
    """Whether the broker's jars have been fetched into ``jars_dir``."""
    return any(jars_dir.glob("kafka_2.13-*.jar")) and any(jars_dir.glob("log4j-slf4j-impl-*.jar"))


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


class KafkaBroker(ServerProcess):
    """One single-node KRaft Kafka server (broker + controller) on 127.0.0.1.

    ``start()``/``stop()``/``kill()``/``restart()`` manage the process; ``bootstrap`` is the
    ``bootstrap.servers`` value; ``create_topic``, ``add_partitions``, ``delete_records``,
    ``delete_topic``, ``recreate_topic``, ``end_offsets``, ``start_offsets`` and ``produce`` talk
    to it. Every wait has a timeout, and every error carries the tail of the broker's log.
    """

    error = KafkaBrokerError
    what = "Kafka broker"
    start_timeout = 90.0
    stop_timeout = 30.0

    def __init__(self, jars_dir: Path | str = JARS_DIR, *, work_dir: Path | str | None = None,
                 heap: str = "512m", extra_config: Mapping[str, str] | None = None,
                 new_session: bool = False) -> None:
        super().__init__(work_dir, dir_prefix="versiq-kafka-", log_name="broker.log", new_session=new_session)
        self.jars_dir = Path(jars_dir)
        self.log_dir = self.work_dir / "data"
        self.config_file = self.work_dir / "server.properties"
        self.heap = heap
        self.extra_config = dict(extra_config or {})
        self.port, self.controller_port = free_ports(2)
        self.cluster_id = new_cluster_id()

    # -- process ------------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` of the broker: ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return self._java_command("kafka.Kafka", str(self.config_file))

    def _prepare(self, timeout: float) -> None:
        """The configuration, and the storage formatted on the first start."""
        if not jars_present(self.jars_dir):
            raise KafkaBrokerError(f"no Kafka jars in {self.jars_dir}: {FETCH_HINT}")
        self._write_config()
        if not (self.log_dir / "meta.properties").exists():
            self._format(timeout)

    def _java_command(self, main: str, *args: str) -> list[str]:
        return [java_binary(KafkaBrokerError), f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true", "-Djava.net.preferIPv4Stack=true",
                f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
                "-cp", str(self.jars_dir / "*"), main, *args]

    def _write_config(self) -> None:
        config = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            # A restart after kill() waits for the killed broker's session to expire before the
            # broker can register again (DUPLICATE_BROKER_REGISTRATION): 9 s by default.
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "4000",
            "log.retention.check.interval.ms": "1000",
            "log.segment.delete.delay.ms": "1000",
            "log.cleaner.backoff.ms": "1000",
            "log.flush.offset.checkpoint.interval.ms": "1000",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
        }
        config.update(self.extra_config)
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        (self.work_dir / "log4j2.properties").write_text(_LOG4J2)

    def _format(self, timeout: float) -> None:
        # What bin/kafka-storage.sh format --standalone does for a single combined node (Kafka 4's
        # quickstart): a dynamic quorum whose only voter is this controller.
        command = self._java_command("kafka.tools.StorageTool", "format", "--standalone",
                                     f"--cluster-id={self.cluster_id}", "-c", str(self.config_file))
        try:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                  cwd=self.work_dir)
        except subprocess.TimeoutExpired as exc:
            raise KafkaBrokerError(f"formatting the broker's storage took more than {timeout} s") from exc
        with open(self.log_file, "ab") as log:
            log.write(b"==== kafka.tools.StorageTool format ====\n" + done.stdout + done.stderr)
        if done.returncode != 0:
            raise self._error(f"formatting the broker's storage failed (exit {done.returncode})")

    def _wait_ready(self, deadline: float) -> None:
        # First the port (so the client does not log a connection refused per try), then a metadata
        # request that lists this node as a live (registered, unfenced) broker.
        while True:
            if not self.is_running():
                raise self._exited_error()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise self._error(f"the Kafka broker did not open 127.0.0.1:{self.port} in time")
            time.sleep(0.2)
        last: Exception | None = None
        admin = self._admin()
        while True:
            if not self.is_running():
                raise self._exited_error()
            try:
                metadata = admin.list_topics(timeout=2)
                if 1 in metadata.brokers:
                    return
            except Exception as exc:  # KafkaException: not ready yet
                last = exc
            if time.monotonic() > deadline:
                raise self._error(f"the Kafka broker did not answer metadata requests in time (last error: {last})")
            time.sleep(0.2)

    # -- administration -----------------------------------------------------------------------

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 5000},
                           logger=_CLIENT_LOG)

    def _result(self, futures: Mapping[Any, Any], what: str, timeout: float = 30.0) -> dict[Any, Any]:
        results = {}
        for key, future in futures.items():
            try:
                results[key] = future.result(timeout)
            except Exception as exc:
                raise self._error(f"{what} failed for {key}: {exc}") from exc
        return results

    def partitions(self, name: str, timeout: float = 10.0) -> int:
        """The number of partitions of topic ``name``."""
        metadata = self._admin().list_topics(topic=name, timeout=timeout)
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            raise KafkaBrokerError(f"topic {name!r}: {topic.error if topic is not None else 'not found'}")
        return len(topic.partitions)

    def _wait_partitions(self, name: str, count: int, timeout: float = 30.0) -> None:
        """Until the metadata shows ``count`` partitions of ``name``, each with a leader."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                topic = self._admin().list_topics(topic=name, timeout=5).topics.get(name)
                if (topic is not None and topic.error is None and len(topic.partitions) == count
                        and all(p.leader >= 0 for p in topic.partitions.values())):
                    return
            if time.monotonic() > deadline:
                raise self._error(f"topic {name!r} did not get {count} partitions with leaders in time")
            time.sleep(0.1)

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        """Create topic ``name`` (replication factor 1) with topic ``config`` (e.g.
        ``{"cleanup.policy": "compact"}``) and wait until all its partitions have a leader."""
        from confluent_kafka.admin import NewTopic

        topic = NewTopic(name, num_partitions=partitions, replication_factor=1,
                         config={k: str(v) for k, v in (config or {}).items()})
        admin = self._admin()  # kept until the futures are done: a destroyed client fails them
        self._result(admin.create_topics([topic], operation_timeout=30), "create_topics")
        self._wait_partitions(name, partitions)
        return name

    def new_topic(self, prefix: str = "topic", partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        """``create_topic`` under a fresh unique name (``prefix-<hex>``), which it returns.
        Time-based retention is off unless ``config`` sets ``retention.ms``: tests produce records
        stamped in 1970, which the broker's retention check (every second here) would delete."""
        return self.create_topic(f"{prefix}-{uuid.uuid4().hex[:12]}", partitions,
                                 {"retention.ms": "-1", **(config or {})})

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name``."""
        admin = self._admin()
        self._result(admin.delete_topics([name], operation_timeout=30), "delete_topics")

    def recreate_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None,
                       timeout: float = 30.0) -> str:
        """Delete topic ``name`` and create it again (``create_topic``): same name, new topic id,
        offsets from 0. The broker refuses the creation while the deletion is under way, so it
        is retried until ``timeout``."""
        self.delete_topic(name)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.create_topic(name, partitions, config)
            except KafkaBrokerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def add_partitions(self, name: str, total: int) -> None:
        """Grow topic ``name`` to ``total`` partitions (Kafka never shrinks a topic)."""
        from confluent_kafka.admin import NewPartitions

        admin = self._admin()
        self._result(admin.create_partitions([NewPartitions(name, total)], operation_timeout=30), "create_partitions")
        self._wait_partitions(name, total)

    def delete_records(self, name: str, before: Mapping[int, int]) -> dict[int, int]:
        """Delete the records of ``name`` below offset ``before[partition]`` (what retention does to
        old segments; ``-1`` means up to the end); returns each partition's new low watermark."""
        from confluent_kafka import TopicPartition

        admin = self._admin()
        futures = admin.delete_records([TopicPartition(name, p, o) for p, o in before.items()], operation_timeout=30)
        results = self._result(futures, "delete_records")
        return {tp.partition: int(deleted.low_watermark) for tp, deleted in results.items()}

    def _offsets(self, name: str, latest: bool) -> dict[int, int]:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
        request = {TopicPartition(name, p): spec for p in range(self.partitions(name))}
        admin = self._admin()
        results = self._result(admin.list_offsets(request, request_timeout=30), "list_offsets")
        return {tp.partition: int(info.offset) for tp, info in sorted(results.items(), key=lambda i: i[0].partition)}

    def end_offsets(self, name: str) -> dict[int, int]:
        """Each partition's end offset (high watermark: the offset the next record will get)."""
        return self._offsets(name, latest=True)

    def start_offsets(self, name: str) -> dict[int, int]:
        """Each partition's first offset still present (log start offset / low watermark)."""
        return self._offsets(name, latest=False)

    # -- producing ----------------------------------------------------------------------------

    def produce(self, name: str, records: Iterable[Record], timeout: float = 60.0,
                config: Mapping[str, Any] | None = None) -> list[tuple[int, int]]:
        """Produce ``records`` to topic ``name`` in order and wait for all of them; raise on any
        delivery error. A record is a mapping with ``key`` and ``value`` (bytes, str — UTF-8 — or
        None) and optional ``partition`` (None: the default partitioner by key), ``timestamp_ms``
        (None: now) and ``headers`` (a list of (name, bytes|str|None)); or a tuple
        ``(key, value[, partition[, timestamp_ms[, headers]]])``. Order within a partition is kept
        (idempotent producer). Returns each record's (partition, offset), in the order given.

        librdkafka takes a timestamp of 0 to mean "now", so ``timestamp_ms`` must be positive.
        """
        from confluent_kafka import Producer

        settings: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                                    "linger.ms": 5, "message.timeout.ms": int(timeout * 1000)}
        settings.update(config or {})
        producer = Producer(settings, logger=_CLIENT_LOG)
        positions: list[tuple[int, int] | None] = []
        errors: list[str] = []

        def delivered(index: int) -> Any:
            def callback(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(f"record {index}: {err}")
                else:
                    positions[index] = (msg.partition(), msg.offset())
            return callback

        for index, record in enumerate(records):
            key, value, partition, timestamp, headers = self._unpack(record)
            if timestamp is not None and timestamp <= 0:
                raise ValueError(f"record {index}: timestamp_ms must be positive (librdkafka reads 0 as now)")
            kwargs: dict[str, Any] = {"key": _as_bytes(key), "value": _as_bytes(value),
                                      "on_delivery": delivered(index)}
            if partition is not None:
                kwargs["partition"] = partition
            if timestamp is not None:
                kwargs["timestamp"] = timestamp
            if headers:
                kwargs["headers"] = [(h, _as_bytes(v)) for h, v in headers]
            positions.append(None)
            while True:
                try:
                    producer.produce(name, **kwargs)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
            producer.poll(0)
        remaining = producer.flush(timeout)
        if remaining:
            raise self._error(f"produce to {name!r}: {remaining} records not delivered within {timeout} s")
        if errors:
            raise self._error(f"produce to {name!r} failed: " + "; ".join(errors[:10]))
        return [p for p in positions if p is not None]

    @staticmethod
    def _unpack(record: Record) -> tuple[Any, Any, int | None, int | None, list[Header] | None]:
        if isinstance(record, Mapping):
            unknown = set(record) - {"key", "value", "partition", "timestamp_ms", "headers"}
            if unknown:
                raise ValueError(f"unknown record fields {sorted(unknown)}")
            return (record.get("key"), record.get("value"), record.get("partition"), record.get("timestamp_ms"),
                    record.get("headers"))
        fields = list(record)
        if not 2 <= len(fields) <= 5:
            raise ValueError("a record tuple is (key, value[, partition[, timestamp_ms[, headers]]])")
        fields += [None] * (5 - len(fields))
        return fields[0], fields[1], fields[2], fields[3], fields[4]
