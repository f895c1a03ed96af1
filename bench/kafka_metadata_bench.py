"""Kafka run metadata benchmark: the seconds of ``kafka.topic_offsets`` alone (partitions,
earliest and end offsets, then the topic's id), asked with the Java client through a warm
session's JVM (``java_topic_offsets``, the code before) and with confluent-kafka
(``driver_topic_offsets``), alternating, on a 3-partition topic with records of a real
single-node KRaft broker started here (``tests/support/kafka_broker.py``).

Besides these two, ``--variants`` times the confluent-kafka path with librdkafka's default
``reconnect.backoff.ms`` (100 ms, which ``kafka.METADATA_RECONNECT_BACKOFF_MS`` lowers) and
with one admin client kept across calls (what keeping a client per source in continuous mode
would save), and a run's read in the driver (``kafka.read_here`` of the topic's 300 records)
as it is (librdkafka's default backoff) and with the metadata client's shorter one. The first
call of each (the JVM's classes, the Python module's import) is reported apart. Every call's answer is checked
equal to the Java client's (a read's: all 300 records).

With ``--cli N``, also the wall seconds of a one-shot ``versiq ingest`` of a store fed by a
1-partition topic (a process per run, ``VERSIQ_DRIVER_SOCKET=off``): a run over one new record,
then a run with nothing new, N of each; with ``--baseline-checkout DIR`` (a checkout of an earlier
commit, run with ``machine.baseline_env`` and ``python -P``) alternating with that code's.

    .venv/bin/python bench/kafka_metadata_bench.py [--calls 40] [--variants]
        [--cli 5 [--baseline-checkout DIR]]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from machine import baseline_env, loadavg, uptime, write_result  # noqa: E402

from tests.support.kafka_broker import KafkaBroker  # noqa: E402
from versiq.ingest import kafka  # noqa: E402


class KeptAdmin:
    """Inside ``with``, ``driver_topic_offsets`` gets the same admin client every call (made by
    the first call): what keeping one client per source across runs would save."""

    def __init__(self) -> None:
        self.client: Any = None
        self.real = kafka.metadata_client

    def __enter__(self) -> KeptAdmin:
        def kept(source: kafka.KafkaSource, config: Any) -> Any:
            if self.client is None:
                self.client = self.real(source, config)
            return self.client

        kafka.metadata_client = kept
        return self

    def __exit__(self, *exc: object) -> None:
        kafka.metadata_client = self.real


def cli_runs(broker: KafkaBroker, work: str, rounds: int, checkout: str | None) -> dict[str, Any]:
    """Wall seconds of ``versiq ingest`` of a Kafka store: one new record, then nothing new, for
    this checkout's code and ``checkout``'s (alternating), each code its own store and topic."""
    codes = {"this": None, **({"baseline": os.path.abspath(checkout)} if checkout else {})}
    out: dict[str, Any] = {code: {"one_record": [], "nothing_new": []} for code in codes}
    out["load_before"] = loadavg()
    for i in range(rounds + 1):
        for code, folder in codes.items():
            topic = f"cli-{code}-{os.getpid()}"
            if i == 0:
                broker.create_topic(topic, 1, {"retention.ms": "-1"})
                shutil.rmtree(os.path.join(work, f"wh-cli-{code}"), ignore_errors=True)
            broker.produce(topic, [{"key": f"k{i}", "value": str(i), "timestamp_ms": 1_000 + i}])
            env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "VERSIQ_DRIVER_SOCKET": "off",
                   **(baseline_env(folder) if folder else {"PYTHONPATH": ROOT})}
            args = [sys.executable, "-P", "-m", "versiq.cli", "ingest", "--warehouse",
                    os.path.join(work, f"wh-cli-{code}"), "--store", "s", "--kafka-bootstrap", broker.bootstrap,
                    "--topic", topic, "--max-future", "none"]
            for what in ("one_record", "nothing_new"):
                t0 = time.perf_counter()
                done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
                seconds = time.perf_counter() - t0
                if done.returncode != 0:
                    raise RuntimeError(f"{code} {what}: {done.stderr[-2000:]}")
                if i:  # the first run of each creates its store
                    out[code][what].append(round(seconds, 2))
    out["load_after"] = loadavg()
    for code in codes:
        for what in ("one_record", "nothing_new"):
            out[code][f"{what}_median_s"] = round(statistics.median(out[code][what]), 2)
        print(f"versiq ingest of a Kafka store, {code}: one record {out[code]['one_record_median_s']} s, nothing new "
              f"{out[code]['nothing_new_median_s']} s (medians of {rounds})", flush=True)
    print(f"load {out['load_before']} -> {out['load_after']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40, help="calls of each, alternating")
    ap.add_argument("--variants", action="store_true", help="also librdkafka's default backoff and a kept client")
    ap.add_argument("--cli", type=int, default=0, help="also this many one-shot versiq ingest runs of each kind")
    ap.add_argument("--baseline-checkout", help="a checkout of an earlier commit: its CLI runs too (with --cli)")
    ap.add_argument("--work", default="/tmp/versiq-bench")
    args = ap.parse_args()
    from versiq.ingest.spark import get_spark

    started = datetime.now(UTC)
    result: dict[str, Any] = {"date": started.isoformat(timespec="seconds"), "calls": args.calls,
                              "machine": {"nproc": os.cpu_count(), "uptime_start": uptime()}}
    shutil.rmtree(os.path.join(args.work, "kafka-metadata"), ignore_errors=True)  # a fresh broker
    broker = KafkaBroker(work_dir=os.path.join(args.work, "kafka-metadata")).start()
    spark = get_spark("local[1]")
    try:
        topic = broker.new_topic("metadata", 3)
        broker.produce(topic, [{"key": f"k{i}", "value": str(i), "partition": i % 3, "timestamp_ms": 1_000 + i}
                               for i in range(300)])
        source = kafka.KafkaSource(bootstrap=broker.bootstrap, topic=topic)

        def default_backoff() -> kafka.TopicOffsets:
            kept, kafka.METADATA_RECONNECT_BACKOFF_MS = kafka.METADATA_RECONNECT_BACKOFF_MS, 100
            try:
                return kafka.driver_topic_offsets(source)
            finally:
                kafka.METADATA_RECONNECT_BACKOFF_MS = kept

        offsets = kafka.driver_topic_offsets(source)
        read = kafka.KafkaRead(offsets.partitions, {p: (offsets.earliest[p], offsets.end[p]) for p in offsets.end},
                               topic_id=offsets.topic_id)

        def read_short_backoff() -> Any:
            import confluent_kafka

            kept = confluent_kafka.Consumer
            confluent_kafka.Consumer = lambda config: kept(  # type: ignore[assignment,misc]
                {**config, "reconnect.backoff.ms": kafka.METADATA_RECONNECT_BACKOFF_MS})
            try:
                return kafka.read_here(source, read, None).num_rows
            finally:
                confluent_kafka.Consumer = kept  # type: ignore[misc]

        ways: dict[str, Callable[[], Any]] = {
            "java": lambda: kafka.java_topic_offsets(spark, source),
            "confluent": lambda: kafka.driver_topic_offsets(source)}
        if args.variants:
            ways["confluent_default_backoff"] = default_backoff
            ways["confluent_kept_client"] = lambda: kafka.driver_topic_offsets(source)
            ways["read_here"] = lambda: kafka.read_here(source, read, None).num_rows
            ways["read_here_short_backoff"] = read_short_backoff
        times: dict[str, list[float]] = {name: [] for name in ways}
        first: dict[str, float] = {}
        expected = None
        kept = KeptAdmin()
        load_before = loadavg()
        for i in range(args.calls + 1):
            for name, ask in ways.items():
                t0 = time.perf_counter()
                if name == "confluent_kept_client":
                    with kept:
                        answer = ask()
                else:
                    answer = ask()
                seconds = time.perf_counter() - t0
                want = 300 if name.startswith("read_here") else expected or answer
                expected = expected or (None if name.startswith("read_here") else answer)
                if answer != want:
                    raise RuntimeError(f"{name}: {answer} != {want}")
                if i == 0:
                    first[name] = round(seconds, 4)
                else:
                    times[name].append(seconds)
        result["load_before"], result["load_after"] = load_before, loadavg()
        result["first_call_s"] = first
        result["per_call_ms"] = {name: {"median": round(statistics.median(t) * 1000, 1),
                                        "p10": round(sorted(t)[len(t) // 10] * 1000, 1),
                                        "p90": round(sorted(t)[len(t) * 9 // 10] * 1000, 1),
                                        "max": round(max(t) * 1000, 1)} for name, t in times.items()}
        for name, figures in result["per_call_ms"].items():
            print(f"{name:<28} median {figures['median']:7.1f} ms  p10 {figures['p10']:7.1f}  "
                  f"p90 {figures['p90']:7.1f}  max {figures['max']:7.1f}  first call {first[name]:.3f} s", flush=True)
        print(f"load {load_before} -> {result['load_after']}")
        spark.stop()  # the CLI runs start JVMs of their own
        if args.cli:
            result["cli"] = cli_runs(broker, args.work, args.cli, args.baseline_checkout)
            result["baseline_checkout"] = args.baseline_checkout
    finally:
        spark.stop()  # again after a failure: nothing to do when stopped
        broker.close()
    result["machine"]["uptime_end"] = uptime()
    write_result(os.path.join(HERE, "results"), "kafka-metadata", result, started)


if __name__ == "__main__":
    main()
