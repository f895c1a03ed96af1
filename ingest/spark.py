"""The SparkSession ingest runs on: ``local[*]`` by default, any master by URL, with Delta's own
Spark connector (delta-spark) loaded: every Delta table the job writes goes through it
(``versiq.ingest.delta``).

Delta's jars (and Spark's Kafka source, ``ingest.kafka``). The project's setup (``make``) fetches
them with Maven from ``jars/pom.xml`` into ``.cache/jars`` (git-ignored); ``VERSIQ_SPARK_JARS``
names another folder (the container image sets one). In a local session (whose tasks run in the
driver JVM) the jars of that folder go on the driver JVM's class path
(``spark.driver.extraClassPath``), where the class-data-sharing archive maps their classes
(handed to Spark as ``spark.jars``, each session would copy them, 31 MB, into a temporary folder
and load them with a class loader of their own). Sessions on a cluster get them as
``spark.jars``, which Spark ships to the executors. Without such a folder (versiq installed from
a wheel) Spark resolves the same coordinates from Maven Central with its own package resolution
(``spark.jars.packages``, the way ``delta.configure_spark_with_delta_pip`` does), cached under
``~/.ivy2``.

Executors must import this project (parsing runs there). In local mode and on a standalone
cluster started from the same installation they share the driver's Python environment
(``PYSPARK_PYTHON`` is set to it); on other clusters the project's packages are shipped with
``addPyFile`` and Arrow must be installed on the workers.

S3 (``s3://`` and ``s3a://`` paths). When the jars folder holds Hadoop's S3A connector
and versiq's LogStore (``jars/s3/pom.xml``, ``jars/logstore``), the session maps both schemes to
``S3AFileSystem`` and registers ``dev.versiq.delta.ConditionalS3LogStore`` as Delta's LogStore for
them (``spark.delta.logStore.s3a.impl``/``s3.impl``). Why a LogStore of versiq's own: Delta's default
for S3, ``S3SingleDriverLogStore``, makes a commit atomic only inside one JVM (it checks that
``_delta_log/N.json`` is absent, then writes it unconditionally), so two writers on two machines
can both commit version N and one overwrites the other; the released delta-storage 4.4.0 has no
conditional-put store (only the DynamoDB one). versiq's class creates the commit file with S3's
conditional create (``If-None-Match: *``), so exactly one writer wins each version and the loser
gets the ``FileAlreadyExistsException`` Delta retries on (docs/research/s3-warehouse.md).
``fs.s3a.performance.flags=create`` must never be set: it makes S3A's ``create(path, false)``
overwrite silently.

The endpoint and region come from the standard AWS variables (``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``; an explicit endpoint, i.e. an
S3-compatible server, gets path-style requests, and an ``http://`` one has TLS off), the
credentials from the AWS SDK's default provider chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
in the JVM's environment, profiles, instance roles): nothing secret is written in code or put into
Spark's configuration. ``configure_s3`` applies the variables to a running session's Hadoop
configuration; ``get_spark`` calls it, and so can anyone whose variables changed after the session
was created (a test's S3 server). Only then, because a JVM cannot see variables set after it
started, does it copy the keys into that Hadoop configuration (never into SparkConf, which Spark
shows).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fnmatch
import glob
import importlib.metadata
import logging
import os
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pandas as pd
import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

from versiq import settings as registry
from versiq.ingest.class_archive import class_archive_option
from versiq.ingest.sqltext import MURMUR2_MOD_FUNCTION
from versiq.package import JARS_DIR_ENV as JARS_DIR_ENV  # the jars' folder: beside the package's files
from versiq.package import jar_files, package_files, package_root
from versiq.package import jars_dir as jars_dir

DEFAULT_MASTER = "local[*]"
#: Hadoop's S3 file system (hadoop-aws), for both ``s3a://`` and ``s3://``.
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
#: versiq's Delta LogStore for S3: commits with a conditional put (jars/logstore).
S3_LOGSTORE = "dev.versiq.delta.ConditionalS3LogStore"
#: The jar of versiq's own classes (jars/logstore), built by the project's setup into the jars folder.
VERSIQ_JAR = "versiq-delta-logstore-*.jar"
#: Hadoop's local file system with permissions set in the JVM rather than by a ``chmod`` process
#: per file created (jars/logstore; ``_with_jars``).
LOCAL_FILESYSTEM = "dev.versiq.fs.LocalFileSystem"
#: The same for Hadoop's ``FileContext``, through which Delta writes and renames its log files.
LOCAL_FILE_CONTEXT = "dev.versiq.fs.LocalFs"
#: What to do when the S3 jars are missing.
FETCH_HINT_S3 = ("run `make .cache/jars/.fetched` (make test and make demo do it) to fetch Hadoop's S3A jars "
                 "(jars/s3/pom.xml) and build versiq's S3 LogStore (jars/logstore)")
#: The credentials ``configure_s3`` copies into the Hadoop configuration only when the JVM's own
#: environment lacks them (S3A's provider chain reads ``fs.s3a.*`` first, then the environment).
#: The variables S3 clients read (``versiq.storage``), handed to Spark's Python workers by ``configure_s3``.
_AWS_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP",
                  "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_S3A_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "fs.s3a.access.key", "AWS_SECRET_ACCESS_KEY": "fs.s3a.secret.key",
                    "AWS_SESSION_TOKEN": "fs.s3a.session.token"}
#: S3A's retries and timeouts. Hadoop 3.5's defaults (5 SDK retries of a request inside up to 7
#: S3A retries, sleeping from 500 ms up, a 200 s socket timeout) kept a run whose S3 server died
#: during its commit retrying for minutes after its lease was lost. With these a request is sent
#: at most (1 + 1) x (1 + 2) = 6 times, about 2 s of sleeps in all: an operation on an endpoint that
#: refuses connections fails in seconds, one on an endpoint that accepts and never answers in
#: at most 6 x 15 s. A run's whole stop is bounded by its lease too (``ingest.store.writer_lock``).
#: Large uploads keep S3A's own ``fs.s3a.connection.part.upload.timeout``: the socket timeout
#: still ends one whose server stopped answering. docs/contract.md, "Warehouses on S3".
S3A_BOUNDS = {
    "fs.s3a.attempts.maximum": "1",  # the AWS SDK's retries of one request
    "fs.s3a.retry.limit": "2",  # S3A's retries of an operation whose requests failed
    "fs.s3a.retry.interval": "500ms",
    "fs.s3a.retry.throttle.limit": "3",
    "fs.s3a.retry.throttle.interval": "500ms",
    "fs.s3a.connection.establish.timeout": "5s",
    "fs.s3a.connection.timeout": "15s",  # a read that receives nothing for this long fails
    "fs.s3a.connection.request.timeout": "15s",
    "fs.s3a.connection.acquisition.timeout": "15s",
}




def master_url(master: str | None = None) -> str:
    return master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER


def spark_coordinates() -> list[str]:
    """The Maven coordinates of Delta's connector for the installed PySpark and delta-spark, and
    of Spark's Kafka source (its own dependencies come with it through Spark's resolution)."""
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta = importlib.metadata.version("delta-spark")
    return [f"io.delta:delta-spark_{spark_minor}_2.13:{delta}", f"io.delta:delta-storage:{delta}",
            f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"]


def s3_jars_present(folder: str | None = None) -> bool:
    """Whether ``folder`` (default: ``jars_dir()``) holds S3A (hadoop-aws) and versiq's LogStore."""
    where = folder if folder is not None else jars_dir()
    return where is not None and all(glob.glob(os.path.join(where, pattern))
                                     for pattern in ("hadoop-aws-*.jar", VERSIQ_JAR))


def s3_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Hadoop settings (no secrets) for S3: ``S3A_BOUNDS``, and from the standard AWS
    variables of ``environ`` (default: this process's environment) the endpoint with path-style
    requests (and TLS off for ``http://``) when one is given, the region when one is given."""
    env = os.environ if environ is None else environ
    settings: dict[str, str] = dict(S3A_BOUNDS)
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        settings["fs.s3a.endpoint"] = endpoint
        # S3-compatible servers (and 127.0.0.1) serve /bucket/key, not bucket.host/key.
        settings["fs.s3a.path.style.access"] = "true"
        settings["fs.s3a.connection.ssl.enabled"] = "false" if endpoint.lower().startswith("http://") else "true"
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        settings["fs.s3a.endpoint.region"] = region
    return settings


def configure_s3(spark: SparkSession, environ: Mapping[str, str] | None = None) -> bool:
    """Apply the AWS variables of ``environ`` (default: this process's environment) to the running
    session's Hadoop configuration: endpoint, path style, TLS, region (``s3_settings``); and the
    keys, only when the driver JVM's own environment does not already hold the same ones (it was
    started before they were set), else S3A's default provider chain reads them from there.
    Returns False (and changes nothing) when the S3 jars are missing.

    Hadoop caches one file system per bucket: call this before the session first touches a bucket
    (or after the endpoint changed, before touching a bucket it has not seen)."""
    if not s3_jars_present():
        return False
    env = os.environ if environ is None else environ
    jsc: Any = spark.sparkContext._jsc
    jvm: Any = spark.sparkContext._jvm
    conf = jsc.hadoopConfiguration()
    for key, value in s3_settings(env).items():
        conf.set(key, value)
    for variable, key in _S3A_CREDENTIALS.items():
        secret = env.get(variable)
        if secret and secret != jvm.java.lang.System.getenv(variable):
            conf.set(key, secret)
    # Parse tasks read S3 sources with pyarrow in Spark's Python workers, whose environment is
    # the JVM's plus ``SparkContext.environment``: the variables the JVM did not start with go
    # there (tasks created from now on carry them; nothing is added to SparkConf).
    for variable in _AWS_VARIABLES:
        setting = env.get(variable)
        if setting and setting != jvm.java.lang.System.getenv(variable):
            spark.sparkContext.environment[variable] = setting
    return True


def _with_s3(builder: SparkSession.Builder, folder: str | None) -> SparkSession.Builder:
    """S3A for ``s3a://`` and ``s3://`` with versiq's LogStore, when the jars are there."""
    if not s3_jars_present(folder):
        return builder
    builder = (
        builder.config("spark.hadoop.fs.s3a.impl", S3A_FILESYSTEM)
        .config("spark.hadoop.fs.s3.impl", S3A_FILESYSTEM)
        # Delta reads these from SparkConf when it first opens a table of the scheme: session-wide.
        .config("spark.delta.logStore.s3a.impl", S3_LOGSTORE)
        .config("spark.delta.logStore.s3.impl", S3_LOGSTORE)
    )
    # The endpoint and region known now go to SparkConf too (executors of a cluster build their
    # Hadoop configuration from it); configure_s3 sets them again on the running session.
    for key, value in s3_settings().items():
        builder = builder.config(f"spark.hadoop.{key}", value)
    return builder


def _with_jars(builder: SparkSession.Builder, url: str) -> SparkSession.Builder:
    """The jars folder's jars (``jars_dir``; else Maven coordinates), and S3 (``_with_s3``). A
    local session gets them on the driver JVM's class path from its start (module docstring),
    and with versiq's jar ``LOCAL_FILESYSTEM`` and ``LOCAL_FILE_CONTEXT`` for ``file:`` paths.

    Why those: without Hadoop's native library, which PySpark does not ship, Hadoop's local file
    system starts a ``chmod`` process for every file and directory it creates, and a
    ``readlink`` one for every rename through ``FileContext``: about 55 per small run (each
    bucket's data file and its ``.crc``, each Delta log file), in the write task and the commit
    (docs/benchmarks.md has what they cost). Only in local sessions: Spark resolves its jars
    through the local file system before it loads any, so the class must be on the JVM's class
    path from its start, which an executor elsewhere would not have."""
    folder = jars_dir()
    if folder is None:
        return builder.config("spark.jars.packages", ",".join(spark_coordinates()))
    jars = jar_files(folder)
    if url != "local" and not url.startswith("local["):
        return _with_s3(builder.config("spark.jars", ",".join(jars)), folder)
    for key, value in local_session_jars(jars).items():
        builder = builder.config(key, value)
    return _with_s3(builder, folder)


def local_session_jars(jars: list[str]) -> dict[str, str]:
    """A local session's settings for ``jars`` (``_with_jars``): the class path, and the local
    file systems when versiq's jar holds them. A jar built before them (a checkout updated
    without ``make``) leaves Hadoop's own: a class named in the settings but missing would stop
    Spark from starting."""
    settings = {"spark.driver.extraClassPath": os.pathsep.join(jars)}
    classes = {name.replace(".", "/") + ".class" for name in (LOCAL_FILESYSTEM, LOCAL_FILE_CONTEXT)}
    for jar in jars:
        if fnmatch.fnmatch(os.path.basename(jar), VERSIQ_JAR):
            try:
                with zipfile.ZipFile(jar) as archive:
                    held = classes <= set(archive.namelist())
            except (OSError, zipfile.BadZipFile):
                held = False
            if held:
                settings["spark.hadoop.fs.file.impl"] = LOCAL_FILESYSTEM
                settings["spark.hadoop.fs.AbstractFileSystem.file.impl"] = LOCAL_FILE_CONTEXT
    return settings


def _with_delta(builder: SparkSession.Builder) -> SparkSession.Builder:
    return (
        builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        # A snapshot's state is small (one row per file): Delta's default of 50 tasks to
        # rebuild it costs seconds on two cores for nothing.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        # Delta's default, kept on purpose: the .crc file beside each commit (table size, file
        # count, ...; delta-rs does not read it) is derived from the previous one in the commit,
        # and it spares the next writer that loads the table from disk (every CLI run) a Spark
        # job over the whole log ("Compute snapshot for version N") in its commit: 0.9-1.4 s ->
        # 0.23-0.28 s per warm append measured, more in a cold JVM (docs/benchmarks.md).
        .config("spark.databricks.delta.writeChecksumFile.enabled", "true")
        # VACUUM lists a table's directories with this many tasks (Spark's default: 10,000).
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "4")
        # versiq keeps removed files for its own (short) retention (versiq.ingest.maintain).
        .config("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        .config("spark.sql.parquet.compression.codec", "zstd")
        # Small row groups: a point read of one key in an older snapshot reads little.
        .config("spark.hadoop.parquet.block.size", str(1 << 20))
    )


#: Spark's log configuration for versiq runs: errors only (``ingest/log4j2.properties``).
QUIET_LOG_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


def _quiet_log_option() -> str | None:
    """The JVM option that gives Spark ``QUIET_LOG_CONFIG``, unless versiq logs at DEBUG (then
    Spark's own default profile, WARN lines and all, shows what the JVM does)."""
    if logging.getLogger("versiq").getEffectiveLevel() <= logging.DEBUG or not os.path.isfile(QUIET_LOG_CONFIG):
        return None
    return f"-Dlog4j2.configurationFile=file:{QUIET_LOG_CONFIG}"


#: The driver JVM's option for a process that ends after one run (``short_lived``): compile with
#: C1 only. HotSpot's optimising compiler (C2) pays off only in long-lived processes; in a run of
#: seconds its compilations take CPU from the run's own threads (two cores here; docs/benchmarks.md
#: "C1 for one-shot runs" has the figures). In a long-lived session it is slower, so continuous
#: mode, the tests' session and the benchmarks keep the full JIT.
#: ``VERSIQ_DRIVER_JAVA_OPTIONS`` comes after it, so ``-XX:TieredStopAtLevel=4`` there turns it off.
SHORT_LIVED_JIT_OPTION = "-XX:TieredStopAtLevel=1"


#: The largest Arrow table (in Arrow bytes) that ``SparkSession.createDataFrame`` turns into a
#: ``LocalRelation`` (rows held in the plan itself; larger ones become an RDD of Arrow batches the
#: tasks decode). Spark's default is 48 MB. Catalyst rebuilds a LocalRelation's list of rows in
#: every rule that maps the expressions of a plan, and a run's plans go through dozens of them:
#: with a small run's tables (its 10k parsed records, its keys' stored versions, their homes)
#: held as LocalRelations, a sampling profile (Java Flight Recorder) of a CLI run of 10k events
#: into a 2M-version store found a third of the driver's time deciding and committing in
#: ``QueryPlan.recursiveTransform`` over those lists. As RDDs: 12.0-12.6 -> 10.5-10.8 s per
#: run, alternating, same store (docs/benchmarks.md); a one-record run is unchanged, and tables
#: this small (up to about 250 parsed records) stay in the plan, where they cost nothing. Small
#: enough that the warm-up's first run (501 records, ``ingest.warm_up``) takes the RDD path, so
#: the class archive and a resident driver's warm-up load its classes.
LOCAL_RELATION_BYTES = 32 * 1024

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
               "t": 1 << 40, "tb": 1 << 40, "p": 1 << 50, "pb": 1 << 50}


def local_relation_bytes(spark: SparkSession) -> int:
    """The session's ``spark.sql.execution.arrow.localRelationThreshold`` in bytes: an Arrow
    table up to it becomes a local relation (``LOCAL_RELATION_BYTES`` in sessions made here;
    Spark's default, 48 MB, in one a caller of ``run_ingest`` made); a text not understood here
    counts as no limit (every table a local relation: the cautious answer for its callers)."""
    text = str(spark.conf.get("spark.sql.execution.arrow.localRelationThreshold", "48MB")).strip().lower()
    digits = text.rstrip("bkmgtp")
    try:
        return int(digits) * _SIZE_UNITS[text[len(digits):]]
    except (KeyError, ValueError):
        return 1 << 62


#: New input (bytes of new files) up to which a run is a *small run* and plans for little data
#: (``_SMALL_RUN``):
#:
#: - Spark's expressions are evaluated interpreted, without generating Java for them and
#:   compiling it (Janino). On little data those compilations cost more than they save: in a cold
#:   JVM (a one-shot run, docs/benchmarks.md "C1 for one-shot runs"), and in continuous mode too,
#:   where every micro-batch's plan embeds its own literals (run number, files, stream time) and
#:   so is compiled afresh each time (docs/benchmarks.md "Interpreted micro-batches").
#: - No adaptive query execution, and one shuffle partition per core (at most the session's
#:   own number): adaptive execution re-plans each stage of each of a run's ~8 jobs from its
#:   shuffle statistics, which on a few records costs more than any plan it could pick saves
#:   (docs/benchmarks.md "Small runs plan for little data"); without it the shuffle partitions
#:   are not coalesced, hence fewer of them.
#:
#: Larger runs and S3 sources (their size is not known up front) keep code generation and
#: adaptive execution; a Kafka run's size is estimated from its records
#: (``kafka.RECORD_BYTES_ESTIMATE``). ``VERSIQ_INTERPRETED_RUN_BYTES`` overrides it (0: never).
INTERPRETED_RUN_BYTES = registry.INTERPRETED_RUN_BYTES.default
INTERPRETED_RUN_BYTES_ENV = registry.INTERPRETED_RUN_BYTES.name
_SMALL_RUN = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
              "spark.sql.adaptive.enabled": "false"}
_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def small_run_settings(spark: SparkSession) -> dict[str, str]:
    """The session settings of a small run (``INTERPRETED_RUN_BYTES``)."""
    partitions = min(int(spark.conf.get(_SHUFFLE_PARTITIONS) or "200"), spark.sparkContext.defaultParallelism)
    return {**_SMALL_RUN, _SHUFFLE_PARTITIONS: str(max(1, partitions))}


def small_run(input_bytes: int | None) -> bool:
    """Whether a run over ``input_bytes`` of new input (None: not known) is a small run
    (``INTERPRETED_RUN_BYTES``)."""
    limit = registry.INTERPRETED_RUN_BYTES.value()
    return limit > 0 and input_bytes is not None and input_bytes <= limit


@contextlib.contextmanager
def plans_for_input(spark: SparkSession, small: bool) -> Iterator[None]:
    """The run inside plans for little data (``small``: ``small_run`` of its input,
    ``small_run_settings``); the session's settings are restored after."""
    if not small:
        yield
        return
    with session_settings(spark, small_run_settings(spark)):
        yield


@contextlib.contextmanager
def session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """``settings`` hold in ``spark``'s SQL settings inside; the previous values after."""
    conf = spark.conf
    previous = {key: conf.get(key, None) for key in settings}
    for key, value in settings.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                conf.unset(key)
            else:
                conf.set(key, old)


@contextlib.contextmanager
def active_on_this_thread(spark: SparkSession) -> Iterator[None]:
    """``spark`` is the JVM thread's active session inside (the previous one after).

    Spark reads many settings (adaptive execution, code generation) from the calling thread's
    active session, not from the session a DataFrame belongs to: a thread of versiq's own (a
    side table's commit, a run beside others) sets it, so that its plans see the session's
    settings as they are now, such as a small run's (``plans_for_input``)."""
    jvm_session = spark._jvm.org.apache.spark.sql.SparkSession  # type: ignore[union-attr]
    previous = jvm_session.getActiveSession()
    jvm_session.setActiveSession(spark._jsparkSession)
    try:
        yield
    finally:
        if previous.isDefined():
            jvm_session.setActiveSession(previous.get())
        else:
            jvm_session.clearActiveSession()


def driver_java_options(short_lived: bool) -> str:
    """The driver JVM's options: the class archive, Spark's quiet logging, C1 only for a
    ``short_lived`` process, then ``VERSIQ_DRIVER_JAVA_OPTIONS`` last (the JVM takes the last of
    a repeated option, so the user's win)."""
    return " ".join(filter(None, [class_archive_option(), _quiet_log_option(),
                                  SHORT_LIVED_JIT_OPTION if short_lived else None,
                                  registry.DRIVER_JAVA_OPTIONS.value()]))


def set_interpreter_defaults() -> None:
    """Spark's Python workers and driver run this interpreter unless told otherwise."""
    # (the resident driver counts an unset variable as this default: driver_client.INTERPRETER_DEFAULTS)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def set_active_session(spark: SparkSession) -> None:
    """``spark`` is the active session of the JVM thread that serves this Python thread."""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)  # type: ignore[union-attr]


def get_spark(master: str | None = None, app_name: str = "versiq-ingest", *,
              short_lived: bool = False) -> SparkSession:
    """Create (or reuse) the session. Shuffle partitions are kept small: 2-core machines.
    ``short_lived``: the process ends after this session's one run (``SHORT_LIVED_JIT_OPTION``)."""
    set_interpreter_defaults()
    url = master_url(master)
    builder = (
        SparkSession.builder.master(url)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", registry.SHUFFLE_PARTITIONS.value())
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", registry.DRIVER_MEMORY.value())
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
        .config("spark.python.worker.reuse", "true")
        # PySpark 4 records the Python call site of every DataFrame and Column call in the JVM
        # (three py4j round trips each) for error messages: most of the py4j calls of a run's
        # plan (docs/benchmarks.md, "PySpark's call-site capture"); our errors name their own context.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        .config("spark.sql.execution.arrow.localRelationThreshold", str(LOCAL_RELATION_BYTES))
    )
    java_options = driver_java_options(short_lived)
    logging.getLogger("versiq.ingest").debug("driver JVM options: %s", java_options)
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    starting = SparkContext._active_spark_context is None
    if starting:
        logging.getLogger("versiq.ingest").info("starting Spark (%s) ...", url)
    started = time.monotonic()
    spark = _with_delta(_with_jars(builder, url)).getOrCreate()
    if starting:
        logging.getLogger("versiq.ingest").info("Spark ready in %.1f s", time.monotonic() - started)
    spark.sparkContext.setLogLevel("ERROR")
    register_functions(spark)
    configure_s3(spark)
    if not url.startswith("local"):
        _ship_project(spark)
    return spark


#: The driver JVM's pid, known for one SparkContext at a time (``driver_jvm_pid``).
_jvm_pid: tuple[object, int] | None = None


def driver_jvm_pid() -> int | None:
    """The pid of this process's Spark driver JVM (the process that makes its Delta commits),
    None when no session runs. Asked of the JVM once per SparkContext."""
    global _jvm_pid
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return None
    if _jvm_pid is None or _jvm_pid[0] is not context:
        jvm: Any = context._jvm
        _jvm_pid = (context, int(jvm.java.lang.ProcessHandle.current().pid()))
    return _jvm_pid[1]


def _murmur2_mod(keys: pd.Series, n: pd.Series) -> pd.Series:
    """``toPositive(murmur2(UTF-8 bytes)) mod n`` of every key of a pandas Series (null: null)."""
    import pyarrow as pa

    from versiq.layout import murmur2_positive

    if len(keys) == 0:
        return pd.Series([], dtype="Int32")
    array = pa.array(keys, type=pa.string(), from_pandas=True)
    hashed = murmur2_positive(array.fill_null("")) % int(n.iloc[0])
    return pd.Series(hashed.astype("int32")).where(~keys.isna().to_numpy(), None).astype("Int32")


def register_functions(spark: SparkSession) -> None:
    """The session's SQL functions of versiq's own (``MURMUR2_MOD_FUNCTION``)."""
    from pyspark.sql.functions import pandas_udf

    spark.udf.register(MURMUR2_MOD_FUNCTION, pandas_udf(_murmur2_mod, "int"))  # type: ignore[call-overload]


def _ship_project(spark: SparkSession) -> None:
    """Zip the ``versiq`` package (following its links to ingest/, query/, service/, cli/) and add
    it to every executor's path."""
    target = os.path.join(tempfile.mkdtemp(prefix="versiq-pyfiles-"), "versiq.zip")
    base = os.path.dirname(package_root())
    with zipfile.ZipFile(target, "w") as archive:
        for full in package_files():
            archive.write(full, os.path.relpath(full, base))
    spark.sparkContext.addPyFile(target)


def runs_locally(spark: SparkSession) -> bool:
    """Whether ``spark``'s master is local (its tasks run in the driver's JVM), known without
    starting a session that starts on demand."""
    url = spark.master_url() if isinstance(spark, SparkOnDemand) else spark.sparkContext.master
    return (url or "").startswith("local")


def start_soon(spark: SparkSession) -> None:
    """Have ``spark`` start now, on a thread of its own, when it is a session that starts on
    demand (``SparkOnDemand.start_soon``); a running session: nothing to do."""
    if isinstance(spark, SparkOnDemand):
        spark.start_soon()


class SparkOnDemand:
    """A SparkSession that starts the first time a run needs one (no JVM for work that
    needs none).

    ``versiq ingest`` hands this to the pipeline in place of a session. Everything a run decides
    before it reads data (configuration, store settings, the writer lock, files done vs files
    present, derived tables already up to date) goes through delta-rs and plain Python, so a run
    with nothing new, or one refused for a setting, ends before any JVM starts; the first use of
    an attribute (``spark.read``, ``spark.sparkContext``, ...) starts the session, after which
    this object behaves as the session itself. It is also the factory ``maintain`` takes
    (``spark()`` returns the session). The process ends after the run (the demo stops the session
    before it serves), so its JVM is ``short_lived``. ``on_start`` is called once, just before
    the session starts, on the thread that starts it (``driver_client.autostart_hook``)."""

    def __init__(self, master: str | None = None, app_name: str = "versiq-ingest",
                 on_start: Callable[[], object] | None = None) -> None:
        self._master = master
        self._app_name = app_name
        self._on_start = on_start
        self._session: SparkSession | None = None
        self._starting: concurrent.futures.Future[SparkSession] | None = None
        self._lock = threading.Lock()  # the stores of a run may ask for it at once (``side_by_side``)

    def __call__(self) -> SparkSession:
        if self._session is not None:
            return self._session
        with self._lock:
            return self._session_now()

    def _session_now(self) -> SparkSession:
        if self._session is None:
            if self._starting is not None:
                try:
                    session = self._starting.result()  # its failure is raised here, in the run
                finally:
                    self._starting = None
                # The JVM keeps the active session per thread, and Spark reads many settings
                # (a small run's: ``plans_for_input``) from the calling thread's active session;
                # this thread's is unset, as the session was made on another one.
                set_active_session(session)
                self._session = session
            else:
                self._session = self._start()
        return self._session

    def _start(self) -> SparkSession:
        if self._on_start is not None:
            on_start, self._on_start = self._on_start, None
            on_start()
        return get_spark(self._master, self._app_name, short_lived=True)

    def running(self) -> SparkSession | None:
        """The session if it has started, else None (never starts one)."""
        return self._session

    def master_url(self) -> str:
        """The master the session has or will have (``master_url``)."""
        return master_url(self._master)

    def start_soon(self) -> None:
        """Start the session on a thread of its own while the run goes on in Python (a run
        parses its files and reads its keys' stored versions meanwhile: ``parse.parse_run``,
        ``pipeline``); the first use of the session waits for it. Measured on the 2-core
        machine: a CLI run of 10k events into a 2M-version store spends about 2.6 s starting
        Spark, and the parse and DuckDB's read of the stored versions (about 0.8 s) now happen
        meanwhile. A session made on another thread installs no SIGINT handler (PySpark does
        that on the main thread only): Ctrl-C ends the process, and with it the JVM, without
        first cancelling its jobs, which a one-shot run does not need."""
        with self._lock:
            if self._session is None and self._starting is None:
                set_interpreter_defaults()  # here: the environment is not changed beside other threads
                pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="versiq-spark-start")
                self._starting = pool.submit(self._start)
                pool.shutdown(wait=False)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy/pickle probes must not start a JVM
            raise AttributeError(name)
        return getattr(self(), name)

    def stop(self) -> None:
        """Stop the session if one was started (the demo serves in the same process afterwards)."""
        if self._starting is not None:  # a start the run did not use (it failed first)
            try:
                self()
            except Exception:  # noqa: BLE001 - the run's own failure is the one to report
                logging.getLogger("versiq.ingest").debug("the Spark session started early failed", exc_info=True)
        if self._session is not None:
            self._session.stop()
            self._session = None

    def as_session(self) -> SparkSession:
        """This object typed as the session it stands for (every attribute is the session's)."""
        return self  # type: ignore[return-value]
