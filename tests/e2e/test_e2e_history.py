"""System time (issue 16 item 6) and the change feed (item 5) end to end: the real ingest writes
runs and ``maintain`` compacts,
``GET /v1/stores/{store}/history`` lists every commit with what made it, and a read with
``asOfSystemTime`` answers from the snapshot that was current then, exactly as ``?snapshot`` does,
which is what the reference model said after that run (bitemporal: "what did we believe at T1
about the value at T2?")."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import httpx
import pytest

from tests.ingest.test_ingest_cli import VERSIQ, env
from tests.support.e2e import IngestedStore, key_path, model_key_json, problem, serve_engine, source_dir
from tests.support.ingest import StoredVersion, records_from, store_versions
from tests.support.reference import InRecord
from versiq.ingest.maintain import maintain_store
from versiq.timestamps import format_timestamp

T0 = 1_700_000_000_000
KEYS = ["a", "b", "c"]


def _records(run: int) -> list[InRecord]:
    specs = [(KEYS[(run + i) % 3], None if (run + i) % 5 == 4 else f'{{"run":{run},"i":{i}}}', T0 + 100 * run + 7 * i)
             for i in range(6)]
    return records_from(f"r{run}.jsonl", specs)


def test_history_lists_commits_and_as_of_system_time_answers_from_the_snapshot_current_then(
        spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path)
    store = IngestedStore(spark, f"{root}/wh", source_dir(root, "h"), "h", history_retention_ms=10 ** 9)
    moments: list[int] = []  # wall-clock ms after each commit
    before = int(time.time() * 1000) - 1
    for run in range(3):
        assert store.run({f"r{run}.jsonl": _records(run)}) is not None
        time.sleep(0.02)
        moments.append(int(time.time() * 1000))
        time.sleep(0.02)
    result = maintain_store(store.warehouse, "h", 60, lambda: spark)
    assert result["buckets_rewritten"] > 0
    with serve_engine(store.warehouse) as (url, _engine), httpx.Client(base_url=url) as client:
        body = client.get("/v1/stores/h/history").json()
        commits = body["commits"]
        assert body["store"] == "h"
        assert [c["snapshot"] for c in commits] == list(range(len(commits) - 1, -1, -1))  # newest first
        runs = [c for c in commits if c["operation"] == "ingest"]
        assert [(c["snapshot"], c["run"], c["files"]) for c in runs][::-1] == \
            [(s, i + 1, [f"r{i}.jsonl"]) for i, s in enumerate(sorted(store.models))]
        assert all(c["counts"]["rowsWritten"] > 0 and c["counts"]["filesAdded"] > 0 for c in runs)
        newest = commits[0]
        assert newest["operation"] == "maintain" and newest["run"] == 3 and newest["files"] == []
        assert newest["counts"]["filesRemoved"] > 0
        times = [c["committedAt"] for c in commits]
        assert times == sorted(times, reverse=True) and before <= times[-1]
        # asOfSystemTime = the snapshot current at that time; as ?snapshot does, as the model did
        for run, moment in enumerate(moments):
            snapshot = sorted(store.models)[run]
            model = store.models[snapshot]
            for key in [*KEYS, "zz"]:
                for as_of in (None, T0 + 50, T0 + 150, T0 + 1_000):
                    params: dict[str, Any] = {} if as_of is None else {"asOf": as_of}
                    by_time = client.get(key_path("h", key), params={**params, "asOfSystemTime": moment})
                    by_snapshot = client.get(key_path("h", key), params={**params, "snapshot": snapshot})
                    assert (by_time.status_code, by_time.json()) == (by_snapshot.status_code, by_snapshot.json())
                    status, expected = model_key_json(model, key, as_of)
                    assert by_time.status_code == status, (run, key, as_of, by_time.text)
                    assert by_time.json()["snapshot"] == snapshot
            info = client.get("/v1/stores/h", params={"asOfSystemTime": moment}).json()
            assert info["snapshot"] == snapshot
            listing = client.get("/v1/stores/h/keys", params={"asOfSystemTime": moment}).json()
            assert listing["snapshot"] == snapshot
            batch = client.post("/v1/stores/h/keys:batchGet", json={"keys": KEYS, "asOfSystemTime": moment}).json()
            assert batch["snapshot"] == snapshot
            versions = client.get(key_path("h", "a", "/versions"), params={"asOfSystemTime": moment}).json()
            assert versions["snapshot"] == snapshot
        # RFC 3339 works too; before the first commit there is no snapshot; not with `snapshot`
        after = client.get(key_path("h", "a"), params={"asOfSystemTime": "2100-01-01T00:00:00Z"})
        assert after.json()["snapshot"] == commits[0]["snapshot"]
        problem(client.get(key_path("h", "a"), params={"asOfSystemTime": before - 60_000}), 404, "snapshot-not-found")
        problem(client.get(key_path("h", "a"), params={"asOfSystemTime": moments[0], "snapshot": 0}), 400,
                "bad-request")
        problem(client.get("/v1/stores/nope/history"), 404, "store-not-found")
        problem(client.get("/v1/stores/h/history", params={"x": 1}), 400, "bad-request")
        # the CLI prints the same JSON without a server (issue 16 item 8)
        listed = _cli("history", "--warehouse", store.warehouse, "--store", "h")
        assert [json.loads(line) for line in listed.splitlines()] == commits
        iso = [json.loads(line) for line in _cli("history", "--warehouse", store.warehouse, "--store", "h",
                                                 "--iso").splitlines()]
        assert iso[0]["committedAt"] == format_timestamp(commits[0]["committedAt"])
        got = _cli("get", "--warehouse", store.warehouse, "--store", "h", "--key", "a", "--as-of", str(T0 + 150),
                   "--as-of-system-time", str(moments[1]))
        http = client.get(key_path("h", "a"), params={"asOf": T0 + 150, "asOfSystemTime": moments[1]})
        assert json.loads(got) == http.json()


def _cli(*args: str) -> str:
    done = subprocess.run([*VERSIQ, *args], env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("bad", ["yesterday", "-5"])
def test_as_of_system_time_must_be_an_instant(tmp_path: Any, bad: str) -> None:
    with serve_engine(str(tmp_path)) as (url, _engine), httpx.Client(base_url=url) as client:
        body = problem(client.get(key_path("h", "a"), params={"asOfSystemTime": bad}), 400, "bad-request")
        assert body["parameter"] == "asOfSystemTime"


def _replay(base: dict[str, list[Any]], changes: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """``base`` (key -> versions) with each change upserted by (key, validFrom)."""
    by_key = {k: {v.timestamp: v for v in vs} for k, vs in base.items()}
    for c in changes:
        by_key.setdefault(c["key"], {})[c["timestamp"]] = StoredVersion(
            c["timestamp"], None if c["deleted"] else json.dumps(c["value"], separators=(",", ":")), c["validTo"])
    return {k: [vs[t] for t in sorted(vs)] for k, vs in by_key.items() if vs}


def _normal(versions: dict[str, list[Any]]) -> dict[str, list[tuple[Any, ...]]]:
    return {k: [(v.timestamp, None if v.value is None else json.loads(v.value), v.valid_to) for v in vs]
            for k, vs in versions.items()}


def test_the_change_feed_replayed_over_a_snapshot_gives_a_later_one(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path)
    store = IngestedStore(spark, f"{root}/wh", source_dir(root, "c"), "c", history_retention_ms=10 ** 9)
    for run in range(3):
        assert store.run({f"r{run}.jsonl": _records(run)}) is not None
    maintain_store(store.warehouse, "c", 60, lambda: spark)  # a maintenance commit: no changes
    path = f"{store.warehouse}/c"
    with serve_engine(store.warehouse) as (url, _engine), httpx.Client(base_url=url) as client:
        head = client.get("/v1/stores/c").json()["snapshot"]
        snapshots = sorted(store.models)
        for since in [-1, *snapshots]:
            whole = client.get("/v1/stores/c/changes", params={"sinceSnapshot": since, "pageSize": 1000}).json()
            assert whole["snapshot"] == head and whole["nextPageToken"] is None
            changes = whole["changes"]
            assert [(c["snapshot"], c["key"], c["timestamp"]) for c in changes] == \
                sorted((c["snapshot"], c["key"], c["timestamp"]) for c in changes)
            assert all(c["snapshot"] in snapshots and c["snapshot"] > since for c in changes)  # not maintain's
            base = {} if since < 0 else store_versions(path, since)
            assert _normal(_replay(base, changes)) == _normal(store_versions(path, head)), since
            # paged: the same changes, the snapshot pinned by the token
            paged, token = [], None
            while True:
                params: dict[str, Any] = {"sinceSnapshot": since, "pageSize": 2}
                if token:
                    params["pageToken"] = token
                body = client.get("/v1/stores/c/changes", params=params).json()
                assert body["snapshot"] == head
                paged += body["changes"]
                token = body["nextPageToken"]
                if not token:
                    break
            assert paged == changes
            # streamed as NDJSON in one pass: the same changes
            streamed = client.get("/v1/stores/c/changes", params={"sinceSnapshot": since},
                                  headers={"accept": "application/x-ndjson"})
            assert streamed.headers["content-type"] == "application/x-ndjson"
            assert int(streamed.headers["versiq-snapshot"]) == head
            assert [json.loads(line) for line in streamed.text.splitlines()] == changes
        for name, value in (("pageSize", "10"), ("pageToken", "x")):  # a stream is not paged: said precisely
            refused = problem(client.get("/v1/stores/c/changes", params={"sinceSnapshot": -1, name: value},
                                         headers={"accept": "application/x-ndjson"}), 400, "bad-request")
            assert refused["parameter"] == name and "NDJSON stream" in refused["detail"], refused
        # a window: (first, second]
        window = client.get("/v1/stores/c/changes", params={"sinceSnapshot": snapshots[0],
                                                           "untilSnapshot": snapshots[1]}).json()
        assert {c["snapshot"] for c in window["changes"]} == {snapshots[1]} and window["snapshot"] == snapshots[1]
        assert _normal(_replay(store_versions(path, snapshots[0]), window["changes"])) == \
            _normal(store_versions(path, snapshots[1]))
        # at the head a long poll waits (bounded) and answers empty when nothing is committed
        started = time.monotonic()
        empty = client.get("/v1/stores/c/changes", params={"sinceSnapshot": head, "wait": "1s"}, timeout=30).json()
        assert empty["changes"] == [] and 0.9 < time.monotonic() - started < 10
        problem(client.get("/v1/stores/c/changes"), 400, "bad-request")
        problem(client.get("/v1/stores/c/changes", params={"sinceSnapshot": head + 5}), 400, "bad-request")
        problem(client.get("/v1/stores/c/changes", params={"sinceSnapshot": 0, "untilSnapshot": head + 5}), 404,
                "snapshot-not-found")
        problem(client.get("/v1/stores/c/changes", params={"sinceSnapshot": 0, "wait": "2h"}), 400, "bad-request")
