"""Point-in-time lookups (issue 16 item 3) over HTTP: random ``(key, asOf)`` pairs answered from one
snapshot, each equal to the single-key read of that snapshot, as JSON, NDJSON, Arrow IPC and
Parquet, with pairs sent as JSON or as an uploaded Arrow/Parquet table; and ``versiq lookup``
(the same engine, no server) writing the same answers."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.service import T0, key_path, live_server
from tests.support.storebuilder import StoreBuilder
from versiq.service.settings import Settings

pytestmark = pytest.mark.rule(31)

KEYS = ["a", "b", "c", "é/x", "zz-missing"]
ARROW = "application/vnd.apache.arrow.stream"
PARQUET = "application/vnd.apache.parquet"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, httpx.Client]]:
    wh = str(tmp_path_factory.mktemp("lookups"))
    rng = random.Random(5)
    b = StoreBuilder(wh, "s", history_retention_ms=300)
    for _run in range(3):
        b.apply([(rng.choice(KEYS[:4]), rng.choice([None, '"x"', "1", '{"v":2}']), T0 + rng.randrange(1000))
                 for _ in range(40)])
    with live_server(Settings(warehouse=wh, refresh_interval_s=3600)) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        yield wh, client


def _pairs(n: int, seed: int) -> list[tuple[str, int | None]]:
    rng = random.Random(seed)
    return [(rng.choice(KEYS), None if rng.random() < 0.2 else T0 + rng.randrange(-50, 1100)) for _ in range(n)]


def _single(client: httpx.Client, key: str, as_of: int | None, snapshot: int) -> dict[str, Any]:
    """The result object the single-key read of ``snapshot`` gives (record or problem)."""
    params: dict[str, Any] = {"snapshot": snapshot, **({} if as_of is None else {"asOf": as_of})}
    resp = client.get(key_path("s", key), params=params)
    body = resp.json()
    head: dict[str, Any] = {"key": key, **({} if as_of is None else {"asOf": as_of})}
    if resp.status_code == 200:
        return {**head, "record": {k: body[k] for k in ("value", "timestamp", "validTo")}}
    return {**head, "problem": body}


def test_json_lookups_equal_single_key_reads(store: tuple[str, httpx.Client]) -> None:
    _wh, client = store
    pairs = _pairs(300, 1)
    body = {"lookups": [{"key": k, **({} if t is None else {"asOf": t})} for k, t in pairs]}
    resp = client.post("/v1/stores/s/lookups", json=body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    snapshot = answer["snapshot"]
    assert answer["store"] == "s" and len(answer["results"]) == len(pairs)
    for (key, as_of), result in zip(pairs, answer["results"], strict=True):
        assert result == _single(client, key, as_of, snapshot), (key, as_of)
    # NDJSON: the same results, one per line, in order
    lines = client.post("/v1/stores/s/lookups", json=body, headers={"Accept": "application/x-ndjson"})
    assert lines.headers["content-type"] == "application/x-ndjson"
    assert [json.loads(line) for line in lines.text.splitlines()] == answer["results"]


def _table(pairs: list[tuple[str, int | None]]) -> pa.Table:
    return pa.table({"key": [k for k, _ in pairs], "asOf": pa.array([t for _, t in pairs], pa.int64())})


def _expected_rows(client: httpx.Client, pairs: list[tuple[str, int | None]], snapshot: int) -> list[dict[str, Any]]:
    rows = []
    for key, as_of in pairs:
        single = _single(client, key, as_of, snapshot)
        record, problem = single.get("record"), single.get("problem")
        rows.append({
            "key": key, "as_of": as_of,
            "outcome": "ok" if record else problem["type"].rsplit("/", 1)[1],
            "value": None if record is None else json.dumps(record["value"], separators=(",", ":")),
            "timestamp": None if record is None else record["timestamp"],
            "valid_to": None if record is None else record["validTo"],
            "deleted_at": None if problem is None else problem.get("deletedAt"),
        })
    return rows


def _normalized(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "value": None if r["value"] is None else json.dumps(json.loads(r["value"]), separators=(",", ":"))}
            for r in rows]


@pytest.mark.parametrize("upload", [ARROW, PARQUET])
@pytest.mark.parametrize("accept", [ARROW, PARQUET])
def test_uploaded_tables_are_answered_as_tables(store: tuple[str, httpx.Client], upload: str, accept: str) -> None:
    _wh, client = store
    pairs = _pairs(500, 2)
    table = _table(pairs)
    sink = io.BytesIO()
    if upload == PARQUET:
        pq.write_table(table, sink)
    else:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    resp = client.post("/v1/stores/s/lookups", content=sink.getvalue(),
                       headers={"content-type": upload, "accept": accept})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == accept
    if accept == PARQUET:
        answer = pq.read_table(io.BytesIO(resp.content))
    else:
        with pa.ipc.open_stream(resp.content) as reader:
            answer = reader.read_all()
    snapshot = int(answer.schema.metadata[b"versiq.snapshot"])
    assert _normalized(answer.to_pylist()) == _normalized(_expected_rows(client, pairs, snapshot))


def test_lookup_errors_are_precise(store: tuple[str, httpx.Client]) -> None:
    _wh, client = store
    for body, field in (({"lookups": []}, "lookups"), ({"lookups": [{"key": ""}]}, "lookups"),
                        ({"lookups": [{"key": "a", "asOf": "soon"}]}, "asOf"), ({"pairs": []}, "pairs")):
        resp = client.post("/v1/stores/s/lookups", json=body)
        assert resp.status_code == 400 and resp.json()["field"] == field, resp.text
    too_many = client.post("/v1/stores/s/lookups", json={"lookups": [{"key": "a"}] * 100_001})
    assert too_many.status_code in (400, 413), too_many.text
    refused = client.post("/v1/stores/s/lookups", json={"lookups": [{"key": "a"}]}, headers={"accept": "text/csv"})
    assert refused.status_code == 406 and refused.json()["type"].endswith("/not-acceptable")
    bad_table = client.post("/v1/stores/s/lookups", content=b"not parquet", headers={"content-type": PARQUET})
    assert bad_table.status_code == 400 and "not a readable" in bad_table.json()["detail"]
    no_key = pa.table({"k": ["a"]})
    sink = io.BytesIO()
    pq.write_table(no_key, sink)
    missing = client.post("/v1/stores/s/lookups", content=sink.getvalue(), headers={"content-type": PARQUET})
    assert missing.status_code == 400 and "'key' column" in missing.json()["detail"]
    assert client.post("/v1/stores/s/lookups", content=b"x", headers={"content-type": "text/csv"}).status_code == 415
    assert client.get("/v1/stores/s/lookups").status_code == 405
    assert client.post("/v1/stores/nope/lookups", json={"lookups": [{"key": "a"}]}).status_code == 404


def test_the_cli_writes_the_answers_of_the_api(store: tuple[str, httpx.Client], tmp_path: Any) -> None:
    wh, client = store
    pairs = _pairs(200, 3)
    source = str(tmp_path / "pairs.parquet")
    pq.write_table(_table(pairs), source)
    for output in ("answers.parquet", "answers.arrow", "answers.jsonl"):
        target = str(tmp_path / output)
        done = subprocess.run([sys.executable, "-m", "versiq.cli", "lookup", "--warehouse", wh, "--store", "s",
                               "--input", source, "--output", target], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        if output.endswith(".jsonl"):
            with open(target, encoding="utf-8") as handle:
                results = [json.loads(line) for line in handle]
            snapshot = client.get("/v1/stores/s").json()["snapshot"]
            assert results == [_single(client, k, t, snapshot) for k, t in pairs]
            continue
        if output.endswith(".parquet"):
            answer = pq.read_table(target)
        else:
            with pa.ipc.open_file(target) as reader:
                answer = reader.read_all()
        snapshot = int(answer.schema.metadata[b"versiq.snapshot"])
        assert _normalized(answer.to_pylist()) == _normalized(_expected_rows(client, pairs, snapshot))
    bad = subprocess.run([sys.executable, "-m", "versiq.cli", "lookup", "--warehouse", wh, "--store", "s",
                          "--input", str(tmp_path / "missing.parquet"), "--output", str(tmp_path / "x.parquet")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "missing.parquet" in bad.stderr
