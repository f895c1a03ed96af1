"""``ingest.decisions_here``: a run parsed in this process is decided by DuckDB here, and must
decide exactly as Spark does (``ingest.semantics``), column for column, detail texts included:
random runs (partitions named or not, offsets, duplicates, late records, stored versions, state
of earlier runs) are classified by both, and their store rows compared. The reference model
checks both against the rules (``test_ingest_property``); this checks them against each other
on what the model does not see (details, stream time of rejected records, every column)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from versiq.ingest.decisions_here import CLASSIFIED_SCHEMA, classify_here, rows_to_write_here, task_frame
from versiq.ingest.order import POS_BITS, RUN_SCHEMA
from versiq.ingest.semantics import RunContext, classify, rows_to_write, stored_homes
from versiq.ingest.spark import LOCAL_RELATION_BYTES, local_relation_bytes
from versiq.layout import MURMUR2, PARTITIONERS, STORE_SCHEMA, StoreSettings, StoreState, default_partition_of

#: A stream time far past what Spark's ``timestamp_millis`` can convert (about year 294,000).
HUGE_TS = 1 << 62

EXISTING_SCHEMA = pa.schema([f for f in STORE_SCHEMA if f.name != "bucket"])


def _run(kind: str, partitions: int, buckets: int, retention: int, records: list[tuple],
         stored: dict[str, list[tuple]], stream_time: dict[int, int], max_offset: dict[int, int],
         partitioner: str = MURMUR2) -> tuple[StoreSettings, StoreState, pa.Table, pa.Table]:
    """(settings, state, parsed, existing) of a run: ``records`` (key, value, ts, partition,
    offset, file index) in processing order, a record without a key one the parser rejected;
    ``stored``: per key its versions' (ts, value) and their partition last."""
    store = StoreSettings(kind=kind, partitions=partitions, buckets=buckets, history_retention_ms=retention,
                          partitioner=partitioner)
    seqs = [(file << POS_BITS) | pos for pos, (*_, file) in enumerate(records, start=1)]
    n = len(records)
    parsed = pa.table({
        "seq": pa.array(seqs, pa.int64()), "key": [r[0] for r in records], "value": [r[1] for r in records],
        "ts": pa.array([None if r[0] is None else r[2] for r in records], pa.int64()),
        "part": pa.array([r[3] for r in records], pa.int64()), "offset": pa.array([r[4] for r in records], pa.int64()),
        "reason": pa.array([None if r[0] is not None else "no_key" for r in records], pa.string()),
        "detail": pa.nulls(n, pa.string()), "raw": pa.nulls(n, pa.string()), "fst": pa.nulls(n, pa.int64())},
        schema=RUN_SCHEMA)
    rows = []
    for key, (*versions, home) in stored.items():
        versions = sorted(versions)
        for i, (ts, value) in enumerate(versions):
            valid_to = versions[i + 1][0] if i + 1 < len(versions) and kind == "versioned" else None
            rows.append((key, ts, valid_to, value, value is None, home, 1))
    existing = pa.table(list(zip(*rows, strict=True)) if rows else [[] for _ in EXISTING_SCHEMA],
                        schema=EXISTING_SCHEMA)
    return store, StoreState(run=1, stream_time=stream_time, max_offset=max_offset), parsed, existing


@st.composite
def runs(draw):  # type: ignore[no-untyped-def]
    """A random ``_run``: few keys, timestamps and offsets, so that records meet stored versions,
    each other and the state; a key's stored versions are mostly in its default partition."""
    kind = draw(st.sampled_from(["versioned", "timestamped"]))
    partitions = draw(st.integers(1, 3))
    partitioner = draw(st.sampled_from(PARTITIONERS))
    keys = ["a", "b", "c", "é", "key-😀-1234567"]
    stamps = st.sampled_from([*range(21), HUGE_TS])
    values = st.one_of(st.none(), st.text("xyz", max_size=3))
    named = draw(st.booleans())
    offsets = draw(st.booleans())
    records = draw(st.lists(st.tuples(
        st.sampled_from([*keys, None]), values, stamps,
        st.one_of(st.none(), st.integers(0, partitions)) if named else st.none(),
        st.one_of(st.none(), st.integers(0, 6)) if offsets else st.none(),
        st.integers(0, 2)), max_size=40))
    stored = {}
    for key in keys:
        # a timestamped store holds one value per key
        stamps_stored = draw(st.sets(st.integers(0, 20), max_size=3 if kind == "versioned" else 1))
        home = draw(st.sampled_from([default_partition_of(key, partitions, partitioner), *range(partitions)]))
        stored[key] = [*((ts, draw(values)) for ts in stamps_stored), home]
    parts = st.integers(0, partitions - 1)
    return _run(kind, partitions, draw(st.integers(1, 4)), draw(st.sampled_from([0, 5, 40])), records, stored,
                draw(st.dictionaries(parts, st.integers(0, 20))), draw(st.dictionaries(parts, st.integers(0, 6))),
                partitioner)


#: Records at a stored version's timestamp (one replacing it, one between versions, one late).
STORED_HIT = _run("versioned", 1, 2, 40, [("a", "new", 10, None, None, 0), ("a", "x", 7, None, None, 0),
                                          ("b", None, 3, None, None, 1), ("a", "y", 12, None, 2, 1)],
                  {"a": [(5, "five"), (10, "ten"), 0], "b": [(3, "three"), 0]}, {0: 8}, {})


def _spark_decisions(spark, ctx: RunContext, parsed: pa.Table, existing: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``classify`` and ``rows_to_write`` as ``pipeline._decide_and_commit`` calls them."""
    good = spark.createDataFrame(parsed).filter(F.col("reason").isNull()).select(
        "seq", "fst", "key", "value", "ts", "part", "offset")
    stored = spark.createDataFrame(existing)
    homes = spark.createDataFrame(stored_homes(existing)) if existing.num_rows else None
    classified = classify(spark, good, stored, ctx, homes)
    rows = rows_to_write(classified, stored, ctx, existing_empty=existing.num_rows == 0)
    return classified.toArrow().cast(CLASSIFIED_SCHEMA), rows.toArrow()


def _sorted(table: pa.Table, by: list[str]) -> list[dict]:
    return table.sort_by([(name, "ascending") for name in by]).to_pylist()


@pytest.mark.rule(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 19, 20, 21)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
@example(STORED_HIT)
def test_decided_here_as_spark_decides(spark, run):
    store, state, parsed, existing = run
    valid = parsed.filter(parsed.column("reason").is_null())
    ctx = RunContext(store, state, 2, explicit_partitions=valid.column("part").null_count < valid.num_rows,
                     any_offsets=valid.column("offset").null_count < valid.num_rows, tasks=2)
    want_classified, want_rows = _spark_decisions(spark, ctx, parsed, existing)
    got_classified = classify_here(parsed, existing, ctx)
    assert _sorted(got_classified, ["seq"]) == _sorted(want_classified, ["seq"])
    got_rows = rows_to_write_here(got_classified, existing, store, 2).select(want_rows.column_names)
    assert _sorted(got_rows.cast(want_rows.schema), ["key", "valid_from"]) == _sorted(want_rows, ["key", "valid_from"])


def test_a_late_record_below_a_huge_stream_time_is_detailed(spark):
    """A stream time past what Spark's timestamps hold is written as milliseconds in the
    detail (it failed Spark's run with a long overflow), by both engines."""
    store = StoreSettings(kind="versioned", partitions=1, buckets=1, history_retention_ms=0)
    parsed = pa.table({"seq": pa.array([1, 2], pa.int64()), "key": ["k", "k"], "value": ["1", "2"],
                       "ts": pa.array([HUGE_TS, 7], pa.int64()), "part": pa.nulls(2, pa.int64()),
                       "offset": pa.nulls(2, pa.int64()), "reason": pa.nulls(2, pa.string()),
                       "detail": pa.nulls(2, pa.string()), "raw": pa.nulls(2, pa.string()),
                       "fst": pa.nulls(2, pa.int64())}, schema=RUN_SCHEMA)
    ctx = RunContext(store, StoreState(), 1, explicit_partitions=False, any_offsets=False, tasks=1)
    existing = EXISTING_SCHEMA.empty_table()
    for classified in (_spark_decisions(spark, ctx, parsed, existing)[0], classify_here(parsed, existing, ctx)):
        late = classified.filter(pc.equal(classified.column("outcome"), "late")).to_pylist()
        assert [row["detail"] for row in late] == [
            f"timestamp 1970-01-01T00:00:00.007Z (7) is older than stream time {HUGE_TS} ms since the epoch "
            f"minus history retention 0ms (horizon {HUGE_TS} ms since the epoch)"]


@pytest.mark.parametrize("value_bytes", [400, 1], ids=["batches", "shuffled"])
def test_task_frame_holds_whole_buckets(spark, value_bytes):
    """Every bucket in one partition, bucket b in partition b mod tasks (the writer cuts a file
    per bucket and task), with rows Spark gets as Arrow batches (each task's rows one batch),
    or shuffled into place when some task's rows are few enough to be a local relation."""
    rows = 600
    table = pa.table({"bucket": pa.array([i % 16 for i in range(rows)], pa.int32()),
                      "value": ["v" * value_bytes] * rows})
    tasks = 6
    before = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    frame = task_frame(spark, table, tasks)
    assert spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") == before
    placed = {(row["bucket"], row["task"]) for row in frame.select("bucket", F.spark_partition_id().alias("task"))
              .distinct().collect()}
    assert frame.rdd.getNumPartitions() == tasks
    assert placed == {(b, b % tasks) for b in range(16)}
    assert frame.count() == rows
    if value_bytes > 1:
        assert 400 * rows // tasks > LOCAL_RELATION_BYTES  # the batch path was taken


@pytest.mark.parametrize(("text", "size"), [("32768", 32768), ("48MB", 48 << 20), ("1g", 1 << 30)])
def test_the_sessions_local_relation_threshold_is_read(spark, text, size):
    """``task_frame`` compares a task's rows with the session's own threshold (Spark's default
    is 48 MB in a session ``run_ingest`` did not make)."""
    name = "spark.sql.execution.arrow.localRelationThreshold"
    before = spark.conf.get(name)
    try:
        spark.conf.set(name, text)
        assert local_relation_bytes(spark) == size
    finally:
        spark.conf.set(name, before)


def test_a_skipped_row_of_a_run_decided_here_is_counted_not_rejected(spark, tmp_path, monkeypatch):
    """A parser's ``skipped`` rows (a Debezium delete's null-value marker, ``kafka_rows.SKIPPED``)
    are counted apart and never written to ``_rejected``, whichever engine decides the run."""
    import versiq.ingest.pipeline as pipeline
    from tests.support.ingest import write_jsonl
    from versiq.ingest.records.kafka_rows import SKIPPED, SKIPPED_DETAIL
    from versiq.rejected import committed_rejected

    real_parse_run = pipeline.parse_run

    def with_a_skipped_row(*args, **kwargs):  # type: ignore[no-untyped-def]
        table, plan = real_parse_run(*args, **kwargs)
        assert isinstance(table, pa.Table) and plan.decide == "duckdb"  # a run parsed here
        row = {name: None for name in RUN_SCHEMA.names} | {"seq": 99, "reason": SKIPPED, "detail": SKIPPED_DETAIL}
        return pa.concat_tables([table, pa.Table.from_pylist([row], schema=RUN_SCHEMA)]), plan

    monkeypatch.setattr(pipeline, "parse_run", with_a_skipped_row)
    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}', "{broken"])
    report = pipeline.run_ingest(spark, str(tmp_path / "wh"), [pipeline.StoreSpec("s", str(src))])
    entry = report.stores["s"]
    assert entry.error is None, entry.error
    assert entry.skipped == {SKIPPED: 1} and {k: n for k, n in entry.rejected.items() if n} == {"malformed": 1}
    assert committed_rejected(str(tmp_path / "wh" / "s"), 1).column("reason").to_pylist() == ["malformed"]
