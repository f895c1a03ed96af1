"""The client generated from openapi.yaml (see tests/service/test_service_client.py) against a live server over
a store written by the real Spark ingest, paging to the end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.service.test_service_client import s_generated, s_generated_dir  # noqa: F401 - the generated-client fixtures
from tests.support.e2e import IngestedStore, iso, model_versions_json, serve_engine, source_dir
from tests.support.ingest import records_from

T0 = 1_700_000_000_000
N = 130
H = 100_000
ODD = "a/b ü?%2F"


@pytest.fixture(scope="module")
def cl_store(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> IngestedStore:
    root = tmp_path_factory.mktemp("e2e-client")
    store = IngestedStore(spark, str(root / "wh"), source_dir(str(root), "cl"), "cl",
                          history_retention_ms=H)
    specs = [("k", f'{{"i":{i},"p":1.50}}', T0 + i * 1000) for i in range(N)]
    specs += [(ODD, '"odd"', T0), (ODD, None, T0 + 5000), (ODD, '""', T0 + 60_000)]
    store.run({"a.jsonl": records_from("a.jsonl", specs)})
    return store


@pytest.fixture(scope="module")
def url(cl_store: IngestedStore) -> Iterator[str]:
    with serve_engine(cl_store.warehouse) as (base, _engine):
        yield base


def test_generated_client_over_ingested_store(s_generated: Any, cl_store: IngestedStore,  # noqa: F811
                                              url: str) -> None:
    from versiq_client import Client
    from versiq_client.api.queries import get_key, list_versions
    from versiq_client.api.stores import get_store
    from versiq_client.models import KeyValue, Problem, StoreInfo, VersionsPage
    from versiq_client.models.list_versions_order import ListVersionsOrder

    client = Client(base_url=url)
    model = cl_store.model
    horizon = T0 + (N - 1) * 1000 - H
    info = get_store.sync("cl", client=client)
    assert isinstance(info, StoreInfo) and info.snapshot == 0 and info.history_retention_ms == H
    assert info.oldest_queryable_timestamp == horizon

    for order in (ListVersionsOrder.ASC, ListVersionsOrder.DESC):
        got: list[dict[str, Any]] = []
        token: Any = None
        pages = 0
        while True:
            kwargs: dict[str, Any] = {"client": client, "order": order, "page_size": 17}
            if token:
                kwargs["page_token"] = token
            page = list_versions.sync("cl", "k", **kwargs)
            assert isinstance(page, VersionsPage), page
            assert page.snapshot == 0
            pages += 1
            got += [{"value": r.value.to_dict() if hasattr(r.value, "to_dict") else r.value,
                     "timestamp": r.timestamp, "validTo": r.valid_to} for r in page.records]
            token = page.next_page_token
            if not isinstance(token, str):  # None (or UNSET) on the last page
                break
        expected = model_versions_json(model, "k", None, None, order == ListVersionsOrder.ASC)
        assert got == expected
        assert len(expected) == N - 29 and pages == -(-len(expected) // 17)

    bounded = list_versions.sync("cl", "k", client=client, from_=iso(T0 + 50_500), to=T0 + 52_000)
    assert isinstance(bounded, VersionsPage)
    assert [r.timestamp for r in bounded.records] == [T0 + 50_000, T0 + 51_000, T0 + 52_000]

    latest = get_key.sync("cl", "k", client=client)
    assert isinstance(latest, KeyValue) and latest.timestamp == T0 + (N - 1) * 1000
    old = get_key.sync("cl", "k", client=client, as_of=iso(T0 + 40_999))
    assert isinstance(old, KeyValue) and (old.timestamp, old.valid_to) == (T0 + 40_000, T0 + 41_000)
    expired = get_key.sync("cl", "k", client=client, as_of=horizon - 1)
    assert isinstance(expired, Problem) and expired.type_.endswith("/expired")
    odd = get_key.sync("cl", ODD, client=client)
    assert isinstance(odd, KeyValue) and odd.key == ODD and odd.value == ""
    gone = get_key.sync("cl", ODD, client=client, as_of=T0 + 5000)
    assert isinstance(gone, Problem) and gone.type_.endswith("/expired")
    odd_versions = list_versions.sync("cl", ODD, client=client)
    assert isinstance(odd_versions, VersionsPage)
    assert [(r.value, r.timestamp, r.valid_to) for r in odd_versions.records] == [("", T0 + 60_000, None)]


def test_generated_client_lists_keys_and_batches(s_generated: Any, cl_store: IngestedStore,  # noqa: F811
                                                 url: str) -> None:
    """Issue 16 items 1-2 through the generated client over a store written by the real Spark
    ingest: the key listing pages to the end, and a batch answers like the single-key reads."""
    from versiq_client import Client
    from versiq_client.api.queries import batch_get_keys, get_key, list_keys
    from versiq_client.models import BatchGetRequest, BatchGetResponse, KeysPage, KeyValue

    client = Client(base_url=url)
    got: list[str] = []
    token: Any = None
    while True:
        kwargs: dict[str, Any] = {"client": client, "page_size": 1, "include_deleted": True}
        if token:
            kwargs["page_token"] = token
        page = list_keys.sync("cl", **kwargs)
        assert isinstance(page, KeysPage), page
        got += [r.key for r in page.records]
        token = page.next_page_token
        if not isinstance(token, str):
            break
    assert got == [ODD, "k"]  # UTF-8 byte order: "a/b ..." < "k"
    # ODD's tombstone at T0+5000 is older than the horizon (T0+29000): as of then, ODD is
    # expired and left out, deleted or not; its latest value is listed under its prefix
    expired = list_keys.sync("cl", client=client, as_of=T0 + 5000, include_deleted=True)
    assert isinstance(expired, KeysPage) and expired.records == []
    prefixed = list_keys.sync("cl", client=client, prefix="a/")
    assert isinstance(prefixed, KeysPage)
    assert [(r.key, r.value, r.timestamp) for r in prefixed.records] == [(ODD, "", T0 + 60_000)]
    batch = batch_get_keys.sync("cl", client=client, body=BatchGetRequest(keys=["k", ODD, "nope"]))
    assert isinstance(batch, BatchGetResponse) and batch.snapshot == 0
    assert [r.key for r in batch.results] == ["k", ODD, "nope"]
    single = get_key.sync("cl", "k", client=client)
    assert isinstance(single, KeyValue)
    assert batch.results[0].record.timestamp == single.timestamp  # type: ignore[union-attr]
    assert batch.results[2].problem.type_.endswith("/not-found")  # type: ignore[union-attr]
