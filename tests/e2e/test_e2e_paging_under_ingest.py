"""Paging while the real ingest commits, refresh without restart, concurrent clients.

Two live servers over one warehouse: ``auto`` refreshes every 0.2 s, ``manual`` only when the test
calls ``engine.refresh()``. Expected answers come from the reference model as it stood at the
snapshot each response names.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.e2e import (
    IngestedStore,
    collect_pages,
    key_path,
    model_counts,
    model_key_json,
    model_versions_json,
    problem,
    report_counts,
    serve_engine,
    source_dir,
)
from tests.support.ingest import records_from

T0 = 1_700_000_000_000
HOUR = 3_600_000
STORE = "pg"
HIST = 60
C_KEYS = [f"c{i}" for i in range(16)]


def c_changes(seed: int, base: int) -> list[tuple]:
    rnd = random.Random(seed)
    out = []
    for _ in range(60):
        value = rnd.choice([None, '"x"', "1", f'{{"n":{rnd.randint(0, 99)}}}', '""'])
        out.append((rnd.choice(C_KEYS), value, base + rnd.randint(0, 40)))
    return out


@pytest.fixture(scope="module")
def pg(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> IngestedStore:
    root = tmp_path_factory.mktemp("e2e-pg")
    store = IngestedStore(spark, str(root / "wh"), source_dir(str(root), STORE), STORE,
                          history_retention_ms=1000 * HOUR)
    specs = [("k", str(i), T0 + 2 * i) for i in range(HIST)] + c_changes(1, T0)
    assert store.run({"r0.jsonl": records_from("r0.jsonl", specs)}).snapshot == 0
    return store


@pytest.fixture(scope="module")
def servers(pg: IngestedStore) -> Iterator[dict[str, Any]]:
    with (serve_engine(pg.warehouse, refresh_interval_s=0.2) as (auto_url, _auto),
          serve_engine(pg.warehouse) as (manual_url, manual)):
        with (httpx.Client(base_url=auto_url, timeout=30) as auto_c,
              httpx.Client(base_url=manual_url, timeout=30) as manual_c):
            yield {"auto": auto_c, "manual": manual_c, "manual_engine": manual, "auto_url": auto_url}


def wait_for_snapshot(client: httpx.Client, snapshot: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get(f"/v1/stores/{STORE}").json()["snapshot"] != snapshot:
        assert time.monotonic() < deadline, f"refresh did not pick up snapshot {snapshot}"
        time.sleep(0.05)


def page(client: httpx.Client, params: dict[str, Any]) -> dict[str, Any]:
    r = client.get(key_path(STORE, "k", "/versions"), params=params)
    assert r.status_code == 200, r.text
    return r.json()


def finish(client: httpx.Client, first: dict[str, Any], params: dict[str, Any]) -> tuple[list, list]:
    records = list(first["records"])
    snapshots = [first["snapshot"]]
    token = first["nextPageToken"]
    while token:
        body = page(client, {**params, "pageToken": token})
        if body["nextPageToken"]:
            assert len(body["records"]) == params["pageSize"]
        records += body["records"]
        snapshots.append(body["snapshot"])
        token = body["nextPageToken"]
    return records, snapshots


def test_paging_while_ingest_commits(pg: IngestedStore, servers: dict[str, Any]) -> None:
    auto, manual = servers["auto"], servers["manual"]
    asc = {"pageSize": 7}
    desc = {"pageSize": 9, "order": "desc"}
    ranged = {"pageSize": 4, "from": T0 + 30, "to": T0 + 90}
    firsts = {name: page(auto, p) for name, p in (("asc", asc), ("desc", desc), ("ranged", ranged))}
    manual_first = page(manual, asc)
    assert all(f["snapshot"] == 0 and f["nextPageToken"] for f in [*firsts.values(), manual_first])

    # run 2 commits between pages: a version between every two listed ones (every listed
    # validTo moves), a same-timestamp replacement of a version not yet paged, a tombstone
    specs = [("k", f'"n{i}"', T0 + 2 * i + 1) for i in range(HIST)]
    specs += [("k", '"replaced"', T0 + 100), ("k", None, T0 + 2 * HIST + 1)] + c_changes(2, T0 + 20)
    rep = pg.run({"r1.jsonl": records_from("r1.jsonl", specs)})
    assert rep is not None and rep.snapshot == 1
    assert report_counts(rep) == model_counts(pg.model_counts[-1])
    wait_for_snapshot(auto, 1)  # the auto server sees the commit: tokens must still pin 0

    old = pg.models[0]
    for name, params in (("asc", asc), ("desc", desc), ("ranged", ranged)):
        records, snapshots = finish(auto, firsts[name], params)
        assert set(snapshots) == {0}, (name, snapshots)
        lo, hi = params.get("from"), params.get("to")
        expected = model_versions_json(old, "k", lo, hi, params.get("order") != "desc")
        assert records == expected, name  # neither skipped nor repeated, pinned validTo/values
    assert len(finish(auto, firsts["asc"], asc)[0]) == HIST

    # the manual server: a fresh query after refresh() sees the commit; its token stays pinned
    servers["manual_engine"].refresh()
    fresh, bodies = collect_pages(manual, key_path(STORE, "k", "/versions"), {"pageSize": 50})
    assert bodies[0]["snapshot"] == 1
    assert fresh == model_versions_json(pg.models[1], "k", None, None, True)
    assert len(fresh) == 2 * HIST and {"value": "replaced", "timestamp": T0 + 100,
                                       "validTo": T0 + 101} in fresh
    records, snapshots = finish(manual, manual_first, asc)
    assert set(snapshots) == {0} and records == model_versions_json(old, "k", None, None, True)
    r = manual.get(key_path(STORE, "k"))
    problem(r, 404, "not-found")  # latest is the tombstone of run 2
    assert r.json()["snapshot"] == 1
    assert manual.get(key_path(STORE, "k"), params={"snapshot": 0}).json()["value"] == HIST - 1
    # a token pinned to snapshot 0 rejects another explicit snapshot
    token = page(auto, {**asc, "snapshot": 0})["nextPageToken"]
    problem(auto.get(key_path(STORE, "k", "/versions"), params={**asc, "pageToken": token, "snapshot": 1}),
            400, "bad-request")


def check(client: httpx.Client, store: IngestedStore, rnd: random.Random) -> int:
    """One random request; the answer must equal the model at the snapshot it names."""
    key = rnd.choice(["k", "missing", *C_KEYS])
    kind = rnd.choice(["latest", "asOf", "versions", "paged"])
    if kind in ("latest", "asOf"):
        t = None if kind == "latest" else T0 + rnd.randint(-5, 2 * HIST + 5)
        r = client.get(key_path(STORE, key), params={} if t is None else {"asOf": t})
        body = r.json()
        status, expect = model_key_json(store.models[body["snapshot"]], key, t)
        assert r.status_code == status, (key, t, r.text)
        if status == 200:
            assert body == {"key": key, **expect, "snapshot": body["snapshot"]}
        else:
            assert body["type"].endswith("/" + expect)
        return int(body["snapshot"])
    lo = T0 + rnd.randint(0, 60)
    hi = lo + rnd.randint(0, 80)
    asc = rnd.random() < 0.5
    params: dict[str, Any] = {"from": lo, "to": hi, "order": "asc" if asc else "desc",
                              "pageSize": 1000 if kind == "versions" else rnd.randint(5, 20)}
    records, bodies = collect_pages(client, key_path(STORE, key, "/versions"), params)
    snap = bodies[0]["snapshot"]
    assert records == model_versions_json(store.models[snap], key, lo, hi, asc), (key, params)
    return int(snap)


def test_concurrent_clients_while_ingest_commits(pg: IngestedStore, servers: dict[str, Any]) -> None:
    """8 threads x >= 50 requests each: first at a stable snapshot, then while run 3 commits.
    Every answer equals the model at the snapshot it names (no half-written batch is seen)."""
    if len(pg.reports) < 2:
        pytest.skip("needs test_paging_while_ingest_commits first (run 2)")
    auto = servers["auto"]
    wait_for_snapshot(auto, 1)
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[list[int]] = [[] for _ in range(8)]

    def worker(n: int) -> None:
        rnd = random.Random(100 + n)
        try:
            with httpx.Client(base_url=servers["auto_url"], timeout=60) as c:
                while len(seen[n]) < 50 or not stop.is_set():
                    seen[n].append(check(c, pg, rnd))
                    if len(seen[n]) >= 50:
                        time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while sum(len(s) >= 50 for s in seen) < 8 and not errors:  # 8 x 50 at snapshot 1
            assert time.monotonic() < deadline
            time.sleep(0.05)
        specs = [("k", f'"m{i}"', T0 + 200 + i) for i in range(30)] + c_changes(3, T0 + 30)
        rep = pg.run({"r2.jsonl": records_from("r2.jsonl", specs)})
        assert rep is not None and rep.snapshot == 2
        wait_for_snapshot(auto, 2)
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    if errors:
        raise errors[0]
    assert all(len(s) >= 50 for s in seen)
    flat = [s for per in seen for s in per]
    assert set(flat) == {1, 2}, sorted(set(flat))
    for per in seen:  # snapshots never go backwards for one client
        assert per == sorted(per)
