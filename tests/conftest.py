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


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("VERSIQ_SHUFFLE_PARTITIONS", "2")
    from versiq.ingest.spark import get_spark

    session = get_spark("local[2]")
    yield session
    session.stop()
