"""Continuous mode compacts beside its runs (``maintain.Compactor``): a run and a compaction of
one store share the writer lock inside the process, and whatever a run commits while a
compaction is under way is still in the store after it."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from tests.support.ingest import record_line, records_from, store_versions, write_jsonl
from versiq.ingest import maintain
from versiq.ingest.errors import LockTimeout
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.store import COMPACTION, EXCLUSIVE, RUN, writer_lock
from versiq.layout import LOCK_FILE, PRIVATE_DIR


def _other_process_could_lock(store: str) -> bool:
    """Whether another holder of the lock file (an open file of its own, as another process
    has) could take the store's lock now."""
    with open(os.path.join(store, PRIVATE_DIR, LOCK_FILE), "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return True


def test_a_run_and_a_compaction_hold_the_lock_together_and_nothing_else_does(tmp_path):
    store = str(tmp_path / "s")
    run_in, run_out = threading.Event(), threading.Event()

    def run() -> None:
        with writer_lock(store, 5, RUN):
            run_in.set()
            run_out.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    assert run_in.wait(10)
    with writer_lock(store, 0.5, COMPACTION):  # beside the run, at once
        assert not _other_process_could_lock(store)
        with pytest.raises(LockTimeout, match="another writer of this process"):
            with writer_lock(store, 0.3, RUN):  # a second run of the store waits for the first
                pass
        with pytest.raises(LockTimeout):
            with writer_lock(store, 0.3, EXCLUSIVE):  # an erase or a drop waits for both
                pass
        run_out.set()
        thread.join(10)
        assert not _other_process_could_lock(store)  # the compaction still holds it
    assert _other_process_could_lock(store)  # given back by the last of them
    with writer_lock(store, 0.5, EXCLUSIVE):
        with pytest.raises(LockTimeout):
            with writer_lock(store, 0.3, COMPACTION):
                pass


def _runs(n: int) -> list[list[str]]:
    """``n`` runs of 40 records each over 12 keys, every run rewriting earlier versions' ends."""
    out = []
    for r in range(n):
        specs = [(f"k{(r * 7 + i) % 12:02d}", f'{{"r":{r},"i":{i}}}', 100 * r + (i * 37) % 90) for i in range(40)]
        out.append([record_line(rec) for rec in records_from(f"r{r:02d}.jsonl", specs)])
    return out


@pytest.mark.parametrize("how", ["merge", "whole"])
def test_a_run_that_commits_while_a_compaction_is_under_way_stays_in_the_store(spark, tmp_path, monkeypatch, how):
    """The compaction plans from one snapshot; a run of this process then commits (it shares the
    lock); the compaction's write comes after. Its merge (Delta's OPTIMIZE) or whole rewrite
    (rows read inside its own write) keeps the run's versions: the store equals the same runs
    ingested without compaction. A whole rewrite of rows read before its write would remove the
    run's file."""
    warehouse = str(tmp_path / "wh")
    src, plain_src = tmp_path / "src", tmp_path / "plain"
    src.mkdir()
    plain_src.mkdir()
    runs = _runs(6)

    def run(name: str, folder, r: int) -> None:
        write_jsonl(str(folder), f"r{r:02d}.jsonl", runs[r])
        report = run_ingest(spark, warehouse, [StoreSpec(name, str(folder), buckets=1)]).stores[name]
        assert report.error is None, report.error

    for r in range(5):
        run("c", src, r)
        run("plain", plain_src, r)
    planned = maintain.plan_compaction
    beside: list[int] = []

    def plan_then_a_run(handle, **kwargs):  # type: ignore[no-untyped-def]
        plan = planned(handle, **kwargs)
        run("c", src, 5)  # a run of the store beside the compaction, before its write
        beside.append(len(plan.buckets))
        return plan

    monkeypatch.setattr(maintain, "plan_compaction", plan_then_a_run)
    result = maintain.maintain_store(warehouse, "c", spark=lambda: spark, recent_only=True,
                                     rewrite_share=1e9 if how == "merge" else 0.0)
    run("plain", plain_src, 5)
    assert beside == [1]
    assert (result["buckets_merged"], result["buckets_rewritten"]) == ((1, 0) if how == "merge" else (0, 1))
    assert store_versions(os.path.join(warehouse, "c")) == store_versions(os.path.join(warehouse, "plain"))


def test_the_compactor_compacts_beside_runs_and_a_failure_stops_no_run(spark, tmp_path, monkeypatch):
    """``Compactor.request`` compacts on its own thread while the runs go on; a store it cannot
    compact (here: a table whose Delta log cannot be read) is reported by the caller's function
    and the runs go on; the store equals the same runs ingested without compaction."""
    from deltalake import DeltaTable

    warehouse = str(tmp_path / "wh")
    src = tmp_path / "src"
    src.mkdir()
    runs = _runs(8)
    monkeypatch.setattr(maintain, "COMPACT_FILES_PER_BUCKET", 2)
    broken = tmp_path / "wh" / "broken" / "_delta_log"
    broken.mkdir(parents=True)
    (broken / f"{0:020d}.json").write_text("not a Delta commit\n")
    failures: list[str] = []
    compactor = maintain.Compactor(spark, warehouse, 30, lambda what, exc: failures.append(what))
    try:
        for r in range(8):
            write_jsonl(str(src), f"r{r:02d}.jsonl", runs[r])
            report = run_ingest(spark, warehouse, [StoreSpec("c", str(src), buckets=1)]).stores["c"]
            assert report.error is None, report.error
            compactor.request(["broken", "c"])
        thread = compactor._thread
        assert thread is not None
        thread.join(120)
    finally:
        compactor.close()
    assert failures and set(failures) == {"maintenance of broken failed"}
    history = DeltaTable(os.path.join(warehouse, "c")).history()
    compactions = [h for h in history if h["isolationLevel"] == "SnapshotIsolation"]  # changes no data
    assert compactions and all("userMetadata" not in h for h in compactions)
    expected = tmp_path / "expected"
    expected.mkdir()
    for r in range(8):
        write_jsonl(str(expected), f"r{r:02d}.jsonl", runs[r])
    assert run_ingest(spark, warehouse, [StoreSpec("e", str(expected), buckets=1)]).stores["e"].error is None
    assert store_versions(os.path.join(warehouse, "c")) == store_versions(os.path.join(warehouse, "e"))


_STOPPED_UNDER_A_COMPACTION = """
import logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
from tests.support.ingest import write_jsonl
from tests.ingest.test_compaction_beside import _runs
from versiq.ingest import maintain
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.spark import get_spark

warehouse, src = sys.argv[1], sys.argv[2]
os.makedirs(src)
spark = get_spark("local[1]")
runs = _runs(3)
for r in range(3):
    write_jsonl(src, f"r{r:02d}.jsonl", runs[r])
    assert run_ingest(spark, warehouse, [StoreSpec("c", src, buckets=1)]).stores["c"].error is None
maintain.COMPACT_FILES_PER_BUCKET = 2
compactor = maintain.Compactor(spark, warehouse, 30, lambda what, exc: print("FAILURE", what, exc))
spark.sparkContext._jsc.sc().stop()  # what the JVM's shutdown hook does on a signal to the group
compactor.request(["c", "c"])
compactor._thread.join(120)
print("PASS OVER", flush=True)
"""


def test_a_compaction_that_spark_stops_under_is_one_info_line(tmp_path):
    """A signal to the whole process group reaches the driver JVM too, whose shutdown hook stops
    Spark under a compaction in flight, before continuous mode's own stop: the compactor says so
    in one INFO line, ends its pass, and reports no failure (in a JVM of its own: the test stops
    its SparkContext)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _STOPPED_UNDER_A_COMPACTION, str(tmp_path / "wh"),
                           str(tmp_path / "src")], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PASS OVER" in done.stdout and "FAILURE" not in done.stdout, done.stdout
    stopping = [line for line in done.stderr.splitlines() if "the compaction under way ended with Spark" in line]
    assert len(stopping) == 1 and stopping[0].startswith("INFO versiq"), done.stderr[-3000:]
    assert not [line for line in done.stderr.splitlines() if line.startswith("ERROR versiq")], done.stderr[-3000:]
