"""Source files that cannot be read fail the run and are retried; non-regular files are never
opened (issue 10, items 4 and 5; ``ingest.sources``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

import versiq.ingest.sources as sources_module
from tests.support.ingest import ingest_in_process, store_versions
from versiq.ingest.pipeline import StoreSpec, run_ingest
from versiq.ingest.sources import SourceError, list_sources

LINE = '{{"key":"{key}","value":1,"timestamp":{ts}}}\n'


def _snapshot_count(store: str) -> int:
    log = os.path.join(store, "_delta_log")
    return len([n for n in os.listdir(log) if n.endswith(".json")]) if os.path.isdir(log) else 0


def test_a_dangling_symlink_fails_the_run_and_is_read_once_it_resolves(spark, tmp_path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(LINE.format(key="a", ts=1))
    target = tmp_path / "later.jsonl"
    os.symlink(target, src / "b.jsonl")
    wh = str(tmp_path / "wh")

    entry = run_ingest(spark, wh, [StoreSpec("s", str(src))]).stores["s"]
    assert entry.error is not None
    assert str(src / "b.jsonl") in entry.error and "No such file or directory" in entry.error
    assert _snapshot_count(os.path.join(wh, "s")) == 0  # nothing of the store was committed

    target.write_text(LINE.format(key="b", ts=2))
    entry = run_ingest(spark, wh, [StoreSpec("s", str(src))]).stores["s"]
    assert entry.error is None and entry.read == 2
    assert set(store_versions(os.path.join(wh, "s"))) == {"a", "b"}


@pytest.mark.timeout(300)
def test_a_fifo_is_ignored_never_opened_and_named_in_the_report(spark, tmp_path, caplog) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.jsonl").write_text(LINE.format(key="a", ts=1))
    os.mkfifo(src / "sub" / "pipe.jsonl")  # opening it for reading would block forever
    os.symlink(src / "sub", src / "linked")  # a symlink to a directory is not followed
    wh = str(tmp_path / "wh")
    with caplog.at_level("WARNING", logger="versiq.ingest"):
        entry = run_ingest(spark, wh, [StoreSpec("f", str(src))]).stores["f"]
    assert entry.error is None and entry.read == 1
    assert entry.ignored == [{"path": "linked", "type": "symlink to directory"},
                             {"path": "sub/pipe.jsonl", "type": "fifo"}]
    assert entry.to_json()["ignored"] == entry.ignored
    assert "sub/pipe.jsonl" in caplog.text and "fifo" in caplog.text


def test_listing_names_the_unreadable_entry(tmp_path) -> None:
    loop = tmp_path / "loop.jsonl"
    os.symlink(loop, loop)
    with pytest.raises(SourceError, match="loop.jsonl"):
        list_sources(str(tmp_path))
    os.unlink(loop)
    (tmp_path / "x.jsonl").write_text("")
    assert list(list_sources(str(tmp_path)).files) == ["x.jsonl"]


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="needs a non-root user")
def test_an_unreadable_directory_fails_the_listing() -> None:
    """Permissions do not stop root: the listing runs as ``nobody`` when the tests run as root."""
    root = tempfile.mkdtemp(prefix="versiq-unreadable-")
    try:
        os.chmod(root, 0o755)
        os.mkdir(os.path.join(root, "closed"))
        with open(os.path.join(root, "closed", "a.jsonl"), "w") as handle:
            handle.write(LINE.format(key="a", ts=1))
        os.chmod(os.path.join(root, "closed"), 0)
        # ingest.sources needs only the standard library: a copy next to the data lets ``nobody``
        # import it whatever the permissions of the checkout and the virtualenv are.
        module_dir = os.path.join(root, "module")
        os.mkdir(module_dir)
        shutil.copy(sources_module.__file__ or "", os.path.join(module_dir, "sources.py"))
        code = ("import sys; from sources import list_sources, SourceError\n"
                "try:\n    list_sources(sys.argv[1])\nexcept SourceError as exc:\n    print(exc); sys.exit(3)\n")
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        python = getattr(sys, "_base_executable", sys.executable)
        code = f"import sys; sys.path.insert(0, {module_dir!r})\n" + code
        result = subprocess.run([*prefix, python, "-I", "-c", code, root], capture_output=True, text=True,
                                timeout=60, cwd="/")
        assert result.returncode == 3, result.stderr
        assert "cannot read source directory" in result.stdout and "closed" in result.stdout
        assert "Permission denied" in result.stdout
    finally:
        os.chmod(os.path.join(root, "closed"), 0o755)
        shutil.rmtree(root)


@pytest.mark.timeout(600)
def test_the_cli_exits_1_naming_the_unreadable_file_and_the_rerun_reads_it(spark, tmp_path) -> None:
    """Items 4 and 5 through ``versiq ingest`` as a scheduler runs it: a dangling symlink is exit
    1 with the path and the OS error on stderr and in the report, a FIFO beside it never blocks
    the run (subprocess timeouts turn a hang into a failure), and the rerun (the CLI's command
    in this process) reads the file."""
    from tests.ingest.test_ingest_cli import versiq

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(LINE.format(key="a", ts=1))
    os.mkfifo(src / "pipe.jsonl")
    target = tmp_path / "later.jsonl"
    os.symlink(target, src / "b.jsonl")
    wh, report = str(tmp_path / "wh"), tmp_path / "report.json"
    args = ("ingest", "--warehouse", wh, "--store", "s", "--source", str(src), "--report", str(report))

    failed = versiq(*args, timeout=240)
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert f"{src / 'b.jsonl'}: No such file or directory" in failed.stderr
    error = json.loads(report.read_text())["stores"]["s"]["error"]
    assert str(src / "b.jsonl") in error and "No such file or directory" in error
    assert _snapshot_count(os.path.join(wh, "s")) == 0

    target.write_text(LINE.format(key="b", ts=2))
    status, printed = ingest_in_process(spark, *args[1:])  # the CLI's command in this process: no JVM start
    assert status == 0, printed[-3000:]
    entry = json.loads(report.read_text())["stores"]["s"]
    assert entry["read"] == 2 and entry["files"] == 2
    assert entry["ignored"] == [{"path": "pipe.jsonl", "type": "fifo"}]
    assert set(store_versions(os.path.join(wh, "s"))) == {"a", "b"}


@pytest.mark.timeout(600)
def test_continuous_mode_retries_an_unreadable_file_and_never_opens_a_fifo(tmp_path) -> None:
    """The same in ``--continuous`` (the watch only says when; the pipeline run decides what is
    read): the run fails while the symlink dangles, commits nothing and is retried until the
    file is readable; the FIFO is reported ignored."""
    from tests.ingest.test_ingest_cli import VERSIQ, _wait_for, env

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(LINE.format(key="a", ts=1))
    os.mkfifo(src / "pipe.jsonl")
    target = tmp_path / "later.jsonl"
    os.symlink(target, src / "b.jsonl")
    wh, report = str(tmp_path / "wh"), tmp_path / "report.json"
    store = os.path.join(wh, "s")
    stderr = open(tmp_path / "stderr.log", "w")  # noqa: SIM115 - a file: failed runs retry and log each time
    proc = subprocess.Popen(
        [*VERSIQ, "ingest", "--warehouse", wh, "--store", "s", "--source", str(src), "--continuous",
         "--trigger-interval", "1s", "--report", str(report)],
        env=env(), stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
    try:
        _wait_for(report.exists, 240, "the first micro-batch")
        error = json.loads(report.read_text())["stores"]["s"]["error"]
        assert str(src / "b.jsonl") in error and "No such file or directory" in error
        assert _snapshot_count(store) == 0  # a is not committed without b, b is not marked done
        target.write_text(LINE.format(key="b", ts=2))
        _wait_for(lambda: set(store_versions(store)) == {"a", "b"} if _snapshot_count(store) else False, 240,
                  "the replayed micro-batch to read the file")
        _wait_for(lambda: "error" not in json.loads(report.read_text())["stores"]["s"], 60, "the report")
        entry = json.loads(report.read_text())["stores"]["s"]
        assert entry["read"] == 2 and entry["ignored"] == [{"path": "pipe.jsonl", "type": "fifo"}]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        finally:
            stderr.close()
    log = (tmp_path / "stderr.log").read_text()
    assert code == 0, log[-3000:]
    # each failed micro-batch is said once, in versiq's words: no py4j or Spark stack traces
    assert "the run failed (a store, stream or table failed); retrying in 1.0s" in log
    assert "There was an exception while executing the Python Proxy" not in log, log[-3000:]
    assert "terminated with error" not in log and "ForeachBatchUserFuncException" not in log, log[-3000:]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_a_read_the_os_refuses_raises_and_corrupt_content_is_a_rejection(tmp_path, fmt) -> None:
    """An OS read error (``/proc/self/mem`` at offset 0 is a regular file whose reads fail, a
    real stand-in for EIO) fails the run in every format; a Parquet reader error once made it one
    ``malformed`` record and the file was marked done. Corrupt Parquet content (pyarrow's
    OSError without an errno) stays a rejection."""
    from versiq.ingest.records import parse_file

    with pytest.raises(OSError) as raised:
        list(parse_file("/proc/self/mem", "mem", fmt))
    assert raised.value.errno is not None
    if fmt == "parquet":
        corrupt = tmp_path / "corrupt.parquet"
        corrupt.write_bytes(b"PAR1" + b"\0" * 100 + b"\x10\0\0\0PAR1")
        [batch] = list(parse_file(str(corrupt), "corrupt.parquet", fmt))
        [row] = batch.to_pylist()
        assert row["reason"] == "malformed" and "not a readable Parquet file" in row["detail"]


def test_a_parquet_file_the_os_cannot_read_fails_the_run(spark, tmp_path) -> None:
    """The parse task's read error names the file, on one line, and nothing is committed."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(LINE.format(key="a", ts=1))
    os.symlink("/proc/self/mem", src / "m.parquet")  # opens fine, every read fails
    wh = str(tmp_path / "wh")
    entry = run_ingest(spark, wh, [StoreSpec("p", str(src))]).stores["p"]
    assert entry.error == f"SourceError: cannot read source file {src / 'm.parquet'}: Invalid argument"
    assert _snapshot_count(os.path.join(wh, "p")) == 0
