"""Parsing a run's new files with Spark: one task per group of files, each file parsed whole and
in order by ``versiq.ingest.records``, with the processing-order columns of ``ingest.order``."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from versiq.ingest.order import MAX_FILES, RUN_SCHEMA, with_order
from versiq.ingest.records import format_of, parse_file
from versiq.ingest.sources import read_error


def parse_files(spark: SparkSession, files: dict[str, str], fmt: str | None, partitions: int | None,
           max_timestamp: int | None = None) -> DataFrame:
    """Every file parsed (``ingest.records``) by a Spark task, with the processing-order
    columns of ``ingest.order`` (``partitions``: the store's, None for a stream)."""
    if len(files) > MAX_FILES:
        raise ValueError(f"{len(files)} new files in one run; at most {MAX_FILES} (ingest them in parts)")
    if list(files) != sorted(files):  # file indexes are processing order (ingest.order)
        raise ValueError("source files must be given in (relative path) order")
    rows = [(full, rel, format_of(rel, fmt), index) for index, (rel, full) in enumerate(files.items())]
    frame = spark.createDataFrame(rows, "path string, source string, fmt string, file_index int")
    frame = frame.repartition(max(1, min(len(rows), spark.sparkContext.defaultParallelism * 4)))

    def parse(batches):  # type: ignore[no-untyped-def]
        for batch in batches:
            for full, rel, file_fmt, index in zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True):
                try:
                    yield from with_order(parse_file(full, rel, file_fmt, max_timestamp), index, partitions)
                except OSError as exc:  # the parsers turn content errors into rejections: the OS refused
                    raise read_error(full, exc) from None

    return frame.mapInArrow(parse, from_arrow_schema(RUN_SCHEMA))
