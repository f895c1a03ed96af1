"""Rejected records over HTTP against a real server: a listing's answer stays small however long
the raw texts are (each cut to its first characters, with its whole length and a flag), and one
record's route answers its whole text; ids survive the reason filter and later snapshots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.support.service import T0, live_server
from tests.support.storebuilder import StoreBuilder
from versiq import layout
from versiq.query.rejected import RAW_PREVIEW_CHARS
from versiq.service.settings import Settings

PROBLEMS = "https://versiq.dev/problems/"
#: A raw text of 1 MB of characters, multi-byte ones included (the cut counts characters).
LONG = '{"key": "k", "value": "' + "é🎉x" * 350_000
_PLACE = {"row": None, "partition": None, "offset": None}


def _row(line: int, raw: str | None, reason: str = "malformed", run: int = 1) -> dict[str, Any]:
    return {"run": run, "source": "in.jsonl", "line": line, **_PLACE, "reason": reason, "raw": raw,
            "detail": "not valid JSON", "ingested_at": "2023-11-15T08:00:00.000Z"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[StoreBuilder, httpx.Client]]:
    builder = StoreBuilder(str(tmp_path), "s")
    builder.apply([("k", "1", T0)])
    rows = [_row(i, LONG + str(i)) for i in range(12)] + [_row(20, "short", "late"), _row(21, None, "late")]
    write_deltalake(str(tmp_path / "s" / layout.REJECTED_DIR),
                    pa.Table.from_pylist(rows, schema=layout.REJECTED_SCHEMA), mode="append")
    with live_server(Settings(warehouse=str(tmp_path))) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield builder, client


def test_a_listing_cuts_long_raw_texts_and_one_record_has_it_whole(served: tuple[StoreBuilder, httpx.Client]) -> None:
    _builder, client = served
    r = client.get("/v1/stores/s/rejected", params={"pageSize": 100})
    assert r.status_code == 200, r.text
    assert len(r.content) < 14 * RAW_PREVIEW_CHARS * 4 + 10_000, f"a listing of 14 records is {len(r.content)} bytes"
    records = r.json()["records"]
    assert [rec["id"] for rec in records] == list(range(14))
    for i, rec in enumerate(records[:12]):
        whole = LONG + str(i)
        assert rec["raw"] == whole[:RAW_PREVIEW_CHARS] and rec["rawTruncated"] is True
        assert rec["rawLength"] == len(whole)
    assert (records[12]["raw"], records[12]["rawLength"], records[12]["rawTruncated"]) == ("short", 5, False)
    assert (records[13]["raw"], records[13]["rawLength"], records[13]["rawTruncated"]) == (None, None, False)

    one = client.get("/v1/stores/s/rejected/3")
    assert one.status_code == 200, one.text
    body = one.json()
    assert body["store"] == "s" and body["snapshot"] == r.json()["snapshot"]
    record = body["record"]
    assert record["raw"] == LONG + "3" and record["rawLength"] == len(LONG + "3") and record["rawTruncated"] is False
    assert {k: v for k, v in record.items() if k != "raw"} == {
        k: v for k, v in records[3].items() if k not in ("raw", "rawTruncated")} | {"rawTruncated": False}


def test_ids_survive_the_reason_filter_and_later_snapshots(served: tuple[StoreBuilder, httpx.Client]) -> None:
    builder, client = served
    late = client.get("/v1/stores/s/rejected", params={"reason": "late"}).json()["records"]
    assert [rec["id"] for rec in late] == [12, 13]
    first = builder.version
    write_deltalake(str(Path(builder.path, layout.REJECTED_DIR)),
                    pa.Table.from_pylist([_row(1, "later", run=2)], schema=layout.REJECTED_SCHEMA), mode="append")
    builder.apply([("k", "2", T0 + 1)])
    r = client.get("/v1/stores/s/rejected/12", params={"minSnapshot": builder.version})
    assert r.status_code == 200 and r.json()["record"]["raw"] == "short", r.text
    assert client.get("/v1/stores/s/rejected/14").json()["record"]["raw"] == "later"
    missing = client.get("/v1/stores/s/rejected/14", params={"snapshot": first})
    assert missing.status_code == 404 and missing.json()["type"] == PROBLEMS + "record-not-found", missing.text
    for bad in ("-1", "x", "1.5", "99999999999999999999"):
        r = client.get(f"/v1/stores/s/rejected/{bad}")
        assert r.status_code == 400 and r.json()["type"] == PROBLEMS + "bad-request", (bad, r.text)
