"""The `versiq ingest` / `rejected` / `maintain` contract as other tools drive it: subprocesses,
exit codes, the report file, the writer lock, kill -9 and rerun, continuous mode, and a real
Spark standalone cluster (master + one worker on 127.0.0.1).

Subprocess tests cost a JVM start each (~10 s), so they are few and each checks a lot.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support.derived_cluster import check_on_cluster
from tests.support.ingest import (
    expressions,
    ingest_in_process,
    rejected_rows,
    store_versions,
    stream_times,
    write_jsonl,
)
from tests.support.server_process import free_ports
from versiq.ingest.pipeline import StoreSpec, run_ingest

VERSIQ = [sys.executable, "-m", "versiq.cli"]
REASONS = {"late", "malformed", "missing_field", "bad_key", "bad_timestamp", "bad_value", "bad_partition",
           "duplicate_offset", "partition_conflict", "too_large", "expression_error"}


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYSPARK_PYTHON"] = sys.executable
    e["VERSIQ_SHUFFLE_PARTITIONS"] = "2"
    e.pop("SPARK_MASTER", None)
    return e


def versiq(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VERSIQ, *args], capture_output=True, text=True, timeout=timeout, env=env(),
                          stdin=subprocess.DEVNULL)


def make_changelog(folder, files: int = 3, keys: int = 300, per_key: int = 6) -> None:
    """Deterministic changelog with out-of-order, late and malformed lines."""
    for f in range(files):
        lines = []
        for k in range(keys):
            for v in range(per_key):
                ts = 1000 * (f * per_key + v) + k
                if (k + v) % 7 == 0:
                    ts -= 1500  # out of order
                if (k * v) % 97 == 5 and f == files - 1:
                    ts = 1  # late
                value = "null" if (k + v) % 31 == 0 else f'{{"v":{f}.{v}0,"k":{k}}}'
                lines.append(f'{{"key":"k{k:04d}","value":{value},"timestamp":{ts}}}')
        lines.insert(5, "this is not json")
        write_jsonl(str(folder), f"part-{f}.jsonl", lines)


def test_cli_usage_errors_exit_2(tmp_path):
    wh = str(tmp_path / "wh")
    cases = [
        ["ingest", "--warehouse", wh, "--store", "s"],
        ["ingest", "--warehouse", wh, "--store", "../evil", "--source", str(tmp_path)],
        ["ingest", "--warehouse", wh, "--store", "s", "--source", str(tmp_path / "missing")],
        ["ingest", "--warehouse", wh, "--store", "s", "--source", str(tmp_path), "--history-retention", "7 days"],
    ]
    config = tmp_path / "bad.yaml"
    config.write_text("stores:\n  - name: s\n    source: .\n    colour: blue\n")
    cases.append(["ingest", "--warehouse", wh, "--config", str(config)])
    for args in cases:
        result = versiq(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "error" in result.stderr
        assert not os.path.exists(os.path.join(wh, "s", "_delta_log"))
    assert versiq("rejected", "--warehouse", wh, "--store", "nope").returncode == 2


def test_cli_report_lock_and_partial_failure(spark, tmp_path):
    """Exit 0 with a complete report (the CLI's command in this process: no JVM start); then, in
    a ``versiq ingest`` process, one store locked by another writer fails (exit 1, `error` in its
    entry) while the other store of the same config still commits."""
    src_a, src_b = tmp_path / "a", tmp_path / "b"
    make_changelog(src_a, files=1, keys=20, per_key=3)
    make_changelog(src_b, files=1, keys=10, per_key=2)
    wh = str(tmp_path / "wh")
    report_file = tmp_path / "out" / "report.json"
    status, printed = ingest_in_process(spark, "--warehouse", wh, "--store", "a", "--source", str(src_a),
                                        "--history-retention", "PT1S", "--report", str(report_file))
    assert status == 0, printed
    report = json.loads(report_file.read_text())
    entry = report["stores"]["a"]
    assert set(entry["rejected"]) >= REASONS
    assert entry["read"] == entry["accepted_latest"] + entry["accepted_out_of_order"] + sum(entry["rejected"].values())
    assert entry["snapshot"] == 0 and entry["seconds"] > 0
    assert "store a: read" in printed

    config = tmp_path / "pipeline.yaml"
    config.write_text(f"stores:\n  - name: a\n    source: {src_a}\n  - name: b\n    source: b\n"
                      "    history_retention: 5m\n    partitions: 2\n")
    lock_path = os.path.join(wh, "a", "_versiq", "lock")
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        handle.write("pid=test-holder")
        handle.flush()
        write_jsonl(str(src_a), "more.jsonl", ['{"key":"x","value":1,"timestamp":999999}'])
        result = versiq("ingest", "--warehouse", wh, "--config", str(config), "--report", str(report_file),
                        "--lock-timeout", "1s")
    assert result.returncode == 1, result.stderr
    report = json.loads(report_file.read_text())
    assert "locked by another writer" in report["stores"]["a"]["error"]
    assert "test-holder" in report["stores"]["a"]["error"]
    assert report["stores"]["b"]["snapshot"] == 0 and "error" not in report["stores"]["b"]

    out = versiq("rejected", "--warehouse", wh, "--store", "a", "--reason", "malformed")
    assert out.returncode == 0
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows and all(r["reason"] == "malformed" and r["raw"] == "this is not json" and r["line"] == 6
                        for r in rows)
    maintained = versiq("maintain", "--warehouse", wh, "--store", "b")
    assert maintained.returncode == 0, maintained.stderr


def test_crash_between_rejected_and_store_commit_is_replaced_by_the_rerun(spark, tmp_path, monkeypatch):
    """A run's `_rejected` rows are committed before its store commit (versiq.ingest.delta); a
    run that died between them left rows of a run the store never committed: readers ignore
    them, and the rerun (run 1 again, over whatever is new by then) replaces them, so nothing is
    kept twice and nothing of the rerun is lost."""
    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}', "garbage"])
    wh = str(tmp_path / "wh")
    import versiq.ingest.pipeline as pipeline
    from versiq.ingest.rejected import iter_rejected

    real_commit = pipeline.commit_store

    def boom(*args, **kwargs):
        raise RuntimeError("simulated crash before the store commit")

    monkeypatch.setattr(pipeline, "commit_store", boom)
    report = run_ingest(spark, wh, [StoreSpec("c", str(src))])
    assert "simulated crash" in report.stores["c"].error
    path = os.path.join(wh, "c")
    assert [r["raw"] for r in rejected_rows(path)] == ["garbage"]  # on disk: the unfinished attempt
    assert not os.path.isdir(os.path.join(path, "_delta_log"))  # no store yet
    write_jsonl(str(src), "b.jsonl", ["more garbage"])  # arrives before the rerun
    monkeypatch.setattr(pipeline, "commit_store", real_commit)
    report = run_ingest(spark, wh, [StoreSpec("c", str(src))])
    assert report.stores["c"].error is None and report.stores["c"].run == 1
    assert sorted(r["raw"] for r in rejected_rows(path)) == ["garbage", "more garbage"]
    assert sorted(r["raw"] for r in iter_rejected(wh, "c")) == ["garbage", "more garbage"]
    run_ingest(spark, wh, [StoreSpec("c", str(src))])
    assert sorted(r["raw"] for r in rejected_rows(path)) == ["garbage", "more garbage"]


def test_rejected_rows_of_an_uncommitted_run_are_not_listed(spark, tmp_path, monkeypatch):
    """`versiq rejected` lists the rejections of committed runs only."""
    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}', "garbage"])
    wh = str(tmp_path / "wh")
    import versiq.ingest.pipeline as pipeline
    from versiq.ingest.rejected import iter_rejected

    assert run_ingest(spark, wh, [StoreSpec("c", str(src))]).stores["c"].error is None
    write_jsonl(str(src), "b.jsonl", ["second garbage"])

    def boom(*args, **kwargs):
        raise RuntimeError("simulated crash before the store commit")

    monkeypatch.setattr(pipeline, "commit_store", boom)
    assert run_ingest(spark, wh, [StoreSpec("c", str(src))]).stores["c"].error
    assert sorted(r["raw"] for r in rejected_rows(os.path.join(wh, "c"))) == ["garbage", "second garbage"]
    assert [r["raw"] for r in iter_rejected(wh, "c")] == ["garbage"]


def test_kill_9_then_rerun_equals_an_uninterrupted_run(spark, tmp_path):
    src = tmp_path / "src"
    make_changelog(src, files=4, keys=400, per_key=5)
    # killed as the run starts its store's commit (its _rejected rows committed): a point in the
    # run, not a delay, so a faster run is killed all the same
    marker = "store k: committing run 1"
    wh = str(tmp_path / "wh")
    args = [*VERSIQ, "ingest", "--warehouse", wh, "--store", "k", "--source", str(src),
            "--history-retention", "3000", "--log-level", "debug"]

    def run_then_kill_at_the_marker() -> tuple[int, list[str]]:
        proc = subprocess.Popen(args, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        assert proc.stderr is not None
        seen = []
        try:
            for line in proc.stderr:
                seen.append(line)
                if marker in line:
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
            return proc.wait(timeout=60), seen
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.stderr.close()

    # the CLI's run is watched (and killed at the marker) by a thread while this process makes
    # the reference run
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        killed = pool.submit(run_then_kill_at_the_marker)
        reference_wh = str(tmp_path / "ref")
        with expressions(generated=True, parsed_here=False):
            run_ingest(spark, reference_wh, [StoreSpec("k", str(src), history_retention_ms=3000)])
        returncode, seen = killed.result(timeout=300)
    ref = os.path.join(reference_wh, "k")
    killed_log = "".join(seen)
    assert returncode == -signal.SIGKILL, killed_log
    # the CLI's JVM ran this small run with interpreted expressions, the reference with
    # generated code: the same store either way (spark.plans_for_input)
    assert re.search(r"driver JVM options: .*-XX:TieredStopAtLevel=1", killed_log), killed_log
    assert "store k: run 1 over 4 new files: parse in the driver, decide with DuckDB, write with Spark (a small run)" \
        in killed_log, killed_log  # the run's plan
    # ... and parsed its files in its own process (parse.parse_here), the reference in Spark tasks
    assert re.search(r"[\d,]+ records parsed in this process", killed_log), killed_log
    # the rerun: the CLI's command with the same arguments, in this process (no JVM start),
    # planned as the CLI's run was (a small run: interpreted expressions, parsed here)
    with expressions(generated=False, parsed_here=True):
        status, printed = ingest_in_process(spark, *args[len(VERSIQ) + 1:])
    assert status == 0, printed
    assert "store k: read" in printed, printed
    path = os.path.join(wh, "k")
    assert store_versions(path) == store_versions(ref)
    assert stream_times(path) == stream_times(ref)
    key = lambda r: (r["source"], r["line"], r["reason"])  # noqa: E731
    assert sorted(map(key, rejected_rows(path))) == sorted(map(key, rejected_rows(ref)))


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_continuous_mode_picks_up_a_file_that_lands_while_it_runs(tmp_path):
    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}'])
    wh = str(tmp_path / "wh")
    report_file = tmp_path / "report.json"
    proc = subprocess.Popen(
        [*VERSIQ, "ingest", "--warehouse", wh, "--store", "live", "--source", str(src), "--continuous",
         "--trigger-interval", "1s", "--report", str(report_file)],
        env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        path = os.path.join(wh, "live")
        _wait_for(lambda: report_file.exists(), 120, "the first micro-batch")
        write_jsonl(str(src), "sub/b.jsonl", ['{"key":"b","value":2,"timestamp":6}'])
        _wait_for(lambda: "b" in store_versions(path), 120, "the new file to be ingested")
        # the report of a micro-batch is written just after its commit
        _wait_for(lambda: json.loads(report_file.read_text())["stores"]["live"]["run"] == 2, 30,
                  "the second micro-batch's report")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert set(store_versions(path)) == {"a", "b"}



@pytest.mark.cluster
def test_ingest_on_a_spark_standalone_cluster(spark, tmp_path):
    """Master and one worker started from the PySpark installation on 127.0.0.1; the ingest
    runs its parse and write tasks on the worker's executor, and derived tables their passes
    (``tests.support.derived_cluster``)."""
    import pyspark

    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    port = free_ports(1)[0]
    e = env()
    e["SPARK_LOCAL_IP"] = "127.0.0.1"
    logs = open(tmp_path / "cluster.log", "w")  # noqa: SIM115
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(free_ports(1)[0])],
                              env=e, stdout=logs, stderr=logs)
    worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker",
                               f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--cores", "2",
                               "--memory", "2g", "--webui-port", str(free_ports(1)[0]),
                               "--work-dir", str(tmp_path / "work")],
                              env=e, stdout=logs, stderr=logs)
    try:
        src = tmp_path / "src"
        make_changelog(src, files=2, keys=50, per_key=4)
        ref_wh = str(tmp_path / "ref")
        # the reference run of "dist" in this process's session, made while the cluster runs
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reference = pool.submit(run_ingest, spark, ref_wh, [StoreSpec("dist", str(src), history_retention_ms=3000)])
            # derived tables: a pass in Spark tasks on the worker, per partition (docs/semantics.md,
            # rule 23); the same CLI runs (one driver and executor start) ingest the store "dist"
            check_on_cluster(spark, tmp_path / "derived", f"spark://127.0.0.1:{port}", e,
                             stores=[{"name": "dist", "source": str(src), "history_retention": "3000ms"}])
            assert reference.result(timeout=300).stores["dist"].error is None
        wh = os.path.join(tmp_path, "derived", "cluster", "warehouse")
        assert store_versions(os.path.join(wh, "dist")) == store_versions(os.path.join(ref_wh, "dist"))
        # the executor really ran on the worker: it has an application work directory
        assert any(os.scandir(tmp_path / "work")), "no executor ran on the worker"
    finally:
        for proc in (worker, master):
            proc.terminate()
        for proc in (worker, master):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        logs.close()


def test_a_state_only_commit_between_runs_is_not_skipped_as_a_committed_run(spark, tmp_path):
    """A table added over a store whose run has nothing new commits only state (the store keeps
    a changelog from its next run). That commit carries no Delta transaction: Delta would skip
    it as run N, which the store already committed, and the next run's records would miss the
    changelog."""
    from deltalake import DeltaTable

    from versiq.layout import read_state

    src = tmp_path / "src"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":1,"timestamp":5}'])
    wh = str(tmp_path / "wh")
    assert run_ingest(spark, wh, [StoreSpec("c", str(src))]).stores["c"].error is None
    path = os.path.join(wh, "c")
    before = DeltaTable(path).version()
    assert run_ingest(spark, wh, [StoreSpec("c", str(src), changelog=True)]).stores["c"].run is None
    assert DeltaTable(path).version() == before + 1
    assert read_state(path, before + 1).changelog_since == 2
    write_jsonl(str(src), "b.jsonl", ['{"key":"b","value":2,"timestamp":6}'])
    assert run_ingest(spark, wh, [StoreSpec("c", str(src))]).stores["c"].run == 2
    assert DeltaTable(os.path.join(path, "_changelog")).to_pyarrow_table().column("key").to_pylist() == ["b"]


def test_work_that_needs_no_data_never_starts_a_jvm(spark, tmp_path):
    """Issue 17: a run with nothing new (a store, a stream and a derived table all up to date), a
    refused store setting, ``versiq rejected`` and the ``maintain`` of a store with nothing to do
    end before any SparkSession starts. Proven by a JAVA_HOME that points nowhere: any JVM start
    fails, as the control (a run with a new file) shows."""
    from versiq.ingest.config import load_config
    from versiq.ingest.run import run_pipeline

    src, clicks = tmp_path / "src", tmp_path / "clicks"
    write_jsonl(str(src), "a.jsonl", ['{"key":"a","value":{"n":1},"timestamp":5}', "not json"])
    write_jsonl(str(clicks), "c.jsonl", ['{"key":"a","value":1,"timestamp":7}'])
    wh = str(tmp_path / "wh")
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"stores:\n  - {{name: s, source: {src}}}\nstreams:\n  - {{name: c, source: {clicks}}}\n"
                      "tables:\n  - {name: big, from: s, filter: 'value.n > 0'}\n")
    first = run_pipeline(spark, wh, load_config(str(config), wh))
    assert not first.failed and first.tables["big"].snapshot == 0

    no_java = {"JAVA_HOME": str(tmp_path / "no-java-here")}

    def versiq_without_java(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*VERSIQ, *args], capture_output=True, text=True, timeout=120,
                              env={**env(), **no_java}, stdin=subprocess.DEVNULL)

    report_file = tmp_path / "report.json"
    nothing_new = versiq_without_java("ingest", "--warehouse", wh, "--config", str(config), "--report",
                                      str(report_file))
    assert nothing_new.returncode == 0, nothing_new.stderr
    report = json.loads(report_file.read_text())
    assert (report["stores"]["s"]["snapshot"], report["streams"]["c"]["snapshot"],
            report["tables"]["big"]["snapshot"]) == (0, 0, 0)
    assert "run" not in report["stores"]["s"] or report["stores"]["s"]["run"] is None

    refused = versiq_without_java("ingest", "--warehouse", wh, "--store", "s", "--source", str(src),
                                  "--history-retention", "1h")
    assert refused.returncode == 2, refused.stderr
    assert "was created with history_retention = 1d; it cannot be changed to 1h" in refused.stderr
    # continuous mode checks its stores before its one SparkSession starts, too
    refused = versiq_without_java("ingest", "--warehouse", wh, "--store", "s", "--source", str(src),
                                  "--history-retention", "1h", "--continuous")
    assert refused.returncode == 2, refused.stderr
    assert "was created with history_retention = 1d; it cannot be changed to 1h" in refused.stderr
    assert "Traceback" not in refused.stderr
    switched = versiq_without_java("ingest", "--warehouse", wh, "--store", "s", "--kafka-bootstrap", "127.0.0.1:9",
                                   "--topic", "t", "--continuous")
    assert switched.returncode == 2, switched.stderr
    assert "store 's' was built from files; it cannot switch to Kafka topic t" in switched.stderr
    rebucketed = tmp_path / "rebucketed.yaml"
    rebucketed.write_text(config.read_text().replace("{name: c, source: ", "{name: c, buckets: 3, source: "))
    refused = versiq_without_java("ingest", "--warehouse", wh, "--config", str(rebucketed), "--continuous")
    assert refused.returncode == 2, refused.stderr
    assert "store 'c' was created with buckets" in refused.stderr, refused.stderr

    rejected = versiq_without_java("rejected", "--warehouse", wh, "--store", "s")
    assert rejected.returncode == 0, rejected.stderr
    assert [json.loads(line)["raw"] for line in rejected.stdout.splitlines()] == ["not json"]

    maintained = versiq_without_java("maintain", "--warehouse", wh, "--store", "s")
    assert maintained.returncode == 0, maintained.stderr

    write_jsonl(str(src), "b.jsonl", ['{"key":"b","value":{"n":2},"timestamp":6}'])
    control = versiq_without_java("ingest", "--warehouse", wh, "--store", "s", "--source", str(src))
    assert control.returncode != 0 and "no-java-here" in control.stderr, control.stderr
