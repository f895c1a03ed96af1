"""The SparkSession ingest runs on: ``local[*]`` by default, any master by URL.

Executors must import this project (parsing and Parquet writing run there). In local mode and
on a standalone cluster started from the same installation they share the driver's Python
environment (``PYSPARK_PYTHON`` is set to it); on other clusters the project's packages are
shipped with ``addPyFile`` and Arrow/delta-rs must be installed on the workers.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile

from pyspark.sql import SparkSession

import versiq

DEFAULT_MASTER = "local[*]"


def master_url(master: str | None = None) -> str:
    return master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER


def get_spark(master: str | None = None, app_name: str = "versiq-ingest") -> SparkSession:
    """Create (or reuse) the session. Shuffle partitions are kept small: 2-core machines."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    url = master_url(master)
    builder = (
        SparkSession.builder.master(url)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", os.environ.get("VERSIQ_SHUFFLE_PARTITIONS", "8"))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", os.environ.get("VERSIQ_DRIVER_MEMORY", "4g"))
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
        .config("spark.python.worker.reuse", "true")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not url.startswith("local"):
        _ship_project(spark)
    return spark


def _ship_project(spark: SparkSession) -> None:
    """Zip the ``versiq`` package (following its links to ingest/, query/, service/, cli/) and add
    it to every executor's path."""
    target = os.path.join(tempfile.mkdtemp(prefix="versiq-pyfiles-"), "versiq.zip")
    root = os.path.dirname(versiq.__file__ or "")
    base = os.path.dirname(root)
    with zipfile.ZipFile(target, "w") as archive:
        for folder, _dirs, files in os.walk(root, followlinks=True):
            for name in files:
                if name.endswith(".py"):
                    full = os.path.join(folder, name)
                    archive.write(full, os.path.relpath(full, base))
    spark.sparkContext.addPyFile(target)
