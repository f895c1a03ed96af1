"""``make kafka``, ``make s3`` and ``make demo-kafka`` (scripts/local_server.py,
scripts/demo_kafka.py, docs/kafka-and-s3-locally.md). The first two start the server the tests
use in the foreground, print what to set and run, and take its process and data away on Ctrl-C;
the Kafka one's printed ingest command is the one ``make demo-kafka`` runs with ``--continuous``.
``make demo-kafka`` does it all in one command: broker, sample, continuous ingest, server, and a
record produced after the store is served that its printed curl answers; Ctrl-C leaves no process
of it behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.local_server import ingest_argv
from tests.support.kafka_broker import jars_present
from tests.support.server_process import free_ports

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local_server.py"
DEMO_KAFKA = ROOT / "scripts" / "demo_kafka.py"

pytestmark = pytest.mark.slow


def _start(*args: str, script: Path = SCRIPT, timeout: float = 180,
           **popen: Any) -> tuple[subprocess.Popen[str], list[str]]:
    """The script started (``popen``: more arguments of ``Popen``), and its output up to the line
    that starts with "Ctrl-C"."""
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, cwd=ROOT, **popen)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
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
def test_make_kafka_serves_the_sample_and_prints_the_ingest_make_demo_kafka_runs(tmp_path):
    """The printed ingest is ``ingest_argv``'s: the demo test below runs it (continuous) and checks
    that it reads every record produced here."""

    proc, lines = _start("kafka", "--sample", str(tmp_path / "sample"), "--keys", "100", "--topic", "prices")
    work_dir = None
    try:
        text = "".join(lines)
        bootstrap = re.search(r"Kafka broker ready on (\S+);", text).group(1)  # type: ignore[union-attr]
        work_dir = re.search(r"its data in (\S+)", text).group(1)  # type: ignore[union-attr]
        assert os.path.isdir(work_dir)
        produced = int(re.search(r"produced (\d+) records of the sample", text).group(1))  # type: ignore[union-attr]
        assert produced > 500
        command = next(line.strip() for line in lines if line.strip().startswith("versiq ingest"))
        assert shlex.split(command) == ingest_argv(bootstrap, "prices")
    finally:
        if proc.poll() is None:
            _stop(proc, work_dir)


def _process_tree(root: int) -> dict[int, tuple[str, str]]:
    """pid -> (start time, command name) of ``root``'s descendants (from /proc)."""
    parents: dict[int, int] = {}
    info: dict[int, tuple[str, str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        pid = int(stat.parent.name)
        parents[pid], info[pid] = int(rest[1]), (rest[19], name)
    tree: dict[int, tuple[str, str]] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree[pid] = info[pid]
                todo.append(pid)
    return tree


def _alive(pid: int, start_time: str) -> bool:
    """Whether process ``pid`` started at ``start_time`` still runs (a zombie does not)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    rest = text[text.rindex(")") + 2:].split()
    return rest[19] == start_time and rest[0] != "Z"


@pytest.mark.skipif(not jars_present(), reason="the Kafka broker's jars are not fetched (make test does it)")
def test_make_demo_kafka_answers_a_produced_record_over_http_and_leaves_nothing_behind(tmp_path):
    port = free_ports(1)[0]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "VERSIQ_SHUFFLE_PARTITIONS": "2"}
    # its own session, as in a terminal: Ctrl-C goes to the whole process group
    proc, lines = _start("--sample", str(tmp_path / "sample"), "--keys", "100", "--port", str(port),
                         script=DEMO_KAFKA, timeout=600, env=env, start_new_session=True)
    try:
        text = "".join(lines)
        tree = _process_tree(proc.pid)
        # the broker's data; the warehouse, the logs and the serving index of the demo
        work_dirs = [re.search(pattern, text).group(1)  # type: ignore[union-attr]
                     for pattern in (r"its data in (\S+)", r"with their logs in (\S+):")]
        assert all(os.path.isdir(folder) for folder in work_dirs), work_dirs
        # make kafka's ingest, continuous: the first run reads every record of the sample
        bootstrap = re.search(r"Kafka broker ready on (\S+);", text).group(1)  # type: ignore[union-attr]
        produced = int(re.search(r"produced (\d+) records of the sample", text).group(1))  # type: ignore[union-attr]
        ingest = shlex.split(next(line.strip() for line in lines if line.strip().startswith("versiq ingest")))
        warehouse = ingest[ingest.index("--warehouse") + 1]
        assert ingest == [*ingest_argv(bootstrap, "prices", warehouse), "--continuous", "--trigger-interval", "1s"]
        assert re.search(rf"\[ingest\] store prices: read {produced}, accepted ", text), text
        # the record produced after the store was served, and the curl that answers it
        record = json.loads(lines[next(i for i, line in enumerate(lines) if line.startswith("Round trip:")) + 1])
        curl = next(i for i, line in enumerate(lines) if line.strip().startswith("curl -s '"))
        url = shlex.split(lines[curl])[2]
        answer = httpx.get(url, timeout=10).json()
        assert (answer["key"], answer["value"], answer["timestamp"]) == (record["key"], record["value"],
                                                                         record["timestamp"]), text
        assert answer["validTo"] is None and answer["snapshot"] >= 1
        assert json.loads(lines[curl + 1]) == answer  # the answer printed under the curl
        # what runs: the broker's JVM, the ingest and its Spark JVM, the server
        names = [name for _, name in tree.values()]
        assert names.count("java") >= 2 and sum(name.startswith("python") for name in names) >= 2, tree
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its children die with it (PR_SET_PDEATHSIG)
                raise
    assert proc.returncode == 0, proc.stdout.read() if proc.stdout else ""
    left = {pid: name for pid, (start, name) in tree.items() if _alive(pid, start)}
    assert left == {}, f"processes of make demo-kafka left after Ctrl-C: {left}"
    assert not any(os.path.exists(folder) for folder in work_dirs)


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
