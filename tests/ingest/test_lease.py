"""The lease of a store on S3 (versiq.ingest.lease) against a real S3 server (SeaweedFS, the
``s3_server`` fixture): it excludes a second writer with the local lock's message, lives past its
ttl while renewed, is taken over once expired (and the old holder's ETag stops working), is known
to be lost when someone else overwrites it or when no renewal gets through within the ttl, lets
exactly one of several racing threads in at a time, survives a restart of the S3 server that is
shorter than its ttl, and is taken over at once when its holder was a process of this host that
is gone (a killed run), but not when the holder's pid belongs to another PID namespace or boot."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.s3_server import S3Server
from versiq.ingest.errors import LockTimeout
from versiq.ingest.lease import LeaseLost, s3_lease
from versiq.storage import s3_client, split_s3

pytestmark = pytest.mark.timeout(120)

BUCKET = "lease-tests"


@pytest.fixture
def s3(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session's S3 server (running, with the test bucket) and the AWS variables set for it."""
    return s3_server.serve_bucket(BUCKET, monkeypatch)


def _lock_uri(store: str) -> str:
    """A fresh store's lock object: every test has its own."""
    return f"s3://{BUCKET}/warehouse/{store}-{uuid.uuid4().hex[:8]}/_versiq/lock"


def _read(uri: str) -> tuple[dict[str, Any], str] | None:
    """(body, etag) of the object at ``uri``, or None when there is none."""
    bucket, key = split_s3(uri)
    try:
        response = s3_client().get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return None
        raise
    return json.loads(response["Body"].read()), response["ETag"]


def _write_by_hand(uri: str, **body: Any) -> str:
    """Put a lease body unconditionally (another writer's, or a dead one's); its ETag."""
    bucket, key = split_s3(uri)
    full = {"owner": str(uuid.uuid4()), "host": "elsewhere", "pid": 4242, "generation": 1, "ttl_s": 30.0,
            "since": "2026-01-01T00:00:00Z", **body}
    return str(s3_client().put_object(Bucket=bucket, Key=key, Body=json.dumps(full).encode())["ETag"])


def _status(exc: ClientError) -> int:
    return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


def _wait_for(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_second_writer_waits_with_the_holders_name_until_release(s3: Any) -> None:
    uri = _lock_uri("first")
    store = uri.split("/")[-3]
    with s3_lease(uri, timeout_s=5, ttl_s=3) as lease:
        read = _read(uri)
        assert read is not None
        body, _etag = read
        assert (body["pid"], body["ttl_s"]) == (os.getpid(), 3)
        assert lease.holder == f"pid={body['pid']} host={body['host']} since={body['since']}"
        assert body["owner"] == lease.owner and body["since"].endswith("Z")
        started = time.monotonic()
        with pytest.raises(LockTimeout) as caught, s3_lease(uri, timeout_s=1, ttl_s=3, poll_s=0.2):
            pytest.fail("a second writer got the lease")
        assert time.monotonic() - started >= 1
        assert str(caught.value) == f"store {store!r} is locked by another writer ({lease.holder}); waited 1s"
        lease.check()
    assert _read(uri) is None
    with pytest.raises(LeaseLost, match="it was released"):
        lease.check()
    started = time.monotonic()
    with s3_lease(uri, timeout_s=5, ttl_s=3) as second:
        assert time.monotonic() - started < 1
        assert _read(uri) is not None and second.owner != lease.owner
    assert _read(uri) is None


def test_an_object_that_is_no_lease_still_holds_the_store(s3: Any) -> None:
    uri = _lock_uri("foreign")
    bucket, key = split_s3(uri)
    s3_client().put_object(Bucket=bucket, Key=key, Body=b"not json")
    with pytest.raises(LockTimeout, match="an unreadable lease object"), s3_lease(uri, timeout_s=0.5, poll_s=0.1):
        pytest.fail("an unreadable lease object was ignored")


def test_renewal_keeps_the_lease_past_its_ttl(s3: Any) -> None:
    uri = _lock_uri("renewed")
    with s3_lease(uri, timeout_s=5, ttl_s=2) as lease:
        read = _read(uri)
        assert read is not None
        first_generation, first_etag = read[0]["generation"], read[1]
        time.sleep(4.5)  # more than twice the ttl
        with pytest.raises(LockTimeout), s3_lease(uri, timeout_s=0.5, ttl_s=2, poll_s=0.1):
            pytest.fail("a renewed lease was taken over")
        lease.check()
        assert not lease.lost
        read = _read(uri)
        assert read is not None
        body, etag = read
        assert body["owner"] == lease.owner and body["generation"] >= first_generation + 4
        assert etag != first_etag and lease.generation >= body["generation"]
    assert _read(uri) is None


def test_an_expired_lease_is_taken_over_and_its_etag_stops_working(s3: Any) -> None:
    uri = _lock_uri("expired")
    bucket, key = split_s3(uri)
    dead = _write_by_hand(uri, ttl_s=1.0, generation=7, pid=999999)  # a holder that died at once
    started = time.monotonic()
    # a long ttl of its own: a renewal (every ttl/3, each a generation) before the read below,
    # on a loaded machine, would make the takeover's generation look wrong
    with s3_lease(uri, timeout_s=10, ttl_s=30, poll_s=0.2) as lease:
        waited = time.monotonic() - started
        assert 0.5 < waited < 5  # judged by the server's clock: ttl + one second of granularity
        read = _read(uri)
        assert read is not None and read[0]["owner"] == lease.owner
        assert lease.generation == read[0]["generation"] == 8
        client = s3_client()
        for late in (lambda: client.put_object(Bucket=bucket, Key=key, Body=b"{}", IfMatch=dead),
                     lambda: client.delete_object(Bucket=bucket, Key=key, IfMatch=dead)):
            with pytest.raises(ClientError) as caught:
                late()
            assert _status(caught.value) == 412
        lease.check()
    assert _read(uri) is None


def test_a_lease_overwritten_by_another_writer_is_lost_and_left_alone(
        s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    uri = _lock_uri("stolen")
    caplog.set_level(logging.WARNING, logger="versiq.ingest")
    with s3_lease(uri, timeout_s=5, ttl_s=3) as lease:
        other = _write_by_hand(uri, pid=4243, host="thief")
        assert _wait_for(lambda: lease.lost, timeout=3)  # the next renewal (every ttl/3) gets a 412
        with pytest.raises(LeaseLost, match="pid=4243 host=thief"):
            lease.check()
    read = _read(uri)
    assert read is not None and read[1] == other and read[0]["host"] == "thief"
    assert any("no longer ours" in record.getMessage() for record in caplog.records)


def test_racing_threads_hold_the_lease_one_at_a_time(s3: Any) -> None:
    uri = _lock_uri("raced")
    mutex = threading.Lock()
    inside: list[int] = []
    overlaps: list[int] = []
    entries: list[int] = []
    errors: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            for _ in range(2):
                with s3_lease(uri, timeout_s=30, ttl_s=3, poll_s=0.05) as lease:
                    with mutex:
                        if inside:
                            overlaps.append(number)
                        inside.append(number)
                        entries.append(number)
                    time.sleep(0.2)
                    lease.check()
                    with mutex:
                        inside.remove(number)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and not overlaps
    assert sorted(entries) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert _read(uri) is None


def test_the_lease_survives_a_restart_of_the_s3_server_shorter_than_its_ttl(
        s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The restart falls on the first renewal (due ttl/3 after the lease was taken), which fails
    and is retried until the server is back. ``weed mini`` usually restarts in about 2 s, but now
    and then needs 5-20 s before it takes writes again; a lease survives an outage shorter than
    its ttl less a renewal interval, so a restart slower than that is tried once more."""
    ttl = 12.0
    caplog.set_level(logging.INFO, logger="versiq.ingest")

    def logged(text: str) -> bool:
        return any(text in record.getMessage() for record in caplog.records)

    slow: list[float] = []
    try:
        for _attempt in range(2):
            caplog.clear()
            uri = _lock_uri("restarted")
            with s3_lease(uri, timeout_s=5, ttl_s=ttl) as lease:
                before = lease.generation
                time.sleep(ttl / 3 - 0.5)
                started = time.monotonic()
                s3.restart()
                took = time.monotonic() - started
                if took > ttl / 2:  # the outage was as long as the lease can outlive: not this test's case
                    slow.append(took)
                    continue
                assert _wait_for(lambda: logged("renewed the lease of store"), timeout=ttl / 2), \
                    "no renewal after the restart"
                assert logged("failed, retrying") and lease.generation > before and not lease.lost
                lease.check()
                read = _read(uri)
                assert read is not None and read[0]["owner"] == lease.owner
            assert _read(uri) is None
            return
        pytest.skip(f"the S3 server took {slow} s to restart: longer than a {ttl:g} s lease can outlive")
    finally:
        s3.ensure_running()


def test_a_lease_not_renewed_within_its_ttl_is_lost(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A server of its own, killed for good: the renewals fail, the lease is lost once its ttl has
    passed without one, and the release's failure is logged, not raised over the block's error."""
    caplog.set_level(logging.WARNING, logger="versiq.ingest")
    with S3Server() as own:
        for name, value in own.env().items():
            monkeypatch.setenv(name, value)
        own.create_bucket(BUCKET)
        uri = _lock_uri("unreachable")
        # The lease's clock starts with its first write, which is after this and before the block.
        before = time.monotonic()
        with pytest.raises(RuntimeError, match="the writer's own error"), \
                s3_lease(uri, timeout_s=5, ttl_s=2) as lease:
            own.kill()
            assert _wait_for(lambda: lease.lost, timeout=6)
            assert time.monotonic() - before >= 2.0  # never before the ttl has passed without a renewal
            with pytest.raises(LeaseLost, match="no renewal succeeded for 2s .last error: Could not connect"):
                lease.check()
            raise RuntimeError("the writer's own error")
    assert any("releasing the lease of store" in record.getMessage() for record in caplog.records)


def _here(**body: Any) -> dict[str, Any]:
    """A lease body's holder fields as a process of this host, boot and PID namespace writes them."""
    import socket

    from versiq.ingest.lease import process_identity

    boot_id, pid_ns = process_identity()
    return {"host": socket.gethostname(), "boot_id": boot_id, "pid_ns": pid_ns, **body}


def _dead_pid() -> int:
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def test_the_lease_of_a_killed_writer_on_this_host_is_taken_over_at_once(s3: Any) -> None:
    """A run killed with SIGKILL leaves its lease behind; a rerun on the same host sees that the
    holder's process is gone and takes the lease over without waiting for its ttl. A live
    holder on this host, and any holder on another host, are waited for."""
    import subprocess

    dead = _dead_pid()
    uri = _lock_uri("killed")
    _write_by_hand(uri, **_here(pid=dead, ttl_s=300.0))
    started = time.monotonic()
    with s3_lease(uri, 5, ttl_s=3):
        assert time.monotonic() - started < 3
        seen = _read(uri)
        assert seen is not None and seen[0]["pid"] == os.getpid()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        for body in (_here(pid=alive.pid), _here(host="elsewhere", pid=dead)):
            other = _lock_uri("alive")
            _write_by_hand(other, **body, ttl_s=300.0)
            with pytest.raises(LockTimeout, match=f"pid={body['pid']} host={body['host']}"), \
                    s3_lease(other, 1, ttl_s=3):
                pass
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize("holder", [
    {"pid_ns": "pid:[4026532999]"},  # a container with host networking: same host name, other pids
    {"boot_id": "00000000-0000-4000-8000-000000000000"},  # this host before a reboot
    {"boot_id": "", "pid_ns": ""},  # a holder that did not say (an older writer, not Linux)
], ids=["other-pid-namespace", "other-boot", "unknown"])
def test_a_holder_on_this_host_name_whose_pids_are_not_ours_is_waited_for(s3: Any, holder: dict[str, str]) -> None:
    """A pid that no process of ours has proves nothing about a holder of another PID namespace
    or boot: its lease is taken only once it expires, never at once."""
    uri = _lock_uri("namespace")
    body = _here(pid=_dead_pid(), ttl_s=300.0, **holder)
    _write_by_hand(uri, **body)
    with pytest.raises(LockTimeout, match=f"pid={body['pid']} host={body['host']}"), s3_lease(uri, 1, ttl_s=3):
        pass
    seen = _read(uri)
    assert seen is not None and seen[0]["pid"] == body["pid"]


def test_a_lease_names_the_boot_and_pid_namespace_of_its_holder(s3: Any) -> None:
    from versiq.ingest.lease import process_identity

    uri = _lock_uri("identity")
    with s3_lease(uri, 5, ttl_s=3):
        seen = _read(uri)
    boot_id, pid_ns = process_identity()
    assert boot_id and pid_ns.startswith("pid:[")
    assert seen is not None and (seen[0]["boot_id"], seen[0]["pid_ns"]) == (boot_id, pid_ns)


@pytest.mark.parametrize("then", ["commit", "fail"])
def test_a_run_whose_lease_was_lost_fails_in_one_line_without_a_traceback(
        s3: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, then: str) -> None:
    """Another writer takes the lease in the middle of a store's run. ``commit``: the run reaches
    its commit check; ``fail``: the run's own work fails first (its Spark jobs cancelled, S3
    gone). Either way the store fails with ``LeaseLost`` in one log line, no traceback, and the
    others' runs go on; the renewing thread has started cancelling the process's Spark jobs."""
    from types import SimpleNamespace

    from versiq import storage
    from versiq.ingest.pipeline import ingest_each
    from versiq.ingest.reports import StoreReport
    from versiq.ingest.store import check_still_writer, writer_lock

    monkeypatch.setenv("VERSIQ_LEASE_TTL", "3s")
    caplog.set_level(logging.INFO, logger="versiq.ingest")
    store = f"s3://{BUCKET}/warehouse/lost-{uuid.uuid4().hex[:8]}"

    def run(spec: Any) -> StoreReport:
        if spec.name == "other":
            return StoreReport()
        with writer_lock(store, 5):
            _write_by_hand(storage.join(store, "_versiq", "lock"), host="thief", pid=4243)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the next renewal (every ttl/3) finds the thief
                try:
                    check_still_writer(store)
                except LeaseLost:
                    break
                time.sleep(0.05)
            if then == "commit":
                check_still_writer(store)
            raise RuntimeError("py4j: An error occurred while calling o42.save.\n\tat org.example.Job.run")

    reports = ingest_each(None, [SimpleNamespace(name="lost"), SimpleNamespace(name="other")],
                          lambda _session, spec: run(spec),
                          lambda error: StoreReport(error=error), "store")
    assert reports["other"].error is None
    error = reports["lost"].error
    assert error is not None and error.startswith("LeaseLost: the lease of store 'lost-") and "thief" in error
    failed = [r for r in caplog.records if r.getMessage().startswith("store lost failed")]
    assert len(failed) == 1 and failed[0].exc_info is None and "\n" not in failed[0].getMessage()
    assert any("cancelling this process's Spark jobs" in r.getMessage() for r in caplog.records)


def test_an_s3_failure_in_a_java_error_is_named_in_one_line() -> None:
    from versiq.ingest.errors import storage_error_in

    text = ("An error occurred while calling o95.save.\n"
            ": org.apache.spark.SparkException: Job aborted: org.apache.hadoop.fs.s3a.AWSClientIOException: PUT "
            "on s3a://b/k: software.amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP request\n"
            "\tat software.amazon.awssdk.core.internal.http.RetryableStageHelper.retryPolicyDisallowedRetryException"
            "(RetryableStageHelper.java:168)\n"
            "Caused by: software.amazon.awssdk.core.exception.SdkClientException: Connect to 127.0.0.1:9 failed: "
            "Connection refused\n"
            "\tat software.amazon.awssdk.core.exception.SdkClientException$BuilderImpl.build(S.java:1)\n"
            "Caused by: java.net.ConnectException: Connection refused\n")
    assert str(storage_error_in(RuntimeError(text))) == (
        "S3 failed: software.amazon.awssdk.core.exception.SdkClientException: Connect to 127.0.0.1:9 failed: "
        "Connection refused")
    frame_only = "java.lang.IllegalStateException: boom\n\tat software.amazon.awssdk.Stage.retryException(S.java:1)"
    assert storage_error_in(RuntimeError(frame_only)) is None
