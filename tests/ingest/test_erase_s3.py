"""``versiq erase`` and ``versiq drop`` on an ``s3://`` warehouse (the real S3 server of the
``s3_server`` fixture, the session's SparkSession pointed at it): an erase leaves no byte of the
key under the store's prefix and the engine answers the other keys as before; a drop leaves no
object under the prefix and the engine stops listing the store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.ingest.test_erase import KEY, build, checkpoint_every, leaks
from tests.support.ingest import store_versions
from versiq import layout, storage
from versiq.ingest.erase import erase_keys, last_checkpoint_holds
from versiq.ingest.lifecycle import drop
from versiq.ingest.spark import FETCH_HINT_S3, configure_s3, s3_jars_present
from versiq.query.api import VersionedKeyQuery
from versiq.query.engine import Engine

BUCKET = "versiq-erase"


@pytest.fixture(scope="module")
def s3(spark: Any, s3_server: Any) -> Iterator[Any]:
    """The AWS variables of the test server in this process (the engine, delta-rs and DuckDB
    read them) and in the session's SparkSession; the bucket created."""
    if not s3_jars_present():
        pytest.fail(f"the S3 jars are missing: {FETCH_HINT_S3}", pytrace=False)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3_server.env().items():
            mp.setenv(name, value)
        assert configure_s3(spark, s3_server.env())
        s3_server.create_bucket(BUCKET)
        yield s3_server


def test_erase_then_drop_on_an_s3_warehouse(spark: Any, s3: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """A checkpoint every 2 commits, so that the erase rewrites one and has Delta write a new
    one (``erase.write_checkpoint``) through S3A."""
    checkpoint_every(monkeypatch, 2)
    wh = f"s3://{BUCKET}/wh-{uuid.uuid4().hex[:8]}"
    build(spark, tmp_path, wh)
    people, adults = layout.table_path(wh, "people"), layout.table_path(wh, "adults")
    assert people.startswith("s3://") and leaks(people) and leaks(adults)
    others = {k: v for k, v in store_versions(people).items() if k != KEY}

    result = erase_keys(wh, "people", [KEY], spark=lambda: spark)
    assert result.rows["people"] >= 1 and result.rows["people/_rejected"] == 1 and result.rows["adults"] >= 1
    assert leaks(people) == [] and leaks(adults) == []
    assert store_versions(people) == others
    assert last_checkpoint_holds(people) and last_checkpoint_holds(adults)
    assert storage.exists(storage.join(people, "_delta_log", "_last_checkpoint"))
    with Engine(wh, refresh_interval_s=3600) as engine:
        engine.refresh()
        assert engine.get("people", VersionedKeyQuery(KEY)).outcome == "not-found"
        assert engine.get("people", VersionedKeyQuery("bob")).record is not None
        assert {s.name for s in engine.list_stores()} >= {"people", "adults"}

        assert drop(wh, "people", cascade=True).dropped == ["adults", "by_city", "people"]
        for name in ("people", "adults", "by_city"):
            assert storage.all_files(layout.table_path(wh, name)) == [], name
        engine.refresh()
        assert {s.name for s in engine.list_stores()} == set()
