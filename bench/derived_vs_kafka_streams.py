"""Derived tables against Kafka Streams: the same records, the same operator, the same run.

bench/derived_bench.py's sources (``--records`` N orders and clicks, with their shipments,
customers and prices; seed 42) are generated once. For each operator (filter, join, fk_join,
aggregate, stream_join, as in derived_bench.py), one after the other:

1. **versiq**: the operator's derived pass over the ingested sources (one partition, a
   SparkSession ``local[*]``, after a throwaway warm-up run; the sources' Spark ingest is done
   once before and not counted): ``tables[name].seconds``, and the records it emitted.
2. **Kafka Streams**: conformance/kafka's OperatorBench.java: the differential test's topology
   of that operator (OperatorScenarios.topology: RocksDB versioned stores, no record cache)
   driven through a TopologyTestDriver with the same generated files, in versiq's merge order
   (rule 23: the head with the smallest timestamp, ties to stores, then the input declared first);
   a warm-up pass over the first ``--warm-up`` records first (reported, not counted). Its
   figure is the measured pass's wall time, reading the JSON lines included.

TopologyTestDriver is single-threaded, synchronous, in memory, without a broker: Kafka Streams'
processing on one core without produce or fetch round trips, favourable to Kafka Streams in that
respect; but it commits after every input record (writes the stores' positions, checkpoints
offsets), which an application does every ``commit.interval.ms`` (a JFR profile of the filter:
about a third of the samples; docs/benchmarks.md). versiq's pass at these sizes is a Spark job
(one task per partition: one here).

Output counts: versiq's emitted records against Kafka's output records (the differential test
compares the same records one by one on small random scenarios); a difference is printed.
Prints both throughputs side by side with the machine's load, and writes
``bench/results/derived-vs-kafka-streams-<date>-<N>.json``.

    .venv/bin/python bench/derived_vs_kafka_streams.py [--records 200000] [--operators filter,join]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from datetime import UTC, datetime
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import derived_bench as db  # noqa: E402
from machine import loadavg, uptime, write_result  # noqa: E402

from tests.support.kafka_streams import KAFKA_VERSION, run_operator_bench  # noqa: E402

#: Kafka's settings of each operator's topology (OperatorScenarios.java), read from the
#: derived table's entry in derived_bench.OPERATORS.
DAY_MS = 86_400_000


def source_files(root: str, name: str, step: int = 0) -> list[str]:
    """A source's generated files in versiq's processing order of one run (rule 20: relative path,
    compared code point by code point, then line; names starting with ``.`` or ``_`` unread)."""
    folder = os.path.join(root, "generated", f"step{step}", name)
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if not f.startswith((".", "_"))]


def kafka_scenario(op: str, files: dict[str, list[str]], warm_up: int) -> dict[str, Any]:
    """OperatorBench's input for ``op``: the topology derived_bench's table entry declares, its
    inputs with their files."""
    entry, inputs = db.OPERATORS[op]
    retention = 7 * DAY_MS  # the table's history_retention (derived_bench.operator_pipeline)
    assert db.GRACE_MS == retention
    spec: dict[str, Any] = {
        "op": op, "type": "inner", "outputKind": "versioned", "outputRetentionMs": retention,
        "warmUpRecords": warm_up,
        "inputs": [{"kind": db.KINDS[name], "historyRetentionMs": db.GRACE_MS if db.KINDS[name] != "stream" else 0,
                    "files": files[name]} for name in inputs],
    }
    if op == "filter":
        spec["filter"] = entry["filter"]
    elif op in ("join", "fk_join", "stream_join"):
        spec["type"] = entry[op].get("type", "inner")
        if op == "fk_join":
            spec["foreignKey"] = entry[op]["foreign_key"]
    elif op == "aggregate":
        aggregate = entry["aggregate"]
        assert set(aggregate) == {"count", "sum"}, aggregate  # OperatorScenarios' count_sum
        spec.update(groupBy=entry["group_by"], aggregator="count_sum", sumOf=aggregate["sum"],
                    outputKind="timestamped")  # as the differential test's aggregates
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("VERSIQ_BENCH_WORK", "/tmp/versiq-bench"))
    ap.add_argument("--records", type=int, default=200_000, help="orders records and clicks records")
    ap.add_argument("--regions", type=int, default=1000, help="distinct group keys of the aggregation")
    ap.add_argument("--operators", default=",".join(db.OPERATORS), help="comma-separated subset")
    ap.add_argument("--warm-up", type=int, default=50_000, help="records of Kafka Streams' warm-up pass")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    ops = [o for o in args.operators.split(",") if o]
    unknown = set(ops) - set(db.OPERATORS)
    if unknown:
        ap.error(f"unknown operator(s) {sorted(unknown)}; known: {', '.join(db.OPERATORS)}")
    sizes = db.Sizes(args.records, args.regions)
    root = os.path.join(args.work, f"derived-vs-kafka-{args.records}")
    shutil.rmtree(root, ignore_errors=True)
    db.instrument()

    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "date": started.strftime("%Y-%m-%d"), "started": started.isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "uptime_start": uptime()},
        "git": db.git_state(), "sizes": sizes.to_json(), "kafka_streams": KAFKA_VERSION,
        "kafka_driver": "TopologyTestDriver: single-threaded, synchronous, in memory, no broker; "
                        "commits after every input record",
        "operators": {o: db.OPERATORS[o][0] for o in ops},
    }
    t0 = time.perf_counter()
    build_in = db.write_sources(root, sizes, db.build_counts(sizes), 0)
    result["generate_s"] = round(time.perf_counter() - t0, 2)
    print(f"generated {build_in} in {result['generate_s']} s under {root}", flush=True)

    from versiq.ingest.spark import get_spark

    spark = get_spark("local[*]")
    result["spark"] = {"version": spark.version, "master": spark.sparkContext.master}
    db.warm_up(spark, root)
    here = os.path.join(root, "partitions-1")
    db.link_step(root, here, 0)
    ingest = db.ingest_sources(spark, here)
    result["ingest"] = {"seconds": ingest["seconds"], "per_source_s": ingest["per_source_s"]}
    files = {name: source_files(root, name) for name in build_in}

    per: dict[str, Any] = {}
    for op in ops:
        versiq = db.derive_one(spark, here, op, build_in, ingest["per_source_s"], False)
        load_before = loadavg()
        kafka = run_operator_bench(kafka_scenario(op, files, args.warm_up))
        kafka.update(load_before=load_before, load_after=loadavg())
        emitted = versiq["report"]["emitted"]
        same_input = kafka["records_in"] == versiq["input_records"]
        per[op] = {"records_in": versiq["input_records"],
                   "versiq": {k: versiq[k] for k in ("table", "derive_s", "records_per_s", "run_pipeline_wall_s",
                                                     "driver_rss_mb", "load_before", "load_after")}
                   | {"emitted": emitted, "phases_s": versiq["phases_s"]},
                   "kafka_streams": kafka,
                   "counts_match": emitted == kafka["output_count"] and same_input}
        print(f"  {op:12s} kafka streams {kafka['records_in']:>10,} records {kafka['seconds']:8.2f} s "
              f"{kafka['records_per_s']:>9,} rec/s  out {kafka['output_count']:,} (versiq emitted {emitted:,})  "
              f"warm-up {kafka.get('warm_up', {}).get('seconds')} s  load {load_before}", flush=True)
    result["operators_run"] = per
    result["machine"]["uptime_end"] = uptime()
    spark.stop()

    print()
    print(f"{args.records:,} orders / clicks; one partition. versiq = the derived pass (Spark local[*], "
          f"tables[name].seconds); Kafka Streams {KAFKA_VERSION} = TopologyTestDriver (single-threaded, "
          "synchronous, in memory, no broker, a commit per input record), warm JVM, reading the JSON lines "
          "included.")
    head = (f"{'operator':12s} {'records in':>10s} | {'versiq s':>8s} {'rec/s':>9s} {'emitted':>9s} | "
            f"{'kafka s':>8s} {'rec/s':>9s} {'outputs':>9s} | {'KS/versiq rec/s':>15s} {'counts':>6s}")
    print(head)
    print("-" * len(head))
    for op, r in per.items():
        v, k = r["versiq"], r["kafka_streams"]
        ratio = v["derive_s"] / k["seconds"] if k["seconds"] else 0
        print(f"{op:12s} {r['records_in']:>10,} | {v['derive_s']:8.2f} {v['records_per_s'] or 0:>9,} "
              f"{v['emitted']:>9,} | {k['seconds']:8.2f} {k['records_per_s']:>9,} {k['output_count']:>9,} | "
              f"{ratio:14.2f}x {'same' if r['counts_match'] else 'DIFF':>6s}")
    print(result["machine"]["uptime_start"])
    print(result["machine"]["uptime_end"])
    write_result(args.results, "derived-vs-kafka-streams", result, started, str(args.records))


if __name__ == "__main__":
    main()
