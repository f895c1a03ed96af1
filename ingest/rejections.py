"""Writing a run's rejected records to the store's ``_rejected`` table: the parser's, with their
original text, and those rejected by the run's decisions (late, duplicate offsets, partition
conflicts), whose text is read again from their files (the run does not carry the text of
parsed records: ``ingest.order``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from versiq.ingest.frames import local_frame, rows_frame, spread_frame
from versiq.ingest.order import MAX_POS, file_seq_base, split_seq
from versiq.ingest.records import BATCH_ROWS, format_of, raw_texts
from versiq.ingest.sqltext import file_of_sql
from versiq.ingest.store import commit_side
from versiq.layout import REJECTED_DIR, REJECTED_SCHEMA, StoreState

#: Up to this many rejections in a run, ``_rejected`` is written on the driver (``write_rejected``).
DRIVER_REJECTIONS = 20_000

#: The same for a run parsed on the driver (``parse.parse_here``), which held all of its records
#: there already (at most ``parse.PARSE_HERE_ROWS``). Bounded still: the rows are written by one
#: task, each with its text and detail (about 250 bytes: some 60 MB at this many).
PARSED_HERE_REJECTIONS = 250_000


def write_rejected(spark: SparkSession, parsed: DataFrame | pa.Table, classified: DataFrame | pa.Table | None,
                   store_path: str, state: StoreState, new: dict[str, str], fmt: str | None, decided: int = 0,
                   total: int | None = None, parsed_here: bool = False) -> None:
    """The run's rejected records: the parser's (with their text), and, when ``classified`` is
    given and ``decided`` > 0, those rejected by the decisions, whose text is read again from
    their files (``ingest.order``: the run does not carry the text of parsed records).

    With ``total`` (all rejections of the run) up to ``DRIVER_REJECTIONS``, or up to
    ``PARSED_HERE_REJECTIONS`` in a run ``parsed_here`` (``parse.parse_here``), the rows are
    collected and assembled on the driver: the same rows, without about five Spark jobs and the
    Python workers that read the texts (an incremental batch's usual case; docs/benchmarks.md
    has the figures); else Spark
    assembles them. Written before the run's store commit (``commit_side``), replacing
    what an unfinished attempt of the run left. ``parsed`` and ``classified`` are Arrow tables
    in a run decided in this process (``ingest.decisions_here``)."""
    run = state.run
    if total == 0:
        _none_rejected(spark, store_path, state)
        return
    files = [(full, format_of(rel, fmt)) for rel, full in new.items()]
    sources = list(new)
    ingested_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if total is not None and total <= (PARSED_HERE_REJECTIONS if parsed_here else DRIVER_REJECTIONS):
        parts = [_arrow(_parsed_rejected(parsed))]
        if classified is not None and decided:
            decided_rows = _arrow(_decided_rejected(classified))
            texts = pa.Table.from_batches(list(_read_texts(files, decided_rows.column("seq").to_numpy())),
                                          schema=_TEXT_SCHEMA)
            parts.append(decided_rows.join(texts, "seq").select(parts[0].column_names))
        table = pa.concat_tables([t.cast(parts[0].schema) for t in parts]).sort_by("seq")
        seq = table.column("seq").to_numpy()
        file_index, pos = split_seq(seq)
        is_row = np.array([files[i][1] == "parquet" for i in file_index], dtype=bool)
        out = pa.table({
            "run": pa.array(np.full(len(seq), run), pa.int64()),
            "source": pa.array([sources[i] for i in file_index], pa.string()),
            "line": pa.array(pos, pa.int64(), mask=is_row),
            "row": pa.array(pos, pa.int64(), mask=~is_row),
            "partition": table.column("part"),
            "offset": table.column("offset"),
            "reason": table.column("reason"),
            "raw": table.column("raw"),
            "detail": table.column("detail"),
            "ingested_at": pa.array([ingested_at] * len(seq), pa.string()),
        })
        commit_side(store_path, REJECTED_DIR, state, local_frame(spark, out), empty=out.num_rows == 0)
        return
    # tables of a run decided here: only their rejected rows go to Spark
    rejected = _frame(spark, _parsed_rejected(parsed))
    later = _frame(spark, _decided_rejected(classified)) if classified is not None and decided else None
    names = rows_frame(spark, [(index, rel, files[index][1] == "parquet") for index, rel in enumerate(sources)],
                       pa.schema([("file", pa.int32()), ("source", pa.string()), ("is_row", pa.bool_())]))
    if later is not None:
        texts = later.select("seq", F.expr(file_of_sql("seq")).alias("file")).repartition("file").mapInArrow(
            _text_reader(files), "seq bigint, raw string")
        rejected = rejected.unionByName(later.join(texts, "seq"))
    pos_col = F.col("seq").bitwiseAND(F.lit(MAX_POS))
    frame = rejected.withColumn("file", F.expr(file_of_sql("seq"))).join(F.broadcast(names), "file").select(
        "seq",
        F.lit(run).cast("bigint").alias("run"),
        "source",
        F.when(~F.col("is_row"), pos_col).alias("line"),
        F.when(F.col("is_row"), pos_col).alias("row"),
        F.col("part").alias("partition"),
        "offset",
        "reason",
        "raw",
        "detail",
        F.lit(ingested_at).alias("ingested_at"),
    )
    commit_side(store_path, REJECTED_DIR, state, frame.repartition(1).sortWithinPartitions("seq"), empty=False)


def write_source_rejected(spark: SparkSession, parsed: DataFrame | pa.Table, classified: DataFrame | pa.Table | None,
                          store_path: str, state: StoreState, source: str, decided: int = 0,
                          total: int | None = None) -> None:
    """The run's rejected records for a source whose parsed records all carry their text
    (``raw``; Kafka: a record cannot be read again from a file), named ``source`` with their
    partition and offset (no line or row). Written like ``write_rejected``; ``parsed`` and
    ``classified`` are Arrow tables in a run read and decided in this process
    (``kafka.read_here``): the same rows, assembled here."""
    if total == 0:
        _none_rejected(spark, store_path, state)
        return
    if isinstance(parsed, pa.Table):
        parts = [_arrow(_parsed_rejected(parsed))]
        if classified is not None and decided:
            texts: pa.Table = parsed.select(["seq", "raw"])
            parts.append(_arrow(_decided_rejected(classified)).join(texts, "seq").select(parts[0].column_names))
        table = pa.concat_tables([t.cast(parts[0].schema) for t in parts]).sort_by("seq")
        rows = table.num_rows
        ingested = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        out = pa.table({
            "run": pa.array(np.full(rows, state.run), pa.int64()), "source": pa.array([source] * rows, pa.string()),
            "line": pa.nulls(rows, pa.int64()), "row": pa.nulls(rows, pa.int64()), "partition": table.column("part"),
            "offset": table.column("offset"), "reason": table.column("reason"), "raw": table.column("raw"),
            "detail": table.column("detail"), "ingested_at": pa.array([ingested] * rows, pa.string())})
        commit_side(store_path, REJECTED_DIR, state, local_frame(spark, out), empty=False)
        return
    assert classified is None or isinstance(classified, DataFrame)
    rejected = parsed.filter(F.col("reason").isNotNull()).select("seq", "part", "offset", "reason", "detail", "raw")
    if classified is not None and decided:
        later = classified.filter(F.col("outcome") != "accepted").select(
            "seq", "part", "offset", F.col("outcome").alias("reason"), "detail")
        rejected = rejected.unionByName(later.join(parsed.select("seq", "raw"), "seq"))
    ingested_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    frame = rejected.select(
        "seq", F.lit(state.run).cast("bigint").alias("run"), F.lit(source).alias("source"),
        F.lit(None).cast("bigint").alias("line"), F.lit(None).cast("bigint").alias("row"),
        F.col("part").alias("partition"), "offset", "reason", "raw", "detail", F.lit(ingested_at).alias("ingested_at"))
    commit_side(store_path, REJECTED_DIR, state, frame.repartition(1).sortWithinPartitions("seq"), empty=False)


def _none_rejected(spark: SparkSession, store_path: str, state: StoreState) -> None:
    """A run without rejections: nothing to add, but an unfinished attempt's rows are replaced."""
    commit_side(store_path, REJECTED_DIR, state, local_frame(spark, REJECTED_SCHEMA.empty_table()), empty=True)


def _parsed_rejected(parsed: DataFrame | pa.Table) -> DataFrame | pa.Table:
    """The records the parser rejected, with their ``reason``, ``detail`` and text."""
    columns = ["seq", "part", "offset", "reason", "detail", "raw"]
    if isinstance(parsed, pa.Table):
        return parsed.filter(pc.is_valid(parsed.column("reason"))).select(columns)
    return parsed.filter(F.col("reason").isNotNull()).select(*columns)


def _decided_rejected(classified: DataFrame | pa.Table) -> DataFrame | pa.Table:
    """The records the run's decisions rejected, with ``reason`` (their outcome) and ``detail``."""
    if isinstance(classified, pa.Table):
        return classified.filter(pc.not_equal(classified.column("outcome"), "accepted")).select(
            ["seq", "part", "offset", "outcome", "detail"]).rename_columns({"outcome": "reason"})
    return classified.filter(F.col("outcome") != "accepted").select(
        "seq", "part", "offset", F.col("outcome").alias("reason"), "detail")


def _arrow(rows: DataFrame | pa.Table) -> pa.Table:
    return rows if isinstance(rows, pa.Table) else rows.toArrow()


def _frame(spark: SparkSession, rows: DataFrame | pa.Table) -> DataFrame:
    return spread_frame(spark, rows) if isinstance(rows, pa.Table) else rows


_TEXT_SCHEMA = pa.schema([pa.field("seq", pa.int64()), pa.field("raw", pa.string())])


def _read_texts(files: list[tuple[str, str]], seqs: Any) -> Iterator[pa.RecordBatch]:
    """(seq, raw) batches of at most ``BATCH_ROWS`` for the records ``seqs`` (a numpy array),
    read from their files (``files[i]``: path and format of file index i)."""
    seqs = np.unique(seqs)  # sorted: each file's positions ascending; 8 bytes per record
    files_of, _ = split_seq(seqs)
    for file in np.unique(files_of):
        base = file_seq_base(int(file))
        full, file_fmt = files[int(file)]
        out_seq: list[int] = []
        out_raw: list[str] = []
        for pos, text in raw_texts(full, file_fmt, (seqs[files_of == file] - base).tolist()):
            out_seq.append(base + pos)
            out_raw.append(text)
            if len(out_seq) == BATCH_ROWS:
                yield pa.RecordBatch.from_pydict({"seq": out_seq, "raw": out_raw}, schema=_TEXT_SCHEMA)
                out_seq, out_raw = [], []
        if out_seq:
            yield pa.RecordBatch.from_pydict({"seq": out_seq, "raw": out_raw}, schema=_TEXT_SCHEMA)


def _text_reader(files: list[tuple[str, str]]):  # type: ignore[no-untyped-def]
    """mapInArrow function: (seq, file) rows -> (seq, raw), ``_read_texts`` on an executor."""

    def read(batches):  # type: ignore[no-untyped-def]
        columns = [batch.column(0) for batch in batches]
        if columns:
            yield from _read_texts(files, pa.concat_arrays(columns).to_numpy())

    return read
