"""Schemathesis against the live server over a real store: no 5xx, every response conforms."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS

from tests.support.service import build_warehouse, live_server
from versiq.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]  # the repository
schema = schemathesis.openapi.from_path(str(ROOT / "openapi.yaml"))


@pytest.fixture(scope="module")
def s_base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    wh = build_warehouse(str(tmp_path_factory.mktemp("wh")))
    with live_server(Settings(warehouse=wh.path)) as url:
        yield url


CHECK_NAMES = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
               "response_schema_conformance", "response_headers_conformance")


@schema.parametrize()
@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_api_conforms(case: schemathesis.Case, s_base_url: str) -> None:
    checks = [c for c in CHECKS.get_all() if c.__name__ in CHECK_NAMES]
    assert len(checks) == len(CHECK_NAMES)
    case.call_and_validate(base_url=s_base_url, checks=checks)
