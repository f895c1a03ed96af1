"""Delta tables on a real S3-compatible server (issue 15, the infrastructure): delta-spark writes
``s3a://`` tables through Hadoop's S3A with versiq's conditional-put LogStore
(``dev.versiq.delta.ConditionalS3LogStore``, jars/logstore), delta-rs reads them back over ``s3://``;
two writers racing for one version never both commit it; the server going away between two
appends does not break the next one.

The server is SeaweedFS's ``weed mini`` (the ``s3_server`` fixture). The session's SparkSession
exists before it (one per test session), so the endpoint and keys reach the session through
``configure_s3`` (its Hadoop configuration), as they would for any variables set after start-up.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
from deltalake import DeltaTable
from py4j.protocol import Py4JJavaError
from pyarrow import fs as pafs

from versiq.ingest.spark import FETCH_HINT_S3, S3_LOGSTORE, configure_s3, s3_jars_present

BUCKET = "versiq-delta"


@pytest.fixture(scope="module")
def s3(spark: Any, s3_server: Any) -> Any:
    """The session's SparkSession pointed at the test server, and the test bucket created."""
    if not s3_jars_present():
        pytest.fail(f"the S3 jars are missing: {FETCH_HINT_S3}", pytrace=False)
    assert spark.sparkContext.getConf().get("spark.delta.logStore.s3a.impl") == S3_LOGSTORE
    assert configure_s3(spark, s3_server.env())
    s3_server.create_bucket(BUCKET)
    return s3_server


def _table(prefix: str) -> str:
    return f"{BUCKET}/{prefix}-{uuid.uuid4().hex[:10]}"


def _commit_files(server: Any, key: str) -> list[str]:
    """The names of the commit files (``N.json``) under ``key``/_delta_log."""
    infos = server.filesystem().get_file_info(pafs.FileSelector(f"{key}/_delta_log"))
    return sorted(i.base_name for i in infos if i.base_name.endswith(".json"))


def _read_text(server: Any, key: str) -> str:
    with server.filesystem().open_input_stream(key) as handle:
        return bytes(handle.read()).decode("utf-8")


def _rows(spark: Any, path: str, version: int | None = None) -> list[tuple[int, str]]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return sorted((row["id"], row["w"]) for row in reader.load(path).collect())


def _rows_delta_rs(server: Any, key: str, version: int | None = None) -> list[tuple[int, str]]:
    table = DeltaTable(f"s3://{key}", version=version, storage_options=server.env())
    return sorted((r["id"], r["w"]) for r in table.to_pyarrow_table().to_pylist())


def _append(spark: Any, path: str, start: int, stop: int, writer: str) -> None:
    spark.range(start, stop).selectExpr("id", f"'{writer}' AS w").write.format("delta").mode("append").save(path)


def _delegate_class(spark: Any, path: str) -> str:
    """The class of the LogStore Delta uses for ``path`` (behind its DelegatingLogStore)."""
    jvm = spark.sparkContext._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    delegate = log.store().getDelegate(jvm.org.apache.hadoop.fs.Path(path))
    return str(delegate.logStoreImpl().getClass().getName())


def test_delta_spark_writes_delta_rs_reads(spark: Any, s3: Any) -> None:
    key = _table("interop")
    path = f"s3a://{key}"
    _append(spark, path, 0, 5, "a")
    _append(spark, path, 5, 8, "b")

    assert _delegate_class(spark, path) == S3_LOGSTORE
    assert _commit_files(s3, key) == [f"{0:020d}.json", f"{1:020d}.json"]
    first = [(i, "a") for i in range(5)]
    both = first + [(i, "b") for i in range(5, 8)]
    assert _rows(spark, path, 0) == first
    assert _rows(spark, path) == both
    # delta-rs over s3:// (and over the s3a:// URI Spark was given) sees the same two versions.
    assert DeltaTable(f"s3://{key}", storage_options=s3.env()).version() == 1
    assert _rows_delta_rs(s3, key, 0) == first
    assert _rows_delta_rs(s3, key) == both
    assert sorted((r["id"], r["w"]) for r in
                  DeltaTable(path, storage_options=s3.env()).to_pyarrow_table().to_pylist()) == both
    # Spark takes s3:// too (S3A behind both schemes, the same LogStore).
    assert _rows(spark, f"s3://{key}") == both
    assert _delegate_class(spark, f"s3://{key}") == S3_LOGSTORE


def test_logstore_race_one_winner_per_version(spark: Any, s3: Any) -> None:
    """Four LogStore instances (as four machines would have) race to create each of six commit
    files at once: exactly one wins each, the others get FileAlreadyExistsException (Delta's retry
    signal), and the file holds the winner's lines; repeating the winner's own write (an ambiguous
    retry) succeeds, anyone else's fails."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    key = _table("race")
    writers, versions = 4, 6
    stores = [jvm.dev.versiq.delta.ConditionalS3LogStore(conf) for _ in range(writers)]

    def lines(*texts: str) -> Any:
        array = jvm.java.util.ArrayList()
        for text in texts:
            array.add(text)
        return array.iterator()

    for version in range(versions):
        name = f"{key}/_delta_log/{version:020d}.json"
        target = jvm.org.apache.hadoop.fs.Path(f"s3a://{name}")
        barrier = threading.Barrier(writers)
        outcome: dict[int, str] = {}

        def attempt(i: int, target: Any = target, barrier: threading.Barrier = barrier,
                    outcome: dict[int, str] = outcome, version: int = version) -> None:
            record = json.dumps({"writer": i, "version": version})
            barrier.wait()
            try:
                stores[i].write(target, lines(record), False, conf)
                outcome[i] = "won"
            except Py4JJavaError as exc:
                outcome[i] = str(exc.java_exception.getClass().getName())

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        winners = [i for i, result in outcome.items() if result == "won"]
        assert len(outcome) == writers, outcome
        assert len(winners) == 1, outcome
        assert all(r == "java.nio.file.FileAlreadyExistsException" for i, r in outcome.items() if i != winners[0]), \
            outcome
        assert json.loads(_read_text(s3, name)) == {"writer": winners[0], "version": version}

    name = f"{key}/_delta_log/{0:020d}.json"
    target = jvm.org.apache.hadoop.fs.Path(f"s3a://{name}")
    own = _read_text(s3, name).rstrip("\n")
    stores[0].write(target, lines(own), False, conf)  # the same bytes: our own write landed
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        stores[0].write(target, lines(own, "{}"), False, conf)
    assert _read_text(s3, name) == own + "\n"
    assert _commit_files(s3, key) == [f"{v:020d}.json" for v in range(versions)]


def test_concurrent_appends_lose_nothing(spark: Any, s3: Any) -> None:
    """Four threads of the session append to one table at once, all from the same snapshot: every
    version holds exactly one commit, the losers of each race retried at a later version (their
    commitInfo's readVersion is older than the version before theirs), and every appended row is
    there exactly once (no commit overwrote another)."""
    key = _table("appends")
    path = f"s3a://{key}"
    _append(spark, path, 0, 1, "seed")  # version 0
    writers, per_writer = 4, 50
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def append(i: int) -> None:
        frame = spark.range(1 + i * per_writer, 1 + (i + 1) * per_writer).selectExpr("id", f"'w{i}' AS w")
        barrier.wait()
        try:
            frame.write.format("delta").mode("append").save(path)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors

    assert _commit_files(s3, key) == [f"{v:020d}.json" for v in range(writers + 1)]
    read_versions = {}
    for version in range(1, writers + 1):
        text = _read_text(s3, f"{key}/_delta_log/{version:020d}.json")
        info = next(json.loads(line)["commitInfo"] for line in text.splitlines() if '"commitInfo"' in line)
        read_versions[version] = info.get("readVersion")
    assert any(read < version - 1 for version, read in read_versions.items() if read is not None), read_versions

    expected = [(0, "seed")] + [(1 + i * per_writer + j, f"w{i}") for i in range(writers) for j in range(per_writer)]
    assert _rows(spark, path) == sorted(expected)
    assert _rows_delta_rs(s3, key) == sorted(expected)


def test_append_after_server_restart(spark: Any, s3: Any) -> None:
    """The server goes away (SIGKILL) and comes back between two appends: the second append works
    on the session's existing S3A client, and both versions read back."""
    key = _table("restart")
    path = f"s3a://{key}"
    _append(spark, path, 0, 10, "before")
    try:
        s3.restart(hard=True)
        _append(spark, path, 10, 20, "after")
    finally:
        s3.ensure_running()
    before = [(i, "before") for i in range(10)]
    after = before + [(i, "after") for i in range(10, 20)]
    assert _commit_files(s3, key) == [f"{0:020d}.json", f"{1:020d}.json"]
    assert _rows(spark, path, 0) == before
    assert _rows(spark, path) == after
    assert _rows_delta_rs(s3, key, 0) == before
    assert _rows_delta_rs(s3, key) == after
