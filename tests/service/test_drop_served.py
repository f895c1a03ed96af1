"""``versiq drop`` against a real ``versiq serve``: the dropped store leaves /v1/stores at the
service's next refresh, its key reads answer 404 store-not-found and its serving index folder is
freed; a store that a derived table reads is refused (exit 2, naming it) unless --cascade. Stores
are written with delta-rs (tests.support.storebuilder): no Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from tests.support.service import ROOT, T0, key_path, serve_process
from tests.support.storebuilder import StoreBuilder
from versiq.query import index_files


def _versiq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "versiq.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)


def _stores(port: int) -> set[str]:
    body = httpx.get(f"http://127.0.0.1:{port}/v1/stores", timeout=10).json()
    return {entry["name"] for entry in body["stores"]}


def _wait_until(condition, what: str, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def test_dropped_store_leaves_the_service_and_its_cache(tmp_path) -> None:  # type: ignore[no-untyped-def]
    warehouse, cache = str(tmp_path / "wh"), str(tmp_path / "cache")
    StoreBuilder(warehouse, "prices").apply([("p-1", '{"price":1}', T0), ("p-2", '{"price":2}', T0 + 1)])
    StoreBuilder(warehouse, "other").apply([("o-1", '"x"', T0)])
    StoreBuilder(warehouse, "cheap").apply([("p-1", '{"price":1}', T0)], inputs={"prices": 0},
                                           sources={"prices": {"run": 1, "snapshot": 0}})
    env = {"VERSIQ_CACHE_DIR": cache, "VERSIQ_REFRESH_INTERVAL": "200ms"}
    with serve_process(warehouse, env) as (port, _pid):
        base = f"http://127.0.0.1:{port}"
        assert _stores(port) == {"prices", "other", "cheap"}
        assert httpx.get(base + key_path("prices", "p-1"), timeout=10).status_code == 200
        store_cache = os.path.join(index_files.cache_dir(warehouse, cache), "prices")
        assert os.path.isdir(store_cache)

        refused = _versiq("drop", "--warehouse", warehouse, "--store", "prices")
        assert refused.returncode == 2, refused.stderr
        assert "cheap" in refused.stderr and "--cascade" in refused.stderr
        assert _stores(port) == {"prices", "other", "cheap"}

        dropped = _versiq("drop", "--warehouse", warehouse, "--store", "prices", "--cascade")
        assert dropped.returncode == 0, dropped.stderr
        assert '"dropped": ["cheap", "prices"]' in dropped.stderr
        assert not os.path.exists(os.path.join(warehouse, "prices"))
        assert not os.path.exists(os.path.join(warehouse, "cheap"))

        _wait_until(lambda: _stores(port) == {"other"}, "the dropped stores leave /v1/stores")
        for store in ("prices", "cheap"):
            answer = httpx.get(base + key_path(store, "p-1"), timeout=10)
            assert answer.status_code == 404
            assert answer.json()["type"].endswith("/store-not-found")
        assert not os.path.exists(store_cache)
        assert httpx.get(base + key_path("other", "o-1"), timeout=10).status_code == 200


def test_drop_names_what_it_cannot_find(tmp_path) -> None:  # type: ignore[no-untyped-def]
    warehouse = str(tmp_path / "wh")
    StoreBuilder(warehouse, "prices").apply([("p-1", '"x"', T0)])
    missing = _versiq("drop", "--warehouse", warehouse, "--store", "price")
    assert missing.returncode == 2
    assert "price" in missing.stderr and "prices" in missing.stderr
    not_a_table = _versiq("drop", "--warehouse", warehouse, "--table", "prices")
    assert not_a_table.returncode == 2 and "--store prices" in not_a_table.stderr
