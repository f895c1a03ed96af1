"""Parsing a run's new files: each file parsed whole and in order by ``versiq.ingest.records``,
with the processing-order columns of ``ingest.order``; by Spark tasks (``parse_files``, one per
group of files), or in this process for a run of up to ``PARSE_HERE_BYTES`` (``parse_here``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import overload

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from versiq import settings
from versiq.ingest.frames import rows_frame
from versiq.ingest.order import MAX_FILES, RUN_SCHEMA, with_order
from versiq.ingest.parse_workers import WorkerRun, parse_workers, plan_pieces
from versiq.ingest.records import format_of, parse_file
from versiq.ingest.sources import read_error
from versiq.ingest.spark import runs_locally, small_run, start_soon
from versiq.logs import counted

#: New input (bytes of new text files) up to which a run parses its files in this process
#: (``parse_here``), far above a small run (``spark.small_run``), and decides them here too
#: (``ingest.decisions_here``, DuckDB): Spark only writes. The parse takes about 3.3 µs per JSONL
#: record on one core; from ``parse_workers.PARALLEL_PARSE_BYTES`` on, worker processes parse on
#: every core. 1M JSONL events (80 MB) into a new store, measured (docs/benchmarks.md, "Larger
#: runs parse in the driver", "A run parsed in the driver is decided there", "The driver parses
#: on every core"):
#:
#: - through the CLI with a JVM of its own, whose start overlaps the parse and the decisions:
#:   13.9-14.2 s, against 21.5 s decided by Spark and 28.5 s parsed by Spark tasks too;
#: - by a resident driver: 6.5 s once its parse workers have started (8.7 s for the first);
#: - in a warm session in process: 5.5-5.6 s (6.6-7.0 s parsed by the driver alone), against
#:   11.6-13.7 s parsed and decided by Spark.
#:
#: The driver's Python process holds such a run's records, their decisions and the store's rows
#: as Arrow tables: a CLI run of 1M events peaked at 0.89 GB resident, most of it DuckDB's
#: decisions, and each parse worker at 0.17 GB.
PARSE_HERE_BYTES = 128 << 20

#: Overrides ``PARSE_HERE_BYTES`` (0: every run parses in Spark tasks).
PARSE_HERE_BYTES_ENV = settings.PARSE_HERE_BYTES.name

#: The most records a run parses in this process, whatever its size on disk: 128 MiB of tiny CSV
#: records (``a,1,1``) would be over 20M records, an Arrow table of over 1 GB held twice by the
#: driver. A run found to hold more while it parses here is parsed again by Spark tasks (the
#: time of the parse so far is lost: about 7 s at this many, a rare case).
PARSE_HERE_ROWS = 2_000_000


def parse_run(spark: SparkSession, files: dict[str, str], fmt: str | None, partitions: int | None,
              max_timestamp: int | None, input_bytes: int | None) -> DataFrame | pa.Table:
    """A run's new files parsed: here when ``parses_here`` (the session, if it has yet to
    start, starts meanwhile on a thread of its own: ``spark.start_soon``), else by Spark; also
    by Spark when they hold more than ``PARSE_HERE_ROWS`` records."""
    log = logging.getLogger("versiq.ingest")
    if parses_here(files, fmt, input_bytes, local_master=runs_locally(spark)):
        _check_files(files)  # a run refused here starts no JVM
        start_soon(spark)
        # no ``fst``: only Spark's decisions read it, and a run parsed here is decided here
        # (with several partitions it costs a CRC per record in Python)
        table = parse_here(files, fmt, None, max_timestamp, max_rows=PARSE_HERE_ROWS)
        if table is not None:
            log.debug("%s parsed in this process", counted(table.num_rows, "record"))
            return table
        log.info("more than %s in %s of new files: Spark tasks parse them", counted(PARSE_HERE_ROWS, "record"),
                 counted(input_bytes or 0, "byte"))
    return parse_files(spark, files, fmt, partitions, max_timestamp)


def parse_files(spark: SparkSession, files: dict[str, str], fmt: str | None, partitions: int | None,
                max_timestamp: int | None = None) -> DataFrame:
    """Every file parsed (``ingest.records``) by a Spark task, with the processing-order
    columns of ``ingest.order`` (``partitions``: the store's, None for a stream)."""
    _check_files(files)
    rows = [(full, rel, format_of(rel, fmt), index) for index, (rel, full) in enumerate(files.items())]
    frame = rows_frame(spark, rows, pa.schema([("path", pa.string()), ("source", pa.string()), ("fmt", pa.string()),
                                               ("file_index", pa.int32())]))
    frame = frame.repartition(max(1, min(len(rows), spark.sparkContext.defaultParallelism * 4)))

    def parse(batches):  # type: ignore[no-untyped-def]
        for batch in batches:
            for full, rel, file_fmt, index in zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True):
                yield from _ordered(full, parse_file(full, rel, file_fmt, max_timestamp), index, partitions)

    return frame.mapInArrow(parse, from_arrow_schema(RUN_SCHEMA))


@overload
def parse_here(files: dict[str, str], fmt: str | None, partitions: int | None,
               max_timestamp: int | None = None) -> pa.Table: ...


@overload
def parse_here(files: dict[str, str], fmt: str | None, partitions: int | None,
               max_timestamp: int | None = None, *, max_rows: int) -> pa.Table | None: ...


def parse_here(files: dict[str, str], fmt: str | None, partitions: int | None,
               max_timestamp: int | None = None, *, max_rows: int | None = None) -> pa.Table | None:
    """The rows ``parse_files`` gives, parsed in this process (``parses_here``): for a small
    run, whose Spark job would cost more than its parse, and for a larger one up to
    ``PARSE_HERE_BYTES``. A CLI run of 10k
    events took 2.7 s in that job with a new JVM (the Python workers' start, Arrow's exchange),
    and its parse takes 0.1 s here; the parse and the reads that follow need no Spark, so they
    also overlap the JVM's start (``spark.start_soon``). With ``max_rows``: None once the files
    hold more records than that (the caller has Spark parse them). A run of at least
    ``parse_workers.PARALLEL_PARSE_BYTES`` is parsed by worker processes, one per core."""
    _check_files(files)
    workers = parse_workers()
    pieces = plan_pieces(files, fmt, workers)
    if pieces is not None:
        try:
            with WorkerRun.start(pieces, max_timestamp, workers) as run:
                return _collect(files, run.files(), partitions, max_rows)
        except BrokenProcessPool as exc:  # the pool could not start, or a worker died
            _parse_here_instead(str(exc))
    parsed = ((index, parse_file(full, rel, format_of(rel, fmt), max_timestamp))
              for index, (rel, full) in enumerate(files.items()))
    return _collect(files, parsed, partitions, max_rows)


def _parse_here_instead(why: str) -> None:
    """The parse workers failed (the run's files did not: they are parsed again here)."""
    logging.getLogger("versiq.ingest").warning("%s: this run parses in the driver", why)


def _collect(files: dict[str, str], parsed: Iterator[tuple[int, Iterator[pa.RecordBatch]]], partitions: int | None,
             max_rows: int | None) -> pa.Table | None:
    """(file index, its parsed batches) of every file in order -> the run's table; None past
    ``max_rows`` records."""
    paths = list(files.values())
    batches: list[pa.RecordBatch] = []
    rows = 0
    for index, file_batches in parsed:
        for batch in _ordered(paths[index], file_batches, index, partitions):
            rows += batch.num_rows
            if max_rows is not None and rows > max_rows:
                return None
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=RUN_SCHEMA)


def parses_here(files: dict[str, str], fmt: str | None, input_bytes: int | None, *,
                local_master: bool = True) -> bool:
    """Whether a run over ``input_bytes`` of new ``files`` parses them in this process
    (``parse_here``): up to ``PARSE_HERE_BYTES`` (``VERSIQ_PARSE_HERE_BYTES``; 0: never) with a
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


def _check_files(files: dict[str, str]) -> None:
    if len(files) > MAX_FILES:
        raise ValueError(f"{len(files)} new files in one run; at most {MAX_FILES} (ingest them in parts)")
    if list(files) != sorted(files):  # file indexes are processing order (ingest.order)
        raise ValueError("source files must be given in (relative path) order")


def _ordered(full: str, batches: Iterator[pa.RecordBatch], index: int,
             partitions: int | None) -> Iterator[pa.RecordBatch]:
    """A file's parsed ``batches`` with the columns of ``ingest.order``."""
    try:
        yield from with_order(batches, index, partitions)
    except OSError as exc:  # the parsers turn content errors into rejections: the OS refused
        raise read_error(full, exc) from None
