"""Derived tables on a Spark standalone cluster (master and one worker from the PySpark
installation, on 127.0.0.1): a pass runs as Spark tasks on the worker's executor, one per
partition of a topology over 2-partition stores, one task for a foreign-key join, and the
tables equal those of the same pipeline run in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.support.derived import RealPipeline
from tests.support.derived_reference import InputDef, Rec
from tests.support.ingest import store_versions
from tests.support.server_process import free_ports

INPUTS = [InputDef("orders", "versioned", history_retention_ms=50, partitions=2),
          InputDef("shipments", "versioned", partitions=2),
          InputDef("customers", "versioned", partitions=2)]
TABLES: list[dict[str, Any]] = [
    {"name": "big", "from": "orders", "filter": "value.n > 3", "history_retention_ms": 20},
    {"name": "shipped", "join": {"left": "orders", "right": "shipments", "type": "left"}},
    {"name": "with_customer", "fk_join": {"left": "orders", "right": "customers", "foreign_key": "value.c",
                                          "type": "inner"}},
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


def test_derived_tables_run_as_tasks_on_a_standalone_cluster(spark: Any, tmp_path: Any) -> None:
    import pyspark

    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    port = free_ports(1)[0]
    e = dict(os.environ, PYSPARK_PYTHON=sys.executable, VERSIQ_SHUFFLE_PARTITIONS="2", SPARK_LOCAL_IP="127.0.0.1",
             VERSIQ_DERIVE_HERE_RECORDS="0")
    e.pop("SPARK_MASTER", None)
    logs = open(tmp_path / "cluster.log", "w")  # noqa: SIM115
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(free_ports(1)[0])],
                              env=e, stdout=logs, stderr=logs)
    worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker",
                               f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--cores", "2",
                               "--memory", "2g", "--webui-port", str(free_ports(1)[0]),
                               "--work-dir", str(tmp_path / "work")],
                              env=e, stdout=logs, stderr=logs)
    try:
        runs = _runs()
        here = RealPipeline(spark, str(tmp_path / "here"))
        here.add("", INPUTS, TABLES, runs)
        here.run_all()  # this process's session, passes in this process (small)
        cluster = RealPipeline(spark, str(tmp_path / "cluster"))
        cluster.add("", INPUTS, TABLES, runs)
        cluster.pipeline()  # makes the source folders
        config = tmp_path / "pipeline.json"
        for step in range(cluster.steps()):
            cluster.write_step(step)
            config.write_text(json.dumps(_pipeline_file(cluster)))
            result = subprocess.run(
                [sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", cluster.warehouse, "--config",
                 str(config), "--master", f"spark://127.0.0.1:{port}"],
                capture_output=True, text=True, timeout=300, env=e, stdin=subprocess.DEVNULL)
            assert result.returncode == 0, result.stderr[-3000:]
            assert "in Spark tasks" in result.stderr, result.stderr[-3000:]
        for table in TABLES:
            name = table["name"]
            assert store_versions(os.path.join(cluster.warehouse, name)) == \
                store_versions(os.path.join(here.warehouse, name)), name
            got, want = cluster.observed("", name), here.observed("", name)
            assert got.emissions == want.emissions, name
        assert any(os.scandir(tmp_path / "work")), "no executor ran on the worker"
    finally:
        for proc in (worker, master):
            proc.terminate()
        for proc in (worker, master):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        logs.close()


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
