"""HTTP API of streams (/v1/streams...) and derived-table provenance, against a live server over
real Delta tables (``test_service_support.build_warehouse``)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.service.test_service_live import get_raw, problem
from tests.support.service import (
    CLICK_RUNS,
    EXPENSIVE_INPUTS,
    EXPENSIVE_SOURCES,
    PRICED_INPUTS,
    PRICED_SOURCES,
    STREAM_KEYS,
    T0,
    Warehouse,
    build_warehouse,
    key_path,
    live_server,
)
from tests.support.storebuilder import StreamBuilder, StreamRow
from versiq.service.settings import Settings

RECORDS = "/v1/streams/clicks/records"


@pytest.fixture(scope="module")
def s_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build_warehouse(str(tmp_path_factory.mktemp("wh")))


@pytest.fixture(scope="module")
def s_client(s_warehouse: Warehouse) -> Iterator[httpx.Client]:
    settings = Settings(warehouse=s_warehouse.path, refresh_interval_s=0.1, token_secret=b"streams")
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def as_json(rows: list[StreamRow], *, key: str | None = None, lo: int | None = None, hi: int | None = None,
            desc: bool = False) -> list[dict[str, Any]]:
    """The reference answer: records filtered, in stream order (reversed for desc), as JSON."""
    out = [
        {"key": r.key, "value": None if r.value is None else json.loads(r.value), "timestamp": r.timestamp,
         "run": r.run, "sequence": r.seq}
        for r in sorted(rows, key=lambda r: (r.run, r.seq), reverse=desc)
        if (key is None or r.key == key) and (lo is None or r.timestamp >= lo) and (hi is None or r.timestamp <= hi)
    ]
    return out


def collect(client: httpx.Client, path: str, params: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    records: list[dict[str, Any]] = []
    pages = 0
    token = None
    while True:
        p = dict(params)
        if token:
            p["pageToken"] = token
        r = client.get(path, params=p)
        assert r.status_code == 200, r.text
        body = r.json()
        pages += 1
        records += body["records"]
        token = body["nextPageToken"]
        if token is None:
            return records, pages
        assert len(body["records"]) == int(p.get("pageSize", 100))


# ---------------------------------------------------------------------------- listing and info
def test_streams_listed_apart_from_stores(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    r = s_client.get("/v1/streams")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    streams = r.json()["streams"]
    assert [s["name"] for s in streams] == ["clicks", "clicks_priced"]
    clicks = streams[0]
    rows = s_warehouse.clicks.records
    assert clicks == {
        "name": "clicks",
        "snapshot": 2,
        "lastRun": 3,
        "buckets": 4,
        "counts": clicks["counts"],
        "minTimestamp": min(x.timestamp for x in rows),
        "maxTimestamp": max(x.timestamp for x in rows),
        "inputs": {},
        "sources": {},
    }
    assert clicks["counts"]["records"] == sum(CLICK_RUNS) and clicks["counts"]["files"] >= 3
    names = {s["name"] for s in s_client.get("/v1/stores").json()["stores"]}
    assert "clicks" not in names and "clicks_priced" not in names
    body = problem(s_client.get("/v1/stores/clicks"), 404, "store-not-found")
    assert "stream" in body["detail"]
    problem(s_client.get(key_path("clicks", "u-1")), 404, "store-not-found")
    body = problem(s_client.get("/v1/streams/prices"), 404, "stream-not-found")
    assert body["stream"] == "prices" and "store" in body["detail"]
    problem(s_client.get("/v1/streams", params={"snapshot": "0"}), 400, "bad-request")


def test_stream_info_and_snapshots(s_client: httpx.Client) -> None:
    info = s_client.get("/v1/streams/clicks_priced").json()
    assert info["inputs"] == PRICED_INPUTS and info["sources"] == PRICED_SOURCES
    assert info["snapshot"] == 0 and info["lastRun"] == 1 and info["counts"]["records"] == 5
    old = s_client.get("/v1/streams/clicks", params={"snapshot": "0"}).json()
    assert old["snapshot"] == 0 and old["lastRun"] == 1 and old["counts"]["records"] == CLICK_RUNS[0]
    body = problem(s_client.get("/v1/streams/clicks", params={"snapshot": "3"}), 404, "snapshot-not-found")
    assert body["stream"] == "clicks" and body["snapshot"] == 3
    for bad in ("-1", "x", ""):
        problem(s_client.get("/v1/streams/clicks", params={"snapshot": bad}), 400, "bad-request")
    problem(s_client.get("/v1/streams/clicks", params={"key": "u-1"}), 400, "bad-request")
    problem(s_client.get("/v1/streams/nope"), 404, "stream-not-found")
    problem(s_client.get("/v1/streams/nope/records"), 404, "stream-not-found")
    for bad_name in ("..", "_x", "a..b", "x" * 101, "%2E%2E", "a%2Fb", ""):
        problem(get_raw(s_client, "/v1/streams/" + bad_name), 404, "stream-not-found")
        problem(get_raw(s_client, "/v1/streams/" + bad_name + "/records"), 404, "stream-not-found")


def test_store_provenance(s_client: httpx.Client) -> None:
    derived = s_client.get("/v1/stores/expensive").json()
    assert derived["inputs"] == EXPENSIVE_INPUTS and derived["sources"] == EXPENSIVE_SOURCES
    at0 = s_client.get("/v1/stores/expensive", params={"snapshot": "0"}).json()
    assert at0["inputs"] == EXPENSIVE_INPUTS
    listed = {s["name"]: s for s in s_client.get("/v1/stores").json()["stores"]}
    assert listed["expensive"]["sources"] == EXPENSIVE_SOURCES
    assert listed["prices"]["inputs"] == {} and listed["prices"]["sources"] == {}


# ---------------------------------------------------------------------------- records
def test_records_order_and_shape(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    rows = s_warehouse.clicks.records
    r = s_client.get(RECORDS, params={"pageSize": "1000"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body == {"stream": "clicks", "key": None, "records": as_json(rows), "nextPageToken": None, "snapshot": 2}
    # values are embedded verbatim (number text kept), null values are JSON null
    first = rows[0]
    assert r.content.startswith(
        b'{"stream":"clicks","key":null,"records":[{"key":"%s","value":%s,"timestamp":%d,"run":1,"sequence":1}'
        % (first.key.encode(), first.value.encode() if first.value else b"null", first.timestamp)
    )
    assert b'"price":1.50' in r.content and b'"value":null' in r.content
    # stream order is not timestamp order
    stamps = [x["timestamp"] for x in body["records"]]
    assert stamps != sorted(stamps)
    desc = s_client.get(RECORDS, params={"pageSize": "1000", "order": "desc"}).json()["records"]
    assert desc == as_json(rows, desc=True)
    empty = s_client.get(RECORDS, params={"key": "nobody"}).json()
    assert empty == {"stream": "clicks", "key": "nobody", "records": [], "nextPageToken": None, "snapshot": 2}


def test_records_key_filter(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    rows = s_warehouse.clicks.records
    for key in STREAM_KEYS:
        for order in ("asc", "desc"):
            body = s_client.get(RECORDS, params={"key": key, "order": order}).json()
            assert body["key"] == key
            assert body["records"] == as_json(rows, key=key, desc=order == "desc"), key
            assert body["records"]
    # in a raw query string '+' is a space and %2B a plus
    plus = get_raw(s_client, RECORDS + "?key=%2Bplus%2B").json()
    assert plus["key"] == "+plus+" and plus["records"] == as_json(rows, key="+plus+")
    spaced = get_raw(s_client, RECORDS + "?key=+plus+").json()
    assert spaced["key"] == " plus " and spaced["records"] == []
    enc = get_raw(s_client, RECORDS + "?key=" + quote("ünï/🎉", safe="")).json()
    assert enc["records"] == as_json(rows, key="ünï/🎉")
    body = problem(s_client.get(RECORDS, params={"key": ""}), 400, "bad-request")
    assert body["parameter"] == "key"


def test_records_time_bounds(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    rows = s_warehouse.clicks.records
    lo, hi = T0 + 10_000, T0 + 20_000  # both are timestamps of records: bounds are inclusive
    assert {lo, hi} <= {x.timestamp for x in rows}
    got = s_client.get(RECORDS, params={"from": lo, "to": hi}).json()["records"]
    assert got == as_json(rows, lo=lo, hi=hi) and len(got) == 11
    assert {x["timestamp"] for x in got} == set(range(lo, hi + 1, 1000))
    assert s_client.get(RECORDS, params={"from": lo, "to": lo}).json()["records"] == as_json(rows, lo=lo, hi=lo)
    assert len(s_client.get(RECORDS, params={"from": lo + 1, "to": lo + 999}).json()["records"]) == 0
    only_from = s_client.get(RECORDS, params={"from": T0 + 90_000, "order": "desc"}).json()["records"]
    assert only_from == as_json(rows, lo=T0 + 90_000, desc=True)
    only_to = s_client.get(RECORDS, params={"to": T0 + 5_000, "key": "u-0"}).json()["records"]
    assert only_to == as_json(rows, key="u-0", hi=T0 + 5_000)
    # RFC 3339 bounds are the same parser as the store endpoints
    iso = s_client.get(RECORDS, params={"from": "2023-11-14T22:13:30Z", "to": "2023-11-14T23:13:40+01:00"})
    assert iso.json()["records"] == got
    body = problem(s_client.get(RECORDS, params={"from": hi, "to": lo}), 400, "bad-request")
    assert body["parameter"] == "from" and "after" in body["detail"]
    for bad in ("soon", "", "-5", "1.5", "2024-01-01"):
        problem(s_client.get(RECORDS, params={"from": bad}), 400, "bad-request")
        problem(s_client.get(RECORDS, params={"to": bad}), 400, "bad-request")


def test_records_parameter_errors(s_client: httpx.Client) -> None:
    for bad in ("0", "1001", "-1", "abc", ""):
        body = problem(s_client.get(RECORDS, params={"pageSize": bad}), 400, "bad-request")
        assert body["parameter"] == "pageSize"
    for bad in ("ASC", "up", ""):
        problem(s_client.get(RECORDS, params={"order": bad}), 400, "bad-request")
    body = problem(s_client.get(RECORDS, params={"Key": "u-1"}), 400, "bad-request")
    assert body["parameter"] == "Key"
    problem(s_client.get(RECORDS, params={"asOf": "1"}), 400, "bad-request")
    problem(get_raw(s_client, RECORDS + "?key=a&key=b"), 400, "bad-request")
    problem(get_raw(s_client, RECORDS + "?key=%zz"), 400, "bad-request")
    problem(s_client.get(RECORDS, params={"snapshot": "3"}), 404, "snapshot-not-found")


def test_records_snapshots(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    clicks = s_warehouse.clicks
    for v in (0, 1, 2):
        body = s_client.get(RECORDS, params={"snapshot": str(v), "pageSize": "1000"}).json()
        assert body["snapshot"] == v and body["records"] == as_json(clicks.at[v])
        keyed = s_client.get(RECORDS, params={"snapshot": str(v), "key": "u-1", "order": "desc"}).json()
        assert keyed["records"] == as_json(clicks.at[v], key="u-1", desc=True)
    assert len(clicks.at[0]) == CLICK_RUNS[0]


# ---------------------------------------------------------------------------- paging
def test_paging_to_the_end(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    rows = s_warehouse.clicks.records
    recs, pages = collect(s_client, RECORDS, {})
    assert pages == 1 and recs == as_json(rows)
    recs, pages = collect(s_client, RECORDS, {"pageSize": 7, "order": "desc"})
    assert pages == 15 and recs == as_json(rows, desc=True)
    # exactly full last page: the server reads one ahead, so no empty trailing page
    recs, pages = collect(s_client, RECORDS, {"pageSize": 25})
    assert pages == 4 and recs == as_json(rows)
    recs, pages = collect(s_client, RECORDS, {"pageSize": 2, "key": "u-1", "from": T0, "to": T0 + 60_000})
    assert recs == as_json(rows, key="u-1", lo=T0, hi=T0 + 60_000) and pages == -(-len(recs) // 2)
    # pageSize may change between pages; defaults equal explicit values
    first = s_client.get(RECORDS, params={"pageSize": 10}).json()
    nxt = s_client.get(RECORDS, params={"pageSize": 3, "order": "asc", "pageToken": first["nextPageToken"]}).json()
    assert [x["sequence"] for x in nxt["records"]] == [11, 12, 13]
    # ISO bounds equal to epoch bounds are the same query
    first = s_client.get(RECORDS, params={"from": str(T0), "pageSize": 2}).json()
    nxt = s_client.get(RECORDS, params={"from": "2023-11-14T22:13:20Z", "pageSize": 2,
                                        "pageToken": first["nextPageToken"]})
    assert nxt.status_code == 200 and nxt.json()["records"] == as_json(rows, lo=T0)[2:4]
    # a page ending at a run boundary continues with the next run
    first = s_client.get(RECORDS, params={"pageSize": CLICK_RUNS[0]}).json()
    nxt = s_client.get(RECORDS, params={"pageSize": 1, "pageToken": first["nextPageToken"]}).json()
    assert (nxt["records"][0]["run"], nxt["records"][0]["sequence"]) == (2, 1)


def test_token_binding_and_tampering(s_client: httpx.Client) -> None:
    params = {"key": "u-1", "from": str(T0), "to": str(T0 + 100_000), "pageSize": "2"}
    token = s_client.get(RECORDS, params=params).json()["nextPageToken"]
    assert token
    assert s_client.get(RECORDS, params={**params, "pageToken": token}).status_code == 200
    for change in ({"key": "u-2"}, {"key": None}, {"from": str(T0 + 1)}, {"to": None}, {"order": "desc"}):
        p = {**params, "pageToken": token}
        for k, v in change.items():
            if v is None:
                p.pop(k)
            else:
                p[k] = v
        body = problem(s_client.get(RECORDS, params=p), 400, "bad-request")
        assert body["parameter"] == "pageToken" and "differ" in body["detail"]
    body = problem(s_client.get("/v1/streams/clicks_priced/records", params={**params, "pageToken": token}),
                   400, "bad-request")
    assert "stream" in body["detail"]
    # a stream token is no versions token, and the reverse
    versions_params = {k: v for k, v in params.items() if k != "key"}
    body = problem(s_client.get(key_path("prices", "u-1", "/versions"),
                                params={**versions_params, "pageToken": token}), 400, "bad-request")
    assert "another kind of listing" in body["detail"]
    vtoken = s_client.get(key_path("prices", "hist", "/versions"), params={"pageSize": 2}).json()["nextPageToken"]
    body = problem(s_client.get(RECORDS, params={"key": "hist", "pageToken": vtoken}), 400, "bad-request")
    assert "another kind of listing" in body["detail"]
    body = problem(s_client.get(RECORDS, params={**params, "pageToken": token, "snapshot": "1"}), 400, "bad-request")
    assert body["parameter"] == "snapshot"
    assert s_client.get(RECORDS, params={**params, "pageToken": token, "snapshot": "2"}).status_code == 200
    head, mac = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    payload[8] = [1, 1]  # move the position
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode() + "." + mac
    for bad in (forged, head, head + ".", "." + mac, "x", "", "a.b.c", "é.é", token[:-2], token + "A"):
        body = problem(s_client.get(RECORDS, params={**params, "pageToken": bad}), 400, "bad-request")
        assert body["parameter"] == "pageToken"


# ---------------------------------------------------------------------------- other servers
def test_token_pins_snapshot_while_records_are_appended(tmp_path: Any) -> None:
    wh = str(tmp_path)
    s = StreamBuilder(wh, "live")
    s.append([(f"k{i % 3}", str(i), T0 + i) for i in range(30)])
    settings = Settings(warehouse=wh, refresh_interval_s=0.05, token_secret=b"pin")
    path = "/v1/streams/live/records"
    with live_server(settings) as url, httpx.Client(base_url=url) as c:
        first = c.get(path, params={"pageSize": 10}).json()
        pinned = first["snapshot"]
        new_version = s.append([(f"k{i % 3}", str(i), T0 + i) for i in range(30, 60)])
        deadline = time.monotonic() + 10
        while c.get("/v1/streams/live").json()["snapshot"] != new_version:
            assert time.monotonic() < deadline, "refresh did not pick up the commit"
            time.sleep(0.05)
        records = list(first["records"])
        token = first["nextPageToken"]
        while token:
            page = c.get(path, params={"pageSize": 10, "pageToken": token}).json()
            assert page["snapshot"] == pinned
            records += page["records"]
            token = page["nextPageToken"]
        assert [r["value"] for r in records] == list(range(30))  # neither skips nor repeats
        fresh, _ = collect(c, path, {"pageSize": 10})
        assert [r["value"] for r in fresh] == list(range(60))
        assert c.get(path, params={"snapshot": str(pinned), "pageSize": 1000}).json()["records"] == records
        ready = c.get("/readyz").json()
        assert ready["ready"] is True and ready["streams"]["live"]["snapshot"] == new_version
        text = c.get("/metrics").text
        assert f'versiq_stream_snapshot_version{{stream="live"}} {float(new_version)}' in text
        assert 'route="/v1/streams/{stream}/records",status="200"' in text


def test_vacuumed_snapshot_and_expired_token_are_gone(tmp_path: Any) -> None:
    from deltalake import DeltaTable

    wh = str(tmp_path)
    s = StreamBuilder(wh, "vac")
    s.append([("k", str(i), T0 + i) for i in range(20)])
    s.append([("k", str(i), T0 + i) for i in range(20, 40)])
    path = "/v1/streams/vac/records"
    with live_server(Settings(warehouse=wh, token_secret=b"v", token_ttl_s=0.5)) as url, \
            httpx.Client(base_url=url) as c:
        token = c.get(path, params={"pageSize": 5, "snapshot": "0"}).json()["nextPageToken"]
        expiring = c.get(path, params={"pageSize": 5}).json()["nextPageToken"]
        dt = DeltaTable(s.path)
        dt.optimize.compact()
        compacted = DeltaTable(s.path).version()
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        latest = DeltaTable(s.path).version()  # compaction and vacuum commit too
        body = problem(c.get(path, params={"snapshot": "0"}), 410, "gone")
        assert body["stream"] == "vac" and body["snapshot"] == 0
        problem(c.get(path, params={"pageToken": token}), 410, "gone")
        problem(c.get(path, params={"snapshot": "1"}), 410, "gone")
        # the current snapshot's files are gone too: answered from the newest snapshot at once, or
        # from the compaction's, whose files the vacuum kept, when the service's 100 ms watch had
        # already moved there (the vacuum's own commits change no data)
        now = c.get(path, params={"pageSize": 100}).json()
        assert compacted <= now["snapshot"] <= latest, (now["snapshot"], compacted, latest)
        assert [r["value"] for r in now["records"]] == list(range(40))
        time.sleep(0.6)
        body = problem(c.get(path, params={"pageToken": expiring}), 410, "gone")
        assert "expired" in body["detail"]
        assert c.get("/v1/streams/vac").json()["snapshot"] == latest


def test_routes_methods_and_auth(s_warehouse: Warehouse) -> None:
    settings = Settings.from_env({"VERSIQ_WAREHOUSE": s_warehouse.path, "VERSIQ_API_TOKENS": "t1"})
    auth = {"Authorization": "Bearer t1"}
    with live_server(settings) as url, httpx.Client(base_url=url) as c:
        for path in ("/v1/streams", "/v1/streams/clicks", RECORDS):
            problem(c.get(path), 401, "unauthorized")
            assert c.get(path, headers=auth).status_code == 200
        for path in ("/v1/streams/clicks/records/x", "/v1/streams/clicks/x", "/v1/streams/clicks/keys/k",
                     "/v1/streamz"):
            problem(c.get(path, headers=auth), 404, "route-not-found")
        r = c.post(RECORDS, headers=auth)
        problem(r, 405, "method-not-allowed")
        assert r.headers["allow"] == "GET, HEAD"
        assert c.get("/readyz").status_code == 200

