"""``GET /v1/stores/{store}/rejected`` end to end: real Spark ingest runs reject records (bad
JSON, a missing key, a late record), a live server lists them as ``versiq rejected`` reads them,
per snapshot, filtered by reason and paged with tokens that pin the snapshot."""

from __future__ import annotations

import httpx
import pytest

from tests.support.e2e import problem, serve_engine
from tests.support.ingest import write_jsonl
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.rejected import iter_rejected

HOUR = 3_600_000
T0 = 1_700_000_000_000

RUN_1 = [f'{{"key":"a","value":1,"timestamp":{T0}}}',
         '{"key":"a","value":',
         f'{{"value":2,"timestamp":{T0}}}',
         f'{{"key":"b","value":3,"timestamp":{T0 + 3 * HOUR}}}']
RUN_2 = [f'{{"key":"c","value":4,"timestamp":{T0 + 3 * HOUR}}}',
         f'{{"key":"late","value":5,"timestamp":{T0}}}',
         "not json at all"]


@pytest.fixture(scope="module")
def rejecting(spark, tmp_path_factory):
    """Store ``s`` after two runs (snapshots of run 1 and run 2) and store ``clean`` that never
    rejected anything."""
    root = tmp_path_factory.mktemp("rejected")
    warehouse, source, clean_source = str(root / "wh"), str(root / "src"), str(root / "clean")
    write_jsonl(source, "day-1.jsonl", RUN_1)
    write_jsonl(clean_source, "ok.jsonl", [f'{{"key":"x","value":1,"timestamp":{T0}}}'])
    first = run_ingest(spark, warehouse, [StoreSpec("s", source, history_retention_ms=HOUR),
                                          StoreSpec("clean", clean_source)])
    write_jsonl(source, "day-2.jsonl", RUN_2)
    second = run_ingest(spark, warehouse, [StoreSpec("s", source, history_retention_ms=HOUR)])
    snapshots = (first.stores["s"].snapshot, second.stores["s"].snapshot)
    return warehouse, snapshots


def _http(record: dict, record_id: int) -> dict:
    """A ``versiq rejected`` JSON line as the HTTP listing spells it (``record_id``: its place in
    the unfiltered listing; these raw texts are short, so none is cut)."""
    out = dict(record)
    out["ingestedAt"] = out.pop("ingested_at")
    raw = out["raw"]
    out.update(id=record_id, rawLength=None if raw is None else len(raw), rawTruncated=False)
    return out


def test_the_listing_is_what_versiq_rejected_prints_with_counts_per_reason(rejecting):
    warehouse, (first, second) = rejecting
    expected = [_http(r, i) for i, r in enumerate(iter_rejected(warehouse, "s"))]
    assert [(r["reason"], r["source"], r["line"], r["run"]) for r in expected] == [
        ("malformed", "day-1.jsonl", 2, 1), ("missing_field", "day-1.jsonl", 3, 1),
        ("late", "day-2.jsonl", 2, 2), ("malformed", "day-2.jsonl", 3, 2)]
    with serve_engine(warehouse) as (url, _engine), httpx.Client(base_url=url, timeout=30) as client:
        body = client.get("/v1/stores/s/rejected").json()
        assert body == {"store": "s", "snapshot": second, "counts": {"late": 1, "malformed": 2, "missing_field": 1},
                        "total": 4, "records": expected, "nextPageToken": None}
        assert expected[1]["raw"] == RUN_1[2] and "key" in expected[1]["detail"]
        # Details are for people: times in RFC 3339 (with the epoch ms), durations as written.
        assert expected[2]["detail"] == (
            "timestamp 2023-11-14T22:13:20.000Z (1700000000000) is older than stream time "
            "2023-11-15T01:13:20.000Z minus history retention 1h (horizon 2023-11-15T00:13:20.000Z)")

        malformed = client.get("/v1/stores/s/rejected", params={"reason": "malformed"}).json()
        assert malformed["records"] == [r for r in expected if r["reason"] == "malformed"]
        assert (malformed["total"], malformed["counts"]) == (2, body["counts"])

        # Snapshot of run 1: the rejections of run 1 only.
        older = client.get("/v1/stores/s/rejected", params={"snapshot": first}).json()
        assert older["snapshot"] == first
        assert older["records"] == [r for r in expected if r["run"] == 1]
        assert older["counts"] == {"malformed": 1, "missing_field": 1}

        clean = client.get("/v1/stores/clean/rejected").json()
        assert (clean["records"], clean["counts"], clean["total"]) == ([], {}, 0)


def test_pages_follow_tokens_that_pin_the_snapshot_and_the_reason(rejecting):
    warehouse, (first, second) = rejecting
    expected = [_http(r, i) for i, r in enumerate(iter_rejected(warehouse, "s"))]
    with serve_engine(warehouse) as (url, _engine), httpx.Client(base_url=url, timeout=30) as client:
        seen, token, pages = [], None, 0
        while True:
            params = {"pageSize": 1, **({"pageToken": token} if token else {})}
            page = client.get("/v1/stores/s/rejected", params=params).json()
            seen += page["records"]
            pages += 1
            assert page["snapshot"] == second and page["total"] == 4
            token = page["nextPageToken"]
            if token is None:
                break
        assert (seen, pages) == (expected, 4)

        first_page = client.get("/v1/stores/s/rejected", params={"pageSize": 1, "snapshot": first}).json()
        token = first_page["nextPageToken"]
        follow = client.get("/v1/stores/s/rejected", params={"pageSize": 1, "pageToken": token}).json()
        assert follow["snapshot"] == first and follow["nextPageToken"] is None
        assert follow["records"] == [r for r in expected if r["run"] == 1][1:]
        other = client.get("/v1/stores/s/rejected", params={"pageToken": token, "reason": "late"})
        assert problem(other, 400, "bad-request")["parameter"] == "pageToken"
        moved = client.get("/v1/stores/s/rejected", params={"pageToken": token, "snapshot": second})
        assert problem(moved, 400, "bad-request")["parameter"] == "snapshot"


def test_bad_requests_are_precise_problems(rejecting):
    warehouse, _ = rejecting
    with serve_engine(warehouse) as (url, _engine), httpx.Client(base_url=url, timeout=30) as client:
        unknown = problem(client.get("/v1/stores/s/rejected", params={"reason": "odd"}), 400, "bad-request")
        assert "unknown reason 'odd'" in unknown["detail"] and "malformed" in unknown["detail"]
        problem(client.get("/v1/stores/s/rejected", params={"pageSize": 0}), 400, "bad-request")
        problem(client.get("/v1/stores/nope/rejected"), 404, "store-not-found")
        problem(client.get("/v1/stores/s/rejected", params={"snapshot": 99}), 404, "snapshot-not-found")
