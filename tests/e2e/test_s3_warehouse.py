"""The warehouse on a real S3-compatible server (issue 15): SeaweedFS's ``weed mini`` on 127.0.0.1
(the ``s3_server`` fixture), written by the real Spark ingest through S3A and versiq's conditional-put
LogStore, read by the real engine (delta-rs, DuckDB over pyarrow's S3 file system) and served by
uvicorn / ``versiq serve``.

The yardstick is a local warehouse fed the same input: an ``s3://`` warehouse must give the same
stores, the same answers and the same rejected records, the same derived tables (rows, emissions,
subscriptions; a pass in this process and one in Spark tasks); and the reference model where a
topic is the source (the Kafka property test, run against S3 here).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ingest.test_ingest_cli import VERSIQ
from tests.ingest.test_kafka_ingest import _partition, _spec, consume, model_records, new_topic
from tests.support.e2e import collect_pages, key_path, serve_engine
from tests.support.ingest import ingest_in_process, model_versions, rejected_rows, store_versions, stream_times
from tests.support.processes import run_then_kill
from tests.support.reference import ReferenceStore
from tests.support.server_process import free_ports
from versiq import layout, sql, storage
from versiq.ingest.config import Pipeline
from versiq.ingest.derived.spec import parse_tables
from versiq.ingest.maintain import maintain_store
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.run import run_pipeline
from versiq.ingest.spark import FETCH_HINT_S3, configure_s3, s3_jars_present

BUCKET = "versiq-wh"
H = 300  # history retention (ms) of the test stores
KEYS = [f"k{i}" for i in range(10)] + ["é-key", "a/b"]
#: Derived tables over the store ``s`` (docs/derived-tables.md): a filter, a group-by aggregate of
#: it (keys "0", "1", "2") and a foreign-key join of the store with the aggregate; one topology.
TABLES = [
    {"name": "even", "from": "s", "filter": "value.n % 2 = 0"},
    {"name": "by_len", "from": "even", "group_by": "length(value.s)", "aggregate": {"count": True, "sum": "value.n"}},
    {"name": "with_len", "fk_join": {"left": "s", "right": "by_len", "foreign_key": "length(value.s)",
                                     "type": "left"}},
]
DERIVED = [t["name"] for t in TABLES]

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def s3(spark: Any, s3_server: Any) -> Iterator[Any]:
    """The AWS variables of the test server in this process (the engine, delta-rs, boto3 and the
    CLI's subprocesses read them) and in the session's SparkSession; the bucket created."""
    if not s3_jars_present():
        pytest.fail(f"the S3 jars are missing: {FETCH_HINT_S3}", pytrace=False)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3_server.env().items():
            mp.setenv(name, value)
        mp.setenv("VERSIQ_LEASE_TTL", "6s")
        assert configure_s3(spark, s3_server.env())
        s3_server.create_bucket(BUCKET)
        yield s3_server


def _warehouse(prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix}-{uuid.uuid4().hex[:8]}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYSPARK_PYTHON=sys.executable, VERSIQ_SHUFFLE_PARTITIONS="2")
    env.pop("SPARK_MASTER", None)
    return env


def _lines(rng: random.Random, n: int, base: int) -> list[str]:
    out = []
    for i in range(n):
        value = None if rng.random() < 0.15 else {"n": i, "s": "é" * rng.randrange(3)}
        out.append(json.dumps({"key": rng.choice(KEYS), "value": value, "timestamp": base + rng.randrange(400)},
                              ensure_ascii=False))
    out.append('{"key": "bad", "value": 1}')  # no timestamp: rejected, kept with its reason
    out.append("not json")
    return out


def _write(folder: str, name: str, lines: list[str]) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def _same_stores(s3_path: str, local_path: str) -> None:
    assert store_versions(s3_path) == store_versions(local_path)
    assert stream_times(s3_path) == stream_times(local_path)
    key = lambda r: (r["run"], r["reason"], r["line"], r["raw"])  # noqa: E731
    assert sorted(map(key, rejected_rows(s3_path))) == sorted(map(key, rejected_rows(local_path)))


def _side_rows(table_path: str, side: str) -> list[dict[str, Any]]:
    """Every row of a derived table's side table (``_emitted``, ``_subscriptions``), sorted."""
    rows = storage.delta_table(storage.join(table_path, side)).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def _same_derived(remote: str, local: str) -> None:
    """Each derived table of the bucket equals the local one: its versions, stream times and
    rejected results, every emission (run, sequence, cause) and the join's subscriptions."""
    for name in DERIVED:
        path = layout.table_path(remote, name)
        _same_stores(path, os.path.join(local, name))
        emitted = _side_rows(path, "_emitted")
        assert emitted == _side_rows(os.path.join(local, name), "_emitted"), name
        assert {r["run"] for r in emitted} == {1, 2}, name  # a pass in each of the two runs
    path = layout.table_path(remote, "with_len")
    subscriptions = _side_rows(path, "_subscriptions")
    assert subscriptions and subscriptions == _side_rows(os.path.join(local, "with_len"), "_subscriptions")


def _answers(url: str) -> dict[str, Any]:
    """Every answer the tests compare, from one server: latest and as-of reads, versions ranges
    (paged to the end), the key listing; reads of the derived tables and their provenance."""
    out: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for name in DERIVED:
            meta = client.get(f"/v1/stores/{name}").json()
            out[f"{name} meta"] = {k: meta.get(k) for k in ("kind", "streamTime", "inputs", "sources")}
        for name, key in (("by_len", "1"), ("with_len", "é-key"), ("even", "a/b")):
            resp = client.get(key_path(name, key), params={"asOf": 2_500})
            body = resp.json()
            body.pop("snapshot", None)
            body.pop("instance", None)
            out[f"{name} {key}"] = (resp.status_code, body)
        meta = client.get("/v1/stores/s").json()
        out["meta"] = {k: meta[k] for k in ("kind", "partitions", "streamTime") if k in meta}
        for key in KEYS:
            for as_of in (None, 1_100, 1_250, 1_400, 2_100, 2_350):
                resp = client.get(key_path("s", key), params={} if as_of is None else {"asOf": as_of})
                body = resp.json()
                body.pop("snapshot", None)
                body.pop("instance", None)
                out[f"{key}@{as_of}"] = (resp.status_code, body)
            records, _pages = collect_pages(client, key_path("s", key, "/versions"),
                                            {"from": 1_000, "to": 3_000, "pageSize": 3})
            out[f"{key} versions"] = records
        listing = client.get("/v1/stores/s/keys", params={"includeDeleted": "true"}).json()
        out["keys"] = listing["records"]
    return out


@pytest.mark.rule(19, 20, 21)
def test_an_s3_warehouse_equals_a_local_one_across_runs_maintain_and_http(spark, s3, tmp_path, caplog):
    rng = random.Random(15)
    local, remote = str(tmp_path / "wh"), _warehouse("equal")
    tables = parse_tables(TABLES, {"s": "versioned"})
    for run, base in enumerate((1_000, 1_200, 2_000)):
        source = _write(str(tmp_path / f"run{run}"), f"r{run}.jsonl", _lines(rng, 120, base))
        # the bucket's store reads its files from the bucket too
        in_bucket = f"{remote}-src/run{run}/r{run}.jsonl"
        with open(source, "rb") as handle, s3.filesystem().open_output_stream(in_bucket[5:]) as out:
            out.write(handle.read())
        for wh, src in ((local, source), (remote, in_bucket)):
            spec = StoreSpec(name="s", source=src, history_retention_ms=H, max_future_ms=None)
            # the derived tables from run 1 on: added over the store (their first pass starts from
            # what its run 0 left); the bucket's second pass in Spark tasks (which read the tables'
            # state from the bucket), every other pass in this process (both ways give the same
            # tables, and a Spark job costs seconds)
            pipeline = Pipeline(stores=[replace(spec, changelog=bool(run))], tables=tables if run else [])
            with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.INFO, logger="versiq.ingest"):
                mp.setenv("VERSIQ_DERIVE_HERE_RECORDS", "0" if (run, wh) == (2, remote) else "100000")
                done = run_pipeline(spark, wh, pipeline)
            assert not done.failed, done.to_json()
            report = done.stores["s"]
            assert report.rejected["malformed"] == 1 and report.rejected["missing_field"] == 1
            assert sorted(done.tables) == (sorted(DERIVED) if run else [])
    passes = [r.getMessage().rsplit(", ", 1)[1] for r in caplog.records
              if r.getMessage().startswith("derived pass over ")]
    assert passes == ["in this process"] * 3 + ["in Spark tasks"], passes
    path = layout.table_path(remote, "s")
    assert path.startswith("s3://") and layout.has_delta_log(path)
    _same_stores(path, os.path.join(local, "s"))
    _same_derived(remote, local)
    # the bucket holds the store, its rejected records, its changelog and its lock object, nothing local
    names = storage.listdir(path)
    assert {"_delta_log", "_rejected", "_changelog", "_versiq"} <= set(names), names
    # a prefix without a Delta log beside the store is not a store
    s3.filesystem().create_dir(f"{BUCKET}/{remote.split('/', 3)[3]}/not-a-store/x")
    with serve_engine(local) as (local_url, _e1), serve_engine(remote) as (remote_url, remote_engine):
        assert remote_engine.catalog.readiness()["ready"]
        assert set(remote_engine.catalog.stores) == {"s", *DERIVED}
        before = _answers(local_url)
        assert _answers(remote_url) == before
        # the derived tables are served from the bucket: a value, and the inputs they were computed from
        assert before["with_len é-key"][0] == 200 and before["by_len 1"][0] == 200, before
        assert set(before["with_len meta"]["inputs"]) == {"s", "by_len"}, before["with_len meta"]
        # the serving index of the bucket's store is in this host's cache folder, never in the bucket
        cached = [name for _dir, _subdirs, files in os.walk(remote_engine.catalog.cache_dir) for name in files]
        assert "rows.arrow" in cached and not remote_engine.catalog.cache_dir.startswith("s3://")
        in_bucket_files = storage.list_files(remote) or {}
        assert in_bucket_files and not [key for key in in_bucket_files if key.endswith(".arrow")]
        # continuous mode's compaction on the bucket: each bucket's recent files merged into one
        # (a replaceWhere on the data columns bucket and run), answering the same
        merged = maintain_store(remote, "s", 60, lambda: spark, recent_only=True, rewrite_share=1e9)
        maintain_store(local, "s", 60, lambda: spark, recent_only=True, rewrite_share=1e9)
        assert merged["buckets_merged"] > 0 and merged["buckets_rewritten"] == 0, merged
        remote_engine.refresh()
        _e1.refresh()
        assert _answers(remote_url) == _answers(local_url)
        # maintain on the bucket: compaction and vacuum answer the same, from a new snapshot
        result = maintain_store(remote, "s", 60, lambda: spark)
        maintain_store(local, "s", 60, lambda: spark)
        assert result["buckets_rewritten"] > 0 and result["rows_after"] <= result["rows_before"]
        remote_engine.refresh()
        _e1.refresh()
        assert _answers(remote_url) == _answers(local_url)
        # snapshot 0 (an older snapshot read through DuckDB over S3) answers as the local one
        with httpx.Client(base_url=remote_url) as rc, httpx.Client(base_url=local_url) as lc:
            for key in KEYS[:4]:
                a = rc.get(key_path("s", key, "/versions"), params={"snapshot": 0, "from": 0})
                b = lc.get(key_path("s", key, "/versions"), params={"snapshot": 0, "from": 0})
                assert (a.status_code, a.json().get("records")) == (b.status_code, b.json().get("records"))
    # SQL over the bucket's snapshot equals SQL over the local one
    query = "SELECT key, value, valid_from, valid_to, deleted FROM s ORDER BY key, valid_from"
    assert sql.connect(remote).sql(query).fetchall() == sql.connect(local).sql(query).fetchall()
    # the CLI over the bucket: rejected records and the key listing
    listings = []
    for wh in (remote, local):
        listed = subprocess.run([*VERSIQ, "rejected", "--warehouse", wh, "--store", "s"], env=_env(),
                                capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr
        listings.append(sorted(json.dumps({k: v for k, v in json.loads(line).items() if k != "ingested_at"})
                               for line in listed.stdout.splitlines()))
    assert listings[0] == listings[1]
    assert {json.loads(line)["reason"] for line in listings[0]} >= {"malformed", "missing_field", "late"}
    keys = subprocess.run([*VERSIQ, "keys", "--warehouse", remote, "--store", "s"], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert keys.returncode == 0, keys.stderr
    assert [json.loads(line)["key"] for line in keys.stdout.splitlines()] == \
        sorted({r["key"] for r in before["keys"] if not r.get("deleted")}, key=lambda k: k.encode())


def test_warehouse_locations_are_checked_before_any_work(s3, tmp_path):
    for bad, message in (("ftp://x/y", "unsupported warehouse location"), ("s3://", "names no bucket"),
                         ("s3://key:secret@bucket/wh", "must not carry credentials")):
        done = subprocess.run([*VERSIQ, "ingest", "--warehouse", bad, "--store", "s", "--source", str(tmp_path)],
                              env=_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "secret" not in done.stderr or "credentials" in done.stderr


def _serve(port: int, warehouse: str, secret: str) -> subprocess.Popen[str]:
    env = _env()
    env.update(VERSIQ_TOKEN_SECRET=secret, VERSIQ_REFRESH_INTERVAL="200ms")
    return subprocess.Popen([*VERSIQ, "serve", "--warehouse", warehouse, "--port", str(port), "--log-level",
                             "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_ready(url: str, deadline: float) -> dict[str, Any]:
    while True:
        try:
            resp = httpx.get(url + "/readyz", timeout=5)
            if resp.status_code == 200:
                body: dict[str, Any] = resp.json()
                return body
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} never became ready"
        time.sleep(0.2)


def test_two_serve_processes_over_one_bucket_converge_and_accept_each_others_tokens(spark, s3, tmp_path):
    remote = _warehouse("replicas")
    rng = random.Random(3)
    first = _write(str(tmp_path / "r0"), "r0.jsonl",
                   [json.dumps({"key": "k", "value": i, "timestamp": 1_000 + i}) for i in range(40)])
    spec = StoreSpec(name="s", source=first, history_retention_ms=10_000, max_future_ms=None)
    assert run_ingest(spark, remote, [spec]).stores["s"].error is None
    ports = free_ports(2)
    servers = [_serve(port, remote, "shared-secret") for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    writer: threading.Thread | None = None
    try:
        for url in urls:
            ready = _wait_ready(url, time.monotonic() + 90)
            assert ready["stores"]["s"]["snapshot"] == 0
            assert "AWS" not in json.dumps(ready) and s3.secret_key not in json.dumps(ready)
        stop = threading.Event()
        errors: list[BaseException] = []

        def ingest_more() -> None:
            try:
                for run in range(1, 4):
                    lines = [json.dumps({"key": "k", "value": 100 * run + i, "timestamp": 2_000 + 100 * run + i})
                             for i in range(rng.randrange(5, 15))]
                    source = _write(str(tmp_path / f"r{run}"), f"r{run}.jsonl", lines)
                    report = run_ingest(spark, remote, [StoreSpec(name="s", source=source,
                                                                  history_retention_ms=10_000,
                                                                  max_future_ms=None)])
                    assert report.stores["s"].error is None
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)
            finally:
                stop.set()

        writer = threading.Thread(target=ingest_more, daemon=True)
        writer.start()
        pages = 0
        with httpx.Client(timeout=30) as client:
            while not stop.is_set() or pages < 3:
                # page 1 from one replica, the rest from the other with its token
                a, b = urls if pages % 2 == 0 else urls[::-1]
                first_page = client.get(a + key_path("s", "k", "/versions"),
                                        params={"from": 0, "pageSize": 7}).json()
                records, snapshot = list(first_page["records"]), first_page["snapshot"]
                token = first_page.get("nextPageToken")
                while token:
                    resp = client.get(b + key_path("s", "k", "/versions"), params={"from": 0, "pageToken": token})
                    assert resp.status_code == 200, resp.text
                    body = resp.json()
                    assert body["snapshot"] == snapshot
                    records += body["records"]
                    token = body.get("nextPageToken")
                whole = client.get(a + key_path("s", "k", "/versions"),
                                   params={"from": 0, "pageSize": 1000, "snapshot": snapshot}).json()
                assert records == whole["records"]
                pages += 1
        writer.join(timeout=600)
        assert not errors, errors
        head = storage.delta_table(layout.table_path(remote, "s")).version()
        deadline = time.monotonic() + 10  # refresh bound: 200 ms interval + load
        for url in urls:
            while httpx.get(url + "/v1/stores/s", timeout=10).json()["snapshot"] != head:
                assert time.monotonic() < deadline, f"{url} did not reach snapshot {head}"
                time.sleep(0.1)
    finally:
        if writer is not None:
            writer.join(timeout=600)  # never leave a run writing after the server's variables are gone
        for proc in servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in servers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.stderr is not None:
                proc.stderr.close()


def _ingest_args(warehouse: str, source: str) -> list[str]:
    return [*VERSIQ, "ingest", "--warehouse", warehouse, "--store", "c", "--source", source,
            "--history-retention", str(H), "--max-future", "none", "--log-level", "info"]


def _big_source(tmp_path: Any) -> str:
    rng = random.Random(21)
    folder = str(tmp_path / "src")
    for i in range(3):
        _write(folder, f"part{i}.jsonl", _lines(rng, 400, 1_000 + 300 * i))
    return folder


@dataclass
class BigRun:
    """``_big_source`` (``source``), its store ``spec`` and an uninterrupted local run of it, the
    reference of the crash tests: made once for the module, in a thread of this process while
    the first test's CLI runs start (``reference()`` waits for it)."""

    source: str
    spec: StoreSpec
    made: concurrent.futures.Future[Any]
    path: str

    def reference(self) -> str:
        """The reference store, once made. Called before a test's own run in this process: the
        two never share the session at once."""
        assert self.made.result(timeout=600).stores["c"].error is None
        return self.path


@pytest.fixture(scope="module")
def big_run(spark: Any, tmp_path_factory: Any) -> Iterator[BigRun]:
    folder = tmp_path_factory.mktemp("s3-big-run")
    source = _big_source(folder)
    spec = StoreSpec(name="c", source=source, history_retention_ms=H, max_future_ms=None)
    reference = str(folder / "ref")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield BigRun(source, spec, pool.submit(run_ingest, spark, reference, [spec]), os.path.join(reference, "c"))


@pytest.mark.slow
def test_sigkill_of_an_ingest_writing_to_s3_then_rerun_equals_an_uninterrupted_run(spark, s3, big_run):
    source, spec = big_run.source, big_run.spec
    moments = [(None, 6.0), ("committing run 1", 0.0)]
    remotes = [_warehouse(f"kill{i}") for i in range(len(moments))]
    # both runs killed at once (each watched by a thread of its own: much of their time is their
    # JVMs' start), each in a warehouse of its own
    with concurrent.futures.ThreadPoolExecutor(len(moments)) as pool:
        killed = [pool.submit(run_then_kill, _ingest_args(remote, source), _env(), marker, delay)
                  for remote, (marker, delay) in zip(remotes, moments, strict=True)]
        for future in killed:
            future.result(timeout=600)
    reference = big_run.reference()
    for i, remote in enumerate(remotes):
        # the killed run's lease is still in the bucket: the rerun takes it over (same host, the
        # holder's process is gone) and completes the store; after the kill at the commit, the
        # CLI's own rerun (its command in this process, the session's Spark: no JVM start); after
        # the other, the same run as the reference's spec
        if i == 1:
            status, printed = ingest_in_process(spark, *_ingest_args(remote, source)[len(VERSIQ) + 1:])
            assert status == 0, printed
        else:
            report = run_ingest(spark, remote, [spec]).stores["c"]
            assert report.error is None, report.error
        _same_stores(layout.table_path(remote, "c"), reference)


@pytest.mark.slow
def test_the_s3_server_restarting_during_an_ingest_then_rerun_equals_an_uninterrupted_run(spark, s3, big_run):
    source, spec = big_run.source, big_run.spec
    remote = _warehouse("restart")
    proc = subprocess.Popen(_ingest_args(remote, source), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "run 1 over" in line:
                s3.restart()  # ~1-4 s without a server, in the middle of the run
                break
        rest = proc.stderr.read()
        code = proc.wait(timeout=600)
    finally:
        proc.stderr.close()
        s3.ensure_running()
    path = layout.table_path(remote, "c")
    if code != 0:  # failed cleanly, with a message
        assert "FAILED" in rest or "error" in rest.lower(), rest
    reference = big_run.reference()
    # the rerun in the session's Spark (the spec the CLI's arguments make; no JVM start)
    report = run_ingest(spark, remote, [spec]).stores["c"]
    assert report.error is None, report.error
    _same_stores(path, reference)


changelogs = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "dé", "e"]), st.one_of(st.none(), st.integers(0, 9)),
                                 st.integers(1, 300)), min_size=1, max_size=30)


@pytest.mark.rule(2, 3, 19, 20, 21)
@settings(max_examples=3, deadline=None)
@given(records=changelogs, data=st.data())
def test_random_topic_changelogs_in_random_runs_give_the_same_store_on_s3_as_the_model(
        spark, s3, kafka_broker, tmp_path_factory, records, data):
    """The Kafka property test against an ``s3://`` warehouse: a random changelog produced in
    random chunks, one run after each, into a bucket and into a local warehouse: both equal the
    model fed the whole topic at once."""
    partitions = data.draw(st.integers(1, 3), label="partitions")
    history = data.draw(st.sampled_from([0, 20, 100]), label="history retention")
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(records) - 1)), max_size=2), label="cuts"))
    topic = new_topic(kafka_broker, "s3-property", partitions)
    local, remote = str(tmp_path_factory.mktemp("s3-property")), _warehouse("property")
    spec = _spec("p", kafka_broker, topic, history_retention_ms=history)
    for chunk in (records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)], strict=True)):
        if not chunk:
            continue
        kafka_broker.produce(topic, [{"key": k, "value": None if v is None else str(v),
                                      "partition": _partition(k, partitions), "timestamp_ms": ts}
                                     for k, v, ts in chunk])
        for wh in (remote, local):
            report = run_ingest(spark, wh, [spec]).stores["p"]
            assert report.error is None, report.error
    model = ReferenceStore(history_retention_ms=history, partitions=partitions)
    model.run(model_records(consume(kafka_broker, topic)))
    path = layout.table_path(remote, "p")
    assert store_versions(path) == model_versions(model, {k for k, _v, _t in records})
    assert stream_times(path) == model.stream_time
    _same_stores(path, os.path.join(local, "p"))


def test_an_unreachable_bucket_makes_the_service_not_ready_and_says_why(s3, monkeypatch):
    """Nothing listens on the endpoint: the engine starts, serves nothing, is not ready, and
    ``/readyz`` says the warehouse cannot be listed (without any credential in the text)."""
    dead = free_ports(1)[0]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead}")
    with serve_engine(_warehouse("unreachable")) as (url, engine):
        body = httpx.get(url + "/readyz", timeout=60).json()
        assert body["ready"] is False and "cannot list the warehouse" in body["warehouse"], body
        assert s3.secret_key not in json.dumps(body) and s3.access_key not in json.dumps(body)
        assert engine.catalog.stores == {}


def test_two_ingests_of_one_store_take_turns_and_never_commit_on_one_snapshot(s3, tmp_path):
    """Two ``versiq ingest`` processes (two JVMs, as two machines would be) write one store in
    the bucket at once: the lease makes one wait for the other, both runs are committed, and
    every commit was made on the snapshot before it (Delta's ``readVersion``)."""
    remote = _warehouse("writers")
    sources = []
    for name in ("a", "b"):
        lines = [json.dumps({"key": f"{name}{i % 5}", "value": i, "timestamp": 1_000 + i}) for i in range(50)]
        sources.append(_write(str(tmp_path / name), f"{name}.jsonl", lines))
    procs = [subprocess.Popen([*VERSIQ, "ingest", "--warehouse", remote, "--store", "w", "--source", source,
                               "--max-future", "none", "--lock-timeout", "300s"], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for source in sources]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert s3.secret_key not in out + err
    path = layout.table_path(remote, "w")
    head = storage.delta_table(path).version()
    state = layout.read_state(path, head)
    assert state.run == 2 and sorted(state.done_files) == ["a.jsonl", "b.jsonl"], state
    for version in range(1, head + 1):
        info = next(json.loads(line)["commitInfo"] for line in storage.read_text(layout.log_file(path, version))
                    .splitlines() if line.startswith('{"commitInfo"'))
        assert info["readVersion"] == version - 1, (version, info)
    versions = store_versions(path)
    assert sorted(versions) == [f"{n}{i}" for n in "ab" for i in range(5)]
    # maintain waits for a writer's lease like an ingest does
    from versiq.ingest.errors import LockTimeout
    from versiq.ingest.store import writer_lock

    with writer_lock(path, 5), pytest.raises(LockTimeout, match="locked by another writer"):
        maintain_store(remote, "w", 1)


def test_continuous_ingest_watches_an_s3_source_into_an_s3_warehouse(s3, tmp_path):
    """``--continuous`` with both the source prefix and the warehouse in the bucket: a file that
    lands under the prefix is ingested by the running job and served; SIGTERM stops it cleanly."""
    remote = _warehouse("continuous")
    source = f"{remote}-src"
    fs = s3.filesystem()

    def land(name: str, key: str, value: int, ts: int) -> None:
        with fs.open_output_stream(f"{source[5:]}/{name}") as out:
            out.write(json.dumps({"key": key, "value": value, "timestamp": ts}).encode() + b"\n")

    land("a.jsonl", "a", 1, 1_000)
    proc = subprocess.Popen([*VERSIQ, "ingest", "--warehouse", remote, "--store", "live", "--source", source,
                             "--continuous", "--trigger-interval", "500ms", "--max-future", "none"],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    path = layout.table_path(remote, "live")
    try:
        deadline = time.monotonic() + 180
        while not layout.has_delta_log(path):
            assert proc.poll() is None and time.monotonic() < deadline, "the first run did not commit"
            time.sleep(0.5)
        with serve_engine(remote, refresh_interval_s=0.5) as (url, _engine), httpx.Client(base_url=url) as client:
            land("b.jsonl", "b", 2, 2_000)
            deadline = time.monotonic() + 120
            while client.get(key_path("live", "b")).status_code != 200:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "b did not become visible"
                time.sleep(0.3)
            assert client.get(key_path("live", "a")).json()["value"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err
    assert s3.secret_key not in err
    # the prefix is listed every trigger interval (a LIST request each), no streaming query or checkpoint
    assert "watching 1 S3 source(s) for new objects (listed every 0.5s)" in err, err
    assert set(storage.listdir(remote)) >= {"live"}
    assert not storage.exists(storage.join(remote, "_versiq", "continuous"))
