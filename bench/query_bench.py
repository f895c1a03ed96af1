"""Query benchmark (issue 4): in-process floors, sequential HTTP latency, 32-client throughput.

1. Store: ``--keys`` keys x 10 versions (default 1M keys; ``--keys 200000`` to scale down),
   built with the real ingest (``run_ingest`` on ``local[*]``) from a generated JSONL
   changelog, plus 100 "hot" keys with 150 versions each so that a versions page really holds
   100 records. Reused when it already exists under ``--work``.
2. In-process floors: ``query.engine.Engine`` directly (no HTTP): latest, as-of, a 100-record
   versions page (hot keys) and a whole-history page of an ordinary key (10 records); p50/p99.
3. ``versiq serve`` on 127.0.0.1 (subprocess) with ``--workers 1`` and ``--workers 2``:
   sequential p50/p99 over one persistent ``httpx.Client`` for ``/healthz`` (floor), latest,
   as-of and the versions pages; then requests/s with 32 concurrent connections for as-of
   lookups of random keys, driven by ``wrk`` (Debian package, native; a Lua script varies the
   key) or, when ``wrk`` is missing, an asyncio httpx load generator. The load generator's CPU
   share (CPU seconds / wall seconds, from /proc) is recorded next to the figure, as is the
   server's.

Bounded loops, loopback only. Prints a table and writes ``bench/results/query-<date>.json``.

    .venv/bin/python bench/query_bench.py [--keys 200000] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from urllib.parse import quote

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gen_changelog as gen  # noqa: E402
from machine import uptime, write_result  # noqa: E402

VERSIONS = 10
HOT_KEYS = 100
HOT_VERSIONS = 150
STORE = "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")




def pct(samples_ns: list[int] | np.ndarray) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=np.float64) / 1e6
    return {"n": int(a.size), "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "mean_ms": round(float(a.mean()), 3)}


# ---------------------------------------------------------------------------- the store
def hot_keys_table(seed: int):  # type: ignore[no-untyped-def]
    """HOT_KEYS keys x HOT_VERSIONS in-order versions within the last 6 days of event time
    (processed after the main changelog: out of order but inside the 7-day grace)."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    end = gen.START_MS + gen.SPAN_MS
    n = HOT_KEYS * HOT_VERSIONS
    keys = np.repeat(np.arange(HOT_KEYS), HOT_VERSIONS)
    ts = end - 6 * 86_400_000 + np.tile(np.arange(HOT_VERSIONS), HOT_KEYS) * 3_000_000 + keys
    return pa.table({
        "key": pa.array([f"hot{k:04d}" for k in keys]),
        "value": pa.array([f'{{"v":{v}}}' for v in rng.integers(0, 10**6, n)]),
        "timestamp": pa.array(ts.astype(np.int64)),
    })


def ensure_store(work: str, keys: int) -> tuple[str, dict]:
    warehouse = os.path.join(work, f"wh-query-{keys}")
    marker = os.path.join(warehouse, "_bench.json")
    if os.path.exists(marker):
        with open(marker) as fh:
            info = json.load(fh)
        print(f"reusing store {warehouse} ({info['events']:,} events)", flush=True)
        return warehouse, info
    from versiq.ingest.pipeline import StoreSpec, run_ingest
    from versiq.ingest.spark import get_spark

    shutil.rmtree(warehouse, ignore_errors=True)
    source = os.path.join(work, f"src-query-{keys}")
    shutil.rmtree(source, ignore_errors=True)
    files = max(8, min(64, keys * VERSIONS // 625_000))
    if keys * VERSIONS > 20_000_000:  # too big for one Arrow table: made and written file by file
        gen.write_jsonl_in_slices(keys, VERSIONS, 1, os.path.join(source, "jsonl"), files)
    else:
        gen.write_changelog(gen.make_events(keys, VERSIONS, seed=1), source, "jsonl", files=files)
    with open(os.path.join(source, "jsonl", "zz-hot.jsonl"), "wb") as fh:
        fh.write(gen._jsonl_bytes(hot_keys_table(2)))
    spark = get_spark("local[*]")
    t0 = time.perf_counter()
    rep = run_ingest(spark, warehouse, [StoreSpec(STORE, os.path.join(source, "jsonl"),
                                                 format="jsonl", history_retention_ms=gen.GRACE_MS)])
    seconds = time.perf_counter() - t0
    spark.stop()
    r = rep.stores[STORE]
    if r.error:
        raise SystemExit(f"ingest failed: {r.error}")
    info = {"keys": keys, "versions": VERSIONS, "events": r.read, "ingest_s": round(seconds, 1),
            "report": r.to_json()}
    with open(marker, "w") as fh:
        json.dump(info, fh, indent=2)
    print(f"built store {warehouse}: {r.read:,} events in {seconds:.0f} s", flush=True)
    return warehouse, info


# ---------------------------------------------------------------------------- workloads
class Workload:
    def __init__(self, keys: int, stream_time: int, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.keys = [f"k{rng.randrange(keys):0{gen.KEY_WIDTH}d}" for _ in range(20_000)]
        # as-of times inside the retention horizon (streamTime - 7d, streamTime]
        lo = stream_time - gen.GRACE_MS + 3_600_000
        self.as_of = [rng.randrange(lo, stream_time) for _ in range(20_000)]
        self.hot = [f"hot{rng.randrange(HOT_KEYS):04d}" for _ in range(20_000)]

    def path(self, kind: str, i: int) -> str:
        k = self.keys[i % len(self.keys)]
        if kind == "latest":
            return f"/v1/stores/{STORE}/keys/{quote(k, safe='')}"
        if kind == "as_of":
            return f"/v1/stores/{STORE}/keys/{quote(k, safe='')}?asOf={self.as_of[i % len(self.as_of)]}"
        if kind == "versions_100":
            return f"/v1/stores/{STORE}/keys/{self.hot[i % len(self.hot)]}/versions?pageSize=100"
        if kind == "versions_10":
            return f"/v1/stores/{STORE}/keys/{quote(k, safe='')}/versions?pageSize=100"
        if kind == "healthz":
            return "/healthz"
        raise ValueError(kind)


def engine_floors(warehouse: str, wl: Workload, n: int) -> dict:
    from versiq.query.api import MultiVersionedKeyQuery, VersionedKeyQuery
    from versiq.query.engine import Engine

    t0 = time.perf_counter()
    eng = Engine(warehouse)
    eng.start()
    start_s = time.perf_counter() - t0
    out: dict = {"engine_start_s": round(start_s, 2)}
    try:
        def run(name, fn):  # type: ignore[no-untyped-def]
            for i in range(min(500, n)):
                fn(i)
            samples = []
            outcomes: dict[str, int] = {}
            for i in range(n):
                t = time.perf_counter_ns()
                res = fn(i)
                samples.append(time.perf_counter_ns() - t)
                key = getattr(res, "outcome", None) or f"{len(res.records)} records"
                outcomes[key] = outcomes.get(key, 0) + 1
            out[name] = {**pct(samples), "outcomes": dict(sorted(outcomes.items())[:5])}

        run("latest", lambda i: eng.get(STORE, VersionedKeyQuery(wl.keys[i % len(wl.keys)])))
        run("as_of", lambda i: eng.get(STORE, VersionedKeyQuery(wl.keys[i % len(wl.keys)],
                                                                 wl.as_of[i % len(wl.as_of)])))
        run("versions_100", lambda i: eng.versions(STORE, MultiVersionedKeyQuery(wl.hot[i % len(wl.hot)]),
                                                   limit=100))
        run("versions_10", lambda i: eng.versions(STORE, MultiVersionedKeyQuery(wl.keys[i % len(wl.keys)]),
                                                  limit=100))
        info = eng.store_info(STORE)
        out["snapshot"] = info.snapshot
    finally:
        eng.close()
    return out


# ---------------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_tree_rss_mb(pid: int) -> dict[int, float]:
    """Resident memory (MB) of pid and each direct child (the uvicorn workers)."""
    out = subprocess.run(["ps", "-o", "pid=,rss=", "--ppid", str(pid), "-p", str(pid)],
                         capture_output=True, text=True).stdout
    return {int(p): round(int(r) / 1024, 1) for p, r in (line.split() for line in out.splitlines())}


def proc_tree_cpu(pid: int) -> float:
    """CPU seconds (user+system) of pid and its descendants (live ones)."""
    total = 0.0
    pids = [pid]
    try:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
        pids += [int(x) for x in out.split()]
    except Exception:  # noqa: BLE001
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


class Server:
    def __init__(self, warehouse: str, workers: int, log_path: str, extra_env: dict[str, str] | None = None) -> None:
        """``versiq serve`` of this checkout's virtualenv; ``extra_env`` on top of this process's
        environment (e.g. ``PYTHONPATH`` of another checkout, whose code it then serves)."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        env = dict(os.environ, VERSIQ_LOG_LEVEL=os.environ.get("BENCH_SERVER_LOG_LEVEL", "WARNING"),
                   **(extra_env or {}))
        self.proc = subprocess.Popen(
            [os.path.join(ROOT, ".venv", "bin", "versiq"), "serve", "--warehouse", warehouse,
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.workers = workers

    def wait_ready(self, timeout: float = 600) -> float:
        import httpx

        t0 = time.perf_counter()
        ready_hits = 0
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                r = httpx.get(self.base + "/readyz", timeout=5)
                if r.status_code == 200:
                    ready_hits += 1
                    # with several workers, each one builds its own index: wait until
                    # consecutive (differently routed) probes all succeed
                    if ready_hits >= 4 * self.workers:
                        return time.perf_counter() - t0
            except httpx.HTTPError:
                ready_hits = 0
            time.sleep(0.5)
        raise RuntimeError("server not ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def sequential(base: str, wl: Workload, n: int,
               kinds: tuple[str, ...] = ("healthz", "latest", "as_of", "versions_100", "versions_10"),
               warmup: int = 300) -> dict:
    """Sequential p50/p99 per route kind over one persistent client, after ``warmup`` requests."""
    import httpx

    out: dict = {}
    with httpx.Client(base_url=base, timeout=10) as client:
        for kind in kinds:
            for i in range(min(warmup, n)):
                client.get(wl.path(kind, i))
            samples = []
            statuses: dict[int, int] = {}
            for i in range(n):
                path = wl.path(kind, i + 1000)
                t = time.perf_counter_ns()
                r = client.get(path)
                samples.append(time.perf_counter_ns() - t)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            out[kind] = {**pct(samples), "statuses": statuses}
    return out


WRK_LUA = """
local paths = {}
for line in io.lines("%s") do paths[#paths + 1] = line end
local counter = 0
init = function(args) math.randomseed(os.time() + (wrk.thread and 1 or 0)) end
request = function()
  return wrk.format("GET", paths[math.random(#paths)])
end
"""


def load_wrk(server: Server, wl: Workload, kind: str, seconds: int, connections: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="versiq-wrk-")
    paths_file = os.path.join(tmp, "paths.txt")
    with open(paths_file, "w") as fh:
        for i in range(len(wl.keys)):
            fh.write(wl.path(kind, i) + "\n")
    script = os.path.join(tmp, "paths.lua")
    with open(script, "w") as fh:
        fh.write(WRK_LUA % paths_file)
    server_cpu0 = proc_tree_cpu(server.proc.pid)
    t0 = time.perf_counter()
    proc = subprocess.Popen(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", script,
                             server.base], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # sample wrk's CPU just before it exits
    wrk_cpu = 0.0
    while proc.poll() is None:
        wrk_cpu = max(wrk_cpu, proc_tree_cpu(proc.pid))
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    text = proc.stdout.read() if proc.stdout else ""
    server_cpu = proc_tree_cpu(server.proc.pid) - server_cpu0
    shutil.rmtree(tmp, ignore_errors=True)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    lat = dict(re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", text, re.M))
    return {"generator": "wrk 4.1 (Debian, native, -t2)", "kind": kind, "connections": connections,
            "seconds": seconds, "requests_per_s": round(rps), "latency_percentiles": lat,
            "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "generator_cpu_share": round(wrk_cpu / wall, 2),
            "server_cpu_share": round(server_cpu / wall, 2), "raw": text}


def load_httpx(server: Server, wl: Workload, kind: str, seconds: int, connections: int) -> dict:
    import httpx

    async def main() -> tuple[int, int]:
        done = 0
        bad = 0
        deadline = time.perf_counter() + seconds
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx.AsyncClient(base_url=server.base, limits=limits, timeout=10) as client:
            async def worker(w: int) -> None:
                nonlocal done, bad
                i = w
                while time.perf_counter() < deadline:
                    r = await client.get(wl.path(kind, i))
                    i += connections
                    done += 1
                    bad += r.status_code >= 300
            await asyncio.gather(*(worker(w) for w in range(connections)))
        return done, bad

    cpu0 = time.process_time()
    server_cpu0 = proc_tree_cpu(server.proc.pid)
    t0 = time.perf_counter()
    done, bad = asyncio.run(main())
    wall = time.perf_counter() - t0
    return {"generator": "asyncio httpx (Python, in the bench process)", "kind": kind,
            "connections": connections, "seconds": seconds, "requests_per_s": round(done / wall),
            "non_2xx": bad, "generator_cpu_share": round((time.process_time() - cpu0) / wall, 2),
            "server_cpu_share": round((proc_tree_cpu(server.proc.pid) - server_cpu0) / wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("VERSIQ_BENCH_WORK", "/tmp/versiq-bench"))
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--n", type=int, default=3000, help="sequential requests per route")
    ap.add_argument("--engine-n", type=int, default=20000, help="in-process queries per kind")
    ap.add_argument("--seconds", type=int, default=15, help="duration of each concurrency run")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--loadgen", choices=("auto", "wrk", "httpx"), default="auto")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    started = datetime.now(UTC)
    result: dict = {"date": started.strftime("%Y-%m-%d"), "started": started.isoformat(timespec="seconds"),
                    "machine": {"nproc": os.cpu_count(), "uptime_start": uptime()}}
    warehouse, info = ensure_store(args.work, args.keys)
    result["store"] = info
    stream_time = gen.START_MS + (args.keys * VERSIONS - 1) * gen.step_ms_for(args.keys * VERSIONS)
    wl = Workload(args.keys, stream_time)

    result["engine"] = engine_floors(warehouse, wl, args.engine_n)
    print("engine floors:", json.dumps({k: v for k, v in result["engine"].items()}), flush=True)
    use_wrk = args.loadgen == "wrk" or (args.loadgen == "auto" and shutil.which("wrk"))
    result["http"] = {}
    for workers in [int(w) for w in args.workers.split(",")]:
        server = Server(warehouse, workers, os.path.join(args.work, f"serve-w{workers}.log"))
        try:
            ready_s = server.wait_ready()
            rss = proc_tree_rss_mb(server.proc.pid)
            print(f"workers={workers} ready in {ready_s:.1f} s, RSS MB per process: {rss}", flush=True)
            seq = sequential(server.base, wl, args.n)
            print(f"workers={workers} sequential:", json.dumps(seq), flush=True)
            loads = []
            for kind in ("as_of", "healthz"):
                load = (load_wrk if use_wrk else load_httpx)(server, wl, kind, args.seconds, args.connections)
                loads.append(load)
                print(f"workers={workers} load {kind}: {load['requests_per_s']} req/s "
                      f"({load['generator']}, generator CPU {load['generator_cpu_share']} cores, "
                      f"server CPU {load['server_cpu_share']} cores, non-2xx {load['non_2xx']})", flush=True)
            result["http"][f"workers_{workers}"] = {"ready_s": round(ready_s, 1), "rss_mb": rss, "sequential": seq,
                                                     "concurrent": loads, "load": uptime()}
        finally:
            server.stop()
    result["machine"]["uptime_end"] = uptime()

    print()
    e = result["engine"]
    print(f"store: {info['events']:,} events ({args.keys:,} keys x {VERSIONS} + {HOT_KEYS} hot keys x "
          f"{HOT_VERSIONS}), engine start {e['engine_start_s']} s")
    print(f"{'route':16s} {'engine p50/p99 ms':>20s} " + " ".join(
        f"{'HTTP w' + w.split('_')[1] + ' p50/p99 ms':>22s}" for w in result["http"]))
    for kind in ("healthz", "latest", "as_of", "versions_100", "versions_10"):
        eng = f"{e[kind]['p50_ms']:.3f} / {e[kind]['p99_ms']:.3f}" if kind in e else "-"
        cells = [f"{h['sequential'][kind]['p50_ms']:.3f} / {h['sequential'][kind]['p99_ms']:.3f}"
                 for h in result["http"].values()]
        print(f"{kind:16s} {eng:>20s} " + " ".join(f"{c:>22s}" for c in cells))
    for w, h in result["http"].items():
        for load in h["concurrent"]:
            print(f"{w} {args.connections} clients {load['kind']:8s}: {load['requests_per_s']:>7,} req/s  "
                  f"[{load['generator']}: {load['generator_cpu_share']} cores; server "
                  f"{load['server_cpu_share']} cores]")
    print(result["machine"]["uptime_start"])
    print(result["machine"]["uptime_end"])
    write_result(args.results, "query", result, started, f"{args.keys}keys")


if __name__ == "__main__":
    main()
