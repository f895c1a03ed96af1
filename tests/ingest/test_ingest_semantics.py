"""docs/semantics.md, rules 1-12 and 19-22 through the real Spark ingest into real Delta stores.

Each test states the rule it checks; expected stores are written out by hand and checked
against the reference model too, so a wrong model cannot make a wrong ingest pass.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.support.ingest import (
    StoredVersion,
    model_versions,
    record_line,
    records_from,
    rejected_rows,
    store_versions,
    stream_times,
    timestamped_values,
    write_jsonl,
)
from tests.support.reference import ReferenceStore
from versiq.ingest.errors import UsageError
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.layout import murmur2_partition, read_state

V = StoredVersion


def ingest(spark, tmp_path, name, runs, **settings):
    """Ingest ``runs`` (each a list of (file name, lines)) as consecutive runs of one store."""
    src = tmp_path / f"src-{name}"
    src.mkdir(exist_ok=True)
    wh = str(tmp_path / "wh")
    reports = []
    for files in runs:
        for fname, lines in files:
            write_jsonl(str(src), fname, lines)
        report = run_ingest(spark, wh, [StoreSpec(name, str(src), **settings)])
        entry = report.stores[name]
        assert entry.error is None, entry.error
        reports.append(entry)
    return os.path.join(wh, name), reports


def lines(specs, source="a.jsonl"):
    return [record_line(r) for r in records_from(source, specs)]


@pytest.mark.rule(1, 4, 5)
def test_versions_validto_tombstones_and_replacement(spark, tmp_path):
    """Rules 1, 4, 5: one version per timestamp, tombstones are versions, validTo is the next
    version's timestamp, an out-of-order record between two versions recomputes validTo."""
    specs = [
        ("k", '{"p":1}', 10),
        ("k", '{"p":3}', 30),
        ("k", '{"p":2}', 20),      # out-of-order: lands between 10 and 30
        ("k", None, 40),           # tombstone as latest
        ("k", '{"p":1.50}', 30),   # same timestamp: value -> value
        ("t", None, 5),            # a key whose first version is a tombstone
        ("t", '"x"', 5),           # null -> value at the same timestamp
        ("u", '""', 7),            # empty string is a value
        ("u", None, 7),            # value -> null
        ("w", None, 1),
        ("w", None, 1),            # null -> null
    ]
    path, [rep] = ingest(spark, tmp_path, "s", [[("a.jsonl", lines(specs))]])
    assert store_versions(path) == {
        "k": [V(10, '{"p":1}', 20), V(20, '{"p":2}', 30), V(30, '{"p":1.50}', 40), V(40, None, None)],
        "t": [V(5, '"x"', None)],
        "u": [V(7, None, None)],
        "w": [V(1, None, None)],
    }
    assert (rep.read, rep.accepted_latest, rep.accepted_out_of_order) == (11, 9, 2)
    assert rep.replaced_same_timestamp == 4
    assert rep.tombstones == 5
    model = ReferenceStore()
    counts = model.run(records_from("a.jsonl", specs))
    assert model_versions(model, "ktuw") == store_versions(path)
    assert (counts.accepted_latest, counts.accepted_out_of_order, counts.replaced_same_timestamp,
            counts.tombstones) == (9, 2, 4, 5)


@pytest.mark.rule(2, 3)
def test_grace_is_strict_and_late_records_change_nothing(spark, tmp_path):
    """Rules 2-3: timestamp == streamTime - H is accepted, one ms older is rejected `late`,
    and a rejected record changes neither the store nor stream time."""
    specs = [("a", "1", 100), ("b", "2", 90), ("b", "3", 89), ("c", "4", 95)]
    path, [rep] = ingest(spark, tmp_path, "g", [[("a.jsonl", lines(specs))]], history_retention_ms=10)
    assert store_versions(path) == {"a": [V(100, "1", None)], "b": [V(90, "2", None)], "c": [V(95, "4", None)]}
    assert rep.rejected["late"] == 1 and rep.accepted_latest == 3
    assert stream_times(path) == {0: 100}
    [rej] = rejected_rows(path)
    assert (rej["reason"], rej["source"], rej["line"]) == ("late", "a.jsonl", 3)
    assert rej["raw"] == lines(specs)[2]
    assert "horizon 1970-01-01T00:00:00.090Z" in rej["detail"] and "(89)" in rej["detail"]


@pytest.mark.rule(2)
def test_stream_time_persists_across_runs(spark, tmp_path):
    """Rule 2 across runs: stream time is part of the store's committed state."""
    run1 = [("a.jsonl", lines([("a", "1", 100)]))]
    run2 = [("b.jsonl", lines([("a", "2", 89), ("a", "3", 90), ("z", "4", 50)], "b.jsonl"))]
    path, [r1, r2] = ingest(spark, tmp_path, "p", [run1, run2], history_retention_ms=10)
    assert r2.rejected["late"] == 2 and r2.accepted_out_of_order == 1
    assert store_versions(path) == {"a": [V(90, "3", 100), V(100, "1", None)]}
    assert r1.snapshot == 0 and r2.snapshot == 1


@pytest.mark.rule(2, 19)
def test_partitions_are_separate_stream_time_domains(spark, tmp_path):
    """Rules 2 and 19: stream time per partition; bad_partition; a key stays in its partition."""
    specs = [
        ("a", "1", 1000, 0),
        ("b", "2", 10, 1),     # partition 1 has its own (low) stream time: accepted
        ("c", "3", 5, 2),      # partitions = 2 -> bad_partition
        ("a", "4", 1001, 1),   # key a lives in partition 0 -> partition_conflict
        ("d", "5", 1001),      # no partition field: Kafka's murmur2 of "d", mod 2
    ]
    path, [rep] = ingest(spark, tmp_path, "q", [[("a.jsonl", lines(specs))]], partitions=2,
                         history_retention_ms=100)
    assert rep.rejected["bad_partition"] == 1 and rep.rejected["partition_conflict"] == 1
    assert set(store_versions(path)) == {"a", "b", "d"}
    p_d = murmur2_partition(b"d", 2)
    expected = {0: 1000, 1: 10}
    expected[p_d] = max(expected[p_d], 1001)
    assert stream_times(path) == expected
    with pytest.raises(UsageError, match="partitions"):
        run_ingest(spark, str(tmp_path / "wh"), [StoreSpec("q", str(tmp_path / "src-q"), partitions=3)])


@pytest.mark.rule(20)
def test_offsets_define_processing_order_and_duplicates(spark, tmp_path):
    """Rule 20: ordered by offset when every record of the partition has one; a (partition, offset)
    already processed, or not above an earlier run's highest offset, is `duplicate_offset`."""
    run1 = lines([("k", '"b"', 20, 0, 2), ("k", '"a"', 10, 0, 1), ("k", '"c"', 10, 0, 3),
                  ("k", '"dup"', 99, 0, 2)])
    run2 = lines([("k", '"old"', 50, 0, 3), ("k", '"new"', 60, 0, 4)], "b.jsonl")
    path, [r1, r2] = ingest(spark, tmp_path, "o", [[("a.jsonl", run1)], [("b.jsonl", run2)]])
    # offset order: 1 (ts10 "a"), 2 (ts20 "b"), 3 (ts10 "c" replaces "a", out-of-order)
    assert r1.rejected["duplicate_offset"] == 1
    assert (r1.accepted_latest, r1.accepted_out_of_order, r1.replaced_same_timestamp) == (2, 1, 1)
    assert r2.rejected["duplicate_offset"] == 1
    assert store_versions(path) == {"k": [V(10, '"c"', 20), V(20, '"b"', 60), V(60, '"new"', None)]}


def test_rerun_without_new_files_changes_nothing(spark, tmp_path):
    """Batch mode ingests only files not yet done; a rerun commits nothing."""
    path, [r1, r2] = ingest(spark, tmp_path, "r", [[("a.jsonl", lines([("a", "1", 1)]))], []])
    assert r1.snapshot == 0 and r2.snapshot == 0 and r2.read == 0 and r2.run is None
    from deltalake import DeltaTable

    assert DeltaTable(path).version() == 0


@pytest.mark.rule(21)
def test_same_results_for_every_split(spark, tmp_path):
    """Rule 21: identical stores however the changelog is split into runs (record-at-a-time)."""
    specs = [("k", "1", 50), ("k", "2", 40), ("j", "3", 45), ("k", "4", 20), ("k", None, 45),
             ("j", "5", 60), ("k", "6", 40), ("j", "7", 10), ("k", "8", 61)]
    all_lines = lines(specs)
    whole, _ = ingest(spark, tmp_path, "whole", [[("a.jsonl", all_lines)]], history_retention_ms=25)
    single, _ = ingest(spark, tmp_path, "single",
                       [[(f"f{i:02d}.jsonl", [line])] for i, line in enumerate(all_lines)],
                       history_retention_ms=25)
    assert store_versions(whole) == store_versions(single)
    assert stream_times(whole) == stream_times(single)
    model = ReferenceStore(history_retention_ms=25)
    model.run(records_from("a.jsonl", specs))
    assert model_versions(model, "kj") == store_versions(whole)


@pytest.mark.rule(12)
def test_timestamped_store_keeps_latest_by_processing_order(spark, tmp_path):
    """Rule 12 (KIP-258): one value per key, the last by processing order, not by timestamp."""
    specs = [("a", "1", 100), ("a", "2", 50), ("b", "3", 10), ("b", None, 20), ("c", "4", 5)]
    path, [rep] = ingest(spark, tmp_path, "ts", [[("a.jsonl", lines(specs))]], kind="timestamped",
                         history_retention_ms=1)
    assert timestamped_values(path) == {"a": ("2", 50), "b": (None, 20), "c": ("4", 5)}
    assert (rep.accepted_latest, rep.accepted_out_of_order, rep.rejected["late"]) == (4, 1, 0)
    path2, [rep2] = ingest(spark, tmp_path, "ts", [[("b.jsonl", lines([("a", "9", 1)], "b.jsonl"))]])
    assert timestamped_values(path2)["a"] == ("9", 1)
    assert rep2.accepted_out_of_order == 1


@pytest.mark.rule(22)
def test_maintain_compacts_prunes_expired_history_and_keeps_old_snapshots(spark, tmp_path):
    """`versiq maintain`: one file per bucket, superseded rows gone, history that ended at or
    before the horizon dropped (no query can return it), older snapshots still readable."""
    from deltalake import DeltaTable

    from versiq.ingest.maintain import maintain_store

    run1 = [("a.jsonl", lines([("k", str(t), t) for t in (10, 20, 30, 40)] + [("j", "1", 50)]))]
    run2 = [("b.jsonl", lines([("k", "99", 20), ("k", "100", 100), ("j", None, 60)], "b.jsonl"))]
    path, _ = ingest(spark, tmp_path, "m", [run1, run2], history_retention_ms=60, buckets=2)
    before = store_versions(path)
    version_before = DeltaTable(path).version()
    result = maintain_store(str(tmp_path / "wh"), "m")
    assert result["buckets_rewritten"] >= 1
    horizon = 100 - 60
    expected = {k: [v for v in vs if v.valid_to is None or v.valid_to > horizon] for k, vs in before.items()}
    assert store_versions(path) == expected
    assert expected["k"][0].timestamp == 40  # 10 (validTo 20), 20 (validTo 30), 30 (validTo 40) pruned
    table = DeltaTable(path)
    buckets = [uri.split("bucket=")[1].split("/")[0] for uri in table.file_uris()]
    assert len(buckets) == len(set(buckets))
    assert store_versions(path, version_before) == before
    assert stream_times(path) == {0: 100}
    # a later run still sees the same store (state carried by the compaction commit)
    path, [rep] = ingest(spark, tmp_path, "m", [[("c.jsonl", lines([("k", "7", 39), ("k", "8", 40)], "c.jsonl"))]])
    assert rep.rejected["late"] == 1 and rep.replaced_same_timestamp == 1


@pytest.mark.rule(22)
def test_continuous_compaction_merges_a_buckets_recent_files_and_rewrites_it_whole_later(spark, tmp_path,
                                                                                          monkeypatch):
    """Continuous mode's compaction costs what arrived, not the store: the recent files of a
    bucket are merged (Delta's OPTIMIZE: every row kept) while its oldest file stays as it is;
    once the recent files hold a quarter of the oldest file's rows, the bucket is rewritten
    whole and superseded rows and expired history go. Neither commit changes data (Delta's
    ``dataChange``) nor carries state: the store's state is its last run's."""
    from deltalake import DeltaTable

    from versiq.ingest import maintain

    filler = [(f"f{i:03d}", "0", 5) for i in range(80)]
    runs = [[("a.jsonl", lines([*filler, ("k", "1", 10)]))],
            [("b.jsonl", lines([("k", "2", 20), ("j", "1", 20)], "b.jsonl"))],
            [("c.jsonl", lines([("j", "2", 20), ("k", "3", 100)], "c.jsonl"))]]  # horizon 100 - 30
    path, _ = ingest(spark, tmp_path, "c", runs, history_retention_ms=30, buckets=1)
    oldest = min(_add_actions(path), key=lambda a: a["max.run"])
    before = store_versions(path)
    assert [v.valid_to for v in before["k"]] == [20, 100, None]  # k@10 ended at 20, before the horizon
    # due once the store holds more than COMPACT_FILES_PER_BUCKET files per bucket (here 3 files)
    monkeypatch.setattr(maintain, "COMPACT_FILES_PER_BUCKET", 3)
    assert maintain.compact_if_due(str(tmp_path / "wh"), "c", 60, lambda: spark) is None
    monkeypatch.setattr(maintain, "COMPACT_FILES_PER_BUCKET", 2)
    result = maintain.compact_if_due(str(tmp_path / "wh"), "c", 60, lambda: spark)
    assert result is not None
    assert (result["buckets_merged"], result["buckets_rewritten"]) == (1, 0)
    assert (result["rows_before"], result["rows_after"]) == (6, 6)
    files = _add_actions(path)
    assert len(files) == 2 and oldest["path"] in [f["path"] for f in files]
    assert store_versions(path) == before  # k@10 of run 1 (validTo NULL) stays hidden
    assert _changes_no_data(path) and read_state(path, DeltaTable(path).version()).run == 3

    run4 = [("d.jsonl", lines([(f"f{i:03d}", "1", 110) for i in range(30)], "d.jsonl"))]
    path, _ = ingest(spark, tmp_path, "c", [run4], history_retention_ms=30, buckets=1)
    before = store_versions(path)
    result = maintain.maintain_store(str(tmp_path / "wh"), "c", spark=lambda: spark, recent_only=True)
    assert (result["buckets_merged"], result["buckets_rewritten"]) == (0, 1)
    assert len(DeltaTable(path).file_uris()) == 1
    assert store_versions(path) == {k: [v for v in vs if v.valid_to is None or v.valid_to > 110 - 30]
                                    for k, vs in before.items()}
    assert [v.timestamp for v in store_versions(path)["k"]] == [20, 100]
    assert _changes_no_data(path) and read_state(path, DeltaTable(path).version()).run == 4


def _changes_no_data(path: str) -> bool:
    """Whether the newest commit of the table at ``path`` changes no data and carries no state."""
    import json

    from deltalake import DeltaTable

    from versiq.layout import log_file

    actions = [json.loads(line) for line in open(log_file(path, DeltaTable(path).version())).read().splitlines()
               if line]
    files = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    return bool(files) and not any(f["dataChange"] for f in files) and "userMetadata" not in info


def test_one_continuous_compaction_merges_one_bucket_and_rewrites_another_whole(spark, tmp_path):
    """Buckets are judged one by one and land in one commit (``replaceWhere`` "bucket IN (...)
    OR (bucket = b AND run > r)"): bucket 0's recent files are small beside its oldest and are
    merged, bucket 1's are not and it is rewritten whole; the store answers as before."""
    from versiq.ingest import maintain
    from versiq.layout import bucket_of

    filler = [(key, "0", 5) for key in (f"f{i:03d}" for i in range(80)) if bucket_of(key, 2) == 0]
    assert bucket_of("d", 2) == 0 and bucket_of("k", 2) == 1
    runs = [[("a.jsonl", lines([*filler, ("k", "1", 10)]))],
            [("b.jsonl", lines([("d", "1", 20), ("k", "2", 20)], "b.jsonl"))],
            [("c.jsonl", lines([("d", "2", 30), ("k", "3", 30)], "c.jsonl"))]]
    path, _ = ingest(spark, tmp_path, "two", runs, history_retention_ms=1000, buckets=2)
    oldest = min((a for a in _add_actions(path) if a["partition.bucket"] == 0), key=lambda a: a["max.run"])
    before = store_versions(path)
    result = maintain.maintain_store(str(tmp_path / "wh"), "two", spark=lambda: spark, recent_only=True)
    assert (result["buckets_merged"], result["buckets_rewritten"]) == (1, 1)
    files = _add_actions(path)
    assert sorted(a["partition.bucket"] for a in files) == [0, 0, 1]
    assert oldest["path"] in [a["path"] for a in files]
    assert store_versions(path) == before


def _add_actions(path: str) -> list[dict]:
    import pyarrow as pa
    from deltalake import DeltaTable

    return pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()


def test_a_bucket_whose_runs_interleave_or_lack_statistics_is_rewritten_whole() -> None:
    """A merge of a bucket's recent files is exact only when all their runs follow its oldest
    file's (``maintain.recent_files``); otherwise, or without statistics, the bucket is
    rewritten whole, as it is when the recent files are a quarter of the oldest or more."""
    from versiq.ingest.maintain import recent_files

    def file(rows: int, low: int | None, high: int | None) -> dict:
        return {"num_records": rows, "min.run": low, "max.run": high}

    oldest, a, b = file(100, 1, 5), file(10, 6, 6), file(5, 7, 7)
    assert recent_files([a, oldest, b], 0.25) == (5, [a, b])
    assert recent_files([oldest, a, b], 0.15) is None  # 15 rows >= 0.15 x 100
    assert recent_files([oldest, file(10, 5, 6), b], 0.25) is None  # run 5 in both
    assert recent_files([file(100, None, None), a, b], 0.25) is None
    assert recent_files([oldest, file(10, None, None)], 0.25) is None


def test_every_commit_after_maintain_carries_the_store_state(spark, tmp_path, monkeypatch):
    """Vacuum writes commits of its own (VACUUM START/END): they carry the state too, so the
    newest commit of a store always has it, whatever log cleanup removed before."""
    import json as _json

    from deltalake import DeltaTable

    import versiq.ingest.maintain as maintain
    from versiq.layout import STATE_KEY, log_file

    path, _ = ingest(spark, tmp_path, "v", [[("a.jsonl", lines([("k", "1", 1)]))],
                                            [("b.jsonl", lines([("k", "2", 2)], "b.jsonl"))]])
    monkeypatch.setattr(maintain, "VACUUM_RETENTION_HOURS", 0)
    result = maintain.maintain_store(str(tmp_path / "wh"), "v")
    assert result["vacuumed_files"] >= 2
    newest = DeltaTable(path).version()
    with open(log_file(path, newest)) as handle:
        info = next(_json.loads(line)["commitInfo"] for line in handle if line.startswith('{"commitInfo"'))
    assert _json.loads(info[STATE_KEY])["run"] == 2
    assert stream_times(path) == {0: 2}


def test_maintain_removes_old_orphaned_files_and_spares_young_ones(spark, tmp_path):
    """Issue 10 item 7: files no commit references (a killed maintain, a failed write) are removed
    once older than the vacuum retention, in the store and its side tables; younger ones stay
    (a writer's files are protected by the lock and by the retention)."""
    from versiq.ingest.maintain import maintain_store

    bad = '{"key":"x","timestamp":"never"}'
    path, _ = ingest(spark, tmp_path, "o", [[("a.jsonl", lines([("k", "1", 1), ("j", "2", 2)]) + [bad])]], buckets=1)
    before = store_versions(path)
    old = time.time() - 3 * 3600
    planted = {}
    for folder in ("bucket=0", "_rejected"):
        for age in ("old", "young"):
            target = os.path.join(path, folder, f"orphan-{age}.parquet")
            with open(target, "wb") as handle:
                handle.write(b"PAR1 not referenced by any commit")
            if age == "old":
                os.utime(target, (old, old))
            planted[(folder, age)] = target
    stale_tmp = os.path.join(path, "bucket=0", "compact-00000001-dead.parquet.tmp")  # a killed maintain
    with open(stale_tmp, "wb") as handle:
        handle.write(b"partial")
    os.utime(stale_tmp, (old, old))

    result = maintain_store(str(tmp_path / "wh"), "o")
    assert not os.path.exists(planted[("bucket=0", "old")]) and not os.path.exists(stale_tmp)
    assert not os.path.exists(planted[("_rejected", "old")])
    assert os.path.exists(planted[("bucket=0", "young")]) and os.path.exists(planted[("_rejected", "young")])
    assert result["vacuumed_files"] >= 2 and result["vacuumed_side_files"] >= 1
    assert store_versions(path) == before
    assert [r["reason"] for r in rejected_rows(path)] == ["bad_timestamp"]


def test_a_record_far_in_the_future_is_refused_and_never_pins_stream_time(spark, tmp_path):
    """Issue 10 item 2 (KIP-937's guard): a record at 2^63-1 once pinned stream time at the maximum,
    so every later record was late. It is rejected bad_timestamp by default (max_future 1h)."""
    future = 2**63 - 1
    path, [first, second] = ingest(spark, tmp_path, "f", [
        [("a.jsonl", lines([("a", "1", 100), ("a", "2", future)]))],
        [("b.jsonl", lines([("b", "3", 200)], "b.jsonl"))],
    ])
    assert first.rejected["bad_timestamp"] == 1 and second.rejected["late"] == 0
    assert stream_times(path) == {0: 200}
    assert set(store_versions(path)) == {"a", "b"}
    [row] = rejected_rows(path)
    assert row["reason"] == "bad_timestamp" and "max_future" in row["detail"] and str(future) in row["raw"]
    # --max-future none: the record is accepted (and then pins stream time, as the user asked)
    path, [rep] = ingest(spark, tmp_path, "g", [[("a.jsonl", lines([("a", "2", future)]))]], max_future_ms=None)
    assert rep.rejected["bad_timestamp"] == 0 and stream_times(path) == {0: future}


def test_the_future_bound_is_inclusive():
    import pyarrow as pa

    from versiq.ingest.future import future_bound, parse_max_future
    from versiq.ingest.records import parse_bytes_for_tests, refuse_future

    table = parse_bytes_for_tests('{"key":"a","value":1,"timestamp":1000}\n{"key":"b","value":1,"timestamp":1001}\n'
                                  '{"key":"c","timestamp":"x"}\n')
    [batch] = table.to_batches()
    out = pa.Table.from_batches([refuse_future(batch, 1000)])
    assert out.column("reason").to_pylist() == [None, "bad_timestamp", "bad_timestamp"]
    assert out.column("key").to_pylist() == ["a", None, None]
    assert "1001" in out.column("detail")[1].as_py() and "max_future" in out.column("detail")[1].as_py()
    assert future_bound(None) is None and future_bound(5, now_ms=10) == 15 and future_bound(2**63 - 1, 10) == 2**63 - 1
    assert parse_max_future("none") is None and parse_max_future("2h") == 7_200_000


def test_max_future_in_a_pipeline_file(tmp_path):
    from versiq.ingest.config import load_config

    (tmp_path / "d").mkdir()
    (tmp_path / "p.yaml").write_text("stores:\n  - {name: a, source: d, max_future: none}\n"
                                     "  - {name: b, source: d, max_future: 2h}\n  - {name: c, source: d}\n")
    stores = load_config(str(tmp_path / "p.yaml")).stores
    assert [s.max_future_ms for s in stores] == [None, 7_200_000, 3_600_000]
    (tmp_path / "q.yaml").write_text("stores:\n  - {name: a, source: d, max_future: soon}\n")
    with pytest.raises(UsageError, match="max_future"):
        load_config(str(tmp_path / "q.yaml"))
    (tmp_path / "n.yaml").write_text("stores:\n  - {name: a, source: d, max_future: null}\n")
    with pytest.raises(UsageError, match="null is not a duration"):
        load_config(str(tmp_path / "n.yaml"))
    # --max-future is the default of the stores that do not set max_future
    stores = load_config(str(tmp_path / "p.yaml"), default_max_future_ms=None).stores
    assert [s.max_future_ms for s in stores] == [None, 7_200_000, None]


def test_a_stream_record_far_in_the_future_is_refused(spark, tmp_path):
    """max_future guards streams too: a stream record at 2^63-1 joined into a table (or
    materialised by toTable) would move that derived table's stream time to the end of time."""
    from versiq.ingest.config import Pipeline
    from versiq.ingest.run import run_pipeline
    from versiq.ingest.streams import StreamSpec

    source = tmp_path / "clicks"
    source.mkdir()
    (source / "a.jsonl").write_text("\n".join(lines([("a", "1", 100), ("b", "2", 2**63 - 1)])) + "\n")
    warehouse = str(tmp_path / "wh")
    report = run_pipeline(spark, warehouse, Pipeline(stores=[], streams=[StreamSpec("clicks", str(source))]))
    entry = report.streams["clicks"]
    assert entry.appended == 1 and entry.rejected["bad_timestamp"] == 1
    [row] = rejected_rows(os.path.join(warehouse, "clicks"))
    assert row["reason"] == "bad_timestamp" and "max_future" in row["detail"]
    # max_future none: accepted, as asked
    report = run_pipeline(spark, str(tmp_path / "wh2"),
                          Pipeline(stores=[], streams=[StreamSpec("clicks", str(source), max_future_ms=None)]))
    assert report.streams["clicks"].appended == 2


def test_max_future_of_streams_in_a_pipeline_file(tmp_path):
    from versiq.ingest.config import load_config

    (tmp_path / "d").mkdir()
    (tmp_path / "p.yaml").write_text("streams:\n  - {name: a, source: d, max_future: none}\n"
                                     "  - {name: b, source: d, max_future: 2h}\n  - {name: c, source: d}\n")
    streams = load_config(str(tmp_path / "p.yaml")).streams
    assert [s.max_future_ms for s in streams] == [None, 7_200_000, 3_600_000]
    streams = load_config(str(tmp_path / "p.yaml"), default_max_future_ms=None).streams
    assert [s.max_future_ms for s in streams] == [None, 7_200_000, None]
    (tmp_path / "n.yaml").write_text("streams:\n  - {name: a, source: d, max_future: null}\n")
    with pytest.raises(UsageError, match="null is not a duration"):
        load_config(str(tmp_path / "n.yaml"))
