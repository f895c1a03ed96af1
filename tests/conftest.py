"""Shared fixtures: one SparkSession for the whole test session (a cold start costs ~10 s)."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# CI runs a derandomized profile with a fixed number of examples; `HYPOTHESIS_PROFILE=explore`
# runs a random, longer one locally.
settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "explore", deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# A resident driver the developer runs (``versiq driver``) must not take the tests' CLI runs:
# every ``versiq ingest`` the tests start runs in its own process unless a test points it at a
# driver of its own (tests/ingest/test_resident_driver.py).
os.environ["VERSIQ_DRIVER_SOCKET"] = "off"
os.environ.pop("VERSIQ_DRIVER_AUTOSTART", None)


@pytest.fixture(scope="session", autouse=True)
def index_cache(tmp_path_factory):
    """The serving indexes of every test's warehouses (query/index_files.py) go to a folder of
    this session, not the user's cache; subprocesses (versiq serve) inherit it."""
    folder = str(tmp_path_factory.mktemp("index-cache"))
    previous = os.environ.get("VERSIQ_CACHE_DIR")
    os.environ["VERSIQ_CACHE_DIR"] = folder
    yield folder
    if previous is None:
        os.environ.pop("VERSIQ_CACHE_DIR", None)
    else:
        os.environ["VERSIQ_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("VERSIQ_SHUFFLE_PARTITIONS", "2")
    from versiq.ingest.spark import get_spark

    session = get_spark("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka_broker():
    """One real single-node KRaft Kafka broker (tests/support/kafka_broker.py) for the session,
    started the first time a test asks for it (~2 s), stopped at the end. A test that stops or kills
    it must start it again (``restart()``, ``start()``; ``ensure_running()`` after one that failed)."""
    from tests.support.kafka_broker import FETCH_HINT, KafkaBroker, jars_present

    if not jars_present():
        pytest.fail(f"the Kafka broker's jars are missing: {FETCH_HINT}", pytrace=False)
    broker = KafkaBroker()
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def schema_registry():
    """One real Confluent-compatible schema registry (Apicurio Registry, tests/support/schema_registry.py)
    on 127.0.0.1 for the session, started the first time a test asks for it (~5-15 s), stopped at the
    end; ``url`` is its Confluent-compatible base URL. A test that stops or kills it must start it
    again (``restart()``, ``start()``; ``ensure_running()`` after one that failed): its schemas and
    ids survive."""
    from tests.support.schema_registry import FETCH_HINT, SchemaRegistry, dist_present

    if not dist_present():
        pytest.fail(f"the schema registry is missing: {FETCH_HINT}", pytrace=False)
    registry = SchemaRegistry()
    try:
        registry.start()
        yield registry
    finally:
        registry.close()


@pytest.fixture(scope="session")
def s3_server():
    """One real S3-compatible server (SeaweedFS ``weed mini``, tests/support/s3_server.py) on
    127.0.0.1 for the session, started the first time a test asks for it (~1 s), stopped at the end.
    ``env()`` gives the AWS variables a client needs. A test that stops or kills it must start it
    again (``restart()``, ``start()``; ``ensure_running()`` after one that failed)."""
    from tests.support.s3_server import INSTALL_HINT, S3Server, weed_binary

    if weed_binary() is None:
        pytest.fail(f"the S3 server's binary is missing: {INSTALL_HINT}", pytrace=False)
    server = S3Server()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium (Debian's, tests/support/browser.py) driven by Playwright for the
    session, started the first time a test asks for it (~1 s)."""
    from playwright.sync_api import sync_playwright

    from tests.support.browser import INSTALL_HINT, chromium_present, launch_chromium

    if not chromium_present():
        pytest.fail(f"no Chromium for the browser tests: {INSTALL_HINT}", pytrace=False)
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        try:
            yield chromium
        finally:
            chromium.close()
