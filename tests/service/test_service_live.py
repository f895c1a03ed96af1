"""End-to-end tests of the HTTP service: real Delta stores, live uvicorn on 127.0.0.1, httpx."""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import yaml

from tests.support.service import (
    HIST_VERSIONS,
    HOUR,
    ODD_KEYS,
    T0,
    Warehouse,
    build_warehouse,
    key_path,
    live_server,
)
from versiq.service.app import OPENAPI_PATH
from versiq.service.settings import Settings

PROBLEM = "application/problem+json"
BASE = "https://versiq.dev/problems/"


@pytest.fixture(scope="module")
def s_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build_warehouse(str(tmp_path_factory.mktemp("wh")))


@pytest.fixture(scope="module")
def s_client(s_warehouse: Warehouse) -> Iterator[httpx.Client]:
    settings = Settings(
        warehouse=s_warehouse.path,
        refresh_interval_s=0.1,
        token_ttl_s=3600,
        cors_origins=("https://ui.example",),
    )
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def problem(resp: httpx.Response, status: int, name: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body = resp.json()
    assert body["type"] == BASE + name, body
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def get_raw(client: httpx.Client, raw: str, **kw: Any) -> httpx.Response:
    """GET a raw, pre-encoded path+query sent verbatim (httpx would normalise dot segments)."""
    conn = http.client.HTTPConnection(client.base_url.host, client.base_url.port, timeout=30)
    try:
        conn.request("GET", raw, headers=kw.get("headers") or {})
        resp = conn.getresponse()
        return httpx.Response(resp.status, headers=resp.getheaders(), content=resp.read())
    finally:
        conn.close()


# ---------------------------------------------------------------------------- stores
def test_list_stores(s_client: httpx.Client) -> None:
    r = s_client.get("/v1/stores")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    stores = {s["name"]: s for s in r.json()["stores"]}
    assert set(stores) == {"prices", "sessions", "live", "expensive"}  # streams are not stores
    p = stores["prices"]
    assert p["kind"] == "versioned" and p["historyRetentionMs"] == HOUR and p["partitions"] == 1
    assert p["streamTime"] == T0 + 10 * HOUR
    assert p["oldestQueryableTimestamp"] == T0 + 9 * HOUR
    assert p["partitionStreamTimes"] == [
        {"partition": 0, "streamTime": T0 + 10 * HOUR, "oldestQueryableTimestamp": T0 + 9 * HOUR}
    ]
    assert p["snapshot"] == 0 and isinstance(p["counts"], dict)
    assert p["inputs"] == {} and p["sources"] == {}  # an ordinary store has no provenance
    assert stores["sessions"]["kind"] == "timestamped"
    assert stores["sessions"]["oldestQueryableTimestamp"] is None


def test_store_info_and_snapshot_errors(s_client: httpx.Client) -> None:
    r = s_client.get("/v1/stores/prices")
    assert r.status_code == 200 and r.json()["name"] == "prices"
    assert s_client.get("/v1/stores/prices", params={"snapshot": "0"}).json()["snapshot"] == 0
    problem(s_client.get("/v1/stores/prices", params={"snapshot": "7"}), 404, "snapshot-not-found")
    for bad in ("-1", "x", "1.0", "", "99999999999999999999"):
        body = problem(s_client.get("/v1/stores/prices", params={"snapshot": bad}), 400, "bad-request")
        assert "snapshot" in body["detail"]
    problem(s_client.get("/v1/stores/nope"), 404, "store-not-found")
    for bad_name in ("..", "_x", "a..b", "x" * 101, "%2E%2E", "a%2Fb"):
        problem(get_raw(s_client, "/v1/stores/" + bad_name), 404, "store-not-found")
    problem(s_client.get("/v1/stores", params={"snapshot": "0"}), 400, "bad-request")


# ---------------------------------------------------------------------------- latest / as-of
def test_latest_and_as_of(s_client: httpx.Client) -> None:
    r = s_client.get(key_path("prices", "p-1"))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    # the stored number text is embedded verbatim
    assert r.content == (
        b'{"key":"p-1","value":{"price":2.00,"currency":"EUR"},'
        b'"timestamp":%d,"validTo":null,"snapshot":0}' % (T0 + 9 * HOUR + 500)
    )
    r = s_client.get(key_path("prices", "p-1"), params={"asOf": str(T0 + 9 * HOUR + 499)})
    assert r.json() == {
        "key": "p-1",
        "value": {"price": 1.5, "currency": "EUR"},
        "timestamp": T0,
        "validTo": T0 + 9 * HOUR + 500,
        "snapshot": 0,
    }
    assert b'"price":1.50' in r.content
    # ISO-8601 instants, with Z, offsets and a form-decoded '+' (space)
    iso = "2023-11-15T07:13:20.500Z"  # T0 + 9h + 500 ms = 2023-11-15T07:13:20.500Z
    assert (
        s_client.get(key_path("prices", "p-1"), params={"asOf": iso}).json()["timestamp"]
        == T0 + 9 * HOUR + 500
    )
    assert (
        get_raw(s_client, key_path("prices", "p-1") + "?asOf=2023-11-15T08:13:20.500+01:00").json()[
            "timestamp"
        ]
        == T0 + 9 * HOUR + 500
    )
    assert (
        get_raw(s_client, key_path("prices", "p-1") + "?asOf=2023-11-15T08:13:20.499%2B01:00").json()[
            "timestamp"
        ]
        == T0
    )
    # an empty string is a value
    assert s_client.get(key_path("prices", "empty")).json()["value"] == ""


def test_not_found_and_expired(s_client: httpx.Client) -> None:
    body = problem(s_client.get(key_path("prices", "missing")), 404, "not-found")
    assert body["key"] == "missing" and body["snapshot"] == 0
    problem(s_client.get(key_path("prices", "deleted")), 404, "not-found")  # tombstone latest
    r = s_client.get(key_path("prices", "deleted"), params={"asOf": T0 + 9 * HOUR + 150})
    assert r.status_code == 200 and r.json()["value"] == "alive"
    # older than the horizon (T0 + 9h) and the latest version is newer than asOf: expired
    body = problem(s_client.get(key_path("prices", "expiring"), params={"asOf": T0 + 500}), 404, "expired")
    assert body["horizon"] == T0 + 9 * HOUR
    # ... but the latest version answers when it is <= asOf, even beyond the horizon
    r = s_client.get(key_path("prices", "expiring"), params={"asOf": T0 + 2000})
    assert r.status_code == 200 and r.json()["value"] == "v2" and r.json()["validTo"] is None
    problem(s_client.get(key_path("prices", "p-1"), params={"asOf": T0 - 1}), 404, "expired")


def test_key_errors(s_client: httpx.Client) -> None:
    path = key_path("prices", "p-1")
    body = problem(s_client.get(path, params={"asof": "1"}), 400, "bad-request")
    assert "'asof'" in body["detail"] and body["parameter"] == "asof"
    body = problem(get_raw(s_client, path + "?asOf=1&asOf=2"), 400, "bad-request")
    assert "repeated" in body["detail"]
    for bad in ("yesterday", "", "-5", "1.5", "2024-01-01", "2024-13-01T00:00:00Z", "9223372036854775808"):
        body = problem(s_client.get(path, params={"asOf": bad}), 400, "bad-request")
        assert repr(bad) in body["detail"] or bad in body["detail"]
    problem(s_client.get(path, params={"snapshot": "5"}), 404, "snapshot-not-found")
    problem(s_client.get(key_path("nope", "p-1")), 404, "store-not-found")
    problem(get_raw(s_client, "/v1/stores/prices/keys/%zz"), 400, "bad-request")
    problem(get_raw(s_client, "/v1/stores/prices/keys/%e2%82"), 400, "bad-request")
    problem(get_raw(s_client, "/v1/stores/prices/keys/abc%"), 400, "bad-request")
    problem(get_raw(s_client, path + "?asOf=%zz"), 400, "bad-request")
    problem(s_client.get("/v1/stores/prices/keys/"), 400, "bad-request")
    body = problem(s_client.get(key_path("sessions", "s-1"), params={"asOf": "1"}), 400, "unsupported-query")
    assert "timestamped" in body["detail"]
    # timestamped stores answer latest by processing order (rule 12)
    r = s_client.get(key_path("sessions", "s-1"))
    assert r.json() == {
        "key": "s-1",
        "value": {"user": "bob"},
        "timestamp": T0 - 5,
        "validTo": None,
        "snapshot": 0,
    }


TIMESTAMP_EDGES = ("0000-01-01T00:00:00Z", "0000-02-29T00:00:00+00:00", "9999-12-31T23:59:59.999-23:59",
                   "2024-01-01T24:00:00Z", "2024-06-30T23:59:60Z", "2024-01-01T00:00:00+24:00",
                   "2024-01-01T00:00:00.%sZ" % ("9" * 3000), "\u0662\u0660\u0662\u0664-01-01T00:00:00Z",
                   "1969-12-31T23:59:59.999Z", "9" * 400, "2024-01-01T00:00:00 23:59")


@pytest.mark.parametrize("text", TIMESTAMP_EDGES)
def test_timestamp_edges_never_answer_5xx(s_client: httpx.Client, text: str) -> None:
    """Issue 10 item 1: a year-0 instant once answered 500. Every time parameter of every read
    either answers or is a 400 problem quoting the text."""
    reads = [(key_path("prices", "p-1"), "asOf"), (key_path("prices", "hist", "/versions"), "from"),
             (key_path("prices", "hist", "/versions"), "to"), ("/v1/streams/clicks/records", "from"),
             ("/v1/streams/clicks/records", "to")]
    for path, name in reads:
        r = s_client.get(path, params={name: text})
        assert r.status_code < 500, (path, name, r.text)
        if r.status_code == 400:
            assert problem(r, 400, "bad-request")["parameter"] == name


def test_odd_keys_round_trip(s_client: httpx.Client) -> None:
    for key in ODD_KEYS:
        r = s_client.get(key_path("prices", key))
        assert r.status_code == 200, (key, r.text)
        assert r.json()["key"] == key and r.json()["value"] == {"k": key}
        v = s_client.get(key_path("prices", key, "/versions"))
        assert v.status_code == 200 and v.json()["key"] == key and len(v.json()["records"]) == 1
    # dot segments: verbatim (no normalisation on the server) or escaped as clients must send them
    for raw, key in (
        ("/v1/stores/prices/keys/..", ".."),
        ("/v1/stores/prices/keys/%2E%2E", ".."),
        ("/v1/stores/prices/keys/.", "."),
        ("/v1/stores/prices/keys/%2e", "."),
        ("/v1/stores/prices/keys/%2E%2E/versions", ".."),
    ):
        assert get_raw(s_client, raw).json()["key"] == key, raw
    # foo%2Fversions is the key "foo/versions", not the versions endpoint of "foo"
    r = get_raw(s_client, "/v1/stores/prices/keys/foo%2Fversions")
    assert r.json()["key"] == "foo/versions" and "records" not in r.json()
    # an unencoded '/' is a path separator: no such route
    problem(get_raw(s_client, "/v1/stores/prices/keys/a/b"), 404, "route-not-found")
    # '+' in a path is a literal plus; a percent-encoded '%2B' too
    assert get_raw(s_client, "/v1/stores/prices/keys/+plus+").json()["key"] == "+plus+"
    assert get_raw(s_client, "/v1/stores/prices/keys/%2Bplus%2B").json()["key"] == "+plus+"


def test_unknown_routes_and_methods(s_client: httpx.Client) -> None:
    for path in (
        "/index.html",  # the console is "/" only, its assets /console/console.{js,css} only
        "/console/",
        "/console/index.html",
        "/v1",
        "/v1/",
        "/v1/store",
        "/v1/stores/prices/keyz",
        "/v1/stores/prices/keys:batchPut",
        "/v1/stores/prices/x/y",
        "/v1/stores/prices/keys/k/versions/x",
        "/v1/stores/prices/keys/k/history",
        "/static/docs/",  # the API docs (/docs, /redoc) serve their listed assets only
        "/static/docs/swagger-ui/index.html",
    ):
        problem(get_raw(s_client, path), 404, "route-not-found")
    r = s_client.post("/v1/stores")
    problem(r, 405, "method-not-allowed")
    assert r.headers["allow"] == "GET, HEAD"
    problem(s_client.delete("/healthz"), 405, "method-not-allowed")


def test_head_answers_what_get_would_without_the_body(s_client: httpx.Client) -> None:
    for path in ("/v1/stores", "/v1/stores/prices", "/v1/stores/nope", "/v1/nothing", "/healthz", "/readyz",
                 "/metrics", "/openapi.json"):
        got, head = s_client.get(path), s_client.head(path)
        assert head.status_code == got.status_code, path
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if path not in ("/metrics", "/readyz"):  # their text changes between two requests (counters, ages)
            assert head.headers["content-length"] == got.headers["content-length"], path
        else:
            assert int(head.headers["content-length"]) > 0, path
    counted = s_client.get("/metrics").text
    assert 'method="HEAD"' in counted  # HEAD requests are counted as themselves


# ---------------------------------------------------------------------------- versions
def test_versions_semantics(s_client: httpx.Client) -> None:
    path = key_path("prices", "p-1", "/versions")
    r = s_client.get(path)
    assert r.status_code == 200
    body = r.json()
    assert body == {
        "key": "p-1",
        "records": [
            {"value": {"price": 1.5, "currency": "EUR"}, "timestamp": T0, "validTo": T0 + 9 * HOUR + 500},
            {"value": {"price": 2.0, "currency": "EUR"}, "timestamp": T0 + 9 * HOUR + 500, "validTo": None},
        ],
        "nextPageToken": None,
        "snapshot": 0,
        "horizon": T0 + 9 * HOUR,
        "truncated": True,  # no `from`: the range reaches below the horizon (rule 32)
    }
    assert b'"price":2.00' in r.content
    assert s_client.get(path, params={"from": T0 + 9 * HOUR}).json()["truncated"] is False
    # history that ended at or before the horizon is expired and never returned
    assert [
        r["value"] for r in s_client.get(key_path("prices", "expiring", "/versions")).json()["records"]
    ] == ["v2"]
    # expired history is never returned; ranges below the horizon only see the latest, and one
    # the latest is after is expired (rule 32), not an empty page
    gone = s_client.get(key_path("prices", "expiring", "/versions"), params={"to": T0 + 500})
    assert gone.status_code == 404 and gone.json()["type"].endswith("/expired"), gone.text
    assert gone.json()["horizon"] == T0 + 9 * HOUR and "wholly before" in gone.json()["detail"]
    assert [
        x["value"]
        for x in s_client.get(key_path("prices", "expiring", "/versions"), params={"to": T0 + 1000}).json()[
            "records"
        ]
    ] == ["v2"]
    # rule 9 edges on hist: validity [ts, validTo) intersects [from, to]
    hist = key_path("prices", "hist", "/versions")
    b = T0 + 9 * HOUR
    ts = [
        x["timestamp"]
        for x in s_client.get(hist, params={"from": b + 1500, "to": b + 3000}).json()["records"]
    ]
    assert ts == [b + 1000, b + 2000, b + 3000]
    ts = [
        x["timestamp"]
        for x in s_client.get(hist, params={"from": b + 2000, "to": b + 2000}).json()["records"]
    ]
    assert ts == [b + 2000]
    desc = s_client.get(hist, params={"from": b, "to": b + 2000, "order": "desc"}).json()["records"]
    assert [x["timestamp"] for x in desc] == [b + 2000, b + 1000, b]
    assert desc[0]["validTo"] == b + 3000
    assert s_client.get(key_path("prices", "missing", "/versions")).json()["records"] == []
    assert s_client.get(key_path("prices", "deleted", "/versions")).json()["records"] == [
        {"value": "alive", "timestamp": T0 + 9 * HOUR + 100, "validTo": T0 + 9 * HOUR + 200}
    ]


def test_versions_errors(s_client: httpx.Client) -> None:
    hist = key_path("prices", "hist", "/versions")
    body = problem(s_client.get(hist, params={"from": "2000", "to": "1000"}), 400, "bad-request")
    assert "after" in body["detail"]
    for bad in ("0", "1001", "-1", "abc", "10.0", "", " 5"):
        body = problem(s_client.get(hist, params={"pageSize": bad}), 400, "bad-request")
        assert body["parameter"] == "pageSize"
    assert len(s_client.get(hist, params={"pageSize": "1000"}).json()["records"]) == HIST_VERSIONS
    for bad in ("ASC", "up", ""):
        problem(s_client.get(hist, params={"order": bad}), 400, "bad-request")
    problem(s_client.get(hist, params={"from": "soon"}), 400, "bad-request")
    problem(s_client.get(hist, params={"To": "1"}), 400, "bad-request")
    problem(get_raw(s_client, hist + "?order=asc&order=desc"), 400, "bad-request")
    problem(s_client.get(hist, params={"snapshot": "3"}), 404, "snapshot-not-found")
    problem(s_client.get(key_path("nope", "k", "/versions")), 404, "store-not-found")
    problem(s_client.get(key_path("sessions", "s-1", "/versions")), 400, "unsupported-query")


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
        assert len(body["records"]) == p.get("pageSize", 100)


def test_paging_to_the_end(s_client: httpx.Client) -> None:
    hist = key_path("prices", "hist", "/versions")
    recs, pages = collect(s_client, hist, {})
    assert pages == 3 and [int(r["value"]) for r in recs] == list(range(HIST_VERSIONS))
    recs, pages = collect(s_client, hist, {"order": "desc", "pageSize": 50})
    assert pages == 5 and [int(r["value"]) for r in recs] == list(range(HIST_VERSIONS))[::-1]
    # exactly full last page: the server reads one ahead, so no empty trailing page
    b = T0 + 9 * HOUR
    recs, pages = collect(s_client, hist, {"from": b, "to": b + 9000, "pageSize": 5})
    assert pages == 2 and len(recs) == 10
    # pageSize may change between pages; defaults equal explicit values
    first = s_client.get(hist, params={"pageSize": 10}).json()
    nxt = s_client.get(
        hist, params={"pageSize": 7, "order": "asc", "pageToken": first["nextPageToken"]}
    ).json()
    assert [int(r["value"]) for r in nxt["records"]] == list(range(10, 17))
    # ISO bounds equal to epoch bounds are the same query
    first = s_client.get(hist, params={"from": str(b), "pageSize": 2}).json()
    iso_b = "2023-11-15T07:13:20Z"
    nxt = s_client.get(hist, params={"from": iso_b, "pageSize": 2, "pageToken": first["nextPageToken"]})
    assert nxt.status_code == 200 and nxt.json()["records"][0]["value"] == 2


def test_token_binding_and_tampering(s_client: httpx.Client) -> None:
    hist = key_path("prices", "hist", "/versions")
    b = T0 + 9 * HOUR
    params = {"from": str(b), "to": str(b + 100_000), "pageSize": "10"}
    token = s_client.get(hist, params=params).json()["nextPageToken"]
    assert token
    for change in ({"from": str(b + 1)}, {"to": None}, {"order": "desc"}, {"from": None}):
        p = {**params, "pageToken": token}
        for k, v in change.items():
            if v is None:
                p.pop(k)
            else:
                p[k] = v
        body = problem(s_client.get(hist, params=p), 400, "bad-request")
        assert body["parameter"] == "pageToken" and "differ" in body["detail"]
    problem(
        s_client.get(key_path("prices", "p-1", "/versions"), params={**params, "pageToken": token}),
        400,
        "bad-request",
    )
    problem(
        s_client.get(key_path("live", "hist", "/versions"), params={**params, "pageToken": token}),
        400,
        "bad-request",
    )
    body = problem(
        s_client.get(hist, params={**params, "pageToken": token, "snapshot": "1"}), 400, "bad-request"
    )
    assert body["parameter"] == "snapshot"
    assert s_client.get(hist, params={**params, "pageToken": token, "snapshot": "0"}).status_code == 200
    # tampering: flip payload bits, drop the MAC, garbage, empty, non-ASCII
    head, mac = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    payload[7] = payload[7] - 5000  # move the position
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode() + "." + mac
    for bad in (forged, head, head + ".", "." + mac, "x", "", "a.b.c", "%%%", "é.é", token[:-2], token + "A"):
        body = problem(s_client.get(hist, params={**params, "pageToken": bad}), 400, "bad-request")
        assert body["parameter"] == "pageToken"


def test_token_pins_snapshot_while_ingest_commits(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    live = s_warehouse.live
    path = key_path("live", "k", "/versions")
    first = s_client.get(path, params={"pageSize": 10}).json()
    pinned = first["snapshot"]
    # a commit lands between pages: inserts versions inside and after the listed range
    new_version = live.apply([("k", f'"new{i}"', T0 + i) for i in range(1, 100, 2)])
    deadline = time.monotonic() + 10
    while s_client.get("/v1/stores/live").json()["snapshot"] != new_version:
        assert time.monotonic() < deadline, "refresh did not pick up the commit"
        time.sleep(0.05)
    records = list(first["records"])
    token = first["nextPageToken"]
    while token:
        page = s_client.get(path, params={"pageSize": 10, "pageToken": token}).json()
        assert page["snapshot"] == pinned
        records += page["records"]
        token = page["nextPageToken"]
    assert [r["value"] for r in records] == list(range(0, 100, 2))  # neither skips nor repeats
    fresh, _ = collect(s_client, path, {"pageSize": 10})
    assert len(fresh) == 100
    # the old snapshot stays readable explicitly
    old = s_client.get(key_path("live", "k"), params={"snapshot": str(pinned)}).json()
    assert old["value"] == 98 and old["snapshot"] == pinned
    new = s_client.get(key_path("live", "k")).json()
    assert new["value"] == "new99" and new["snapshot"] == new_version


# ---------------------------------------------------------------------------- operations
def test_health_ready_openapi(s_client: httpx.Client) -> None:
    assert s_client.get("/healthz").json() == {"status": "ok"}
    r = s_client.get("/readyz")
    assert r.status_code == 200 and r.json()["ready"] is True
    assert set(r.json()["stores"]) == {"prices", "sessions", "live", "expensive"}
    assert set(r.json()["streams"]) == {"clicks", "clicks_priced"}
    served = s_client.get("/openapi.json")
    assert served.headers["content-type"] == "application/json"
    with OPENAPI_PATH.open() as fh:
        assert served.json() == yaml.safe_load(fh)
    with open(Path(__file__).resolve().parents[2] / "openapi.yaml") as fh:
        assert served.json() == yaml.safe_load(fh)


def test_metrics(s_client: httpx.Client) -> None:
    s_client.get(key_path("prices", "p-1"))
    s_client.get(key_path("prices", "missing"))
    s_client.get("/nowhere")
    text = s_client.get("/metrics").text
    assert (
        'versiq_http_requests_total{method="GET",route="/v1/stores/{store}/keys/{key}",status="200"}' in text
    )
    assert (
        'versiq_http_requests_total{method="GET",route="/v1/stores/{store}/keys/{key}",status="404"}' in text
    )
    assert 'route="unmatched",status="404"' in text
    assert (
        'versiq_http_request_duration_seconds_bucket{le="0.005",method="GET",route="/v1/stores/{store}/keys/{key}"'
        in text
    )
    assert 'versiq_store_snapshot_version{store="prices"} 0.0' in text
    assert 'versiq_store_refresh_age_seconds{store="prices"}' in text
    assert "versiq_ready 1.0" in text
    assert "p-1" not in text and "missing" not in text  # keys never become labels


def test_cors(s_client: httpx.Client) -> None:
    r = s_client.get("/v1/stores", headers={"Origin": "https://ui.example"})
    assert r.headers["access-control-allow-origin"] == "https://ui.example"
    r = s_client.options(
        "/v1/stores",
        headers={
            "Origin": "https://ui.example",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert r.status_code == 200 and "GET" in r.headers["access-control-allow-methods"]
    r = s_client.get("/v1/stores", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


# ---------------------------------------------------------------------------- other servers
def test_auth(s_warehouse: Warehouse, tmp_path: Any) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("# ops\nfile-token\n")
    settings = Settings.from_env(
        {
            "VERSIQ_WAREHOUSE": s_warehouse.path,
            "VERSIQ_API_TOKENS": "t1, t2",
            "VERSIQ_API_TOKENS_FILE": str(tokens_file),
        }
    )
    with live_server(settings) as url, httpx.Client(base_url=url) as c:
        for path in (
            "/v1/stores",
            "/v1/stores/prices",
            key_path("prices", "p-1"),
            key_path("prices", "hist", "/versions"),
            "/metrics",
            "/v1/nowhere",
        ):
            r = c.get(path)
            problem(r, 401, "unauthorized")
            assert r.headers["www-authenticate"].startswith("Bearer")
            r = c.get(path, headers={"Authorization": "Bearer wrong"})
            problem(r, 401, "unauthorized")
            assert 'error="invalid_token"' in r.headers["www-authenticate"]
            problem(c.get(path, headers={"Authorization": "Basic dDE6"}), 401, "unauthorized")
        for token in ("t1", "t2", "file-token"):
            assert (
                c.get(key_path("prices", "p-1"), headers={"Authorization": f"Bearer {token}"}).status_code
                == 200
            )
        assert c.get("/metrics", headers={"Authorization": "bearer t1"}).status_code == 200
        for open_path in ("/healthz", "/readyz", "/openapi.json"):
            assert c.get(open_path).status_code == 200


def test_token_expiry(s_warehouse: Warehouse) -> None:
    settings = Settings(warehouse=s_warehouse.path, token_ttl_s=0.3, token_secret=b"s1")
    hist = key_path("prices", "hist", "/versions")
    with live_server(settings) as url, httpx.Client(base_url=url) as c:
        token = c.get(hist, params={"pageSize": 5}).json()["nextPageToken"]
        assert c.get(hist, params={"pageToken": token}).status_code == 200
        time.sleep(0.4)
        body = problem(c.get(hist, params={"pageToken": token}), 410, "gone")
        assert "expired" in body["detail"]
    # another server secret: the token is not valid there (400), the same secret accepts it
    with live_server(Settings(warehouse=s_warehouse.path, token_secret=b"s2")) as url2:
        with httpx.Client(base_url=url2) as c:
            token = c.get(hist, params={"pageSize": 5}).json()["nextPageToken"]
        with (
            live_server(Settings(warehouse=s_warehouse.path, token_secret=b"s2")) as url3,
            httpx.Client(base_url=url3) as c3,
        ):
            assert c3.get(hist, params={"pageToken": token}).status_code == 200
        with (
            live_server(Settings(warehouse=s_warehouse.path, token_secret=b"s3")) as url4,
            httpx.Client(base_url=url4) as c4,
        ):
            problem(c4.get(hist, params={"pageToken": token}), 400, "bad-request")


def test_vacuumed_snapshot_is_gone(tmp_path: Any) -> None:
    from deltalake import DeltaTable

    from tests.support.storebuilder import StoreBuilder

    wh = str(tmp_path)
    b = StoreBuilder(wh, "vac")
    b.apply([("k", str(i), T0 + i) for i in range(20)])
    b.apply([("k", str(i), T0 + i) for i in range(20, 40)])
    settings = Settings(warehouse=wh, token_secret=b"v")
    path = key_path("vac", "k", "/versions")
    with live_server(settings) as url, httpx.Client(base_url=url) as c:
        token = c.get(path, params={"pageSize": 5, "snapshot": "0"}).json()["nextPageToken"]
        dt = DeltaTable(b.path)
        dt.optimize.compact()
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        problem(c.get(path, params={"snapshot": "0"}), 410, "gone")
        problem(c.get(path, params={"pageToken": token}), 410, "gone")
        problem(c.get(key_path("vac", "k"), params={"snapshot": "0"}), 410, "gone")
        assert c.get(key_path("vac", "k")).status_code == 200


def test_not_ready_without_warehouse(tmp_path: Any) -> None:
    settings = Settings(warehouse=str(tmp_path / "missing"))
    with live_server(settings) as url, httpx.Client(base_url=url) as c:
        r = c.get("/readyz")
        assert r.status_code in (200, 503)
        if r.status_code == 503:
            body = problem(r, 503, "not-ready")
            assert body["ready"] is False
        assert c.get("/v1/stores").json() == {"stores": [], "unavailable": []}
        problem(c.get(key_path("x", "k")), 404, "store-not-found")


# ---------------------------------------------------------------------------- beyond one key (#16)
def _all_keys(client: httpx.Client, store: str, **params: Any) -> tuple[list[dict[str, Any]], set[int]]:
    records: list[dict[str, Any]] = []
    snapshots: set[int] = set()
    query: dict[str, Any] = dict(params)
    while True:
        r = client.get(f"/v1/stores/{store}/keys", params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["store"] == store
        records += body["records"]
        snapshots.add(body["snapshot"])
        if body["nextPageToken"] is None:
            return records, snapshots
        query = {**params, "pageToken": body["nextPageToken"]}


def test_key_listing(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    """Issue 16 item 1: every key in UTF-8 byte order with the record the single-key read
    answers; tombstones only with includeDeleted; prefix and range; paging pins the snapshot."""
    records, snapshots = _all_keys(s_client, "prices", pageSize=3)
    assert len(snapshots) == 1
    keys = [r["key"] for r in records]
    assert keys == sorted(keys, key=lambda k: k.encode("utf-8")) and "deleted" not in keys
    for r in records:
        single = get_raw(s_client, key_path("prices", r["key"])).json()  # raw: keys such as "." and ".."
        assert {k: single[k] for k in ("key", "value", "timestamp", "validTo")} == r
    with_deleted, _ = _all_keys(s_client, "prices", includeDeleted="true", pageSize=1000)
    [gone] = [r for r in with_deleted if r["key"] == "deleted"]
    assert gone == {"key": "deleted", "timestamp": T0 + 9 * HOUR + 200, "validTo": None, "deleted": True}
    assert [r for r in with_deleted if r["key"] != "deleted"] == records
    p_keys, _ = _all_keys(s_client, "prices", prefix="p-")
    assert [r["key"] for r in p_keys] == ["p-1"]
    ranged, _ = _all_keys(s_client, "prices", start="e", end="h")
    assert [r["key"] for r in ranged] == [k for k in keys if "e" <= k < "h"] and ranged
    as_of, _ = _all_keys(s_client, "prices", asOf=T0 + 9 * HOUR + 150, prefix="deleted")
    assert as_of == [{"key": "deleted", "value": "alive", "timestamp": T0 + 9 * HOUR + 100,
                      "validTo": T0 + 9 * HOUR + 200}]
    sessions, _ = _all_keys(s_client, "sessions")
    assert [r["key"] for r in sessions] == ["s-1"]


def test_key_listing_errors(s_client: httpx.Client) -> None:
    problem(s_client.get("/v1/stores/prices/keys", params={"start": "b", "end": "a"}), 400, "bad-request")
    problem(s_client.get("/v1/stores/prices/keys", params={"includeDeleted": "yes"}), 400, "bad-request")
    problem(s_client.get("/v1/stores/prices/keys", params={"pageSize": "0"}), 400, "bad-request")
    problem(s_client.get("/v1/stores/sessions/keys", params={"asOf": "5"}), 400, "unsupported-query")
    problem(s_client.get("/v1/stores/nope/keys"), 404, "store-not-found")
    first = s_client.get("/v1/stores/prices/keys", params={"pageSize": 1}).json()
    other = s_client.get("/v1/stores/prices/keys", params={"pageSize": 1, "prefix": "p",
                                                           "pageToken": first["nextPageToken"]})
    assert "another key listing" in problem(other, 400, "bad-request")["detail"]
    versions_token = s_client.get(key_path("prices", "hist") + "/versions", params={"pageSize": 1}).json()
    wrong = s_client.get("/v1/stores/prices/keys", params={"pageToken": versions_token["nextPageToken"]})
    problem(wrong, 400, "bad-request")


def test_batch_get(s_client: httpx.Client) -> None:
    """Issue 16 item 2: one result per key in request order, each what the single-key read of
    the same snapshot answers (record, or its problem), from one snapshot."""
    keys = ["p-1", "missing", "deleted", "expiring", "p-1", "hist"]
    for as_of in (None, T0 + 500, T0 - 10 * HOUR):
        body: dict[str, Any] = {"keys": keys}
        if as_of is not None:
            body["asOf"] = as_of
        r = s_client.post("/v1/stores/prices/keys:batchGet", json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["store"] == "prices" and [x["key"] for x in answer["results"]] == keys
        for key, result in zip(keys, answer["results"], strict=True):
            params = {"snapshot": answer["snapshot"]} | ({} if as_of is None else {"asOf": as_of})
            single = get_raw(s_client, key_path("prices", key) + "?" + urlencode(params))
            assert result.get("asOf") == as_of
            if single.status_code == 200:
                want = single.json()
                assert result["record"] == {k: want[k] for k in ("value", "timestamp", "validTo")}
            else:
                assert result["problem"] == single.json(), key
    rfc = s_client.post("/v1/stores/prices/keys:batchGet", json={"keys": ["p-1"], "asOf": "2100-01-01T00:00:00Z"})
    assert rfc.status_code == 200 and "record" in rfc.json()["results"][0]


def test_batch_get_errors(s_client: httpx.Client) -> None:
    url = "/v1/stores/prices/keys:batchGet"
    assert "at most 1000" in problem(s_client.post(url, json={"keys": ["k"] * 1001}), 400, "bad-request")["detail"]
    for body in ({}, {"keys": []}, {"keys": [""]}, {"keys": [1]}, {"keys": ["a"], "asOf": -1},
                 {"keys": ["a"], "asOf": "yesterday"}, {"keys": ["a"], "snapshot": "1"}, {"keys": ["a"], "k": 1},
                 ["a"]):
        problem(s_client.post(url, json=body), 400, "bad-request")
    problem(s_client.post(url, content=b"{not json", headers={"content-type": "application/json"}),
            400, "bad-request")
    problem(s_client.post(url, content=b"keys=a", headers={"content-type": "text/plain"}), 415,
            "unsupported-media-type")
    too_big = s_client.post(url, content=b" " * (33 * 1024 * 1024), headers={"content-type": "application/json"})
    problem(too_big, 413, "content-too-large")
    r = s_client.get(url)
    problem(r, 405, "method-not-allowed")
    assert r.headers["allow"] == "POST"
    problem(s_client.post("/v1/stores/sessions/keys:batchGet", json={"keys": ["s-1"], "asOf": 5}), 400,
            "unsupported-query")
    problem(s_client.post("/v1/stores/prices/keys:batchGet", json={"keys": ["p-1"], "snapshot": 999}), 404,
            "snapshot-not-found")
    problem(s_client.post("/v1/stores/nope/keys:batchGet", json={"keys": ["a"]}), 404, "store-not-found")


def test_a_not_found_caused_by_a_tombstone_says_when(s_client: httpx.Client) -> None:
    """Issue 16 item 4 (part): the 404 of a deleted key names the tombstone's time."""
    body = problem(s_client.get(key_path("prices", "deleted")), 404, "not-found")
    assert body["deletedAt"] == T0 + 9 * HOUR + 200
    assert f"deleted at 2023-11-15T07:13:20.200Z ({T0 + 9 * HOUR + 200})" in body["detail"]  # RFC 3339 for people
    body = problem(s_client.get(key_path("prices", "missing")), 404, "not-found")
    assert "deletedAt" not in body and "deleted" not in body["detail"]
    alive = s_client.get(key_path("prices", "deleted"), params={"asOf": T0 + 9 * HOUR + 150})
    assert alive.status_code == 200 and alive.json()["value"] == "alive"


@pytest.mark.rule(32)
def test_versions_show_tombstones_when_asked_and_page_tokens_bind_that(s_client: httpx.Client) -> None:
    """Issue 16 item 4: ``includeDeleted=true`` returns the tombstone as a record with
    ``deleted: true`` and no value; the values are those of the same read without it; a page
    token issued with it cannot be used without it."""
    path = key_path("prices", "deleted", "/versions")
    plain = s_client.get(path).json()["records"]
    assert plain == [{"value": "alive", "timestamp": T0 + 9 * HOUR + 100, "validTo": T0 + 9 * HOUR + 200}]
    shown = s_client.get(path, params={"includeDeleted": "true"}).json()["records"]
    assert shown == [*plain, {"timestamp": T0 + 9 * HOUR + 200, "validTo": None, "deleted": True}]
    desc = s_client.get(path, params={"includeDeleted": "true", "order": "desc"}).json()["records"]
    assert desc == shown[::-1]
    first = s_client.get(path, params={"includeDeleted": "true", "pageSize": 1}).json()
    assert first["records"] == shown[:1] and first["nextPageToken"]
    rest = s_client.get(path, params={"includeDeleted": "true", "pageSize": 1, "pageToken": first["nextPageToken"]})
    assert rest.json()["records"] == shown[1:]
    body = problem(s_client.get(path, params={"pageToken": first["nextPageToken"]}), 400, "bad-request")
    assert "includeDeleted" in body["detail"]
    problem(s_client.get(path, params={"includeDeleted": "yes"}), 400, "bad-request")


def test_etags_answer_304_until_the_answer_changes(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    """Issue 16 item 7: every /v1 read carries an ETag; If-None-Match with it (weak form, in a
    list, or *) is a 304 without a body until a commit changes that answer."""
    path = key_path("live", "etag")
    s_warehouse.live.apply([("etag", '"one"', T0)])
    _until_value(s_client, path, "one")
    first = s_client.get(path)
    tag = first.headers["etag"]
    assert tag.startswith('"') and tag.endswith('"')
    for header in (tag, f"W/{tag}", f'"other", {tag}', "*"):
        again = s_client.get(path, headers={"If-None-Match": header})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == tag
    head = s_client.head(path, headers={"If-None-Match": tag})
    assert head.status_code == 304
    assert s_client.get(path, headers={"If-None-Match": '"other"'}).status_code == 200
    assert s_client.get("/v1/stores", headers={"If-None-Match": tag}).status_code == 200  # another answer
    s_warehouse.live.apply([("etag", '"two"', T0 + 1)])
    _until_value(s_client, path, "two")
    changed = s_client.get(path, headers={"If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["etag"] != tag


def _until_value(client: httpx.Client, path: str, value: str) -> None:
    deadline = time.monotonic() + 20
    while client.get(path).json().get("value") != value:
        assert time.monotonic() < deadline, f"{path} never answered {value!r}"
        time.sleep(0.05)


def test_min_snapshot_reads_your_writes_or_answers_503(s_client: httpx.Client, s_warehouse: Warehouse) -> None:
    """Issue 16 item 7: ``minSnapshot=V`` answers from a snapshot >= V, waiting for the refresh
    when V has just been committed; a V that does not come is a 503 with Retry-After; a named
    older snapshot is a 400."""
    path = key_path("live", "rw")
    current = s_client.get("/v1/stores/live").json()["snapshot"]
    assert s_client.get("/v1/stores/live", params={"minSnapshot": current}).json()["snapshot"] == current
    committed = s_warehouse.live.apply([("rw", '"mine"', T0)])  # the write; the server has not refreshed yet
    mine = s_client.get(path, params={"minSnapshot": committed})
    assert mine.status_code == 200 and mine.json()["value"] == "mine" and mine.json()["snapshot"] >= committed
    started = time.monotonic()
    later = s_client.get(path, params={"minSnapshot": committed + 50})  # never committed: no wait
    assert problem(later, 404, "snapshot-not-found")["snapshot"] == committed + 50
    assert time.monotonic() - started < 1.9  # a wait for a snapshot lasts at least 2 s
    problem(s_client.get(path, params={"minSnapshot": committed, "snapshot": 0}), 400, "bad-request")
    problem(s_client.get(path, params={"minSnapshot": "x"}), 400, "bad-request")
    batch = s_client.post("/v1/stores/live/keys:batchGet", json={"keys": ["rw"], "minSnapshot": committed})
    assert batch.status_code == 200 and batch.json()["snapshot"] >= committed
