"""Continuous mode's two intervals: a file or record that lands after a quiet spell starts a run
at once (local folders: the kernel's file notifications; Kafka topics: a consumer each, or, with
Java-only client settings, their end offsets asked every ``WATCH_INTERVAL_S``; S3 sources:
listed every trigger interval, ``ingest.watch``), and ``--trigger-interval`` is the least time
between the starts of two runs that committed something. ``run_continuous`` runs in this process
with the tests' session (real folders, a real broker, real runs); a helper thread lands the files
or produces the records and sends SIGTERM. (An S3 source's watch: tests/e2e/test_s3_warehouse.py.)"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any

from tests.support.ingest import store_versions, write_jsonl
from tests.support.service import free_port
from versiq import layout
from versiq.exits import EXIT_OK
from versiq.ingest import kafka, topic_watch
from versiq.ingest.config import Pipeline
from versiq.ingest.kafka import KafkaSource
from versiq.ingest.pipeline import StoreSpec
from versiq.ingest.run import run_pipeline
from versiq.ingest.streams import StreamSpec
from versiq.ingest.topic_watch import TopicChanges
from versiq.ingest.watch import WATCH_INTERVAL_S, listing_pause, run_continuous, run_watching, watch_interval

#: The trigger interval of the test: an hour. Spark's trigger fires on multiples of its interval,
#: so a query triggered every hour would start the first file's run at the next full hour.
HOUR_S = 3600.0


def _record(key: str, ts: int) -> str:
    return json.dumps({"key": key, "value": {"n": ts}, "timestamp": ts})


def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _run_continuous_with(spark: Any, warehouse: str, pipeline: Pipeline, interval_s: float, one_run: Any,
                         beside: Any, watch_s: float | None = None) -> int:
    """``run_continuous`` in this (the main) thread while ``beside()`` runs in a helper thread,
    which then sends SIGTERM (run_continuous stops after its current batch). An error of
    ``beside`` is raised here; SIGTERM is never sent once run_continuous has returned (the
    test's signal handlers are back by then)."""
    outcome: dict[str, BaseException] = {}
    returned = threading.Event()
    lock = threading.Lock()

    def helper() -> None:
        try:
            beside()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            outcome["error"] = exc
        finally:
            with lock:
                if not returned.is_set():
                    os.kill(os.getpid(), signal.SIGTERM)

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    thread = threading.Thread(target=helper, daemon=True)
    thread.start()
    try:
        code = run_continuous(spark, warehouse, pipeline, interval_s, one_run, lambda report: None, watch_s)
    finally:
        with lock:
            returned.set()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        thread.join(timeout=60)
    if "error" in outcome:
        raise outcome["error"]
    assert not thread.is_alive(), f"run_continuous returned {code} while the files were still landing"
    return code


def test_a_file_after_a_quiet_spell_starts_a_run_at_once_and_the_next_run_waits_for_the_interval(
        spark: Any, tmp_path: Any, caplog: Any) -> None:
    """Local folders: no streaming query; the kernel's notification of the file starts its run
    (the trigger and watch intervals are an hour, so no listing of the folder comes otherwise)."""
    source, warehouse = tmp_path / "src", str(tmp_path / "wh")
    source.mkdir()
    pipeline = Pipeline(stores=[StoreSpec(name="w", source=str(source), max_future_ms=None)])
    store = layout.table_path(warehouse, "w")
    starts: list[float] = []
    landed: dict[str, float] = {}
    seen: dict[str, Any] = {}

    def one_run() -> Any:
        starts.append(time.monotonic())
        return run_pipeline(spark, warehouse, pipeline)

    def files() -> None:
        _wait(lambda: any("watching 1 local source" in r.getMessage() for r in caplog.records), 60, "the watch")
        time.sleep(0.5)  # a quiet spell: the folder was listed, nothing is new
        landed["a"] = time.monotonic()
        write_jsonl(str(source), "a.jsonl", [_record("a", 1)])
        _wait(lambda: layout.has_table(store) and "a" in store_versions(store), 120, "the first run")
        write_jsonl(str(source), "b.jsonl", [_record("b", 2)])
        landed["b"] = time.monotonic()
        time.sleep(2)  # b is noticed at once, but its run waits an hour after the start of a's
        seen["starts"] = list(starts)

    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        code = _run_continuous_with(spark, warehouse, pipeline, HOUR_S, one_run, files, watch_s=HOUR_S)
    assert code == EXIT_OK
    assert not [r for r in caplog.records if r.name == "versiq.notify"]  # no fallback to polling
    assert not spark.streams.active and not os.path.exists(os.path.join(warehouse, "_versiq", "continuous"))
    first, *later = seen["starts"]
    assert first - landed["a"] < 30, first - landed["a"]  # at once: no listing came in the hour
    assert later == [], [t - landed["b"] for t in later]
    assert set(store_versions(store)) == {"a"}


def _store_with_a_file_done(spark: Any, tmp_path: Any, name: str) -> tuple[Any, str, Pipeline, str]:
    """A source folder holding ``a.jsonl`` and store ``name`` that has ingested it: (source,
    warehouse, pipeline, store path)."""
    source, warehouse = tmp_path / "src", str(tmp_path / "wh")
    source.mkdir()
    write_jsonl(str(source), "a.jsonl", [_record("a", 1)])
    pipeline = Pipeline(stores=[StoreSpec(name=name, source=str(source), max_future_ms=None)])
    run_pipeline(spark, warehouse, pipeline)
    return source, warehouse, pipeline, layout.table_path(warehouse, name)


def test_files_done_before_a_start_start_no_run_and_a_file_in_a_new_subfolder_starts_one(
        spark: Any, tmp_path: Any, caplog: Any) -> None:
    """The files done come from the store's newest commit (no checkpoint of its own): a restart
    with nothing new runs nothing. The watch is recursive: a folder made after the start is
    watched too, and a file landing in it starts a run."""
    source, warehouse, pipeline, store = _store_with_a_file_done(spark, tmp_path, "d")
    runs: list[float] = []

    def one_run() -> Any:
        runs.append(time.monotonic())
        return run_pipeline(spark, warehouse, pipeline)

    def files() -> None:
        _wait(lambda: any("watching 1 local source" in r.getMessage() for r in caplog.records), 60, "the watch")
        time.sleep(1)
        assert runs == []  # a.jsonl was done before the start
        (source / "2026" / "11").mkdir(parents=True)
        time.sleep(0.2)
        write_jsonl(str(source / "2026" / "11"), "b.jsonl", [_record("b", 2)])
        _wait(lambda: "b" in store_versions(store), 120, "the run of the file in the new folder")

    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        code = _run_continuous_with(spark, warehouse, pipeline, HOUR_S, one_run, files, watch_s=HOUR_S)
    assert code == EXIT_OK and len(runs) == 1
    assert set(store_versions(store)) == {"a", "b"}


def test_a_pipeline_with_derived_tables_runs_once_at_start_and_hidden_files_wake_nothing(
        spark: Any, tmp_path: Any) -> None:
    """``catch_up`` (what ``run_continuous`` sets for a pipeline with derived tables): one run at
    start with nothing new, since tables a stopped ingest left behind their inputs must catch up
    without a new file. Files under hidden names (a writer's temporary file) start no run; the
    rename into place does."""
    source, warehouse, pipeline, store = _store_with_a_file_done(spark, tmp_path, "c")
    runs: list[Any] = []
    stop: dict[str, Any] = {}

    def one_run() -> Any:
        report = run_pipeline(spark, warehouse, pipeline)
        runs.append(report)
        if len(runs) == 1:  # the catch-up run: nothing new, nothing committed
            assert not report.committed
            threading.Thread(target=land, daemon=True).start()
        else:
            os.kill(os.getpid(), signal.SIGTERM)
        return report

    def land() -> None:
        time.sleep(1)
        write_jsonl(str(source), ".b.jsonl.tmp", [_record("b", 2)])
        (source / "_staging").mkdir()
        write_jsonl(str(source / "_staging"), "c.jsonl", [_record("c", 3)])
        time.sleep(1)
        stop["runs_before_rename"] = len(runs)
        os.rename(source / ".b.jsonl.tmp", source / "b.jsonl")

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = run_watching(warehouse, pipeline.stores, HOUR_S, HOUR_S, one_run, lambda report: None,
                            catch_up=True)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == EXIT_OK and len(runs) == 2 and stop["runs_before_rename"] == 1
    assert set(store_versions(store)) == {"a", "b"}


#: A Java client setting librdkafka has no same-meaning setting for: the topic is read with
#: Spark's Kafka source and watched by the streaming query (``kafka.driver_config``).
JAVA_ONLY = {"reconnect.backoff.max.ms": "1000"}


def _topic_pipeline(broker: Any, name: str, options: dict[str, str] | None = None) -> tuple[Pipeline, str]:
    """A store reading a new one-partition topic with client ``options`` (``JAVA_ONLY``: its end
    offsets polled with the Java client; none: watched by a consumer)."""
    topic = broker.new_topic(name, partitions=1, config={"retention.ms": "-1"})
    return Pipeline(stores=[StoreSpec(name=name, source="", max_future_ms=None,
                                      kafka=KafkaSource(broker.bootstrap, topic, options=options or {}))]), topic


def test_a_topic_is_watched_by_a_consumer_that_wakes_for_records_landed_after_the_last_rearm(
        kafka_broker: Any, monkeypatch: Any) -> None:
    """``TopicChanges`` over a real broker: the records there when the watch starts wake
    nothing (the first run reads them), one produced later wakes it, ``rearm`` (a run starting)
    forgets it and every record before it, and a partition the topic gains is watched from its
    first record."""
    monkeypatch.setattr(topic_watch, "PARTITIONS_RECHECK_S", 0.2)
    topic = kafka_broker.new_topic("watch", partitions=2)
    kafka_broker.produce(topic, [{"key": "old", "value": "1", "partition": p} for p in (0, 1)])
    changes = TopicChanges([KafkaSource(kafka_broker.bootstrap, topic)])
    try:
        assert not changes.wait(1.0)
        kafka_broker.produce(topic, [{"key": "new", "value": "2", "partition": 1}])
        _wait(lambda: changes.wait(0.1), 60, "the record to wake the watch")
        assert changes.wait(0.0)  # until a run starts
        kafka_broker.produce(topic, [{"key": "read", "value": "2", "partition": 0}])  # before the run: it reads it
        changes.rearm()
        assert not changes.wait(1.0)
        kafka_broker.add_partitions(topic, 3)
        kafka_broker.produce(topic, [{"key": "third", "value": "3", "partition": 2}])
        _wait(lambda: changes.wait(0.1), 60, "a record in the new partition to wake the watch")
    finally:
        changes.close()


def test_a_watch_of_two_topics_wakes_for_either_and_a_run_rearms_both(kafka_broker: Any) -> None:
    """Two topics: a record in either wakes the watch; ``rearm`` (a run starting, which reads
    both topics) moves both past what landed, so records the run read wake nothing more."""
    first, second = kafka_broker.new_topic("one"), kafka_broker.new_topic("two")
    changes = TopicChanges([KafkaSource(kafka_broker.bootstrap, first), KafkaSource(kafka_broker.bootstrap, second)])
    try:
        assert not changes.wait(0.5)
        kafka_broker.produce(second, [{"key": "b", "value": "1"}])
        _wait(lambda: changes.wait(0.1), 60, "a record of the second topic to wake the watch")
        kafka_broker.produce(first, [{"key": "a", "value": "1"}])  # before the run: it reads it
        changes.rearm()
        assert not changes.wait(1.0)
        kafka_broker.produce(first, [{"key": "a", "value": "2"}])
        _wait(lambda: changes.wait(0.1), 60, "a record of the first topic to wake the watch")
    finally:
        changes.close()


def test_a_read_committed_watch_wakes_for_a_transaction_committed_after_it_started(kafka_broker: Any) -> None:
    """Under ``isolation.level=read_committed`` a run reads up to the last stable offset, so the
    watch starts there too: records of a transaction still open when it starts wake it once the
    transaction commits (watching from the high watermark would skip them)."""
    from confluent_kafka import Producer

    topic = kafka_broker.new_topic("txn", partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"versiq-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"1")
    producer.flush(30)
    source = KafkaSource(kafka_broker.bootstrap, topic, options={"isolation.level": "read_committed"})
    changes = TopicChanges([source])
    try:
        assert not changes.wait(1.0)
        producer.commit_transaction(30)
        _wait(lambda: changes.wait(0.1), 60, "the committed transaction to wake the watch")
    finally:
        changes.close()


def test_a_topic_whose_broker_does_not_answer_is_asked_again_in_one_line_each_time_until_stopped(
        monkeypatch: Any, caplog: Any, capfd: Any) -> None:
    """Continuous mode started while the broker is down: each attempt to watch the topic is one
    warning (librdkafka's own lines go to the debug log, not stderr), and a stop ends the wait."""
    from versiq.ingest.watch import _asked

    monkeypatch.setattr(topic_watch, "METADATA_TIMEOUT_S", 1)
    started = time.monotonic()

    def stopped() -> bool:
        return sum("cannot watch kafka:t" in r.getMessage() for r in caplog.records) >= 2

    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        assert _asked(lambda: TopicChanges([KafkaSource(f"127.0.0.1:{free_port()}", "t")]), 0.2, stopped) is None
    assert time.monotonic() - started < 60
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("trying again in 0.2s" in r.getMessage() for r in warnings), warnings
    assert "rdkafka" not in capfd.readouterr().err


def test_a_topic_readable_here_needs_no_streaming_query_and_its_records_start_runs(
        spark: Any, tmp_path: Any, caplog: Any, kafka_broker: Any) -> None:
    """A topic whose settings librdkafka takes: ``run_continuous`` watches it with a consumer, no
    streaming query and no checkpoint; the run at start reads what the topic held before, and a
    record produced later starts a run without any listing (the intervals are an hour: only the
    wake-up can start it)."""
    pipeline, topic = _topic_pipeline(kafka_broker, "woken")
    kafka_broker.produce(topic, [{"key": "before", "value": "1", "timestamp_ms": 1}])
    warehouse = str(tmp_path / "wh")
    store = layout.table_path(warehouse, "woken")
    queries: list[int] = []

    def records() -> None:
        _wait(lambda: layout.has_table(store) and "before" in store_versions(store), 120, "the run at start")
        queries.append(len(spark.streams.active))
        kafka_broker.produce(topic, [{"key": "after", "value": "2", "timestamp_ms": 2}])
        _wait(lambda: "after" in store_versions(store), 120, "the record's run")

    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        code = _run_continuous_with(spark, warehouse, pipeline, 0.1, lambda: run_pipeline(spark, warehouse, pipeline),
                                    records, watch_s=HOUR_S)
    assert code == EXIT_OK
    assert any("watching 1 Kafka topic(s) for new records" in r.getMessage() for r in caplog.records)
    assert queries == [0] and not os.path.exists(os.path.join(warehouse, "_versiq", "continuous"))
    assert set(store_versions(store)) == {"before", "after"}


def test_a_pipeline_of_a_folder_and_a_topic_is_woken_by_either(spark: Any, tmp_path: Any, caplog: Any,
                                                                 kafka_broker: Any) -> None:
    """Both kinds of sources in one pipeline: one loop waits on the folder's notifications and
    the topic's consumer, and a file and, later, a record each start a run (the record's can
    only come from the consumer: a topic is never listed)."""
    topic_pipeline, topic = _topic_pipeline(kafka_broker, "topic")
    source, warehouse = tmp_path / "src", str(tmp_path / "wh")
    source.mkdir()
    pipeline = Pipeline(stores=[StoreSpec(name="files", source=str(source), max_future_ms=None),
                                *topic_pipeline.stores])
    files, records = layout.table_path(warehouse, "files"), layout.table_path(warehouse, "topic")

    def both() -> None:
        _wait(lambda: any("watching 1 local source(s) for new files (file notifications) and 1 Kafka topic(s)"
                          in r.getMessage() for r in caplog.records), 60, "the watch")
        write_jsonl(str(source), "a.jsonl", [_record("a", 1)])
        _wait(lambda: layout.has_table(files) and "a" in store_versions(files), 120, "the file's run")
        kafka_broker.produce(topic, [{"key": "r", "value": "1", "timestamp_ms": 5}])
        _wait(lambda: layout.has_table(records) and "r" in store_versions(records), 120, "the record's run")

    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        code = _run_continuous_with(spark, warehouse, pipeline, 0.1,
                                    lambda: run_pipeline(spark, warehouse, pipeline), both, watch_s=HOUR_S)
    assert code == EXIT_OK and not spark.streams.active


def test_a_topic_only_the_java_client_reads_is_polled_and_its_broker_going_away_is_one_warning(
        spark: Any, tmp_path: Any, caplog: Any, kafka_broker: Any, monkeypatch: Any) -> None:
    """A topic whose client settings librdkafka cannot take: its end offsets are asked with the
    Java client every watch interval (``topic_watch.TopicPolls``), no streaming query; the run at
    start reads what the topic held, and a record produced later starts a run (a topic is never
    listed: only the poll can start it). The pipeline's folder of 3,000 files (a listing of
    about 20 ms of CPU) is watched by the kernel, so the polls are not slowed by listing it at
    each one (``watch._Listing``). The broker stops mid-watch: the polls that fail start no run
    and say so in one warning (not one per poll), the watch says once that it reaches the broker
    when it is back, and the record produced then starts the run. (The end offsets' and the
    partitions' timeouts are cut to 2 s so that a failing poll fails soon.)"""
    monkeypatch.setattr(topic_watch, "METADATA_TIMEOUT_S", 2)
    monkeypatch.setattr(kafka, "METADATA_TIMEOUT_S", 2)  # the partitions, asked again every 10 s
    topic_pipeline, topic = _topic_pipeline(kafka_broker, "polled", JAVA_ONLY)
    kafka_broker.produce(topic, [{"key": "before", "value": "1", "timestamp_ms": 1}])
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(3000):
        (folder / f"f{i:04d}.jsonl").write_text("")
    pipeline = Pipeline(stores=[*topic_pipeline.stores, StoreSpec(name="many", source=str(folder))])
    warehouse = str(tmp_path / "wh")
    store = layout.table_path(warehouse, "polled")
    runs: list[int] = []

    def one_run() -> Any:
        runs.append(1)
        return run_pipeline(spark, warehouse, pipeline)

    def said(text: str) -> list[Any]:
        return [r for r in caplog.records if text in r.getMessage()]

    def records() -> None:
        _wait(lambda: layout.has_table(store) and "before" in store_versions(store), 120, "the run at start")
        time.sleep(1.0)  # ten polls with nothing new: no run
        kafka_broker.stop()
        try:
            _wait(lambda: said("asking again every poll"), 60, "the watch's warning")
            time.sleep(3)  # more failing polls: no second warning, no run
        finally:
            kafka_broker.ensure_running()
        _wait(lambda: said("the watch reaches the broker again"), 120, "the watch back")
        assert len(runs) == 1, runs
        kafka_broker.produce(topic, [{"key": "after", "value": "2", "timestamp_ms": 2}])
        _wait(lambda: "after" in store_versions(store), 120, "the record's run")

    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        code = _run_continuous_with(spark, warehouse, pipeline, 1.0, one_run, records, watch_s=0.1)
    assert code == EXIT_OK
    assert said("watching 1 local source(s) for new files (file notifications) and 1 Kafka topic(s) for new "
                "records (their end offsets every 0.1s)")
    assert not said("listing the sources used"), "the watched folder was listed at every poll"
    [warning] = said("asking again every poll")
    assert warning.levelno == logging.WARNING and topic in warning.getMessage()
    assert len(said("the watch reaches the broker again")) == 1
    assert not spark.streams.active and not os.path.exists(os.path.join(warehouse, "_versiq", "continuous"))
    assert set(store_versions(store)) == {"before", "after"}


def test_sources_are_checked_every_100ms_except_on_s3_unless_a_watch_interval_is_given() -> None:
    local = StoreSpec(name="f", source="/data/in")
    topic = StoreSpec(name="k", source="", kafka=KafkaSource("127.0.0.1:9092", "t"))
    s3 = StreamSpec(name="s", source="s3://bucket/in")
    assert watch_interval([local, topic], 5.0) == WATCH_INTERVAL_S == 0.1
    assert watch_interval([local], 0.05) == 0.05  # a shorter trigger interval is checked as often
    assert watch_interval([local, s3], 5.0) == 5.0  # a LIST request per check
    assert watch_interval([local, s3], 5.0, 0.5) == 0.5  # --watch-interval: the user's choice
    assert watch_interval([local], 5.0, 30.0) == 5.0


def test_a_costly_listing_of_what_cannot_notify_is_repeated_less_often_but_at_least_every_trigger_interval(
        ) -> None:
    """A folder of many files on a file system without notifications (or beside a polled topic)
    is listed with at most a twentieth of a core (``LISTING_SHARE``): a listing of 20 ms of CPU
    every 0.4 s, not ten times a second; a cheap one every watch interval; never less often than
    the trigger interval, when every source is listed anyway."""
    assert listing_pause(0.1, 5.0, 0.001) == 0.1
    assert abs(listing_pause(0.1, 5.0, 0.02) - 0.4) < 1e-9
    assert listing_pause(0.1, 1.0, 0.2) == 1.0
    assert listing_pause(0.5, 5.0, 0.02) == 0.5  # --watch-interval longer than the listing's pace
