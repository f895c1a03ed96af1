"""The driver JVM's class-data-sharing archive (ingest/spark.py): named per JDK and PySpark, used
only under its final name, and used by the sessions of this checkout once `make` wrote it; and
the session's other settings for small runs."""

from __future__ import annotations

import os

import pytest

from versiq.ingest import spark as spark_module


def test_the_archive_is_named_for_the_jdk_and_used_only_when_whole(tmp_path, monkeypatch):
    monkeypatch.setenv(spark_module.CLASS_ARCHIVE_DIR_ENV, str(tmp_path))
    path = spark_module.class_archive_path()
    assert path is not None and os.path.dirname(path) == str(tmp_path)
    assert spark_module._class_archive_option() is None  # not written yet: Spark starts without one
    with open(f"{path}.123.partial", "wb") as handle:  # a JVM still writing it (or killed doing so)
        handle.write(b"\0" * 64)
    assert spark_module._class_archive_option() is None
    os.replace(f"{path}.123.partial", path)
    assert spark_module._class_archive_option() == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "another-jdk"))
    assert spark_module.class_archive_path() is None  # no java there: no archive, never a stale one


def test_the_sessions_of_this_checkout_map_the_archive(spark):
    """`make test` writes the archive before the tests (Makefile, CLASS_ARCHIVE)."""
    path = spark_module.class_archive_path()
    if path is None or not os.path.isfile(path):
        pytest.skip("no class archive: run through `make test` (it writes one)")
    assert f"-XX:SharedArchiveFile={path}" in spark.conf.get("spark.driver.extraJavaOptions")


def test_the_session_does_not_record_python_call_sites(spark):
    """PySpark's call-site capture costs three py4j round trips per DataFrame or Column call,
    most of the driver time of a small run's plan (ingest/spark.py)."""
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()
