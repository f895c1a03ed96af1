"""``make bench``: the ingest benchmark, the query benchmark, the derived-tables benchmark, the
Kafka benchmark, the S3 warehouse benchmark, the CLI benchmark, then the freshness benchmark
(results in bench/results/).

Arguments after ``--`` are not parsed; use the environment instead:
``BENCH_BIG=1`` adds the 10M-event ingest scale, ``BENCH_QUERY_KEYS`` sets the query store's
keys (default 1,000,000; e.g. 200000 on a busy machine), ``BENCH_DERIVED_RECORDS`` the derived
benchmark's input records (default 1,000,000, about 10 minutes on two cores), ``BENCH_KAFKA_KEYS``
the Kafka benchmark's changelog keys (x 10 records; default 1,000,000, about 12 minutes),
``BENCH_S3_EVENTS`` the S3 benchmark's ingest events (default 1,000,000) and ``BENCH_S3_VERSIONS``
its cold-start store sizes (default 1000000,10000000; e.g. 1000000 on a busy machine).
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    ingest = [sys.executable, os.path.join(HERE, "ingest_bench.py"), "--profile"]
    if os.environ.get("BENCH_BIG"):
        ingest.append("--big")
    query = [sys.executable, os.path.join(HERE, "query_bench.py"),
             "--keys", os.environ.get("BENCH_QUERY_KEYS", "1000000")]
    derived = [sys.executable, os.path.join(HERE, "derived_bench.py"),
               "--records", os.environ.get("BENCH_DERIVED_RECORDS", "1000000")]
    kafka = [sys.executable, os.path.join(HERE, "kafka_bench.py"),
             "--keys", os.environ.get("BENCH_KAFKA_KEYS", "1000000")]
    s3 = [sys.executable, os.path.join(HERE, "s3_bench.py"),
          "--events", os.environ.get("BENCH_S3_EVENTS", "1000000"),
          "--versions", os.environ.get("BENCH_S3_VERSIONS", "1000000,10000000")]
    cli = [sys.executable, os.path.join(HERE, "cli_bench.py")]
    freshness = [sys.executable, os.path.join(HERE, "freshness_bench.py")]
    for cmd in (ingest, query, derived, kafka, s3, cli, freshness):
        print("+", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
