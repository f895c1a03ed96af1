"""Parsing a run's new files: each file parsed whole and in order by ``versiq.ingest.records``,
with the processing-order columns of ``ingest.order``; by Spark tasks (``parse_files``, one per
group of files), or in this process (``parse_here``), as the run's plan says (``ingest.plan``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import overload

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from versiq.ingest.frames import rows_frame
from versiq.ingest.order import MAX_FILES, RUN_SCHEMA, with_order
from versiq.ingest.plan import RunPlan
from versiq.ingest.records import format_of, parse_file
from versiq.ingest.sources import read_error
from versiq.ingest.spark import start_soon
from versiq.layout import Partitioning
from versiq.logs import counted

#: The most records a run parses in this process, whatever its size on disk: 128 MiB of tiny CSV
#: records (``a,1,1``) would be over 20M records, an Arrow table of over 1 GB held twice by the
#: driver. A run found to hold more while it parses here is parsed again by Spark tasks (the
#: time of the parse so far is lost: about 7 s at this many, a rare case).
PARSE_HERE_ROWS = 2_000_000


def parse_run(spark: SparkSession, plan: RunPlan, files: dict[str, str], fmt: str | None,
              partitioning: Partitioning | None,
              max_timestamp: int | None) -> tuple[DataFrame | pa.Table, RunPlan]:
    """A run's new files parsed as ``plan`` says (``ingest.plan``): here (the session, if it has
    yet to start, starts meanwhile on a thread of its own: ``spark.start_soon``), else by Spark
    tasks; also by Spark when they hold more than ``PARSE_HERE_ROWS`` records, and then the plan
    returned is Spark's."""
    log = logging.getLogger("versiq.ingest")
    if plan.parse == "driver":
        _check_files(files)  # a run refused here starts no JVM
        start_soon(spark)
        # no ``fst``: only Spark's decisions read it, and a run parsed here is decided here
        # (with several partitions it costs a hash per record in Python)
        table = parse_here(files, fmt, None, max_timestamp, max_rows=PARSE_HERE_ROWS)
        if table is not None:
            log.debug("%s parsed in this process", counted(table.num_rows, "record"))
            return table, plan
        plan = plan.spark_parses()
        log.info("more than %s in %s of new files: %s", counted(PARSE_HERE_ROWS, "record"),
                 counted(plan.input_bytes or 0, "byte"), plan.describe())
    return parse_files(spark, files, fmt, partitioning, max_timestamp), plan


def parse_files(spark: SparkSession, files: dict[str, str], fmt: str | None, partitioning: Partitioning | None,
                max_timestamp: int | None = None) -> DataFrame:
    """Every file parsed (``ingest.records``) by a Spark task, with the processing-order
    columns of ``ingest.order`` (``partitioning``: the store's, None for a stream)."""
    _check_files(files)
    rows = [(full, rel, format_of(rel, fmt), index) for index, (rel, full) in enumerate(files.items())]
    frame = rows_frame(spark, rows, pa.schema([("path", pa.string()), ("source", pa.string()), ("fmt", pa.string()),
                                               ("file_index", pa.int32())]))
    frame = frame.repartition(max(1, min(len(rows), spark.sparkContext.defaultParallelism * 4)))

    def parse(batches):  # type: ignore[no-untyped-def]
        for batch in batches:
            for full, rel, file_fmt, index in zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True):
                yield from _ordered(full, parse_file(full, rel, file_fmt, max_timestamp), index, partitioning)

    return frame.mapInArrow(parse, from_arrow_schema(RUN_SCHEMA))


@overload
def parse_here(files: dict[str, str], fmt: str | None, partitioning: Partitioning | None,
               max_timestamp: int | None = None) -> pa.Table: ...


@overload
def parse_here(files: dict[str, str], fmt: str | None, partitioning: Partitioning | None,
               max_timestamp: int | None = None, *, max_rows: int) -> pa.Table | None: ...


def parse_here(files: dict[str, str], fmt: str | None, partitioning: Partitioning | None,
               max_timestamp: int | None = None, *, max_rows: int | None = None) -> pa.Table | None:
    """The rows ``parse_files`` gives, parsed in this process, one file after another: for a
    run whose Spark job would cost more than its parse (``ingest.plan``); the parse and the
    reads that follow need no Spark, so they overlap the JVM's start (``spark.start_soon``).
    With ``max_rows``: None once the files hold more records than that (the caller has Spark
    parse them)."""
    _check_files(files)
    parsed = ((index, parse_file(full, rel, format_of(rel, fmt), max_timestamp))
              for index, (rel, full) in enumerate(files.items()))
    return _collect(files, parsed, partitioning, max_rows)


def _collect(files: dict[str, str], parsed: Iterator[tuple[int, Iterator[pa.RecordBatch]]],
             partitioning: Partitioning | None,
             max_rows: int | None) -> pa.Table | None:
    """(file index, its parsed batches) of every file in order -> the run's table; None past
    ``max_rows`` records."""
    paths = list(files.values())
    batches: list[pa.RecordBatch] = []
    rows = 0
    for index, file_batches in parsed:
        for batch in _ordered(paths[index], file_batches, index, partitioning):
            rows += batch.num_rows
            if max_rows is not None and rows > max_rows:
                return None
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=RUN_SCHEMA)


def _check_files(files: dict[str, str]) -> None:
    if len(files) > MAX_FILES:
        raise ValueError(f"{len(files)} new files in one run; at most {MAX_FILES} (ingest them in parts)")
    if list(files) != sorted(files):  # file indexes are processing order (ingest.order)
        raise ValueError("source files must be given in (relative path) order")


def _ordered(full: str, batches: Iterator[pa.RecordBatch], index: int,
             partitioning: Partitioning | None) -> Iterator[pa.RecordBatch]:
    """A file's parsed ``batches`` with the columns of ``ingest.order``."""
    try:
        yield from with_order(batches, index, partitioning)
    except OSError as exc:  # the parsers turn content errors into rejections: the OS refused
        raise read_error(full, exc) from None
