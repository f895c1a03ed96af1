"""The SparkSession ingest runs on: ``local[*]`` by default, any master by URL, with Delta's own
Spark connector (delta-spark) loaded: every Delta table the job writes goes through it
(``versiq.ingest.delta``).

Delta's jars (and Spark's Kafka source, ``ingest.kafka``). The project's setup (``make``) fetches
them with Maven from ``jars/pom.xml`` into
``.cache/jars`` (git-ignored); ``VERSIQ_SPARK_JARS`` names another folder (the container image
sets one). The jars of that folder are handed to Spark (``spark.jars``, shipped to executors by
Spark itself). Without such a folder (versiq installed from a wheel) Spark resolves the same
coordinates from Maven Central with its own package resolution (``spark.jars.packages``, the
way ``delta.configure_spark_with_delta_pip`` does), cached under ``~/.ivy2``.

Executors must import this project (parsing runs there). In local mode and on a standalone
cluster started from the same installation they share the driver's Python environment
(``PYSPARK_PYTHON`` is set to it); on other clusters the project's packages are shipped with
``addPyFile`` and Arrow must be installed on the workers.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import sys
import tempfile
import zipfile

import pyspark
from pyspark.sql import SparkSession

import versiq

DEFAULT_MASTER = "local[*]"
#: The environment variable naming a folder of Delta's jars (else ``.cache/jars`` of the checkout).
JARS_DIR_ENV = "VERSIQ_SPARK_JARS"


def master_url(master: str | None = None) -> str:
    return master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER


def spark_coordinates() -> list[str]:
    """The Maven coordinates of Delta's connector for the installed PySpark and delta-spark, and
    of Spark's Kafka source (its own dependencies come with it through Spark's resolution)."""
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta = importlib.metadata.version("delta-spark")
    return [f"io.delta:delta-spark_{spark_minor}_2.13:{delta}", f"io.delta:delta-storage:{delta}",
            f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"]


def jars_dir() -> str | None:
    """The folder of fetched jars: ``VERSIQ_SPARK_JARS``, else ``.cache/jars`` of the checkout
    this package runs from; None when neither holds Delta's connector."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(versiq.__file__ or "")))
    for folder in (os.environ.get(JARS_DIR_ENV), os.path.join(root, ".cache", "jars")):
        if folder and glob.glob(os.path.join(folder, "delta-spark_*.jar")):
            return folder
    return None


def _with_delta(builder: SparkSession.Builder) -> SparkSession.Builder:
    folder = jars_dir()
    if folder is not None:
        builder = builder.config("spark.jars", ",".join(sorted(glob.glob(os.path.join(folder, "*.jar")))))
    else:
        builder = builder.config("spark.jars.packages", ",".join(spark_coordinates()))
    return (
        builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        # A snapshot's state is small (one row per file): Delta's default of 50 tasks to
        # rebuild it costs seconds on two cores for nothing.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        # The .crc file Delta writes beside each commit only speeds up Delta's own snapshot
        # checks (delta-rs does not read it); computing it costs about a third of a small commit.
        .config("spark.databricks.delta.writeChecksumFile.enabled", "false")
        # VACUUM lists a table's directories with this many tasks (Spark's default: 10,000).
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "4")
        # versiq keeps removed files for its own (short) retention (versiq.ingest.maintain).
        .config("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        .config("spark.sql.parquet.compression.codec", "zstd")
        # Small row groups: a point read of one key in an older snapshot reads little.
        .config("spark.hadoop.parquet.block.size", str(1 << 20))
    )


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
    spark = _with_delta(builder).getOrCreate()
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
