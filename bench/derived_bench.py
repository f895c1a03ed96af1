"""Derived-tables benchmark (issue #5): build throughput and incremental-update cost, one
derived table per operator, at 1M input records.

Sources (JSONL, generated here with numpy/pyarrow, seed 42; ``N`` = ``--records``):

- ``orders`` store: N records over N/5 keys (``o0000042``), value
  ``{"amount":n,"customer_id":"c000123","region":"r042"}`` (``--regions`` distinct regions,
  default 1000, N/20 customers); timestamps grow with processing position over 30 days, 10% moved back by up
  to half the 7-day grace (out of order), 1% tombstones.
- ``shipments`` store: one record per order key (N/5), in time order.
- ``customers`` store: N/20 keys, one record each, all before the first order.
- ``prices`` store: N/200 products x 10 versions (N/20 records), in time order.
- ``clicks`` stream: N records on random products, in time order.

Operators, one pipeline each (so every derived pass is timed alone):

| operator | table | inputs |
| filter | ``from: orders, filter: value.amount > 500`` | orders |
| join (PK, left) | ``join: {left: orders, right: shipments}`` | orders + shipments |
| fk_join (left) | ``fk_join: {left: orders, right: customers, foreign_key: value.customer_id}`` | orders + customers |
| aggregate | ``from: orders, group_by: value.region, aggregate: {count, sum: value.amount}`` | orders |
| stream_join (left) | ``stream_join: {stream: clicks, table: prices}`` | clicks + prices |

Phases, one SparkSession (``local[*]``) for everything:

1. **Build.** One run ingests every source (the baseline: ``stores[..].seconds`` /
   ``streams[..].seconds``, with ``_changelog``), then one ``run_pipeline`` per operator (its
   sources have no new files, so it only derives). The figure is the derived pass's seconds
   (``tables[name].seconds``) and input records / s; the ratio derive / ingest compares it with
   the ingest of that operator's inputs.
2. **Incremental.** A batch of new files: ``--batch`` (10k) orders (random existing keys plus
   2% new ones, 10% out of order, 1% tombstones), 10k clicks, and 10% / 2% / 1% of that for
   shipments / customers / prices; one ingest run, then one ``run_pipeline`` per operator. The
   ratio incremental / build shows whether the cost follows the batch.

``--partitions 1,4`` runs everything once per partition count of the source stores (keys in
Kafka's default partition), in the same process: 1 is the baseline, where every topology has one
partition; with several, the topologies that do not re-key (filter, join, stream_join) run one
Spark task per partition. Above ``VERSIQ_DERIVE_HERE_RECORDS`` a pass is a Spark job, so the
build runs in Spark tasks and the batch in the driver.

The derived pass is split into phases by wrapping functions: reading and processing the pass
(``job.run_job``, Spark tasks; ``job.run_here``, this process), the commits (``derive._commit``);
in this process, ``PartitionRun.feed`` and the ``SnapshotReader.load`` calls are counted too (in Spark
tasks they run in other processes). The driver's peak resident memory during each pass
(``VmRSS``, sampled every 50 ms) is reported as ``driver_rss_mb`` (this Python process) and
``driver_jvm_rss_mb`` (its JVM: with a local master also the executor's).
Prints a table and writes ``bench/results/derived-<date>[-<N>].json``.

    .venv/bin/python bench/derived_bench.py [--records 1000000] [--partitions 1,4] [--quick] [--work DIR] [--master URL]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gen_changelog as gen  # noqa: E402
from machine import loadavg, uptime, write_result  # noqa: E402

from versiq.ingest.config import Pipeline  # noqa: E402
from versiq.ingest.derived.spec import parse_tables  # noqa: E402
from versiq.ingest.pipeline import StoreSpec  # noqa: E402
from versiq.ingest.streams import StreamSpec  # noqa: E402

START_MS = gen.START_MS
SPAN_MS = gen.SPAN_MS
GRACE_MS = gen.GRACE_MS
DAY_MS = 86_400_000

STORES = ("orders", "shipments", "customers", "prices")
STREAMS = ("clicks",)
KINDS = {**dict.fromkeys(STORES, "versioned"), **dict.fromkeys(STREAMS, "stream")}

#: operator -> (derived table entry as in the pipeline file, source inputs)
OPERATORS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "filter": ({"name": "big_orders", "from": "orders", "filter": "value.amount > 500"}, ("orders",)),
    "join": ({"name": "orders_shipments", "join": {"left": "orders", "right": "shipments", "type": "left"}},
             ("orders", "shipments")),
    "fk_join": ({"name": "orders_customers",
                 "fk_join": {"left": "orders", "right": "customers", "foreign_key": "value.customer_id",
                             "type": "left"}}, ("orders", "customers")),
    "aggregate": ({"name": "revenue_by_region", "from": "orders", "group_by": "value.region",
                   "aggregate": {"count": True, "sum": "value.amount"}}, ("orders",)),
    "stream_join": ({"name": "clicks_priced", "stream_join": {"stream": "clicks", "table": "prices", "type": "left"}},
                    ("clicks", "prices")),
}


# -- data ----------------------------------------------------------------------------------

def _num(values: np.ndarray, width: int) -> pa.Array:
    return pc.utf8_lpad(pc.cast(pa.array(values), pa.string()), width, "0")


def _ts_perturbed(rng: np.random.Generator, ts: np.ndarray, out_of_order: float) -> np.ndarray:
    ts = ts.copy()
    ooo = rng.random(len(ts)) < out_of_order
    ts[ooo] -= rng.integers(1, GRACE_MS // 2, size=int(ooo.sum()), dtype=np.int64)
    return ts


def _tombstones(rng: np.random.Generator, value: pa.Array, share: float) -> pa.Array:
    n = len(value)
    return pc.if_else(pa.array(rng.random(n) < share), pa.nulls(n, pa.string()), value)


def _table(key: pa.Array, value: pa.Array, ts: np.ndarray) -> pa.Table:
    return pa.table({"key": key, "value": value, "timestamp": pa.array(ts, pa.int64()),
                     "is_late": pa.array(np.zeros(len(ts), dtype=bool))})


class Sizes:
    def __init__(self, records: int, regions: int) -> None:
        self.records = records
        self.order_keys = max(10, records // 5)
        self.customers = max(10, records // 20)
        self.products = max(10, records // 200)
        self.price_versions = 10
        self.regions = regions
        self.step = max(1, SPAN_MS // records)  # time step of the orders / clicks logs

    def to_json(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items()}


def gen_orders(rng: np.random.Generator, s: Sizes, n: int, batch: bool) -> pa.Table:
    if batch:  # random existing keys, 2% new ones
        ids = rng.integers(0, s.order_keys + max(1, s.order_keys // 50), size=n, dtype=np.int64)
        ts = START_MS + (s.records + np.arange(n, dtype=np.int64)) * s.step
    else:
        ids = np.repeat(np.arange(s.order_keys, dtype=np.int64), -(-n // s.order_keys))[:n]
        rng.shuffle(ids)
        ts = START_MS + np.arange(n, dtype=np.int64) * s.step
    value = pc.binary_join_element_wise(
        '{"amount":', pc.cast(pa.array(rng.integers(1, 1001, size=n)), pa.string()),
        ',"customer_id":"c', _num(rng.integers(0, s.customers, size=n), 6),
        '","region":"r', _num(rng.integers(0, s.regions, size=n), 3), '"}', "")
    key = pc.binary_join_element_wise("o", _num(ids, 7), "")
    return _table(key, _tombstones(rng, value, 0.01), _ts_perturbed(rng, ts, 0.10))


def gen_shipments(rng: np.random.Generator, s: Sizes, n: int, batch: bool) -> pa.Table:
    if batch:
        ids = rng.integers(0, s.order_keys, size=n, dtype=np.int64)
        ts = np.sort(START_MS + s.records * s.step + rng.integers(0, n * 10 * s.step, size=n))
        ts = _ts_perturbed(rng, ts, 0.10)
    else:
        ids = rng.permutation(s.order_keys)[:n]
        ts = np.sort(START_MS + rng.integers(0, SPAN_MS, size=n))
    carriers = np.array(["dhl", "ups", "fedex", "post"])
    value = pc.binary_join_element_wise(
        '{"carrier":"', pa.array(carriers[rng.integers(0, 4, size=n)]), '","days":',
        pc.cast(pa.array(rng.integers(1, 10, size=n)), pa.string()), "}", "")
    return _table(pc.binary_join_element_wise("o", _num(ids, 7), ""), value, ts)


def gen_customers(rng: np.random.Generator, s: Sizes, n: int, batch: bool) -> pa.Table:
    if batch:
        ids = rng.integers(0, s.customers, size=n, dtype=np.int64)
        ts = np.sort(START_MS + s.records * s.step + rng.integers(0, n * 50 * s.step, size=n))
    else:
        ids = np.arange(n, dtype=np.int64)
        ts = START_MS - DAY_MS + ids  # every customer exists before the first order
    value = pc.binary_join_element_wise(
        '{"name":"n', _num(ids, 6), '","tier":', pc.cast(pa.array(rng.integers(1, 4, size=n)), pa.string()),
        "}", "")
    return _table(pc.binary_join_element_wise("c", _num(ids, 6), ""), value, ts)


def gen_prices(rng: np.random.Generator, s: Sizes, n: int, batch: bool) -> pa.Table:
    if batch:
        ids = rng.integers(0, s.products, size=n, dtype=np.int64)
        ts = np.sort(START_MS + s.records * s.step + rng.integers(0, n * 100 * s.step, size=n))
    else:
        ids = np.repeat(np.arange(s.products, dtype=np.int64), s.price_versions)
        rng.shuffle(ids)
        ids = ids[:n]
        ts = np.sort(START_MS - DAY_MS + rng.integers(0, SPAN_MS, size=n))
    value = pc.binary_join_element_wise('{"price":', pc.cast(pa.array(rng.integers(100, 100_000, size=n)),
                                                             pa.string()), "}", "")
    return _table(pc.binary_join_element_wise("p", _num(ids, 5), ""), value, ts)


def gen_clicks(rng: np.random.Generator, s: Sizes, n: int, batch: bool) -> pa.Table:
    base = s.records if batch else 0
    ts = START_MS + (base + np.arange(n, dtype=np.int64)) * s.step + rng.integers(0, 1000, size=n)
    value = pc.binary_join_element_wise(
        '{"user":"u', _num(rng.integers(0, 100_000, size=n), 6), '","qty":',
        pc.cast(pa.array(rng.integers(1, 5, size=n)), pa.string()), "}", "")
    return _table(pc.binary_join_element_wise("p", _num(rng.integers(0, s.products, size=n), 5), ""), value, ts)


GENERATORS = {"orders": gen_orders, "shipments": gen_shipments, "customers": gen_customers,
              "prices": gen_prices, "clicks": gen_clicks}


def build_counts(s: Sizes) -> dict[str, int]:
    return {"orders": s.records, "shipments": s.order_keys, "customers": s.customers,
            "prices": s.products * s.price_versions, "clicks": s.records}


def batch_counts(batch: int) -> dict[str, int]:
    return {"orders": batch, "shipments": max(1, batch // 10), "customers": max(1, batch // 50),
            "prices": max(1, batch // 100), "clicks": batch}


def write_sources(root: str, s: Sizes, counts: dict[str, int], step: int) -> dict[str, int]:
    """Write one step's files (step 0 = build, 1 = batch) of every source; records per source."""
    out = {}
    for name, n in counts.items():
        rng = np.random.default_rng(42 + 1000 * step + sorted(GENERATORS).index(name))
        tbl = GENERATORS[name](rng, s, n, batch=step > 0)
        files = 1 if step > 0 else max(1, min(8, n // 125_000))
        tmp = os.path.join(root, "_gen", name, str(step))
        shutil.rmtree(tmp, ignore_errors=True)
        for path in gen.write_changelog(tbl, tmp, "jsonl", files=files, prefix=f"step{step}"):
            target = os.path.join(root, "generated", f"step{step}", name)
            os.makedirs(target, exist_ok=True)
            shutil.move(path, os.path.join(target, os.path.basename(path)))
        out[name] = tbl.num_rows
    shutil.rmtree(os.path.join(root, "_gen"), ignore_errors=True)
    return out


# -- pipelines -----------------------------------------------------------------------------

#: The partition count of the source stores (``--partitions``), set by ``main`` for each pass over them.
PARTITIONS = [1]


def source_specs(root: str, names: tuple[str, ...] | list[str]) -> tuple[list[StoreSpec], list[StreamSpec]]:
    stores = [StoreSpec(n, os.path.join(root, "sources", n), format="jsonl", kind="versioned",
                        history_retention_ms=GRACE_MS, changelog=True, partitions=PARTITIONS[0])
              for n in STORES if n in names]
    streams = [StreamSpec(n, os.path.join(root, "sources", n), format="jsonl") for n in STREAMS if n in names]
    return stores, streams


def operator_pipeline(root: str, op: str) -> Pipeline:
    entry, inputs = OPERATORS[op]
    stores, streams = source_specs(root, inputs)
    table = dict(entry)
    if "stream_join" not in table:
        table["history_retention"] = "7d"  # the sources' grace: out-of-order results are not late
    return Pipeline(stores=stores, streams=streams, tables=parse_tables([table], KINDS))


# -- instrumentation -----------------------------------------------------------------------

PHASES: dict[str, float] = {}
LOADS = {"calls": 0, "keys_all": 0, "keys_requested": 0, "seconds": 0.0, "all_seconds": 0.0}


def instrument() -> None:
    """Time the derived pass's phases (names below) and count ``SnapshotReader.load`` calls."""
    import versiq.ingest.derived.derive as run
    import versiq.ingest.derived.job as job
    from versiq.ingest.derived.state import SnapshotReader
    from versiq.ingest.derived.tasks import PartitionRun

    def timed(fn: Any, label: str) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                PHASES[label] = PHASES.get(label, 0.0) + time.perf_counter() - t
        return wrapper

    for name, label in (("run_job", "spark tasks"), ("run_here", "in the driver")):
        setattr(run, name, timed(getattr(job, name), label))
    run._commit = timed(run._commit, "commit")  # type: ignore[attr-defined]
    PartitionRun.feed = timed(PartitionRun.feed, "topology")  # type: ignore[method-assign]
    original = SnapshotReader.load

    @functools.wraps(original)
    def load(self: Any, keys: Any, latest_only: bool = False) -> Any:
        t = time.perf_counter()
        if keys is None:
            LOADS["keys_all"] += 1
        else:
            keys = list(keys)
            LOADS["keys_requested"] += len(keys)
        LOADS["calls"] += 1
        try:
            return original(self, keys, latest_only)
        finally:
            LOADS["seconds"] += time.perf_counter() - t
            if keys is None:
                LOADS["all_seconds"] += time.perf_counter() - t
    SnapshotReader.load = load  # type: ignore[method-assign]


def take_phases(total: float) -> dict[str, Any]:
    out: dict[str, Any] = {k: round(v, 2) for k, v in PHASES.items()}
    out["other (locks, snapshots, readers)"] = round(total - sum(PHASES.values()), 2)
    out["snapshot_loads"] = {"calls": LOADS["calls"], "whole_table_loads": LOADS["keys_all"],
                             "keys_requested": LOADS["keys_requested"], "seconds": round(LOADS["seconds"], 2),
                             "whole_table_seconds": round(LOADS["all_seconds"], 2)}
    PHASES.clear()
    LOADS.update(calls=0, keys_all=0, keys_requested=0, seconds=0.0, all_seconds=0.0)
    return out




def git_state() -> dict[str, Any]:
    """The commit measured and the files that differ from it (others may be editing the tree)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", here, *cmd], capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "modified": git("status", "--porcelain", "--", "ingest").splitlines()}




# -- phases --------------------------------------------------------------------------------

def ingest_sources(spark: Any, root: str, names: list[str] | None = None) -> dict[str, Any]:
    """Ingest the sources ``names`` (those of the operators measured; default: every source)."""
    from versiq.ingest.run import run_pipeline

    stores, streams = source_specs(root, names if names is not None else [*STORES, *STREAMS])
    t0 = time.perf_counter()
    rep = run_pipeline(spark, os.path.join(root, "warehouse"), Pipeline(stores=stores, streams=streams))
    seconds = time.perf_counter() - t0
    if rep.failed:
        raise RuntimeError(json.dumps(rep.to_json()))
    out: dict[str, Any] = {"seconds": round(seconds, 2), "per_source_s": {}, "reports": rep.to_json()}
    for name, r in [*rep.stores.items(), *rep.streams.items()]:
        out["per_source_s"][name] = round(r.seconds, 2)
        print(f"  ingest {name:10s} {getattr(r, 'read', 0):>10,} records {r.seconds:7.1f} s", flush=True)
    return out


def link_step(root: str, here: str, step: int) -> None:
    """Make step ``step``'s generated files visible in ``here``'s sources (hard links)."""
    source = os.path.join(root, "generated", f"step{step}")
    for name in os.listdir(source):
        target = os.path.join(here, "sources", name)
        os.makedirs(target, exist_ok=True)
        for file in os.listdir(os.path.join(source, name)):
            os.link(os.path.join(source, name, file), os.path.join(target, file))


def warm_up(spark: Any, root: str) -> None:
    """A throwaway ingest + derive so the first measured ingest does not pay Spark's warm-up
    (class loading, Python workers, first-job planning)."""
    from versiq.ingest.run import run_pipeline

    folder = os.path.join(root, "_warm_up")
    os.makedirs(os.path.join(folder, "src"))
    with open(os.path.join(folder, "src", "a.jsonl"), "w") as fh:
        fh.writelines(f'{{"key":"k{i}","value":{{"amount":{i}}},"timestamp":{START_MS + i}}}\n' for i in range(1000))
    store = StoreSpec("w", os.path.join(folder, "src"), format="jsonl", changelog=True)
    tables = parse_tables([{"name": "w_big", "from": "w", "filter": "value.amount > 5"}], {"w": "versioned"})
    rep = run_pipeline(spark, os.path.join(folder, "warehouse"), Pipeline(stores=[store], tables=tables))
    if rep.failed:
        raise RuntimeError(json.dumps(rep.to_json()))
    shutil.rmtree(folder)


class PeakRss:
    """The peak resident memory (``VmRSS``) of this process and of the driver's JVM while the
    block runs, sampled every 50 ms. With a local master the JVM is the executor too (its
    heap, ``spark.driver.memory``, holds the tasks' data); with a cluster's it is the driver's
    alone. With a local master, also the Spark tasks' Python workers (``pyspark.daemon``
    processes of this machine), every 250 ms: the largest one (``worker_peak_mb``) and their
    sum (``workers_peak_mb``), and the largest one before the block (``worker_before_mb``: Spark
    reuses its workers, and a worker keeps the memory its earlier tasks took)."""

    def __init__(self, jvm_pid: int | None = None) -> None:
        self.jvm_pid = jvm_pid

    def __enter__(self) -> PeakRss:
        import threading

        self.peak_mb = self._now("self")
        self.jvm_peak_mb = self._now(self.jvm_pid)
        self.worker_peak_mb = self.workers_peak_mb = 0.0
        # Spark reuses its Python workers, which keep the memory of earlier tasks (the ingest's)
        self.worker_before_mb = max((self._now(pid) for pid in self._python_workers()), default=0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        ticks = 0
        while not self._stop.wait(0.05):
            self.peak_mb = max(self.peak_mb, self._now("self"))
            self.jvm_peak_mb = max(self.jvm_peak_mb, self._now(self.jvm_pid))
            ticks += 1
            if ticks % 5 == 0:
                workers = [self._now(pid) for pid in self._python_workers()]
                self.worker_peak_mb = max(self.worker_peak_mb, max(workers, default=0.0))
                self.workers_peak_mb = max(self.workers_peak_mb, sum(workers))

    @staticmethod
    def _python_workers() -> list[str]:
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        if b"pyspark.daemon" in fh.read():
                            found.append(pid)
                except OSError:
                    pass
        return found

    @staticmethod
    def _now(pid: int | str | None) -> float:
        if pid is None:
            return 0.0
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def derive_one(spark: Any, root: str, op: str, inputs: dict[str, int], ingest_s: dict[str, float],
               profile: bool) -> dict[str, Any]:
    from versiq.ingest.run import run_pipeline

    pipeline = operator_pipeline(root, op)
    name = pipeline.tables[0].name
    load_before = loadavg()
    prof = cProfile.Profile() if profile else None
    PHASES.clear()
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    with PeakRss(spark.sparkContext._jvm.ProcessHandle.current().pid()) as rss:
        rep = run_pipeline(spark, os.path.join(root, "warehouse"), pipeline)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    if rep.failed:
        raise RuntimeError(json.dumps(rep.to_json()))
    table = rep.tables[name]
    records = sum(inputs[s] for s in OPERATORS[op][1])
    base = sum(ingest_s[s] for s in OPERATORS[op][1])
    derive_s = table.seconds
    out: dict[str, Any] = {
        "table": name, "input_records": records, "derive_s": round(derive_s, 2),
        "records_per_s": round(records / derive_s) if derive_s else None,
        "ingest_of_inputs_s": round(base, 2), "derive_over_ingest": round(derive_s / base, 2) if base else None,
        "run_pipeline_wall_s": round(wall, 2), "driver_rss_mb": round(rss.peak_mb),
        "driver_jvm_rss_mb": round(rss.jvm_peak_mb), "worker_rss_mb": round(rss.worker_peak_mb),
        "worker_rss_before_mb": round(rss.worker_before_mb),
        "workers_rss_mb": round(rss.workers_peak_mb),
        "noop_source_ingest_s": round(sum(r.seconds for r in [*rep.stores.values(), *rep.streams.values()]), 2),
        "phases_s": take_phases(derive_s), "report": table.to_json(),
        "load_before": load_before, "load_after": loadavg(),
    }
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        out["driver_profile_top"] = s.getvalue()
    print(f"  {op:12s} {records:>10,} input records  derive {derive_s:8.2f} s  {out['records_per_s'] or 0:>9,} rec/s  "
          f"(ingest of inputs {base:6.1f} s, x{out['derive_over_ingest']})  emitted {table.emitted:,}  "
          f"driver {out['driver_rss_mb']} MB (JVM {out['driver_jvm_rss_mb']} MB)  Python worker "
          f"{out['worker_rss_mb']} MB (all {out['workers_rss_mb']} MB; before {out['worker_rss_before_mb']} MB)  "
          f"load {load_before}", flush=True)
    print(f"    phases: {out['phases_s']}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("VERSIQ_BENCH_WORK", "/tmp/versiq-bench"))
    ap.add_argument("--records", type=int, default=1_000_000, help="orders records and clicks records")
    ap.add_argument("--quick", action="store_true", help="smoke test: 100k records")
    ap.add_argument("--batch", type=int, default=10_000, help="orders / clicks records of the incremental batch")
    ap.add_argument("--regions", type=int, default=1000, help="distinct group keys of the aggregation")
    ap.add_argument("--operators", default=",".join(OPERATORS), help="comma-separated subset")
    ap.add_argument("--profile", default="", help="comma-separated operators to cProfile (build and batch)")
    ap.add_argument("--partitions", default="1", help="comma-separated partition counts of the source stores")
    ap.add_argument("--master", default="local[*]", help="Spark master (derived_cluster_bench.py: standalone)")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    records = 100_000 if args.quick else args.records
    ops = [o for o in args.operators.split(",") if o]
    unknown = set(ops) - set(OPERATORS)
    if unknown:
        ap.error(f"unknown operator(s) {sorted(unknown)}; known: {', '.join(OPERATORS)}")
    profiled = set(filter(None, args.profile.split(",")))
    sizes = Sizes(records, args.regions)
    counts = [int(p) for p in args.partitions.split(",") if p]
    root = os.path.join(args.work, f"derived-{records}")
    shutil.rmtree(root, ignore_errors=True)
    instrument()

    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "date": started.strftime("%Y-%m-%d"), "started": started.isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "uptime_start": uptime()},
        "git": git_state(), "sizes": sizes.to_json(), "batch": args.batch,
        "operators": {o: OPERATORS[o][0] for o in ops},
    }
    needed = sorted({s for op in ops for s in OPERATORS[op][1]})
    t0 = time.perf_counter()
    build_in = write_sources(root, sizes, {n: c for n, c in build_counts(sizes).items() if n in needed}, 0)
    batch_in = write_sources(root, sizes, {n: c for n, c in batch_counts(args.batch).items() if n in needed}, 1)
    result["generate_s"] = round(time.perf_counter() - t0, 2)
    print(f"generated {build_in} and a batch of {batch_in} in {result['generate_s']} s under {root}", flush=True)

    from versiq.ingest.spark import get_spark

    t0 = time.perf_counter()
    spark = get_spark(args.master)
    result["spark_start_s"] = round(time.perf_counter() - t0, 2)
    result["spark"] = {"version": spark.version, "master": spark.sparkContext.master}
    t0 = time.perf_counter()
    warm_up(spark, root)
    result["warm_up_s"] = round(time.perf_counter() - t0, 2)

    result["partitions"] = {}
    for partitions in counts:
        PARTITIONS[0] = partitions
        here = os.path.join(root, f"partitions-{partitions}")
        per_count: dict[str, Any] = {}
        for step, (phase, inputs) in enumerate((("build", build_in), ("incremental", batch_in))):
            link_step(root, here, step)
            print(f"{partitions} partition(s), {phase}: ingest of the sources ({inputs})", flush=True)
            ingest = ingest_sources(spark, here, needed)
            per = {}
            for op in ops:
                per[op] = derive_one(spark, here, op, inputs, ingest["per_source_s"], op in profiled)
            per_count[phase] = {"input_records": inputs, "ingest": ingest, "operators": per}
        for op in ops:
            b, i = per_count["build"]["operators"][op], per_count["incremental"]["operators"][op]
            i["incremental_over_build"] = round(i["derive_s"] / b["derive_s"], 4) if b["derive_s"] else None
        result["partitions"][str(partitions)] = per_count
    result["machine"]["uptime_end"] = uptime()
    spark.stop()

    print()
    print(f"{records:,} records; batch {args.batch:,}. Derive = the derived pass (tables[name].seconds); "
          "ingest = the Spark ingest of that operator's inputs in the same run; x1 = derive s with 1 partition / "
          "derive s with this many.")
    head = (f"{'operator':12s} {'parts':>5s} {'build in':>10s} {'derive s':>9s} {'rec/s':>9s} {'x1':>5s} "
            f"{'d/i':>6s} {'rss MB':>7s} | {'batch in':>8s} {'derive s':>9s} {'inc/build':>9s}")
    print(head)
    print("-" * len(head))
    base = result["partitions"][str(counts[0])]
    for op in ops:
        for partitions in counts:
            per_count = result["partitions"][str(partitions)]
            b, i = per_count["build"]["operators"][op], per_count["incremental"]["operators"][op]
            x1 = base["build"]["operators"][op]["derive_s"] / b["derive_s"] if b["derive_s"] else 0
            print(f"{op:12s} {partitions:>5d} {b['input_records']:>10,} {b['derive_s']:9.2f} "
                  f"{b['records_per_s'] or 0:>9,} {x1:5.2f} {b['derive_over_ingest']:6.2f} {b['driver_rss_mb']:>7,} | "
                  f"{i['input_records']:>8,} {i['derive_s']:9.2f} {i['incremental_over_build']:9.3f}")
    print(result["machine"]["uptime_start"])
    print(result["machine"]["uptime_end"])
    write_result(args.results, "derived", result, started, "" if records == 1_000_000 else str(records))


if __name__ == "__main__":
    main()
