"""Fast, vectorised (numpy + pyarrow) changelog generator for the benchmarks.

A changelog of ``keys x versions`` events in processing order, deterministic for a seed:

- every key gets exactly ``versions`` events; keys are shuffled over processing order;
- the base timestamp grows with the processing position (``START_MS + i * step_ms``, the whole
  changelog spans 30 days of event time), so records are in order unless perturbed;
- 10% **out of order**: timestamp moved back by up to half the grace period (accepted, rule 4);
- 0.1% **late**: timestamp moved back by more than the grace period (rejected ``late``);
- 1% **tombstones** (``value`` null).

Files are contiguous slices of processing order named ``part-00000.<ext>`` ... so that their
sort order is the processing order. JSONL lines are
``{"key":"k0000042","value":{"v":123,"price":45.67},"timestamp":1709251200000}``; Parquet has
columns ``key`` (string), ``value`` (JSON text, null = tombstone), ``timestamp`` (int64 ms).

``--batch N --after-events E`` writes an *incremental* batch of N events that continues a
changelog of E events (same time step, random existing keys).

    python bench/gen_changelog.py --keys 100000 --versions 10 --out /tmp/cl --format both
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

START_MS = 1_709_251_200_000  # 2024-03-01T00:00:00Z
SPAN_MS = 30 * 86_400_000
GRACE_MS = 7 * 86_400_000  # history retention (= grace period) of the benchmark stores
OUT_OF_ORDER = 0.10
TOMBSTONES = 0.01
LATE = 0.001
KEY_WIDTH = 7


def step_ms_for(total_events: int) -> int:
    return max(1, SPAN_MS // max(1, total_events))


def make_events(keys: int, versions: int, seed: int, *, batch: int | None = None,
                after_events: int = 0) -> pa.Table:
    """The events as an Arrow table in processing order (plus an ``is_late`` helper column)."""
    rng = np.random.default_rng(seed + 7919 * after_events)
    if batch is None:
        n = keys * versions
        key_ids = np.repeat(np.arange(keys, dtype=np.int64), versions)
        rng.shuffle(key_ids)
        step = step_ms_for(n)
    else:
        n = batch
        key_ids = rng.integers(0, keys, size=n, dtype=np.int64)
        step = step_ms_for(keys * versions)  # the time step of the changelog it continues
    return _events(key_ids, np.arange(after_events, after_events + n, dtype=np.int64), step, rng)


def _events(key_ids: np.ndarray, pos: np.ndarray, step: int, rng: np.random.Generator) -> pa.Table:
    """Events for ``key_ids`` at processing positions ``pos``: timestamps ``START_MS + pos *
    step``, with the out-of-order, late and tombstone shares drawn from ``rng``."""
    n = len(key_ids)
    ts = START_MS + pos * step
    u = rng.random(n)
    late = u < LATE
    ooo = (u >= LATE) & (u < LATE + OUT_OF_ORDER)
    ts[ooo] -= rng.integers(1, GRACE_MS // 2, size=int(ooo.sum()), dtype=np.int64)
    ts[late] -= GRACE_MS + rng.integers(60_000, 86_400_000, size=int(late.sum()), dtype=np.int64)
    tomb = rng.random(n) < TOMBSTONES

    key_arr = pc.binary_join_element_wise(
        "k", pc.utf8_lpad(pc.cast(pa.array(key_ids), pa.string()), KEY_WIDTH, "0"), "")
    v = rng.integers(0, 1_000_000, size=n)
    cents = rng.integers(100, 100_000, size=n)
    price = pc.binary_join_element_wise(
        pc.cast(pa.array(cents // 100), pa.string()), ".",
        pc.utf8_lpad(pc.cast(pa.array(cents % 100), pa.string()), 2, "0"), "")
    value = pc.binary_join_element_wise(
        '{"v":', pc.cast(pa.array(v), pa.string()), ',"price":', price, "}", "")
    value = pc.if_else(pa.array(tomb), pa.nulls(n, pa.string()), value)
    return pa.table({"key": key_arr, "value": value, "timestamp": pa.array(ts),
                     "is_late": pa.array(late)})


def write_jsonl_in_slices(keys: int, versions: int, seed: int, folder: str, files: int) -> int:
    """``make_events`` then ``write_changelog`` (JSONL) for changelogs too big for one Arrow
    table (100M events): the keys are shuffled once, then each file's slice is made and written
    alone. Same distribution as ``make_events``, not the same draws. Returns the late count."""
    rng = np.random.default_rng(seed)
    n = keys * versions
    key_ids = np.repeat(np.arange(keys, dtype=np.int32), versions)
    rng.shuffle(key_ids)
    bounds = np.linspace(0, n, files + 1).astype(np.int64)
    os.makedirs(folder, exist_ok=True)
    late = 0
    for i in range(files):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        part = _events(key_ids[lo:hi].astype(np.int64), np.arange(lo, hi, dtype=np.int64), step_ms_for(n), rng)
        late += int(pc.sum(part["is_late"]).as_py() or 0)
        with open(os.path.join(folder, f"part-{i:05d}.jsonl"), "wb") as fh:
            fh.write(_jsonl_bytes(part.drop_columns(["is_late"])))
    return late


def _jsonl_bytes(tbl: pa.Table) -> bytes:
    value = pc.fill_null(tbl["value"], "null")
    lines = pc.binary_join_element_wise(
        '{"key":"', tbl["key"], '","value":', value, ',"timestamp":',
        pc.cast(tbl["timestamp"], pa.string()), "}\n", "")
    arr = pa.concat_arrays(lines.chunks) if isinstance(lines, pa.ChunkedArray) else lines
    arr = arr.cast(pa.large_string())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    return arr.buffers()[2].to_pybytes()[offsets[0]: offsets[-1]]


def write_changelog(tbl: pa.Table, out: str, fmt: str, files: int, prefix: str = "part") -> list[str]:
    """Split ``tbl`` into ``files`` contiguous slices and write them under ``out/<fmt>/``."""
    formats = ("jsonl", "parquet") if fmt == "both" else (fmt,)
    data = tbl.drop_columns(["is_late"])
    n = data.num_rows
    bounds = np.linspace(0, n, files + 1).astype(np.int64)
    written = []
    for f in formats:
        folder = os.path.join(out, f)
        os.makedirs(folder, exist_ok=True)
        for i in range(files):
            part = data.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i]))
            path = os.path.join(folder, f"{prefix}-{i:05d}.{f}")
            if f == "parquet":
                pq.write_table(part, path, row_group_size=128 * 1024)
            else:
                with open(path, "wb") as fh:
                    fh.write(_jsonl_bytes(part))
            written.append(path)
    return written


def summary(tbl: pa.Table) -> dict[str, int]:
    return {
        "events": tbl.num_rows,
        "tombstones": tbl["value"].null_count,
        "late": int(pc.sum(tbl["is_late"]).as_py() or 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--versions", type=int, default=10)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", required=True)
    ap.add_argument("--format", choices=("jsonl", "parquet", "both"), default="both")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--batch", type=int, help="write an incremental batch of this many events")
    ap.add_argument("--after-events", type=int, default=0,
                    help="with --batch: size of the changelog the batch continues")
    args = ap.parse_args()
    t0 = time.perf_counter()
    tbl = make_events(args.keys, args.versions, args.seed, batch=args.batch, after_events=args.after_events)
    t1 = time.perf_counter()
    write_changelog(tbl, args.out, args.format, args.files,
                    prefix="part" if args.batch is None else f"batch-{args.after_events}")
    t2 = time.perf_counter()
    print(json.dumps({**summary(tbl), "generate_s": round(t1 - t0, 2), "write_s": round(t2 - t1, 2)}))


if __name__ == "__main__":
    main()
