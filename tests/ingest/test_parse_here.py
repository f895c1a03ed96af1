"""A run of up to ``PARSE_HERE_BYTES`` of text files, small or not, parses its files in its own
process (``parse.parse_here``) and takes its parse statistics from the Arrow table
(``pipeline._parse_stats_here``); another parses in Spark tasks (``parse.parse_files``) and
aggregates in Spark (``pipeline._parse_stats``). Both must give the same rows and the same
figures for any input: random files of valid records, broken lines, records naming partitions
(some out of range) and offsets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame

import versiq.ingest.parse as parse_module
from tests.support.ingest import write_jsonl
from versiq.ingest.parse import parse_files, parse_here, parse_run
from versiq.ingest.pipeline import RUN_KEYS, _parse_stats, _parse_stats_here
from versiq.ingest.plan import PARSE_HERE_BYTES, PARSE_HERE_BYTES_ENV, choose_plan, parses_here
from versiq.ingest.reports import StoreReport
from versiq.ingest.spark import INTERPRETED_RUN_BYTES, INTERPRETED_RUN_BYTES_ENV, SparkOnDemand, start_soon
from versiq.layout import MURMUR2, Partitioning


@st.composite
def lines(draw) -> list[str]:
    out = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["record", "record", "record", "broken", "blank", "no_key"]))
        if kind == "broken":
            out.append("{not json")
        elif kind == "blank":
            out.append("")
        elif kind == "no_key":
            out.append(json.dumps({"value": 1, "timestamp": 5}))
        else:
            record: dict[str, object] = {"key": draw(st.sampled_from(["a", "b", "c", "dé", "e"])),
                                         "value": draw(st.sampled_from([1, "x", None, {"n": 2}])),
                                         "timestamp": draw(st.integers(0, 50))}
            if draw(st.booleans()):
                record["partition"] = draw(st.integers(0, 4))  # 3 and 4 are out of range
            if draw(st.booleans()):
                record["offset"] = draw(st.integers(0, 9))
            out.append(json.dumps(record))
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(lines(), min_size=1, max_size=3), st.sampled_from([1, 3]), st.booleans())
def test_a_run_parsed_here_has_the_rows_and_figures_of_one_parsed_by_spark(spark, tmp_path_factory, files,
                                                                          partitions, keys):
    folder = tmp_path_factory.mktemp("parse-here")
    new = {f"f{i}.jsonl": write_jsonl(str(folder), f"f{i}.jsonl", body) for i, body in enumerate(files)}
    here = parse_here(new, None, Partitioning(partitions, MURMUR2))
    there = parse_files(spark, new, None, Partitioning(partitions, MURMUR2))
    assert here.schema.names == there.columns
    assert here.sort_by("seq").to_pylist() == there.toArrow().cast(here.schema).sort_by("seq").to_pylist()

    report_here, report_there = StoreReport(), StoreReport()
    got = _parse_stats_here(here, report_here, keys=keys)
    want = _parse_stats(there, report_there, None, keys=keys)
    assert got[0] == want[0]
    if keys:  # each valid record's key with the smallest timestamp of its records
        valid = [r for r in here.to_pylist() if r["reason"] is None]
        from_ts = {r["key"]: min(v["ts"] for v in valid if v["key"] == r["key"]) for r in valid}
        for run_keys in (got[1], want[2]):
            assert run_keys is not None and run_keys.schema == RUN_KEYS
            assert dict(zip(run_keys.column("key").to_pylist(), run_keys.column("from_ts").to_pylist(),
                            strict=True)) == from_ts
            assert run_keys.num_rows == len(from_ts)
    else:
        assert got[1] is None and want[2] is None
    assert (report_here.read, report_here.rejected, report_here.skipped) == \
        (report_there.read, report_there.rejected, report_there.skipped)


def test_which_runs_parse_here(monkeypatch):
    """Runs of text files up to ``PARSE_HERE_BYTES``, small or not (with a cluster's master, small
    runs only); not Parquet (a few MB on disk can hold millions of rows), not a run beyond the
    limit, not a run whose size is unknown (S3 sources); ``VERSIQ_PARSE_HERE_BYTES`` sets the
    limit (0: none, not even an empty run)."""
    monkeypatch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
    monkeypatch.delenv(INTERPRETED_RUN_BYTES_ENV, raising=False)
    files = {"a.jsonl": "/x/a.jsonl", "b.csv": "/x/b.csv"}
    assert parses_here(files, None, 1000)
    assert parses_here(files, None, INTERPRETED_RUN_BYTES + 1)  # beyond a small run
    assert parses_here(files, None, PARSE_HERE_BYTES)
    assert not parses_here(files, None, PARSE_HERE_BYTES + 1)
    assert not parses_here(files, None, None)
    assert not parses_here({**files, "c.parquet": "/x/c.parquet"}, None, 1000)
    assert not parses_here(files, "parquet", 1000)
    assert parses_here(files, None, INTERPRETED_RUN_BYTES, local_master=False)
    assert not parses_here(files, None, INTERPRETED_RUN_BYTES + 1, local_master=False)
    monkeypatch.setenv(PARSE_HERE_BYTES_ENV, "0")
    assert not parses_here(files, None, 1000) and not parses_here(files, None, 0)
    monkeypatch.setenv(PARSE_HERE_BYTES_ENV, "2000")
    assert parses_here(files, None, 2000) and not parses_here(files, None, 2001)


def test_a_run_beyond_a_small_run_parses_here(spark, tmp_path, monkeypatch):
    """``parse_run`` of a run larger than a small run (planned with generated code): an Arrow
    table parsed here, up to ``VERSIQ_PARSE_HERE_BYTES``; beyond it, Spark's rows."""
    monkeypatch.setenv(INTERPRETED_RUN_BYTES_ENV, "10")  # every run below is larger than a small run
    monkeypatch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
    path = write_jsonl(str(tmp_path), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}', "{broken"])
    files, size = {"a.jsonl": path}, os.path.getsize(path)
    table, plan = parse_run(spark, choose_plan(spark, files, None, size), files, None, Partitioning(1, MURMUR2), None)
    assert isinstance(table, pa.Table) and plan.decide == "duckdb"
    assert table.column("reason").to_pylist() == [None, "malformed"]
    monkeypatch.setenv(PARSE_HERE_BYTES_ENV, str(size - 1))
    frame, plan = parse_run(spark, choose_plan(spark, files, None, size), files, None, Partitioning(1, MURMUR2), None)
    assert isinstance(frame, DataFrame) and plan.decide == "spark"
    assert sorted(r["reason"] or "" for r in frame.collect()) == ["", "malformed"]


def test_a_run_of_more_records_than_parse_here_rows_is_parsed_by_spark(spark, tmp_path, monkeypatch):
    """Few bytes can hold many records: past ``PARSE_HERE_ROWS`` the parse here stops and Spark
    tasks parse the files, giving the same rows."""
    monkeypatch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
    lines = [json.dumps({"key": f"k{i}", "value": i, "timestamp": i}) for i in range(5)]
    files = {"a.jsonl": write_jsonl(str(tmp_path), "a.jsonl", lines[:3]),
             "b.jsonl": write_jsonl(str(tmp_path), "b.jsonl", lines[3:])}
    assert parse_here(files, None, Partitioning(1, MURMUR2), max_rows=5) is not None
    assert parse_here(files, None, Partitioning(1, MURMUR2), max_rows=4) is None
    monkeypatch.setattr(parse_module, "PARSE_HERE_ROWS", 4)
    planned = choose_plan(spark, files, None, 100)
    assert planned.parse == "driver"
    frame, plan = parse_run(spark, planned, files, None, Partitioning(1, MURMUR2), None)
    assert isinstance(frame, DataFrame) and plan.parse == "spark" and plan.decide == "spark"
    assert sorted(r["key"] for r in frame.collect()) == [f"k{i}" for i in range(5)]


def test_an_empty_run_parsed_here_is_an_empty_table(tmp_path):
    path = write_jsonl(str(tmp_path), "a.jsonl", ["", "  "])
    table = parse_here({"a.jsonl": path}, None, Partitioning(1, MURMUR2))
    assert table.num_rows == 0 and isinstance(table, pa.Table)


def test_a_session_started_early_that_fails_fails_the_run_that_uses_it():
    """``start_soon`` starts the session on a thread of its own; what went wrong there is raised
    where the run first uses the session, and stopping the never-started session is quiet."""
    calls = []

    def refuse() -> None:
        import threading

        calls.append(threading.current_thread().name)
        raise RuntimeError("no JVM today")

    on_demand = SparkOnDemand(on_start=refuse)
    start_soon(on_demand.as_session())
    start_soon(on_demand.as_session())  # once only
    with pytest.raises(RuntimeError, match="no JVM today"):
        on_demand()
    on_demand.stop()
    assert len(calls) == 1 and calls[0].startswith("versiq-spark-start")


_EARLY_SESSION = """
import json
from versiq.ingest.spark import SparkOnDemand, plans_for_input, start_soon

on_demand = SparkOnDemand("local[1]")
start_soon(on_demand.as_session())
spark = on_demand()
jvm = spark._jvm
with plans_for_input(spark, 100):  # a small run: adaptive execution off in the session
    conf = jvm.org.apache.spark.sql.internal.SQLConf.get()
    print(json.dumps({"active": jvm.org.apache.spark.sql.SparkSession.getActiveSession().isDefined(),
                      "adaptive": conf.adaptiveExecutionEnabled()}))
on_demand.stop()
"""


def test_a_session_started_early_is_the_active_session_of_the_run_that_uses_it(tmp_path):
    """The JVM keeps the active session per thread, and Spark reads a run's settings (a small
    run's, ``plans_for_input``) from the calling thread's active session: a session made on
    the start thread (``start_soon``) must be the active one of the thread that runs the run,
    or that run plans with Spark's defaults."""
    done = subprocess.run([sys.executable, "-c", _EARLY_SESSION], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                                             "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"active": True, "adaptive": False}


def test_a_runs_plan_is_chosen_once_and_says_what_the_run_does(spark, tmp_path, monkeypatch):
    """``plan.choose_plan``: where a run parses and who decides, from its size and the process
    it runs in."""
    monkeypatch.delenv(PARSE_HERE_BYTES_ENV, raising=False)
    monkeypatch.delenv(INTERPRETED_RUN_BYTES_ENV, raising=False)
    path = write_jsonl(str(tmp_path), "a.jsonl", [json.dumps({"key": f"k{i}", "value": i, "timestamp": i})
                                                  for i in range(50)])
    files, size = {"a.jsonl": path}, os.path.getsize(path)
    plan = choose_plan(spark, files, None, size)
    assert (plan.parse, plan.decide, plan.small) == ("driver", "duckdb", True)
    assert plan.describe() == "parse in the driver, decide with DuckDB, write with Spark (a small run)"
    assert choose_plan(spark, None, None, 10 ** 9).describe() == "parse, decide and write with Spark"
    assert choose_plan(spark, files, None, None).parse == "spark"  # size unknown (S3)
    monkeypatch.setenv(PARSE_HERE_BYTES_ENV, "0")
    assert choose_plan(spark, files, None, size).describe() == "parse, decide and write with Spark (a small run)"
    monkeypatch.delenv(PARSE_HERE_BYTES_ENV)
    one_shot = SparkOnDemand("local[1]")  # a one-shot CLI run's session, on demand: the same plan
    plan = choose_plan(one_shot.as_session(), files, None, size)
    assert plan.describe() == "parse in the driver, decide with DuckDB, write with Spark (a small run)"
    one_shot.stop()  # never started
