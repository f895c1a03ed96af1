"""Progress of a long ingest on stderr (ingest/progress.py): a line when Spark starts, then, while
a phase lasts, the phase again with its duration and Spark's task progress; off when stderr is
not a terminal unless asked."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import time

import pytest

from tests.support.ingest import write_jsonl
from versiq.ingest.progress import DEFAULT_INTERVAL_S, Heartbeat, interval_from


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_option():
    assert interval_from("auto", io.StringIO()) is None  # a file or a pipe: one line per phase only
    assert interval_from("auto", _Terminal()) == DEFAULT_INTERVAL_S
    assert interval_from("off", _Terminal()) is None
    assert interval_from("2s") == 2.0
    assert interval_from("500ms") == 0.5
    for bad in ("soon", "0s", "-1s"):
        with pytest.raises(ValueError, match="--progress"):
            interval_from(bad)


def _slow_partition(rows):
    time.sleep(1.0)
    yield from rows


def test_a_silent_phase_is_repeated_with_its_duration_and_sparks_tasks(spark, caplog):
    """While a Spark job runs without a new log line, the heartbeat names the latest phase, how
    long it has lasted and the job's stage progress; a new phase line resets it; nothing after
    the block ends."""
    phase_log = logging.getLogger("versiq.ingest.pipeline")
    with caplog.at_level(logging.INFO, logger="versiq.ingest"):
        with Heartbeat(0.4, lambda: spark):
            phase_log.info("store s: 10 accepted, 0 rejected; writing")
            spark.sparkContext.parallelize(range(8), 4).mapPartitions(_slow_partition).count()
        ended = len(caplog.records)
        time.sleep(1.0)
    beats = [r.getMessage() for r in caplog.records if r.name == "versiq.ingest.progress"]
    assert beats, [r.getMessage() for r in caplog.records]
    assert all(b.startswith("still busy (") and "since: store s: 10 accepted, 0 rejected; writing)" in b
               for b in beats), beats
    assert any("; Spark: stage " in b and "/4 tasks (" in b for b in beats), beats
    assert len(caplog.records) == ended  # the heartbeat stopped with the block


def test_cli_ingest_says_spark_is_starting_and_beats(tmp_path):
    """`versiq ingest --progress 1s` (stderr is a pipe here, so only when asked): the Spark start
    is announced and a silent phase is repeated."""
    write_jsonl(str(tmp_path / "in"), "a.jsonl", ['{"key":"a","value":1,"timestamp":1000}'])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "VERSIQ_SHUFFLE_PARTITIONS": "2"}
    env.pop("SPARK_MASTER", None)
    done = subprocess.run([sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", str(tmp_path / "wh"),
                           "--store", "s", "--source", str(tmp_path / "in"), "--progress", "1s"],
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "store s: run 1 over 1 new file: parse in the driver, decide with DuckDB, write with Spark (a small run)" \
        in done.stderr  # the run's plan, once
    assert "starting Spark (local[*]) ..." in done.stderr
    assert "Spark ready in " in done.stderr
    assert "still busy (" in done.stderr, done.stderr
