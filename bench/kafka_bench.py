"""Kafka benchmark (issue 14): Kafka -> store throughput beside the same records from JSONL, and
freshness (record produced -> visible in ``versiq serve``) in continuous mode.

- **Throughput.** The generated changelog of ``bench/gen_changelog.py`` (``--keys`` x 10
  events, out of order, tombstones, late records) is produced to a 1-partition and a
  3-partition topic (a key always to the same partition) of a real single-node KRaft broker
  started here (``tests/support/kafka_broker.py``); the load generator is the
  ``confluent-kafka`` producer (librdkafka). Then, in one SparkSession, a fresh store is built
  from the JSONL files (the baseline of the same run), from the 1-partition topic and from the
  3-partition topic; events/s = records read / run seconds, and the ratio to JSONL.
- **Freshness.** ``versiq ingest --continuous --trigger-interval 200ms`` on a fresh topic and
  ``versiq serve`` (refresh 200 ms) on the same warehouse, both real processes; a producer
  writes ``--rate`` records/s for ``--seconds`` s, each a new key; every 100th is a probe whose
  produce time is noted, and a poller asks the service for the oldest probe not yet seen every
  20 ms; freshness = first 200 answer - produce time (p50, p99, max). The ingest's log is kept
  in ``<work>/<topic>-ingest.log`` (``VERSIQ_LOG_LEVEL=INFO`` shows each compaction's time).

With ``--run-pairs N``, the seconds of a store's run over 1,000 new records read in the driver and
by Spark, alternating, in one session (``run_seconds``).

With ``--baseline-checkout DIR`` (a checkout of an earlier commit, e.g. ``git archive HEAD |
tar -x -C DIR`` before a change) freshness is measured ``--rounds`` times for each code,
alternating (baseline, then this checkout), the baseline's processes run with
``machine.baseline_env`` and ``python -P``.

The machine load (1-minute load average) is recorded before and after every figure. Prints a
table and writes ``bench/results/kafka-<date>.json``.

    .venv/bin/python bench/kafka_bench.py [--keys 1000000] [--rate 1000 --seconds 60]
        [--skip-throughput] [--baseline-checkout DIR --rounds 2] [--run-pairs 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import zlib
from datetime import UTC, datetime

import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import gen_changelog as gen  # noqa: E402
from ingest_bench import ensure_changelog, link_source  # noqa: E402
from machine import baseline_env, loadavg, uptime, write_result  # noqa: E402

from tests.support.kafka_broker import KafkaBroker  # noqa: E402
from versiq.ingest.kafka import KafkaSource  # noqa: E402
from versiq.ingest.pipeline import StoreSpec, run_ingest  # noqa: E402


def produce_changelog(broker: KafkaBroker, topic: str, parquet_dir: str, partitions: int) -> dict:
    """Every record of the changelog's Parquet files, in processing order, to ``topic``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                         "compression.type": "lz4", "enable.idempotence": True,
                         "queue.buffering.max.messages": 1_000_000})
    sent = 0
    t0 = time.perf_counter()
    for name in sorted(os.listdir(parquet_dir)):
        table = pq.read_table(os.path.join(parquet_dir, name))
        for key, value, ts in zip(*(table.column(c).to_pylist() for c in ("key", "value", "timestamp")),
                                  strict=True):
            partition = zlib.crc32(key.encode()) % partitions
            while True:
                try:
                    producer.produce(topic, value=None if value is None else value.encode(), key=key.encode(),
                                     partition=partition, timestamp=ts)
                    break
                except BufferError:
                    producer.poll(0.05)
            sent += 1
            if sent % 100_000 == 0:
                producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError("records left undelivered")
    seconds = time.perf_counter() - t0
    return {"records": sent, "seconds": round(seconds, 1), "records_per_s": round(sent / seconds)}


def build(spark, warehouse: str, spec: StoreSpec) -> dict:  # type: ignore[no-untyped-def]
    load_before = loadavg()
    t0 = time.perf_counter()
    report = run_ingest(spark, warehouse, [spec]).stores[spec.name]
    seconds = time.perf_counter() - t0
    if report.error:
        raise RuntimeError(f"{spec.name}: {report.error}")
    out = {"store": spec.name, "read": report.read, "seconds": round(seconds, 1),
           "events_per_s": round(report.read / seconds), "load_before": load_before, "load_after": loadavg()}
    print(f"  {spec.name:<12} {report.read:>11,} records {seconds:8.1f} s {report.read / seconds:>10,.0f} events/s "
          f"(load {load_before} -> {out['load_after']})", flush=True)
    return out


def throughput(broker: KafkaBroker, work: str, keys: int) -> dict:
    from versiq.ingest.spark import get_spark

    changelog = ensure_changelog(work, keys)
    produced = {}
    topics = {}
    for partitions in (1, 3):
        topic = broker.create_topic(f"changelog-{partitions}p", partitions, {"retention.ms": "-1"})
        produced[partitions] = produce_changelog(broker, topic, os.path.join(changelog, "parquet"), partitions)
        topics[partitions] = topic
        print(f"produced {produced[partitions]} to {topic}", flush=True)
    spark = get_spark("local[*]")
    warehouse = os.path.join(work, "wh-kafka")
    shutil.rmtree(warehouse, ignore_errors=True)
    source = link_source(os.path.join(changelog, "jsonl"), os.path.join(work, "src", "kafka-jsonl"))
    runs = {"jsonl": build(spark, warehouse, StoreSpec("jsonl", source, format="jsonl",
                                                       history_retention_ms=gen.GRACE_MS, max_future_ms=None))}
    for partitions, topic in topics.items():
        kafka = KafkaSource(bootstrap=broker.bootstrap, topic=topic)
        runs[f"kafka_{partitions}p"] = build(spark, warehouse, StoreSpec(
            f"kafka_{partitions}p", kafka.name, kafka=kafka, history_retention_ms=gen.GRACE_MS, max_future_ms=None))
    spark.stop()
    for name in ("kafka_1p", "kafka_3p"):
        runs[name]["seconds_vs_jsonl"] = round(runs[name]["seconds"] / runs["jsonl"]["seconds"], 2)
    return {"produced": produced, "runs": runs}


def run_seconds(broker: KafkaBroker, work: str, pairs: int, records: int = 1000) -> dict:
    """Seconds of a store's run over ``records`` new records of a 1-partition topic, read in the
    driver (``kafka.read_here``, decided by DuckDB) and by Spark (``VERSIQ_PARSE_HERE_BYTES=0``),
    alternating, in one warm session: continuous mode's runs without the streaming trigger. The
    first run of each (a new store) is not counted."""
    import json

    from versiq.ingest.spark import get_spark

    spark = get_spark("local[*]")
    warehouse = os.path.join(work, "wh-run-seconds")
    shutil.rmtree(warehouse, ignore_errors=True)
    out: dict = {"records": records, "driver": [], "spark": [], "load_before": loadavg()}
    topics = {mode: broker.new_topic(f"runs-{mode}", 1) for mode in ("driver", "spark")}
    previous = os.environ.get("VERSIQ_PARSE_HERE_BYTES")
    try:
        for i in range(pairs + 1):
            for mode, topic in topics.items():
                os.environ["VERSIQ_PARSE_HERE_BYTES"] = "0" if mode == "spark" else str(128 << 20)
                broker.produce(topic, [{"key": f"k{i * records + j}", "value": json.dumps({"n": j}),
                                        "timestamp_ms": 1_000_000 + i * records + j} for j in range(records)])
                source = KafkaSource(bootstrap=broker.bootstrap, topic=topic)
                t0 = time.perf_counter()
                report = run_ingest(spark, warehouse, [StoreSpec(mode, source.name, kafka=source,
                                                                 max_future_ms=None)]).stores[mode]
                seconds = time.perf_counter() - t0
                if report.error or report.read != records:
                    raise RuntimeError(f"{mode}: {report.error or report.read}")
                if i:
                    out[mode].append(round(seconds, 3))
    finally:
        if previous is None:
            os.environ.pop("VERSIQ_PARSE_HERE_BYTES", None)
        else:
            os.environ["VERSIQ_PARSE_HERE_BYTES"] = previous
        spark.stop()
    out["load_after"] = loadavg()
    for mode in ("driver", "spark"):
        out[f"{mode}_median_s"] = round(statistics.median(out[mode]), 3)
    print(f"a run of {records} records: read in the driver {out['driver_median_s']} s, by Spark "
          f"{out['spark_median_s']} s (medians of {pairs}; load {out['load_before']} -> {out['load_after']})",
          flush=True)
    return out


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "VERSIQ_REFRESH_INTERVAL": "200ms", **(extra or {})}


def freshness(broker: KafkaBroker, work: str, rate: int, seconds: int, name: str = "fresh",
              checkout: str | None = None, probe_every: int = 100) -> dict:
    """Freshness of this checkout's code, or with ``checkout`` that checkout's (``baseline_env``)."""
    import httpx
    from confluent_kafka import Producer

    extra = baseline_env(checkout) if checkout else None
    python = [sys.executable, "-P"] if checkout else [sys.executable]
    topic = broker.create_topic(name, 1, {"retention.ms": "-1"})
    warehouse = os.path.join(work, f"wh-{name}")
    shutil.rmtree(warehouse, ignore_errors=True)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    producer.produce(topic, key=b"warmup", value=b"0", timestamp=int(time.time() * 1000))
    producer.flush(30)
    ingest_log = open(os.path.join(work, f"{name}-ingest.log"), "wb")  # noqa: SIM115 - closed with the process
    ingest = subprocess.Popen(
        [*python, "-m", "versiq.cli", "ingest", "--warehouse", warehouse, "--store", "fresh",
         "--kafka-bootstrap", broker.bootstrap, "--topic", topic, "--continuous", "--trigger-interval", "200ms"],
        env=_env(extra), stdout=subprocess.DEVNULL, stderr=ingest_log, start_new_session=True)
    port = 18_000 + os.getpid() % 1000
    while not os.path.isdir(os.path.join(warehouse, "fresh", "_delta_log")):
        time.sleep(0.2)
    serve = subprocess.Popen([*python, "-m", "versiq.cli", "serve", "--warehouse", warehouse,
                              "--port", str(port)], env=_env(extra), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    probes: list[tuple[str, float]] = []
    latencies: list[float] = []
    done = threading.Event()
    try:
        with httpx.Client(base_url=url, timeout=5) as client:
            while True:
                try:
                    if client.get("/v1/stores/fresh/keys/warmup").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)

            def produce() -> None:
                start = time.monotonic()
                for i in range(rate * seconds):
                    due = start + i / rate
                    delay = due - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    key = f"f{i:08d}"
                    producer.produce(topic, key=key.encode(), value=str(i).encode(),
                                     timestamp=int(time.time() * 1000))
                    producer.poll(0)
                    if i % probe_every == 0:
                        producer.flush(10)  # a probe's clock starts when the broker has it
                        probes.append((key, time.monotonic()))
                producer.flush(30)
                done.set()

            load_before = loadavg()
            thread = threading.Thread(target=produce)
            thread.start()
            seen = 0
            deadline = time.monotonic() + seconds + 120
            while (not done.is_set() or seen < len(probes)) and time.monotonic() < deadline:
                if seen < len(probes):
                    key, produced_at = probes[seen]
                    if client.get(f"/v1/stores/fresh/keys/{key}").status_code == 200:
                        latencies.append(time.monotonic() - produced_at)
                        seen += 1
                        continue
                time.sleep(0.02)
            thread.join()
    finally:
        for proc in (serve, ingest):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        ingest_log.close()
    latencies.sort()
    out = {"rate_per_s": rate, "seconds": seconds, "probe_every": probe_every, "probes": len(probes),
           "seen": len(latencies),
           "p50_s": round(statistics.median(latencies), 3),
           "p99_s": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
           "max_s": round(latencies[-1], 3), "load_before": load_before, "load_after": loadavg()}
    print(f"{name}: freshness at {rate}/s: p50 {out['p50_s']} s, p99 {out['p99_s']} s, max {out['max_s']} s "
          f"({out['seen']}/{out['probes']} probes; load {load_before} -> {out['load_after']})", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/versiq-bench")
    ap.add_argument("--keys", type=int, default=1_000_000, help="changelog keys (x 10 events)")
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--probe-every", type=int, default=100,
                    help="every Nth record produced is a probe (1 with a low --rate: each record after a quiet spell)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-freshness", action="store_true")
    ap.add_argument("--baseline-checkout", help="a checkout of an earlier commit: freshness of its code too")
    ap.add_argument("--rounds", type=int, default=1, help="freshness runs of each code (alternating)")
    ap.add_argument("--run-pairs", type=int, default=0,
                    help="also time this many runs of 1,000 records read in the driver and by Spark, alternating")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    result: dict = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "load_generator": "confluent-kafka producer (librdkafka), this process",
                    "machine": {"nproc": os.cpu_count(), "uptime_start": uptime()}}
    shutil.rmtree(os.path.join(args.work, "kafka"), ignore_errors=True)  # a fresh broker: topics of this run only
    broker = KafkaBroker(work_dir=os.path.join(args.work, "kafka"), heap="1g").start()
    try:
        if args.skip_freshness:
            pass
        elif args.baseline_checkout or args.rounds > 1:
            checkout = args.baseline_checkout and os.path.abspath(args.baseline_checkout)
            runs: dict[str, list[dict]] = {"this": [], **({"baseline": []} if checkout else {})}
            for i in range(args.rounds):
                for code in runs:
                    runs[code].append(freshness(broker, args.work, args.rate, args.seconds, f"fresh-{code}-{i}",
                                                checkout if code == "baseline" else None, args.probe_every))
            result["freshness_runs"] = runs
            result["baseline_checkout"] = args.baseline_checkout
            result["freshness"] = runs["this"][-1]
        else:
            result["freshness"] = freshness(broker, args.work, args.rate, args.seconds, probe_every=args.probe_every)
        if args.run_pairs:
            result["run_seconds"] = run_seconds(broker, args.work, args.run_pairs)
        if not args.skip_throughput:
            result["throughput"] = throughput(broker, args.work, args.keys)
    finally:
        broker.close()
    result["machine"]["uptime_end"] = uptime()
    write_result(os.path.join(HERE, "results"), "kafka", result, datetime.now(UTC))


if __name__ == "__main__":
    main()
