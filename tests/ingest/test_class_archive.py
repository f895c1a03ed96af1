"""The driver JVM's class-data-sharing archive (ingest/class_archive.py): named per JDK and
PySpark, used only under its final name, used by the sessions of this checkout once `make` wrote
it, and never able to fail a command: a JVM that cannot write it in time is killed with its
process group and leaves no partial file."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from versiq.ingest import class_archive


def test_the_archive_is_named_for_the_jdk_and_used_only_when_whole(tmp_path, monkeypatch):
    monkeypatch.setenv(class_archive.CLASS_ARCHIVE_DIR_ENV, str(tmp_path))
    path = class_archive.class_archive_path()
    assert path is not None and os.path.dirname(path) == str(tmp_path)
    assert class_archive.class_archive_option() is None  # not written yet: Spark starts without one
    with open(f"{path}.123.partial", "wb") as handle:  # a JVM still writing it (or killed doing so)
        handle.write(b"\0" * 64)
    assert class_archive.class_archive_option() is None
    os.replace(f"{path}.123.partial", path)
    assert class_archive.class_archive_option() == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "another-jdk"))
    assert class_archive.class_archive_path() is None  # no java there: no archive, never a stale one


def test_the_sessions_of_this_checkout_map_the_archive(spark):
    """`make test` writes the archive before the tests (Makefile, CLASS_ARCHIVE) from a JVM that
    ran the warm-up ingest runs: in CI a missing one is a broken recipe, unless the machine was
    too busy to write it in time (the attempt's record says so; the command went on without it)."""
    path = class_archive.class_archive_path()
    if path is None or not os.path.isfile(path):
        attempt = class_archive.last_attempt(os.path.dirname(path)) if path else None
        if os.environ.get("CI") and (attempt is None or attempt[0] != "timeout"):
            pytest.fail(f"`make test` wrote no JVM class archive: its recipe failed ({attempt})")
        pytest.skip(f"no class archive ({attempt or 'run through `make test`, it writes one'})")
    assert f"-XX:SharedArchiveFile={path}" in spark.conf.get("spark.driver.extraJavaOptions")


def _processes_naming(text: str) -> list[int]:
    """The pids whose command line contains ``text`` (the JVM carries the partial file's path)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if text.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_an_archive_not_written_in_time_is_skipped_with_one_line_and_nothing_left(tmp_path, monkeypatch, caplog):
    """A busy machine: the writer's timeout passes while its JVM runs. The call returns None
    within the timeout (plus the kill), logs one line, leaves no process of its group and no
    partial file, and records the attempt as a timeout; a partial of an earlier killed attempt
    is removed too."""
    folder = tmp_path / "jvm"
    monkeypatch.setenv(class_archive.CLASS_ARCHIVE_DIR_ENV, str(folder))
    path = class_archive.class_archive_path()
    assert path is not None
    folder.mkdir()
    abandoned = f"{path}.999999999.partial"  # no such pid: an attempt killed before it cleaned up
    with open(abandoned, "wb") as handle:
        handle.write(b"\0" * 64)
    timeout = 15.0
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(_processes_naming(str(folder)))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger=class_archive.__name__):
            result = class_archive.write_class_archive(timeout=timeout)
    finally:
        done.set()
        watcher.join()
    elapsed = time.monotonic() - started
    assert result is None
    assert elapsed < timeout + 10
    assert [record.getMessage() for record in caplog.records if record.name == class_archive.__name__] == [
        f"the JVM class archive was not written within {timeout:g} s (a busy machine?); Spark starts without one"]
    assert seen, "the writer's child was never seen running"
    time.sleep(0.5)
    assert _processes_naming(str(folder)) == []  # the child and its JVM are gone
    assert sorted(os.listdir(folder)) == [class_archive.OUTCOME_FILE]  # no partial, no archive
    assert class_archive.last_attempt(str(folder))[0] == "timeout"  # type: ignore[index]
    assert not os.path.exists(abandoned)


def test_a_failing_writer_is_one_line_and_no_archive(tmp_path, monkeypatch, caplog):
    """A recipe that fails (here: a script that exits with an error) returns None with one line naming
    the exit, and records the attempt as failed: the command that asked goes on."""
    monkeypatch.setenv(class_archive.CLASS_ARCHIVE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(class_archive, "_CLASS_ARCHIVE_SCRIPT", "raise SystemExit('recipe broken')")
    with caplog.at_level(logging.WARNING, logger=class_archive.__name__):
        assert class_archive.write_class_archive(timeout=60) is None
    lines = [record.getMessage() for record in caplog.records if record.name == class_archive.__name__]
    assert len(lines) == 1 and "exit 1: recipe broken" in lines[0]
    assert class_archive.last_attempt(str(tmp_path))[0] == "failed"  # type: ignore[index]
    assert sorted(os.listdir(tmp_path)) == [class_archive.OUTCOME_FILE]


def test_makes_archive_step_goes_on_when_the_archive_times_out(tmp_path):
    """The Makefile's archive step (a prerequisite of `make demo` and `make test`) with a timeout
    no JVM meets: make exits 0, says in one line that Spark starts without an archive, and marks
    the step done so the command goes on."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    stamp = tmp_path / ".written"
    env = {**os.environ, class_archive.CLASS_ARCHIVE_DIR_ENV: str(tmp_path / "jvm"), "PYTHONPATH": root}
    env.pop("MAKEFLAGS", None)
    done = subprocess.run(["make", "--no-print-directory", "-C", root, f"CLASS_ARCHIVE={stamp}",
                           "CLASS_ARCHIVE_TIMEOUT=1", str(stamp)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "JVM class archive: none (Spark starts without one)" in done.stdout
    assert "was not written within 1 s" in done.stderr and "Traceback" not in done.stderr
    assert stamp.exists()
    assert sorted(os.listdir(tmp_path / "jvm")) == [class_archive.OUTCOME_FILE]
