"""``versiq erase``: a key's rows leave a store, its side tables and the derived tables keyed by
its key, everywhere on disk, and an erase killed midway is completed by its rerun (real Spark,
real Delta, real CLI processes)."""

from __future__ import annotations

import json
import os
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from tests.ingest.test_ingest_cli import VERSIQ, env, versiq
from tests.support.ingest import erase_in_process, store_versions, write_jsonl
from tests.support.processes import run_then_kill
from versiq import storage
from versiq.ingest import delta, maintain
from versiq.ingest.config import load_config
from versiq.ingest.erase import DerivedTable, affected_tables, erase_keys, erase_secret, key_hash
from versiq.ingest.run import run_pipeline
from versiq.layout import TABLE_PROPERTIES
from versiq.query import history
from versiq.query.api import SnapshotGone, VersionedKeyQuery
from versiq.query.engine import Engine

KEY = "erin-7f3a9c"
VALUE = "ERINVALUE"  # every value of KEY holds it; no other record does
PIPELINE = """
stores:
  - {name: people, source: SRC}
tables:
  - {name: adults, from: people, filter: "value.age > 17"}
  - {name: by_city, from: people, group_by: "value.city", aggregate: {count: true}}
"""


def _person(key: str, age: int, secret: str, ts: int) -> str:
    return json.dumps({"key": key, "value": {"age": age, "city": "Oslo", "secret": secret}, "timestamp": ts})


def build(spark, tmp_path, wh: str | None = None) -> tuple[str, str]:
    """Two runs and a compaction into ``wh`` (default: a folder of ``tmp_path``): the key's rows
    are in live files, in files the compaction removed (not vacuumed) and in ``_rejected`` (a
    line that is not JSON)."""
    src, wh = tmp_path / "src", wh or str(tmp_path / "wh")
    config = tmp_path / "pipeline.yaml"
    config.write_text(PIPELINE.replace("SRC", str(src)))
    write_jsonl(str(src), "1.jsonl", [_person(KEY, 30, f"{VALUE}-1", 10), _person("bob", 40, "bob-1", 11),
                                      _person("carl", 12, "carl-1", 12), f"not json {KEY} {VALUE}-3"])
    assert not run_pipeline(spark, wh, load_config(str(config), wh)).failed
    write_jsonl(str(src), "2.jsonl", [_person(KEY, 31, f"{VALUE}-2", 20), _person("bob", 41, "bob-2", 21)])
    assert not run_pipeline(spark, wh, load_config(str(config), wh)).failed
    maintain.maintain_store(wh, "people", spark=lambda: spark)
    return wh, str(config)


def leaks(folder: str) -> list[str]:
    """Files under ``folder`` (a directory or an S3 prefix) that hold the key or a value of it:
    raw bytes (logs, checksums, every file) and, for Parquet, the decoded rows (compressed pages
    hide text from a byte scan)."""
    found = []
    for path in storage.all_files(folder):
        data = storage.read_bytes(path)
        if KEY.encode() in data or VALUE.encode() in data:
            found.append(path)
        elif data[:4] == b"PAR1":
            rows = json.dumps(pq.read_table(pa.BufferReader(data)).to_pylist(), default=str)
            if KEY in rows or VALUE in rows:
                found.append(path)
    return found


def test_affected_tables_follow_the_key_and_name_those_to_rebuild():
    tables = [DerivedTable("f", "", "from", ("s",)), DerivedTable("j", "", "join", ("f", "x")),
              DerivedTable("g", "", "aggregate", ("s",)), DerivedTable("gf", "", "from", ("g",)),
              DerivedTable("fk", "", "fk_join", ("s", "x")), DerivedTable("sj", "", "stream_join", ("clicks", "j")),
              DerivedTable("other", "", "from", ("x",))]
    keyed, rebuild = affected_tables("s", tables)
    assert [t.name for t in keyed] == ["f", "j", "sj"]
    assert rebuild == ["fk", "g", "gf"]


def test_erase_killed_after_the_store_commit_is_completed_by_its_rerun(spark, tmp_path):
    wh, _config = build(spark, tmp_path)
    people, adults = os.path.join(wh, "people"), os.path.join(wh, "adults")
    assert leaks(people) and leaks(adults)
    others = {k: v for k, v in store_versions(people).items() if k != KEY}
    before = DeltaTable(people).version()
    command = [*VERSIQ, "erase", "--warehouse", wh, "--store", "people", "--key", KEY]

    # killed once the store's own commit is made, before its side tables and derived tables
    assert run_then_kill(command, env(), "people: erase committed", 0.0) < 0
    assert leaks(os.path.join(people, "_rejected")) and leaks(adults)
    assert not os.path.exists(os.path.join(people, "_erasures")), "recorded before it was done"

    # the rerun: the CLI's erase command in this process (``erase_in_process``: the kill above
    # needed a process of its own, the rerun does not need a JVM start)
    status, stdout, stderr = erase_in_process(spark, "--warehouse", wh, "--store", "people", "--key", KEY)
    assert status == 0, stderr
    result = json.loads(stdout)
    assert result["rebuild"] == ["by_city"] and "versiq rebuild --table by_city" in stderr
    assert result["rows"]["people"] == 0, "the rerun erased the store's rows again"
    assert result["rows"]["people/_rejected"] == 1 and result["rows"]["adults"] >= 1
    assert KEY not in stdout + stderr and VALUE not in stdout + stderr

    assert leaks(people) == [] and leaks(adults) == []
    assert store_versions(people) == others

    # the serving engine: 404 at every snapshot still readable, 410 for those that read erased files
    engine = Engine(wh, refresh_interval_s=3600)
    engine.refresh()
    try:
        current = engine.current_snapshot("people")
        assert engine.get("people", VersionedKeyQuery(KEY)).outcome == "not-found"
        assert engine.get("people", VersionedKeyQuery("bob")).record is not None
        for snapshot in range(current + 1):
            if snapshot <= before:  # every snapshot before the erase read a file that held the key
                with pytest.raises(SnapshotGone):
                    engine.get("people", VersionedKeyQuery(KEY), snapshot=snapshot)
            else:
                assert engine.get("people", VersionedKeyQuery(KEY), snapshot=snapshot).outcome == "not-found"
        with pytest.raises(SnapshotGone):
            engine.changes("people", -1)
        after = engine.changes("people", current - 1)
        assert all(c.key != KEY for c in after.changes)
    finally:
        engine.close()

    commits = history.commits(people, DeltaTable(people).version())
    assert [c.operation for c in commits].count("erase") == 1
    assert next(c for c in commits if c.operation == "erase").snapshot == before + 1

    # the audit trail: one erase, a keyed hash of the key, never the key; the secret is private
    trail = DeltaTable(os.path.join(people, "_erasures")).to_pyarrow_table().to_pylist()
    assert len(trail) == 1
    assert trail[0]["keys"] == 1 and trail[0]["store"] == "people" and trail[0]["user"]
    assert trail[0]["key_hashes"] == [key_hash(erase_secret(wh), KEY)]
    assert trail[0]["rebuild"] == ["by_city"] and trail[0]["tables"] == ["people", "adults"]
    secret = os.path.join(wh, "_versiq", "erase-secret")
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600

    # erasing again finds nothing left and records a second erase
    again = erase_keys(wh, "people", [KEY], spark=lambda: spark)
    assert sum(again.rows.values()) == 0
    assert len(DeltaTable(os.path.join(people, "_erasures")).to_pyarrow_table()) == 2


def checkpoint_every(monkeypatch, commits: int) -> None:
    """Tables created from now on get a Delta checkpoint every ``commits`` commits (50 in
    versiq's tables): a few runs then exercise what 50 would."""
    monkeypatch.setattr(delta, "TABLE_PROPERTIES", {**TABLE_PROPERTIES, "delta.checkpointInterval": str(commits)})


def checkpoint_described(table: str) -> bool:
    """Whether the table's ``_last_checkpoint`` names a checkpoint of the size it records."""
    folder = os.path.join(table, "_delta_log")
    with open(os.path.join(folder, "_last_checkpoint"), encoding="utf-8") as handle:
        hint = json.load(handle)
    prefix = f"{hint['version']:020d}.checkpoint."
    sizes = [os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
             if n.startswith(prefix) and n.endswith(".parquet")]
    return bool(sizes) and sum(sizes) == hint["sizeInBytes"]


def _fresh_reads(spark, table: str) -> int:
    """The table's rows as delta-spark (its log cache dropped, as a new process) and delta-rs
    read them: the same number, returned."""
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    rows = spark.read.format("delta").load(table).count()
    assert DeltaTable(table).to_pyarrow_table().num_rows == rows
    return rows


def test_erase_on_checkpointed_tables_leaves_logs_both_delta_readers_and_the_next_writers_take(
        spark, tmp_path, monkeypatch):
    """A checkpoint every 2 commits: the store's newest checkpoint holds the statistics of the
    compacted file of the key (rewritten by the erase), the erase commit of ``adults`` writes a
    checkpoint of its own, the next run writes one after the erase."""
    checkpoint_every(monkeypatch, 2)
    wh, config = build(spark, tmp_path)
    people, adults = os.path.join(wh, "people"), os.path.join(wh, "adults")
    tables, checkpointed = (people, os.path.join(people, "_rejected"), adults), (people, adults)
    assert os.path.exists(os.path.join(people, "_delta_log", f"{2:020d}.checkpoint.parquet"))
    others = {k: v for k, v in store_versions(people).items() if k != KEY}
    with Engine(wh, refresh_interval_s=3600) as engine:
        engine.refresh()
        bob = engine.get("people", VersionedKeyQuery("bob")).record
    assert bob is not None

    result = erase_keys(wh, "people", [KEY], spark=lambda: spark)
    assert result.rows["people"] >= 1 and result.rows["people/_rejected"] == 1 and result.rows["adults"] >= 1
    assert leaks(people) == [] and leaks(adults) == []
    for table in checkpointed:
        assert checkpoint_described(table), f"{table}: _last_checkpoint does not describe its checkpoint"
    for table in tables:
        _fresh_reads(spark, table)
    assert store_versions(people) == others
    with Engine(wh, refresh_interval_s=3600) as engine:
        engine.refresh()
        assert engine.get("people", VersionedKeyQuery(KEY)).outcome == "not-found"
        assert engine.get("people", VersionedKeyQuery("bob")).record == bob

    # the next run commits on the erased log and checkpoints after it; then a compaction
    write_jsonl(str(tmp_path / "src"), "3.jsonl", [_person("bob", 42, "bob-3", 30), _person("dora", 50, "d", 31)])
    assert not run_pipeline(spark, wh, load_config(config, wh)).failed
    assert os.path.exists(os.path.join(people, "_delta_log", f"{4:020d}.checkpoint.parquet"))
    maintain.maintain_store(wh, "people", spark=lambda: spark)
    assert leaks(people) == [] and leaks(adults) == []
    for table in checkpointed:
        assert checkpoint_described(table)
    for table in tables:
        _fresh_reads(spark, table)
    latest = store_versions(people)
    assert KEY not in latest and latest["dora"][-1].value is not None
    assert json.loads(latest["bob"][-1].value)["secret"] == "bob-3"


def test_erase_usage_errors_exit_2(tmp_path):
    wh = str(tmp_path / "wh")
    os.makedirs(wh)
    assert versiq("erase", "--warehouse", wh, "--store", "nope", "--key", "k").returncode == 2
    assert versiq("erase", "--warehouse", wh, "--store", "nope").returncode == 2
