"""An S3 warehouse whose server goes away in the middle of a run (SeaweedFS's ``weed mini``, the
``s3_server`` fixture, killed with SIGKILL): the ``versiq ingest`` process must not hang in S3A's
retries. It fails within a bound, with one line naming the failure and no traceback, and once the
server is back a rerun completes the store (docs/contract.md, "S3 warehouses").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from tests.ingest.test_ingest_cli import VERSIQ
from tests.support.ingest import ingest_in_process
from versiq import layout, storage
from versiq.ingest.spark import FETCH_HINT_S3, configure_s3, s3_jars_present

BUCKET = "versiq-outage"
#: The lease's ttl in these runs: the run must end soon after the lease is lost.
TTL_S = 10
#: The most a run may take from the server's death to its exit (docs/contract.md).
FAIL_WITHIN_S = 60

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def s3(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    if not s3_jars_present():
        pytest.fail(f"the S3 jars are missing: {FETCH_HINT_S3}", pytrace=False)
    return s3_server.serve_bucket(BUCKET, monkeypatch)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYSPARK_PYTHON=sys.executable, VERSIQ_SHUFFLE_PARTITIONS="2", VERSIQ_LEASE_TTL=f"{TTL_S}s")
    env.pop("SPARK_MASTER", None)
    return env


def _source(folder: Any) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "a.jsonl")
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(200):
            handle.write(json.dumps({"key": f"k{i % 20}", "value": i, "timestamp": 1_000 + i}) + "\n")
    return str(folder)


def test_the_s3_server_dying_at_the_commit_fails_the_run_in_one_line_and_a_rerun_completes(spark, s3, tmp_path,
                                                                                          monkeypatch):
    warehouse = f"s3://{BUCKET}/wh-{uuid.uuid4().hex[:8]}"
    args = [*VERSIQ, "ingest", "--warehouse", warehouse, "--store", "s", "--source", _source(tmp_path / "src"),
            "--max-future", "none", "--log-level", "info"]
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "committing run 1" in line:
                s3.kill()
                break
        killed = time.monotonic()
        try:
            _, rest = proc.communicate(timeout=FAIL_WITHIN_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, rest = proc.communicate()
            pytest.fail(f"the run was still going {FAIL_WITHIN_S}s after the S3 server died:\n{''.join(lines)}{rest}")
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        s3.ensure_running()
    stderr = "".join(lines) + rest
    assert proc.returncode == 1, stderr
    assert took <= FAIL_WITHIN_S, took
    assert "Traceback" not in stderr and "\tat " not in stderr, stderr
    failed = [line for line in stderr.splitlines() if "store s failed" in line]
    assert len(failed) == 1, stderr
    # the rerun: the CLI's command with the same arguments in this process (no JVM start), the
    # session's Spark given the server's S3 settings
    monkeypatch.setenv("VERSIQ_LEASE_TTL", f"{TTL_S}s")
    assert configure_s3(spark, s3.env())
    status, printed = ingest_in_process(spark, *args[len(VERSIQ) + 1:])
    assert status == 0, printed
    path = layout.table_path(warehouse, "s")
    assert layout.read_state(path, storage.delta_table(path).version()).run == 1
