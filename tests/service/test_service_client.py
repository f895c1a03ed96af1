"""A Python client generated from openapi.yaml (openapi-python-client) against a live server."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.service import (
    CLICK_RUNS,
    EXPENSIVE_INPUTS,
    EXPENSIVE_SOURCES,
    HIST_VERSIONS,
    HOUR,
    ODD_KEYS,
    PRICED_INPUTS,
    PRICED_SOURCES,
    T0,
    Warehouse,
    build_warehouse,
    live_server,
)
from versiq.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]  # the repository
VENV_BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "tests" / "support" / "client_example.py"


@pytest.fixture(scope="module")
def s_generated_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the generated package ``versiq_client`` and docs/http-api.md's example
    (tests/support/client_example.py) beside it."""
    out = tmp_path_factory.mktemp("gen")
    generator = shutil.which("openapi-python-client", path=str(VENV_BIN)) or "openapi-python-client"
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [generator, "generate", "--path", str(ROOT / "openapi.yaml"), "--meta", "none",
         "--config", str(ROOT / "openapi-python-client.yaml"),
         "--output-path", str(out / "versiq_client")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Warning" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    shutil.copyfile(EXAMPLE, out / EXAMPLE.name)
    return out


@pytest.fixture(scope="module")
def s_generated(s_generated_dir: Path) -> Iterator[Any]:
    sys.path.insert(0, str(s_generated_dir))
    try:
        yield importlib.import_module("versiq_client")
    finally:
        sys.path.remove(str(s_generated_dir))
        for name in [m for m in sys.modules
                     if m in ("versiq_client", EXAMPLE.stem) or m.startswith("versiq_client.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def s_wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build_warehouse(str(tmp_path_factory.mktemp("wh")))


def test_generated_client_every_endpoint(s_generated: Any, s_wh: Warehouse) -> None:
    from versiq_client import AuthenticatedClient, Client
    from versiq_client.api.operations import healthz, metrics, openapi, readyz
    from versiq_client.api.queries import get_key, list_versions
    from versiq_client.api.stores import get_store, list_stores
    from versiq_client.models import KeyValue, Problem, StoreInfo, StoreList, VersionsPage
    from versiq_client.models.list_versions_order import ListVersionsOrder

    settings = Settings.from_env({"VERSIQ_WAREHOUSE": s_wh.path, "VERSIQ_API_TOKENS": "secret-1"})
    with live_server(settings) as url:
        anon = Client(base_url=url)
        client = AuthenticatedClient(base_url=url, token="secret-1")
        wrong = AuthenticatedClient(base_url=url, token="nope")

        assert healthz.sync(client=anon).status == "ok"
        ready = readyz.sync_detailed(client=anon)
        assert ready.status_code == 200 and ready.parsed.ready is True
        assert openapi.sync_detailed(client=anon).status_code == 200
        assert metrics.sync_detailed(client=client).status_code == 200
        assert metrics.sync_detailed(client=anon).status_code == 401

        stores = list_stores.sync(client=client)
        assert isinstance(stores, StoreList)
        assert [s.name for s in stores.stores] == ["expensive", "live", "prices", "sessions"]
        denied = list_stores.sync(client=wrong)
        assert isinstance(denied, Problem) and denied.status == 401

        info = get_store.sync("prices", client=client, snapshot=0)
        assert isinstance(info, StoreInfo) and info.snapshot == 0 and info.kind.value == "versioned"
        missing = get_store.sync("nope", client=client)
        assert isinstance(missing, Problem) and missing.type_.endswith("/store-not-found")

        latest = get_key.sync("prices", "p-1", client=client)
        assert isinstance(latest, KeyValue) and latest.value == {"price": 2.0, "currency": "EUR"}
        old = get_key.sync("prices", "p-1", client=client, as_of=T0 + 9 * HOUR + 100)
        assert isinstance(old, KeyValue) and old.timestamp == T0 and old.valid_to == latest.timestamp
        iso = get_key.sync("prices", "p-1", client=client, as_of="2023-11-15T07:13:20.100Z")
        assert isinstance(iso, KeyValue) and iso.timestamp == T0
        for key in ODD_KEYS:
            got = get_key.sync("prices", key, client=client)
            assert isinstance(got, KeyValue) and got.key == key, key
        expired = get_key.sync("prices", "expiring", client=client, as_of=T0 + 1)
        assert isinstance(expired, Problem) and expired.type_.endswith("/expired")
        bad = get_key.sync("prices", "p-1", client=client, as_of="soon")
        assert isinstance(bad, Problem) and bad.status == 400

        # paging to the end, both orders
        for order in (ListVersionsOrder.ASC, ListVersionsOrder.DESC):
            values: list[int] = []
            token: Any = None
            pages = 0
            while True:
                kwargs: dict[str, Any] = {"client": client, "order": order, "page_size": 60}
                if token:
                    kwargs["page_token"] = token
                page = list_versions.sync("prices", "hist", **kwargs)
                assert isinstance(page, VersionsPage)
                pages += 1
                values += [r.value for r in page.records]
                token = page.next_page_token
                if token is None:
                    break
            expected = list(range(HIST_VERSIONS))
            assert values == (expected if order == ListVersionsOrder.ASC else expected[::-1])
            assert pages == 5
        empty = list_versions.sync("prices", "missing", client=client)
        assert isinstance(empty, VersionsPage) and empty.records == []
        too_big = list_versions.sync("prices", "hist", client=client, page_size=1001)
        assert isinstance(too_big, Problem) and too_big.status == 400


def test_generated_client_streams_and_provenance(s_generated: Any, s_wh: Warehouse) -> None:
    from versiq_client import Client
    from versiq_client.api.stores import get_store, list_stores
    from versiq_client.api.streams import get_stream, list_stream_records, list_streams
    from versiq_client.models import Problem, StoreInfo, StreamInfo, StreamList, StreamRecordsPage
    from versiq_client.models.list_stream_records_order import ListStreamRecordsOrder

    def sources(model: Any) -> dict[str, dict[str, int]]:
        return {k: {"run": v.run, "snapshot": v.snapshot} for k, v in model.additional_properties.items()}

    with live_server(Settings(warehouse=s_wh.path)) as url:
        client = Client(base_url=url)
        streams = list_streams.sync(client=client)
        assert isinstance(streams, StreamList)
        assert [s.name for s in streams.streams] == ["clicks", "clicks_priced"]
        assert "clicks" not in [s.name for s in list_stores.sync(client=client).stores]

        info = get_stream.sync("clicks_priced", client=client)
        assert isinstance(info, StreamInfo) and info.last_run == 1
        assert info.inputs.additional_properties == PRICED_INPUTS and sources(info.sources) == PRICED_SOURCES
        old = get_stream.sync("clicks", client=client, snapshot=0)
        assert isinstance(old, StreamInfo) and old.counts.additional_properties["records"] == CLICK_RUNS[0]
        assert old.inputs.additional_properties == {} and sources(old.sources) == {}
        missing = get_stream.sync("nope", client=client)
        assert isinstance(missing, Problem) and missing.type_.endswith("/stream-not-found")
        too_new = get_stream.sync("clicks", client=client, snapshot=9)
        assert isinstance(too_new, Problem) and too_new.type_.endswith("/snapshot-not-found")

        derived = get_store.sync("expensive", client=client)
        assert isinstance(derived, StoreInfo)
        assert derived.inputs.additional_properties == EXPENSIVE_INPUTS
        assert sources(derived.sources) == EXPENSIVE_SOURCES
        plain = get_store.sync("prices", client=client)
        assert isinstance(plain, StoreInfo) and plain.inputs.additional_properties == {}

        expected = [(r.key, r.run, r.seq) for r in s_wh.clicks.records]
        for order in (ListStreamRecordsOrder.ASC, ListStreamRecordsOrder.DESC):
            got: list[tuple[str, int, int]] = []
            token: Any = None
            while True:
                kwargs: dict[str, Any] = {"client": client, "order": order, "page_size": 30}
                if token:
                    kwargs["page_token"] = token
                page = list_stream_records.sync("clicks", **kwargs)
                assert isinstance(page, StreamRecordsPage)
                got += [(r.key, r.run, r.sequence) for r in page.records]
                token = page.next_page_token
                if token is None:
                    break
            assert got == (expected if order == ListStreamRecordsOrder.ASC else expected[::-1])
        keyed = list_stream_records.sync("clicks", client=client, key="+plus+", from_=T0, to=T0 + 99_000)
        assert isinstance(keyed, StreamRecordsPage) and keyed.key == "+plus+"
        assert [r.sequence for r in keyed.records] == [r.seq for r in s_wh.clicks.records if r.key == "+plus+"]
        assert any(r.value is None for r in list_stream_records.sync("clicks", client=client).records)
        bad = list_stream_records.sync("clicks", client=client, from_=5, to=4)
        assert isinstance(bad, Problem) and bad.status == 400
        gone = list_stream_records.sync("nope", client=client)
        assert isinstance(gone, Problem) and gone.type_.endswith("/stream-not-found")


def test_root_openapi_equals_packaged_copy() -> None:
    assert (ROOT / "openapi.yaml").read_bytes() == (ROOT / "service" / "openapi.yaml").read_bytes()


def test_generated_client_issue_16_endpoints(s_generated: Any, s_wh: Warehouse) -> None:
    """The queries beyond one key through the generated client: history, the change feed,
    point-in-time lookups, versions with deletions, system time and minSnapshot."""
    from versiq_client import Client
    from versiq_client.api.queries import get_key, list_versions, lookup_pairs
    from versiq_client.api.stores import get_rejected, get_store_history, list_changes, list_rejected
    from versiq_client.models import (
        BatchGetResponse,
        ChangesPage,
        KeyValue,
        LookupRequest,
        LookupRequestLookupsItem,
        Problem,
        RejectedPage,
        StoreHistory,
        VersionsPage,
    )

    with live_server(Settings.from_env({"VERSIQ_WAREHOUSE": s_wh.path})) as url:
        client = Client(base_url=url)
        history = get_store_history.sync("prices", client=client)
        assert isinstance(history, StoreHistory) and history.commits[0].snapshot == 0
        changes = list_changes.sync("prices", client=client, since_snapshot=-1)
        assert isinstance(changes, ChangesPage) and changes.snapshot == 0
        rejected = list_rejected.sync("prices", client=client)
        assert isinstance(rejected, RejectedPage) and rejected.records == []
        no_record = get_rejected.sync("prices", 0, client=client)
        assert isinstance(no_record, Problem) and no_record.type_.endswith("/record-not-found")
        body = LookupRequest(lookups=[LookupRequestLookupsItem(key="p-1"),
                                      LookupRequestLookupsItem(key="deleted", as_of=T0 + 9 * 3_600_000 + 150)])
        answer = lookup_pairs.sync("prices", client=client, body=body)
        assert isinstance(answer, BatchGetResponse) and [r.key for r in answer.results] == ["p-1", "deleted"]
        versions = list_versions.sync("prices", "deleted", client=client, include_deleted=True)
        assert isinstance(versions, VersionsPage) and versions.records[-1].deleted is True
        at = get_key.sync("prices", "p-1", client=client, as_of_system_time=history.commits[0].committed_at)
        assert isinstance(at, KeyValue) and at.snapshot == 0
        later = get_key.sync("prices", "p-1", client=client, min_snapshot=5)
        assert isinstance(later, Problem) and later.type_.endswith("/snapshot-not-found")


def test_generated_client_types_under_mypy_strict(s_generated_dir: Path, tmp_path: Path) -> None:
    """Auth is declared once for the whole API (``security: [{}, {bearerAuth: []}]``), so every
    call takes a plain ``Client`` (a server without tokens) or an ``AuthenticatedClient``; the
    package and docs/http-api.md's example pass ``mypy --strict``."""
    api = s_generated_dir / "versiq_client" / "api"
    calls = sorted(api.rglob("*.py"))
    assert len([p for p in calls if p.name != "__init__.py"]) >= 17
    only_authenticated = [str(p.relative_to(api)) for p in calls if "client: AuthenticatedClient,\n" in p.read_text()]
    assert only_authenticated == [], "operations typed as needing a token: declare no per-operation security"
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")  # none of the repository's settings
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir", str(tmp_path / "cache"),
         "versiq_client", EXAMPLE.name],
        cwd=s_generated_dir, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_client_example_with_auth_off_and_on(s_generated: Any, s_wh: Warehouse) -> None:
    """docs/http-api.md's example: a plain ``Client`` against a server without tokens (an empty token
    also means no token), an ``AuthenticatedClient`` against one with tokens."""
    import client_example
    from versiq_client import Client
    from versiq_client.api.stores import list_stores
    from versiq_client.models import Problem, StoreList

    def check(url: str, token: str | None) -> None:
        latest, history = client_example.latest_and_history(url, token)
        assert latest.value == {"price": 2.0, "currency": "EUR"} and latest.valid_to is None
        assert [(r.timestamp, r.valid_to) for r in history.records] == [(T0, latest.timestamp),
                                                                       (latest.timestamp, None)]

    with live_server(Settings(warehouse=s_wh.path)) as url:
        check(url, None)
        check(url, "")
        assert isinstance(list_stores.sync(client=Client(base_url=url)), StoreList)
    with live_server(Settings.from_env({"VERSIQ_WAREHOUSE": s_wh.path, "VERSIQ_API_TOKENS": "secret-1"})) as url:
        check(url, "secret-1")
        denied = list_stores.sync(client=Client(base_url=url))
        assert isinstance(denied, Problem) and denied.status == 401
        with pytest.raises(RuntimeError, match="no answer"):
            client_example.latest_and_history(url)
