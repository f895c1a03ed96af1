"""The ``s3_server`` fixture's server (tests/support/s3_server.py) is a real S3 server: its one
identity is the key pair given (a wrong secret is refused), it listens on 127.0.0.1 only on the
ports chosen, objects survive a clean restart and a SIGKILL, and closing it leaves no process and no
directory behind."""

from __future__ import annotations

import os
import socket

import pytest
from pyarrow import fs as pafs

from tests.support.s3_server import REGION, S3Server


def _write(filesystem: pafs.S3FileSystem, key: str, data: bytes) -> None:
    with filesystem.open_output_stream(key) as out:
        out.write(data)


def _read(filesystem: pafs.S3FileSystem, key: str) -> bytes:
    with filesystem.open_input_stream(key) as handle:
        return bytes(handle.read())


def test_env_names_the_endpoint_and_keys(s3_server):
    env = s3_server.env()
    assert env == {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_server.port}", "AWS_ACCESS_KEY_ID": s3_server.access_key,
                   "AWS_SECRET_ACCESS_KEY": s3_server.secret_key, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}
    assert s3_server.endpoint == env["AWS_ENDPOINT_URL"]
    assert "versiq-ready" in s3_server.list_buckets()


def test_own_server_credentials_restart_kill_and_close():
    server = S3Server(access_key="own-key", secret_key="own-secret")
    work_dir = server.work_dir
    try:
        server.start()
        assert len(set(server.ports.values())) == len(server.ports)
        with socket.create_connection(("127.0.0.1", server.port), timeout=2):
            pass
        server.create_bucket("kept")
        assert {"kept", "versiq-ready"} <= set(server.list_buckets())
        _write(server.filesystem(), "kept/a/b=1/x.bin", b"first")

        wrong = pafs.S3FileSystem(access_key="own-key", secret_key="not-it", region=REGION,
                                  endpoint_override=f"127.0.0.1:{server.port}", scheme="http",
                                  retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
        with pytest.raises(OSError):
            _read(wrong, "kept/a/b=1/x.bin")

        ports = dict(server.ports)
        server.restart()
        assert server.ports == ports
        assert _read(server.filesystem(), "kept/a/b=1/x.bin") == b"first"
        _write(server.filesystem(), "kept/second.bin", b"second")

        server.restart(hard=True)
        assert _read(server.filesystem(), "kept/second.bin") == b"second"
        pid = server.pid
        assert pid is not None
    finally:
        server.close()
    assert not server.is_running()
    with pytest.raises(ProcessLookupError):  # reaped, not only signalled
        os.kill(pid, 0)
    assert not work_dir.exists()
