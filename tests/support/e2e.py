"""Helpers of the end-to-end tests: real Spark ingest -> real Delta -> live uvicorn -> httpx.

The live server reuses ``test_service_support`` (free port, key paths); ``serve_engine`` differs
from ``test_service_support.live_server`` only in that the test owns the ``Engine``, so it can
call ``engine.refresh()`` itself. No tests here.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import uvicorn

from tests.support.ingest import record_line, write_jsonl
from tests.support.reference import InRecord, ReferenceStore, RunCounts
from tests.support.service import free_port, key_path
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.reports import StoreReport
from versiq.query.engine import Engine
from versiq.service.app import create_app
from versiq.service.settings import Settings

__all__ = ["key_path", "iso", "problem", "IngestedStore", "serve_engine", "collect_pages",
           "model_key_json", "model_versions_json", "PROBLEM_BASE"]

PROBLEM = "application/problem+json"
PROBLEM_BASE = "https://versiq.dev/problems/"


def iso(ms: int) -> str:
    """Epoch ms -> RFC 3339 text with millisecond precision and ``Z``."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def ms(text: str) -> int:
    """RFC 3339 text (with offset) -> epoch ms."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def problem(resp: httpx.Response, status: int, name: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM, resp.headers
    body = resp.json()
    assert body["type"] == PROBLEM_BASE + name, body
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    return body


class IngestedStore:
    """One store fed through the real ingest, run by run, mirrored in a ReferenceStore.

    ``models[s]`` is a copy of the model after the run that produced Delta snapshot ``s``.
    """

    def __init__(self, spark: Any, warehouse: str, source: str, name: str, **settings: Any) -> None:
        self.spark = spark
        self.warehouse = warehouse
        self.source = source
        self.name = name
        self.settings = settings
        def setting(name: str, default: Any) -> Any:
            value = settings.get(name)
            return default if value is None else value

        self.model = ReferenceStore(
            kind=setting("kind", "versioned"),
            history_retention_ms=setting("history_retention_ms", 86_400_000),
            partitions=setting("partitions", 1),
        )
        self.models: dict[int, ReferenceStore] = {}
        self.reports: list[StoreReport | None] = []
        self.model_counts: list[RunCounts] = []

    def run(self, files: dict[str, list[InRecord]],
            lines: dict[str, list[str]] | None = None) -> StoreReport | None:
        """Write ``files`` (relative name -> records; the text is record_line's unless ``lines``
        gives that file's lines verbatim), run the real ingest, advance the model."""
        for name, recs in files.items():
            text = (lines or {}).get(name) or [record_line(r) for r in recs]
            assert len(text) == len(recs)
            write_jsonl(self.source, name, text)
        report = run_ingest(self.spark, self.warehouse, [StoreSpec(self.name, self.source, **self.settings)])
        entry = report.stores.get(self.name)
        assert entry is None or entry.error is None, entry.error
        counts = self.model.run([r for recs in files.values() for r in recs])
        self.reports.append(entry)
        self.model_counts.append(counts)
        if entry is not None and entry.snapshot is not None:
            self.models[entry.snapshot] = copy.deepcopy(self.model)
        return entry


def report_counts(entry: StoreReport | None) -> tuple:
    if entry is None:
        return (0, 0, 0, 0, 0, {})
    return (entry.read, entry.accepted_latest, entry.accepted_out_of_order,
            entry.replaced_same_timestamp, entry.tombstones,
            {k: v for k, v in entry.rejected.items() if v})


def model_counts(c: RunCounts) -> tuple:
    return (c.read, c.accepted_latest, c.accepted_out_of_order, c.replaced_same_timestamp,
            c.tombstones, {k: v for k, v in c.rejected.items() if v})


@contextmanager
def serve_engine(warehouse: str, refresh_interval_s: float = 3600.0,
                 token_secret: bytes = b"e2e", service_refresh_s: float | None = None,
                 watch_interval_s: float | None = None) -> Iterator[tuple[str, Engine]]:
    """A started Engine (owned by the test) served by uvicorn on 127.0.0.1; yields (url, engine).
    With the default interval the engine only sees new commits when the test calls refresh():
    its watch pass is off unless ``watch_interval_s`` is given (then a commit's file landing loads
    it at once, or after that interval). ``service_refresh_s``: the interval the service believes
    in (its waits and Retry-After), when it should differ from the engine's."""
    engine = Engine(warehouse, refresh_interval_s=refresh_interval_s,
                    watch_interval_s=refresh_interval_s if watch_interval_s is None else watch_interval_s,
                    notified=watch_interval_s is not None)
    engine.start()
    settings = Settings(warehouse=warehouse, refresh_interval_s=service_refresh_s or refresh_interval_s,
                        token_secret=token_secret)
    app = create_app(engine, settings=settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}", engine
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.close()


def collect_pages(client: httpx.Client, path: str, params: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """Page a versions query to the end; returns (records, page bodies). Checks the paging
    contract on the way: full pages while a token follows, one snapshot for every page."""
    records: list[dict] = []
    bodies: list[dict] = []
    token = None
    while True:
        p = dict(params)
        if token is not None:
            p["pageToken"] = token
        r = client.get(path, params=p)
        assert r.status_code == 200, r.text
        body = r.json()
        bodies.append(body)
        records += body["records"]
        token = body["nextPageToken"]
        if token is None:
            break
        assert len(body["records"]) == int(p.get("pageSize", 100)), body
        assert len(bodies) < 10_000
    assert len({b["snapshot"] for b in bodies}) == 1, [b["snapshot"] for b in bodies]
    assert len({b["horizon"] for b in bodies}) == 1
    if len(bodies) > 1:
        assert bodies[-1]["records"], "the server reads one ahead: no empty trailing page"
    return records, bodies


def _value(text: str) -> Any:
    import json

    return json.loads(text)


def model_key_json(model: ReferenceStore, key: str, as_of: int | None) -> tuple[int, Any]:
    """Expected (status, body subset) of GET key[?asOf]: 200 -> {value, timestamp, validTo};
    404 -> problem type name."""
    if as_of is None:
        v = model.latest(key)
        if v is None:
            return 404, "not-found"
        return 200, {"value": _value(v.value), "timestamp": v.timestamp, "validTo": None}
    outcome, v = model.as_of(key, as_of)
    if outcome != "ok":
        return 404, outcome
    assert v is not None
    return 200, {"value": _value(v.value), "timestamp": v.timestamp, "validTo": v.valid_to}


def model_versions_json(model: ReferenceStore, key: str, lo: int | None, hi: int | None,
                        ascending: bool, include_deleted: bool = False) -> list[dict]:
    return [{"timestamp": v.timestamp, "validTo": v.valid_to, "deleted": True} if v.value is None else
            {"value": _value(v.value), "timestamp": v.timestamp, "validTo": v.valid_to}
            for v in model.range(key, lo, hi, ascending, include_deleted)]


def source_dir(root: str, name: str) -> str:
    path = os.path.join(root, f"src-{name}")
    os.makedirs(path, exist_ok=True)
    return path
