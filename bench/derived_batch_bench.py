"""Where an incremental derived pass's time goes: small batches through each operator, broken
down by phase, for this checkout and (``--baseline-checkout``) an earlier one in the same run.

The sources and operators are ``derived_bench.py``'s (seed 42): a build of ``--records``
orders (and the other sources in proportion), then batches of each size in ``--batches``
(default 10 and 10,000 orders / clicks, the other sources in ``derived_bench``'s proportions),
each with timestamps after the one before, ``--repeat`` times. After every batch's ingest, one
``run_pipeline`` per operator derives it (its sources have nothing new). Below
``VERSIQ_DERIVE_HERE_RECORDS`` a pass runs in the driver, so every phase is in this process and
is timed by wrapping its function:

- ``read``: the pass's source records (``job.records_here``, DuckDB) or ``run_job`` (Spark);
- ``process``: the topology (``job.partition_runner``'s generator), ``to_spark`` the results as a
  Spark frame (``job.local_frame``);
- ``commit sides``: ``_emitted``, ``_rejected`` and ``_subscriptions`` (``commit_sides``, or
  ``commit_side`` per table in code before it, also timed one by one: ``commit _emitted`` ...),
  and ``commit table`` (``commit_store``), each with the Spark jobs it ran;
- ``other``: the rest of the pass (``tables[name].seconds`` minus the above: locks, snapshots,
  the state of the inputs).

Each checkout runs in its own process (its own SparkSession, warmed up by a throwaway run), one
after the other, ``--rounds`` times alternating; the load average is kept with every figure.
Prints a table (median over repeats) and writes ``bench/results/derived-batch-<date>.json``.

    .venv/bin/python bench/derived_batch_bench.py [--records 50000] [--batches 10,10000] \\
        [--baseline-checkout /tmp/base] [--rounds 1] [--profile fk_join]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import functools
import importlib
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from machine import baseline_env, loadavg, uptime, write_result  # noqa: E402

GOAL_OPERATORS = ("filter", "join", "fk_join", "aggregate")


# -- one checkout's measurement (``--inner``) ------------------------------------------------

PHASES: dict[str, float] = {}
JOBS: dict[str, int] = {}


def _jobs(spark: Any) -> int:
    # one py4j call (a Java int[]), not one per job as the Python status tracker's list
    return len(spark.sparkContext._jsc.sc().statusTracker().getJobIdsForGroup("bench"))


def instrument(spark: Any) -> None:
    import versiq.ingest.derived.derive as derive
    import versiq.ingest.derived.job as job

    def timed(fn: Any, label: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            names = label(*a, **kw) if callable(label) else label
            t, j = time.perf_counter(), _jobs(spark)
            try:
                return fn(*a, **kw)
            finally:
                for name in [names] if isinstance(names, str) else names:
                    PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - t
                    JOBS[name] = JOBS.get(name, 0) + _jobs(spark) - j
        return wrapper

    job.records_here = timed(job.records_here, "read")
    derive.run_job = timed(derive.run_job, "spark job (read+process)")
    job.local_frame = timed(job.local_frame, "to_spark")
    runner = job.partition_runner

    def partition_runner(*args: Any) -> Any:  # (work) now, (work, names) in code before
        run = runner(*args)

        def timed_run(batches: Any) -> Any:
            it = run(batches)
            while True:
                t = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    PHASES["process"] = PHASES.get("process", 0.0) + time.perf_counter() - t
                    return
                PHASES["process"] = PHASES.get("process", 0.0) + time.perf_counter() - t
                yield item
        return timed_run

    job.partition_runner = partition_runner
    if hasattr(derive, "commit_sides"):  # side tables committed at once: one figure for them all
        derive.commit_sides = timed(derive.commit_sides, "commit sides")
    else:  # one after the other (the code before)
        derive.commit_side = timed(derive.commit_side, lambda path, side, *a, **kw: (f"commit {side}", "commit sides"))
    derive.commit_store = timed(derive.commit_store, "commit table")
    derive._commit = timed(derive._commit, "commit (all)")


def inner(args: argparse.Namespace) -> None:
    # versiq from PYTHONPATH (the measured checkout), before derived_bench puts this one first
    importlib.import_module("versiq.ingest")
    import derived_bench as db

    from versiq.ingest.run import run_pipeline
    from versiq.ingest.spark import get_spark

    root = args.inner
    ops = [o for o in args.operators.split(",") if o]
    if args.raw_local_fs:  # an experiment: Hadoop's local file system without its checksum files
        import versiq.ingest.spark as spark_module

        with_delta = spark_module._with_delta
        spark_module._with_delta = lambda builder: with_delta(builder).config(  # type: ignore[attr-defined]
            "spark.hadoop.fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem").config(
            "spark.hadoop.fs.AbstractFileSystem.file.impl", "org.apache.hadoop.fs.local.RawLocalFs")
    spark = get_spark("local[*]")
    spark.sparkContext.setJobGroup("bench", "derived batch bench")
    db.warm_up(spark, root)
    instrument(spark)
    here = os.path.join(root, f"run-{os.getpid()}")
    shutil.rmtree(here, ignore_errors=True)
    steps = json.loads(args.steps)
    import versiq.ingest.derived.derive as derive

    out: dict[str, Any] = {"python_path": os.environ.get("PYTHONPATH"), "derive": derive.__file__, "batches": []}
    print(f"  code: {derive.__file__}", flush=True)
    for step, size in steps:
        db.link_step(root, here, step)
        ingest = db.ingest_sources(spark, here)
        entry: dict[str, Any] = {"size": size, "ingest_s": ingest["seconds"], "operators": {}}
        for op in ops:
            pipeline = db.operator_pipeline(here, op)
            name = pipeline.tables[0].name
            PHASES.clear()
            JOBS.clear()
            load = os.getloadavg()[0]
            prof = cProfile.Profile() if size and op in args.profile.split(",") and step == steps[-1][0] else None
            if prof:
                prof.enable()
            jobs = _jobs(spark)
            rep = run_pipeline(spark, os.path.join(here, "warehouse"), pipeline)
            if prof:
                prof.disable()
            if rep.failed:
                raise RuntimeError(json.dumps(rep.to_json()))
            table = rep.tables[name]
            phases = {k: round(v, 3) for k, v in PHASES.items()}
            known = sum(v for k, v in PHASES.items() if k in ("read", "process", "to_spark", "commit (all)",
                                                                 "spark job (read+process)"))
            phases["other"] = round(table.seconds - known, 3)
            result = {"seconds": round(table.seconds, 3), "phases": phases, "jobs": dict(JOBS),
                      "spark_jobs": _jobs(spark) - jobs, "emitted": table.emitted, "load": round(load, 2)}
            if prof:
                s = io.StringIO()
                stats = pstats.Stats(prof, stream=s)
                stats.sort_stats("cumulative").print_stats(40)
                stats.print_callers("send_command")
                result["profile"] = s.getvalue()
            entry["operators"][op] = result
            print(f"  step {step} size {size:>6} {op:10s} {table.seconds:6.2f} s  {phases}  jobs {JOBS}", flush=True)
        out["batches"].append(entry)
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


# -- the outer run -----------------------------------------------------------------------------

def generate(root: str, records: int, batches: list[int], repeat: int) -> list[tuple[int, int]]:
    """Write the build (step 0) and the batches (steps 1..); returns [(step, size)] in order."""
    import derived_bench as db

    sizes = db.Sizes(records, 1000)
    db.write_sources(root, sizes, db.build_counts(sizes), 0)
    steps, shift = [(0, 0)], 0
    for _ in range(repeat):
        for size in batches:
            step = len(steps)
            shifted = copy.copy(sizes)
            shifted.records = records + shift  # the batch's timestamps follow the one before
            db.write_sources(root, shifted, db.batch_counts(size), step)
            shift += size
            steps.append((step, size))
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("VERSIQ_BENCH_WORK", "/tmp/versiq-bench"))
    ap.add_argument("--records", type=int, default=50_000, help="orders records of the build")
    ap.add_argument("--batches", default="10,10000", help="orders / clicks records of each batch size")
    ap.add_argument("--repeat", type=int, default=2, help="batches of each size")
    ap.add_argument("--operators", default=",".join(GOAL_OPERATORS))
    ap.add_argument("--baseline-checkout", help="a checkout of an earlier commit, measured in the same run")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of baseline and this checkout")
    ap.add_argument("--profile", default="", help="operators whose last batch is cProfiled")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--raw-local-fs", action="store_true",
                    help="also measure this checkout with Hadoop's RawLocalFileSystem for file:// (no .crc files)")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    ap.add_argument("--steps", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args)
        return
    started = datetime.now(UTC)
    root = os.path.join(args.work, "derived-batch")
    shutil.rmtree(root, ignore_errors=True)
    steps = generate(root, args.records, [int(b) for b in args.batches.split(",")], args.repeat)
    this = os.path.dirname(HERE)
    modes: dict[str, dict[str, str]] = {"current": {"PYTHONPATH": this}}
    if args.baseline_checkout:
        modes = {"previous": baseline_env(args.baseline_checkout), **modes}
    if args.raw_local_fs:
        modes["current+raw_local_fs"] = {"PYTHONPATH": this}

    def git(path: str) -> str:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()

    result: dict[str, Any] = {"started": started.isoformat(timespec="seconds"), "uptime_start": uptime(),
                              "records": args.records, "steps": steps, "operators": args.operators,
                              "commits": {"current": git(this)}, "runs": []}
    if args.baseline_checkout:
        result["commits"]["previous"] = git(args.baseline_checkout)
    for round_ in range(args.rounds):
        for mode, env in modes.items():
            print(f"round {round_ + 1}, {mode} (load {loadavg()})", flush=True)
            environ = {**os.environ, **env, "PYSPARK_PYTHON": sys.executable}
            extra = ["--raw-local-fs"] if mode.endswith("raw_local_fs") else []
            proc = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), "--inner", root, "--steps",
                                   json.dumps(steps), "--operators", args.operators, "--profile", args.profile, *extra],
                                  env=environ, capture_output=True, text=True)
            lines = proc.stdout.splitlines()
            for line in lines:
                if not line.startswith("RESULT "):
                    print(line, flush=True)
            found = [json.loads(line[7:]) for line in lines if line.startswith("RESULT ")]
            if proc.returncode or not found:
                print(proc.stderr[-5000:])
                raise SystemExit(f"{mode} failed")
            result["runs"].append({"mode": mode, "round": round_ + 1, **found[0]})
    result["uptime_end"] = uptime()
    summary: dict[str, Any] = {}
    for run in result["runs"]:
        for batch in run["batches"]:
            if not batch["size"]:
                continue
            for op, r in batch["operators"].items():
                key = f"{run['mode']} {op} {batch['size']}"
                summary.setdefault(key, []).append(r)
    print(f"\n{'mode operator batch':28s} {'median s':>8s}  {'runs':20s} median phases")
    for key, rs in summary.items():
        secs = sorted(r["seconds"] for r in rs)
        phases = {p: round(statistics.median(r["phases"].get(p, 0.0) for r in rs), 3)
                  for p in sorted({p for r in rs for p in r["phases"]})}
        loads = [r["load"] for r in rs]
        print(f"{key:28s} {statistics.median(secs):8.2f}  {str(secs):20s} {phases} load {min(loads)}-{max(loads)}")
    result["summary"] = {k: {"median_s": statistics.median(r["seconds"] for r in rs),
                             "seconds": [r["seconds"] for r in rs], "loads": [r["load"] for r in rs]}
                         for k, rs in summary.items()}
    print(result["uptime_start"])
    print(result["uptime_end"])
    print(write_result(args.results, "derived-batch", result, started))


if __name__ == "__main__":
    main()
