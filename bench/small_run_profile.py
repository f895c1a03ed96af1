"""Where the time of a small run goes, per phase, in one process and one Spark session.

Copies a warehouse whose store ``fresh`` already holds versions (``--template``; ``none``: the
store starts empty, made by the first run), then lands ``--runs`` files of ``--records`` records
each (after ``--warm`` uncounted ones) and runs ``pipeline.run_ingest`` for each, as continuous
mode does. Per run it prints one JSON line: the run's wall time, the time of each phase
(``pipeline``'s and ``store``'s functions, wrapped), the CPU time of this process and of the
driver JVM with its children, the Spark jobs of the run and the machine load. With
``--key-space N`` the records' keys are random keys of ``gen_changelog`` (``k0000000`` ..), so
a run updates keys the store holds; else every record has a new key.

Build a template with ``freshness_bench.prefilled_warehouse``; compare code by running this
script once per checkout (``PYTHONPATH``), alternating, on the same template:

    PYTHONPATH=$PWD .venv/bin/python bench/small_run_profile.py --template /tmp/tpl-2m/prefill-wh \\
        --records 100 --key-space 200000 --label new@2m --out /tmp/small-runs.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import tempfile
import time
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", default="none", help="a warehouse with store fresh, or none")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--warm", type=int, default=3, help="runs before the counted ones")
    ap.add_argument("--records", type=int, default=1, help="records per landed file")
    ap.add_argument("--key-space", type=int, default=0, help="random existing keys k0..k<N-1> (0: new keys)")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between runs")
    ap.add_argument("--label", default="run")
    ap.add_argument("--out", help="append the JSON lines to this file")
    args = ap.parse_args()

    from versiq.ingest import pipeline, store
    from versiq.ingest.spark import driver_jvm_pid, get_spark

    phases: dict[str, float] = {}

    def timed(module: Any, name: str) -> None:
        function = getattr(module, name)
        label = f"{module.__name__.rsplit('.', 1)[1]}.{name}"

        @functools.wraps(function)
        def wrapper(*a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                phases[label] = phases.get(label, 0.0) + time.perf_counter() - started

        setattr(module, name, wrapper)

    for name in ("open_for", "list_sources", "parse_run", "existing_versions", "classify_here",
                 "rows_to_write_here", "write_rejected", "_write_changelog", "commit_store", "task_frame"):
        timed(pipeline, name)
    timed(store, "commit_table")

    spark = get_spark(None)
    status = spark.sparkContext._jsc.sc().statusStore()  # type: ignore[union-attr]
    work = tempfile.mkdtemp(prefix="versiq-small-runs-")
    warehouse, source = os.path.join(work, "wh"), os.path.join(work, "src")
    os.makedirs(source)
    if args.template != "none":
        shutil.copytree(args.template, warehouse)
    spec = pipeline.StoreSpec(name="fresh", source=source)
    rng = random.Random(7)

    def land(i: int) -> None:
        now = int(time.time() * 1000)
        staged = os.path.join(source, f".p{i}")
        with open(staged, "w") as handle:
            for j in range(args.records):
                key = f"k{rng.randrange(args.key_space):07d}" if args.key_space else f"probe-{i}-{j}"
                handle.write(json.dumps({"key": key, "value": {"n": i}, "timestamp": now}) + "\n")
        os.rename(staged, os.path.join(source, f"p{i:04d}.jsonl"))

    def cpu(pid: int) -> float:
        """CPU seconds of ``pid`` and its descendants."""
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(cpu(int(c)) for c in children)

    def jobs_from(first: int) -> list[dict[str, Any]]:
        jobs, listed = [], status.jobsList(None)
        for n in range(listed.length()):
            job = listed.apply(n)
            if job.jobId() < first:
                continue
            start, end = job.submissionTime(), job.completionTime()
            seconds = (end.get().getTime() - start.get().getTime()) / 1000 if start.isDefined() and end.isDefined() \
                else None
            jobs.append({"id": job.jobId(), "name": job.name()[:60], "s": seconds, "tasks": job.numTasks()})
        return jobs

    lines = []
    for i in range(args.warm + args.runs):
        land(i)
        phases.clear()
        listed = status.jobsList(None)
        first = max([listed.apply(n).jobId() for n in range(listed.length())] + [-1]) + 1
        jvm = driver_jvm_pid()
        load = os.getloadavg()[0]
        jvm_cpu, own_cpu = cpu(jvm) if jvm else 0.0, time.process_time()
        started = time.perf_counter()
        report = pipeline.run_ingest(spark, warehouse, [spec]).stores["fresh"]
        seconds = time.perf_counter() - started
        jvm = driver_jvm_pid()
        line = {"label": args.label, "i": i, "warm": i < args.warm, "seconds": round(seconds, 3),
                "load": round(load, 2), "error": report.error,
                "phases": {name: round(value, 3) for name, value in sorted(phases.items())},
                "jvm_cpu_s": round((cpu(jvm) if jvm else 0.0) - jvm_cpu, 2),
                "python_cpu_s": round(time.process_time() - own_cpu, 2), "snapshot": report.snapshot}
        time.sleep(0.3)  # the status store hears of the run's last job
        line["jobs"] = jobs_from(first)
        lines.append(line)
        print(json.dumps(line), flush=True)
        time.sleep(args.gap)
    if args.out:
        with open(args.out, "a") as handle:
            handle.writelines(json.dumps(line) + "\n" for line in lines)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
