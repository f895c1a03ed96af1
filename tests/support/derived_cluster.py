"""Derived tables on a Spark standalone cluster (``check_on_cluster``, called by the cluster test
of tests/ingest/test_ingest_cli.py, which starts the master and the worker): a pass runs as
Spark tasks on the worker's executor, one per partition of a topology over 2-partition stores
(the foreign-key join's tasks each reading the customers whole), and the tables equal those of
the same pipeline run in this process. No tests here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec, run_partitioned, run_repartitioned
from versiq.layout import MURMUR2, default_partition_of

INPUTS = [InputDef("orders", "versioned", history_retention_ms=50, partitions=2),
          InputDef("shipments", "versioned", partitions=2),
          InputDef("customers", "versioned", partitions=2)]
TABLES: list[dict[str, Any]] = [
    {"name": "big", "from": "orders", "filter": "value.n > 3", "history_retention_ms": 20},
    {"name": "shipped", "join": {"left": "orders", "right": "shipments", "type": "left"}},
    {"name": "with_customer", "fk_join": {"left": "orders", "right": "customers", "foreign_key": "value.c",
                                          "type": "inner"}},
    {"name": "by_customer", "from": "orders", "group_by": "value.c", "aggregate": {"count": True, "sum": "value.n"}},
    {"name": "busy", "from": "by_customer", "filter": "value.count > 9"},
]


def _runs() -> list[dict[str, list[Rec]]]:
    def rec(key: str, n: int, ts: int, **extra: Any) -> Rec:
        return Rec(key, json.dumps({"n": n, **extra}, separators=(",", ":")), ts, hash_free_partition(key))

    orders = [rec(f"o{i}", i % 7, 10 * i + (100 if i % 2 else 0), c=f"c{i % 3}") for i in range(30)]
    return [{"orders": orders, "shipments": [rec(f"o{i}", i, 200) for i in range(0, 30, 4)],
             "customers": [*(rec(f"c{i}", i, 1) for i in range(3)), rec("c1", 10, 250)]}]


def hash_free_partition(key: str) -> int:
    """An explicit partition per key (the same in every store, so the stores are co-partitioned)."""
    return int(key[1:]) % 2


def check_on_cluster(spark: Any, root: Any, master: str, env: dict[str, str],
                     stores: list[dict[str, Any]] | None = None) -> None:
    """Run the pipeline through the CLI on ``master`` (every pass in Spark tasks); the derived
    tables and their emissions must be the reference model's: once per partition for the
    filter, the join and the foreign-key join (each partition reading the right store whole),
    through a repartition for the group-by (its groups' updates shuffled between the tasks).
    ``stores``: entries
    of more stores the same runs ingest (one driver and executor start for everything the
    caller checks on the cluster)."""
    runs = _runs()
    cluster = RealPipeline(spark, str(root / "cluster"))
    cluster.add("", INPUTS, TABLES, runs)
    cluster.pipeline()  # makes the source folders
    config = root / "pipeline.json"
    for step in range(cluster.steps()):
        cluster.write_step(step)
        pipeline = _pipeline_file(cluster)
        pipeline["stores"] += stores or []
        config.write_text(json.dumps(pipeline))
        result = subprocess.run(
            [sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", cluster.warehouse, "--config",
             str(config), "--master", master],
            capture_output=True, text=True, timeout=300, env={**env, "VERSIQ_DERIVE_HERE_RECORDS": "0"},
            stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "in Spark tasks" in result.stderr, result.stderr[-3000:]
    per_partition = run_partitioned(INPUTS, TABLES[:3], runs, 2, lambda key: 0)
    regrouped = run_repartitioned(INPUTS, TABLES[3:], runs, 2, lambda key: 0,
                                  lambda group: default_partition_of(group, 2, MURMUR2))
    for table in TABLES:
        name = table["name"]
        want = {**per_partition, **regrouped}[name]
        got = cluster.observed("", name)
        assert got.emissions == [(e.key, e.value, e.timestamp, e.cause) for e in want.emissions], name
        assert got.versions == want.versions, name


def _pipeline_file(real: RealPipeline) -> dict[str, Any]:
    stores = [{"name": spec.name, "source": os.path.join(real.root, "sources", spec.name),
               "history_retention": f"{spec.history_retention_ms}ms", "partitions": spec.partitions}
              for _, spec in real.inputs]
    tables = []
    for _, table in real.tables:
        entry = dict(table)
        if "history_retention_ms" in entry:
            entry["history_retention"] = f"{entry.pop('history_retention_ms')}ms"
        tables.append(entry)
    return {"stores": stores, "tables": tables}
