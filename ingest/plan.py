"""A run's plan: where it parses, who decides, how Spark plans its jobs; chosen once per run by
``choose_plan`` (the one place that weighs the size thresholds against each other) and logged once::

    store prices: run 5 over 3 new files: parse in the driver, decide with DuckDB, write with Spark

The plans (docs/architecture.md has this table with the reasons):

==========================  ==================================  ==========  =====================
run                         parse                               decide      Spark plans as
==========================  ==================================  ==========  =====================
local files, <= 128 MiB     the driver (``parse.parse_here``)   DuckDB      small run <= 4 MiB
Kafka, <= 128 MiB / 256 B   the driver (``kafka.read_here``)    DuckDB      small run <= 4 MiB
larger, Parquet, S3         Spark tasks                         Spark       small run <= 4 MiB
cluster master              the driver only for a small run     (as parse)
==========================  ==================================  ==========  =====================

A Kafka run's size is its records times ``kafka.RECORD_BYTES_ESTIMATE`` (256 bytes): up to
524,288 records it is read in the driver with the confluent-kafka client, unless the source's
client settings have no same-meaning librdkafka setting (``kafka.driver_config``; said once).

Spark always writes. A run the driver finds to hold more than ``parse.PARSE_HERE_ROWS`` records
while it parses is parsed again by Spark tasks (``RunPlan.spark_parses``), and that is logged too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pyspark.sql import SparkSession

from versiq import settings
from versiq.ingest.kafka import KafkaSource, reads_here
from versiq.ingest.records import format_of
from versiq.ingest.spark import runs_locally, small_run

#: New input (bytes of new text files) up to which a run parses its files in the driver and
#: decides them there: the parse and DuckDB's decisions overlap the JVM's start, and Spark only
#: writes. The driver then holds the run's records, decisions and store rows as Arrow tables
#: (under 1 GB for 1M events; docs/benchmarks.md has the figures).
PARSE_HERE_BYTES = 128 << 20

#: Overrides ``PARSE_HERE_BYTES`` (0: every run parses in Spark tasks).
PARSE_HERE_BYTES_ENV = settings.PARSE_HERE_BYTES.name


@dataclass(frozen=True)
class RunPlan:
    """How one run goes. ``parse``: ``driver`` (this process, decided by DuckDB) or ``spark``
    (Spark tasks parse, Spark decides); ``small``: Spark plans for little data
    (``spark.plans_for_input``: interpreted expressions, no adaptive execution)."""

    parse: str
    small: bool
    input_bytes: int | None

    @property
    def decide(self) -> str:
        return "duckdb" if self.parse == "driver" else "spark"

    def spark_parses(self) -> RunPlan:
        """The plan of a run the driver gave up parsing (too many records): Spark's."""
        return replace(self, parse="spark")

    def describe(self) -> str:
        if self.parse == "driver":
            text = "parse in the driver, decide with DuckDB, write with Spark"
        else:
            text = "parse, decide and write with Spark"
        return text + (" (a small run)" if self.small else "")


def choose_plan(spark: SparkSession, files: dict[str, str] | None, fmt: str | None,
                input_bytes: int | None, *, kafka: KafkaSource | None = None, store: str = "") -> RunPlan:
    """The plan of a run over ``files`` (relative path -> path; None: not files, e.g. a Kafka
    topic) of ``input_bytes`` (None: not known, e.g. S3 objects) in ``spark`` (a local master or
    a cluster's); or of a run of ``store`` over the records of ``kafka`` (``files`` None,
    ``input_bytes`` its records times ``kafka.RECORD_BYTES_ESTIMATE``). Starts no session."""
    small = small_run(input_bytes)
    if kafka is not None:
        here = parses_here({}, None, input_bytes, local_master=runs_locally(spark)) and reads_here(kafka, store)
    else:
        here = files is not None and parses_here(files, fmt, input_bytes, local_master=runs_locally(spark))
    return RunPlan("driver" if here else "spark", small, input_bytes)


def parses_here(files: dict[str, str], fmt: str | None, input_bytes: int | None, *,
                local_master: bool = True) -> bool:
    """Whether a run over ``input_bytes`` of new ``files`` parses them in this process
    (``parse.parse_here``): up to ``PARSE_HERE_BYTES`` (``VERSIQ_PARSE_HERE_BYTES``; 0: never) with a
    local master; with a cluster's (not ``local_master``), only a small run (``spark.small_run``):
    its tasks would carry the parsed batches over the network, and its executors parse on more
    cores than this process has. Never a run of unknown size (S3 sources) or one with Parquet
    files, whose size on disk says little about the rows they hold (a compressed file of a few MB
    can hold millions)."""
    if input_bytes is None or any(format_of(rel, fmt) == "parquet" for rel in files):
        return False
    explicit = settings.PARSE_HERE_BYTES.value()
    if explicit is not None:
        return 0 < explicit and input_bytes <= explicit
    return input_bytes <= PARSE_HERE_BYTES if local_master else small_run(input_bytes)


#: New source records of a derived pass up to which it runs in the driver, partition after
#: partition (``derived.job.run_here``): its records and results fit in a few tens of MB, and a
#: pass of a continuous run or of a small batch is done in a fraction of the Spark job's time;
#: a larger pass runs as Spark tasks (``derived.job.run_job``), whatever its size.
DERIVE_HERE_RECORDS = 100_000


def derives_here(records: int) -> bool:
    """Whether a derived pass over ``records`` new source records runs in this process
    (``VERSIQ_DERIVE_HERE_RECORDS`` overrides ``DERIVE_HERE_RECORDS``; 0: never)."""
    limit = settings.DERIVE_HERE_RECORDS.value()
    limit = DERIVE_HERE_RECORDS if limit is None else limit
    return limit > 0 and records <= limit


#: Up to this many buckets, a run reads the stored versions of its keys
#: (``store.existing_versions``) bucket by bucket, each bucket's files for that bucket's keys only
#: (``store._stored_rows``); a run touching more (a store of many buckets) reads them in one scan.
BUCKET_SCANS_LIMIT = 64


def scans_per_bucket(buckets: int) -> bool:
    """Whether a run whose keys fall in ``buckets`` buckets reads their stored versions bucket by
    bucket (``VERSIQ_BUCKET_SCANS_LIMIT`` overrides ``BUCKET_SCANS_LIMIT``; 0: never)."""
    limit = settings.BUCKET_SCANS_LIMIT.value()
    limit = BUCKET_SCANS_LIMIT if limit is None else limit
    return buckets <= limit
