"""Can a bucket's compaction commit beside the runs that keep appending to it? (issue 44: compaction
off the critical path of continuous mode.) An experiment against the delta-spark in use, to run
again when it changes: what Delta does with a rewrite of bucket 0 while a second writer commits.

A small table partitioned by ``bucket`` (10 keys in bucket 0 written by run 1, and runs 2 and 3
appending one row each). A thread rewrites bucket 0 (``replaceWhere``), reading its rows inside
its own write through a Python function that waits; meanwhile the main thread commits as a
continuous run (an append to bucket 0) or as ``versiq erase`` (a delete of one row of bucket 0)
does, then lets the rewrite go on. Each case prints whether the rewrite committed (or Delta's
error) and the rows bucket 0 holds afterwards: an appended row must stay, an erased row must not
come back. The last two cases show that a rewrite whose predicate needs a data column (the merge
of a bucket's recent files, ``run > r``) cannot be written as a change of no data.

Measured on 2026-11-28 with delta-spark 4.4 (docs/benchmarks.md, "Kafka: a topic's headers"):
only a whole-bucket rewrite with ``dataChange=false`` commits beside an append. The last case,
Delta's OPTIMIZE of the files smaller than a bucket's oldest beside a thread that keeps
appending, is the merge continuous mode makes since (docs/benchmarks.md, "Compaction beside the
runs").

    .venv/bin/python bench/compaction_concurrency.py [--work /tmp/versiq-bench/concurrency]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from machine import loadavg  # noqa: E402

SCHEMA = "bucket int, key string, run long"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/versiq-bench/concurrency")
    args = ap.parse_args()
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from versiq.ingest.spark import get_spark

    spark = get_spark("local[2]")
    work = args.work
    table, started, go = os.path.join(work, "t"), os.path.join(work, "started"), os.path.join(work, "go")

    @F.udf("long")
    def waiting(run):  # type: ignore[no-untyped-def]  # the rewrite's tasks: says it started, waits for "go"
        open(started, "w").close()
        while not os.path.exists(go):
            time.sleep(0.05)
        return run

    def fresh() -> None:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        rows = [(0, f"k{i}", 1) for i in range(10)] + [(1, f"j{i}", 1) for i in range(10)]
        spark.createDataFrame(rows, SCHEMA).repartition(2).write.format("delta").partitionBy("bucket").save(table)
        for run in (2, 3):
            spark.createDataFrame([(0, f"k{run}", run), (1, f"j{run}", run)], SCHEMA) \
                .write.format("delta").mode("append").save(table)

    def append() -> None:  # a continuous run's commit
        spark.createDataFrame([(0, "new", 9)], SCHEMA).write.format("delta").mode("append").save(table)

    def erase() -> None:  # versiq erase's commit
        DeltaTable.forPath(spark, table).delete("key = 'k3'")

    def case(name: str, where: str, data_change: bool, during: Callable[[], None] | None,
             before: Callable[[], None] | None = None) -> dict[str, Any]:
        fresh()
        outcome: dict[str, Any] = {}

        def rewrite() -> None:
            try:
                rows = spark.read.format("delta").load(table).where(where)
                if before is not None:  # committed after the rewrite's plan, before its transaction
                    before()
                rows = rows.withColumn("run", waiting("run")).coalesce(1)
                writer = rows.write.format("delta").mode("overwrite").option("replaceWhere", where)
                if not data_change:
                    writer = writer.option("dataChange", "false")
                writer.save(table)
                outcome["rewrite"] = "committed"
            except Exception as exc:  # noqa: BLE001 - the outcome is the figure
                text = str(exc)
                start = text.find("[DELTA_")
                outcome["rewrite"] = text[start:start + 60] if start >= 0 else type(exc).__name__

        thread = threading.Thread(target=rewrite)
        thread.start()
        while not os.path.exists(started) and thread.is_alive():
            time.sleep(0.05)
        second = during is not None and thread.is_alive()  # the rewrite may have failed before reading
        if second and during is not None:
            during()
        open(go, "w").close()
        thread.join()
        keys = sorted(r.key for r in spark.read.format("delta").load(table).where("bucket = 0").collect())
        outcome.update(case=name, new_kept="new" in keys if second and during is append else None,
                       erased_back="k3" in keys if (second and during is erase) or before is erase else None)
        print(f"{name:<58} {outcome['rewrite']:<62} appended row kept: {outcome['new_kept']!s:<5} "
              f"erased row back: {outcome['erased_back']}", flush=True)
        return outcome

    def optimize_beside_appends() -> dict[str, Any]:
        """Delta's OPTIMIZE of bucket 0's files smaller than its oldest (the merge continuous mode
        makes), three times while another thread keeps appending one row at a time: each
        OPTIMIZE commits or fails, and every appended row must stay."""
        fresh()
        from deltalake import DeltaTable as Rs

        base = max(int(s) for s in Rs(table).get_add_actions(flatten=True).column("size_bytes").to_pylist())
        spark.conf.set("spark.databricks.delta.optimize.minFileSize", str(base))
        stop, appended = threading.Event(), list[str]()

        def appender() -> None:
            while not stop.is_set():
                run = 100 + len(appended)
                spark.createDataFrame([(0, f"a{run}", run)], SCHEMA).write.format("delta").mode("append").save(table)
                appended.append(f"a{run}")

        thread = threading.Thread(target=appender)
        thread.start()
        outcomes = []
        for _ in range(3):
            time.sleep(0.5)
            try:
                DeltaTable.forPath(spark, table).optimize().where("bucket = 0").executeCompaction()
                outcomes.append("committed")
            except Exception as exc:  # noqa: BLE001 - the outcome is the figure
                outcomes.append(type(exc).__name__)
        stop.set()
        thread.join()
        keys = {r.key for r in spark.read.format("delta").load(table).where("bucket = 0").collect()}
        outcome = {"case": "OPTIMIZE of small files beside appends", "rewrite": ", ".join(outcomes),
                   "new_kept": set(appended) <= keys, "erased_back": None, "appended": len(appended)}
        print(f"{outcome['case']:<58} {outcome['rewrite']:<62} appended rows kept: {outcome['new_kept']} "
              f"({len(appended)})", flush=True)
        return outcome

    print(f"load {loadavg()}", flush=True)
    results = [
        case("append beside a rewrite (data change)", "bucket = 0", True, append),
        case("append beside a rewrite (dataChange=false)", "bucket = 0", False, append),
        case("erase beside a rewrite (dataChange=false)", "bucket = 0", False, erase),
        case("erase before the rewrite's transaction (dataChange=false)", "bucket = 0", False, None, before=erase),
        case("append beside a merge, run > 1 (dataChange=false)", "bucket = 0 AND run > 1", False, append),
        case("append beside a merge, run > 1 (data change)", "bucket = 0 AND run > 1", True, append),
    ]
    results.append(optimize_beside_appends())
    print(f"load {loadavg()}; {len(results)} cases", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
