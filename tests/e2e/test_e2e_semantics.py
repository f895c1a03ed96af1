"""docs/semantics.md, rules 6-11 and 22 end to end: real Spark ingest -> real Delta -> live uvicorn -> httpx.

One store ``sem`` (3 partitions = 3 stream-time domains, 30-day history retention):

- partition 0: one key per read rule (6-11) and per retention edge, June/July 2023,
  stream time 2023-07-31 so the horizon h0 is 2023-07-01T00:00Z;
- partition 1: the KIP-968 worked example (integer key 1, ISO timestamps in the input);
- partition 2: ``snap``, whose horizon moves in run 2 (snapshot 1), so ``?snapshot=0`` and page
  tokens pinned to snapshot 0 must judge expiry as the store did at snapshot 0.

Expected answers are written out by hand; every one is also checked against the reference model
(tests/support/reference.py), so neither a wrong model nor a wrong implementation can pass alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.e2e import (
    IngestedStore,
    collect_pages,
    iso,
    key_path,
    model_counts,
    model_key_json,
    model_versions_json,
    ms,
    problem,
    report_counts,
    serve_engine,
    source_dir,
)
from tests.support.ingest import records_from

DAY = 86_400_000
H = 30 * DAY
STORE = "sem"


def june(d: int) -> int:
    return ms(f"2023-06-{d:02d}T00:00:00Z")


def july(d: int) -> int:
    return ms(f"2023-07-{d:02d}T00:00:00Z")


H0 = july(1)            # horizon of partition 0 = stream time (July 31) - 30 days
S0 = july(31)
T1 = ms("2023-03-01T00:00:00Z")
KIP = {d: ms(f"2023-01-{d:02d}T10:00:00Z") for d in (1, 5, 10, 15, 20)}

P0 = [  # (key, value JSON text | None, timestamp, partition) in file order
    # retention keys first (June), while stream time still admits them
    ("solo", '"solo"', june(5), 0),
    ("oldtomb", '"v"', june(5), 0),
    ("oldtomb", None, june(8), 0),
    ("exp", '"old"', june(10), 0),
    ("exp", '"mid"', june(15), 0),
    ("edge", '"a"', june(10), 0),
    ("exp", '"new"', july(5), 0),        # stream time July 5: grace bound June 5
    ("edge", '"b"', H0, 0),              # exactly at the final horizon
    ("edge", '"c"', july(3), 0),
    ("atbound", '"ok"', june(5), 0),     # == streamTime - H: accepted (rule 3)
    ("under", '"no"', june(5) - 1, 0),   # one ms older: rejected late
    # rule keys (July, after the final horizon)
    ("ooo", '"a1"', july(2), 0),
    ("ooo", '"a3"', july(4), 0),
    ("ooo", '"a2"', july(3), 0),         # out-of-order (rule 4)
    ("rep", '"x"', july(2), 0),
    ("rep", '"y"', july(2), 0),          # same timestamp: replaces (rule 1)
    ("rep2", '"v"', july(2), 0),
    ("rep2", None, july(2), 0),          # value -> tombstone at the same timestamp
    ("tomb", '"alive"', july(2), 0),
    ("tomb", None, july(4), 0),
    ("tomb", '"back"', july(6), 0),
    ("tomblast", '"v"', july(2), 0),
    ("tomblast", None, july(3), 0),
    ("empty", '""', july(2), 0),
    ("num", '{"p":1.50,"q":[1e3,-0.0,10.000],"s":"x"}', july(2), 0),
    ("rng", "10", july(10), 0),
    ("rng", "15", july(15), 0),
    ("rng", "20", july(20), 0),
    ("rng", "25", july(25), 0),
    ("clock", '"tick"', S0, 0),          # stream time of partition 0: h0 = July 1
    ("grace", '"late"', H0 - 1, 0),      # rejected late
    ("grace", '"edge"', H0, 0),          # accepted
    ("ooo", '"late"', H0 - 1, 0),        # rejected late: ooo unchanged
]
KIP_LINES = [  # KIP-968's example, verbatim timestamps; key 1 is an integer (stored as "1")
    '{"key":1,"value":1,"timestamp":"2023-01-01T10:00:00.00Z","partition":1}',
    '{"key":1,"timestamp":"2023-01-05T10:00:00.00Z","partition":1}',
    '{"key":1,"value":null,"timestamp":"2023-01-10T10:00:00.00Z","partition":1}',
    '{"key":1,"value":2,"timestamp":"2023-01-15T10:00:00.00Z","partition":1}',
    '{"key":1,"value":3,"timestamp":"2023-01-20T10:00:00.00Z","partition":1}',
]
P1 = [("1", "1", KIP[1], 1), ("1", None, KIP[5], 1), ("1", None, KIP[10], 1),
      ("1", "2", KIP[15], 1), ("1", "3", KIP[20], 1)]
P2_RUN1 = [("snap", '"a"', T1, 2), ("snap", '"b"', T1 + 5 * DAY, 2)]
P2_RUN2 = [("snapclock", '"x"', T1 + 40 * DAY, 2)]


@pytest.fixture(scope="module")
def sem(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> IngestedStore:
    root = tmp_path_factory.mktemp("e2e-sem")
    store = IngestedStore(spark, str(root / "wh"), source_dir(str(root), STORE), STORE,
                          history_retention_ms=H, partitions=3)
    store.run(
        {"a.jsonl": records_from("a.jsonl", P0), "b.jsonl": records_from("b.jsonl", P1),
         "c.jsonl": records_from("c.jsonl", P2_RUN1)},
        lines={"b.jsonl": KIP_LINES},
    )
    store.run({"d.jsonl": records_from("d.jsonl", P2_RUN2)})
    return store


@pytest.fixture(scope="module")
def client(sem: IngestedStore) -> Iterator[httpx.Client]:
    with serve_engine(sem.warehouse) as (url, _engine), httpx.Client(base_url=url, timeout=30) as c:
        yield c


class Q:
    """Query helpers that also check every answer against the reference model."""

    def __init__(self, client: httpx.Client, store: IngestedStore) -> None:
        self.c = client
        self.s = store

    def get(self, key: str, as_of: int | str | None = None, snapshot: int | None = None) -> httpx.Response:
        params: dict[str, Any] = {}
        if as_of is not None:
            params["asOf"] = as_of
        if snapshot is not None:
            params["snapshot"] = snapshot
        r = self.c.get(key_path(STORE, key), params=params)
        body = r.json()
        snap = body["snapshot"]
        assert snap == (1 if snapshot is None else snapshot), body
        t = None if as_of is None else (as_of if isinstance(as_of, int) else ms(as_of))
        status, expect = model_key_json(self.s.models[snap], key, t)
        assert r.status_code == status, (key, as_of, r.text)
        if status == 200:
            assert {k: body[k] for k in ("value", "timestamp", "validTo")} == expect
        else:
            assert body["type"].endswith("/" + expect) and body["key"] == key
        return r

    def ok(self, key: str, as_of: int | str | None, value: Any, ts: int, valid_to: int | None,
           snapshot: int | None = None) -> None:
        r = self.get(key, as_of, snapshot)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.json() == {"key": key, "value": value, "timestamp": ts, "validTo": valid_to,
                            "snapshot": 1 if snapshot is None else snapshot}

    def none(self, key: str, as_of: int | str | None, kind: str, horizon: int,
             snapshot: int | None = None) -> None:
        body = problem(self.get(key, as_of, snapshot), 404, kind)
        assert body["key"] == key and body["horizon"] == horizon
        assert body["snapshot"] == (1 if snapshot is None else snapshot)

    def versions(self, key: str, frm: int | str | None = None, to: int | str | None = None,
                 order: str | None = None, snapshot: int | None = None) -> list[dict]:
        params: dict[str, Any] = {}
        for name, v in (("from", frm), ("to", to), ("order", order), ("snapshot", snapshot)):
            if v is not None:
                params[name] = v
        r = self.c.get(key_path(STORE, key, "/versions"), params=params)
        snap = 1 if snapshot is None else snapshot
        model = self.s.models[snap]

        def num(x: int | str | None) -> int | None:
            return x if x is None or isinstance(x, int) else ms(x)

        expired, truncated = model.range_edges(key, num(frm), num(to))
        if expired:  # rule 32: retention, not the key's history, empties this range
            gone = problem(r, 404, "expired")
            assert gone["key"] == key and gone["snapshot"] == snap and gone["horizon"] == model.horizon(key)
            assert model_versions_json(model, key, num(frm), num(to), order != "desc") == []
            return []
        assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
        body = r.json()
        assert set(body) == {"key", "records", "nextPageToken", "snapshot", "horizon", "truncated"}
        assert body["key"] == key and body["snapshot"] == snap and body["nextPageToken"] is None
        assert body["horizon"] == model.horizon(key) and body["truncated"] == truncated
        assert body["records"] == model_versions_json(model, key, num(frm), num(to), order != "desc")
        return body["records"]


@pytest.fixture(scope="module")
def q(client: httpx.Client, sem: IngestedStore) -> Q:
    return Q(client, sem)


def rec(value: Any, ts: int, valid_to: int | None) -> dict[str, Any]:
    return {"value": value, "timestamp": ts, "validTo": valid_to}


# ------------------------------------------------------------------------------- ingest side
def test_run_reports_and_store_info(sem: IngestedStore, client: httpx.Client) -> None:
    r1, r2 = sem.reports
    assert r1 is not None and r2 is not None and (r1.snapshot, r2.snapshot) == (0, 1)
    assert r1.read == len(P0) + len(P1) + len(P2_RUN1)
    assert r1.rejected["late"] == 3 and sum(r1.rejected.values()) == 3
    # tombstones: oldtomb, rep2, tomb, tomblast + the KIP's two
    assert r1.tombstones == 6
    assert r1.replaced_same_timestamp == 2
    assert r1.accepted_out_of_order == 1  # ooo a2
    for report, counts in zip(sem.reports, sem.model_counts, strict=True):
        assert report_counts(report) == model_counts(counts)
    info = client.get(f"/v1/stores/{STORE}").json()
    assert info["kind"] == "versioned" and info["partitions"] == 3
    assert info["historyRetentionMs"] == H and info["snapshot"] == 1
    assert info["partitionStreamTimes"] == [
        {"partition": 0, "streamTime": S0, "oldestQueryableTimestamp": H0},
        {"partition": 1, "streamTime": KIP[20], "oldestQueryableTimestamp": KIP[20] - H},
        {"partition": 2, "streamTime": T1 + 40 * DAY, "oldestQueryableTimestamp": T1 + 10 * DAY},
    ]
    at0 = client.get(f"/v1/stores/{STORE}", params={"snapshot": 0}).json()
    assert at0["snapshot"] == 0
    assert at0["partitionStreamTimes"][2] == {
        "partition": 2, "streamTime": T1 + 5 * DAY, "oldestQueryableTimestamp": T1 - 25 * DAY}


# ------------------------------------------------------------------------------- rules 6-7
@pytest.mark.rule(6)
def test_latest_rule_6(q: Q) -> None:
    q.ok("ooo", None, "a3", july(4), None)            # the late "ooo" record changed nothing
    q.ok("rep", None, "y", july(2), None)
    q.none("rep2", None, "not-found", H0)              # tombstone replaced the value
    q.ok("tomb", None, "back", july(6), None)
    q.none("tomblast", None, "not-found", H0)          # latest is a tombstone
    q.none("never-written", None, "not-found", q.s.model.horizon("never-written"))
    q.ok("empty", None, "", july(2), None)             # an empty string is a value
    q.ok("solo", None, "solo", june(5), None)          # the latest never expires
    q.ok("grace", None, "edge", H0, None)
    q.ok("atbound", None, "ok", june(5), None)
    q.none("under", None, "not-found", q.s.model.horizon("under"))
    # verbatim value text: number text kept (1.50, 1e3, -0.0, 10.000)
    r = q.get("num")
    assert r.content == (b'{"key":"num","value":{"p":1.50,"q":[1e3,-0.0,10.000],"s":"x"},'
                         b'"timestamp":%d,"validTo":null,"snapshot":1}' % july(2))


@pytest.mark.rule(7)
def test_as_of_rule_7(q: Q) -> None:
    q.ok("ooo", july(3), "a2", july(3), july(4))        # the out-of-order version, validTo next
    q.ok("ooo", july(3) - 1, "a1", july(2), july(3))
    q.ok("ooo", july(2), "a1", july(2), july(3))        # inclusive
    q.none("ooo", july(2) - 1, "not-found", H0)         # t >= h, nothing <= t: not found
    q.ok("ooo", july(4), "a3", july(4), None)           # newest: validTo null
    q.ok("ooo", 10**15, "a3", july(4), None)
    q.ok("tomb", july(3), "alive", july(2), july(4))    # validTo is the tombstone's timestamp
    q.none("tomb", july(4), "not-found", H0)             # as of the tombstone
    q.none("tomb", july(6) - 1, "not-found", H0)
    q.ok("tomb", july(6), "back", july(6), None)
    q.none("rep2", july(2), "not-found", H0)
    q.ok("tomblast", july(2), "v", july(2), july(3))
    q.ok("empty", july(9), "", july(2), None)
    q.ok("rng", july(17), 15, july(15), july(20))


def test_as_of_iso_timestamps(q: Q) -> None:
    q.ok("ooo", "2023-07-03T00:00:00Z", "a2", july(3), july(4))
    q.ok("ooo", "2023-07-02T23:59:59.999Z", "a1", july(2), july(3))
    q.ok("ooo", "2023-07-03T02:00:00+02:00", "a2", july(3), july(4))   # == July 3 00:00Z
    q.ok("ooo", "2023-07-03T01:59:59.999+02:00", "a1", july(2), july(3))
    q.ok("ooo", "2023-07-02T23:59:59.9999999Z", "a1", july(2), july(3))  # sub-ms truncated
    q.ok("ooo", "2023-07-02T19:00:00-05:00", "a2", july(3), july(4))
    # a '+' offset sent raw arrives form-decoded as a space and is read as '+'
    r = q.c.get(key_path(STORE, "ooo") + "?asOf=2023-07-03T02:00:00+02:00")
    assert r.status_code == 200 and r.json()["timestamp"] == july(3)
    for bad in ("2023-07-03", "2023-07-03T00:00:00", "July 3", "2023-07-03T00:00:00.Z"):
        body = problem(q.c.get(key_path(STORE, "ooo"), params={"asOf": bad}), 400, "bad-request")
        assert bad in body["detail"]


# ------------------------------------------------------------------------------- rule 8 + edges
@pytest.mark.rule(8, 22)
def test_expired_as_of_rule_8_and_retention_edges(q: Q) -> None:
    # t < h and the newest version is newer than t: expired (even with no version <= t)
    q.none("exp", june(20), "expired", H0)
    q.none("exp", june(12), "expired", H0)
    q.none("exp", june(1), "expired", H0)
    q.none("exp", H0 - 1, "expired", H0)
    q.none("ooo", H0 - 1, "expired", H0)
    # t == h: rule 7 applies again, history valid at h is still answered
    q.ok("exp", H0, "mid", june(15), july(5))
    q.ok("exp", iso(H0), "mid", june(15), july(5))
    q.ok("edge", H0, "b", H0, july(3))
    # beyond the horizon the latest still answers when its timestamp <= t
    q.ok("solo", june(6), "solo", june(5), None)
    q.ok("solo", june(5), "solo", june(5), None)
    q.none("solo", june(5) - 1, "expired", H0)
    # newest is a tombstone <= t: not-found, not expired; newer than t: expired
    q.none("oldtomb", june(9), "not-found", H0)
    q.none("oldtomb", june(8), "not-found", H0)
    q.none("oldtomb", june(6), "expired", H0)
    # a key with no versions is not-found at any time
    h_none = q.s.model.horizon("nobody")
    q.none("nobody", 0, "not-found", h_none)
    q.none("nobody", june(1), "not-found", h_none)


# ------------------------------------------------------------------------------- rules 9-11
@pytest.mark.rule(9, 11)
def test_versions_rule_9(q: Q) -> None:
    all_rng = [rec(10, july(10), july(15)), rec(15, july(15), july(20)),
               rec(20, july(20), july(25)), rec(25, july(25), None)]
    assert q.versions("rng") == all_rng
    assert q.versions("rng", order="asc") == all_rng
    assert q.versions("rng", order="desc") == all_rng[::-1]                       # rule 11
    assert q.versions("rng", july(15), july(20)) == all_rng[1:3]                  # both ends inclusive
    assert q.versions("rng", july(15) + 1, july(20) - 1) == all_rng[1:2]
    assert q.versions("rng", july(17), july(17)) == all_rng[1:2]                  # from == to
    assert q.versions("rng", july(15), july(15)) == all_rng[1:2]                  # validTo == from excluded
    assert q.versions("rng", july(15) - 1, july(15)) == all_rng[0:2]
    assert q.versions("rng", july(20)) == all_rng[2:]                             # only from
    assert q.versions("rng", None, july(12)) == all_rng[:1]                       # only to
    assert q.versions("rng", None, july(10) - 1) == []
    assert q.versions("rng", july(30), None) == all_rng[3:]                       # still valid
    assert q.versions("rng", "2023-07-15T00:00:00Z", "2023-07-20T02:00:00+02:00", "desc") == all_rng[1:3][::-1]
    # tombstones only end validity and are never returned (rule 11)
    assert q.versions("tomb") == [rec("alive", july(2), july(4)), rec("back", july(6), None)]
    assert q.versions("tomb", july(4), july(5)) == []
    assert q.versions("tomb", july(4) - 1, july(5)) == [rec("alive", july(2), july(4))]
    assert q.versions("tomblast") == [rec("v", july(2), july(3))]
    assert q.versions("rep2") == []
    assert q.versions("rep") == [rec("y", july(2), None)]
    assert q.versions("ooo") == [rec("a1", july(2), july(3)), rec("a2", july(3), july(4)),
                                 rec("a3", july(4), None)]
    assert q.versions("empty") == [rec("", july(2), None)]
    assert q.versions("nobody") == []
    r = q.c.get(key_path(STORE, "num", "/versions"))
    assert b'"records":[{"value":{"p":1.50,"q":[1e3,-0.0,10.000],"s":"x"},' in r.content


@pytest.mark.rule(10, 22)
def test_versions_rule_10_and_retention_edges(q: Q) -> None:
    # history that ended at or before h is hidden from every range
    assert q.versions("exp") == [rec("mid", june(15), july(5)), rec("new", july(5), None)]
    assert q.versions("exp", june(1), june(12)) == []            # "old" ended June 15 <= h
    assert q.versions("edge") == [rec("b", H0, july(3)), rec("c", july(3), None)]  # a ended at h
    assert q.versions("oldtomb") == []
    assert q.versions("oldtomb", None, june(6)) == []
    # to < h: only the latest may qualify (rule 10)
    assert q.versions("exp", None, H0 - 1) == []
    assert q.versions("exp", june(15), june(16)) == []
    assert q.versions("solo", None, june(10)) == [rec("solo", june(5), None)]
    assert q.versions("solo", june(1), june(5)) == [rec("solo", june(5), None)]
    assert q.versions("solo", None, june(5) - 1) == []
    assert q.versions("ooo", None, H0 - 1) == []
    # to == h: rule 9 restricted to history still valid after h
    assert q.versions("exp", None, H0) == [rec("mid", june(15), july(5))]
    assert q.versions("exp", iso(june(1)), iso(H0), "desc") == [rec("mid", june(15), july(5))]
    assert q.versions("edge", None, H0) == [rec("b", H0, july(3))]


def test_versions_errors(q: Q) -> None:
    path = key_path(STORE, "rng", "/versions")
    body = problem(q.c.get(path, params={"from": july(20), "to": july(19)}), 400, "bad-request")
    assert "after" in body["detail"]
    problem(q.c.get(path, params={"from": "2023-07-20T00:00:00Z", "to": "2023-07-19T23:59:59.999Z"}),
            400, "bad-request")
    problem(q.c.get(path, params={"to": "tomorrow"}), 400, "bad-request")
    problem(q.c.get(path, params={"order": "DESC"}), 400, "bad-request")
    problem(q.c.get(path, params={"pageSize": 0}), 400, "bad-request")
    problem(q.c.get(path, params={"asOf": 1}), 400, "bad-request")
    problem(q.c.get(key_path(STORE, "rng"), params={"from": 1}), 400, "bad-request")
    problem(q.c.get(key_path("nope", "rng", "/versions")), 404, "store-not-found")
    problem(q.c.get(path, params={"snapshot": 2}), 404, "snapshot-not-found")


# ------------------------------------------------------------------------------- KIP-968
def test_kip_968_worked_example(q: Q) -> None:
    v1 = rec(1, KIP[1], KIP[5])
    v2 = rec(2, KIP[15], KIP[20])
    v3 = rec(3, KIP[20], None)
    # example 1: no bounds = all versions (the tombstones only end validity)
    assert q.versions("1") == [v1, v2, v3]
    # example 2: fromTime 2023-01-17T10:00Z, toTime 2023-01-25T10:00Z
    assert q.versions("1", "2023-01-17T10:00:00.00Z", "2023-01-25T10:00:00.00Z") == [v2, v3]
    assert q.versions("1", ms("2023-01-17T10:00:00Z"), ms("2023-01-25T10:00:00Z")) == [v2, v3]
    assert q.versions("1", "2023-01-17T10:00:00Z", "2023-01-25T10:00:00Z", "desc") == [v3, v2]
    assert q.versions("1", order="desc") == [v3, v2, v1]
    # toTime only = [0, t1]; fromTime only = [t1, MAX)
    assert q.versions("1", None, "2023-01-04T00:00:00Z") == [v1]
    assert q.versions("1", "2023-01-05T10:00:00Z") == [v2, v3]       # v1's validTo == from
    assert q.versions("1", "2023-01-05T09:59:59.999Z") == [v1, v2, v3]
    assert q.versions("1", "2023-01-05T10:00:00Z", "2023-01-14T00:00:00Z") == []
    assert q.versions("1", "2023-01-20T10:00:00Z", "2023-01-20T10:00:00Z") == [v3]
    # VersionedKeyQuery over the same history
    q.ok("1", None, 3, KIP[20], None)
    q.ok("1", "2023-01-04T00:00:00Z", 1, KIP[1], KIP[5])
    q.none("1", "2023-01-05T10:00:00Z", "not-found", KIP[20] - H)
    q.none("1", "2023-01-12T00:00:00Z", "not-found", KIP[20] - H)
    q.ok("1", "2023-01-15T10:00:00Z", 2, KIP[15], KIP[20])
    q.ok("1", "2023-01-20T09:59:59.999Z", 2, KIP[15], KIP[20])
    q.none("1", "2023-01-01T09:59:59.999Z", "not-found", KIP[20] - H)
    q.none("1", "2022-12-01T00:00:00Z", "expired", KIP[20] - H)      # before h = 2022-12-21T10:00Z


# ------------------------------------------------------------------------------- snapshots
@pytest.mark.rule(22)
def test_snapshot_judges_expiry_as_the_store_did(q: Q) -> None:
    h_old, h_new = T1 - 25 * DAY, T1 + 10 * DAY
    q.ok("snap", T1 + DAY, "a", T1, T1 + 5 * DAY, snapshot=0)
    q.none("snap", T1 + DAY, "expired", h_new)
    q.ok("snap", None, "b", T1 + 5 * DAY, None)
    q.ok("snap", None, "b", T1 + 5 * DAY, None, snapshot=0)
    assert q.versions("snap", snapshot=0) == [rec("a", T1, T1 + 5 * DAY), rec("b", T1 + 5 * DAY, None)]
    assert q.versions("snap") == [rec("b", T1 + 5 * DAY, None)]
    # a page token pinned to snapshot 0 keeps snapshot 0's horizon on every page
    path = key_path(STORE, "snap", "/versions")
    records, bodies = collect_pages(q.c, path, {"snapshot": 0, "pageSize": 1})
    assert records == [rec("a", T1, T1 + 5 * DAY), rec("b", T1 + 5 * DAY, None)]
    assert [b["snapshot"] for b in bodies] == [0, 0] and {b["horizon"] for b in bodies} == {h_old}
    # partition 0 was not touched by run 2: same answers at both snapshots
    q.ok("exp", H0, "mid", june(15), july(5), snapshot=0)
    q.none("exp", H0 - 1, "expired", H0, snapshot=0)


def test_every_key_and_instant_agrees_with_the_model(q: Q) -> None:
    """Sweep: every key, every version timestamp of its partition +-1 ms, both snapshots."""
    records = P0 + P1 + P2_RUN1 + P2_RUN2
    keys = sorted({(k, p) for k, _v, _t, p in records} | {("nobody", None)}, key=str)
    for key, part in keys:
        stamps = {t for _k, _v, t, p in records if p == part or part is None}
        instants = sorted({0, H0, KIP[20] - H} | {t + d for t in stamps for d in (-1, 0, 1)})
        for snapshot in ((0, 1) if part in (2, None) else (1,)):
            q.get(key, snapshot=snapshot)
            for t in instants:
                q.get(key, t, snapshot)
            q.versions(key, snapshot=snapshot)
            q.versions(key, order="desc", snapshot=snapshot)
            for lo, hi in ((min(stamps), max(stamps)), (H0, H0), (None, H0 - 1)):
                q.versions(key, lo, hi, snapshot=snapshot)
