"""``make kafka`` and ``make s3`` (scripts/local_server.py, docs/kafka-and-s3-locally.md): each starts
the server the tests use in the foreground, prints what to set and run, and takes its process
and data away on Ctrl-C. The Kafka one's printed ingest command, run as printed, builds the store
of the sample it produced."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.kafka_broker import jars_present

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local_server.py"

pytestmark = pytest.mark.slow


def _start(*args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """The script started, and its output up to the line that starts with "Ctrl-C"."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, cwd=ROOT)
    lines: list[str] = []
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("the script ended early:\n" + "".join(lines))
        lines.append(line)
        if "Ctrl-C here stops" in line:
            return proc, lines
    proc.kill()
    raise AssertionError("the script did not get ready:\n" + "".join(lines))


def _stop(proc: subprocess.Popen[str], work_dir: str | None) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    assert work_dir is None or not os.path.exists(work_dir)  # the server's data went with it


def _children_dirs(prefix: str) -> set[str]:
    import tempfile

    return {str(p) for p in Path(tempfile.gettempdir()).glob(prefix + "*")}


@pytest.mark.skipif(not jars_present(), reason="the Kafka broker's jars are not fetched (make test does it)")
def test_make_kafka_serves_the_sample_and_its_printed_ingest_builds_the_store(tmp_path):
    before = _children_dirs("versiq-kafka-")
    sample = tmp_path / "sample"
    proc, lines = _start("kafka", "--sample", str(sample), "--topic", "prices")
    work_dir = None
    try:
        text = "".join(lines)
        produced = int(re.search(r"produced (\d+) records of the sample", text).group(1))  # type: ignore[union-attr]
        command = next(line.strip() for line in lines if line.strip().startswith("versiq ingest"))
        work_dir = (_children_dirs("versiq-kafka-") - before).pop()
        argv = shlex.split(command.replace("warehouse-kafka", str(tmp_path / "wh")))
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "VERSIQ_SHUFFLE_PARTITIONS": "2"}
        done = subprocess.run([sys.executable, "-m", "versiq.cli", *argv[1:], "--log-level", "WARNING"],
                              capture_output=True, text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        assert re.search(rf"store prices: read {produced}, accepted \d+ latest", done.stderr), done.stderr
    finally:
        if proc.poll() is None:
            _stop(proc, work_dir)


def test_make_s3_serves_a_bucket_with_the_variables_it_prints(tmp_path):
    from pyarrow import fs as pafs

    before = _children_dirs("versiq-s3-")
    proc, lines = _start("s3", "--bucket", "warehouse")
    work_dir = None
    try:
        export = next(line.strip() for line in lines if line.strip().startswith("export "))
        variables = dict(word.split("=", 1) for word in shlex.split(export)[1:])
        endpoint = variables["AWS_ENDPOINT_URL"].removeprefix("http://")
        s3 = pafs.S3FileSystem(access_key=variables["AWS_ACCESS_KEY_ID"], secret_key=variables["AWS_SECRET_ACCESS_KEY"],
                               region=variables["AWS_REGION"], endpoint_override=endpoint, scheme="http")
        with s3.open_output_stream("warehouse/hello.txt") as out:
            out.write(b"hi")
        assert s3.get_file_info("warehouse/hello.txt").size == 2
        work_dir = (_children_dirs("versiq-s3-") - before).pop()
    finally:
        if proc.poll() is None:
            _stop(proc, work_dir)
