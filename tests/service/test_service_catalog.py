"""The store list and readiness follow the warehouse (issue 10, items 8-10): a store that cannot
be read is listed as unavailable and answers 503, never "not found"; a removed store leaves; a
repaired one comes back; an anonymous /readyz tells only whether the server is ready."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.service import T0, key_path, live_server
from tests.support.storebuilder import StoreBuilder
from versiq.service.settings import Settings

PROBLEMS = "https://versiq.dev/problems/"


def _until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def _commit_file(store: str, version: int) -> str:
    return os.path.join(store, "_delta_log", f"{version:020d}.json")


def _truncate(path: str) -> bytes:
    with open(path, "rb") as handle:
        original = handle.read()
    with open(path, "wb") as handle:
        handle.write(original[: len(original) // 2])
    return original


def _commit_corrupted(builder: StoreBuilder, records: list[tuple[str, str | None, int]], scratch: str) -> None:
    """Commit ``records`` to ``builder``'s store with the commit file cut in half, so that a
    server watching the store never sees it whole: the commit is written in a copy of the store,
    cut there, and its files moved in (the log entry last, by an atomic rename)."""
    served = builder.path
    shutil.copytree(served, scratch)
    builder.path = scratch
    try:
        builder.apply(records)
    finally:
        builder.path = served
    commit = os.path.relpath(_commit_file(scratch, builder.version), scratch)
    _truncate(os.path.join(scratch, commit))
    for folder, _dirs, files in os.walk(scratch):
        for name in files:
            relative = os.path.relpath(os.path.join(folder, name), scratch)
            if relative != commit and not os.path.exists(os.path.join(served, relative)):
                os.makedirs(os.path.dirname(os.path.join(served, relative)), exist_ok=True)
                shutil.copy2(os.path.join(folder, name), os.path.join(served, relative))
    shutil.copy2(os.path.join(scratch, commit), os.path.join(scratch, commit + ".moving"))
    os.replace(os.path.join(scratch, commit + ".moving"), os.path.join(served, commit))


def _problem(resp: httpx.Response, status: int, name: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    body = resp.json()
    assert body["type"] == PROBLEMS + name and body["detail"]
    return body


@pytest.fixture()
def two_stores(tmp_path: Any) -> tuple[str, StoreBuilder, StoreBuilder]:
    wh = str(tmp_path / "wh")
    p1, p2 = StoreBuilder(wh, "p1"), StoreBuilder(wh, "p2")
    for builder in (p1, p2):
        builder.apply([("k", '"a"', T0)])
        builder.apply([("k", '"b"', T0 + 1)])
    return wh, p1, p2


def test_a_corrupt_store_is_unavailable_not_missing_and_comes_back_when_repaired(
        two_stores: tuple[str, StoreBuilder, StoreBuilder], caplog: pytest.LogCaptureFixture) -> None:
    wh, _p1, p2 = two_stores
    original = _truncate(_commit_file(p2.path, 1))
    settings = Settings(warehouse=wh, refresh_interval_s=0.1)
    with caplog.at_level(logging.INFO, logger="versiq"), live_server(settings) as url, \
            httpx.Client(base_url=url) as c:
        ready = _problem(c.get("/readyz"), 503, "not-ready")
        assert ready["ready"] is False and "p2" in ready["unavailable"] and "p2" in ready["detail"]
        listing = c.get("/v1/stores").json()
        assert [s["name"] for s in listing["stores"]] == ["p1"]
        assert [u["name"] for u in listing["unavailable"]] == ["p2"] and listing["unavailable"][0]["error"]
        for path in ("/v1/stores/p2", key_path("p2", "k"), key_path("p2", "k", "/versions")):
            r = c.get(path)
            body = _problem(r, 503, "store-unavailable")
            assert body["store"] == "p2" and int(r.headers["retry-after"]) >= 1
        assert c.get(key_path("p1", "k")).json()["value"] == "b"
        assert any(r.levelno == logging.ERROR and "p2" in r.getMessage() for r in caplog.records)

        with open(_commit_file(p2.path, 1), "wb") as handle:  # repaired: no restart needed
            handle.write(original)
        _until(lambda: c.get("/readyz").status_code == 200)
        assert c.get(key_path("p2", "k")).json()["value"] == "b"
        assert c.get("/v1/stores").json()["unavailable"] == []


def test_a_store_corrupted_while_served_keeps_its_last_good_snapshot(
        two_stores: tuple[str, StoreBuilder, StoreBuilder], caplog: pytest.LogCaptureFixture, tmp_path: Any) -> None:
    wh, _p1, p2 = two_stores
    settings = Settings(warehouse=wh, refresh_interval_s=0.1)
    with caplog.at_level(logging.INFO, logger="versiq"), live_server(settings) as url, \
            httpx.Client(base_url=url) as c:
        _until(lambda: c.get("/readyz").status_code == 200)
        _commit_corrupted(p2, [("k", '"c"', T0 + 2)], str(tmp_path / "scratch"))
        assert p2.version == 2
        _until(lambda: (c.get("/readyz").json()["stores"]["p2"]["error"] or "") != "")
        state = c.get("/readyz").json()
        assert state["ready"] is True and state["stores"]["p2"]["snapshot"] == 1
        body = c.get(key_path("p2", "k")).json()
        assert body["value"] == "b" and body["snapshot"] == 1
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and "p2" in r.getMessage()]
        time.sleep(0.5)  # several refreshes: the failure is logged once, not every pass
        assert len([r for r in caplog.records if r.levelno == logging.ERROR and "p2" in r.getMessage()]) == \
            len(errors) == 1


def test_a_removed_store_leaves_the_list_and_readiness(two_stores: tuple[str, StoreBuilder, StoreBuilder]) -> None:
    wh, _p1, p2 = two_stores
    _truncate(_commit_file(p2.path, 1))
    settings = Settings(warehouse=wh, refresh_interval_s=0.1)
    with live_server(settings) as url, httpx.Client(base_url=url) as c:
        assert c.get("/readyz").status_code == 503
        shutil.rmtree(p2.path)  # the broken store is removed: ready again
        _until(lambda: c.get("/readyz").status_code == 200)
        shutil.rmtree(os.path.join(wh, "p1"))  # a served store is removed: no longer served
        _until(lambda: c.get("/v1/stores").json()["stores"] == [])
        _problem(c.get(key_path("p1", "k")), 404, "store-not-found")
        assert c.get("/readyz").json()["stores"] == {}


def test_anonymous_readiness_tells_only_ready(two_stores: tuple[str, StoreBuilder, StoreBuilder]) -> None:
    wh, _p1, p2 = two_stores
    original = _truncate(_commit_file(p2.path, 1))
    settings = Settings(warehouse=wh, refresh_interval_s=0.1, api_tokens=frozenset({"t1"}))
    with live_server(settings) as url, httpx.Client(base_url=url) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = c.get("/readyz", headers=headers)
            body = _problem(r, 503, "not-ready")
            assert set(body) == {"type", "title", "status", "detail", "ready"} and body["ready"] is False
            assert wh not in r.text and "p2" not in r.text
        detailed = c.get("/readyz", headers={"Authorization": "Bearer t1"}).json()
        assert "p2" in detailed["unavailable"] and detailed["stores"]["p1"]["snapshot"] == 1

        with open(_commit_file(p2.path, 1), "wb") as handle:
            handle.write(original)
        _until(lambda: c.get("/readyz").status_code == 200)
        assert c.get("/readyz").json() == {"ready": True}
        detailed = c.get("/readyz", headers={"Authorization": "Bearer t1"}).json()
        assert set(detailed["stores"]) == {"p1", "p2"} and detailed["unavailable"] == {}


def test_min_snapshot_waits_for_a_commit_not_loaded_yet_then_answers_503(tmp_path: Any) -> None:
    """Issue 16 item 7: a snapshot committed but not loaded by this server is waited for (three
    refresh intervals, at least 2 s), then 503 with Retry-After; once loaded it answers."""
    from tests.support.e2e import serve_engine

    b = StoreBuilder(str(tmp_path), "s", history_retention_ms=10 ** 9)
    b.apply([("k", '"a"', T0)])
    with serve_engine(str(tmp_path), service_refresh_s=0.5) as (url, engine), httpx.Client(base_url=url) as c:
        committed = b.apply([("k", '"b"', T0 + 1)])  # the engine does not refresh by itself
        started = time.monotonic()
        r = c.get(key_path("s", "k"), params={"minSnapshot": committed})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["type"] == PROBLEMS + "store-unavailable" and r.json()["minSnapshot"] == committed
        assert 1.9 < time.monotonic() - started < 10
        engine.refresh()
        r = c.get(key_path("s", "k"), params={"minSnapshot": committed})
        assert r.status_code == 200 and r.json()["value"] == "b" and r.json()["snapshot"] == committed
