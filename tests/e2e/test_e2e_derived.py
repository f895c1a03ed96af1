"""End to end through the CLI: `versiq ingest --config` with streams and derived tables (a real
subprocess), then the HTTP API on a live uvicorn: derived stores, stream records, provenance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.e2e import key_path, serve_engine
from tests.support.ingest import ingest_in_process, store_versions

PIPELINE = """
stores:
  - {name: orders, source: data/orders/}
  - {name: customers, source: data/customers/}
  - {name: prices, source: data/prices/}
streams:
  - {name: clicks, source: data/clicks/}
tables:
  - {name: big_orders, from: orders, filter: "value.amount > 100"}
  - name: orders_with_customer
    fk_join: {left: orders, right: customers, foreign_key: "value.customer_id", type: left}
    select: {amount: "value.left.amount", customer: "value.right.name"}
  - name: revenue_by_region
    from: orders
    group_by: "value.region"
    aggregate: {count: true, sum: "value.amount"}
  - {name: clicks_priced, stream_join: {stream: clicks, table: prices, type: left}}
  - {name: last_click_price, from: clicks_priced}
"""

FILES = {
    "orders/1.jsonl": [
        {"key": "o1", "value": {"amount": 150, "customer_id": "c1", "region": "eu"}, "timestamp": 1000},
        {"key": "o2", "value": {"amount": 50.5, "customer_id": "c2", "region": "us"}, "timestamp": 1100},
        {"key": "o1", "value": {"amount": 90, "customer_id": "c2", "region": "eu"}, "timestamp": 1200},
    ],
    "customers/1.jsonl": [
        {"key": "c1", "value": {"name": "Ann"}, "timestamp": 500},
        {"key": "c2", "value": {"name": "Bob"}, "timestamp": 1150},
    ],
    "prices/1.jsonl": [{"key": "p1", "value": 10, "timestamp": 900}, {"key": "p1", "value": 12, "timestamp": 2000}],
    "clicks/1.jsonl": [
        {"key": "p1", "value": {"user": "u1"}, "timestamp": 1000},
        {"key": "p1", "value": {"user": "u2"}, "timestamp": 2500},
        {"key": "p2", "value": {"user": "u3"}, "timestamp": 1000},
    ],
}


def _ingest(root: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = root / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", str(root / "wh"), "--config",
         str(root / "pipeline.yaml"), "--report", str(report)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": os.getcwd()})
    return result, json.loads(report.read_text()) if report.exists() else {}


def test_pipeline_file_through_cli_and_http(tmp_path: Path) -> None:
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    for rel, records in FILES.items():
        path = tmp_path / "data" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result, report = _ingest(tmp_path)
    assert result.returncode == 0, result.stderr
    assert set(report) == {"stores", "streams", "tables"}
    assert report["streams"]["clicks"]["appended"] == 3
    tables = report["tables"]
    assert tables["clicks_priced"]["kind"] == "stream" and tables["clicks_priced"]["emitted"] == 3
    assert tables["revenue_by_region"]["emitted"] == 3  # o1 eu, o2 us, o1 eu->eu (one atomic update)
    assert tables["orders_with_customer"]["inputs"] == {"orders": 0, "customers": 0}
    assert "table revenue_by_region (versioned): emitted 3" in result.stderr

    with serve_engine(str(tmp_path / "wh")) as (url, _engine), httpx.Client(base_url=url, timeout=30) as client:
        names = {s["name"] for s in client.get("/v1/streams").json()["streams"]}
        assert names == {"clicks", "clicks_priced"}
        stores = {s["name"] for s in client.get("/v1/stores").json()["stores"]}
        assert {"big_orders", "orders_with_customer", "revenue_by_region", "last_click_price"} <= stores
        assert "clicks_priced" not in stores

        r = client.get(key_path("revenue_by_region", "eu"))
        assert r.status_code == 200 and r.json()["value"] == {"count": 1, "sum": 90}, r.text
        r = client.get(key_path("revenue_by_region", "eu"), params={"asOf": 1100})
        assert r.json()["value"] == {"count": 1, "sum": 150}, r.text
        r = client.get(key_path("orders_with_customer", "o1"))
        assert r.json()["value"] == {"amount": 90, "customer": "Bob"}, r.text
        r = client.get(key_path("big_orders", "o1"))
        assert r.status_code == 404  # 90 fails the filter: a tombstone at 1200
        r = client.get(key_path("big_orders", "o1"), params={"asOf": 1199})
        assert r.json()["value"]["amount"] == 150

        r = client.get("/v1/streams/clicks_priced/records", params={"key": "p1"})
        assert r.status_code == 200, r.text
        assert [(x["value"]["right"], x["timestamp"]) for x in r.json()["records"]] == [(10, 1000), (12, 2500)]
        info = client.get("/v1/stores/last_click_price").json()
        assert info["inputs"] == {"clicks_priced": 0}
        assert info["sources"] == {"clicks": {"run": 1, "snapshot": 0}, "prices": {"run": 1, "snapshot": 0}}
        # derived tables have a history and a change feed like source stores (issue 16 items 5-6)
        commits = client.get("/v1/stores/revenue_by_region/history").json()["commits"]
        assert [c["operation"] for c in commits] == ["derive"]
        feed = client.get("/v1/stores/revenue_by_region/changes", params={"sinceSnapshot": -1}).json()["changes"]
        expected = store_versions(str(tmp_path / "wh" / "revenue_by_region"))
        assert sorted((c["key"], c["timestamp"], c["deleted"]) for c in feed) == \
            sorted((k, v.timestamp, v.value is None) for k, vs in expected.items() for v in vs)

    # a second run with nothing new changes nothing
    result, report = _ingest(tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(entry["run"] is None for entry in report["tables"].values())

    # a changed definition is refused before any data is touched (not applied to new records only)
    (tmp_path / "pipeline.yaml").write_text(PIPELINE.replace("value.amount > 100", "value.amount > 10"))
    (tmp_path / "report.json").unlink()
    result, report = _ingest(tmp_path)
    assert result.returncode == 2, result.stderr
    assert "tables (big_orders): the definition changed since the table was built" in result.stderr


def test_continuous_mode_updates_derived_tables_when_a_file_lands(tmp_path: Path) -> None:
    import signal
    import time

    from tests.support.ingest import store_versions

    (tmp_path / "pipeline.yaml").write_text(
        "stores:\n  - {name: orders, source: data/orders/}\n"
        "tables:\n  - {name: by_region, from: orders, group_by: value.region, aggregate: {count: true}}\n")
    orders = tmp_path / "data" / "orders"
    orders.mkdir(parents=True)
    (orders / "1.jsonl").write_text('{"key":"o1","value":{"region":"eu"},"timestamp":1}\n')
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "versiq.cli", "ingest", "--warehouse", str(tmp_path / "wh"), "--config",
         str(tmp_path / "pipeline.yaml"), "--continuous", "--trigger-interval", "1s", "--report", str(report)],
        env={**os.environ, "PYTHONPATH": os.getcwd()}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True)
    table = str(tmp_path / "wh" / "by_region")

    def wait_for(predicate: object, what: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}")

    try:
        wait_for(lambda: report.exists() and "tables" in json.loads(report.read_text()), "the first micro-batch")
        (orders / "2.jsonl").write_text('{"key":"o2","value":{"region":"eu"},"timestamp":2}\n')
        wait_for(lambda: any(v.value == '{"count":2}' for v in store_versions(table).get("eu", [])),
                 "the derived table to count the new order")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, proc.stderr.read() if proc.stderr else ""


def _versiq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "versiq.cli", *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.getcwd()})


def _latest(path: Path) -> dict[str, str | None]:
    """Each key's latest value (None: a tombstone), read from the Delta table."""
    return {key: versions[-1].value for key, versions in store_versions(str(path)).items()}


def test_a_table_added_over_the_demo_store_through_the_cli(spark: Any, tmp_path: Path) -> None:
    """Issue 10 item 12 as docs/cli.md shows it: `versiq demo` (what `make demo` runs) ingests
    `prices` without any table; a pipeline file then adds a filter table over it, and later runs
    (one without the pipeline file, as `make demo` or `versiq ingest --store` do) keep it exact.
    The runs after the demo's are the CLI's command in this process (``ingest_in_process``: no JVM
    start; a pipeline file through a ``versiq ingest`` process: ``test_pipeline_file_through_cli_and_http``)."""
    data, wh = tmp_path / "demo-data", tmp_path / "warehouse"
    result = _versiq("demo", "--no-serve", "--keys", "300", "--warehouse", str(wh), "--data", str(data))
    assert result.returncode == 0, result.stderr
    (tmp_path / "pipeline.yaml").write_text(f"""
stores:
  - {{name: prices, source: {data}}}
tables:
  - {{name: expensive, from: prices, filter: "value.price > 50"}}
""")
    config = ("ingest", "--warehouse", str(wh), "--config", str(tmp_path / "pipeline.yaml"))

    def check_expensive() -> None:
        prices = _latest(wh / "prices")
        want = {key: value if value is not None and json.loads(value)["price"] > 50 else None
                for key, value in prices.items()}
        got = _latest(wh / "expensive")
        assert {k: v for k, v in got.items() if v is not None} == {k: v for k, v in want.items() if v is not None}

    status, printed = ingest_in_process(spark, *config[1:])
    assert status == 0 and "Traceback" not in printed, printed
    assert "table expensive (versioned): emitted" in printed
    check_expensive()

    late = max(v.timestamp for vs in store_versions(str(wh / "prices")).values() for v in vs) + 1000
    (data / "later-1.jsonl").write_text(
        json.dumps({"key": "sku-new", "value": {"price": 99.5}, "timestamp": late}) + "\n")
    status, printed = ingest_in_process(spark, "--warehouse", str(wh), "--store", "prices", "--source", str(data))
    assert status == 0, printed
    (data / "later-2.jsonl").write_text(
        json.dumps({"key": "sku-new", "value": {"price": 10}, "timestamp": late + 1}) + "\n"
        + json.dumps({"key": "sku-new2", "value": {"price": 60}, "timestamp": late + 2}) + "\n")
    status, printed = ingest_in_process(spark, *config[1:])
    assert status == 0, printed
    assert "table expensive (versioned): emitted" in printed, printed
    check_expensive()
    versions = store_versions(str(wh / "expensive"))
    assert [(v.timestamp, v.value) for v in versions["sku-new"]] == [(late, '{"price":99.5}'), (late + 1, None)]
