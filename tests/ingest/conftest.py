"""Fixtures of the ingest tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def registry_stores(spark, kafka_broker, schema_registry, tmp_path_factory):
    """Every store of the end-to-end schema-registry tests, built by one ``versiq ingest --config``
    in the session's Spark (tests/support/registry_stores.py), the first time a test of this
    worker asks."""
    from tests.support.registry_stores import build_registry_stores

    return build_registry_stores(kafka_broker, schema_registry, tmp_path_factory.mktemp("registry-stores"), spark)
