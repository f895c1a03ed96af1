"""A pipeline of many small stores: its runs side by side (``VERSIQ_PARALLEL_RUNS``) against one
after the other, in the same process and session, alternating.

Two pipelines of the same shape, each ``--stores`` stores fed a small JSONL file per run (40
events of 5 keys) and a derived filter table per store (independent passes). Each round lands
one file per store in both pipelines' sources and runs both pipelines (``run_pipeline``): one
with the setting, one with ``VERSIQ_PARALLEL_RUNS=1``, which goes first alternating. The first
round (tables created) is reported apart. Prints per-round times of the stores' and the derived
phases (from each report's per-table seconds is not enough: phases overlap, so wall times of
``run_ingest`` and ``derive`` are taken around them), the ratio, and the machine's load.

    .venv/bin/python bench/parallel_runs.py [--stores 12] [--rounds 6] [--parallel 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from machine import loadavg, uptime, write_result  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--work", default="/tmp/versiq-bench/parallel-runs")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    from versiq.ingest.config import Pipeline
    from versiq.ingest.derived.derive import derive
    from versiq.ingest.derived.spec import parse_tables
    from versiq.ingest.pipeline import StoreSpec, run_ingest
    from versiq.ingest.spark import get_spark

    started = datetime.now(UTC)
    shutil.rmtree(args.work, ignore_errors=True)
    spark = get_spark()
    rng = random.Random(7)
    names = [f"s{i}" for i in range(args.stores)]
    modes = {"together": str(args.parallel), "alone": "1"}

    def pipeline(mode: str) -> Any:
        stores = [StoreSpec(name=n, source=os.path.join(args.work, mode, "sources", n), changelog=True) for n in names]
        tables = parse_tables([{"name": f"{n}_big", "from": n, "filter": "value.n > 3"} for n in names],
                              {n: "versioned" for n in names})
        return Pipeline(stores=stores, streams=[], tables=tables)

    pipelines = {mode: pipeline(mode) for mode in modes}
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        lines = {n: [json.dumps({"key": f"k{rng.randint(1, 5)}", "value": {"n": rng.randint(0, 9)},
                                 "timestamp": 100 * r + rng.randint(0, 99)}) for _ in range(40)] for n in names}
        order = list(modes) if r % 2 else list(reversed(modes))
        row: dict[str, Any] = {"round": r, "first": order[0], "load": loadavg()}
        for mode in order:
            for n in names:
                folder = os.path.join(args.work, mode, "sources", n)
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, f"run-{r:03d}.jsonl"), "w") as handle:
                    handle.write("\n".join(lines[n]) + "\n")
            os.environ["VERSIQ_PARALLEL_RUNS"] = modes[mode]
            warehouse = os.path.join(args.work, mode, "warehouse")
            t0 = time.monotonic()
            report = run_ingest(spark, warehouse, pipelines[mode].stores)
            t1 = time.monotonic()
            tables = derive(spark, warehouse, pipelines[mode], 60.0)
            t2 = time.monotonic()
            failed = [n for n, s in {**report.stores, **tables}.items() if s.error]
            assert not failed, failed
            row[mode] = {"stores_s": round(t1 - t0, 2), "derived_s": round(t2 - t1, 2), "total_s": round(t2 - t0, 2)}
        row["ratio"] = round(row["alone"]["total_s"] / row["together"]["total_s"], 2)
        print(json.dumps(row), flush=True)
        rounds.append(row)
    steady = rounds[1:]
    summary = {mode: {phase: round(statistics.median(r[mode][phase] for r in steady), 2)
                      for phase in ("stores_s", "derived_s", "total_s")} for mode in modes}
    summary["ratio"] = round(summary["alone"]["total_s"] / summary["together"]["total_s"], 2)
    print(f"{args.stores} stores + {args.stores} derived tables per run, {args.parallel} at a time against one at a "
          f"time (median of rounds 2-{args.rounds}): {json.dumps(summary)}")
    print(uptime())
    write_result(args.results, "parallel-runs", {"stores": args.stores, "parallel": args.parallel,
                                                 "rounds": rounds, "summary": summary, "uptime": uptime()}, started)


if __name__ == "__main__":
    main()
