"""Freshness benchmark (issue 17): a changelog file lands -> its record is served.

``versiq ingest --continuous --trigger-interval 1s`` watches a folder of JSONL files and writes a
store; ``versiq serve`` (1 worker, default refresh and watch intervals; ``query_bench.Server``) serves the same local
warehouse. Every ``--every`` seconds plus a random part of the trigger interval (so a file lands
at any moment of the trigger's period, not always at the same one) the load generator (this
process: one ``httpx.Client`` polling every 20 ms) moves a one-record file into the folder (a
rename: the file lands whole) and measures the time until ``GET /v1/stores/fresh/keys/<key>``
answers 200 (after ``WARMUP_PROBES`` uncounted ones). Printed with the ingest's own time per
micro-batch (from its summary lines: the part of the latency that is the Spark run), and the
machine load before and after.

The same probes run in each mode, ``--rounds`` times in alternating order (A B, B A: whichever
ran first measured slower), each time with its own ingest, service and warehouse; the figures
pool the rounds. Modes (``MODES``): ``default`` (the folder watched with the kernel's file
notifications, a run at most every second: ``ingest.watch``), ``generated_code`` (the
default with ``VERSIQ_INTERPRETED_RUN_BYTES=0``: every run compiles generated code for its plan;
the baseline without a checkout). (``trigger_only``, ``--watch-interval 1s``, was the baseline
while a streaming query checked local folders; with notifications it equals ``default``.)
With ``--baseline-checkout DIR`` (a checkout of an earlier commit, e.g. ``git worktree add DIR
HEAD~1``), mode ``previous`` is the default mode run by that checkout's code (its directory
first on ``PYTHONPATH`` of the ingest and of the service, the same jars and JVM class archive) and becomes
the baseline.

``--store-versions 0,2000000`` measures each mode on a store that starts empty (0) and on one
that already holds that many versions (keys x 10 from ``gen_changelog``, their timestamps
spanning the 30 days before now, ingested once by a batch run into a template warehouse that
each measurement copies): the cost of a small run must not grow with the store. The figures
are keyed ``<mode>@<versions>``.

    .venv/bin/python bench/freshness_bench.py [--probes 20] [--every 3] [--rounds 2] \\
        [--modes generated_code,default] [--baseline-checkout DIR] [--store-versions 0,2000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from machine import baseline_env, write_result  # noqa: E402
from query_bench import Server  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env.pop("VERSIQ_INTERPRETED_RUN_BYTES", None)  # each mode sets its own (MODES)
    env.setdefault("VERSIQ_SHUFFLE_PARTITIONS", "2")
    return env


def _land(source: str, staging: str, name: str, key: str) -> None:
    path = os.path.join(staging, name)
    with open(path, "w") as handle:
        handle.write(json.dumps({"key": key, "value": {"n": 1}, "timestamp": int(time.time() * 1000)}) + "\n")
    os.rename(path, os.path.join(source, name))


TRIGGER_S = 1.0
#: mode -> the ingest's extra environment and arguments (module docstring)
MODES: dict[str, tuple[dict[str, str], list[str]]] = {
    "default": ({}, []),
    "generated_code": ({"VERSIQ_INTERPRETED_RUN_BYTES": "0"}, []),
}
BASELINE = "generated_code"
PREVIOUS = "previous"
#: probes landed and timed but not counted: a new ingest's first micro-batches are slower (its JIT
#: warms up), and what a user sees is a long-running ingest
WARMUP_PROBES = 3


def prefilled_warehouse(versions: int, work: str) -> str:
    """A warehouse whose store ``fresh`` holds ``versions`` versions (``versions // 10`` keys x
    10 events of ``gen_changelog``, shifted to end now), written by one batch ``versiq ingest``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from gen_changelog import START_MS, make_events, write_changelog

    events = make_events(max(1, versions // 10), 10, seed=42)
    shift = int(time.time() * 1000) - 30 * 86_400_000 - START_MS
    events = events.set_column(events.schema.get_field_index("timestamp"), "timestamp",
                               pc.add(events["timestamp"], pa.scalar(shift, pa.int64())))
    source = os.path.join(work, "prefill-src")
    write_changelog(events, source, "jsonl", 8)
    warehouse = os.path.join(work, "prefill-wh")
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", warehouse, "--store", "fresh",
                    "--source", os.path.join(source, "jsonl"), "--log-level", "WARNING"], env=_env(), check=True)
    print(f"prefilled store fresh with {events.num_rows} events in {time.monotonic() - started:.1f} s", flush=True)
    shutil.rmtree(source, ignore_errors=True)
    return warehouse


def measure(mode: str, probes: int, every: float, rng: random.Random,
            template: str | None = None) -> tuple[list[float], list[float], tuple]:
    """One ingest + service pair in ``mode``: each probe's latency, each micro-batch's run time (from
    the ingest's summary lines) and the machine load before and after. ``template``: a warehouse
    to start from (copied), whose store ``fresh`` already holds versions."""
    import httpx

    work = tempfile.mkdtemp(prefix="versiq-fresh-")
    source, staging, warehouse = (os.path.join(work, d) for d in ("src", "staging", "wh"))
    if template is not None:
        shutil.copytree(template, warehouse)
    os.makedirs(source)
    os.makedirs(staging)
    _land(source, staging, "warmup.jsonl", "warmup")
    log_path = os.path.join(work, "ingest.log")
    with open(log_path, "w") as log:
        ingest = subprocess.Popen(
            [sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", warehouse, "--store", "fresh", "--source",
             source, "--continuous", "--trigger-interval", f"{TRIGGER_S:g}s", *MODES[mode][1]],
            env={**_env(), **MODES[mode][0]}, stdout=log, stderr=log, start_new_session=True,
            # ``python -m`` puts the working directory first on sys.path, before PYTHONPATH: a
            # checkout's code runs only from its own directory (before 2026-11-26 afternoon mode
            # ``previous`` ran the code of the directory the bench was started from)
            cwd=MODES[mode][0].get("PYTHONPATH"))
    serve: Server | None = None
    latencies: list[float] = []
    load_before = os.getloadavg()
    try:
        while not os.path.isdir(os.path.join(warehouse, "fresh", "_delta_log")):
            assert ingest.poll() is None, open(log_path).read()
            time.sleep(0.2)
        # the service of the mode's code too (``previous``: the baseline checkout's)
        code = {k: v for k, v in MODES[mode][0].items() if k == "PYTHONPATH"}
        serve = Server(warehouse, 1, os.path.join(work, "serve.log"), extra_env=code)
        serve.wait_ready()
        with httpx.Client(base_url=serve.base, timeout=5) as client:
            while client.get("/v1/stores/fresh/keys/warmup").status_code != 200:
                time.sleep(0.2)
            for i in range(-WARMUP_PROBES, probes):
                key = f"probe-{i}"
                landed = time.monotonic()
                _land(source, staging, f"probe-{i:04d}.jsonl", key)
                while client.get(f"/v1/stores/fresh/keys/{key}").status_code != 200:
                    assert time.monotonic() - landed < 120, "a probe was not served within 120 s"
                    time.sleep(0.02)
                latency = time.monotonic() - landed
                if i >= 0:
                    latencies.append(latency)
                print(f"{mode} probe {i}: {latency:.2f} s", flush=True)
                time.sleep(max(0.0, every + rng.uniform(0, TRIGGER_S) - latency))
    finally:
        if serve is not None:
            serve.stop()
        os.killpg(ingest.pid, signal.SIGTERM)
        ingest.wait(timeout=60)
    # one micro-batch per landed file: warmup.jsonl (the store's creation, unless prefilled) and the
    # warm-up probes first
    runs = [float(s) for s in re.findall(r"store fresh: read \d+.*? in ([\d.]+)s", open(log_path).read())]
    runs = runs[1 + WARMUP_PROBES:]
    shutil.rmtree(work, ignore_errors=True)
    return latencies, runs, (load_before, os.getloadavg())


def summary(latencies: list[float], runs: list[float], loads: list[tuple]) -> dict[str, object]:
    latencies = sorted(latencies)
    return {
        "probes": len(latencies),
        "p50_s": round(statistics.median(latencies), 2),
        # with fewer than 100 probes this is the largest latency but one at most (40: the largest)
        "p99_s": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
        "max_s": round(latencies[-1], 2),
        "ingest_run_s_median": round(statistics.median(runs), 2) if runs else None,
        "load_before_after": loads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--every", type=float, default=3.0)
    ap.add_argument("--modes", default="generated_code,default", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=2, help="each mode's probes run this many times, order alternating")
    ap.add_argument("--seed", type=int, default=17, help="of the landing moments' random part")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--baseline-checkout", help=f"a checkout of an earlier commit: mode {PREVIOUS!r} runs its code")
    ap.add_argument("--store-versions", default="0",
                    help="comma-separated sizes of the store the probes land in (0: it starts empty)")
    args = ap.parse_args()
    baseline = BASELINE
    if args.baseline_checkout:
        checkout = os.path.abspath(args.baseline_checkout)
        if not os.path.isdir(os.path.join(checkout, "versiq")):
            ap.error(f"{checkout} is not a checkout of versiq")
        MODES[PREVIOUS] = (baseline_env(checkout), [])
        baseline = PREVIOUS
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    sizes = [int(v) for v in args.store_versions.split(",") if v]
    scratch = tempfile.mkdtemp(prefix="versiq-fresh-templates-")
    templates = {size: prefilled_warehouse(size, os.path.join(scratch, str(size))) if size else None
                 for size in sizes}
    cases = [(mode, size) for size in sizes for mode in modes]

    def label(mode: str, size: int) -> str:
        return mode if sizes == [0] else f"{mode}@{size}"

    # rounds alternate the order (A B, B A, ...): the first pair of a run measured slower either way;
    # within a round every case gets the same landing moments (one seed per round)
    pooled: dict[str, tuple[list[float], list[float], list[tuple]]] = {label(*c): ([], [], []) for c in cases}
    for round_ in range(args.rounds):
        for mode, size in (cases if round_ % 2 == 0 else cases[::-1]):
            latencies, runs, load = measure(mode, args.probes, args.every, random.Random(args.seed + round_),
                                            templates[size])
            pooled[label(mode, size)][0].extend(latencies)
            pooled[label(mode, size)][1].extend(runs)
            pooled[label(mode, size)][2].append(load)
    shutil.rmtree(scratch, ignore_errors=True)
    result: dict[str, object] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_generator": "httpx.Client in the bench process, polling every 20 ms",
        "trigger_interval_s": TRIGGER_S, "every_s": args.every, "rounds": args.rounds,
        "baseline_checkout": args.baseline_checkout and subprocess.run(
            ["git", "-C", args.baseline_checkout, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "store_versions": sizes,
        "modes": {name: summary(*figures) for name, figures in pooled.items()},
    }
    figures = result["modes"]
    assert isinstance(figures, dict)
    for size in sizes:
        base = label(baseline, size)
        if base in figures:
            for mode in modes:
                if mode != baseline:
                    result[f"p50_ratio_{label(mode, size)}_vs_{base}"] = round(
                        figures[label(mode, size)]["p50_s"] / figures[base]["p50_s"], 2)
    if 0 in sizes:
        for size in sizes:
            if size:
                for mode in modes:
                    result[f"p50_ratio_{label(mode, size)}_vs_{label(mode, 0)}"] = round(
                        figures[label(mode, size)]["p50_s"] / figures[label(mode, 0)]["p50_s"], 2)
    print(json.dumps(result, indent=2))
    write_result(args.results, "freshness", result, datetime.now(UTC))


if __name__ == "__main__":
    main()
