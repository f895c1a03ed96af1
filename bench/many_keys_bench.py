"""Queries beyond one key (issue 16): batchGet of 1,000 keys, 100,000 point-in-time lookups as
Arrow, a key-listing page of 1,000, and the change feed, against the single-key reads of the same
server in the same run (``/healthz`` and as-of: no regression).

Store: ``query_bench.ensure_store`` (``--keys`` keys x 10 versions, default 1M keys = 10M
versions, built by the real ingest or reused from ``--work``). Server: ``versiq serve
--workers 1`` on 127.0.0.1 (``query_bench.Server``). Load generator: one persistent
``httpx.Client`` in this process, sequential requests; times are measured by the client (so they
include the loopback HTTP and, for lookups, building the upload and reading the Arrow answer),
and the server's own time from its ``Server-Timing`` header beside them.
The machine load (``uptime``) is recorded before and after. Prints a table and writes
``bench/results/many-keys-<date>.json``.

    .venv/bin/python bench/many_keys_bench.py [--keys 1000000] [--n 200]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import gen_changelog as gen  # noqa: E402
from machine import uptime, write_result  # noqa: E402
from query_bench import STORE, Server, Workload, ensure_store, pct, sequential  # noqa: E402

ARROW = "application/vnd.apache.arrow.stream"


def server_ms(response: Any) -> float:
    """The server's own time for a response (its ``Server-Timing: app;dur=<ms>`` header)."""
    header = response.headers["server-timing"]
    return float(header.split("dur=", 1)[1].split(";", 1)[0])


def timed(fn: Any, n: int, warmup: int = 3) -> dict[str, Any]:
    """Client time (request to last byte read, this process) and server time (``Server-Timing``)
    of ``n`` calls of ``fn`` (which returns the response)."""
    for _ in range(warmup):
        fn()
    samples, server = [], []
    for _ in range(n):
        t = time.perf_counter_ns()
        response = fn()
        samples.append(time.perf_counter_ns() - t)
        server.append(int(server_ms(response) * 1e6))
    return dict(pct(samples), server=pct(server))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("VERSIQ_BENCH_WORK", "/tmp/versiq-bench"))
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--n", type=int, default=200, help="requests per measured route")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args()

    started = datetime.now(UTC)
    warehouse, info = ensure_store(args.work, args.keys)
    result: dict[str, Any] = {"date": started.strftime("%Y-%m-%d"), "store": info,
                              "machine": {"uptime_start": uptime()},
                              "load_generator": "one persistent httpx.Client in the benchmark process, sequential"}
    server = Server(warehouse, 1, os.path.join(args.work, "many-keys-serve.log"))
    try:
        result["ready_s"] = round(server.wait_ready(), 2)
        with httpx.Client(base_url=server.base, timeout=120) as client:
            stream_time = int(client.get(f"/v1/stores/{STORE}").json()["streamTime"])
            wl = Workload(args.keys, stream_time)
            result["single_key"] = sequential(server.base, wl, 2000, kinds=("healthz", "as_of"), warmup=200)
            rng = random.Random(11)
            keys = [f"k{rng.randrange(args.keys):0{gen.KEY_WIDTH}d}" for _ in range(20_000)]
            as_of = wl.as_of

            def batch_get() -> httpx.Response:
                start = rng.randrange(len(keys) - 1000)
                r = client.post(f"/v1/stores/{STORE}/keys:batchGet",
                                json={"keys": keys[start:start + 1000], "asOf": as_of[start]})
                assert r.status_code == 200, r.text
                return r

            result["batch_get_1000"] = timed(batch_get, args.n)
            pairs = pa.table({"key": [keys[i % len(keys)] for i in range(100_000)],
                              "asOf": pa.array([as_of[i % len(as_of)] for i in range(100_000)], pa.int64())})
            sink = io.BytesIO()
            with pa.ipc.new_stream(sink, pairs.schema) as writer:
                writer.write_table(pairs)
            upload = sink.getvalue()

            def lookups() -> httpx.Response:
                r = client.post(f"/v1/stores/{STORE}/lookups", content=upload,
                                headers={"content-type": ARROW, "accept": ARROW})
                assert r.status_code == 200, r.text
                with pa.ipc.open_stream(r.content) as reader:
                    assert reader.read_all().num_rows == 100_000
                return r

            result["lookups_100000_arrow"] = timed(lookups, max(3, args.n // 40), warmup=1)

            def listing() -> httpx.Response:
                start = keys[rng.randrange(len(keys))]
                r = client.get(f"/v1/stores/{STORE}/keys", params={"start": start, "pageSize": 1000})
                assert r.status_code == 200, r.text
                return r

            result["key_listing_page_1000"] = timed(listing, args.n)
            # the change feed: every change of the store (one run), paged by 1000, for ~20 s
            t0 = time.perf_counter()
            count, token, pages = 0, None, 0
            while time.perf_counter() - t0 < 20:
                params: dict[str, Any] = {"sinceSnapshot": -1, "pageSize": 1000}
                if token:
                    params["pageToken"] = token
                body = client.get(f"/v1/stores/{STORE}/changes", params=params).json()
                count += len(body["changes"])
                pages += 1
                token = body["nextPageToken"]
                if not token:
                    break
            seconds = time.perf_counter() - t0
            result["change_feed_pages_of_1000"] = {"changes": count, "pages": pages, "seconds": round(seconds, 2),
                                                   "changes_per_s": round(count / seconds)}
            # streamed as NDJSON: the whole feed in one answer
            t0 = time.perf_counter()
            streamed = 0
            with client.stream("GET", f"/v1/stores/{STORE}/changes", params={"sinceSnapshot": -1},
                               headers={"accept": "application/x-ndjson"}, timeout=600) as resp:
                for chunk in resp.iter_bytes():
                    streamed += chunk.count(b"\n")
            seconds = time.perf_counter() - t0
            result["change_feed_ndjson"] = {"changes": streamed, "seconds": round(seconds, 2),
                                            "changes_per_s": round(streamed / seconds)}
    finally:
        server.stop()
    result["machine"]["uptime_end"] = uptime()
    single = result["single_key"]
    print(f"store: {info['events']:,} events; ready in {result['ready_s']} s")
    print(f"healthz p50/p99 {single['healthz']['p50_ms']:.3f}/{single['healthz']['p99_ms']:.3f} ms; "
          f"as-of {single['as_of']['p50_ms']:.3f}/{single['as_of']['p99_ms']:.3f} ms "
          f"(x{single['as_of']['p50_ms'] / single['healthz']['p50_ms']:.2f} healthz p50)")
    for name in ("batch_get_1000", "lookups_100000_arrow", "key_listing_page_1000"):
        figure, server = result[name], result[name]["server"]
        print(f"{name:28s} client p50 {figure['p50_ms']:8.2f} ms  p99 {figure['p99_ms']:8.2f} ms; "
              f"server p50 {server['p50_ms']:8.2f} ms  p99 {server['p99_ms']:8.2f} ms")
    for name in ("change_feed_pages_of_1000", "change_feed_ndjson"):
        feed = result[name]
        print(f"{name}: {feed['changes']:,} changes in {feed['seconds']} s = {feed['changes_per_s']:,}/s")
    print(result["machine"]["uptime_start"])
    print(result["machine"]["uptime_end"])
    write_result(args.results, "many-keys", result, started)


if __name__ == "__main__":
    main()
