"""Runs that exercise what a real ingest run does, in a session that is to run more: the
resident driver's warm-up before it serves (``ingest.driver``) and the recipe of the driver
JVM's class-data-sharing archive (``class_archive``), so both load and compile the
same paths: Delta's commit, Parquet's writer, the Python workers' Arrow exchange, the side
tables, interpreted and generated expressions."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from versiq import settings


def warm_up(spark: Any) -> None:
    """Three runs into a scratch warehouse that load and compile what a real run does: a new
    store with a changelog and a rejected line (a small run: interpreted expressions), a run
    into stored keys with a tombstone, both parsed and decided in this process as runs of local
    files up to ``plan.PARSE_HERE_BYTES`` are, and one parsed by Spark tasks and decided by
    Spark through generated code (as larger runs and Kafka's are).
    ``VERSIQ_INTERPRETED_RUN_BYTES`` and ``VERSIQ_PARSE_HERE_BYTES`` are as they were afterwards."""
    from versiq.ingest.pipeline import StoreSpec, run_ingest

    def write(path: str, records: list[dict[str, Any]], extra: str = "") -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)
            f.write(extra)

    with tempfile.TemporaryDirectory(prefix="versiq-driver-warm-up-") as folder:
        source, warehouse = os.path.join(folder, "src"), os.path.join(folder, "wh")
        os.mkdir(source)
        spec = StoreSpec("warm_up", source, changelog=True, max_future_ms=None)
        runs = [([{"key": f"k{i % 50}", "value": {"n": i}, "timestamp": 1000 + i} for i in range(500)],
                 "no json\n"),
                ([{"key": f"k{i % 70}", "value": i, "timestamp": 1200 + i} for i in range(300)]
                 + [{"key": "k1", "value": None, "timestamp": 5000}], ""),
                ([{"key": f"k{i % 90}", "value": i, "timestamp": 900 + i * 7} for i in range(300)], "")]
        # the last run: parsed by Spark tasks, decided by Spark with generated code
        large: dict[settings.Setting[Any], str] = {settings.INTERPRETED_RUN_BYTES: "0", settings.PARSE_HERE_BYTES: "0"}
        for n, (records, extra) in enumerate(runs):
            write(os.path.join(source, f"{n}.jsonl"), records, extra)
            with settings.overridden(large if n == len(runs) - 1 else {}):
                report = run_ingest(spark, warehouse, [spec])
            if report.failed:
                raise RuntimeError(f"the driver's warm-up run failed: {report.to_json()}")
