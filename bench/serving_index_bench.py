"""Serving index benchmark (issue 17): start-up, memory and as-of latency of the memory-mapped index.

For one store (default the query benchmark's 1M keys x 10 versions = 10M versions, built by
``bench/query_bench.py`` under ``/tmp/versiq-bench``), each measurement is a fresh Python process
(the load generator is the process itself: in-process ``Engine.get`` calls, no HTTP):

1. **cold**: an empty ``VERSIQ_CACHE_DIR``: the process builds every bucket's files, then serves;
2. **warm**: the files exist (another worker, an earlier start): the process opens them;
3. **two warm processes at once**: what each holds privately while both map the same files.

Per process: seconds from ``Engine(...)`` to ready (the first refresh done), memory from
``/proc/self/smaps_rollup`` before the engine (the baseline: interpreter and imports) and after
20,000 as-of reads of random keys: ``Anonymous`` (private to the process) and ``Rss`` minus
``Anonymous`` (file pages: the mapped index and libraries, shared through the page cache), and the
as-of p50/p99 in microseconds. The machine's load average is recorded at start and end.

    .venv/bin/python bench/serving_index_bench.py [--warehouse DIR] [--store NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from machine import write_result  # noqa: E402  (bench/, the script's folder, is on sys.path)

READS = 20_000


def _memory() -> dict[str, int]:
    """Fields of /proc/self/smaps_rollup in MB."""
    out: dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) // 1024
    return out


def child(warehouse: str, store: str, cache: str) -> None:
    import numpy as np

    from versiq.query.api import VersionedKeyQuery
    from versiq.query.engine import Engine

    before = _memory()
    started = time.monotonic()
    engine = Engine(warehouse, refresh_interval_s=3600, cache_dir=cache)
    engine.refresh()
    ready = time.monotonic() - started
    loaded = engine._stores[store].loaded  # noqa: SLF001 - the benchmark samples keys from the index
    assert loaded is not None
    rng = random.Random(1)
    buckets = list(loaded.buckets.values())
    probes = []
    for _ in range(READS):
        data = rng.choice(buckets).data
        i = rng.randrange(data.key_count)
        s, e = int(data.starts[i]), int(data.ends[i])
        lo, hi = int(data.valid_from[s]), int(data.valid_from[e - 1])
        probes.append((data.keys[i].as_py(), rng.randint(lo, hi + 1)))
    times = []
    for key, as_of in probes:
        t = time.perf_counter_ns()
        engine.get(store, VersionedKeyQuery(key, as_of))
        times.append(time.perf_counter_ns() - t)
    after = _memory()
    counts = loaded.counts()
    print(json.dumps({
        "ready_s": round(ready, 2), "versions": counts["versions"], "keys": counts["keys"],
        "baseline_mb": {"rss": before["Rss"], "anonymous": before["Anonymous"]},
        "after_mb": {"rss": after["Rss"], "anonymous": after["Anonymous"], "file": after["Rss"] - after["Anonymous"]},
        "private_mb": after["Anonymous"] - before["Anonymous"],
        "asof_us": {"p50": round(float(np.percentile(times, 50)) / 1000, 1),
                    "p99": round(float(np.percentile(times, 99)) / 1000, 1)},
    }))
    engine.close()


def _run(warehouse: str, store: str, cache: str, count: int = 1) -> list[dict[str, object]]:
    procs = [subprocess.Popen([sys.executable, __file__, "--child", "--warehouse", warehouse, "--store", store,
                               "--cache", cache], stdout=subprocess.PIPE, text=True) for _ in range(count)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, out
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warehouse", default="/tmp/versiq-bench/wh-query-1000000")
    parser.add_argument("--store", default="bench")
    parser.add_argument("--cache")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.warehouse, args.store, args.cache)
        return
    cache = tempfile.mkdtemp(prefix="versiq-index-bench-")
    load_start = os.getloadavg()
    try:
        cold = _run(args.warehouse, args.store, cache)[0]
        warm = _run(args.warehouse, args.store, cache)[0]
        pair = _run(args.warehouse, args.store, cache, count=2)
        on_disk = sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(cache)
                      for name in names)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "store": args.store,
              "warehouse": args.warehouse, "load_generator": "in-process Engine.get, one thread",
              "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "index_on_disk_mb": on_disk >> 20,
              "cold": cold, "warm": warm, "two_warm_processes": pair}
    print(json.dumps(result, indent=2))
    write_result(os.path.join(ROOT, "bench", "results"), "serving-index", result, datetime.now(UTC))


if __name__ == "__main__":
    main()
