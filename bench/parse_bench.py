"""Cost of the ingest parser alone (no Spark): CPU µs per record (best of 5 runs) for one JSONL
and one Parquet file of a changelog written by ``bench/gen_changelog.py``, plus the top
functions by own time.

    .venv/bin/python bench/parse_bench.py /tmp/versiq-bench/changelog-1000000
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from versiq.ingest.records import parse_file  # noqa: E402


def run(path: str, fmt: str) -> tuple[int, float]:
    t0 = time.process_time()
    n = 0
    for batch in parse_file(path, os.path.basename(path), fmt):
        n += batch.num_rows
    return n, time.process_time() - t0


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else "/tmp/versiq-bench/changelog-1000000"
    for fmt in ("jsonl", "parquet"):
        path = os.path.join(root, fmt, f"part-00000.{fmt}")
        n, cpu = min((run(path, fmt) for _ in range(5)), key=lambda r: r[1])  # best of 5
        print(f"{fmt}: {n:,} records, {cpu:.2f} CPU s, {cpu / n * 1e6:.1f} µs/record "
              f"= {n / cpu:,.0f} records per CPU-second")
        prof = cProfile.Profile()
        prof.enable()
        run(path, fmt)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(8)
        print(out.getvalue().split("\n\n", 1)[-1])


if __name__ == "__main__":
    main()
