"""Property test end to end: random changelogs through the real ingest, random queries over HTTP,
answers compared exactly with the reference model (tests/support/reference.py).

Spark runs are the cost, so each example holds N independent changelogs in ONE store: changelog
i lives in stream-time partition i (``partitions=N``, every record says ``"partition": i``, keys
prefixed ``e{i}-``). Partitions are independent stream-time domains, so this is N separate
stores. Each changelog is cut at random points into up to 3 runs; run r ingests chunk r of every
changelog (files ``r{r}/e{i:03d}.jsonl``), the model gets the same records run by run.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests.support.e2e import (
    IngestedStore,
    collect_pages,
    iso,
    key_path,
    model_counts,
    model_key_json,
    model_versions_json,
    problem,
    report_counts,
    serve_engine,
)
from tests.support.reference import InRecord

N = 10          # changelogs (= partitions) per example
MAX_TS = 60
KEYS = ("a", "b", "c")
VALUES = (None, None, '""', "1", '"x"', '{"a":1.50}', "[1,2]", "0.0", "null")

_record = st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES), st.integers(0, MAX_TS))


@st.composite
def changelog(draw: Any, runs: int) -> tuple[list[tuple[str, str | None, int]], list[int], list[int] | None]:
    """(records, cut points into ``runs`` chunks, offsets or None)."""
    recs = draw(st.lists(_record, min_size=1, max_size=14))
    # bursts of late / out-of-order records after a jump of stream time
    if draw(st.booleans()):
        k, v, t = draw(_record)
        recs.insert(draw(st.integers(0, len(recs))), (k, v, MAX_TS + draw(st.integers(0, 30))))
    cuts = sorted(draw(st.lists(st.integers(0, len(recs)), min_size=runs - 1, max_size=runs - 1)))
    offsets = None
    if draw(st.integers(0, 3)) == 0:  # offsets define processing order (duplicates possible)
        offsets = draw(st.lists(st.integers(0, 25), min_size=len(recs), max_size=len(recs)))
    return [(k, None if v == "null" else v, t) for k, v, t in recs], cuts, offsets


def chunks(items: list[Any], cuts: list[int]) -> list[list[Any]]:
    bounds = [0, *cuts, len(items)]
    return [items[a:b] for a, b in itertools.pairwise(bounds)]


def ts_param(draw: Any, t: int) -> int | str:
    return iso(t) if draw(st.booleans()) else t


def check_key(client: httpx.Client, store: IngestedStore, snapshot: int, key: str, draw: Any) -> None:
    model = store.model
    path = key_path(store.name, key)
    r = client.get(path)
    status, expect = model_key_json(model, key, None)
    check_answer(r, status, expect, key, snapshot)
    for t in draw(st.lists(st.integers(0, MAX_TS + 35), min_size=2, max_size=4)):
        r = client.get(path, params={"asOf": ts_param(draw, t)})
        status, expect = model_key_json(model, key, t)
        check_answer(r, status, expect, key, snapshot, t)
    for _ in range(2):
        lo = draw(st.none() | st.integers(0, MAX_TS + 35))
        hi = draw(st.none() | st.integers(0, MAX_TS + 35))
        if lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo
        asc = draw(st.booleans())
        params: dict[str, Any] = {"pageSize": draw(st.integers(1, 3))}
        if lo is not None:
            params["from"] = ts_param(draw, lo)
        if hi is not None:
            params["to"] = ts_param(draw, hi)
        if not asc or draw(st.booleans()):
            params["order"] = "asc" if asc else "desc"
        deleted = draw(st.booleans())
        if deleted:
            params["includeDeleted"] = "true"
        expired, truncated = model.range_edges(key, lo, hi)
        if expired:  # rule 32: a range wholly past retention is expired, not an empty page
            body = problem(client.get(path + "/versions", params=params), 404, "expired")
            assert body["key"] == key and body["snapshot"] == snapshot and body["horizon"] == model.horizon(key)
            continue
        records, bodies = collect_pages(client, path + "/versions", params)
        assert records == model_versions_json(model, key, lo, hi, asc, deleted), (key, params)
        assert {b["snapshot"] for b in bodies} == {snapshot}
        assert bodies[0]["horizon"] == model.horizon(key) and bodies[0]["key"] == key
        assert {b["truncated"] for b in bodies} == {truncated}, (key, params)


def check_answer(r: httpx.Response, status: int, expect: Any, key: str, snapshot: int,
                 t: int | None = None) -> None:
    if status == 200:
        assert r.status_code == 200, (key, t, r.text)
        assert r.json() == {"key": key, **expect, "snapshot": snapshot}, (key, t)
    else:
        body = problem(r, 404, expect)
        assert body["key"] == key and body["snapshot"] == snapshot, (key, t, body)


def test_random_changelogs_agree_with_the_model(spark: Any, tmp_path: Any) -> None:
    seen: dict[str, int] = {}
    examples = itertools.count()

    # no shrinking: every step costs Spark runs; the failing draws are printed as they are
    @settings(max_examples=4, phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(data=st.data())
    def run(data: Any) -> None:
        draw = data.draw
        runs = draw(st.integers(1, 3), label="runs")
        retention = draw(st.sampled_from([0, 5, 20, 1000]), label="history_retention_ms")
        logs = [draw(changelog(runs), label=f"changelog {i}") for i in range(N)]
        root = tmp_path / f"ex{next(examples)}"
        store = IngestedStore(spark, str(root / "wh"), str(root / "src"), "prop",
                              history_retention_ms=retention, partitions=N)
        for r in range(runs):
            files: dict[str, list[InRecord]] = {}
            for i, (recs, cuts, offsets) in enumerate(logs):
                start = ([0, *cuts])[r]
                part = chunks(recs, cuts)[r]
                if not part:
                    continue
                name = f"r{r}/e{i:03d}.jsonl"
                files[name] = [
                    InRecord(name, n, f"e{i}-{k}", v, t, i,
                             None if offsets is None else 30 * r + offsets[start + n - 1])
                    for n, (k, v, t) in enumerate(part, start=1)
                ]
            store.run(files)
        # per-run counts equal the model's (a run with no files may be left out of the report)
        for report, counts in zip(store.reports, store.model_counts, strict=True):
            assert report_counts(report) == model_counts(counts)
        for counts in store.model_counts:
            for name in ("accepted_out_of_order", "replaced_same_timestamp", "tombstones"):
                seen[name] = seen.get(name, 0) + getattr(counts, name)
            for reason, n in counts.rejected.items():
                seen[reason] = seen.get(reason, 0) + n
        snapshot = max(store.models) if store.models else None
        if snapshot is None:
            return
        with serve_engine(store.warehouse) as (url, _engine), httpx.Client(base_url=url, timeout=30) as c:
            info = c.get("/v1/stores/prop").json()
            assert info["snapshot"] == snapshot and info["partitions"] == N
            assert {p["partition"]: p["streamTime"] for p in info["partitionStreamTimes"]
                    if p["streamTime"] is not None} == store.model.stream_time
            for i in range(N):
                for k in (*KEYS, "zz"):
                    check_key(c, store, snapshot, f"e{i}-{k}", draw)

    run()
    # the generator really produced the interesting cases
    for name in ("accepted_out_of_order", "replaced_same_timestamp", "tombstones", "late",
                 "duplicate_offset"):
        assert seen.get(name, 0) > 0, (name, json.dumps(seen))
