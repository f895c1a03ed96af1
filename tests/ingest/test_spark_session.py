"""The session's settings: the driver JVM's options and the settings of small runs (the class
archive itself: tests/ingest/test_class_archive.py)."""

from __future__ import annotations

from versiq.ingest import spark as spark_module
from versiq.ingest.class_archive import DRIVER_JAVA_OPTIONS_ENV


def test_a_short_lived_driver_compiles_with_c1_only_and_the_users_options_come_last(spark, monkeypatch):
    """One-shot runs (``SparkOnDemand``, ``versiq maintain``) end with their run: C1 only. A
    long-lived session (continuous mode, this test session) keeps the full JIT. The user's
    ``VERSIQ_DRIVER_JAVA_OPTIONS`` come last, so ``-XX:TieredStopAtLevel=4`` there wins."""
    monkeypatch.delenv(DRIVER_JAVA_OPTIONS_ENV, raising=False)
    assert spark_module.SHORT_LIVED_JIT_OPTION in spark_module.driver_java_options(short_lived=True).split()
    assert "-XX:TieredStopAtLevel" not in spark_module.driver_java_options(short_lived=False)
    # the options this session's JVM started with (a later get_spark's builder may have set the
    # session's runtime copy of the setting; the JVM keeps what it started with)
    assert "-XX:TieredStopAtLevel" not in (spark.sparkContext.getConf().get("spark.driver.extraJavaOptions") or "")
    monkeypatch.setenv(DRIVER_JAVA_OPTIONS_ENV, "-XX:TieredStopAtLevel=4 -Xss4m")
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
    assert spark_module.small_run(spark_module.INTERPRETED_RUN_BYTES)
    with spark_module.plans_for_input(spark, True):
        assert settings() == ["false", "NO_CODEGEN", "false", partitions]
    assert settings() == before
    for size in (spark_module.INTERPRETED_RUN_BYTES + 1, None):
        assert not spark_module.small_run(size)
    with spark_module.plans_for_input(spark, False):
        assert settings() == before
    monkeypatch.setenv(spark_module.INTERPRETED_RUN_BYTES_ENV, "0")
    for size in (10, 0):  # 0: never, even for a run with no bytes of new input
        assert not spark_module.small_run(size)
    assert settings() == before
    assert settings() == before


def test_a_local_sessions_files_get_hadoops_permissions_from_versiqs_file_system(spark, tmp_path):
    """A local session's Hadoop file systems for ``file:`` paths are versiq's (``FileSystem`` and
    ``FileContext``, which Delta's log goes through): files and directories get the permissions
    Hadoop's own would give them (its defaults under its umask, ``fs.permissions.umask-mode``),
    set in the JVM; a file, a directory and a symbolic link have the status Hadoop's own raw file
    system gives them; and a Delta table written through them reads back."""
    import os
    import stat

    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    uri = jvm.java.net.URI("file:///")
    assert jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf).getClass().getName() == spark_module.LOCAL_FILESYSTEM
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf)
    assert context.getDefaultFileSystem().getClass().getName() == spark_module.LOCAL_FILE_CONTEXT
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf)
    folder, made = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/a/b"), f"file://{tmp_path}/a/b/f"
    assert fs.mkdirs(folder)
    fs.create(jvm.org.apache.hadoop.fs.Path(made), False).close()
    umask = jvm.org.apache.hadoop.fs.permission.FsPermission.getUMask(conf).toShort()
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o777 & ~umask
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "f").st_mode) == 0o666 & ~umask
    assert (tmp_path / "a" / "b" / ".f.crc").exists()  # still Hadoop's checksummed file system
    # an explicit permission, through the raw file system and FileContext alike
    raw = fs.getRaw()
    raw.setPermission(jvm.org.apache.hadoop.fs.Path(made), jvm.org.apache.hadoop.fs.permission.FsPermission("640"))
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "f").st_mode) == 0o640
    context.setPermission(jvm.org.apache.hadoop.fs.Path(made), jvm.org.apache.hadoop.fs.permission.FsPermission("604"))
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b" / "f").st_mode) == 0o604
    # the status of a file, a directory, a symbolic link, as Hadoop's own raw file system gives it
    os.symlink(tmp_path / "a" / "b" / "f", tmp_path / "link")
    stock = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    stock.initialize(uri, conf)
    for name in ("a/b/f", "a/b", "link"):
        where = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/{name}")
        ours, theirs = context.getFileLinkStatus(where), stock.getFileLinkStatus(where)
        assert (ours.isSymlink(), ours.isFile(), ours.isDirectory(), ours.getLen(), ours.getPath().toString()) == \
            (theirs.isSymlink(), theirs.isFile(), theirs.isDirectory(), theirs.getLen(), theirs.getPath().toString())
    assert context.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(made)).isFile()
    # a Delta table written and read through them
    path = str(tmp_path / "t")
    spark.range(5).write.format("delta").save(path)
    spark.range(5, 7).write.format("delta").mode("append").save(path)
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == list(range(7))
    assert stat.S_IMODE(os.stat(os.path.join(path, "_delta_log", "00000000000000000001.json")).st_mode) == \
        0o666 & ~umask


def test_a_versiq_jar_without_the_file_systems_leaves_hadoops_own(tmp_path):
    """A local session names versiq's file systems only when its jar holds them: a jar built
    before them (a checkout updated without ``make``) or an unreadable one leaves Hadoop's, so
    Spark still starts; the jars go on the class path either way."""
    import zipfile

    from versiq.package import jars_dir

    old = tmp_path / "versiq-delta-logstore-1.jar"
    with zipfile.ZipFile(old, "w") as jar:
        jar.writestr("dev/versiq/delta/ConditionalS3LogStore.class", b"")
    other = tmp_path / "delta-spark_4.2_2.13-4.4.0.jar"
    other.write_bytes(b"")
    for versiq_jar in (old, tmp_path / "not-a-zip" / "versiq-delta-logstore-1.jar"):
        versiq_jar.parent.mkdir(exist_ok=True)
        if not versiq_jar.exists():
            versiq_jar.write_bytes(b"not a zip")
        jars = [str(other), str(versiq_jar)]
        assert spark_module.local_session_jars(jars) == {"spark.driver.extraClassPath": ":".join(jars)}
    built = spark_module.jar_files(jars_dir())
    settings = spark_module.local_session_jars(built)
    assert settings["spark.hadoop.fs.file.impl"] == spark_module.LOCAL_FILESYSTEM
    assert settings["spark.hadoop.fs.AbstractFileSystem.file.impl"] == spark_module.LOCAL_FILE_CONTEXT
