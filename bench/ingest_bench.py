"""Ingest benchmark (issue 3): full-build throughput and incremental-batch cost.

- Full build: a fresh store from a generated changelog of ``keys x 10`` events, once from
  Parquet and once from JSONL (8 files each); events/s = events read / run seconds.
  Default 1M events (100k keys x 10 versions); ``--big`` adds 10M (1M keys x 10).
- Baseline of the JSONL build (issue 17): right after it, one DuckDB query builds the versions
  of the same JSONL files (``duckdb_build``); the ratio of the two is printed.
- Warm (``--warm ROUNDS``, issue 17): the JSONL build again in the same session, each round
  followed by the DuckDB baseline, the ratio of the medians printed; ``--warm-baseline-env
  NAME=VALUE`` alternates each round's build with one under that setting (the same run's
  baseline of a change behind a variable, e.g. ``VERSIQ_PARSE_HERE_BYTES=0``).
- Incremental: after a full build, a 10k-event JSONL batch (random existing keys, 10% out of
  order, 1% tombstones, 0.1% late) is ingested ``--batches`` times into the same store; the
  median is the figure, for the 1M-version store and (``--big``) the 10M-version store, and the
  ratio between them (goal: within 1.5x, cost follows the batch, not the table).

One SparkSession (``get_spark("local[*]")``) for every run. Prints a table and writes
``bench/results/ingest-<date>.json``. ``--profile`` runs cProfile on the driver for one
incremental batch and stores the top functions by cumulative time (Spark actions show up as
the pipeline functions that trigger them).

    .venv/bin/python bench/ingest_bench.py [--big] [--work /tmp/versiq-bench]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gen_changelog as gen  # noqa: E402
from machine import loadavg, uptime, write_result  # noqa: E402

from versiq.ingest.pipeline import StoreSpec, run_ingest  # noqa: E402
from versiq.ingest.spark import get_spark  # noqa: E402

VERSIONS = 10
BATCH_EVENTS = 10_000


PHASES: dict[str, float] = {}
PHASE_NAMES = {
    "parse_run": "parse in the driver (a run of up to 128 MiB; for Spark's parse only its plan)",
    "_parse_stats": "parse + cache (first action)",
    "_parse_stats_here": "statistics of a run parsed in the driver (Arrow)",
    "classify_here": "decisions in the driver (DuckDB)",
    "rows_to_write_here": "the store's rows in the driver (DuckDB)",
    "existing_versions": "read existing versions (delta-rs/DuckDB)",
    "_outcome_rows": "Spark's decisions (window functions) + outcome counts, a run Spark parsed",
    "outcome_rows": "outcome counts of a run decided in the driver (DuckDB)",
    "write_rejected": "write + commit _rejected (delta-spark, before the store commit)",
    "commit_store": "write + commit the store's rows (delta-spark; Spark's rows_to_write for a run Spark decided)",
}


def instrument() -> None:
    """Time the pipeline's phases: each wrapped function runs the Spark actions of one phase
    (the pipeline is lazy, so a phase's seconds include the plan it triggers)."""
    import functools

    import versiq.ingest.pipeline as pipeline

    for name in PHASE_NAMES:
        fn = getattr(pipeline, name, None)
        if fn is None:
            continue

        def wrap(fn, name=name):  # type: ignore[no-untyped-def]
            @functools.wraps(fn)
            def timed(*a, **kw):  # type: ignore[no-untyped-def]
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - t
            return timed

        setattr(pipeline, name, wrap(fn))


def take_phases(total: float) -> dict[str, float]:
    out = {k: round(v, 2) for k, v in PHASES.items()}
    out["other (plan building, listing, state)"] = round(total - sum(PHASES.values()), 2)
    PHASES.clear()
    return out


def ensure_changelog(work: str, keys: int) -> str:
    out = os.path.join(work, f"changelog-{keys * VERSIONS}")
    marker = os.path.join(out, "_done.json")
    if not os.path.exists(marker):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        tbl = gen.make_events(keys, VERSIONS, seed=42)
        gen.write_changelog(tbl, out, "both", files=8 if keys * VERSIONS <= 1_000_000 else 16)
        info = {**gen.summary(tbl), "seconds": round(time.perf_counter() - t0, 2)}
        with open(marker, "w") as fh:
            json.dump(info, fh)
        print(f"generated {out}: {info}", flush=True)
    return out


def link_source(src_folder: str, dest: str) -> str:
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for name in sorted(os.listdir(src_folder)):
        os.link(os.path.join(src_folder, name), os.path.join(dest, name))
    return dest


def report_of(rep, name: str) -> dict:  # type: ignore[no-untyped-def]
    r = rep.stores[name]
    if r.error:
        raise RuntimeError(f"store {name} failed: {r.error}")
    return r.to_json()


def full_build(spark, work: str, keys: int, fmt: str) -> dict:  # type: ignore[no-untyped-def]
    events = keys * VERSIONS
    changelog = ensure_changelog(work, keys)
    warehouse = os.path.join(work, "wh-ingest")
    name = f"full_{fmt}_{events}"
    shutil.rmtree(os.path.join(warehouse, name), ignore_errors=True)
    source = link_source(os.path.join(changelog, fmt), os.path.join(work, "src", name))
    load_before = loadavg()
    t0 = time.perf_counter()
    rep = run_ingest(spark, warehouse, [StoreSpec(name, source, format=fmt, history_retention_ms=gen.GRACE_MS)])
    seconds = time.perf_counter() - t0
    r = report_of(rep, name)
    phases = take_phases(seconds)
    out = {"phases_s": phases, "format": fmt, "events": events, "keys": keys, "seconds": round(seconds, 2),
           "events_per_s": round(r["read"] / seconds), "report": r,
           "load_before": load_before, "load_after": loadavg()}
    print(f"full build {fmt:7s} {events:>10,} events: {seconds:7.1f} s  "
          f"{r['read'] / seconds:>9,.0f} events/s  (load {load_before} -> {out['load_after']})", flush=True)
    print(f"  phases: {phases}", flush=True)
    return out


def duckdb_build(work: str, keys: int) -> dict:
    """The baseline of a full build from JSONL (issue 17: "a one-query DuckDB window-function
    build of the same file, same run"): one DuckDB query reads the same JSONL files, takes each
    file's stream time as the running maximum of its timestamps in line order, drops records
    later than the grace period behind it, keeps the last record per (key, timestamp), computes
    each version's end with ``lead`` per key and writes the versions to one Parquet file. It is
    what a store's build does at its core, without its rules' details (per-partition stream
    time, rejection reasons, tombstone rules, raw text kept for rejects, buckets, Delta), so it
    bounds from below what a build could cost on this machine."""
    import duckdb

    src = os.path.join(ensure_changelog(work, keys), "jsonl")
    out = os.path.join(work, "duckdb-baseline")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    load_before = loadavg()
    t0 = time.perf_counter()
    con = duckdb.connect()
    con.execute(f"""
        COPY (
          WITH raw AS (
            SELECT key, value::VARCHAR AS value, "timestamp" AS ts, filename, row_number() OVER () AS seq
            FROM read_json('{src}/*.jsonl', format = 'newline_delimited', filename = true,
                           columns = {{key: 'VARCHAR', value: 'JSON', "timestamp": 'BIGINT'}})),
          timed AS (
            SELECT *, max(ts) OVER (PARTITION BY filename ORDER BY seq ROWS UNBOUNDED PRECEDING) AS stream_time
            FROM raw),
          kept AS (
            SELECT * FROM timed WHERE ts >= stream_time - {gen.GRACE_MS}
            QUALIFY row_number() OVER (PARTITION BY key, ts ORDER BY seq DESC) = 1)
          SELECT key, value, ts AS valid_from, lead(ts) OVER (PARTITION BY key ORDER BY ts) AS valid_to FROM kept
        ) TO '{out}/versions.parquet' (FORMAT parquet)""")
    seconds = time.perf_counter() - t0
    versions = con.sql(f"SELECT count(*) FROM '{out}/versions.parquet'").fetchall()[0][0]
    con.close()
    out_info = {"events": keys * VERSIONS, "seconds": round(seconds, 2), "versions": versions,
                "duckdb": duckdb.__version__, "load_before": load_before, "load_after": loadavg()}
    print(f"DuckDB one-query build {keys * VERSIONS:>10,} events: {seconds:7.2f} s ({versions:,} versions; "
          f"load {load_before} -> {out_info['load_after']})", flush=True)
    return out_info


def warm_builds(spark, work: str, keys: int, rounds: int, baseline_env: str | None) -> dict:  # type: ignore[no-untyped-def]
    """Issue 17's "same build in a warm session vs a one-query DuckDB build, same run": the
    JSONL full build again in the session that already built once, ``rounds`` times, each
    followed by ``duckdb_build``; with ``baseline_env`` (``NAME=VALUE``) each round also builds
    once with that variable set, alternating, as the same run's baseline of a setting."""
    settings: list[tuple[str, dict[str, str]]] = [("default", {})]
    if baseline_env:
        name, _, value = baseline_env.partition("=")
        settings.append((baseline_env, {name: value}))
    seconds: dict[str, list[float]] = {label: [] for label, _ in settings}
    duck: list[float] = []
    for r in range(rounds):
        for label, env in (settings if r % 2 == 0 else settings[::-1]):
            with mock.patch.dict(os.environ, env):
                print(f"warm build, round {r + 1}, {label}:", flush=True)
                seconds[label].append(full_build(spark, work, keys, "jsonl")["seconds"])
        duck.append(duckdb_build(work, keys)["seconds"])
    out: dict = {"events": keys * VERSIONS, "rounds": rounds, "seconds": seconds, "duckdb_s": duck,
                 "duckdb_median_s": statistics.median(duck)}
    for label, values in seconds.items():
        out[label] = {"median_s": statistics.median(values),
                      "ratio_to_duckdb": round(statistics.median(values) / statistics.median(duck), 2)}
    return out


def incremental(spark, work: str, keys: int, fmt: str, batches: int, profile: bool) -> dict:  # type: ignore[no-untyped-def]
    """Batches into the store that ``full_build(keys, fmt)`` left behind."""
    events = keys * VERSIONS
    warehouse = os.path.join(work, "wh-ingest")
    name = f"full_{fmt}_{events}"
    source = os.path.join(work, "src", name)
    runs = []
    prof_text = None
    first = len([f for f in os.listdir(source) if f.startswith("part-b")])  # batches of earlier runs
    for b in range(first, first + batches):
        batch_events = events + b * BATCH_EVENTS
        tbl = gen.make_events(keys, VERSIONS, seed=42, batch=BATCH_EVENTS, after_events=batch_events)
        batch_dir = os.path.join(work, "batches", name, str(b))
        shutil.rmtree(batch_dir, ignore_errors=True)
        gen.write_changelog(tbl, batch_dir, "jsonl", files=1, prefix=f"part-b{b:03d}")
        for f in os.listdir(os.path.join(batch_dir, "jsonl")):
            shutil.copy(os.path.join(batch_dir, "jsonl", f), os.path.join(source, f))
        spec = StoreSpec(name, source, history_retention_ms=gen.GRACE_MS)
        load_before = loadavg()
        prof = cProfile.Profile() if (profile and b == first + batches - 1) else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        rep = run_ingest(spark, warehouse, [spec])
        if prof:
            prof.disable()
        seconds = time.perf_counter() - t0
        r = report_of(rep, name)
        assert r["read"] == BATCH_EVENTS, r
        assert r["files"] == 1, r
        runs.append({"seconds": round(seconds, 2), "phases_s": take_phases(seconds), "report": r,
                     "load_before": load_before})
        print(f"incremental {BATCH_EVENTS:,} events into {events:>10,} versions: batch {b}: "
              f"{seconds:6.2f} s (load {load_before})  phases: {runs[-1]['phases_s']}", flush=True)
        if prof:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(35)
            prof_text = s.getvalue()
    secs = [r["seconds"] for r in runs]
    out = {"store_versions": events, "batch_events": BATCH_EVENTS, "median_s": statistics.median(secs),
           "runs": runs}
    if prof_text:
        out["driver_profile_top"] = prof_text
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("VERSIQ_BENCH_WORK", "/tmp/versiq-bench"))
    ap.add_argument("--keys", type=int, default=100_000, help="keys of the small scale (x10 events)")
    ap.add_argument("--big", action="store_true", help="also 10M events (1M keys x 10)")
    ap.add_argument("--only-big", action="store_true", help="only the 10M scale")
    ap.add_argument("--formats", default="parquet,jsonl")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--reuse-big", action="store_true",
                    help="with --big: no 10M full build, batches into the 10M store a previous run built")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--warm", type=int, default=0, metavar="ROUNDS",
                    help="after the first builds, the JSONL build ROUNDS more times in the same session, each "
                         "followed by the DuckDB baseline (issue 17's warm ratio)")
    ap.add_argument("--warm-baseline-env", metavar="NAME=VALUE",
                    help="with --warm: each round also builds once with this environment variable set "
                         "(e.g. VERSIQ_PARSE_HERE_BYTES=0), alternating with the default")
    ap.add_argument("--label", default="", help="results file ingest-<date>-<label>.json")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    instrument()
    scales = [] if args.only_big else [args.keys]
    if args.big or args.only_big:
        scales.append(1_000_000)
    started = datetime.now(UTC)
    result: dict = {"date": started.strftime("%Y-%m-%d"), "started": started.isoformat(timespec="seconds"),
                    "machine": {"nproc": os.cpu_count(), "uptime_start": uptime()},
                    "full_build": [], "incremental": []}
    t0 = time.perf_counter()
    spark = get_spark("local[*]")
    result["spark_start_s"] = round(time.perf_counter() - t0, 2)
    result["spark"] = {"version": spark.version, "master": spark.sparkContext.master,
                       "default_parallelism": spark.sparkContext.defaultParallelism}
    formats = args.formats.split(",")
    for keys in scales:
        for fmt in formats:
            if keys == 1_000_000 and args.reuse_big:
                continue
            result["full_build"].append(full_build(spark, args.work, keys, fmt))
            if fmt == "jsonl":  # the baseline of the same files, right after the build
                baseline = duckdb_build(args.work, keys)
                baseline["ratio"] = round(result["full_build"][-1]["seconds"] / baseline["seconds"], 2)
                result.setdefault("duckdb_baseline", []).append(baseline)
        if args.warm and "jsonl" in formats and not (keys == 1_000_000 and args.reuse_big):
            result["warm_jsonl"] = warm_builds(spark, args.work, keys, args.warm, args.warm_baseline_env)
        # batches go into the store built from the last format (the 10M store of an earlier run
        # with --reuse-big: it was built from JSONL)
        inc_fmt = "jsonl" if (keys == 1_000_000 and args.reuse_big) else formats[-1]
        if args.batches < 1:
            continue
        result["incremental"].append(incremental(spark, args.work, keys, inc_fmt, args.batches, args.profile))
    result["machine"]["uptime_end"] = uptime()
    if len(result["incremental"]) == 2:
        a, b = result["incremental"]
        result["incremental_ratio"] = round(b["median_s"] / a["median_s"], 2)
    spark.stop()

    print()
    print(f"{'benchmark':48s} {'seconds':>9s} {'figure':>16s}")
    for fb in result["full_build"]:
        print(f"{'full build ' + fb['format'] + ' ' + format(fb['events'], ','):48s} {fb['seconds']:9.1f} "
              f"{fb['events_per_s']:>10,} ev/s")
    for base in result.get("duckdb_baseline", []):
        print(f"{'DuckDB one-query build ' + format(base['events'], ','):48s} {base['seconds']:9.2f} "
              f"{'JSONL build ' + str(base['ratio']) + 'x':>16s}")
    warm = result.get("warm_jsonl")
    for label in warm["seconds"] if warm else []:
        print(f"{'warm JSONL build ' + format(warm['events'], ',') + ' (' + label + ', median)':48s} "
              f"{warm[label]['median_s']:9.2f} {'DuckDB ' + str(warm[label]['ratio_to_duckdb']) + 'x':>16s}")
    for inc in result["incremental"]:
        label = f"incremental {inc['batch_events']:,} into {inc['store_versions']:,} versions (median)"
        print(f"{label:48s} {inc['median_s']:9.2f} {'':>16s}")
    if "incremental_ratio" in result:
        print(f"{'incremental ratio (big / small)':48s} {result['incremental_ratio']:>26}x")
    print(result["machine"]["uptime_start"])
    print(result["machine"]["uptime_end"])
    write_result(args.results, "ingest", result, started,
                 args.label or ("big" if (args.big or args.only_big) else ""))


if __name__ == "__main__":
    main()
