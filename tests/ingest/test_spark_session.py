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
    """`make test` writes the archive before the tests (Makefile, CLASS_ARCHIVE) from a JVM that
    ran the warm-up ingest runs (``_CLASS_ARCHIVE_SCRIPT``): in CI a missing one is a broken recipe."""
    path = spark_module.class_archive_path()
    if path is None or not os.path.isfile(path):
        if os.environ.get("CI"):
            pytest.fail("`make test` wrote no JVM class archive: its recipe failed (see make's output)")
        pytest.skip("no class archive: run through `make test` (it writes one)")
    assert f"-XX:SharedArchiveFile={path}" in spark.conf.get("spark.driver.extraJavaOptions")


def test_a_short_lived_driver_compiles_with_c1_only_and_the_users_options_come_last(spark, monkeypatch):
    """One-shot runs (``SparkOnDemand``, ``versiq maintain``) end with their run: C1 only. A
    long-lived session (continuous mode, this test session) keeps the full JIT. The user's
    ``VERSIQ_DRIVER_JAVA_OPTIONS`` come last, so ``-XX:TieredStopAtLevel=4`` there wins."""
    monkeypatch.delenv(spark_module.DRIVER_JAVA_OPTIONS_ENV, raising=False)
    assert spark_module.SHORT_LIVED_JIT_OPTION in spark_module.driver_java_options(short_lived=True).split()
    assert "-XX:TieredStopAtLevel" not in spark_module.driver_java_options(short_lived=False)
    # the options this session's JVM started with (a later get_spark's builder may have set the
    # session's runtime copy of the setting; the JVM keeps what it started with)
    assert "-XX:TieredStopAtLevel" not in (spark.sparkContext.getConf().get("spark.driver.extraJavaOptions") or "")
    monkeypatch.setenv(spark_module.DRIVER_JAVA_OPTIONS_ENV, "-XX:TieredStopAtLevel=4 -Xss4m")
    options = spark_module.driver_java_options(short_lived=True).split()
    assert options[-2:] == ["-XX:TieredStopAtLevel=4", "-Xss4m"]
    assert options.index(spark_module.SHORT_LIVED_JIT_OPTION) < options.index("-XX:TieredStopAtLevel=4")


def test_the_session_does_not_record_python_call_sites(spark):
    """PySpark's call-site capture costs three py4j round trips per DataFrame or Column call,
    most of the driver time of a small run's plan (ingest/spark.py)."""
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()


def test_small_runs_plan_for_little_data_and_the_session_gets_its_settings_back(spark, monkeypatch):
    """A run over at most ``INTERPRETED_RUN_BYTES`` of new input evaluates expressions interpreted,
    without adaptive execution and with one shuffle partition per core at most, in any session
    (a one-shot CLI run's or continuous mode's); a larger one, one of unknown size (Kafka, S3)
    and any run with ``VERSIQ_INTERPRETED_RUN_BYTES=0`` keep the session's plans (generated code,
    adaptive execution); the session's own settings come back after each. (That both paths write
    the same store is checked by the ingest property test and the CLI kill -9 test.)"""
    monkeypatch.delenv(spark_module.INTERPRETED_RUN_BYTES_ENV, raising=False)
    keys = ["spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode", "spark.sql.adaptive.enabled",
            "spark.sql.shuffle.partitions"]
    assert sorted(spark_module.small_run_settings(spark)) == sorted(keys)
    before = [spark.conf.get(key, None) for key in keys]
    assert before[2] == "true"

    def settings() -> list[str | None]:
        return [spark.conf.get(key, None) for key in keys]

    partitions = str(min(int(before[3] or 200), spark.sparkContext.defaultParallelism))
    with spark_module.plans_for_input(spark, spark_module.INTERPRETED_RUN_BYTES):
        assert settings() == ["false", "NO_CODEGEN", "false", partitions]
    assert settings() == before
    for size in (spark_module.INTERPRETED_RUN_BYTES + 1, None):
        with spark_module.plans_for_input(spark, size):
            assert settings() == before
    monkeypatch.setenv(spark_module.INTERPRETED_RUN_BYTES_ENV, "0")
    for size in (10, 0):  # 0: never, even for a run with no bytes of new input
        with spark_module.plans_for_input(spark, size):
            assert settings() == before
    assert settings() == before
