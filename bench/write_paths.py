"""Issue 12: the ingest benchmark with both Delta write paths, in one session of this script.

The old path (executors write Parquet with pyarrow, the driver commits with delta-rs) is the
project at a given git commit (``--old``, checked out with ``git worktree`` into ``--tree``);
the new path (every table through delta-spark) is this checkout. Each runs
``bench/ingest_bench.py`` in its own process (one SparkSession each, like a real run) over the
same generated changelogs; the runs alternate (old, new, old, new with ``--rounds 2``) so that
both see the same machine load, which is recorded. Prints every figure of both and the ratio
new / old (seconds: > 1 is slower).

    .venv/bin/python bench/write_paths.py --old 9a7ea09 [--big] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime

from machine import write_result  # bench/, the script's folder, is on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_bench(tree: str, args: argparse.Namespace, label: str) -> dict:
    results = os.path.join(args.work, "results")
    cmd = [sys.executable, os.path.join(tree, "bench", "ingest_bench.py"), "--work", args.work,
           "--batches", str(args.batches), "--label", label, "--results", results]
    if args.big:
        cmd.append("--big")
    env = {**os.environ, "PYTHONPATH": tree}  # this tree's versiq before the installed one
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True).stdout
    path = out.strip().splitlines()[-1].removeprefix("wrote ").strip()
    with open(path) as fh:
        return json.load(fh)


def figures(result: dict) -> dict[str, float]:
    out = {}
    for fb in result["full_build"]:
        out[f"full build {fb['format']} {fb['events']:,} (s)"] = fb["seconds"]
    for inc in result["incremental"]:
        out[f"incremental {inc['batch_events']:,} into {inc['store_versions']:,} (median s)"] = inc["median_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="git commit of the old write path")
    ap.add_argument("--tree", default="/tmp/versiq-old-writer", help="where to check it out")
    ap.add_argument("--work", default="/tmp/versiq-bench")
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--paths", default="old,new", help="which write paths to run (a quick look at one)")
    args = ap.parse_args()
    if not os.path.isdir(args.tree):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "-f", args.tree, args.old], check=True)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for name, tree in (("old", args.tree), ("new", ROOT)):
            if name not in args.paths.split(","):
                continue
            print(f"round {r + 1}: {name} write path ({tree}) load {os.getloadavg()[0]:.2f}", flush=True)
            runs[name].append(run_bench(tree, args, f"writepath-{name}-{r + 1}"))
    best = {name: {k: min(figures(res)[k] for res in rs) for k in figures(rs[0])} for name, rs in runs.items() if rs}
    print(f"\n{'figure':52s} {'old (delta-rs)':>15s} {'new (delta-spark)':>18s} {'new/old':>8s}")
    for key in best.get("old", best.get("new", {})):
        old, new = best.get("old", {}).get(key), best.get("new", {}).get(key)
        ratio = f"{new / old:8.2f}" if old and new else ""
        print(f"{key:52s} {old or 0:15.2f} {new or 0:18.2f} {ratio}")
    loads = [res["machine"] for rs in runs.values() for res in rs]
    print("machine load (uptime at start/end of each run):")
    for m in loads:
        print("  ", m["uptime_start"], "|", m["uptime_end"])
    summary = {"started": started, "old_commit": args.old, "best": best, "runs": runs}
    write_result(os.path.join(HERE, "results"), "write-paths", summary, datetime.fromisoformat(started))


if __name__ == "__main__":
    main()
