"""The record-at-a-time part of a derived pass alone: ``tasks.PartitionRun`` over generated
records, without Spark, Delta or DuckDB, to time and profile the Python path per operator.

The records are ``derived_bench``'s build sources (same generators, seed and sizes; ``N`` =
``--records``), each source in its file order, all in partition 0, and every table starts
empty (no snapshot), as a first build does. Each operator is ``derived_bench``'s pipeline entry.
For each operator the pass runs ``--repeat`` times and the best time is kept (the process's CPU
time, which a loaded machine disturbs less than wall time); the figures are input records per
CPU second of a ``PartitionRun`` (the topology, the state bookkeeping and the result tables)
and of the whole Spark task's Python work (``job.partition_runner``: the records as Arrow
batches in, the result rows out), not Spark's reading, sorting and writing.

``--digest`` prints a SHA-256 of everything the partition returns per operator (changed rows,
``_emitted`` rows, late results, counts, stream time), ``late`` rows without their
``ingested_at``: two checkouts that print the same digests computed the same answers.
``--profile`` runs each operator's task once more under ``cProfile`` (CPU time) and prints the
top functions. ``--partitions N`` also runs the whole pass (``job.process_here``: every stage,
a group-by's repartition included) with the records in 1 and in N partitions (a key's
partition by Kafka's partitioner) and prints both CPU times: what a repartition adds in
Python (Spark's shuffle not included), and what N cores could share.

Run it from the checkout to measure (its directory goes first on ``sys.path``):

    PYTHONPATH=. .venv/bin/python bench/derived_profile.py [--records 200000] [--operators filter,join]
        [--repeat 3] [--digest] [--profile] [--json FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import derived_bench as bench  # noqa: E402
from machine import loadavg  # noqa: E402

from versiq.ingest.derived.job import RECORDS_SCHEMA, merged_here, partition_runner, process_here  # noqa: E402
from versiq.ingest.derived.spec import TableSpec, parse_tables  # noqa: E402
from versiq.ingest.derived.tasks import PartitionResult, PartitionRun, PassWork, Readers, TableRead  # noqa: E402
from versiq.ingest.derived.topology import SourceRecord  # noqa: E402
from versiq.layout import MURMUR2, default_partition_of  # noqa: E402


def sources(records: int) -> dict[str, list[SourceRecord]]:
    """Every build source's records in file order (``derived_bench.write_sources``, step 0)."""
    sizes = bench.Sizes(records, 1000)
    out = {}
    for name, n in bench.build_counts(sizes).items():
        rng = np.random.default_rng(42 + sorted(bench.GENERATORS).index(name))
        table = bench.GENERATORS[name](rng, sizes, n, batch=False)
        out[name] = [SourceRecord(k, v, t, 0) for k, v, t in zip(
            table["key"].to_pylist(), table["value"].to_pylist(), table["timestamp"].to_pylist(), strict=True)]
    return out


def work_of(op: str) -> tuple[PassWork, TableSpec]:
    entry, inputs = bench.OPERATORS[op]
    table = dict(entry)
    if "stream_join" not in table:
        table["history_retention"] = "7d"
    spec = parse_tables([table], bench.KINDS)[0]
    reads = [TableRead(n, f"/nonexistent/{n}", None, "versioned", bench.GRACE_MS, 16) for n in inputs
             if bench.KINDS[n] != "stream"]
    if not spec.is_stream:
        reads.append(TableRead(spec.name, f"/nonexistent/{spec.name}", None, spec.kind, spec.history_retention_ms,
                               spec.buckets))
    work = PassWork(tables=(spec,), writers=(spec.name,), reads=tuple(reads),
                    inputs=tuple((n, bench.KINDS[n] == "stream") for n in inputs), runs=((spec.name, 1),))
    return work, spec


def run_once(work: PassWork, records: dict[str, list[SourceRecord]]) -> tuple[float, list[PartitionResult]]:
    """CPU seconds of one ``PartitionRun`` fed the partition's records (merged, in one chunk)."""
    merged = pa.Table.from_batches(task_input(work, records))
    columns = [merged.column(n).to_pylist() for n in ("rank", "key", "value", "timestamp", "partition")]
    rows = list(zip(*columns, strict=True))
    readers = Readers(work)
    t = time.process_time()
    run = PartitionRun(work, 0, readers)
    run.feed(rows)
    results = list(run.finish())
    seconds = time.process_time() - t
    readers.close()
    return seconds, results


def task_input(work: PassWork, records: dict[str, list[SourceRecord]]) -> list[pa.RecordBatch]:
    """The partition's records as a Spark task gets them (``job.RECORDS_SCHEMA`` in merge order,
    ``job.merged_here``), in batches of Spark's default ``maxRecordsPerBatch`` (10,000)."""
    rows: dict[str, list[Any]] = {n: [] for n in RECORDS_SCHEMA.names}
    for i, (name, _) in enumerate(work.inputs):
        for position, r in enumerate(records[name]):
            for column, item in (("task", 0), ("input", i), ("key", r.key), ("value", r.value),
                                 ("timestamp", r.timestamp), ("partition", r.partition), ("o1", 1), ("o2", 1),
                                 ("o3", position), ("o4", "")):
                rows[column].append(item)
    names = [name for name, _ in work.inputs]
    return merged_here(pa.table(rows, schema=RECORDS_SCHEMA), work, names).to_batches(max_chunksize=10_000)


def run_task(work: PassWork, batches: list[pa.RecordBatch]) -> float:
    """CPU seconds of ``job.partition_runner`` over the batches: Arrow records in, result rows out."""
    t = time.process_time()
    for _ in partition_runner(work)(iter(batches)):
        pass
    return time.process_time() - t


def run_pass(work: PassWork, records: dict[str, list[SourceRecord]], partitions: int) -> float:
    """CPU seconds of the whole pass in ``partitions`` partitions (``job.process_here``)."""
    rows: dict[str, list[Any]] = {n: [] for n in RECORDS_SCHEMA.names}
    for i, (name, _) in enumerate(work.inputs):
        for position, r in enumerate(records[name]):
            part = default_partition_of(r.key, partitions, MURMUR2) if partitions > 1 else 0
            for column, item in (("task", part), ("input", i), ("key", r.key), ("value", r.value),
                                 ("timestamp", r.timestamp), ("partition", part), ("o1", 1), ("o2", 1),
                                 ("o3", position), ("o4", "")):
                rows[column].append(item)
    table = pa.table(rows, schema=RECORDS_SCHEMA)
    t = time.process_time()
    process_here(replace(work, partitions=partitions), table, MURMUR2)
    return time.process_time() - t


def digest(results: list[PartitionResult]) -> str:
    h = hashlib.sha256()
    for result in results:
        for name, outcome in sorted(result.tables.items()):
            late = None if outcome.late is None else outcome.late.drop_columns(["ingested_at"])
            for table in (outcome.rows, outcome.emitted, late, outcome.subscriptions):
                if table is not None:
                    h.update(json.dumps(table.to_pylist(), sort_keys=True, default=str).encode())
            h.update(json.dumps([name, outcome.stats], sort_keys=True).encode())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--operators", default=",".join(bench.OPERATORS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--digest", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", default="", help="write the figures to this file")
    ap.add_argument("--partitions", type=int, default=1, help="also time the whole pass in 1 and N partitions")
    args = ap.parse_args()
    data = sources(args.records)
    out: dict[str, Any] = {"records": args.records, "load_start": loadavg(), "operators": {}}
    for op in args.operators.split(","):
        work, _ = work_of(op)
        inputs = {n: data[n] for n, _ in work.inputs}
        count = sum(len(r) for r in inputs.values())
        times = []
        result = None
        for _ in range(args.repeat):
            seconds, result = run_once(work, inputs)
            times.append(seconds)
        assert result is not None
        best = min(times)
        batches = task_input(work, inputs)
        task_times = [run_task(work, batches) for _ in range(args.repeat)]
        task_best = min(task_times)
        entry: dict[str, Any] = {"input_records": count, "seconds": [round(t, 3) for t in times],
                                 "records_per_s": round(count / best),
                                 "task_seconds": [round(t, 3) for t in task_times],
                                 "task_records_per_s": round(count / task_best)}
        line = (f"{op:12s} {count:>9,} records  PartitionRun {best:7.3f} cpu s {count / best:>9,.0f} rec/s"
                f"  task {task_best:7.3f} cpu s {count / task_best:>9,.0f} rec/s")
        if args.digest:
            entry["digest"] = digest(result)
            line += f"  digest {entry['digest']}"
        print(line, flush=True)
        if args.partitions > 1:
            one = min(run_pass(work, inputs, 1) for _ in range(args.repeat))
            many = min(run_pass(work, inputs, args.partitions) for _ in range(args.repeat))
            entry["pass_cpu_s"] = {"1": round(one, 3), str(args.partitions): round(many, 3)}
            print(f"{'':12s} whole pass: 1 partition {one:7.3f} cpu s, {args.partitions} partitions {many:7.3f} cpu s "
                  f"({many / one:.2f}x the CPU, shared by up to {args.partitions} cores)", flush=True)
        if args.profile:
            prof = cProfile.Profile(time.process_time)
            prof.enable()
            for _ in partition_runner(work)(iter(batches)):
                pass
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.top)
            print(s.getvalue(), flush=True)
        out["operators"][op] = entry
    out["load_end"] = loadavg()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=2)
            handle.write("\n")


if __name__ == "__main__":
    main()
