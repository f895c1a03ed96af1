"""Derived tables on a Spark standalone cluster of 1 and of 2 workers (issue 43's scaling goal).

Starts a master and workers from the PySpark installation on 127.0.0.1 (as the cluster test of
tests/ingest/test_ingest_cli.py does), each worker with ``--cores 1``, and runs
``bench/derived_bench.py --master spark://...`` once with one worker and once with two, on the
same generated records (source stores of ``--partitions`` partitions, 2 by default: a
topology's tasks run one after the other on one worker's single core, side by side on two). The
driver runs here, outside the workers' cores: on the 2-core machine it idles while the tasks
run. Prints each operator's build seconds with 1 and 2 workers and the ratio (of the whole
pass, and of its Spark tasks alone: the commits are the driver's), the driver's peak memory
(this Python process and its JVM, which holds no task data on a cluster); writes
``bench/results/derived-cluster-<date>[-<records>].json`` (both runs' full results inside).

    .venv/bin/python bench/derived_cluster_bench.py [--records 2000000] [--operators filter,aggregate]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import loadavg, uptime, write_result  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def start(args: list[str], env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([spark_class(), *args], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_for_workers(master_log: str, count: int, timeout: float = 120) -> None:
    """The master logs "Registering worker" once per worker that joined."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(master_log) as fh:
            if fh.read().count("Registering worker") >= count:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{count} worker(s) did not register within {timeout} s (see {master_log})")


def run_with(workers: int, args: argparse.Namespace, work: str) -> dict[str, Any]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.pop("SPARK_MASTER", None)
    logs = os.path.join(work, f"cluster-{workers}")
    os.makedirs(logs, exist_ok=True)
    port = free_port()
    master_log = os.path.join(logs, "master.log")
    procs = []
    with open(master_log, "w") as mlog, open(os.path.join(logs, "workers.log"), "w") as wlog:
        procs.append(start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                            "--webui-port", str(free_port())], env, mlog))
        try:
            for i in range(workers):
                procs.append(start(["org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                                    "--host", "127.0.0.1", "--cores", "1", "--memory", args.worker_memory,
                                    "--webui-port", str(free_port()), "--work-dir", os.path.join(logs, f"w{i}")],
                                   env, wlog))
            wait_for_workers(master_log, workers)
            results = os.path.join(logs, "results")
            cmd = [sys.executable, os.path.join(HERE, "derived_bench.py"), "--master", f"spark://127.0.0.1:{port}",
                   "--records", str(args.records), "--partitions", str(args.partitions), "--operators",
                   args.operators, "--work", os.path.join(work, "data"), "--results", results]
            print(f"{workers} worker(s): {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, check=True, env=env)
            (path,) = glob.glob(os.path.join(results, "*.json"))
            with open(path) as fh:
                return json.load(fh)
        finally:
            stop(procs[::-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=2, help="partitions of the source stores")
    ap.add_argument("--operators", default="filter,join,fk_join,aggregate")
    ap.add_argument("--worker-memory", default="6g")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "versiq-cluster-bench"))
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    started = datetime.now(UTC)
    result: dict[str, Any] = {"date": started.strftime("%Y-%m-%d"), "started": started.isoformat(timespec="seconds"),
                              "records": args.records, "partitions": args.partitions, "uptime_start": uptime(),
                              "runs": {}}
    for workers in (1, 2):
        result["runs"][str(workers)] = run_with(workers, args, args.work)
    result["uptime_end"] = uptime()
    ops = [o for o in args.operators.split(",") if o]
    print()
    print(f"{args.records:,} records, source stores of {args.partitions} partitions; standalone workers of 1 core")
    head = (f"{'operator':12s} {'build in':>10s} {'1 worker s':>11s} {'2 workers s':>12s} {'x':>5s} "
            f"{'tasks x':>8s} {'rec/s (2)':>10s} {'driver MB':>10s} {'driver JVM MB':>14s}")
    print(head)
    print("-" * len(head))
    result["speedup"] = {}
    for op in ops:
        one, two = (result["runs"][w]["partitions"][str(args.partitions)]["build"]["operators"][op]
                    for w in ("1", "2"))
        x = one["derive_s"] / two["derive_s"] if two["derive_s"] else 0.0
        tasks_one, tasks_two = (r["phases_s"].get("spark tasks", 0.0) for r in (one, two))
        tasks_x = tasks_one / tasks_two if tasks_two else 0.0
        result["speedup"][op] = {"derive": round(x, 2), "spark_tasks": round(tasks_x, 2)}
        print(f"{op:12s} {one['input_records']:>10,} {one['derive_s']:11.2f} {two['derive_s']:12.2f} {x:5.2f} "
              f"{tasks_x:8.2f} {two['records_per_s'] or 0:>10,} {two['driver_rss_mb']:>10,} "
              f"{two['driver_jvm_rss_mb']:>14,}")
    print(result["uptime_start"])
    print(result["uptime_end"], loadavg())
    write_result(args.results, "derived-cluster", result, started, str(args.records))


if __name__ == "__main__":
    main()
