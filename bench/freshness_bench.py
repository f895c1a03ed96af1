"""Freshness benchmark (issue 17): a changelog file lands -> its record is served.

``versiq ingest --continuous --trigger-interval 1s`` watches a folder of JSONL files and writes a
store; ``versiq serve`` (1 worker, default refresh and watch intervals; ``query_bench.Server``) serves the same local
warehouse. Every ``--every`` seconds the load generator (this process: one ``httpx.Client``
polling every 20 ms) moves a one-record file into the folder (a rename: the file lands whole) and
measures the time until ``GET /v1/stores/fresh/keys/<key>`` answers 200. Printed with the
ingest's own time per micro-batch (from its summary lines: the part of the latency that is the
Spark run) as the baseline of the same run, and the machine load before and after.

    .venv/bin/python bench/freshness_bench.py [--probes 20] [--every 3]
"""

from __future__ import annotations

import argparse
import json
import os
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

from query_bench import Server  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env.setdefault("VERSIQ_SHUFFLE_PARTITIONS", "2")
    return env


def _land(source: str, staging: str, name: str, key: str) -> None:
    path = os.path.join(staging, name)
    with open(path, "w") as handle:
        handle.write(json.dumps({"key": key, "value": {"n": 1}, "timestamp": int(time.time() * 1000)}) + "\n")
    os.rename(path, os.path.join(source, name))


def main() -> None:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--every", type=float, default=3.0)
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="versiq-fresh-")
    source, staging, warehouse = (os.path.join(work, d) for d in ("src", "staging", "wh"))
    os.makedirs(source)
    os.makedirs(staging)
    _land(source, staging, "warmup.jsonl", "warmup")
    log_path = os.path.join(work, "ingest.log")
    with open(log_path, "w") as log:
        ingest = subprocess.Popen(
            [sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", warehouse, "--store", "fresh", "--source",
             source, "--continuous", "--trigger-interval", "1s"],
            env=_env(), stdout=log, stderr=log, start_new_session=True)
    serve: Server | None = None
    latencies: list[float] = []
    load_before = os.getloadavg()
    try:
        while not os.path.isdir(os.path.join(warehouse, "fresh", "_delta_log")):
            assert ingest.poll() is None, open(log_path).read()
            time.sleep(0.2)
        serve = Server(warehouse, 1, os.path.join(work, "serve.log"))
        serve.wait_ready()
        with httpx.Client(base_url=serve.base, timeout=5) as client:
            while client.get("/v1/stores/fresh/keys/warmup").status_code != 200:
                time.sleep(0.2)
            for i in range(args.probes):
                key = f"probe-{i}"
                landed = time.monotonic()
                _land(source, staging, f"probe-{i:04d}.jsonl", key)
                while client.get(f"/v1/stores/fresh/keys/{key}").status_code != 200:
                    assert time.monotonic() - landed < 120, "a probe was not served within 120 s"
                    time.sleep(0.02)
                latencies.append(time.monotonic() - landed)
                print(f"probe {i}: {latencies[-1]:.2f} s", flush=True)
                time.sleep(max(0.0, args.every - latencies[-1]))
    finally:
        if serve is not None:
            serve.stop()
        os.killpg(ingest.pid, signal.SIGTERM)
        ingest.wait(timeout=60)
    runs = [float(s) for s in re.findall(r"store fresh: read \d+.*? in ([\d.]+)s", open(log_path).read())]
    shutil.rmtree(work, ignore_errors=True)
    latencies.sort()
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_generator": "httpx.Client in the bench process, polling every 20 ms",
        "trigger_interval_s": 1.0, "probes": len(latencies),
        "p50_s": round(statistics.median(latencies), 2),
        "p99_s": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
        "max_s": round(latencies[-1], 2),
        "ingest_run_s_median": round(statistics.median(runs), 2) if runs else None,
        "load_before": load_before, "load_after": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    with open(os.path.join(args.results, f"freshness-{datetime.now(UTC).date()}.json"), "w") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")


if __name__ == "__main__":
    main()
