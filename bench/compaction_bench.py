"""Continuous mode's compaction (issue 17: a change visible in about a second, also while the
store is large): merging each bucket's recent files against rewriting every bucket of several
files whole (what ``compact_if_due`` did before, and ``versiq maintain`` still does), on copies
of one store, in one process and SparkSession.

The store: ``--keys`` x 10 events (``gen_changelog.make_events``, seed 42, built from Parquet),
then ``--batches`` runs of ``--batch`` events each (random existing keys, ``make_events(batch=)``),
each run writing a file into most of the 16 buckets, as continuous mode's micro-batches do.
Each policy then compacts its own copy of that store (``maintain.maintain_store``, recent_only
True: the merge; False: the whole rewrite, the baseline), ``--repeat`` times on fresh copies,
alternating, after a round that is not counted (the JVM's first pass over each policy's code),
and the same batch runs once more after the compaction (a micro-batch after it).
Wall time of the compaction call is the figure (DuckDB's resolution of the buckets, the Spark
write and its Delta commit, the vacuum check); both copies must answer alike (the store's
versions after the read rule, horizon applied, are compared).

The load generator is this process (``run_ingest`` and ``maintain_store`` in a warm session);
the machine's load average is recorded before and after each compaction.

    .venv/bin/python bench/compaction_bench.py [--keys 100000] [--batches 4] [--batch 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import gen_changelog as gen  # noqa: E402
from ingest_bench import VERSIONS, ensure_changelog, link_source  # noqa: E402
from machine import loadavg, uptime, write_result  # noqa: E402

from versiq import storage  # noqa: E402
from versiq.ingest import maintain  # noqa: E402
from versiq.ingest.pipeline import StoreSpec, run_ingest  # noqa: E402
from versiq.ingest.spark import get_spark  # noqa: E402
from versiq.layout import answerable_sql, read_rule_sql, read_state  # noqa: E402

POLICIES = {"merge_recent": True, "whole_buckets": False}


def _batch_file(work: str, keys: int, n: int, size: int, dest: str) -> None:
    tbl = gen.make_events(keys, VERSIONS, seed=42, batch=size, after_events=keys * VERSIONS + n * size)
    out = os.path.join(work, "compaction-batches", str(n))
    shutil.rmtree(out, ignore_errors=True)
    gen.write_changelog(tbl, out, "jsonl", files=1, prefix=f"batch-{n:03d}")
    for name in os.listdir(os.path.join(out, "jsonl")):
        shutil.copy(os.path.join(out, "jsonl", name), os.path.join(dest, name))


def _ingest(spark, warehouse: str, source: str) -> None:  # type: ignore[no-untyped-def]
    rep = run_ingest(spark, warehouse, [StoreSpec("s", source, history_retention_ms=gen.GRACE_MS)]).stores["s"]
    if rep.error:
        raise SystemExit(f"ingest failed: {rep.error}")


def _answers(path: str) -> tuple[int, int]:
    """(versions a query can return, a checksum of them): the read rule, without history that
    ended at or before its partition's horizon (a whole rewrite drops it, a merge keeps it)."""
    table = storage.delta_table(path)
    state = read_state(path, table.version())
    con = storage.duckdb_connect(path)
    try:
        row = con.sql("SELECT count(*), sum(hash(key, valid_from, valid_to, value)) FROM (SELECT * FROM "
                      f"read_parquet($files, hive_partitioning = false) {read_rule_sql('versioned')}) "
                      f"WHERE {answerable_sql(state.stream_time, gen.GRACE_MS)}",
                      params={"files": table.file_uris()}).fetchall()[0]
        return int(row[0]), int(row[1])
    finally:
        con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("VERSIQ_BENCH_WORK", "/tmp/versiq-bench"))
    ap.add_argument("--keys", type=int, default=100_000, help="keys of the store (x 10 versions)")
    ap.add_argument("--batches", type=int, default=4, help="runs after the build, before compacting")
    ap.add_argument("--batch", type=int, default=2_000, help="events per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("versiq.ingest").setLevel(logging.WARNING)  # one line per run: the rounds say it
    started = datetime.now(UTC)
    spark = get_spark("local[*]")
    changelog = ensure_changelog(args.work, args.keys)
    base = os.path.join(args.work, "compaction")
    shutil.rmtree(base, ignore_errors=True)
    source = link_source(os.path.join(changelog, "parquet"), os.path.join(base, "src"))
    warehouse = os.path.join(base, "wh")
    t0 = time.perf_counter()
    _ingest(spark, warehouse, source)
    build_s = time.perf_counter() - t0
    batches = os.path.join(base, "batches")
    os.makedirs(batches)
    for n in range(args.batches):
        _batch_file(args.work, args.keys, n, args.batch, batches)
        _ingest(spark, warehouse, batches)  # a StoreSpec of its own: the batches' folder
    files = len(storage.delta_table(os.path.join(warehouse, "s")).file_uris())
    print(f"store: {args.keys * VERSIONS:,} events built in {build_s:.1f} s, then {args.batches} runs of "
          f"{args.batch:,}: {files} files", flush=True)
    os.makedirs(os.path.join(base, "next"))
    _batch_file(args.work, args.keys, args.batches, args.batch, os.path.join(base, "next"))

    times: dict[str, list[float]] = {p: [] for p in POLICIES}
    after: dict[str, list[float]] = {p: [] for p in POLICIES}
    loads: list[list[float]] = []
    results: dict[str, dict] = {}
    answers: set[tuple[int, int]] = set()
    for r in range(-1, args.repeat):  # round -1 warms the JVM's paths of both policies: not counted
        order = list(POLICIES) if r % 2 == 0 else list(reversed(POLICIES))
        for policy in order:
            copy = os.path.join(base, f"copy-{policy}")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(warehouse, copy)
            loads.append(loadavg())
            t0 = time.perf_counter()
            result = maintain.maintain_store(copy, "s", spark=lambda: spark, recent_only=POLICIES[policy])
            seconds = time.perf_counter() - t0
            loads.append(loadavg())
            results[policy] = result
            answers.add(_answers(os.path.join(copy, "s")))
            nxt = os.path.join(copy, "src")  # the batches done, and the next one
            shutil.copytree(batches, nxt)
            shutil.copytree(os.path.join(base, "next"), nxt, dirs_exist_ok=True)
            t0 = time.perf_counter()
            _ingest(spark, copy, nxt)  # the micro-batch after the compaction
            next_s = time.perf_counter() - t0
            if r >= 0:
                times[policy].append(seconds)
                after[policy].append(next_s)
            print(f"round {r}: {policy:14s} compaction {seconds:6.2f} s "
                  f"({result['buckets_merged']} merged, {result['buckets_rewritten']} whole; "
                  f"{result['rows_before']:,} rows -> {result['rows_after']:,}); next run {next_s:.2f} s",
                  flush=True)
    spark.stop()
    if len(answers) != 1:
        raise SystemExit(f"the policies' stores answer differently: {answers}")
    summary = {p: {"median_s": round(statistics.median(times[p]), 2), "runs_s": [round(t, 2) for t in times[p]],
                   "next_run_median_s": round(statistics.median(after[p]), 2), "last": results[p]}
               for p in POLICIES}
    ratio = summary["merge_recent"]["median_s"] / summary["whole_buckets"]["median_s"]
    out = {"date": started.strftime("%Y-%m-%d"), "started": started.isoformat(timespec="seconds"),
           "machine": {"nproc": os.cpu_count(), "uptime_start": uptime(), "load_samples": loads},
           "store_events": args.keys * VERSIONS, "batches": args.batches, "batch_events": args.batch,
           "files_before": files, "policies": summary, "ratio_merge_to_whole": round(ratio, 3)}
    print(f"\ncompaction of a {args.keys * VERSIONS:,}-event store after {args.batches} runs of {args.batch:,} "
          f"({files} files), median of {args.repeat}:")
    for policy, s in summary.items():
        print(f"  {policy:14s} {s['median_s']:6.2f} s   next run {s['next_run_median_s']:.2f} s")
    print(f"  ratio merge / whole: {ratio:.2f}x   load {loads[0]} -> {loads[-1]}")
    write_result(args.results, "compaction", out, started)


if __name__ == "__main__":
    main()
